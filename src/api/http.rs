//! The axum router: `/v1` JSON routes, the KServe v2 routes ([`super::kserve::http`]), health, metrics. Handlers
//! are thin: decode, call the service, encode.
//! [`status_of`] is the one mapping from service errors to HTTP statuses.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::rank_body::{RankBody, decode_rank};
use super::{Protocol, kserve, v1};
use crate::error::ServiceError;
use crate::metrics::UNKNOWN_MODEL;
use crate::service::{Readiness, ServedModel, Service};

/// The HTTP status for each service error. Exhaustive: a new variant must be mapped here.
pub fn status_of(error: &ServiceError) -> StatusCode {
    match error {
        ServiceError::InvalidInput { .. }
        | ServiceError::Malformed(_)
        | ServiceError::WrongKind { .. } => StatusCode::BAD_REQUEST,
        ServiceError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        ServiceError::ModelNotFound { .. }
        | ServiceError::VersionNotFound { .. }
        | ServiceError::PipelineNotFound { .. } => StatusCode::NOT_FOUND,
        ServiceError::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
        ServiceError::DeadlineExceeded { .. } => StatusCode::GATEWAY_TIMEOUT,
        ServiceError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        ServiceError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// `{"error": "..."}` with the mapped status; internal detail goes to the log, not to the client.
pub fn error_response(error: &ServiceError) -> Response {
    let status = status_of(error);
    if let ServiceError::Internal(detail) = error {
        tracing::error!(%detail, "internal error");
    }
    let mut response = (status, axum::Json(json!({ "error": error.to_string() }))).into_response();
    match error {
        ServiceError::Overloaded { retry_after, .. } => {
            let seconds = retry_after.as_secs().max(1);
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        // The rest of the body is not read, so the connection cannot carry another request: saying so keeps a
        // client from sending its next request on a connection that is about to close.
        ServiceError::PayloadTooLarge { .. } => {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        _ => {}
    }
    response
}

/// Builds the router. `--max-body-bytes` bounds every request body.
pub fn router(service: Arc<Service>) -> Router {
    let max_body_bytes = service.limits.max_body_bytes;
    Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/models/{model}/rank", post(rank))
        .route(
            "/v1/models/{model}/versions/{version}/rank",
            post(rank_version),
        )
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .merge(kserve::http::routes())
        .merge(super::http_recall::routes())
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(service)
}

pub(crate) fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, ServiceError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ServiceError::PayloadTooLarge { limit }
        } else {
            ServiceError::Malformed(rejection.body_text())
        }
    })
}

pub(crate) fn parse_version(version: Option<String>) -> Result<Option<u64>, ServiceError> {
    version
        .map(|v| {
            v.parse::<u64>().map_err(|_| {
                ServiceError::invalid(
                    "version",
                    format!("{v:?} in the URL is not a version number"),
                )
            })
        })
        .transpose()
}

/// The header carrying a request's deadline: milliseconds from its arrival.
pub const DEADLINE_HEADER: &str = "x-recserve-deadline-ms";

/// Most milliseconds a deadline may be set ahead.
const MAX_DEADLINE_MS: u64 = 3_600_000;

/// The request's deadline from `x-recserve-deadline-ms`, counted from `arrival`.
pub fn deadline_from(
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

async fn rank(
    State(service): State<Arc<Service>>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    rank_call(service, model, None, headers, body).await
}

async fn rank_version(
    State(service): State<Arc<Service>>,
    Path((model, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    rank_call(service, model, Some(version), headers, body).await
}

async fn rank_call(
    service: Arc<Service>,
    model: String,
    version: Option<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    model_call(service, model, version, headers, body, "rank", rank_served).await
}

/// The shape every `/v1` per-model route shares: resolve the model (and the version, when pinned in the path),
/// read the deadline header, run `serve`, answer an error with its status, and record the request under
/// `endpoint`.
pub(crate) async fn model_call<F, Fut>(
    service: Arc<Service>,
    model: String,
    version: Option<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    endpoint: &'static str,
    serve: F,
) -> Response
where
    F: FnOnce(
        Arc<Service>,
        Arc<ServedModel>,
        Option<Instant>,
        Result<Bytes, BytesRejection>,
    ) -> Fut,
    Fut: Future<Output = Result<Response, ServiceError>>,
{
    let start = Instant::now();
    let served = parse_version(version).and_then(|version| service.model(&model, version));
    let label = served.as_ref().map_or(UNKNOWN_MODEL, |m| m.name.as_str());
    let result = match (&served, deadline_from(&headers, start)) {
        (Ok(served), Ok(deadline)) => {
            serve(Arc::clone(&service), Arc::clone(served), deadline, body).await
        }
        (Err(e), _) => Err(e.clone()),
        (_, Err(e)) => Err(e),
    };
    let response = result.unwrap_or_else(|e| error_response(&e));
    service.metrics.observe_request(
        label,
        endpoint,
        Protocol::V1.as_str(),
        response.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    response
}

async fn rank_served(
    service: Arc<Service>,
    served: Arc<ServedModel>,
    deadline: Option<Instant>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ServiceError> {
    let ranking = served.ranking()?;
    // The default deadline, when the request names none, counts from now: decoding spends it too.
    let deadline = Some(ranking.deadline(deadline));
    // Under overload most requests are refused: refuse before paying for the JSON.
    ranking.precheck(deadline)?;
    let contract = &ranking.contract;
    let body = body_bytes(body, service.limits.max_body_bytes)?;
    let RankBody {
        input,
        candidate_ids,
        top_k,
    } = decode_rank(contract, &body)?;
    let scores = service.rank(&served, input, deadline).await?;
    Ok(axum::Json(v1::rank_response(
        &served.name,
        served.version,
        &candidate_ids,
        top_k,
        &scores,
    ))
    .into_response())
}

async fn list_models(State(service): State<Arc<Service>>) -> Response {
    let models = service.models().map(|m| v1::model_info(m)).collect();
    axum::Json(v1::ModelList { models }).into_response()
}

async fn live() -> Response {
    axum::Json(json!({ "status": "live" })).into_response()
}

async fn ready(State(service): State<Arc<Service>>) -> Response {
    match service.readiness() {
        Readiness::Ready => {
            (StatusCode::OK, axum::Json(json!({ "status": "ready" }))).into_response()
        }
        Readiness::Loading => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "status": "loading" })),
        )
            .into_response(),
        Readiness::ShuttingDown => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "status": "shutting down" })),
        )
            .into_response(),
    }
}

async fn metrics(State(service): State<Arc<Service>>) -> Response {
    match service.metrics.render() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => error_response(&ServiceError::Internal(format!("render metrics: {e}"))),
    }
}

async fn not_found(method: Method, uri: Uri) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({ "error": format!("no route for {method} {}", uri.path()) })),
    )
        .into_response()
}
