//! What every HTTP route shares, below the router and the route files (which import it, never each other): the
//! mapping of service errors to HTTP responses, reading a body within `--max-body-bytes`, parsing a JSON body with
//! the path of its first problem, the deadline header, and the model named in a route's path.

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::path::ErrorKind;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::service::{ModelRequest, Operation, Protocol, RequestBody};
use recserve_core::error::{Echo, ServiceError};
use recserve_core::trace;

/// The path of a per-model route: `…/models/{model}/…` or `…/models/{model}/versions/{version}/…`. Extracted as
/// [`Segments`] are, and a `{version}` segment is never empty (`…/versions//…` would otherwise mean the version
/// serving, by accident).
#[derive(Debug)]
pub(crate) struct ModelPath {
    pub(crate) model: String,
    pub(crate) version: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for ModelPath {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        #[derive(Deserialize)]
        struct Raw {
            model: String,
            version: Option<String>,
        }
        let Segments(Raw { model, version }) = Segments::from_request_parts(parts, state).await?;
        if version.as_deref() == Some("") {
            return Err(error_response(&ServiceError::invalid(
                "version",
                "is empty: give a version number, or leave `/versions/{version}` out for the version serving",
            )));
        }
        Ok(ModelPath { model, version })
    }
}

/// A route's path parameters, as axum's `Path` extracts them, refused with the JSON error body of every other
/// client error (axum's own rejection is plain text), naming the segment.
pub(crate) struct Segments<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Segments<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Segments(value)),
            Err(rejection) => Err(error_response(&path_error(rejection))),
        }
    }
}

/// The client error for a path whose parameters do not extract; the rejections that only a wrong route table can
/// cause are internal errors.
fn path_error(rejection: PathRejection) -> ServiceError {
    let PathRejection::FailedToDeserializePathParams(failed) = rejection else {
        return ServiceError::Internal(rejection.body_text());
    };
    match failed.into_kind() {
        ErrorKind::InvalidUtf8InPathParam { key } => {
            ServiceError::invalid(key, "is not UTF-8 once percent-decoded")
        }
        ErrorKind::ParseErrorAtKey { key, .. } | ErrorKind::DeserializeError { key, .. }
            if key.is_empty() =>
        {
            ServiceError::invalid("path", "does not parse")
        }
        ErrorKind::DeserializeError { key, message, .. } => ServiceError::invalid(key, message),
        ErrorKind::ParseErrorAtKey {
            key, expected_type, ..
        } => ServiceError::invalid(key, format!("is not a {expected_type}")),
        ErrorKind::Message(message) => ServiceError::invalid("path", message),
        kind @ (ErrorKind::ParseErrorAtIndex { .. } | ErrorKind::ParseError { .. }) => {
            ServiceError::invalid("path", kind.to_string())
        }
        kind => ServiceError::Internal(kind.to_string()),
    }
}

impl ModelPath {
    /// What the service needs of an HTTP request for this model before its body: its arrival (its first byte) and
    /// the deadline header. `deadline_in_body`: the body may set a deadline of its own (KServe's `timeout`).
    pub(crate) fn request<'a>(
        &'a self,
        protocol: Protocol,
        operation: Operation,
        headers: &'a HeaderMap,
        deadline_in_body: bool,
    ) -> ModelRequest<'a> {
        let arrival = trace::arrival();
        ModelRequest {
            protocol,
            operation,
            model: &self.model,
            version: self.version.as_deref(),
            routing_key: routing_key(headers),
            arrival,
            deadline: deadline_header(headers, arrival),
            deadline_in_body,
        }
    }
}

/// The header a traffic split routes by: the user's id, so that a user stays on one version.
pub(crate) const ROUTING_KEY: &str = "x-recserve-routing-key";

/// The request's routing key, if it sends one (a value that is not visible ASCII counts as none).
pub(crate) fn routing_key(headers: &HeaderMap) -> Option<&str> {
    headers.get(ROUTING_KEY).and_then(|v| v.to_str().ok())
}

/// The HTTP status of a service error ([`ServiceError::http_status`], the one mapping).
pub(crate) fn status_of(error: &ServiceError) -> StatusCode {
    StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// `{"error": message}` with `status`: the body of every HTTP error.
pub(crate) fn error_body(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

/// `{"error": "..."}` with the mapped status; internal detail goes to the log, not to the client.
pub(crate) fn error_response(error: &ServiceError) -> Response {
    let status = status_of(error);
    if let ServiceError::Internal(detail) = error {
        tracing::error!(%detail, "internal error");
    }
    let mut response = error_body(status, &error.to_string());
    match error {
        ServiceError::Overloaded { retry_after, .. } => {
            let seconds = retry_after.as_secs().max(1);
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        ServiceError::Unauthenticated(_) => {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        // The rest of the body is not read, so the connection cannot carry another request: saying so keeps a
        // client from sending its next request on a connection that is about to close.
        ServiceError::PayloadTooLarge { .. } | ServiceError::BodyTimeout { .. } => {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        _ => {}
    }
    response
}

/// An HTTP request's body, unread until the service admits the request.
#[derive(Debug)]
pub(crate) struct HttpBody {
    body: Option<Body>,
    limit: usize,
    /// The client waits for `100 Continue` before it sends the body (hyper sends it at the first read).
    expects_continue: bool,
}

impl HttpBody {
    pub(crate) fn new(headers: &HeaderMap, body: Body, limit: usize) -> HttpBody {
        HttpBody {
            body: Some(body),
            limit,
            expects_continue: expects_continue(headers),
        }
    }

    /// The response to the request: `result`'s, or its error's ([`error_response`]), saying `Connection: close`
    /// when the request was refused before a client that waits for `100 Continue` sent its body.
    pub(crate) fn respond(&self, result: Result<Response, ServiceError>) -> Response {
        result.unwrap_or_else(|e| {
            let mut response = error_response(&e);
            if self.body.is_none() || !self.expects_continue {
                return response;
            }
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        })
    }
}

impl RequestBody for HttpBody {
    type Read = Bytes;

    async fn read(&mut self) -> Result<Bytes, ServiceError> {
        let body = self
            .body
            .take()
            .ok_or_else(|| ServiceError::Internal("a request body read twice".into()))?;
        read_body(body, self.limit).await
    }

    fn refused(&mut self) {
        if !self.expects_continue
            && let Some(body) = self.body.take()
        {
            refuse_unread(body, self.limit);
        }
    }
}

/// Whether a request's client waits for `100 Continue` before it sends its body.
pub(crate) fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// What is done with the body of a request refused before it was read, from a client that did not wait for
/// `100 Continue` and may be sending it now: it is read (up to `limit` + [`DRAIN_SLACK_BYTES`], each frame dropped
/// as it comes, within the body's read timeout) while the answer goes out, so that the client reads the answer
/// rather than a connection reset. Once the drain stops the connection closes; a client still writing then (a body
/// further over the limit) may see its write fail.
pub(crate) fn refuse_unread(body: Body, limit: usize) {
    tokio::spawn(async move {
        let mut body = body;
        let mut read = 0;
        while let Some(Ok(frame)) = body.frame().await {
            read += frame.data_ref().map_or(0, |d| d.len());
            if read > limit.saturating_add(DRAIN_SLACK_BYTES) {
                break;
            }
        }
    });
}

/// How far past `--max-body-bytes` a refused body is still read and dropped ([`refuse_unread`]): a body somewhat
/// over the limit (the usual mistake) is read to its end, so its client is not reset while it writes the last
/// megabytes (seen as EPIPE in `tests/kserve.rs` with 5 MiB against a 4 MiB limit when the drain stopped at the
/// limit).
const DRAIN_SLACK_BYTES: usize = 16 << 20;

/// The body whole, or why it could not be read (larger than `limit`, too slow to arrive, cut short).
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Bytes, ServiceError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) => Err(if error.downcast_ref::<LengthLimitError>().is_some() {
            ServiceError::PayloadTooLarge { limit }
        } else if let Some(found) = service_error_in(&*error) {
            // The body's own error ([`super::timed_body`]: it did not arrive in time).
            found
        } else {
            ServiceError::Malformed(causes(&*error))
        }),
    }
}

/// `error` and each of its sources, as one line (`error reading a body from connection: invalid chunk size
/// line: …`): the outermost message alone rarely says what was wrong with the bytes (hyper's says only that
/// reading failed; its source says which chunk rule the client broke).
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let message = e.to_string();
        if !line.contains(&message) {
            line.push_str(": ");
            line.push_str(&message);
        }
        source = e.source();
    }
    line
}

/// The body of a route that reads it before anything else (the repository API), or why it could not be read.
pub(crate) fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, ServiceError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ServiceError::PayloadTooLarge { limit }
        } else if let Some(error) = service_error_in(&rejection) {
            // The body's own error ([`super::timed_body`]: it did not arrive in time).
            error
        } else {
            ServiceError::Malformed(rejection.body_text())
        }
    })
}

/// The first [`ServiceError`] among `error` and its sources.
fn service_error_in(error: &(dyn std::error::Error + 'static)) -> Option<ServiceError> {
    let mut source = Some(error);
    while let Some(e) = source {
        if let Some(found) = e.downcast_ref::<ServiceError>() {
            return Some(found.clone());
        }
        source = e.source();
    }
    None
}

/// The header carrying a request's deadline: milliseconds from its arrival.
pub(crate) const DEADLINE_HEADER: &str = "x-recserve-deadline-ms";

/// Most milliseconds a deadline may be set ahead.
const MAX_DEADLINE_MS: u64 = 3_600_000;

/// The request's deadline from `x-recserve-deadline-ms`, counted from `arrival`.
pub(crate) fn deadline_header(
    headers: &HeaderMap,
    arrival: Instant,
) -> Result<Option<Instant>, ServiceError> {
    let Some(value) = headers.get(DEADLINE_HEADER) else {
        return Ok(None);
    };
    let ms = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| (1..=MAX_DEADLINE_MS).contains(ms))
        .ok_or_else(|| {
            ServiceError::invalid(
                DEADLINE_HEADER,
                format!("must be a whole number of milliseconds from 1 to {MAX_DEADLINE_MS}, got {value:?}"),
            )
        })?;
    Ok(Some(arrival + Duration::from_millis(ms)))
}

/// Refuses a body that is not a JSON object: serde also reads a struct from an array.
pub(crate) fn require_object(body: &[u8]) -> Result<(), ServiceError> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(()),
        Some(_) => Err(ServiceError::Malformed(
            "the body must be a JSON object".to_owned(),
        )),
        None => Err(ServiceError::Malformed("the body is empty".to_owned())),
    }
}

/// Parses a JSON object body, naming the path of the first problem ([`json_error`]).
pub(crate) fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ServiceError> {
    require_object(body)?;
    // Valid bodies take the plain parser; only a failed parse is repeated with path tracking, which costs a
    // share of every parse, to name the field in the error.
    if let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        json_error(body, Some(path), e.inner())
    })?;
    de.end()
        .map_err(|e| ServiceError::Malformed(e.to_string()))?;
    Ok(value)
}

/// The client error for a JSON body that serde_json refused with `e`, while reading the field at `path` (`None`
/// or `.`: outside every field). A number that JSON cannot carry (NaN, Infinity) or that no 64-bit type holds
/// (`1e400`, an integer beyond 64 bits) is described as that, at its field; other type errors name the field
/// with serde's words; syntax errors and a body cut short are malformed bodies.
pub(crate) fn json_error(body: &[u8], path: Option<String>, e: &serde_json::Error) -> ServiceError {
    let path = path.filter(|p| !p.is_empty() && p != ".");
    match path {
        Some(path) if !e.is_eof() => match number_problem(body, e) {
            Some(problem) => ServiceError::invalid(path, problem),
            None if e.is_data() => ServiceError::invalid(path, e.to_string()),
            None => ServiceError::Malformed(e.to_string()),
        },
        _ => ServiceError::Malformed(e.to_string()),
    }
}

/// What is wrong with the number serde_json stopped at, when that is the problem.
fn number_problem(body: &[u8], e: &serde_json::Error) -> Option<String> {
    let token = token_at(body, e.line(), e.column())?;
    let unsigned = token.trim_start_matches(['-', '+']);
    if ["nan", "inf", "infinity"]
        .iter()
        .any(|name| unsigned.eq_ignore_ascii_case(name))
    {
        return Some(format!(
            "{} is not a number JSON can carry (JSON has no NaN or Infinity): send a finite number",
            Echo(token)
        ));
    }
    let digits = token.strip_prefix('-').unwrap_or(token);
    let integer = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    let number = digits.starts_with(|c: char| c.is_ascii_digit())
        && digits
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
    let message = e.to_string();
    if number && message.starts_with("number out of range") {
        return Some(if integer {
            format!(
                "the integer {} is beyond the range of every 64-bit number, integer or floating point",
                Echo(token)
            )
        } else {
            format!(
                "{} is beyond the range of 64-bit floating point (about ±1.8e308)",
                Echo(token)
            )
        });
    }
    if integer && message.starts_with("invalid type: floating point") {
        let expected = message.split_once(", expected ").map_or("", |(_, rest)| {
            rest.split(" at line ").next().unwrap_or(rest)
        });
        return Some(format!(
            "the integer {} does not fit in 64 bits (expected {expected})",
            Echo(token)
        ));
    }
    None
}

/// The word of `body` (letters, digits, `+`, `-`, `.`) around the byte a serde_json error at `line` and `column`
/// points at: for a number, its last character (type errors) or its first (syntax errors).
fn token_at(body: &[u8], line: usize, column: usize) -> Option<&str> {
    let line_start = match line {
        0 | 1 => 0,
        n => {
            body.iter()
                .enumerate()
                .filter(|&(_, &b)| b == b'\n')
                .nth(n - 2)?
                .0
                + 1
        }
    };
    let at = (line_start + column).checked_sub(1)?;
    let word = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.');
    if !word(body.get(at)?) {
        return None;
    }
    let start = body[..at]
        .iter()
        .rposition(|b| !word(b))
        .map_or(0, |i| i + 1);
    let end = body[at..]
        .iter()
        .position(|b| !word(b))
        .map_or(body.len(), |i| at + i);
    std::str::from_utf8(&body[start..end]).ok()
}
