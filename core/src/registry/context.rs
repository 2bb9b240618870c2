//! What loading a model needs besides the model itself ([`LoadContext`]), and what a model kind provides
//! ([`Loadable`]).

use std::sync::Arc;

use crate::batching::BatchSettings;
use crate::embedding::Preload;
use crate::embedding::remote::TierContext;
use crate::error::LoadError;
use crate::executor::{Runtime, SessionOptions};
use crate::gpu::Placement;
use crate::metrics::Metrics;
use crate::repository::{ModelSpec, ModelVersion};

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
    /// `--gather-user-once`: ranking executors gather each request's user columns once.
    pub gather_user_once: bool,
    /// `--preload`: when the pages of table and index files are read in.
    pub preload: Preload,
    /// `--split-graph`: models with `[dense_graph.split]` run their user part once per request.
    pub split_graph: bool,
    /// The Redis tier of tables with `tier = "redis"` (`--redis-url`, `--embedding-cache-bytes`,
    /// `--redis-fetch-timeout-ms`).
    pub tier: TierContext,
    /// Whether a loaded version is warmed up (every batch bucket run once) before it is handed over: always when
    /// it will serve; `check-config` loads without.
    pub warm_up: bool,
}

/// Bounds on what one request may carry, which the models' contracts check. Serialized with the keys of the config
/// file (`check-config` prints it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
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

/// A loaded model of any kind, as the registry holds it.
pub trait Loadable: Shadowed + Send + Sync + Sized + 'static {
    /// Loads, checks and (with [`LoadContext::warm_up`]) warms up the version in `version.dir`, whose `model.toml`
    /// reads as `spec`.
    fn load(
        ctx: &LoadContext,
        version: &ModelVersion,
        spec: Arc<ModelSpec>,
    ) -> Result<Self, LoadError>;
    /// Where its tables live (`cpu`, `cuda:0`), for logs and `recserve_model_info`.
    fn device(&self) -> &str;
}

/// What the registry tells a served version when its model's traffic changes.
pub trait Shadowed {
    /// Whether it is its model's shadow version now (its work then yields to every other version's).
    fn set_shadow(&self, _shadow: bool) {}
}
