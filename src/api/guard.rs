//! What the HTTP router checks before any route runs, so that every route refuses alike, with the JSON error body:
//! a request target longer than [`MAX_URI_BYTES`] (414), more than [`MAX_HEADERS`] headers or [`MAX_HEADER_BYTES`]
//! of them (431), a compressed body (`Content-Encoding` other than `identity`: 415), and a `Content-Length` over
//! `--max-body-bytes` (413 as soon as the head is read: instead of `100 Continue` to a client that waits for it,
//! and without waiting for the body to a client that does not, whose body is drained up to the limit while the
//! answer goes out; the connection closes after the answer, since its body cannot be skipped). A body without a `Content-Length` (chunked) gets its 413 from the
//! route, which reads it up to the limit. It also gives the 405 of a route that exists for other methods a JSON
//! body naming them.
//!
//! hyper itself answers what it cannot parse (a garbage request line, a malformed or conflicting
//! `Content-Length`), and what exceeds its own limits, before any of this runs, with an empty body: its limits
//! ([`HYPER_MAX_HEADERS`] here) are set above ours so that most oversized requests reach this check instead.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::Response;

use super::envelope::{error_body, expects_continue, refuse_unread};
use recserve_core::error::ServiceError;

/// Longest request target (path and query) accepted, in bytes.
pub(crate) const MAX_URI_BYTES: usize = 8 * 1024;
/// Most header fields a request may carry.
pub(crate) const MAX_HEADERS: usize = 100;
/// Most bytes a request's header fields may hold, names and values.
pub(crate) const MAX_HEADER_BYTES: usize = 64 * 1024;
/// hyper's own limit on header fields (server/connections.rs sets it), above [`MAX_HEADERS`] so that a request
/// with more headers than we accept still reaches [`check`], which answers with the JSON body; beyond it, hyper
/// answers 431 with an empty body.
pub(crate) const HYPER_MAX_HEADERS: usize = 4096;

/// The middleware: refuses a request that breaks one of the bounds above, else runs the route.
pub(crate) async fn check(
    State(max_body_bytes): State<usize>,
    request: Request,
    next: Next,
) -> Response {
    let expects_continue = expects_continue(request.headers());
    let refused = refusal(request.uri(), request.headers(), max_body_bytes);
    if let Err((status, message)) = refused {
        let mut response = error_body(status, &message);
        if expects_continue || status == StatusCode::PAYLOAD_TOO_LARGE {
            // The client waits for this answer before it sends its body, and will not send it; or its body is
            // larger than what may be read to skip it: the connection cannot carry another request (hyper closes
            // it after the answer).
            response.headers_mut().insert(
                header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        if !expects_continue {
            // A client sending its body unasked reads the answer rather than a reset while it writes.
            refuse_unread(request.into_body(), max_body_bytes);
        }
        return response;
    }
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    if response.status() == StatusCode::METHOD_NOT_ALLOWED {
        return method_not_allowed(&method, &path, response);
    }
    response
}

/// Why `uri` and `headers` are refused, if they are.
fn refusal(
    uri: &Uri,
    headers: &HeaderMap,
    max_body_bytes: usize,
) -> Result<(), (StatusCode, String)> {
    let target = uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    if target > MAX_URI_BYTES {
        return Err((
            StatusCode::URI_TOO_LONG,
            format!("the request target is {target} bytes long; the limit is {MAX_URI_BYTES}"),
        ));
    }
    if headers.len() > MAX_HEADERS {
        return Err((
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "the request has {} header fields; the limit is {MAX_HEADERS}",
                headers.len()
            ),
        ));
    }
    let header_bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if header_bytes > MAX_HEADER_BYTES {
        return Err((
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "the request's header fields hold {header_bytes} bytes; the limit is {MAX_HEADER_BYTES}"
            ),
        ));
    }
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let identity = value.to_str().is_ok_and(|v| {
            v.split(',')
                .all(|coding| coding.trim().eq_ignore_ascii_case("identity"))
        });
        if !identity {
            return Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("Content-Encoding: {value:?} is not supported: send the body uncompressed"),
            ));
        }
    }
    // hyper has already refused a Content-Length that is not one number.
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(length) = length
        && length > max_body_bytes as u64
    {
        return Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            ServiceError::PayloadTooLarge {
                limit: max_body_bytes,
            }
            .to_string(),
        ));
    }
    Ok(())
}

/// axum's 405 (which carries `Allow`), with the JSON body.
fn method_not_allowed(method: &Method, path: &str, response: Response) -> Response {
    let allow = response
        .headers()
        .get(header::ALLOW)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let message = if allow.is_empty() {
        format!("{method} is not allowed on {path}")
    } else {
        format!("{method} is not allowed on {path}: use {allow}")
    };
    let mut json = error_body(StatusCode::METHOD_NOT_ALLOWED, &message);
    let (parts, _) = response.into_parts();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            json.headers_mut().insert(name, value.clone());
        }
    }
    json
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).expect("value"));
        }
        map
    }

    fn refused(uri: &str, pairs: &[(&'static str, &str)]) -> Option<(u16, String)> {
        let uri: Uri = uri.parse().expect("uri");
        refusal(&uri, &headers(pairs), 1000)
            .err()
            .map(|(status, message)| (status.as_u16(), message))
    }

    #[test]
    fn accepts_ordinary_requests() {
        assert_eq!(
            refused(
                "/v1/models/m/rank",
                &[("content-length", "1000"), ("expect", "100-continue")]
            ),
            None
        );
        assert_eq!(
            refused("/v1/models", &[("content-encoding", "identity")]),
            None
        );
        assert_eq!(
            refused("/v1/models", &[("content-encoding", "Identity, identity")]),
            None
        );
        let long = format!("/v1/models/{}", "a".repeat(MAX_URI_BYTES - 11));
        assert_eq!(refused(&long, &[]), None);
        let many: Vec<(&'static str, &str)> = vec![("x-h", "v"); MAX_HEADERS];
        assert_eq!(refused("/", &many), None);
    }

    #[test]
    fn refuses_what_breaks_a_bound_with_a_message_naming_it() {
        let long = format!("/v1/models/{}", "a".repeat(MAX_URI_BYTES));
        assert_eq!(
            refused(&long, &[]),
            Some((
                414,
                "the request target is 8203 bytes long; the limit is 8192".into()
            ))
        );
        let many: Vec<(&'static str, &str)> = vec![("x-h", "v"); MAX_HEADERS + 1];
        assert_eq!(
            refused("/", &many),
            Some((
                431,
                "the request has 101 header fields; the limit is 100".into()
            ))
        );
        let big = "v".repeat(MAX_HEADER_BYTES);
        assert_eq!(
            refused("/", &[("x-big", &big)]),
            Some((
                431,
                "the request's header fields hold 65541 bytes; the limit is 65536".into()
            ))
        );
        assert_eq!(
            refused("/", &[("content-encoding", "gzip")]),
            Some((
                415,
                "Content-Encoding: \"gzip\" is not supported: send the body uncompressed".into()
            ))
        );
        assert_eq!(
            refused("/", &[("content-encoding", "identity, br")]).map(|(s, _)| s),
            Some(415)
        );
        for pairs in [
            &[("content-length", "1001"), ("expect", "100-continue")][..],
            &[("content-length", "1001")],
        ] {
            assert_eq!(
                refused("/", pairs),
                Some((
                    413,
                    "the body is larger than the limit of 1000 bytes".into()
                )),
                "{pairs:?}"
            );
        }
    }
}
