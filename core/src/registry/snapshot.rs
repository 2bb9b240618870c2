//! The versions serving at one moment: each model's loaded [`Served`] versions (one, or several under a version
//! policy) and how its requests are shared between them ([`Traffic`]), in a [`Snapshot`] that each request keeps
//! to its end.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::traffic::{Route, Traffic};
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

/// Where a request for a model goes: the version that answers it, and the shadow version that also scores a copy
/// of it, if any.
#[derive(Debug)]
pub struct Routed<M> {
    pub primary: Arc<Served<M>>,
    pub shadow: Option<Arc<Served<M>>>,
}

impl<M> Clone for Routed<M> {
    fn clone(&self) -> Self {
        Routed {
            primary: Arc::clone(&self.primary),
            shadow: self.shadow.clone(),
        }
    }
}

/// The models serving at one moment, by name and version, and each model's traffic split. Requests hold it for
/// their whole life.
#[derive(Debug)]
pub struct Snapshot<M> {
    /// Each model's loaded versions (never empty).
    pub(super) models: BTreeMap<String, BTreeMap<u64, Arc<Served<M>>>>,
    /// Splits by model name; kept whether or not the model is loaded (they are configuration).
    pub(super) traffic: BTreeMap<String, Arc<Traffic>>,
}

impl<M> Clone for Snapshot<M> {
    fn clone(&self) -> Self {
        Snapshot {
            models: self.models.clone(),
            traffic: self.traffic.clone(),
        }
    }
}

impl<M> Snapshot<M> {
    pub(crate) fn new(models: impl IntoIterator<Item = Served<M>>) -> Snapshot<M> {
        let mut by_name: BTreeMap<String, BTreeMap<u64, Arc<Served<M>>>> = BTreeMap::new();
        for m in models {
            by_name
                .entry(m.name.clone())
                .or_default()
                .insert(m.version, Arc::new(m));
        }
        Snapshot {
            models: by_name,
            traffic: BTreeMap::new(),
        }
    }

    /// The model `name`: `version` when one is asked for, else its highest loaded version (what pipelines check
    /// and unloads look at; requests are [routed](Self::route)).
    pub fn get(&self, name: &str, version: Option<u64>) -> Result<&Arc<Served<M>>, ServiceError> {
        let versions = self
            .models
            .get(name)
            .ok_or_else(|| ServiceError::ModelNotFound {
                model: name.to_owned(),
                served: self.names(),
            })?;
        match version {
            None => Ok(versions
                .values()
                .next_back()
                .expect("a served model has a version")),
            Some(v) => versions
                .get(&v)
                .ok_or_else(|| ServiceError::VersionNotFound {
                    model: name.to_owned(),
                    version: v,
                    serving: versions.keys().copied().collect(),
                }),
        }
    }

    /// Where a request for `name` goes: `version` when it names one (no shadow), else the version the model's
    /// traffic split gives its `key` (the highest loaded, without a split), and the shadow that takes it, if any.
    pub fn route(
        &self,
        name: &str,
        version: Option<u64>,
        key: Option<&[u8]>,
    ) -> Result<Routed<M>, ServiceError> {
        if version.is_some() {
            return Ok(Routed {
                primary: Arc::clone(self.get(name, version)?),
                shadow: None,
            });
        }
        let highest = self.get(name, None)?;
        let Some(traffic) = self.traffic.get(name) else {
            return Ok(Routed {
                primary: Arc::clone(highest),
                shadow: None,
            });
        };
        let versions = &self.models[name];
        let Route { version, shadow } = traffic.route(versions, key);
        Ok(Routed {
            primary: Arc::clone(&versions[&version]),
            shadow: shadow.map(|v| Arc::clone(&versions[&v])),
        })
    }

    /// Every served version of every model, by name then version.
    pub fn models(&self) -> impl Iterator<Item = &Arc<Served<M>>> {
        self.models.values().flat_map(BTreeMap::values)
    }

    /// The loaded versions of `name`, ascending (empty when it is not served).
    pub fn versions(&self, name: &str) -> Vec<u64> {
        self.models
            .get(name)
            .map(|v| v.keys().copied().collect())
            .unwrap_or_default()
    }

    /// The traffic split of `name`, if one is set.
    pub fn traffic(&self, name: &str) -> Option<&Arc<Traffic>> {
        self.traffic.get(name)
    }

    /// The served models' names, comma-separated, for messages.
    pub fn names(&self) -> String {
        self.models.keys().cloned().collect::<Vec<_>>().join(", ")
    }

    /// This snapshot with exactly `versions` (not empty, all of one name) for their model; returns the versions it
    /// no longer holds.
    pub(super) fn with(&self, versions: Vec<Arc<Served<M>>>) -> (Snapshot<M>, Vec<Arc<Served<M>>>) {
        let mut next = self.clone();
        let name = versions[0].name.clone();
        let set: BTreeMap<u64, Arc<Served<M>>> =
            versions.into_iter().map(|m| (m.version, m)).collect();
        let replaced = next
            .models
            .insert(name, set)
            .map(|old| {
                old.into_iter()
                    .filter(|(v, m)| !next_holds(&next.models, &m.name, *v, m))
                    .map(|(_, m)| m)
                    .collect()
            })
            .unwrap_or_default();
        (next, replaced)
    }

    /// This snapshot without the model `name`, and the versions removed.
    pub(super) fn without(&self, name: &str) -> (Snapshot<M>, Vec<Arc<Served<M>>>) {
        let mut next = self.clone();
        let removed = next
            .models
            .remove(name)
            .map(|v| v.into_values().collect())
            .unwrap_or_default();
        (next, removed)
    }

    /// This snapshot with `traffic` as the split of `name` (`None`: no split).
    pub fn with_traffic(&self, name: &str, traffic: Option<Arc<Traffic>>) -> Snapshot<M> {
        let mut next = self.clone();
        match traffic {
            Some(t) => next.traffic.insert(name.to_owned(), t),
            None => next.traffic.remove(name),
        };
        next
    }
}

/// Whether `models` still holds this very version (the same `Arc`, not a reload of it).
fn next_holds<M>(
    models: &BTreeMap<String, BTreeMap<u64, Arc<Served<M>>>>,
    name: &str,
    version: u64,
    served: &Arc<Served<M>>,
) -> bool {
    models
        .get(name)
        .and_then(|v| v.get(&version))
        .is_some_and(|m| Arc::ptr_eq(m, served))
}
