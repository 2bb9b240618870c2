//! The axum router: the `/v1` JSON routes ([`super::v1`]), the KServe v2 routes ([`super::kserve::http`]),
//! health and `/metrics`. `--max-body-bytes` bounds every request body; [`super::guard`] checks every request
//! before its route runs.

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::envelope::{error_body, error_response};
use super::{guard, kserve, v1};
use crate::error::ServiceError;
use crate::service::{Readiness, Service};

/// Builds the router.
pub fn router(service: Arc<Service>) -> Router {
    let max_body_bytes = service.limits.max_body_bytes;
    let routes = Router::new()
        .merge(v1::routes())
        .merge(kserve::http::routes())
        .merge(kserve::repository::routes())
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(service);
    // Around the routing rather than inside it, so that the guard sees a 405 with the Allow header axum adds.
    Router::new()
        .fallback_service(routes)
        .layer(middleware::from_fn_with_state(max_body_bytes, guard::check))
}

async fn live() -> Response {
    axum::Json(json!({ "status": "live" })).into_response()
}

async fn ready(State(service): State<Arc<Service>>) -> Response {
    let (status, word) = match service.readiness() {
        Readiness::Ready => (StatusCode::OK, "ready"),
        Readiness::Loading => (StatusCode::SERVICE_UNAVAILABLE, "loading"),
        Readiness::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting down"),
    };
    (status, axum::Json(json!({ "status": word }))).into_response()
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
    error_body(
        StatusCode::NOT_FOUND,
        &format!("no route for {method} {}", uri.path()),
    )
}
