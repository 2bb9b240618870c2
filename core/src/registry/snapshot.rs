//! The versions serving at one moment: one [`Served`] version per model, in a [`Snapshot`] that each request
//! keeps to its end.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::ServiceError;
use crate::repository::ModelSpec;

/// One served version of a model.
#[derive(Debug)]
pub struct Served<M> {
    pub name: String,
    pub version: u64,
    /// Versions present in the repository, ascending.
    pub available: Vec<u64>,
    pub spec: Arc<ModelSpec>,
    pub model: M,
}

/// The models serving at one moment, by name. Requests hold it for their whole life.
#[derive(Debug)]
pub struct Snapshot<M> {
    pub(super) models: BTreeMap<String, Arc<Served<M>>>,
}

impl<M> Clone for Snapshot<M> {
    fn clone(&self) -> Self {
        Snapshot {
            models: self.models.clone(),
        }
    }
}

impl<M> Snapshot<M> {
    pub(crate) fn new(models: impl IntoIterator<Item = Served<M>>) -> Snapshot<M> {
        Snapshot {
            models: models
                .into_iter()
                .map(|m| (m.name.clone(), Arc::new(m)))
                .collect(),
        }
    }

    /// The model `name`, when it serves `version` (if one is asked for).
    pub fn get(&self, name: &str, version: Option<u64>) -> Result<&Arc<Served<M>>, ServiceError> {
        let model = self
            .models
            .get(name)
            .ok_or_else(|| ServiceError::ModelNotFound {
                model: name.to_owned(),
                served: self.names(),
            })?;
        match version {
            Some(v) if v != model.version => Err(ServiceError::VersionNotFound {
                model: name.to_owned(),
                version: v,
                serving: model.version,
            }),
            _ => Ok(model),
        }
    }

    /// Every served model, by name.
    pub fn models(&self) -> impl Iterator<Item = &Arc<Served<M>>> {
        self.models.values()
    }

    /// The served models' names, comma-separated, for messages.
    pub fn names(&self) -> String {
        self.models.keys().cloned().collect::<Vec<_>>().join(", ")
    }

    /// This snapshot with `model` in place of the version of its name (or added); returns the one it replaces.
    pub(super) fn with(&self, model: Arc<Served<M>>) -> (Snapshot<M>, Option<Arc<Served<M>>>) {
        let mut next = self.clone();
        let replaced = next.models.insert(model.name.clone(), model);
        (next, replaced)
    }

    /// This snapshot without the model `name`, and the version removed.
    pub(super) fn without(&self, name: &str) -> (Snapshot<M>, Option<Arc<Served<M>>>) {
        let mut next = self.clone();
        let removed = next.models.remove(name);
        (next, removed)
    }
}
