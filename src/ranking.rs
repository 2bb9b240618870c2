//! DeepFM ranking: loading a ranking model (tables, dense graph sessions, batcher and executor threads), the
//! request contract every transport decodes into ([`RankContract`] → [`RankInput`]), and scoring.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::batching::{
    Batch, BatchConfig, BatchExecutor, Batcher, Estimator, Job, Refusal, Unexecuted, split_rows,
};
use crate::embedding::{self, EmbeddingStore, open_tables};
use crate::error::{LoadError, ServiceError};
use crate::executor::{DenseGraph, ExecError, GraphShape, Worker};
use crate::metrics::Metrics;
use crate::repository::OovPolicy;
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

/// Rows of one request (or chunk of one) waiting to be scored.
#[derive(Debug)]
pub struct RankJob {
    pub ids: Vec<i64>,
    pub dense: Vec<f32>,
    pub reply: oneshot::Sender<Result<Vec<f32>, ExecError>>,
}

impl Job for RankJob {
    fn is_abandoned(&self) -> bool {
        self.reply.is_closed()
    }

    fn refuse(self, why: Unexecuted) {
        let error = match why {
            Unexecuted::Expired => ExecError::DeadlineExceeded,
            Unexecuted::ShuttingDown => ExecError::ShuttingDown,
        };
        let _ = self.reply.send(Err(error));
    }
}

/// An executor thread of a ranking model: concatenates a batch's rows, pads them to the batch's bucket, scores
/// them and answers each job with its own rows' scores.
#[derive(Debug)]
struct RankExecutor {
    worker: Worker,
    shape: GraphShape,
    ids: Vec<i64>,
    dense: Vec<f32>,
}

impl BatchExecutor for RankExecutor {
    type Job = RankJob;

    fn execute(&mut self, batch: Batch<RankJob>) {
        let GraphShape { fields, dense, .. } = self.shape;
        self.ids.clear();
        self.dense.clear();
        for entry in &batch.entries {
            self.ids.extend_from_slice(&entry.job.ids);
            self.dense.extend_from_slice(&entry.job.dense);
        }
        // Padding rows read row 0 of every table (always in the vocabulary); their scores are discarded.
        self.ids.resize(batch.bucket * fields, 0);
        self.dense.resize(batch.bucket * dense, 0.0);
        let (worker, ids, dense_values) = (&mut self.worker, &self.ids, &self.dense);
        let result = catch_unwind(AssertUnwindSafe(|| {
            worker.execute(batch.bucket, ids, dense_values)
        }))
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(ExecError::Panicked(what))
        });
        match result {
            Ok(scores) => {
                let mut at = 0;
                for entry in batch.entries {
                    let mine = scores[at..at + entry.rows].to_vec();
                    at += entry.rows;
                    let _ = entry.job.reply.send(Ok(mine));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, rows = batch.rows, "batch failed");
                for entry in batch.entries {
                    let _ = entry.job.reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// A loaded DeepFM model: its embedding store and the batcher in front of its executor threads.
#[derive(Debug)]
pub struct RankingModel {
    pub contract: RankContract,
    store: Arc<dyn EmbeddingStore>,
    batcher: Batcher<RankJob>,
    batching: BatchConfig,
    default_deadline: Duration,
    metrics: Metrics,
    model: String,
}

impl RankingModel {
    /// Opens the tables and the dense graph (one session per executor), checks them against `spec`, runs every
    /// batch bucket on every session (which also seeds the execution-time estimate), and starts the batcher.
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
        let (batching, default_deadline) = ctx.batching.resolve(&spec.batching);
        let estimator = Estimator::new(&batching.buckets);
        let fields: Arc<[usize]> = spec.fields.iter().map(|f| f.table).collect();
        let metrics = ctx.metrics.model(&mv.name, store.device());
        let graph_path = mv.dir.join(&graph_spec.file);
        let mut executors = Vec::with_capacity(ctx.executors);
        for executor in 0..ctx.executors {
            let lane = embedding::lane(&store, executor).map_err(|e| {
                LoadError::new(&mv.dir, format!("cannot set up executor {executor}: {e}"))
            })?;
            let options = ctx.session.on_device(lane.cuda_device());
            let graph = DenseGraph::open(&ctx.runtime, &mv.dir, graph_spec, shape, &options)?;
            let mut worker = Worker::new(graph, lane, Arc::clone(&fields), metrics.clone());
            worker
                .warm_up(&batching.buckets, Some(&estimator))
                .map_err(|e| LoadError::new(&graph_path, format!("warm-up run failed: {e}")))?;
            executors.push(RankExecutor {
                worker,
                shape,
                ids: Vec::new(),
                dense: Vec::new(),
            });
        }
        let batcher = Batcher::start(
            &mv.name,
            batching.clone(),
            estimator,
            executors,
            ctx.metrics.batching(&mv.name),
        )
        .map_err(|e| LoadError::new(&mv.dir, format!("cannot start the batcher threads: {e}")))?;
        Ok(RankingModel {
            contract,
            store,
            batcher,
            batching,
            default_deadline,
            metrics: ctx.metrics.clone(),
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

    /// The batching this model runs with.
    pub fn batching(&self) -> &BatchConfig {
        &self.batching
    }

    /// Refuses a request before it is decoded when admission would refuse it whatever its size (the queue is
    /// full, or the work ahead alone would miss `deadline`, defaulting as in [`Self::score`]).
    pub fn precheck(&self, deadline: Option<Instant>) -> Result<(), ServiceError> {
        self.batcher
            .precheck(self.deadline(deadline))
            .map_err(|refusal| self.refused(refusal))
    }

    /// A request's deadline: the one it came with, else the model's default deadline from now. A transport that
    /// prechecks and then scores resolves it once, before both, so the default budget counts its decoding too.
    pub fn deadline(&self, given: Option<Instant>) -> Instant {
        given.unwrap_or_else(|| Instant::now() + self.default_deadline)
    }

    /// Counts a refusal and turns it into the service error the client gets.
    fn refused(&self, refusal: Refusal) -> ServiceError {
        self.metrics.rejected(&self.model, refusal.reason());
        refusal.into_error(&self.model)
    }

    /// Scores validated rows: splits them into chunks of at most `max_batch_rows`, queues them for the batcher
    /// and reassembles the scores in order. `deadline` defaults to the model's default deadline from now.
    pub async fn score(
        &self,
        input: RankInput,
        deadline: Option<Instant>,
    ) -> Result<Vec<f32>, ServiceError> {
        let deadline = self.deadline(deadline);
        let (fields, dense) = (self.contract.fields(), self.contract.dense_features);
        let ranges = split_rows(input.rows, self.batching.max_batch_rows);
        let mut chunks = Vec::with_capacity(ranges.len());
        let mut answers = Vec::with_capacity(ranges.len());
        if ranges.len() == 1 {
            let (reply, answer) = oneshot::channel();
            chunks.push((
                RankJob {
                    ids: input.ids,
                    dense: input.dense,
                    reply,
                },
                input.rows,
            ));
            answers.push(answer);
        } else {
            for r in ranges {
                let (reply, answer) = oneshot::channel();
                let job = RankJob {
                    ids: input.ids[r.start * fields..r.end * fields].to_vec(),
                    dense: input.dense[r.start * dense..r.end * dense].to_vec(),
                    reply,
                };
                chunks.push((job, r.len()));
                answers.push(answer);
            }
        }
        let promised = match self.batcher.submit(chunks, deadline) {
            Ok(promised) => promised,
            Err((refusal, _)) => return Err(self.refused(refusal)),
        };
        let mut scores = Vec::with_capacity(input.rows);
        for answer in answers {
            match answer.await {
                Ok(Ok(part)) => scores.extend(part),
                Ok(Err(ExecError::DeadlineExceeded)) => {
                    return Err(ServiceError::DeadlineExceeded {
                        model: self.model.clone(),
                    });
                }
                Ok(Err(ExecError::ShuttingDown)) => {
                    return Err(ServiceError::Unavailable("shutting down"));
                }
                Ok(Err(e)) => {
                    return Err(ServiceError::Internal(format!(
                        "model {:?}: {e}",
                        self.model
                    )));
                }
                Err(_) => {
                    return Err(ServiceError::Internal(format!(
                        "model {:?}: the executor dropped the job",
                        self.model
                    )));
                }
            }
        }
        self.batcher.answered(promised);
        Ok(scores)
    }
}
