//! The model repository extension over HTTP, as Triton defines it (so `tritonclient`'s
//! `get_model_repository_index`, `load_model` and `unload_model` work): `POST /v2/repository/index`,
//! `POST /v2/repository/models/{model}/load` and `.../unload`; and recserve's own `GET` and `PUT
//! /v2/repository/models/{model}/traffic`, a model's traffic split and shadow. Every call needs the admin token
//! (`Authorization: Bearer …`); load and unload need `--model-control explicit` (docs/api.md).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::api::envelope::{Segments, body_bytes, error_response, parse_json};
use crate::config::split_of;
use crate::service::{Service, TrafficView};
use recserve_core::error::ServiceError;
use recserve_core::registry::Shadow;

/// The routes, for [`crate::api::router::router`] to mount.
pub(crate) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route("/v2/repository/index", post(index))
        .route("/v2/repository/models/{model}/load", post(load))
        .route("/v2/repository/models/{model}/unload", post(unload))
        .route(
            "/v2/repository/models/{model}/traffic",
            get(traffic).put(set_traffic),
        )
}

/// The `Authorization` header, checked against the admin token.
fn authorize(service: &Service, headers: &HeaderMap) -> Result<(), ServiceError> {
    let header = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    service.authorize_admin(header)
}

/// A body that may be empty (tritonclient sends none to `index`) or a JSON object.
fn optional_json<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, ServiceError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        parse_json(body)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexRequest {
    #[serde(default)]
    ready: bool,
}

/// The body of an index call: whether only the `READY` models are asked for.
pub(crate) fn index_request(body: &[u8]) -> Result<bool, ServiceError> {
    optional_json::<IndexRequest>(body).map(|r| r.ready)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ControlRequest {
    #[serde(default)]
    parameters: Map<String, Value>,
}

/// The body of a load: empty, or without parameters (tritonclient's `config` and `file:` overrides are refused:
/// recserve loads what the repository holds).
pub(crate) fn load_request(body: &[u8]) -> Result<(), ServiceError> {
    let request = optional_json::<ControlRequest>(body)?;
    match request.parameters.keys().min() {
        Some(key) => Err(ServiceError::invalid(
            format!("parameters.{key}"),
            "is not supported: recserve loads the model as its repository holds it",
        )),
        None => Ok(()),
    }
}

/// The body of an unload: empty or any parameters (`unload_dependents` is accepted and means nothing: recserve
/// models have no dependents).
pub(crate) fn unload_request(body: &[u8]) -> Result<(), ServiceError> {
    optional_json::<ControlRequest>(body).map(drop)
}

async fn index(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = authorize(&service, &headers)
        .and_then(|()| body_bytes(body, service.limits.max_body_bytes))
        .and_then(|body| index_request(&body))
        .and_then(|ready| service.repository_index(ready));
    match result {
        Ok(entries) => {
            let models: Vec<Value> = entries
                .into_iter()
                .map(|e| {
                    let mut entry = json!({"name": e.name, "state": e.state});
                    if !e.version.is_empty() {
                        entry["version"] = json!(e.version);
                    }
                    if !e.reason.is_empty() {
                        entry["reason"] = json!(e.reason);
                    }
                    entry
                })
                .collect();
            axum::Json(models).into_response()
        }
        Err(e) => error_response(&e),
    }
}

/// Answers a load or unload: `{}` once it is done, or the error.
fn done(result: Result<(), ServiceError>) -> Response {
    match result {
        Ok(()) => axum::Json(json!({})).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn load(
    State(service): State<Arc<Service>>,
    Segments(model): Segments<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let checked = authorize(&service, &headers)
        .and_then(|()| body_bytes(body, service.limits.max_body_bytes))
        .and_then(|body| load_request(&body));
    done(match checked {
        Ok(()) => service.load_model(&model).await.map(drop),
        Err(e) => Err(e),
    })
}

async fn unload(
    State(service): State<Arc<Service>>,
    Segments(model): Segments<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let checked = authorize(&service, &headers)
        .and_then(|()| body_bytes(body, service.limits.max_body_bytes))
        .and_then(|body| unload_request(&body));
    done(match checked {
        Ok(()) => service.unload_model(&model).await.map(drop),
        Err(e) => Err(e),
    })
}

/// The body of a traffic change: `{"split": {"7": 90, "8": 10}, "shadow": {"version": 9, "percent": 5}}`; both
/// left out (or `{}`): every request to the highest loaded version.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrafficRequest {
    #[serde(default)]
    split: std::collections::BTreeMap<String, u32>,
    #[serde(default)]
    shadow: Option<ShadowRequest>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShadowRequest {
    version: u64,
    percent: f64,
}

/// A traffic change's body, checked: the split by version, and the shadow.
pub(crate) fn traffic_request(
    body: &[u8],
) -> Result<(std::collections::BTreeMap<u64, u32>, Option<Shadow>), ServiceError> {
    let request = optional_json::<TrafficRequest>(body)?;
    let split = split_of(&request.split)
        .map_err(|(key, problem)| ServiceError::invalid(format!("split.{key}"), problem))?;
    let shadow = request.shadow.map(|s| Shadow {
        version: s.version,
        percent: s.percent,
    });
    Ok((split, shadow))
}

fn traffic_json(view: &TrafficView) -> Value {
    let split: Map<String, Value> = view
        .split
        .iter()
        .map(|(v, w)| (v.to_string(), json!(w)))
        .collect();
    let mut out = json!({"model": view.model, "versions": view.versions, "split": split});
    if let Some(s) = &view.shadow {
        out["shadow"] = json!({"version": s.version, "percent": s.percent});
    }
    out
}

async fn traffic(
    State(service): State<Arc<Service>>,
    Segments(model): Segments<String>,
    headers: HeaderMap,
) -> Response {
    match authorize(&service, &headers).and_then(|()| service.traffic(&model)) {
        Ok(view) => axum::Json(traffic_json(&view)).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn set_traffic(
    State(service): State<Arc<Service>>,
    Segments(model): Segments<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = authorize(&service, &headers)
        .and_then(|()| body_bytes(body, service.limits.max_body_bytes))
        .and_then(|body| traffic_request(&body))
        .and_then(|(split, shadow)| service.set_traffic(&model, split, shadow));
    match result {
        Ok(view) => axum::Json(traffic_json(&view)).into_response(),
        Err(e) => error_response(&e),
    }
}
