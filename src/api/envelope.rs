//! What every HTTP route shares, below the router and the route files (which import it, never each other): the
//! mapping of service errors to HTTP responses, reading a body within `--max-body-bytes`, parsing a JSON body with
//! the path of its first problem, the deadline header, and the model named in a route's path.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::error::ServiceError;
use crate::service::{ModelRequest, Operation, Protocol};

/// The path of a per-model route: `…/models/{model}/…` or `…/models/{model}/versions/{version}/…`.
#[derive(Debug, Deserialize)]
pub struct ModelPath {
    pub model: String,
    pub version: Option<String>,
}

impl ModelPath {
    /// What the service's envelope needs of an HTTP request for this model, read now: its arrival and the
    /// deadline header. `deadline_in_body`: the body may set a deadline of its own (KServe's `timeout`).
    pub fn request(
        &self,
        protocol: Protocol,
        operation: Operation,
        headers: &HeaderMap,
        deadline_in_body: bool,
    ) -> ModelRequest<'_> {
        let arrival = Instant::now();
        ModelRequest {
            protocol,
            operation,
            model: &self.model,
            version: self.version.as_deref(),
            arrival,
            deadline: deadline_header(headers, arrival),
            deadline_in_body,
        }
    }
}

/// The HTTP status of a service error ([`ServiceError::http_status`], the one mapping).
pub fn status_of(error: &ServiceError) -> StatusCode {
    StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// `{"error": message}` with `status`: the body of every HTTP error.
pub fn error_body(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

/// `{"error": "..."}` with the mapped status; internal detail goes to the log, not to the client.
pub fn error_response(error: &ServiceError) -> Response {
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

/// The body, or why it could not be read (larger than `limit`, too slow to arrive, cut short).
pub fn body_bytes(
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

/// The first [`ServiceError`] among `error`'s sources.
fn service_error_in(error: &(dyn std::error::Error + 'static)) -> Option<ServiceError> {
    let mut source = error.source();
    while let Some(e) = source {
        if let Some(found) = e.downcast_ref::<ServiceError>() {
            return Some(found.clone());
        }
        source = e.source();
    }
    None
}

/// The header carrying a request's deadline: milliseconds from its arrival.
pub const DEADLINE_HEADER: &str = "x-recserve-deadline-ms";

/// Most milliseconds a deadline may be set ahead.
const MAX_DEADLINE_MS: u64 = 3_600_000;

/// The request's deadline from `x-recserve-deadline-ms`, counted from `arrival`.
pub fn deadline_header(
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
pub fn require_object(body: &[u8]) -> Result<(), ServiceError> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(()),
        Some(_) => Err(ServiceError::Malformed(
            "the body must be a JSON object".to_owned(),
        )),
        None => Err(ServiceError::Malformed("the body is empty".to_owned())),
    }
}

/// Parses a JSON object body, naming the path of the first problem.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ServiceError> {
    require_object(body)?;
    // Valid bodies take the plain parser; only a failed parse is repeated with path tracking, which costs a
    // share of every parse, to name the field in the error.
    if let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || inner.is_syntax() || inner.is_eof() {
            ServiceError::Malformed(inner.to_string())
        } else {
            ServiceError::invalid(path, inner.to_string())
        }
    })?;
    de.end()
        .map_err(|e| ServiceError::Malformed(e.to_string()))?;
    Ok(value)
}
