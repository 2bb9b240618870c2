//! recserve's own JSON API, `/v1` (documented in `docs/api.md`): ranking ([`rank`], decoded in one pass by
//! [`rank_body`]), recall ([`recall`]), recommend pipelines ([`recommend`]) and the model list. Decoding names the
//! exact field of every problem (`candidates[3].fields.C21`).

pub mod rank;
pub mod rank_body;
pub(crate) mod recall;
pub(crate) mod recommend;

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

use crate::service::{ServedModel, Service};
use recserve_core::registry::{self, Status};
use recserve_core::repository::Side;

/// The `/v1` routes, for [`super::router::router`] to mount.
pub(crate) fn routes() -> Router<Arc<Service>> {
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
    pub(crate) fields: HashMap<String, i64>,
    #[serde(default)]
    pub(crate) dense: Vec<f32>,
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
    /// The models serving.
    pub models: Vec<ModelInfo>,
    /// Models of the repository that do not serve now: unloaded, or whose load failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) unavailable: Vec<ModelState>,
}

/// Where a model stands beside its serving version: loading another, or its last load failed.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ModelState {
    pub(crate) name: String,
    /// `ready`, `loading`, `failed` or `unloaded`.
    pub(crate) state: String,
    /// The version being loaded, or whose load failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<u64>,
    /// Why the load failed (the file and the problem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
}

impl ModelState {
    fn of(name: &str, status: Option<&Status>) -> ModelState {
        let (state, version, reason) = match status.map(|s| &s.state) {
            None | Some(registry::ModelState::Ready) => ("ready", None, None),
            Some(registry::ModelState::Loading { version }) => ("loading", Some(*version), None),
            Some(registry::ModelState::Failed { version, reason }) => {
                ("failed", *version, Some(reason.clone()))
            }
            Some(registry::ModelState::Unloaded) => ("unloaded", None, None),
        };
        ModelState {
            name: name.to_owned(),
            state: state.to_owned(),
            version,
            reason,
        }
    }
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
    /// Per-candidate floats a rank request sends in `candidates[i].features`.
    #[serde(default)]
    pub candidate_features: Vec<String>,
    pub tables: Vec<TableInfo>,
    /// `ready`; `loading` while another version loads beside it, `failed` when the last load did (it goes on
    /// serving); `load` then says which version and why.
    #[serde(default)]
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<ModelState>,
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

pub(crate) fn model_info(model: &ServedModel, status: Option<&Status>) -> ModelInfo {
    let state = ModelState::of(&model.name, status);
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
        device: registry::Loadable::device(&model.model).to_owned(),
        description: spec.description.clone(),
        user_fields: fields_on(Side::User),
        item_fields: fields_on(Side::Item),
        item_id_field: ranking
            .and_then(|r| r.item_id_field)
            .map(|f| spec.fields[f].name.clone()),
        dense_features: ranking
            .map(|r| r.dense_features.clone())
            .unwrap_or_default(),
        candidate_features: ranking
            .map(|r| r.candidate_features.clone())
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
        state: state.state.clone(),
        load: (state.state != "ready").then_some(state),
    }
}

async fn list_models(State(service): State<Arc<Service>>) -> Response {
    let status = service.model_status();
    let served = service.models();
    let models = served
        .iter()
        .map(|m| model_info(m, status.get(&m.name)))
        .collect();
    let unavailable = status
        .iter()
        .filter(|(name, s)| s.serving.is_none() && !served.iter().any(|m| &m.name == *name))
        .map(|(name, s)| ModelState::of(name, Some(s)))
        .collect();
    axum::Json(ModelList {
        models,
        unavailable,
    })
    .into_response()
}
