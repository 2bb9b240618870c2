//! DeepFM ranking: loading a ranking model (tables, dense graph sessions, executor threads), the request contract
//! every transport decodes into ([`RankContract`] → [`RankInput`]), and scoring.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::embedding::{self, EmbeddingStore, OovPolicy, open_tables};
use crate::error::{LoadError, ServiceError};
use crate::executor::pool::{ExecutorPool, RankJob, Refused, Worker};
use crate::executor::{DenseGraph, GraphShape};
use crate::metrics::ModelMetrics;
use crate::repository::{ModelSpec, ModelVersion, Side};
use crate::service::LoadContext;

/// Validated rows to score: `ids` is `[rows, fields]` in graph order, `dense` is `[rows, dense_features]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RankInput {
    pub rows: usize,
    pub ids: Vec<i64>,
    pub dense: Vec<f32>,
}

/// What a ranking request must carry, derived from `model.toml`. Transports decode against it.
#[derive(Debug, Clone)]
pub struct RankContract {
    pub spec: Arc<ModelSpec>,
    /// Indices into `spec.fields`, in graph order.
    pub user_fields: Vec<usize>,
    /// Item-side fields a candidate sends in `fields` (all item fields but `item_id_field`).
    pub item_fields: Vec<usize>,
    pub item_id_field: Option<usize>,
    pub dense_features: usize,
    field_by_name: HashMap<String, usize>,
    pub max_candidates: usize,
}

impl RankContract {
    pub fn new(spec: Arc<ModelSpec>, max_candidates: usize) -> RankContract {
        let ranking = spec.ranking.as_ref();
        let item_id_field = ranking.and_then(|r| r.item_id_field);
        let by_side = |side: Side| {
            spec.fields
                .iter()
                .enumerate()
                .filter(|(i, f)| f.side == side && Some(*i) != item_id_field)
                .map(|(i, _)| i)
                .collect::<Vec<_>>()
        };
        RankContract {
            user_fields: by_side(Side::User),
            item_fields: by_side(Side::Item),
            item_id_field,
            dense_features: ranking.map_or(0, |r| r.dense_features.len()),
            field_by_name: spec
                .fields
                .iter()
                .enumerate()
                .map(|(i, f)| (f.name.clone(), i))
                .collect(),
            max_candidates,
            spec,
        }
    }

    pub fn fields(&self) -> usize {
        self.spec.fields.len()
    }

    pub fn field_index(&self, name: &str) -> Option<usize> {
        self.field_by_name.get(name).copied()
    }

    pub fn field_name(&self, field: usize) -> &str {
        &self.spec.fields[field].name
    }

    /// Checks `id` for `field` against its table's OOV policy: ids a `reject` table would refuse fail here,
    /// before the request is queued, so one bad request never fails a batch.
    pub fn check_id(&self, field: usize, id: i64) -> Result<(), String> {
        let table = &self.spec.tables[self.spec.fields[field].table].spec;
        if table.oov == OovPolicy::Reject && !table.contains(id) {
            return Err(format!(
                "id {id} is outside the vocabulary of table {:?} (ids 0..{}), which rejects unknown ids",
                table.name, table.rows
            ));
        }
        Ok(())
    }

    /// Checks a dense value.
    pub fn check_dense(value: f32) -> Result<(), String> {
        if value.is_finite() {
            Ok(())
        } else {
            Err(format!("must be a finite number, got {value}"))
        }
    }

    /// Checks the number of rows of a request.
    pub fn check_rows(&self, rows: usize) -> Result<(), String> {
        if rows == 0 {
            Err("must hold at least one candidate".to_owned())
        } else if rows > self.max_candidates {
            Err(format!(
                "holds {rows} candidates, more than the limit of {} (--max-candidates)",
                self.max_candidates
            ))
        } else {
            Ok(())
        }
    }
}

/// A loaded DeepFM model: its embedding store and the executor threads that own its dense-graph sessions.
#[derive(Debug)]
pub struct RankingModel {
    pub contract: RankContract,
    store: Arc<dyn EmbeddingStore>,
    pool: ExecutorPool,
    metrics: ModelMetrics,
    model: String,
}

impl RankingModel {
    /// Opens the tables and the dense graph (one session per executor), checks them against `spec`, warms every
    /// session up and starts the executor threads.
    pub fn load(
        ctx: &LoadContext,
        mv: &ModelVersion,
        spec: Arc<ModelSpec>,
    ) -> Result<RankingModel, LoadError> {
        let graph_spec = spec.dense_graph.as_ref().ok_or_else(|| {
            LoadError::new(
                &mv.dir.join("model.toml"),
                "a deepfm model needs [dense_graph]",
            )
        })?;
        let bytes = open_tables(&mv.dir, &spec.tables)?;
        let counters = spec
            .tables
            .iter()
            .map(|t| ctx.metrics.oov_counter(&mv.name, &t.spec.name))
            .collect();
        let specs = spec.tables.iter().map(|t| t.spec.clone()).collect();
        let store = crate::gpu::open_store(&ctx.placement, specs, bytes, ctx.shards, counters)
            .map_err(|e| {
                LoadError::new(
                    &mv.dir,
                    format!("cannot place the embedding tables (--device): {e}"),
                )
            })?;
        for shard in store.device_memory() {
            ctx.metrics.set_gpu_memory_bytes(
                &mv.name,
                &shard.table,
                shard.shard,
                &shard.device,
                shard.bytes,
            );
        }
        for t in store.tables() {
            ctx.metrics.set_table_bytes(
                &mv.name,
                &t.name,
                t.storage.as_str(),
                store.device(),
                t.bytes(),
            );
        }

        let contract = RankContract::new(Arc::clone(&spec), ctx.max_candidates);
        let shape = GraphShape {
            fields: contract.fields(),
            dim: spec.field_dim(),
            dense: contract.dense_features,
        };
        let fields: Arc<[usize]> = spec.fields.iter().map(|f| f.table).collect();
        let metrics = ctx.metrics.model(&mv.name, store.device());
        let graph_path = mv.dir.join(&graph_spec.file);
        let mut workers = Vec::with_capacity(ctx.executors);
        for executor in 0..ctx.executors {
            let lane = embedding::lane(&store, executor).map_err(|e| {
                LoadError::new(&mv.dir, format!("cannot set up executor {executor}: {e}"))
            })?;
            let options = ctx.session.on_device(lane.cuda_device());
            let graph = DenseGraph::open(&ctx.runtime, &mv.dir, graph_spec, shape, &options)?;
            let mut worker = Worker::new(graph, lane, Arc::clone(&fields), metrics.clone());
            worker
                .warm_up(&ctx.warmup_rows)
                .map_err(|e| LoadError::new(&graph_path, format!("warm-up run failed: {e}")))?;
            workers.push(worker);
        }
        let pool = ExecutorPool::start(&mv.name, workers, ctx.queue_capacity)
            .map_err(|e| LoadError::new(&mv.dir, format!("cannot start executor threads: {e}")))?;
        Ok(RankingModel {
            contract,
            store,
            pool,
            metrics,
            model: mv.name.clone(),
        })
    }

    pub fn device(&self) -> &str {
        self.store.device()
    }

    pub fn shard_counts(&self) -> Vec<usize> {
        self.store
            .shard_layouts()
            .iter()
            .map(|l| l.shards)
            .collect()
    }

    /// Scores validated rows: queues them for an executor and waits for the scores, one per row.
    pub async fn score(&self, input: RankInput) -> Result<Vec<f32>, ServiceError> {
        self.metrics.request_rows.observe(input.rows as f64);
        let (reply, scores) = oneshot::channel();
        let job = RankJob {
            rows: input.rows,
            ids: input.ids,
            dense: input.dense,
            reply,
        };
        match self.pool.try_submit(job) {
            Ok(()) => {}
            Err(Refused::Full(_)) => {
                self.metrics.rejected_queue_full.inc();
                return Err(ServiceError::Overloaded {
                    model: self.model.clone(),
                    retry_after: std::time::Duration::from_secs(1),
                });
            }
            Err(Refused::Closed(_)) => return Err(ServiceError::Unavailable("shutting down")),
        }
        match scores.await {
            Ok(Ok(scores)) => Ok(scores),
            Ok(Err(e)) => Err(ServiceError::Internal(format!(
                "model {:?}: {e}",
                self.model
            ))),
            Err(_) => Err(ServiceError::Internal(format!(
                "model {:?}: the executor dropped the job",
                self.model
            ))),
        }
    }
}
