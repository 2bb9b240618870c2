//! The transport-agnostic service: the models it serves (through the [`Registry`]), its pipelines, whether it is
//! ready, and the one envelope every request goes through whatever its protocol ([`Service::model_call`],
//! [`Service::pipeline_call`] in [`call`]). Transports only decode and encode.

mod call;
mod lifecycle;
mod traffic;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::watch;

pub(crate) use call::{
    ModelCall, ModelRequest, PipelineRequest, Protocol, Received, RequestBody, parse_version,
};
pub(crate) use recserve_core::models::{Model, Models, Operation, ResolvedPipeline, ServedModel};
pub(crate) use traffic::TrafficView;

use crate::config::Config;
use recserve_core::error::{LoadError, ServiceError};
use recserve_core::executor::{Runtime, RuntimeError};
use recserve_core::gpu::{self, GpuError};
use recserve_core::metrics::Metrics;
use recserve_core::pipeline::Pipeline;
use recserve_core::registry::{LoadContext, Registry};
use recserve_core::repository::VersionPolicy;

/// Why the server could not start serving. Each message holds its cause whole, so none has a `source` (a report
/// that prints an error's chain would print the cause twice).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("cannot load model: {0}")]
    Load(LoadError),
    #[error("--device: {0}")]
    Device(GpuError),
    #[error("{0}")]
    Io(std::io::Error),
    /// A TLS file or the inference tokens' file that cannot be used; the message names the flag and the file.
    #[error(transparent)]
    Credentials(Box<dyn std::error::Error + Send + Sync>),
    /// A `[pipelines.NAME]` of the config file that the loaded models cannot serve.
    #[error("pipeline {name:?} (--config [pipelines.{name}]): {problem}")]
    Pipeline { name: String, problem: String },
}

/// What the server loads before it serves, in the order it does: the admin token file, ONNX Runtime, the device,
/// every model of the repository (the versions its policy picks: pinned, latest N or named; else the highest) with
/// its traffic split, and the pipelines over them. `serve`
/// installs it; `check-config` loads it without warming the models up, reports, and drops it.
pub struct StartLoad {
    pub ctx: LoadContext,
    token: Option<String>,
    pub models: Models,
    pub pipelines: BTreeMap<String, Arc<Pipeline>>,
}

impl std::fmt::Debug for StartLoad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartLoad")
            .field("models", &self.models.names())
            .field("pipelines", &self.pipelines.keys())
            .finish_non_exhaustive()
    }
}

impl StartLoad {
    /// Blocking. `warm_up`: run each model's warm-up batches (always when it will serve).
    pub fn run(
        config: &Config,
        registry: &Registry<Model>,
        metrics: Metrics,
        warm_up: bool,
    ) -> Result<StartLoad, StartError> {
        let token = config
            .admin_token_file
            .as_deref()
            .map(lifecycle::read_token)
            .transpose()?;
        let runtime = Runtime::load(&config.ort_library)?;
        let placement = gpu::select(config.device)?;
        let ctx = LoadContext {
            warm_up,
            ..config.load_context(runtime, metrics.clone(), placement)
        };
        // A server whose models change while it serves starts without a model that fails (its status says why);
        // one that loads only at start could never serve it, and refuses to start.
        let keep_going = config.model_control != crate::config::ModelControl::None;
        let mut models = registry.load(&ctx, &config.repository, &config.policies, keep_going)?;
        for (name, settings) in &config.models {
            if let Some(traffic) = settings.traffic() {
                models = models.with_traffic(name, Some(Arc::new(traffic)));
            }
        }
        let pipelines =
            recserve_core::models::build_pipelines(&config.pipelines, &models, &metrics)
                .map_err(|(name, problem)| StartError::Pipeline { name, problem })?;
        Ok(StartLoad {
            ctx,
            token,
            models,
            pipelines,
        })
    }
}

impl From<LoadError> for StartError {
    fn from(e: LoadError) -> StartError {
        StartError::Load(e)
    }
}

impl From<GpuError> for StartError {
    fn from(e: GpuError) -> StartError {
        StartError::Device(e)
    }
}

impl From<std::io::Error> for StartError {
    fn from(e: std::io::Error) -> StartError {
        StartError::Io(e)
    }
}

/// Loading, ready, or draining.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Readiness {
    Loading,
    Ready,
    ShuttingDown,
}

/// Bounds on requests that every transport enforces before the service sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_body_bytes: usize,
}

/// The state every transport shares.
#[derive(Debug)]
pub struct Service {
    registry: Registry<Model>,
    /// Set just before the first snapshot is installed, so a ready service has its pipelines.
    pipelines: OnceLock<BTreeMap<String, Arc<Pipeline>>>,
    /// What loading while serving needs; set with the first snapshot.
    lifecycle: OnceLock<lifecycle::Lifecycle>,
    shutting_down: AtomicBool,
    /// Follows [`Service::readiness`], for transports that push it (gRPC health) instead of being asked.
    readiness_changes: watch::Sender<Readiness>,
    pub(crate) metrics: Metrics,
    pub(crate) limits: Limits,
}

impl Service {
    pub fn new(metrics: Metrics, limits: Limits) -> Service {
        Service {
            registry: Registry::new(metrics.clone()),
            pipelines: OnceLock::new(),
            lifecycle: OnceLock::new(),
            shutting_down: AtomicBool::new(false),
            readiness_changes: watch::Sender::new(Readiness::Loading),
            metrics,
            limits,
        }
    }

    /// Loads ONNX Runtime and every model of the repository, checks the pipelines against them, then marks the
    /// service ready. Blocking: run it on a thread of its own.
    pub fn load(&self, config: &Config) -> Result<(), StartError> {
        let start = StartLoad::run(config, &self.registry, self.metrics.clone(), true)?;
        // Loading happens once per service; a second call would be a bug, and the first pipelines stay.
        let _ = self.pipelines.set(start.pipelines);
        let _ = self
            .lifecycle
            .set(lifecycle::Lifecycle::new(config, start.ctx, start.token));
        self.registry.install(start.models);
        self.publish_readiness();
        Ok(())
    }

    /// Recomputes the readiness under the watch's lock, so concurrent transitions (loaded, shutting down) cannot
    /// publish out of order.
    fn publish_readiness(&self) {
        self.readiness_changes.send_if_modified(|published| {
            let now = self.readiness();
            let changed = *published != now;
            *published = now;
            changed
        });
    }

    /// A receiver that sees every change of [`Service::readiness`].
    pub(crate) fn watch_readiness(&self) -> watch::Receiver<Readiness> {
        self.readiness_changes.subscribe()
    }

    pub(crate) fn readiness(&self) -> Readiness {
        if self.shutting_down.load(Ordering::Acquire) {
            Readiness::ShuttingDown
        } else if self.registry.snapshot().is_some() {
            Readiness::Ready
        } else {
            Readiness::Loading
        }
    }

    /// From now on `/health/ready` fails, so load balancers stop sending; requests still in flight finish.
    pub(crate) fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.publish_readiness();
    }

    /// The models serving now.
    pub(crate) fn snapshot(&self) -> Result<Arc<Models>, ServiceError> {
        self.registry
            .snapshot()
            .ok_or(ServiceError::Unavailable("models are still loading"))
    }

    /// The served models, by name (none while loading).
    pub(crate) fn models(&self) -> Vec<Arc<ServedModel>> {
        self.registry
            .snapshot()
            .map(|s| s.models().cloned().collect())
            .unwrap_or_default()
    }

    /// Looks a model up by name and, when given, version (as the request spells it).
    pub(crate) fn model(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<Arc<ServedModel>, ServiceError> {
        let models = self.snapshot()?;
        let version = parse_version(version)?;
        models.get(name, version).cloned()
    }

    /// The version policy of `model` (`[models.NAME] versions`, `--pin`; default the highest alone).
    pub(crate) fn version_policy(&self, model: &str) -> VersionPolicy {
        self.lifecycle
            .get()
            .and_then(|l| l.policy(model))
            .unwrap_or_default()
    }

    /// The loaded versions of `model`, ascending (none while loading or when it is not served).
    pub(crate) fn versions(&self, model: &str) -> Vec<u64> {
        self.registry
            .snapshot()
            .map(|s| s.versions(model))
            .unwrap_or_default()
    }

    /// The configured pipelines with the models serving now, by name (none while loading).
    pub(crate) fn pipelines(&self) -> Vec<ResolvedPipeline> {
        let Some(models) = self.registry.snapshot() else {
            return Vec::new();
        };
        self.pipelines
            .get()
            .into_iter()
            .flat_map(BTreeMap::values)
            .filter_map(|p| ResolvedPipeline::new(p, &models).ok())
            .collect()
    }

    /// Looks a pipeline up by name.
    fn pipeline(&self, name: &str) -> Result<Arc<Pipeline>, ServiceError> {
        let pipelines = self
            .pipelines
            .get()
            .ok_or(ServiceError::Unavailable("models are still loading"))?;
        pipelines
            .get(name)
            .cloned()
            .ok_or_else(|| ServiceError::PipelineNotFound {
                pipeline: name.to_owned(),
                served: pipelines.keys().cloned().collect::<Vec<_>>().join(", "),
            })
    }
}
