//! The axum router: the `/v1` JSON routes ([`super::v1`]), the KServe v2 routes ([`super::kserve::http`]),
//! health, `/metrics` and the slow-request record (`/debug/slow-requests`). `--max-body-bytes` bounds every request body; [`super::guard`] checks every request
//! before its route runs, then [`super::auth`] its bearer token (with `--inference-tokens-file`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::auth::{self, Auth};
use super::envelope::{error_body, error_response};
use super::{guard, kserve, v1};
use crate::service::{Readiness, Service};
use recserve_core::error::ServiceError;
use recserve_core::trace::slow::WINDOW;

/// Builds the router; `auth`: the inference tokens' check, if the server has tokens.
pub(crate) fn router(service: Arc<Service>, auth: Option<Auth>) -> Router {
    let max_body_bytes = service.limits.max_body_bytes;
    let routes = Router::new()
        .merge(v1::routes())
        .merge(kserve::http::routes())
        .merge(kserve::repository::routes())
        .merge(kserve::statistics::routes())
        .merge(kserve::model_config::routes())
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/debug/slow-requests", get(slow_requests))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(service);
    // Around the routing rather than inside it, so that the guard sees a 405 with the Allow header axum adds; the
    // token is checked after the guard's bounds, and before any route (or its 404) answers.
    let mut router = Router::new().fallback_service(routes);
    if let Some(auth) = auth {
        router = router.layer(middleware::from_fn_with_state(auth, auth::http));
    }
    router.layer(middleware::from_fn_with_state(max_body_bytes, guard::check))
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

/// The slowest requests of the last minute, slowest first, with their stages ([`recserve_core::trace::slow`]).
async fn slow_requests(State(service): State<Arc<Service>>) -> Response {
    let now = Instant::now();
    let traces = service.metrics.traces();
    let requests: Vec<_> = traces
        .slow()
        .slowest(now)
        .iter()
        .map(|f| {
            json!({
                "model": f.outcome.model,
                "endpoint": f.outcome.endpoint,
                "protocol": f.outcome.protocol,
                "status": f.outcome.status,
                "total_ms": ms(f.total),
                "seconds_ago": now.saturating_duration_since(f.at).as_secs_f64(),
                "stages": f.stages.iter().map(|(stage, took)| json!({
                    "stage": stage.as_str(),
                    "ms": ms(*took),
                })).collect::<Vec<_>>(),
                "batch": f.batch.map(|b| json!({
                    "id": b.id,
                    "rows": b.rows,
                    "requests": b.requests,
                    "closed_by": b.reason,
                })),
            })
        })
        .collect();
    axum::Json(json!({
        "window_seconds": WINDOW.as_secs(),
        "kept": traces.slow().keep(),
        "requests": requests,
    }))
    .into_response()
}

/// Milliseconds, to the microsecond.
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

async fn not_found(method: Method, uri: Uri) -> Response {
    error_body(
        StatusCode::NOT_FOUND,
        &format!("no route for {method} {}", uri.path()),
    )
}
