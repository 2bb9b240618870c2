//! Which version of each model serves now. The registry loads the models of a repository (each through its
//! kind's loader, [`Model::load`], which the service implements above it), keeps them as one [`Snapshot`] behind
//! an `Arc`, and hands that snapshot to every request, which keeps it to its end: a request finishes on the
//! versions it started on, and a recommend call uses one snapshot for both of its models. What loading needs
//! besides the model itself (the server's settings, ONNX Runtime, the metrics) is a [`LoadContext`].
//!
//! The registry is generic over the model type so that it knows nothing of model kinds: `ranking` and `recall`
//! sit above it and read their [`LoadContext`] from here, and its bookkeeping is tested with a model of its own.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Instant;

use crate::batching::BatchSettings;
use crate::config::{Config, Switch};
use crate::error::{LoadError, ServiceError};
use crate::executor::{Runtime, SessionOptions};
use crate::gpu::Placement;
use crate::metrics::Metrics;
use crate::repository::{self, ModelSpec, ModelVersion};

/// What loading a model needs besides the model itself.
#[derive(Debug, Clone)]
pub struct LoadContext {
    pub runtime: Runtime,
    pub metrics: Metrics,
    pub session: SessionOptions,
    /// Where embedding tables go (`--device`, resolved against the machine once at start-up).
    pub placement: Placement,
    pub executors: usize,
    pub shards: usize,
    pub limits: RequestLimits,
    pub batching: BatchSettings,
}

/// Bounds on what one request may carry, which the models' contracts check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Candidates of a ranking request, and users of a KServe recall request (`--max-candidates`).
    pub max_candidates: usize,
    /// Item ids in a recall request's `history` (`--max-history`).
    pub max_history: usize,
    /// Item ids in a recall request's `exclude` (`--max-exclude`).
    pub max_exclude: usize,
    /// Items of one reply: users × `k` of a recall request, `k` of a recommend request (`--max-reply-items`).
    pub max_reply_items: usize,
}

impl LoadContext {
    pub fn new(
        config: &Config,
        runtime: Runtime,
        metrics: Metrics,
        placement: Placement,
    ) -> LoadContext {
        LoadContext {
            runtime,
            metrics,
            session: SessionOptions {
                intra_op_threads: config.intra_op_threads,
                provider: config.execution_provider,
                tensorrt: config.tensorrt(),
                cuda_device: None,
            },
            placement,
            executors: config.executors,
            shards: config.shards,
            limits: RequestLimits {
                max_candidates: config.max_candidates,
                max_history: config.max_history,
                max_exclude: config.max_exclude,
                max_reply_items: config.max_reply_items,
            },
            batching: BatchSettings {
                enabled: config.batching == Switch::On,
                max_batch_rows: config.max_batch_rows,
                max_queue_delay_us: config.max_queue_delay_us,
                buckets: config.batch_buckets.clone(),
                default_deadline_ms: config.default_deadline_ms,
                queue_capacity: config.queue_capacity,
                executor_niceness: config.executor_niceness,
            },
        }
    }
}

/// A loaded model of any kind, as the registry holds it.
pub trait Model: Send + Sync + Sized + 'static {
    /// Loads, checks and warms up the version in `version.dir`, whose `model.toml` reads as `spec`.
    fn load(
        ctx: &LoadContext,
        version: &ModelVersion,
        spec: Arc<ModelSpec>,
    ) -> Result<Self, LoadError>;
    /// Where its tables live (`cpu`, `cuda:0`), for logs and `recserve_model_info`.
    fn device(&self) -> &str;
}

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
    models: BTreeMap<String, Arc<Served<M>>>,
}

impl<M> Snapshot<M> {
    pub fn new(models: impl IntoIterator<Item = Served<M>>) -> Snapshot<M> {
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
}

/// Owns which version of each model serves now.
#[derive(Debug)]
pub struct Registry<M> {
    /// `None` until the first snapshot is installed.
    current: RwLock<Option<Arc<Snapshot<M>>>>,
}

impl<M> Default for Registry<M> {
    fn default() -> Self {
        Registry {
            current: RwLock::new(None),
        }
    }
}

impl<M: Model> Registry<M> {
    /// Loads every model of `repository` (the version `pins` names, else the highest), in name order; the first
    /// that cannot be loaded stops the load. The result is not served until it is [installed](Self::install).
    pub fn load(
        &self,
        ctx: &LoadContext,
        repository: &Path,
        pins: &HashMap<String, u64>,
    ) -> Result<Snapshot<M>, LoadError> {
        let mut models = Vec::new();
        for mv in repository::discover(repository, pins)? {
            let started = Instant::now();
            let spec = Arc::new(repository::read_spec(&mv.dir)?);
            let model = M::load(ctx, &mv, Arc::clone(&spec))?;
            ctx.metrics.set_model_info(
                &mv.name,
                mv.version,
                spec.kind.as_str(),
                spec.precision().as_str(),
                model.device(),
            );
            tracing::info!(
                model = %mv.name,
                version = mv.version,
                kind = spec.kind.as_str(),
                precision = spec.precision().as_str(),
                device = model.device(),
                seconds = started.elapsed().as_secs_f64(),
                "model loaded and warmed up"
            );
            models.push(Served {
                name: mv.name,
                version: mv.version,
                available: mv.available,
                spec,
                model,
            });
        }
        Ok(Snapshot::new(models))
    }
}

impl<M> Registry<M> {
    /// Serves `snapshot` from now on. Requests already running keep the snapshot they took.
    pub fn install(&self, snapshot: Snapshot<M>) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(snapshot));
    }

    /// The models serving now, or `None` before the first snapshot is installed.
    pub fn snapshot(&self) -> Option<Arc<Snapshot<M>>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(name: &str, version: u64) -> Served<()> {
        let spec = r#"
format_version = 1
kind = "lightgcn"
[recall]
user_table = "user"
item_table = "item"
[[tables]]
name = "user"
file = "t.safetensors"
rows = 2
dim = 2
storage = "fp32"
[[tables]]
name = "item"
file = "t.safetensors"
rows = 2
dim = 2
storage = "fp32"
"#;
        Served {
            name: name.to_owned(),
            version,
            available: vec![version],
            spec: Arc::new(ModelSpec::parse(spec).expect("spec")),
            model: (),
        }
    }

    #[test]
    fn a_snapshot_finds_models_by_name_and_version() {
        let snapshot = Snapshot::new([served("b", 3), served("a", 1)]);
        assert_eq!(snapshot.names(), "a, b");
        assert_eq!(snapshot.get("b", None).expect("served").version, 3);
        assert_eq!(snapshot.get("b", Some(3)).expect("served").version, 3);
        assert_eq!(
            snapshot.get("b", Some(2)).expect_err("old").to_string(),
            "model \"b\" version 2 is not served (serving version 3)"
        );
        assert_eq!(
            snapshot.get("c", None).expect_err("absent").to_string(),
            "model \"c\" is not served (served models: a, b)"
        );
    }

    #[test]
    fn requests_keep_the_snapshot_they_took() {
        let registry = Registry::<()>::default();
        assert!(
            registry.snapshot().is_none(),
            "nothing serves before install"
        );
        registry.install(Snapshot::new([served("a", 1)]));
        let taken = registry.snapshot().expect("installed");
        registry.install(Snapshot::new([served("a", 2)]));
        assert_eq!(taken.get("a", None).expect("a").version, 1);
        let now = registry.snapshot().expect("installed");
        assert_eq!(now.get("a", None).expect("a").version, 2);
    }
}
