//! A request body that must arrive whole within a time (`--body-read-timeout-ms`): the server wraps every request
//! body in a [`TimedBody`], which fails once its deadline has passed with the body still incomplete. The error is
//! the one each transport answers with: [`ServiceError::BodyTimeout`] for the HTTP routes (408, found by
//! [`super::envelope::body_bytes`]) and its gRPC status for tonic, which looks for a `Status` among a body error's
//! sources (`DEADLINE_EXCEEDED`, by [`super::kserve::grpc::code_of`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::BoxError;
use axum::body::HttpBody;
use http_body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use recserve_core::error::ServiceError;

/// Which transport reads the body, hence the error a timeout becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reader {
    Http,
    Grpc,
}

impl Reader {
    fn timeout(self, after: Duration) -> BoxError {
        let error = ServiceError::BodyTimeout {
            ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
        };
        match self {
            Reader::Http => Box::new(error),
            Reader::Grpc => Box::new(super::kserve::grpc::status(&error)),
        }
    }
}

/// `inner`, failing if it is still incomplete `after` its creation (the arrival of the request's head).
#[derive(Debug)]
pub(crate) struct TimedBody<B> {
    inner: B,
    deadline: Instant,
    after: Duration,
    reader: Reader,
    /// Armed the first time the body has to wait, so a body that arrives with its head costs no timer.
    sleep: Option<Pin<Box<Sleep>>>,
    expired: bool,
}

impl<B> TimedBody<B> {
    pub(crate) fn new(inner: B, after: Duration, reader: Reader) -> TimedBody<B> {
        TimedBody {
            inner,
            deadline: Instant::now() + after,
            after,
            reader,
            sleep: None,
            expired: false,
        }
    }
}

impl<B> HttpBody for TimedBody<B>
where
    B: HttpBody + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Some(Err(this.reader.timeout(this.after))));
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.expired = true;
                Poll::Ready(Some(Err(this.reader.timeout(this.after))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        !self.expired && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{Body, Bytes};
    use http_body_util::BodyExt;

    /// A body whose first chunk arrives at once and whose second never does.
    fn stalled() -> Body {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let first = Frame::data(Bytes::from_static(b"{\"user\""));
        tx.try_send(Ok(first)).expect("room for one frame");
        // The sender stays alive (leaked into the stream's state) so the body never ends.
        let stream = futures_util::stream::unfold((rx, tx), |(mut rx, tx)| async move {
            rx.recv().await.map(|frame| (frame, (rx, tx)))
        });
        Body::new(http_body_util::StreamBody::new(stream))
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_fails_at_its_deadline_with_the_transports_error() {
        let start = Instant::now();
        let mut body = TimedBody::new(stalled(), Duration::from_millis(200), Reader::Http);
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().expect("data"), "{\"user\"");
        let error = body
            .frame()
            .await
            .expect("an error")
            .expect_err("timed out");
        assert_eq!(start.elapsed(), Duration::from_millis(200));
        let error = error.downcast::<ServiceError>().expect("a ServiceError");
        assert_eq!(
            error.to_string(),
            "the request body did not arrive within 200 ms of its head"
        );
        assert!(!body.is_end_stream());

        let mut body = TimedBody::new(stalled(), Duration::from_millis(50), Reader::Grpc);
        body.frame().await.expect("a frame").expect("data");
        let error = body
            .frame()
            .await
            .expect("an error")
            .expect_err("timed out");
        let status = error.downcast::<tonic::Status>().expect("a tonic Status");
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
        assert_eq!(
            status.message(),
            "the request body did not arrive within 50 ms of its head"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_arrives_in_time_passes_through_whole() {
        let body = TimedBody::new(
            Body::from("{\"k\": 1}"),
            Duration::from_millis(10),
            Reader::Http,
        );
        let bytes = body.collect().await.expect("whole").to_bytes();
        assert_eq!(bytes, "{\"k\": 1}");
    }
}
