//! The HTTP routes of recall and recommend, merged into [`super::http::router`]: `POST
//! /v1/models/{model}/recall` (and `/versions/{version}/recall`), `POST /v1/recommend/{pipeline}` and `GET
//! /v1/pipelines`. Thin like the rank handlers: decode ([`super::v1_recall`]), call the service, encode; errors go
//! through the one status mapping, [`super::http::error_response`].

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::http::{body_bytes, deadline_from, error_response, model_call};
use super::{Protocol, v1, v1_recall};
use crate::error::ServiceError;
use crate::metrics::UNKNOWN_MODEL;
use crate::service::{ServedModel, Service};

/// The routes, for `Router::merge` (the body limit and the state are the main router's).
pub fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route("/v1/models/{model}/recall", post(recall))
        .route(
            "/v1/models/{model}/versions/{version}/recall",
            post(recall_version),
        )
        .route("/v1/recommend/{pipeline}", post(recommend))
        .route("/v1/pipelines", get(list_pipelines))
}

async fn recall(
    State(service): State<Arc<Service>>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    recall_call(service, model, None, headers, body).await
}

async fn recall_version(
    State(service): State<Arc<Service>>,
    Path((model, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    recall_call(service, model, Some(version), headers, body).await
}

async fn recall_call(
    service: Arc<Service>,
    model: String,
    version: Option<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    model_call(
        service,
        model,
        version,
        headers,
        body,
        "recall",
        recall_served,
    )
    .await
}

async fn recall_served(
    service: Arc<Service>,
    served: Arc<ServedModel>,
    deadline: Option<Instant>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ServiceError> {
    // The kind first: a ranking model's name gets "does not support recall", not a complaint about the body.
    served.recall()?;
    let body = body_bytes(body, service.limits.max_body_bytes)?;
    let input = v1_recall::recall_input(v1::parse_json(&body)?)?;
    let items = service.recall(&served, input, deadline).await?;
    Ok(axum::Json(v1_recall::recall_response(
        &served.name,
        served.version,
        &items,
    ))
    .into_response())
}

async fn recommend(
    State(service): State<Arc<Service>>,
    Path(pipeline): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let start = Instant::now();
    let found = service.pipeline(&pipeline);
    // The `model` label of recommend requests is the pipeline's name (bounded: pipelines come from the config).
    let label = found.as_ref().map_or(UNKNOWN_MODEL, |p| p.name.as_str());
    let result = match (&found, deadline_from(&headers, start)) {
        (Ok(pipeline), Ok(deadline)) => {
            async {
                let body = body_bytes(body, service.limits.max_body_bytes)?;
                let request = v1::parse_json(&body)?;
                let (input, timings) = v1_recall::recommend_input(pipeline, request)?;
                let answer = service.recommend(pipeline, input, deadline).await?;
                Ok(
                    axum::Json(v1_recall::recommend_response(pipeline, &answer, timings))
                        .into_response(),
                )
            }
            .await
        }
        (Err(e), _) => Err(e.clone()),
        (_, Err(e)) => Err(e),
    };
    let response = result.unwrap_or_else(|e: ServiceError| error_response(&e));
    service.metrics.observe_request(
        label,
        "recommend",
        Protocol::V1.as_str(),
        response.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    response
}

async fn list_pipelines(State(service): State<Arc<Service>>) -> Response {
    let pipelines = service
        .pipelines()
        .map(|p| v1_recall::pipeline_info(p))
        .collect();
    axum::Json(v1_recall::PipelineList { pipelines }).into_response()
}
