//! Triton's statistics extension: `GET /v2/models/stats` (every served model), `GET /v2/models/{model}/stats` and
//! `GET /v2/models/{model}/versions/{version}/stats` here, gRPC `ModelStatistics` in [`super::grpc`]; both encode
//! the list [`statistics`] reads. Each served model version keeps its own counts from its load on
//! ([`recserve_core::batching::Statistics`]); how recserve's stages map onto Triton's fields is in docs/api.md.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::grpc::proto;
use crate::api::envelope::{ModelPath, error_response};
use crate::service::Service;
use recserve_core::batching::{DurationStat, StatisticsSnapshot};
use recserve_core::error::ServiceError;

/// The routes, for [`crate::api::router::router`] to mount.
pub(crate) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route("/v2/models/stats", get(every_model))
        .route("/v2/models/{model}/stats", get(one_model))
        .route(
            "/v2/models/{model}/versions/{version}/stats",
            get(one_model),
        )
}

/// The statistics of one served model version.
#[derive(Debug)]
pub(crate) struct ModelStatistics {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) stats: StatisticsSnapshot,
}

/// The statistics of `model` (every served model when `None` or empty) at `version` (the served one when `None` or
/// empty). A model or version that is not served is an error (404 / NOT_FOUND), as is a version without a model.
pub(crate) fn statistics(
    service: &Service,
    model: Option<&str>,
    version: Option<&str>,
) -> Result<Vec<ModelStatistics>, ServiceError> {
    let served = match model.filter(|m| !m.is_empty()) {
        Some(name) => vec![service.model(name, version)?],
        None if version.is_some_and(|v| !v.is_empty()) => {
            return Err(ServiceError::invalid(
                "version",
                "needs a model name: statistics of every model are of the versions they serve",
            ));
        }
        None => {
            service.snapshot()?;
            service.models()
        }
    };
    Ok(served
        .iter()
        .map(|m| ModelStatistics {
            name: m.name.clone(),
            version: m.version.to_string(),
            stats: m.model.statistics(),
        })
        .collect())
}

fn duration_json(d: DurationStat) -> Value {
    json!({ "count": d.count, "ns": d.ns })
}

/// `$stats_model_response`.
pub(crate) fn to_json(models: &[ModelStatistics]) -> Value {
    let model_stats: Vec<Value> = models
        .iter()
        .map(|m| {
            let s = &m.stats;
            let batch_stats: Vec<Value> = s
                .batch_sizes
                .iter()
                .map(|b| {
                    json!({
                        "batch_size": b.batch_size,
                        "compute_input": duration_json(b.compute_input),
                        "compute_infer": duration_json(b.compute_infer),
                        "compute_output": duration_json(b.compute_output),
                    })
                })
                .collect();
            json!({
                "name": m.name,
                "version": m.version,
                "last_inference": s.last_inference_ms,
                "inference_count": s.inference_count,
                "execution_count": s.execution_count,
                "inference_stats": {
                    "success": duration_json(s.success),
                    "fail": duration_json(s.fail),
                    "queue": duration_json(s.queue),
                    "compute_input": duration_json(s.compute_input),
                    "compute_infer": duration_json(s.compute_infer),
                    "compute_output": duration_json(s.compute_output),
                    "cache_hit": duration_json(DurationStat::default()),
                    "cache_miss": duration_json(DurationStat::default()),
                },
                "batch_stats": batch_stats,
            })
        })
        .collect();
    json!({ "model_stats": model_stats })
}

fn duration_proto(d: DurationStat) -> Option<proto::StatisticDuration> {
    Some(proto::StatisticDuration {
        count: d.count,
        ns: d.ns,
    })
}

/// `ModelStatisticsResponse`.
pub(crate) fn to_proto(models: Vec<ModelStatistics>) -> proto::ModelStatisticsResponse {
    let model_stats = models
        .into_iter()
        .map(|m| {
            let s = m.stats;
            proto::ModelStatistics {
                name: m.name,
                version: m.version,
                last_inference: s.last_inference_ms,
                inference_count: s.inference_count,
                execution_count: s.execution_count,
                inference_stats: Some(proto::InferStatistics {
                    success: duration_proto(s.success),
                    fail: duration_proto(s.fail),
                    queue: duration_proto(s.queue),
                    compute_input: duration_proto(s.compute_input),
                    compute_infer: duration_proto(s.compute_infer),
                    compute_output: duration_proto(s.compute_output),
                    cache_hit: duration_proto(DurationStat::default()),
                    cache_miss: duration_proto(DurationStat::default()),
                }),
                batch_stats: s
                    .batch_sizes
                    .iter()
                    .map(|b| proto::InferBatchStatistics {
                        batch_size: b.batch_size,
                        compute_input: duration_proto(b.compute_input),
                        compute_infer: duration_proto(b.compute_infer),
                        compute_output: duration_proto(b.compute_output),
                    })
                    .collect(),
            }
        })
        .collect();
    proto::ModelStatisticsResponse { model_stats }
}

fn answer(result: Result<Vec<ModelStatistics>, ServiceError>) -> Response {
    match result {
        Ok(models) => axum::Json(to_json(&models)).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn every_model(State(service): State<Arc<Service>>) -> Response {
    answer(statistics(&service, None, None))
}

async fn one_model(State(service): State<Arc<Service>>, path: ModelPath) -> Response {
    answer(statistics(
        &service,
        Some(&path.model),
        path.version.as_deref(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use recserve_core::batching::BatchSizeStat;

    fn sample() -> Vec<ModelStatistics> {
        let d = |count, ns| DurationStat { count, ns };
        vec![ModelStatistics {
            name: "deepfm".into(),
            version: "3".into(),
            stats: StatisticsSnapshot {
                last_inference_ms: 1_700_000_000_000,
                inference_count: 300,
                execution_count: 2,
                success: d(3, 9_000),
                fail: d(1, 500),
                queue: d(3, 600),
                compute_input: d(3, 1_200),
                compute_infer: d(3, 3_000),
                compute_output: d(3, 300),
                batch_sizes: vec![BatchSizeStat {
                    batch_size: 100,
                    compute_input: d(2, 800),
                    compute_infer: d(2, 2_000),
                    compute_output: d(2, 200),
                }],
            },
        }]
    }

    #[test]
    fn json_and_proto_carry_the_same_numbers_under_tritons_names() {
        let json = to_json(&sample());
        let m = &json["model_stats"][0];
        assert_eq!((&m["name"], &m["version"]), (&json!("deepfm"), &json!("3")));
        assert_eq!(m["last_inference"], 1_700_000_000_000u64);
        assert_eq!(
            (&m["inference_count"], &m["execution_count"]),
            (&json!(300), &json!(2))
        );
        assert_eq!(
            m["inference_stats"]["success"],
            json!({"count": 3, "ns": 9000})
        );
        assert_eq!(
            m["inference_stats"]["cache_hit"],
            json!({"count": 0, "ns": 0})
        );
        assert_eq!(m["batch_stats"][0]["batch_size"], 100);
        assert_eq!(
            m["batch_stats"][0]["compute_infer"],
            json!({"count": 2, "ns": 2000})
        );

        let p = to_proto(sample());
        let m = &p.model_stats[0];
        let stats = m.inference_stats.as_ref().expect("inference_stats");
        assert_eq!(
            stats.fail,
            duration_proto(DurationStat { count: 1, ns: 500 })
        );
        assert_eq!(
            stats.queue,
            duration_proto(DurationStat { count: 3, ns: 600 })
        );
        assert_eq!((m.inference_count, m.execution_count), (300, 2));
        assert_eq!(m.batch_stats[0].batch_size, 100);
        assert_eq!(
            m.batch_stats[0].compute_output,
            duration_proto(DurationStat { count: 2, ns: 200 })
        );
    }
}
