//! DeepFM ranking: loading a ranking model (tables, dense graph sessions, batcher and executor threads), the
//! request contract every transport decodes into ([`RankContract`] → [`RankInput`]), its item feature table
//! ([`ItemFeatures`], for recommend pipelines), and scoring.

mod contract;
mod cooccurrence;
mod item_features;

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{Histogram, IntCounter};

pub use contract::{RankContract, RankInput, best_first};
pub(crate) use cooccurrence::Cooccurrence;
pub(crate) use item_features::ItemFeatures;

use crate::batching::{
    Batch, BatchConfig, BatchExecutor, BatchTrace, Batcher, Estimator, Job, StatisticsSnapshot,
    Work, catch_panic, split_rows,
};
use crate::embedding::remote::{TableSource, TieredStore};
use crate::embedding::{self, EmbeddingStore, open_tables};
use crate::error::{LoadError, ServiceError};
use crate::executor::SessionOptions;
use crate::executor::{DenseGraph, Executed, GraphShape, SplitGraph, Worker};
use crate::registry::LoadContext;
use crate::repository::{DenseGraphSpec, ModelSpec, ModelVersion, TableEntry, Tier};

/// The rows of one request (or chunk of one) to score: `ids` is `[rows, fields]`, `dense` `[rows, dense]`.
#[derive(Debug)]
pub(crate) struct RankWork {
    ids: Vec<i64>,
    dense: Vec<f32>,
}

impl Work for RankWork {
    /// One score per row.
    type Output = Vec<f32>;
}

/// An executor thread of a ranking model: concatenates a batch's rows, pads them to the rows the batch executes at
/// (its bucket on a GPU, [`BatchConfig::executed_rows`]), scores them and answers each job with its own rows'
/// scores.
#[derive(Debug)]
struct RankExecutor {
    worker: Worker,
    shape: GraphShape,
    ids: Vec<i64>,
    dense: Vec<f32>,
    /// Rows of each of the batch's entries, in order (a split graph's runs of one user side end with them).
    requests: Vec<usize>,
}

impl BatchExecutor for RankExecutor {
    type Work = RankWork;

    fn execute(&mut self, batch: Batch<Job<RankWork>>, trace: &BatchTrace) {
        let GraphShape { fields, dense, .. } = self.shape;
        self.ids.clear();
        self.dense.clear();
        self.requests.clear();
        for entry in &batch.entries {
            self.requests.push(entry.rows);
            self.ids.extend_from_slice(&entry.job.work.ids);
            self.dense.extend_from_slice(&entry.job.work.dense);
        }
        // Padding rows read row 0 of every table (always in the vocabulary); their scores are discarded.
        self.ids.resize(batch.bucket * fields, 0);
        self.dense.resize(batch.bucket * dense, 0.0);
        let (worker, ids, dense_values, requests) =
            (&mut self.worker, &self.ids, &self.dense, &self.requests);
        // The batch's rows are due when its earliest request is, less the time its execution is predicted to take:
        // a remote tier's rows are waited for until then, so the answer still comes by the deadline.
        let due = batch
            .entries
            .iter()
            .map(|e| e.deadline)
            .min()
            .unwrap_or_else(Instant::now);
        let deadline = due.checked_sub(batch.estimate).unwrap_or(due);
        let result =
            catch_panic(|| worker.execute(batch.bucket, ids, dense_values, requests, deadline));
        match result {
            Ok(Executed {
                scores,
                gather,
                inference,
            }) => {
                trace.set_phases(gather, inference);
                let mut at = 0;
                for entry in batch.entries {
                    let mine = scores[at..at + entry.rows].to_vec();
                    at += entry.rows;
                    entry.job.answer(Ok(mine));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, rows = batch.rows, "batch failed");
                for entry in batch.entries {
                    entry.job.answer(Err(e.clone()));
                }
            }
        }
    }
}

/// The model's embedding store: its tables mapped and placed by `--device`, or, when any table has
/// `tier = "redis"`, a [`TieredStore`] on the CPU (the Redis tier has no GPU store yet). The in-process ceiling
/// (`recload ceiling`) opens its store here too.
pub fn open_store(
    ctx: &LoadContext,
    mv: &ModelVersion,
    spec: &ModelSpec,
) -> Result<Arc<dyn EmbeddingStore>, LoadError> {
    let counters = spec
        .tables
        .iter()
        .map(|t| ctx.metrics.oov_counter(&mv.name, &t.spec.name))
        .collect();
    let specs = spec.tables.iter().map(|t| t.spec.clone()).collect();
    if spec.tables.iter().all(|t| t.tier == Tier::File) {
        let bytes = open_tables(&mv.dir, &spec.tables, ctx.preload)?;
        return crate::gpu::open_store(&ctx.placement, specs, bytes, ctx.shards, counters).map_err(
            |e| {
                LoadError::new(
                    &mv.dir,
                    format!("cannot place the embedding tables (--device): {e}"),
                )
            },
        );
    }
    let files: Vec<TableEntry> = spec
        .tables
        .iter()
        .filter(|t| t.tier == Tier::File)
        .cloned()
        .collect();
    let mut mapped = open_tables(&mv.dir, &files, ctx.preload)?.into_iter();
    let mut sources = Vec::with_capacity(spec.tables.len());
    for t in &spec.tables {
        sources.push(match t.tier {
            Tier::File => TableSource::File(
                mapped
                    .next()
                    .ok_or_else(|| LoadError::new(&mv.dir, "a mapped table went missing"))?,
            ),
            Tier::Redis { unfetched } => TableSource::Redis {
                unfetched,
                defaulted: ctx
                    .metrics
                    .unfetched_default_counter(&mv.name, &t.spec.name),
            },
        });
    }
    let store = TieredStore::open(
        &mv.dir,
        &ctx.tier,
        &mv.name,
        mv.version,
        specs,
        sources,
        counters,
        ctx.metrics.tier(&mv.name),
    )?;
    Ok(Arc::new(store))
}

/// The split graph an executor scores host batches with: `[dense_graph.split]` of a model, unless `--split-graph
/// off` or the executor runs on a GPU (which runs the whole graph). The in-process ceiling wires it here too.
pub(crate) fn split_graph(
    ctx: &LoadContext,
    mv: &ModelVersion,
    graph_spec: &DenseGraphSpec,
    shape: GraphShape,
    options: &SessionOptions,
) -> Result<Option<SplitGraph>, LoadError> {
    match &graph_spec.split {
        Some(split) if ctx.split_graph && options.cuda_device.is_none() => Ok(Some(
            SplitGraph::open(&ctx.runtime, &mv.dir, graph_spec, split, shape, options)?,
        )),
        Some(_) if ctx.split_graph => {
            tracing::info!(model = %mv.name, "the split graph runs on the CPU only; the GPU executor runs the whole graph");
            Ok(None)
        }
        _ => Ok(None),
    }
}

/// The executor workers of a ranking model, one per `--executors`, each with its lane of `store` and its own session
/// of the dense graph, wired as the model's settings say (the user side gathered once, the split graph): what
/// [`RankingModel::load`] warms up and hands its batcher, and what the in-process ceiling (`recload ceiling`)
/// measures. Marks `batching` padded when an executor runs on a GPU.
pub fn open_workers(
    ctx: &LoadContext,
    mv: &ModelVersion,
    store: &Arc<dyn EmbeddingStore>,
    contract: &RankContract,
    batching: &mut BatchConfig,
) -> Result<Vec<Worker>, LoadError> {
    let spec = &contract.spec;
    let graph_spec = spec.dense_graph.as_ref().ok_or_else(|| {
        LoadError::new(
            &mv.dir.join("model.toml"),
            "a deepfm model needs [dense_graph]",
        )
    })?;
    let shape = contract.shape();
    let fields: Arc<[usize]> = spec.fields.iter().map(|f| f.table).collect();
    let metrics = ctx.metrics.model(&mv.name, store.device());
    let mut workers = Vec::with_capacity(ctx.executors);
    for executor in 0..ctx.executors {
        let lane = embedding::lane(store, executor).map_err(|e| {
            LoadError::new(&mv.dir, format!("cannot set up executor {executor}: {e}"))
        })?;
        let options = ctx.session.on_device(lane.cuda_device());
        batching.pad |= lane.cuda_device().is_some();
        let graph = DenseGraph::open(&ctx.runtime, &mv.dir, graph_spec, shape, &options)?;
        let mut worker = Worker::new(graph, lane, Arc::clone(&fields), metrics.clone());
        if ctx.gather_user_once {
            worker = worker.with_user_columns(&contract.user_fields);
        }
        if let Some(split) = split_graph(ctx, mv, graph_spec, shape, &options)? {
            worker = worker.with_split(split, &contract.user_fields);
        }
        workers.push(worker);
    }
    Ok(workers)
}

/// A loaded DeepFM model: its embedding store, its item feature table, and the batcher in front of its executor
/// threads.
#[derive(Debug)]
pub struct RankingModel {
    pub contract: RankContract,
    store: Arc<dyn EmbeddingStore>,
    /// `[item_features]`, for recommend pipelines.
    item_features: Option<Arc<ItemFeatures>>,
    /// `[cooccurrence]`, for the `cooccurrence` candidate feature of recommend pipelines.
    cooccurrence: Option<Arc<Cooccurrence>>,
    batcher: Batcher<RankWork>,
    batching: BatchConfig,
    default_deadline: Duration,
    /// `recserve_request_rows`: candidates per scoring call (a rank request, or a pipeline's rank stage).
    request_rows: Histogram,
    /// The model's name, for the error of a non-finite score.
    name: String,
    /// `recserve_non_finite_scores_total`.
    non_finite_scores: IntCounter,
}

impl RankingModel {
    /// Opens the tables and the dense graph (one session per executor), checks them against `spec`, runs every
    /// batch bucket on every session (which also seeds the execution-time estimate), and starts the batcher.
    pub(crate) fn load(
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
        let store = open_store(ctx, mv, &spec)?;
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

        let item_features = ItemFeatures::open(&mv.dir, &spec)?.map(Arc::new);
        let cooccurrence = Cooccurrence::open(&mv.dir, &spec)?.map(Arc::new);
        let (mut batching, default_deadline) = ctx.batching.resolve(&spec.batching);
        let contract = RankContract::new(Arc::clone(&spec), ctx.limits.max_candidates)
            .with_queue(batching.fit());
        let shape = contract.shape();
        let estimator = Estimator::new(&batching.buckets);
        let model_metrics = ctx.metrics.model(&mv.name, store.device());
        let (request_rows, non_finite_scores) = (
            model_metrics.request_rows.clone(),
            model_metrics.non_finite_scores.clone(),
        );
        let graph_path = mv.dir.join(&graph_spec.file);
        let workers = open_workers(ctx, mv, &store, &contract, &mut batching)?;
        let mut executors = Vec::with_capacity(workers.len());
        let mut warm_up = Duration::ZERO;
        for mut worker in workers {
            let started = Instant::now();
            if ctx.warm_up {
                worker
                    .warm_up(&batching.buckets, Some(&estimator))
                    .map_err(|e| LoadError::new(&graph_path, format!("warm-up run failed: {e}")))?;
            }
            warm_up += started.elapsed();
            executors.push(RankExecutor {
                worker,
                shape,
                ids: Vec::new(),
                dense: Vec::new(),
                requests: Vec::new(),
            });
        }
        if ctx.warm_up {
            ctx.metrics.observe_warmup(&mv.name, warm_up.as_secs_f64());
        }
        store.serving();
        let batcher = Batcher::start(
            &mv.name,
            batching.clone(),
            estimator,
            executors,
            ctx.metrics.batching(&mv.name, mv.version),
        )
        .map_err(|e| LoadError::new(&mv.dir, format!("cannot start the executor threads: {e}")))?;
        Ok(RankingModel {
            contract,
            store,
            item_features,
            cooccurrence,
            batcher,
            batching,
            default_deadline,
            request_rows,
            name: mv.name.clone(),
            non_finite_scores,
        })
    }

    pub(crate) fn device(&self) -> &str {
        self.store.device()
    }

    pub(crate) fn shard_counts(&self) -> Vec<usize> {
        self.store
            .shard_layouts()
            .iter()
            .map(|l| l.shards)
            .collect()
    }

    /// `[item_features]` of its `model.toml`, read and checked at load.
    pub(crate) fn item_features(&self) -> Option<&Arc<ItemFeatures>> {
        self.item_features.as_ref()
    }

    /// `[cooccurrence]` of its `model.toml`, read and checked at load.
    pub(crate) fn cooccurrence(&self) -> Option<&Arc<Cooccurrence>> {
        self.cooccurrence.as_ref()
    }

    /// The deadline of requests that come without one.
    pub(crate) fn default_deadline(&self) -> Duration {
        self.default_deadline
    }

    /// Refuses a request before it is decoded when admission would refuse it whatever its size (the queue is
    /// full, or the work ahead alone would miss `deadline`).
    pub(crate) fn precheck(&self, deadline: Instant) -> Result<(), ServiceError> {
        self.batcher.precheck(deadline)
    }

    /// The batching it runs with.
    /// Runs the executors at the lowest priority while this version is its model's shadow.
    pub fn set_shadow(&self, shadow: bool) {
        self.batcher.set_shadow(shadow);
    }

    pub fn batching(&self) -> &BatchConfig {
        &self.batching
    }

    /// How many executor threads run its batches.
    pub fn executors(&self) -> usize {
        self.batcher.executors()
    }

    /// Its statistics since it was loaded.
    pub fn statistics(&self) -> StatisticsSnapshot {
        self.batcher.statistics()
    }

    /// Scores validated rows: splits them into chunks of at most `max_batch_rows`, queues them for the batcher
    /// and reassembles the scores in order. A score that is not a finite number fails the call
    /// ([`ServiceError::NonFiniteScore`], counted in `recserve_non_finite_scores_total`).
    pub async fn score(
        &self,
        input: RankInput,
        deadline: Instant,
    ) -> Result<Vec<f32>, ServiceError> {
        let result = self.score_rows(input, deadline).await.and_then(|scores| {
            if let Some(row) = scores.iter().position(|s| !s.is_finite()) {
                self.non_finite_scores.inc();
                tracing::error!(model = %self.name, row, value = %scores[row], "the model computed a non-finite score");
                return Err(ServiceError::NonFiniteScore {
                    model: self.name.clone(),
                    row,
                    value: scores[row],
                });
            }
            Ok(scores)
        });
        self.batcher.called(&result);
        result
    }

    async fn score_rows(
        &self,
        input: RankInput,
        deadline: Instant,
    ) -> Result<Vec<f32>, ServiceError> {
        self.request_rows.observe(input.rows as f64);
        let (fields, dense) = (self.contract.fields(), self.contract.dense_width());
        let ranges = split_rows(input.rows, self.batching.max_batch_rows);
        if ranges.len() == 1 {
            let work = RankWork {
                ids: input.ids,
                dense: input.dense,
            };
            let mut scores = self.batcher.run(vec![(work, input.rows)], deadline).await?;
            return Ok(scores.pop().unwrap_or_default());
        }
        let chunks = ranges
            .into_iter()
            .map(|r| {
                let work = RankWork {
                    ids: input.ids[r.start * fields..r.end * fields].to_vec(),
                    dense: input.dense[r.start * dense..r.end * dense].to_vec(),
                };
                (work, r.len())
            })
            .collect();
        let parts = self.batcher.run(chunks, deadline).await?;
        Ok(parts.concat())
    }
}
