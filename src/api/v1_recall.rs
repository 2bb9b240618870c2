//! The `/v1` JSON bodies of recall (`POST /v1/models/{model}/recall`), recommend (`POST /v1/recommend/{pipeline}`)
//! and the pipeline list (`GET /v1/pipelines`), documented in `docs/api.md`, and their decoding into the typed
//! service inputs ([`RecallInput`], [`RecommendInput`]). Problems name the exact field (`history[3]`,
//! `user.fields.C2`).

use serde::{Deserialize, Serialize};

use super::v1::UserSide;
use crate::error::ServiceError;
use crate::pipeline::{Pipeline, RecommendInput, Recommendation};
use crate::ranking::RankContract;
use crate::recall::{RecallInput, RecallQuery, Scored};
use crate::repository::Side;

/// `POST /v1/models/{model}/recall`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RecallRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<i64>>,
    pub k: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<i64>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct RecallResponse {
    pub model: String,
    pub version: u64,
    pub items: Vec<RecalledItem>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct RecalledItem {
    pub id: i64,
    pub score: f32,
}

/// Exactly one of `user_id` and `history`.
fn recall_query(
    user_id: Option<i64>,
    history: Option<Vec<i64>>,
) -> Result<RecallQuery, ServiceError> {
    match (user_id, history) {
        (Some(id), None) => Ok(RecallQuery::UserId(id)),
        (None, Some(history)) => Ok(RecallQuery::History(history)),
        (Some(_), Some(_)) => Err(ServiceError::invalid(
            "history",
            "cannot be sent together with user_id: send one of them",
        )),
        (None, None) => Err(ServiceError::invalid(
            "user_id",
            "is missing: send user_id (a row of the user table) or history (item ids the user interacted with)",
        )),
    }
}

/// Decodes a recall request; the model checks the ids, `k` and the lengths.
pub fn recall_input(request: RecallRequest) -> Result<RecallInput, ServiceError> {
    Ok(RecallInput {
        query: recall_query(request.user_id, request.history)?,
        k: request.k,
        exclude: request.exclude,
    })
}

pub fn recall_response(model: &str, version: u64, items: &[Scored]) -> RecallResponse {
    RecallResponse {
        model: model.to_owned(),
        version,
        items: items
            .iter()
            .map(|s| RecalledItem {
                id: i64::from(s.id),
                score: s.score,
            })
            .collect(),
    }
}

/// `POST /v1/recommend/{pipeline}`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RecommendRequest {
    /// The ranking model's user side (its `side = "user"` fields and dense features).
    #[serde(default)]
    pub user: UserSide,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<i64>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
    /// Report how long each stage took.
    #[serde(default)]
    pub timings: bool,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct RecommendResponse {
    pub pipeline: String,
    pub recall_model: ModelRef,
    pub ranking_model: ModelRef,
    pub items: Vec<RecommendedItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct ModelRef {
    pub name: String,
    pub version: u64,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct RecommendedItem {
    pub id: i64,
    pub score: f32,
    pub recall_score: f32,
}

/// Milliseconds per stage (microsecond resolution); each stage includes its queueing.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct Timings {
    pub recall_ms: f64,
    pub features_ms: f64,
    pub rank_ms: f64,
    pub total_ms: f64,
}

/// The ranking model's user side of a recommend request: every `side = "user"` field (ids checked against their
/// tables' OOV policy) and the dense features, written into one rank row.
fn user_side(
    contract: &RankContract,
    user: &UserSide,
) -> Result<(Vec<i64>, Vec<f32>), ServiceError> {
    if user.dense.len() != contract.dense_features {
        return Err(ServiceError::invalid(
            "user.dense",
            format!(
                "holds {} values, but the ranking model takes {} dense features",
                user.dense.len(),
                contract.dense_features
            ),
        ));
    }
    for (i, &v) in user.dense.iter().enumerate() {
        RankContract::check_dense(v)
            .map_err(|problem| ServiceError::invalid(format!("user.dense[{i}]"), problem))?;
    }
    let mut row = vec![0i64; contract.fields()];
    for &f in &contract.user_fields {
        let name = contract.field_name(f);
        let path = format!("user.fields.{name}");
        let id = *user
            .fields
            .get(name)
            .ok_or_else(|| ServiceError::invalid(&path, "is missing"))?;
        contract
            .check_id(f, id)
            .map_err(|problem| ServiceError::invalid(&path, problem))?;
        row[f] = id;
    }
    if user.fields.len() != contract.user_fields.len() {
        let mut unknown: Vec<&String> = user
            .fields
            .keys()
            .filter(|k| {
                contract
                    .field_index(k)
                    .is_none_or(|f| contract.spec.fields[f].side != Side::User)
            })
            .collect();
        unknown.sort_unstable();
        if let Some(name) = unknown.first() {
            let problem = if contract.field_index(name).is_some() {
                "is an item-side field: recommend takes it from the ranking model's item feature table"
            } else {
                "is not a field of the ranking model"
            };
            return Err(ServiceError::invalid(
                format!("user.fields.{name}"),
                problem,
            ));
        }
    }
    Ok((row, user.dense.clone()))
}

/// Decodes a recommend request against the pipeline's ranking model; returns the input and whether the client
/// asked for timings. The recall model checks the recall side when the pipeline runs.
pub fn recommend_input(
    pipeline: &Pipeline,
    request: RecommendRequest,
) -> Result<(RecommendInput, bool), ServiceError> {
    let contract = &pipeline.ranking.ranking()?.contract;
    let (user, dense) = user_side(contract, &request.user)?;
    let query = recall_query(request.user_id, request.history)?;
    Ok((
        RecommendInput {
            user,
            dense,
            query,
            exclude: request.exclude,
            k: request.k,
        },
        request.timings,
    ))
}

pub fn recommend_response(
    pipeline: &Pipeline,
    answer: &Recommendation,
    timings: bool,
) -> RecommendResponse {
    // Whole microseconds, in milliseconds.
    let ms = |d: std::time::Duration| d.as_micros() as f64 / 1e3;
    RecommendResponse {
        pipeline: pipeline.name.clone(),
        recall_model: ModelRef {
            name: pipeline.recall.name.clone(),
            version: pipeline.recall.version,
        },
        ranking_model: ModelRef {
            name: pipeline.ranking.name.clone(),
            version: pipeline.ranking.version,
        },
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
pub struct PipelineList {
    pub pipelines: Vec<PipelineInfo>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PipelineInfo {
    pub name: String,
    pub recall_model: ModelRef,
    pub ranking_model: ModelRef,
    pub candidates: usize,
    pub k: usize,
}

pub fn pipeline_info(pipeline: &Pipeline) -> PipelineInfo {
    PipelineInfo {
        name: pipeline.name.clone(),
        recall_model: ModelRef {
            name: pipeline.recall.name.clone(),
            version: pipeline.recall.version,
        },
        ranking_model: ModelRef {
            name: pipeline.ranking.name.clone(),
            version: pipeline.ranking.version,
        },
        candidates: pipeline.config.candidates,
        k: pipeline.config.k,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::api::v1::parse_json;
    use crate::repository::ModelSpec;

    fn decode(body: &str) -> Result<RecallInput, ServiceError> {
        recall_input(parse_json(body.as_bytes())?)
    }

    #[test]
    fn decodes_recall_requests() {
        assert_eq!(
            decode(r#"{"user_id": 3, "k": 5, "exclude": [1, 2]}"#).expect("valid"),
            RecallInput {
                query: RecallQuery::UserId(3),
                k: 5,
                exclude: vec![1, 2]
            }
        );
        assert_eq!(
            decode(r#"{"history": [4, 4, 7], "k": 1}"#).expect("valid"),
            RecallInput {
                query: RecallQuery::History(vec![4, 4, 7]),
                k: 1,
                exclude: vec![]
            }
        );
        let cases = [
            (r#"{"k": 5}"#, "user_id: is missing: send user_id"),
            (
                r#"{"user_id": 1, "history": [1], "k": 5}"#,
                "history: cannot be sent together with user_id",
            ),
            (r#"{"user_id": 1}"#, "missing field `k`"),
            (
                r#"{"user_id": 1, "k": -1}"#,
                "k: invalid value: integer `-1`",
            ),
            (
                r#"{"user_id": 1.5, "k": 1}"#,
                "user_id: invalid type: floating point",
            ),
            (
                r#"{"history": [1, "x"], "k": 1}"#,
                "history[1]: invalid type: string",
            ),
            (
                r#"{"user_id": 1, "k": 1, "exclude": [null]}"#,
                "exclude[0]: invalid type: null",
            ),
            (
                r#"{"user_id": 1, "k": 1, "top_k": 3}"#,
                "unknown field `top_k`",
            ),
        ];
        for (body, expected) in cases {
            let got = decode(body).expect_err(body).to_string();
            assert!(
                got.contains(expected),
                "{body}: expected {expected:?} in {got:?}"
            );
        }
    }

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
                "user.dense: holds 0 values, but the ranking model takes 1",
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
