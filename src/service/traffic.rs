//! A model's traffic split and shadow while serving: what the repository API's `traffic` route reads and sets
//! (the registry swaps the split in with the snapshot; requests already running keep their route).

use std::collections::BTreeMap;

use super::Service;
use recserve_core::error::ServiceError;
use recserve_core::models::Model;
use recserve_core::registry::{Shadow, Traffic};

/// A model's loaded versions and how its requests are shared between them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TrafficView {
    pub(crate) model: String,
    /// Loaded versions, ascending.
    pub(crate) versions: Vec<u64>,
    /// Version → weight; empty: the highest loaded version takes every request.
    pub(crate) split: BTreeMap<u64, u32>,
    pub(crate) shadow: Option<Shadow>,
}

impl Service {
    /// The traffic of a served model.
    pub(crate) fn traffic(&self, name: &str) -> Result<TrafficView, ServiceError> {
        let models = self.snapshot()?;
        models.get(name, None)?;
        let traffic = models.traffic(name);
        Ok(TrafficView {
            model: name.to_owned(),
            versions: models.versions(name),
            split: traffic.map(|t| t.split.clone()).unwrap_or_default(),
            shadow: traffic.and_then(|t| t.shadow),
        })
    }

    /// Routes a served model's requests by `split` and `shadow` from now on (both empty: all to the highest
    /// loaded version). Every version named must be loaded now, and a shadow needs a ranking model (whose copies
    /// are scored and thrown away); the problem names the field.
    pub(crate) fn set_traffic(
        &self,
        name: &str,
        split: BTreeMap<u64, u32>,
        shadow: Option<Shadow>,
    ) -> Result<TrafficView, ServiceError> {
        let models = self.snapshot()?;
        let serving = models.get(name, None)?;
        let loaded = models.versions(name);
        let not_loaded = |field: String, v: u64| {
            ServiceError::invalid(
                field,
                format!("version {v} of model {name:?} is not loaded (loaded: {loaded:?})"),
            )
        };
        if let Some(&v) = split.keys().find(|v| !loaded.contains(v)) {
            return Err(not_loaded(format!("split.{v}"), v));
        }
        if let Some(s) = &shadow {
            if !loaded.contains(&s.version) {
                return Err(not_loaded("shadow.version".to_owned(), s.version));
            }
            if !matches!(serving.model, Model::Ranking(_)) {
                return Err(ServiceError::invalid(
                    "shadow",
                    format!(
                        "model {name:?} is a recall model: only ranking models take a shadow version"
                    ),
                ));
            }
        }
        let traffic = if split.is_empty() && shadow.is_none() {
            None
        } else {
            let field = if shadow.is_some() && split.is_empty() {
                "shadow"
            } else {
                "split"
            };
            Some(
                Traffic::new(split, shadow)
                    .map_err(|problem| ServiceError::invalid(field, problem))?,
            )
        };
        self.registry.set_traffic(name, traffic);
        tracing::info!(model = %name, "traffic split changed");
        self.traffic(name)
    }
}
