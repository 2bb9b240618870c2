//! What the batcher queues: a request's [`Work`] (or a chunk of it) with the channel its answer goes back on
//! ([`Job`]), the one error type of execution ([`ExecError`]), which [`super::Batcher::run`] turns into the
//! error the client gets, and what an answer carries back of the batch that produced it ([`BatchTrace`]), for
//! the request's stage trace.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::error::ServiceError;
use crate::trace::BatchInfo;

/// The work of one request, or of one chunk of a request the batcher split, as an executor reads it.
pub trait Work: Send + 'static {
    /// What an executor answers it with.
    type Output: Send + 'static;
}

/// A job's answer, and the batch it was executed in (none for a job answered without executing: expired, shut
/// down).
#[derive(Debug)]
pub struct Answered<O> {
    pub(crate) result: Result<O, ExecError>,
    pub(crate) batch: Option<Arc<BatchTrace>>,
}

/// The answer of a job, as its request waits for it.
pub type Answer<W> = oneshot::Receiver<Answered<<W as Work>::Output>>;

/// One executed batch, as its requests' traces see it: which batch, when it closed and when an executor started
/// it, and how long its gather and inference took (set by the executor before it answers).
#[derive(Debug)]
pub struct BatchTrace {
    pub(crate) info: BatchInfo,
    pub(crate) closed: Instant,
    pub(crate) started: Instant,
    phases: OnceLock<(Duration, Duration)>,
}

impl BatchTrace {
    pub(crate) fn new(info: BatchInfo, closed: Instant, started: Instant) -> BatchTrace {
        BatchTrace {
            info,
            closed,
            started,
            phases: OnceLock::new(),
        }
    }

    /// Notes how long the batch's gather and inference took (the first call wins).
    pub(crate) fn set_phases(&self, gather: Duration, inference: Duration) {
        let _ = self.phases.set((gather, inference));
    }

    /// The gather and inference times, when the executor set them.
    pub(crate) fn phases(&self) -> Option<(Duration, Duration)> {
        self.phases.get().copied()
    }
}

/// Queued work and where its answer goes.
#[derive(Debug)]
pub struct Job<W: Work> {
    pub(crate) work: W,
    reply: oneshot::Sender<Answered<W::Output>>,
    /// The batch it is executed in, set when its batch is handed to an executor.
    batch: Option<Arc<BatchTrace>>,
}

impl<W: Work> Job<W> {
    /// A job, and the receiver its answer arrives on.
    pub(crate) fn new(work: W) -> (Job<W>, Answer<W>) {
        let (reply, answer) = oneshot::channel();
        (
            Job {
                work,
                reply,
                batch: None,
            },
            answer,
        )
    }

    /// Notes the batch the job is executed in: its answer carries it back.
    pub(crate) fn executed_in(&mut self, batch: &Arc<BatchTrace>) {
        self.batch = Some(Arc::clone(batch));
    }

    /// Sends the job's answer; a request that has gone (its receiver dropped) is not waiting for it.
    pub(crate) fn answer(self, result: Result<W::Output, ExecError>) {
        let _ = self.reply.send(Answered {
            result,
            batch: self.batch,
        });
    }

    /// Whether the request has gone, so that its answer would be thrown away.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.reply.is_closed()
    }
}

/// Why a job got no result. Never the client's doing: requests are validated before they are queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// Executing failed: a gather, ONNX Runtime, a query vector that is not finite. The detail is for the log.
    #[error("{0}")]
    Failed(String),
    #[error("the executor panicked: {0}")]
    Panicked(String),
    /// The job's deadline passed (or could not be met) while it waited; it was not executed.
    #[error("deadline passed before execution")]
    DeadlineExceeded,
    /// The server stopped before the job could run.
    #[error("shutting down")]
    ShuttingDown,
    /// The executor dropped the job without answering it.
    #[error("the executor dropped the job")]
    Dropped,
    /// Embedding rows could not be fetched from a remote tier in time, and their table's policy is to refuse.
    #[error("{0}")]
    TierUnavailable(String),
}

impl ExecError {
    /// What the client of a request on `model` gets for this failure; internal detail stays in the error for the
    /// log.
    pub(crate) fn into_service_error(self, model: &str) -> ServiceError {
        match self {
            ExecError::DeadlineExceeded => ServiceError::DeadlineExceeded {
                model: model.to_owned(),
            },
            ExecError::ShuttingDown => ServiceError::Unavailable("shutting down"),
            ExecError::TierUnavailable(_) => ServiceError::TierUnavailable {
                model: model.to_owned(),
            },
            ExecError::Failed(_) | ExecError::Panicked(_) | ExecError::Dropped => {
                ServiceError::Internal(format!("model {model:?}: {self}"))
            }
        }
    }
}

/// Runs `f`, turning a panic into [`ExecError::Panicked`] with its message, so that one failing batch answers its
/// jobs with an error instead of taking the executor thread down.
pub fn catch_panic<T>(f: impl FnOnce() -> Result<T, ExecError>) -> Result<T, ExecError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(ExecError::Panicked(message))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_with_its_message() {
        let answer: Result<(), ExecError> = catch_panic(|| panic!("boom {}", 7));
        assert_eq!(answer, Err(ExecError::Panicked("boom 7".to_owned())));
        assert_eq!(catch_panic(|| Ok(3)), Ok(3));
    }

    #[test]
    fn failures_map_to_what_the_client_may_see() {
        let internal = ExecError::Failed("ONNX Runtime failed: bad shape".to_owned());
        match internal.into_service_error("m") {
            ServiceError::Internal(detail) => {
                assert_eq!(detail, "model \"m\": ONNX Runtime failed: bad shape");
            }
            other => panic!("expected an internal error, got {other:?}"),
        }
        assert!(matches!(
            ExecError::DeadlineExceeded.into_service_error("m"),
            ServiceError::DeadlineExceeded { model } if model == "m"
        ));
        assert!(matches!(
            ExecError::ShuttingDown.into_service_error("m"),
            ServiceError::Unavailable(_)
        ));
    }
}
