//! The `/v1` JSON API: request and response bodies (documented in `docs/api.md`) and their decoding into the
//! typed service inputs. Decoding names the exact field of every problem (`candidates[3].fields.C21`).

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::ServiceError;
use crate::ranking::{RankContract, RankInput};
use crate::repository::Side;
use crate::service::ServedModel;

/// Parses a JSON object body, naming the path of the first problem.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ServiceError> {
    // serde also reads a struct from an array; a request body must be an object.
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(_) => {
            return Err(ServiceError::Malformed(
                "the body must be a JSON object".to_owned(),
            ));
        }
        None => return Err(ServiceError::Malformed("the body is empty".to_owned())),
    }
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

/// `POST /v1/models/{model}/rank`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RankRequest {
    #[serde(default)]
    pub user: UserSide,
    pub candidates: Vec<Candidate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UserSide {
    #[serde(default)]
    pub fields: HashMap<String, i64>,
    #[serde(default)]
    pub dense: Vec<f32>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<i64>,
    #[serde(default)]
    pub fields: HashMap<String, i64>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct RankResponse {
    pub model: String,
    pub version: u64,
    pub scores: Vec<ScoredCandidate>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct ScoredCandidate {
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<i64>,
    pub score: f32,
}

/// Checks one `fields` object against the fields it must hold exactly, writing each id into `row`.
fn fill_fields(
    contract: &RankContract,
    path: &str,
    given: &HashMap<String, i64>,
    expected: &[usize],
    side: Side,
    row: &mut [i64],
) -> Result<(), ServiceError> {
    for &f in expected {
        let name = contract.field_name(f);
        let id = *given
            .get(name)
            .ok_or_else(|| ServiceError::invalid(format!("{path}.{name}"), "is missing"))?;
        contract
            .check_id(f, id)
            .map_err(|problem| ServiceError::invalid(format!("{path}.{name}"), problem))?;
        row[f] = id;
    }
    if given.len() != expected.len() {
        let mut unknown: Vec<&String> = given
            .keys()
            .filter(|k| {
                !expected
                    .iter()
                    .any(|&f| contract.field_name(f) == k.as_str())
            })
            .collect();
        unknown.sort_unstable();
        if let Some(name) = unknown.first() {
            let problem = match contract.field_index(name) {
                Some(f) if Some(f) == contract.item_id_field => {
                    "is the model's item_id_field: send it as the candidate's `id`, not in `fields`"
                        .to_owned()
                }
                Some(_) if side == Side::User => {
                    "is an item-side field: send it in candidates[i].fields".to_owned()
                }
                Some(_) => "is a user-side field: send it in user.fields".to_owned(),
                None => "is not a field of this model".to_owned(),
            };
            return Err(ServiceError::invalid(format!("{path}.{name}"), problem));
        }
    }
    Ok(())
}

/// Expands a rank request into rows: the user side repeated for every candidate.
pub fn rank_input(contract: &RankContract, req: &RankRequest) -> Result<RankInput, ServiceError> {
    let rows = req.candidates.len();
    contract
        .check_rows(rows)
        .map_err(|problem| ServiceError::invalid("candidates", problem))?;
    if req.top_k == Some(0) {
        return Err(ServiceError::invalid("top_k", "must be at least 1"));
    }
    if req.user.dense.len() != contract.dense_features {
        return Err(ServiceError::invalid(
            "user.dense",
            format!(
                "holds {} values, but the model takes {} dense features",
                req.user.dense.len(),
                contract.dense_features
            ),
        ));
    }
    for (i, &v) in req.user.dense.iter().enumerate() {
        RankContract::check_dense(v)
            .map_err(|problem| ServiceError::invalid(format!("user.dense[{i}]"), problem))?;
    }

    let nf = contract.fields();
    let mut user_row = vec![0i64; nf];
    fill_fields(
        contract,
        "user.fields",
        &req.user.fields,
        &contract.user_fields,
        Side::User,
        &mut user_row,
    )?;

    let mut ids = Vec::with_capacity(rows * nf);
    for (i, c) in req.candidates.iter().enumerate() {
        let start = ids.len();
        ids.extend_from_slice(&user_row);
        let row = &mut ids[start..];
        let path = format!("candidates[{i}].fields");
        fill_fields(
            contract,
            &path,
            &c.fields,
            &contract.item_fields,
            Side::Item,
            row,
        )?;
        if let Some(f) = contract.item_id_field {
            let id = c.id.ok_or_else(|| {
                ServiceError::invalid(
                    format!("candidates[{i}].id"),
                    format!(
                        "is required: it is the value of the model's item_id_field {:?}",
                        contract.field_name(f)
                    ),
                )
            })?;
            contract
                .check_id(f, id)
                .map_err(|problem| ServiceError::invalid(format!("candidates[{i}].id"), problem))?;
            row[f] = id;
        }
    }
    let dense = req.user.dense.repeat(rows);
    Ok(RankInput { rows, ids, dense })
}

/// Builds the response: every candidate in request order, or the `top_k` best (highest score first, ties by
/// request order).
pub fn rank_response(model: &str, version: u64, req: &RankRequest, scores: &[f32]) -> RankResponse {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    if let Some(k) = req.top_k {
        // NaN (a broken model) sorts last rather than first.
        let key = |i: usize| {
            if scores[i].is_nan() {
                f32::NEG_INFINITY
            } else {
                scores[i]
            }
        };
        let by_score = |a: &usize, b: &usize| key(*b).total_cmp(&key(*a)).then(a.cmp(b));
        if k < order.len() {
            order.select_nth_unstable_by(k - 1, by_score);
            order.truncate(k);
        }
        order.sort_unstable_by(by_score);
    }
    RankResponse {
        model: model.to_owned(),
        version,
        scores: order
            .into_iter()
            .map(|i| ScoredCandidate {
                index: i,
                id: req.candidates[i].id,
                score: scores[i],
            })
            .collect(),
    }
}

/// `GET /v1/models`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ModelList {
    pub models: Vec<ModelInfo>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: String,
    pub version: u64,
    pub available_versions: Vec<u64>,
    pub kind: String,
    pub precision: String,
    pub device: String,
    pub description: String,
    pub user_fields: Vec<String>,
    pub item_fields: Vec<String>,
    pub item_id_field: Option<String>,
    pub dense_features: Vec<String>,
    pub tables: Vec<TableInfo>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TableInfo {
    pub name: String,
    pub rows: u64,
    pub dim: usize,
    pub storage: String,
    pub oov: String,
    pub shards: usize,
    pub bytes: u64,
}

pub fn model_info(model: &ServedModel) -> ModelInfo {
    let spec = &model.spec;
    let fields_on = |side: Side| {
        spec.fields
            .iter()
            .filter(|f| f.side == side)
            .map(|f| f.name.clone())
            .collect()
    };
    let ranking = spec.ranking.as_ref();
    let shards = model.handle.shard_counts();
    ModelInfo {
        name: model.name.clone(),
        version: model.version,
        available_versions: model.available.clone(),
        kind: spec.kind.as_str().to_owned(),
        precision: spec.precision().as_str().to_owned(),
        device: model.handle.device().to_owned(),
        description: spec.description.clone(),
        user_fields: fields_on(Side::User),
        item_fields: fields_on(Side::Item),
        item_id_field: ranking
            .and_then(|r| r.item_id_field)
            .map(|f| spec.fields[f].name.clone()),
        dense_features: ranking
            .map(|r| r.dense_features.clone())
            .unwrap_or_default(),
        tables: spec
            .tables
            .iter()
            .zip(shards.iter().copied().chain(std::iter::repeat(1)))
            .map(|(t, shards)| TableInfo {
                name: t.spec.name.clone(),
                rows: t.spec.rows,
                dim: t.spec.dim,
                storage: t.spec.storage.as_str().to_owned(),
                oov: t.spec.oov.as_str().to_owned(),
                shards,
                bytes: t.spec.bytes(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::repository::ModelSpec;

    const SPEC: &str = r#"
format_version = 1
kind = "deepfm"
[ranking]
dense_features = ["d0", "d1"]
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
[[tables]]
name = "cat"
file = "t.safetensors"
rows = 5
dim = 3
storage = "fp32"
oov = "reject"
[[fields]]
name = "u"
side = "user"
[[fields]]
name = "item"
side = "item"
[[fields]]
name = "cat"
side = "item"
"#;

    fn contract() -> RankContract {
        RankContract::new(Arc::new(ModelSpec::parse(SPEC).expect("spec")), 3)
    }

    fn decode(body: &str) -> Result<RankInput, ServiceError> {
        let request: RankRequest = parse_json(body.as_bytes())?;
        rank_input(&contract(), &request)
    }

    fn message(body: &str) -> String {
        decode(body).expect_err("must be refused").to_string()
    }

    #[test]
    fn expands_user_side_to_every_candidate() {
        let input = decode(
            r#"{"user": {"fields": {"u": 7}, "dense": [0.5, -1]},
                "candidates": [{"id": 42, "fields": {"cat": 1}}, {"id": 3, "fields": {"cat": 4}}]}"#,
        )
        .expect("valid");
        assert_eq!(input.rows, 2);
        assert_eq!(input.ids, vec![7, 42, 1, 7, 3, 4]);
        assert_eq!(input.dense, vec![0.5, -1.0, 0.5, -1.0]);
    }

    #[test]
    fn out_of_vocabulary_ids_pass_only_for_default_tables() {
        // `item` has oov = "default": any id passes here and reads the default row in the gather.
        let input = decode(r#"{"user": {"fields": {"u": 0}, "dense": [0, 0]}, "candidates": [{"id": -5, "fields": {"cat": 0}}]}"#)
            .expect("default policy");
        assert_eq!(input.ids, vec![0, -5, 0]);
    }

    #[test]
    fn names_the_field_of_every_problem() {
        let ok_user = r#""user": {"fields": {"u": 1}, "dense": [0, 0]}"#;
        let cases = [
            (r#"{"user": "#.to_owned(), "malformed request body: EOF while parsing"),
            (format!(r#"{{{ok_user}}}"#), "missing field `candidates`"),
            (format!(r#"{{{ok_user}, "candidates": []}}"#), "candidates: must hold at least one candidate"),
            (
                format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}}}, {{"id": 1, "fields": {{"cat": 0}}}}, {{"id": 1, "fields": {{"cat": 0}}}}, {{"id": 1, "fields": {{"cat": 0}}}}]}}"#),
                "candidates: holds 4 candidates, more than the limit of 3",
            ),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": "x"}}}}]}}"#), "candidates[0].fields.cat: invalid type: string \"x\", expected i64"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1.5, "fields": {{"cat": 0}}}}]}}"#), "candidates[0].id: invalid type: floating point"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{}}}}]}}"#), "candidates[0].fields.cat: is missing"),
            (format!(r#"{{{ok_user}, "candidates": [{{"fields": {{"cat": 0}}}}]}}"#), "candidates[0].id: is required: it is the value of the model's item_id_field \"item\""),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 5}}}}]}}"#), "candidates[0].fields.cat: id 5 is outside the vocabulary of table \"cat\" (ids 0..5), which rejects unknown ids"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0, "item": 1}}}}]}}"#), "candidates[0].fields.item: is the model's item_id_field"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0, "u": 1}}}}]}}"#), "candidates[0].fields.u: is a user-side field"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0, "zz": 1}}}}]}}"#), "candidates[0].fields.zz: is not a field of this model"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}}}], "top_k": 0}}"#), "top_k: must be at least 1"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}}}], "extra": 1}}"#), "unknown field `extra`"),
            (r#"{"user": {"fields": {"u": 10}, "dense": [0, 0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.fields.u: id 10 is outside the vocabulary"),
            (r#"{"user": {"fields": {"u": 1, "cat": 1}, "dense": [0, 0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.fields.cat: is an item-side field"),
            (r#"{"user": {"fields": {}, "dense": [0, 0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.fields.u: is missing"),
            (r#"{"user": {"fields": {"u": 1}, "dense": [0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.dense: holds 1 values, but the model takes 2 dense features"),
            (r#"{"user": {"fields": {"u": 1}, "dense": [0, 1e39]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.dense[1]: must be a finite number, got inf"),
            (r#"{"user": {"fields": {"u": 1}, "dense": [0, NaN]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "malformed request body"),
            (r#"{"user": {"fields": {"u": 1}, "dense": [0, "1"]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.dense[1]: invalid type: string"),
            (r#"{"user": {"fields": {"u": 99999999999999999999}, "dense": [0, 0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.fields.u"),
            ("[]".to_owned(), "malformed request body"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}}}]}} trailing"#), "malformed request body: trailing characters"),
        ];
        for (body, expected) in cases {
            let got = message(&body);
            assert!(
                got.contains(expected),
                "for {body}\nexpected {expected:?}\ngot      {got:?}"
            );
        }
    }

    #[test]
    fn top_k_sorts_by_score_then_request_order() {
        let scores = [0.2, 0.9, f32::NAN, 0.9, 0.5];
        let order = |k: Option<usize>| {
            let mut req: RankRequest = parse_json(
                br#"{"candidates": [{"id": 10}, {"id": 11}, {"id": 12}, {"id": 13}, {"id": 14}]}"#,
            )
            .expect("parse");
            req.top_k = k;
            let resp = rank_response("m", 1, &req, &scores);
            resp.scores
                .iter()
                .map(|s| (s.index, s.id))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            order(Some(3)),
            vec![(1, Some(11)), (3, Some(13)), (4, Some(14))]
        );
        assert_eq!(order(Some(1)), vec![(1, Some(11))]);
        assert_eq!(
            order(Some(9)),
            vec![
                (1, Some(11)),
                (3, Some(13)),
                (4, Some(14)),
                (0, Some(10)),
                (2, Some(12))
            ]
        );
        assert_eq!(
            order(None),
            (0..5).map(|i| (i, Some(10 + i as i64))).collect::<Vec<_>>()
        );
    }
}
