//! recserve's own JSON API, `/v1` (documented in `docs/api.md`): ranking ([`rank`], decoded in one pass by
//! [`rank_body`]), recall ([`recall`]), recommend pipelines ([`recommend`]) and the model list. Decoding names the
//! exact field of every problem (`candidates[3].fields.C21`).

pub mod rank;
pub mod rank_body;
pub mod recall;
pub mod recommend;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::registry;
use crate::repository::Side;
use crate::service::{ServedModel, Service};

/// The `/v1` routes, for [`super::http::router`] to mount.
pub fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route("/v1/models", get(list_models))
        .merge(rank::routes())
        .merge(recall::routes())
        .merge(recommend::routes())
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
    let shards = model.model.shard_counts();
    ModelInfo {
        name: model.name.clone(),
        version: model.version,
        available_versions: model.available.clone(),
        kind: spec.kind.as_str().to_owned(),
        precision: spec.precision().as_str().to_owned(),
        device: registry::Model::device(&model.model).to_owned(),
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

async fn list_models(State(service): State<Arc<Service>>) -> Response {
    let models = service.models().iter().map(|m| model_info(m)).collect();
    axum::Json(ModelList { models }).into_response()
}
