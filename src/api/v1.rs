//! The `/v1` JSON API: request and response bodies (documented in `docs/api.md`) and their decoding into the
//! typed service inputs. Decoding names the exact field of every problem (`candidates[3].fields.C21`). Rank bodies,
//! the hot path, are decoded by [`super::rank_body`].

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;

use serde::de::{self, DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::ServiceError;
use crate::repository::Side;
use crate::service::ServedModel;

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

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UserSide {
    #[serde(default, deserialize_with = "unique_ids")]
    pub fields: HashMap<String, i64>,
    #[serde(default)]
    pub dense: Vec<f32>,
}

/// An object of ids by field name that refuses a key given twice (serde's maps would keep the last one), as the
/// rank decoder does.
fn unique_ids<'de, D: Deserializer<'de>>(d: D) -> Result<HashMap<String, i64>, D::Error> {
    struct Ids;
    impl<'de> Visitor<'de> for Ids {
        type Value = HashMap<String, i64>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object of ids by field name")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut ids = HashMap::with_capacity(map.size_hint().unwrap_or(0));
            while let Some(name) = map.next_key::<String>()? {
                let id = map.next_value::<i64>()?;
                match ids.entry(name) {
                    Entry::Occupied(e) => {
                        return Err(de::Error::custom(format_args!(
                            "`{}` is given more than once",
                            e.key()
                        )));
                    }
                    Entry::Vacant(e) => {
                        e.insert(id);
                    }
                }
            }
            Ok(ids)
        }
    }
    d.deserialize_map(Ids)
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

/// Builds the response: every candidate in request order, or the `top_k` best (highest score first, ties by
/// request order).
pub fn rank_response(
    model: &str,
    version: u64,
    candidate_ids: &[Option<i64>],
    top_k: Option<usize>,
    scores: &[f32],
) -> RankResponse {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    if let Some(k) = top_k {
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
                id: candidate_ids[i],
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
    use super::*;

    #[test]
    fn top_k_sorts_by_score_then_request_order() {
        let scores = [0.2, 0.9, f32::NAN, 0.9, 0.5];
        let order = |k: Option<usize>| {
            let ids: Vec<Option<i64>> = (10..15).map(Some).collect();
            let resp = rank_response("m", 1, &ids, k, &scores);
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
