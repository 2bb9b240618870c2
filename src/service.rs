//! The transport-agnostic service: which models are served, whether the server is ready, and the calls every
//! transport (HTTP `/v1`, KServe v2 over HTTP and gRPC) makes after decoding its request.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tokio::sync::watch;

use crate::batching::BatchSettings;
use crate::config::{Config, Switch};
use crate::error::{LoadError, ServiceError};
use crate::executor::{Runtime, RuntimeError, SessionOptions};
use crate::gpu::{self, GpuError, Placement};
use crate::metrics::Metrics;
use crate::pipeline::{ItemFeatures, Pipeline, RecommendInput, Recommendation};
use crate::ranking::{RankInput, RankingModel};
use crate::recall::{RecallInput, RecallLimits, RecallModel, Scored};
use crate::repository::{self, ModelKind, ModelSpec};

/// Why the server could not start serving.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("cannot load model: {0}")]
    Load(#[from] LoadError),
    #[error("--device: {0}")]
    Device(#[from] GpuError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A `[pipelines.NAME]` of the config file that the loaded models cannot serve.
    #[error("pipeline {name:?} (--config [pipelines.{name}]): {problem}")]
    Pipeline { name: String, problem: String },
}

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
    pub max_candidates: usize,
    pub batching: BatchSettings,
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
            max_candidates: config.max_candidates,
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

/// A loaded model of one of the supported kinds.
#[derive(Debug)]
pub enum ModelHandle {
    Ranking(RankingModel),
    Recall(RecallModel),
}

impl ModelHandle {
    pub fn device(&self) -> &str {
        match self {
            ModelHandle::Ranking(m) => m.device(),
            ModelHandle::Recall(m) => m.device(),
        }
    }

    pub fn shard_counts(&self) -> Vec<usize> {
        match self {
            ModelHandle::Ranking(m) => m.shard_counts(),
            ModelHandle::Recall(m) => m.shard_counts(),
        }
    }
}

/// One served model version.
#[derive(Debug)]
pub struct ServedModel {
    pub name: String,
    pub version: u64,
    /// Versions present in the repository, ascending.
    pub available: Vec<u64>,
    pub spec: Arc<ModelSpec>,
    pub handle: ModelHandle,
    /// A ranking model's `[item_features]`, read and checked at load, for recommend pipelines.
    pub item_features: Option<Arc<ItemFeatures>>,
}

impl ServedModel {
    fn wrong_kind(&self, operation: &'static str) -> ServiceError {
        ServiceError::WrongKind {
            model: self.name.clone(),
            kind: self.spec.kind.as_str(),
            operation,
        }
    }

    pub fn ranking(&self) -> Result<&RankingModel, ServiceError> {
        match &self.handle {
            ModelHandle::Ranking(m) => Ok(m),
            ModelHandle::Recall(_) => Err(self.wrong_kind("rank")),
        }
    }

    pub fn recall(&self) -> Result<&RecallModel, ServiceError> {
        match &self.handle {
            ModelHandle::Recall(m) => Ok(m),
            ModelHandle::Ranking(_) => Err(self.wrong_kind("recall")),
        }
    }
}

/// Loading, ready, or draining.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    Loading,
    Ready,
    ShuttingDown,
}

/// Bounds on requests that every transport enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_candidates: usize,
}

/// The state every transport shares.
#[derive(Debug)]
pub struct Service {
    models: OnceLock<BTreeMap<String, Arc<ServedModel>>>,
    /// Set just before `models`, so a ready service has its pipelines.
    pipelines: OnceLock<BTreeMap<String, Arc<Pipeline>>>,
    shutting_down: AtomicBool,
    /// Follows [`Service::readiness`], for transports that push it (gRPC health) instead of being asked.
    readiness_changes: watch::Sender<Readiness>,
    pub metrics: Metrics,
    pub limits: Limits,
}

impl Service {
    pub fn new(metrics: Metrics, limits: Limits) -> Service {
        Service {
            models: OnceLock::new(),
            pipelines: OnceLock::new(),
            shutting_down: AtomicBool::new(false),
            readiness_changes: watch::Sender::new(Readiness::Loading),
            metrics,
            limits,
        }
    }

    /// Loads ONNX Runtime and every model of the repository, then marks the service ready. Blocking: run it on a
    /// thread of its own.
    pub fn load(&self, config: &Config) -> Result<(), StartError> {
        let runtime = Runtime::load(&config.ort_library)?;
        let placement = gpu::select(config.device)?;
        let ctx = LoadContext::new(config, runtime, self.metrics.clone(), placement);
        let pins: HashMap<String, u64> = config.pin.clone();
        let mut models = BTreeMap::new();
        for mv in repository::discover(&config.repository, &pins)? {
            let started = std::time::Instant::now();
            let spec = Arc::new(repository::read_spec(&mv.dir)?);
            let (handle, item_features) = match spec.kind {
                ModelKind::Deepfm => (
                    ModelHandle::Ranking(RankingModel::load(&ctx, &mv, Arc::clone(&spec))?),
                    ItemFeatures::open(&mv.dir, &spec)?.map(Arc::new),
                ),
                ModelKind::Lightgcn => {
                    let limits = RecallLimits {
                        max_history: config.max_history,
                        max_exclude: config.max_exclude,
                        max_queries: config.max_candidates,
                    };
                    let model = RecallModel::load(&ctx, &mv, Arc::clone(&spec), limits)?;
                    (ModelHandle::Recall(model), None)
                }
            };
            self.metrics.set_model_info(
                &mv.name,
                mv.version,
                spec.kind.as_str(),
                spec.precision().as_str(),
                handle.device(),
            );
            tracing::info!(
                model = %mv.name,
                version = mv.version,
                kind = spec.kind.as_str(),
                precision = spec.precision().as_str(),
                device = handle.device(),
                seconds = started.elapsed().as_secs_f64(),
                "model loaded and warmed up"
            );
            models.insert(
                mv.name.clone(),
                Arc::new(ServedModel {
                    name: mv.name,
                    version: mv.version,
                    available: mv.available,
                    spec,
                    handle,
                    item_features,
                }),
            );
        }
        let mut pipelines = BTreeMap::new();
        for (name, p) in &config.pipelines {
            let pipeline = Pipeline::new(name, p, &models, &self.metrics).map_err(|problem| {
                StartError::Pipeline {
                    name: name.clone(),
                    problem,
                }
            })?;
            tracing::info!(
                pipeline = %name,
                recall = %p.recall_model,
                ranking = %p.ranking_model,
                candidates = p.candidates,
                k = p.k,
                "pipeline ready"
            );
            pipelines.insert(name.clone(), Arc::new(pipeline));
        }
        // Loading happens once per service; a second call would be a bug, and the first models stay.
        let _ = self.pipelines.set(pipelines);
        let _ = self.models.set(models);
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
    pub fn watch_readiness(&self) -> watch::Receiver<Readiness> {
        self.readiness_changes.subscribe()
    }

    pub fn readiness(&self) -> Readiness {
        if self.shutting_down.load(Ordering::Acquire) {
            Readiness::ShuttingDown
        } else if self.models.get().is_some() {
            Readiness::Ready
        } else {
            Readiness::Loading
        }
    }

    /// From now on `/health/ready` fails, so load balancers stop sending; requests still in flight finish.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.publish_readiness();
    }

    /// The served models, by name (empty while loading).
    pub fn models(&self) -> impl Iterator<Item = &Arc<ServedModel>> {
        self.models.get().into_iter().flat_map(BTreeMap::values)
    }

    /// Looks a model up by name and, when given, version.
    pub fn model(
        &self,
        name: &str,
        version: Option<u64>,
    ) -> Result<Arc<ServedModel>, ServiceError> {
        let models = self
            .models
            .get()
            .ok_or(ServiceError::Unavailable("models are still loading"))?;
        let model = models
            .get(name)
            .ok_or_else(|| ServiceError::ModelNotFound {
                model: name.to_owned(),
                served: models.keys().cloned().collect::<Vec<_>>().join(", "),
            })?;
        match version {
            Some(v) if v != model.version => Err(ServiceError::VersionNotFound {
                model: name.to_owned(),
                version: v,
                serving: model.version,
            }),
            _ => Ok(Arc::clone(model)),
        }
    }

    /// Scores validated ranking rows on `model`. `deadline` is when the client stops waiting (from
    /// `x-recserve-deadline-ms`, gRPC's `grpc-timeout`, …); work for it is dropped once it has passed.
    pub async fn rank(
        &self,
        model: &ServedModel,
        input: RankInput,
        deadline: Option<Instant>,
    ) -> Result<Vec<f32>, ServiceError> {
        model.ranking()?.score(input, deadline).await
    }

    /// The `k` best items of a recall model for a request (best first; equal scores by lower id).
    pub async fn recall(
        &self,
        model: &ServedModel,
        input: RecallInput,
        deadline: Option<Instant>,
    ) -> Result<Vec<Scored>, ServiceError> {
        model.recall()?.recall(input, deadline).await
    }

    /// Several recall queries of one request on `model`, queued together; answers in input order.
    pub async fn recall_many(
        &self,
        model: &ServedModel,
        inputs: Vec<RecallInput>,
        deadline: Option<Instant>,
    ) -> Result<Vec<Vec<Scored>>, ServiceError> {
        model.recall()?.recall_many(inputs, deadline).await
    }

    /// The configured pipelines, by name (empty while loading).
    pub fn pipelines(&self) -> impl Iterator<Item = &Arc<Pipeline>> {
        self.pipelines.get().into_iter().flat_map(BTreeMap::values)
    }

    /// Looks a pipeline up by name.
    pub fn pipeline(&self, name: &str) -> Result<Arc<Pipeline>, ServiceError> {
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

    /// Recall then rank through `pipeline`.
    pub async fn recommend(
        &self,
        pipeline: &Pipeline,
        input: RecommendInput,
        deadline: Option<Instant>,
    ) -> Result<Recommendation, ServiceError> {
        pipeline.recommend(input, deadline).await
    }
}
