//! `POST /v1/recommend/{pipeline}` (recall then rank in one call) and `GET /v1/pipelines`. The body decodes
//! against the pipeline's ranking model (its user side) and recall model (`user_id` or `history`) and runs through
//! the service's envelope with both models of one snapshot.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::UserSide;
use super::recall::{recall_query, search_request};
use crate::api::envelope::{HttpBody, Segments, deadline_header, parse_json, routing_key};
use crate::service::{PipelineRequest, Protocol, ResolvedPipeline, ServedModel, Service};
use recserve_core::error::ServiceError;
use recserve_core::pipeline::{RecommendInput, Recommendation};
use recserve_core::ranking::RankContract;
use recserve_core::recall::RecallQuery;
use recserve_core::trace;

/// The routes, for [`super::routes`].
pub(crate) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route("/v1/recommend/{pipeline}", post(recommend))
        .route("/v1/pipelines", get(list_pipelines))
}

async fn recommend(
    State(service): State<Arc<Service>>,
    Segments(pipeline): Segments<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let arrival = trace::arrival();
    let request = PipelineRequest {
        protocol: Protocol::V1,
        pipeline: &pipeline,
        routing_key: routing_key(&headers),
        arrival,
        deadline: deadline_header(&headers, arrival),
    };
    let mut body = HttpBody::new(&headers, body, service.limits.max_body_bytes);
    let result = service
        .pipeline_call(request, &mut body, |call, body| async move {
            let (input, timings) = recommend_input(&call.pipeline, parse_json(&body)?)?;
            let answer = call.recommend(input).await?;
            Ok(axum::Json(recommend_response(&call.pipeline, &answer, timings)).into_response())
        })
        .await;
    body.respond(result)
}

async fn list_pipelines(State(service): State<Arc<Service>>) -> Response {
    let pipelines = service.pipelines().iter().map(pipeline_info).collect();
    axum::Json(PipelineList { pipelines }).into_response()
}

/// `POST /v1/recommend/{pipeline}`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecommendRequest {
    /// The ranking model's user side (its `side = "user"` fields and dense features).
    #[serde(default)]
    pub(crate) user: Option<UserSide>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) user_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) history: Option<Vec<i64>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) exclude: Vec<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) k: Option<usize>,
    /// `true`: the recall stage scores every item, even when its model has an IVF index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) exact: Option<bool>,
    /// Lists of the recall model's IVF index to scan (1 to its `nlist`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) nprobe: Option<usize>,
    /// Report how long each stage took.
    #[serde(default)]
    pub(crate) timings: bool,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct RecommendResponse {
    pub(crate) pipeline: String,
    pub(crate) recall_model: ModelRef,
    pub(crate) ranking_model: ModelRef,
    pub(crate) items: Vec<RecommendedItem>,
    /// For a `history` request: how many of its distinct items have a history vector (were seen in training).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) history_used: Option<usize>,
    /// `"popularity"` when the history carried no signal and the candidates are the recall model's most popular
    /// items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fallback: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) timings: Option<Timings>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct ModelRef {
    pub(crate) name: String,
    pub(crate) version: u64,
}

impl ModelRef {
    fn of(model: &ServedModel) -> ModelRef {
        ModelRef {
            name: model.name.clone(),
            version: model.version,
        }
    }
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct RecommendedItem {
    pub(crate) id: i64,
    pub(crate) score: f32,
    pub(crate) recall_score: f32,
}

/// Milliseconds per stage (microsecond resolution); each stage includes its queueing.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct Timings {
    pub(crate) recall_ms: f64,
    pub(crate) features_ms: f64,
    pub(crate) rank_ms: f64,
    pub(crate) total_ms: f64,
}

/// The ranking model's user side of a recommend request: every `side = "user"` field (ids checked against their
/// tables' OOV policy) and the dense features, written into one rank row.
fn user_side(
    contract: &RankContract,
    user: &UserSide,
) -> Result<(Vec<i64>, Vec<f32>), ServiceError> {
    contract.check_dense_values(&user.dense)?;
    let mut row = vec![0i64; contract.fields()];
    contract.fill_fields(
        "user.fields",
        &user.fields,
        &contract.user_fields,
        |name| {
            if contract.field_index(name).is_some() {
                "is an item-side field: recommend takes it from the ranking model's item feature table"
            } else {
                "is not a field of the ranking model"
            }
        },
        &mut row,
    )?;
    Ok((row, user.dense.clone()))
}

/// Decodes a recommend request against the pipeline's ranking model; returns the input and whether the client
/// asked for timings. The recall model checks the recall side when the pipeline runs.
pub(crate) fn recommend_input(
    pipeline: &ResolvedPipeline,
    request: RecommendRequest,
) -> Result<(RecommendInput, bool), ServiceError> {
    let contract = &pipeline.ranking.ranking()?.contract;
    contract.check_user_given(request.user.is_some())?;
    let (user, dense) = user_side(contract, &request.user.unwrap_or_default())?;
    // With a ranker that takes the co-occurrence with the user's history, a `user_id` request also sends its
    // history: recall embeds the user by id, the ranker's feature reads the history.
    let (query, history) = match (request.user_id, request.history) {
        (Some(id), Some(items)) if pipeline.pipeline.takes_history() => {
            (RecallQuery::UserId(id), Some(items))
        }
        (user_id, history) => (recall_query(user_id, history)?, None),
    };
    Ok((
        RecommendInput {
            user,
            dense,
            query,
            history,
            exclude: request.exclude,
            k: request.k,
            search: search_request(request.exact, request.nprobe)?,
        },
        request.timings,
    ))
}

pub(crate) fn recommend_response(
    pipeline: &ResolvedPipeline,
    answer: &Recommendation,
    timings: bool,
) -> RecommendResponse {
    // Whole microseconds, in milliseconds.
    let ms = |d: std::time::Duration| d.as_micros() as f64 / 1e3;
    RecommendResponse {
        pipeline: pipeline.pipeline.name.clone(),
        recall_model: ModelRef::of(&pipeline.recall),
        ranking_model: ModelRef::of(&pipeline.ranking),
        history_used: answer.history_used,
        fallback: answer.fallback.map(|f| f.as_str().to_owned()),
        items: answer
            .items
            .iter()
            .map(|item| RecommendedItem {
                id: i64::from(item.id),
                score: item.score,
                recall_score: item.recall_score,
            })
            .collect(),
        timings: timings.then(|| Timings {
            recall_ms: ms(answer.timings.recall),
            features_ms: ms(answer.timings.features),
            rank_ms: ms(answer.timings.rank),
            total_ms: ms(answer.timings.total),
        }),
    }
}

/// `GET /v1/pipelines`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PipelineList {
    pub(crate) pipelines: Vec<PipelineInfo>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PipelineInfo {
    pub(crate) name: String,
    pub(crate) recall_model: ModelRef,
    pub(crate) ranking_model: ModelRef,
    pub(crate) candidates: usize,
    pub(crate) k: usize,
}

pub(crate) fn pipeline_info(pipeline: &ResolvedPipeline) -> PipelineInfo {
    PipelineInfo {
        name: pipeline.pipeline.name.clone(),
        recall_model: ModelRef::of(&pipeline.recall),
        ranking_model: ModelRef::of(&pipeline.ranking),
        candidates: pipeline.pipeline.config.candidates,
        k: pipeline.pipeline.config.k,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::api::envelope::parse_json;
    use recserve_core::repository::ModelSpec;

    const RANKING: &str = r#"
format_version = 1
kind = "deepfm"
[ranking]
dense_features = ["d0"]
item_id_field = "item"
[dense_graph]
file = "g.onnx"
precision = "fp32"
[[tables]]
name = "u"
file = "t.safetensors"
rows = 10
dim = 3
storage = "fp32"
oov = "reject"
[[tables]]
name = "item"
file = "t.safetensors"
rows = 100
dim = 3
storage = "fp32"
[[fields]]
name = "u"
side = "user"
[[fields]]
name = "item"
side = "item"
"#;

    #[test]
    fn checks_the_ranking_user_side() {
        let contract = RankContract::new(Arc::new(ModelSpec::parse(RANKING).expect("spec")), 10);
        let side = |json: &str| -> Result<(Vec<i64>, Vec<f32>), ServiceError> {
            let user: UserSide = parse_json(json.as_bytes())?;
            user_side(&contract, &user)
        };
        assert_eq!(
            side(r#"{"fields": {"u": 4}, "dense": [1.5]}"#).expect("valid"),
            (vec![4, 0], vec![1.5])
        );
        let cases = [
            (
                r#"{"fields": {}, "dense": [1]}"#,
                "user.fields.u: is missing",
            ),
            (
                r#"{"fields": {"u": 10}, "dense": [1]}"#,
                "user.fields.u: id 10 is outside the vocabulary",
            ),
            (
                r#"{"fields": {"u": 1, "item": 3}, "dense": [1]}"#,
                "user.fields.item: is an item-side field: recommend takes it",
            ),
            (
                r#"{"fields": {"u": 1, "zz": 3}, "dense": [1]}"#,
                "user.fields.zz: is not a field of the ranking model",
            ),
            (
                r#"{"fields": {"u": 1}, "dense": []}"#,
                "user.dense: holds 0 values, but the model takes 1",
            ),
            (
                r#"{"fields": {"u": 1}, "dense": [1e39]}"#,
                "user.dense[0]: must be a finite number",
            ),
        ];
        for (json, expected) in cases {
            let got = side(json).expect_err(json).to_string();
            assert!(
                got.contains(expected),
                "{json}: expected {expected:?} in {got:?}"
            );
        }
    }
}
