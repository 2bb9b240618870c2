//! The statuses of gRPC calls that fail before a service method runs, made to say whose mistake it was: tonic's
//! codec answers `INTERNAL` for a request it cannot decode (garbage protobuf, a compressed flag without
//! `grpc-encoding`, a length prefix beyond the data, no message at all), although docs/api.md keeps `INTERNAL`
//! for failures of the server; these become `INVALID_ARGUMENT` (`UNIMPLEMENTED` for a compressed message, since
//! the server supports no compression). tonic's `UNIMPLEMENTED` for an unknown service or method gets a message
//! naming it. A request whose `content-type` is not gRPC's is refused with HTTP 415, as the gRPC protocol
//! asks, before any service sees it.
//!
//! [`check`] is a middleware on the gRPC routes; the statuses it rewrites are matched by the messages tonic 0.14
//! writes (tonic is pinned; `tests/grpc_transport.rs` fails if they change).

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use http_body::Frame;
use http_body_util::BodyExt;
use tonic::{Code, Status};

/// The gRPC services served, by full name, for the message of an unknown one.
pub(crate) type Services = &'static [&'static str];

/// The middleware: refuses a request that is not gRPC, and rewrites the status of one that failed in tonic.
pub(crate) async fn check(
    State(services): State<Services>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(refused) = refuse_content_type(request.headers()) {
        return refused;
    }
    let path = request.uri().path().to_owned();
    let mut response = next.run(request).await;
    // A call that fails before its method runs is answered with headers only (the status in the headers); one
    // that fails while a method reads its request stream, in the trailers.
    rewrite(response.headers_mut(), &path, services);
    response.map(|body| {
        Body::new(body.map_frame(move |frame| match frame.into_trailers() {
            Ok(mut trailers) => {
                rewrite(&mut trailers, &path, services);
                Frame::trailers(trailers)
            }
            Err(frame) => frame,
        }))
    })
}

/// HTTP 415 with an `INVALID_ARGUMENT` status when `content-type` is not `application/grpc` (or `+proto`).
fn refuse_content_type(headers: &HeaderMap) -> Option<Response> {
    let content_type = headers.get(header::CONTENT_TYPE);
    let grpc = content_type.and_then(|v| v.to_str().ok()).is_some_and(|v| {
        let v = v.trim();
        v == "application/grpc"
            || v.starts_with("application/grpc;")
            || v.starts_with("application/grpc+proto")
    });
    if grpc {
        return None;
    }
    let got = content_type.map_or_else(|| "none".to_owned(), |v| format!("{v:?}"));
    let status = Status::invalid_argument(format!(
        "content-type: must be application/grpc (or application/grpc+proto), got {got}"
    ));
    let mut response = status.into_http::<Body>();
    *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    Some(response)
}

/// Replaces the status in `headers` (response headers or trailers) when [`client_status`] has a better one.
fn rewrite(headers: &mut HeaderMap, path: &str, services: Services) {
    if !headers.contains_key(Status::GRPC_STATUS) {
        return;
    }
    let Some(status) = Status::from_header_map(headers) else {
        return;
    };
    if let Some(better) = client_status(&status, path, services) {
        headers.remove(Status::GRPC_MESSAGE);
        headers.remove(Status::GRPC_STATUS_DETAILS);
        if better.add_header(headers).is_err() {
            tracing::warn!(?better, "cannot write a gRPC status");
        }
    }
}

/// The status a client should get instead of `status`, which tonic produced for a call to `path`; `None` to keep
/// it.
pub(crate) fn client_status(status: &Status, path: &str, services: Services) -> Option<Status> {
    let message = status.message();
    match status.code() {
        Code::Internal => {
            if message.starts_with("failed to decode Protobuf message") {
                Some(Status::invalid_argument(format!(
                    "malformed request message: {message}"
                )))
            } else if message.contains("received message with compressed-flag but no grpc-encoding")
            {
                Some(Status::unimplemented(
                    "the request message is compressed (compressed flag 1), but compression is not supported: \
                     send messages uncompressed",
                ))
            } else if message.contains("received message with invalid compression flag") {
                Some(Status::invalid_argument(format!(
                    "malformed request stream: {message}"
                )))
            } else if message == "Unexpected EOF decoding stream." {
                Some(Status::invalid_argument(
                    "malformed request stream: it ends inside a message (the length prefix promises more bytes than \
                     were sent)",
                ))
            } else if message == "Missing request message." {
                Some(Status::invalid_argument(
                    "malformed request stream: it holds no message, but the method takes one",
                ))
            } else {
                None
            }
        }
        Code::Unimplemented if message.is_empty() => {
            Some(Status::unimplemented(unknown(path, services)))
        }
        _ => None,
    }
}

/// Says what of `path` (`/package.Service/Method`) is unknown.
fn unknown(path: &str, services: Services) -> String {
    let (service, method) = path
        .trim_start_matches('/')
        .split_once('/')
        .unwrap_or((path, ""));
    if services.contains(&service) {
        format!("{service} has no method {method:?}")
    } else {
        format!(
            "no service {service:?} here (services: {})",
            services.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVICES: Services = &["inference.GRPCInferenceService", "grpc.health.v1.Health"];

    fn rewritten(code: Code, message: &str, path: &str) -> Option<(Code, String)> {
        client_status(&Status::new(code, message), path, SERVICES)
            .map(|s| (s.code(), s.message().to_owned()))
    }

    #[test]
    fn codec_failures_become_the_clients_errors() {
        let infer = "/inference.GRPCInferenceService/ModelInfer";
        assert_eq!(
            rewritten(
                Code::Internal,
                "failed to decode Protobuf message: invalid varint",
                infer
            ),
            Some((
                Code::InvalidArgument,
                "malformed request message: failed to decode Protobuf message: invalid varint"
                    .into()
            ))
        );
        assert_eq!(
            rewritten(
                Code::Internal,
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                infer
            )
            .map(|(code, _)| code),
            Some(Code::Unimplemented)
        );
        for message in [
            "Unexpected EOF decoding stream.",
            "Missing request message.",
        ] {
            assert_eq!(
                rewritten(Code::Internal, message, infer).map(|(code, _)| code),
                Some(Code::InvalidArgument),
                "{message}"
            );
        }
        // A failure of the server stays INTERNAL, and other codes stay as they are.
        assert_eq!(rewritten(Code::Internal, "internal error", infer), None);
        assert_eq!(
            rewritten(Code::InvalidArgument, "categorical: ...", infer),
            None
        );
        assert_eq!(
            rewritten(
                Code::Unimplemented,
                "Content is compressed with `gzip`",
                infer
            ),
            None
        );
    }

    #[test]
    fn unknown_methods_and_services_are_named() {
        assert_eq!(
            rewritten(
                Code::Unimplemented,
                "",
                "/inference.GRPCInferenceService/Nope"
            ),
            Some((
                Code::Unimplemented,
                "inference.GRPCInferenceService has no method \"Nope\"".into()
            ))
        );
        assert_eq!(
            rewritten(Code::Unimplemented, "", "/no.Such/Method"),
            Some((
                Code::Unimplemented,
                "no service \"no.Such\" here (services: inference.GRPCInferenceService, grpc.health.v1.Health)"
                    .into()
            ))
        );
    }

    #[test]
    fn rewrites_the_status_in_headers_or_trailers() {
        let mut headers = HeaderMap::new();
        Status::internal("Missing request message.")
            .add_header(&mut headers)
            .expect("valid status");
        rewrite(
            &mut headers,
            "/inference.GRPCInferenceService/ModelInfer",
            SERVICES,
        );
        let status = Status::from_header_map(&headers).expect("a status");
        assert_eq!(status.code(), Code::InvalidArgument);
        let mut ok = HeaderMap::new();
        ok.insert(Status::GRPC_STATUS, HeaderValue::from_static("0"));
        rewrite(&mut ok, "/x/y", SERVICES);
        assert_eq!(ok.len(), 1);
    }

    #[test]
    fn refuses_what_is_not_grpc() {
        let mut headers = HeaderMap::new();
        for ok in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc; charset=utf-8",
        ] {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(ok));
            assert!(refuse_content_type(&headers).is_none(), "{ok}");
        }
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let response = refuse_content_type(&headers).expect("refused");
        assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let status = Status::from_header_map(response.headers()).expect("a status");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "content-type: must be application/grpc (or application/grpc+proto), got \"application/json\""
        );
    }
}
