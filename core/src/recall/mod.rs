//! Recall: the `kind = "lightgcn"` model (any two-tower model with a user table and an item table), exact top-K
//! by inner product over its item catalogue. The request contract every transport decodes into
//! ([`RecallInput`], checked by [`RecallContract`]), the executor that scores a batch of queries in one pass over
//! the catalogue, and loading.
//!
//! A query's vector is the user's row of the user table (`user_id`), or, for a user the table does not hold, the
//! LightGCN embedding of an item history: `e_u = (1 / sqrt(|H|)) · Σ_{i ∈ H} h_i` over the history table
//! (docs/model-repository.md). Queries are batched by the shared [`Batcher`]: a batch of queries is scored
//! together as a matrix product over cache-sized blocks of the catalogue ([`Catalogue`]), each query keeps its own
//! top K ([`TopK`]) per shard, and the shards' lists are merged. Scores are exact (no approximate index) and
//! reproducible bit for bit whatever the batch, shard layout or CPU.

mod catalogue;
mod ivf;
mod kernel;
#[cfg(test)]
mod reference;
mod select;
mod signal;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use catalogue::{
    Catalogue, CodeRow, F32Row, LANES, Panels, SearchQuery, SearchScratch, SearchStats, Shard,
};
pub use ivf::{IvfIndex, IvfScratch, IvfStats, Probe, exact_score, table_checksum};
pub use kernel::{BLOCK_BYTES, Isa};
pub use select::{Scored, TopK, answer_order, merge};
pub use signal::Fallback;
use signal::Popularity;

use crate::batching::{
    Batch, BatchConfig, BatchExecutor, BatchTrace, Batcher, Estimator, ExecError, Job, QueueFit,
    Work, catch_panic,
};
use crate::embedding::{CpuStore, EmbeddingStore, open_tables};
use crate::error::{LoadError, ServiceError};
use crate::metrics::RecallMetrics;
use crate::registry::{LoadContext, RequestLimits};
use crate::repository::{BatchingSpec, ModelSpec, ModelVersion};
use crate::repository::{IndexSpec, OovPolicy, TableSpec};

/// Queries per batch unless the model's `[batching]` or the server's flags say otherwise: a batch of 64 queries
/// scores the catalogue 64 times per pass over its memory, and waits at most one such pass.
pub const DEFAULT_MAX_BATCH_QUERIES: usize = 64;

/// Warm-up measures batch sizes 1, 2, 4, … and stops after the first that takes longer than this (the batcher's
/// estimate scales the nearest measured size for the others, and learns from every executed batch).
const WARM_UP_BUDGET: Duration = Duration::from_millis(250);

/// Whose recommendations a request wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecallQuery {
    /// A row of the user table.
    UserId(i64),
    /// Item ids the user interacted with (for users the table does not hold).
    History(Vec<i64>),
}

/// How a request asks to be searched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SearchRequest {
    /// The model's way: its IVF index with `[recall.index] nprobe` when it has one, else exact.
    #[default]
    Default,
    /// Every item of the catalogue, whatever the model has.
    Exact,
    /// The IVF index with this many lists (1 to the index's `nlist`; only for models with an index).
    Nprobe(usize),
}

/// A recall request, as every transport decodes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallInput {
    pub query: RecallQuery,
    /// How many items to return (1 ≤ k ≤ catalogue size).
    pub k: usize,
    /// Item ids never to return.
    pub exclude: Vec<i64>,
    pub search: SearchRequest,
}

/// What a request may ask of a model's IVF index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexContract {
    pub nlist: usize,
    /// `[recall.index]`: how a query that asks nothing searches.
    pub default: Probe,
}

/// The answer to one recall query.
#[derive(Clone, Debug, PartialEq)]
pub struct Recalled {
    /// Best first (equal scores: lower id first).
    pub items: Vec<Scored>,
    /// For a `history` query: how many of its distinct items have a history vector (had training interactions).
    pub history_used: Option<usize>,
    /// Set when the query carried no signal and the answer is the model's fallback.
    pub fallback: Option<Fallback>,
}

/// What a recall request may carry, derived from `model.toml` and the server's limits.
#[derive(Clone, Debug)]
pub struct RecallContract {
    pub user_table: TableSpec,
    pub item_table: TableSpec,
    pub history_table: Option<TableSpec>,
    /// The `k` of a request that gives none (`[recall] default_k`, 1 to the catalogue size).
    pub default_k: usize,
    /// `max_history` and `max_exclude` bound a query; `max_candidates` is the most queries (users) of one
    /// KServe v2 request, the per-request row limit; `max_reply_items` bounds queries × `k` of one reply.
    pub limits: RequestLimits,
    /// How many queries of one request the model's queue can hold.
    pub queue: QueueFit,
    /// `[recall.index]`, when the model has an IVF index.
    pub index: Option<IndexContract>,
}

/// A validated query, ready to queue.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    User(i64),
    /// Distinct ids, in request order.
    History(Vec<i64>),
}

/// A validated request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Prepared {
    source: Source,
    k: usize,
    /// Catalogue ids, ascending, distinct.
    exclude: Vec<u32>,
    search: Search,
}

fn outside(id: i64, what: &str, table: &TableSpec) -> String {
    format!(
        "id {id} is outside the {what} {:?} ({}), which rejects unknown ids",
        table.name,
        table.id_range()
    )
}

impl RecallContract {
    /// The catalogue size: valid `k` is `1..=items`.
    pub fn items(&self) -> usize {
        self.item_table.rows as usize
    }

    /// Checks that a reply of `queries` lists of `k` items stays within `--max-reply-items`; `field` is where the
    /// request sets `k`.
    pub fn check_reply(&self, queries: usize, k: usize, field: &str) -> Result<(), ServiceError> {
        let max = self.limits.max_reply_items;
        let items = queries.saturating_mul(k);
        if items <= max {
            return Ok(());
        }
        let problem = if queries == 1 {
            format!("is {k}, more items than one reply may hold ({max}, --max-reply-items)")
        } else {
            format!(
                "is {k} for {queries} users: {items} items, more than one reply may hold ({max}, \
                 --max-reply-items); ask for fewer users or a smaller k"
            )
        };
        Err(ServiceError::invalid(field, problem))
    }

    /// How a query that asks for `request` is searched; `field` is where the request sets `nprobe`.
    pub fn search(&self, request: SearchRequest, field: &str) -> Result<Search, ServiceError> {
        match (request, &self.index) {
            (SearchRequest::Exact, _) | (SearchRequest::Default, None) => Ok(Search::Exact),
            (SearchRequest::Default, Some(index)) => Ok(Search::Index(index.default)),
            (SearchRequest::Nprobe(_), None) => Err(ServiceError::invalid(
                field,
                "is for models with an IVF index, and this model has none ([recall.index] in its model.toml): \
                 leave it out",
            )),
            (SearchRequest::Nprobe(n), Some(index)) if (1..=index.nlist).contains(&n) => {
                Ok(Search::Index(Probe {
                    nprobe: n,
                    ..index.default
                }))
            }
            (SearchRequest::Nprobe(n), Some(index)) => Err(ServiceError::invalid(
                field,
                format!(
                    "is {n}; it must be from 1 to the {} lists of the model's index",
                    index.nlist
                ),
            )),
        }
    }

    pub fn supports_history(&self) -> bool {
        self.history_table.is_some()
    }

    /// Checks a user id against the user table's OOV policy.
    pub fn check_user_id(&self, id: i64) -> Result<(), String> {
        if self.user_table.oov == OovPolicy::Reject && !self.user_table.contains(id) {
            Err(outside(id, "user table", &self.user_table))
        } else {
            Ok(())
        }
    }

    /// Checks a request against the model: exactly one of user id and history, `k` within the catalogue, lengths
    /// within the limits, every id within its table unless the table's `oov = "default"` policy covers it (user
    /// and history ids then read the default row; excluded ids outside the catalogue are dropped, since they can
    /// never be returned). Duplicate history and exclude ids count once.
    fn prepare(&self, input: RecallInput) -> Result<Prepared, ServiceError> {
        if input.k == 0 {
            return Err(ServiceError::invalid("k", "must be at least 1"));
        }
        if input.k > self.items() {
            return Err(ServiceError::invalid(
                "k",
                format!(
                    "is {}, more than the {} items of the catalogue",
                    input.k,
                    self.items()
                ),
            ));
        }
        let source = match input.query {
            RecallQuery::UserId(id) => {
                self.check_user_id(id)
                    .map_err(|problem| ServiceError::invalid("user_id", problem))?;
                Source::User(id)
            }
            RecallQuery::History(ids) => {
                let Some(table) = &self.history_table else {
                    return Err(ServiceError::invalid(
                        "history",
                        "is not supported by this model (its model.toml has no recall.history_table): send user_id",
                    ));
                };
                if ids.is_empty() {
                    return Err(ServiceError::invalid(
                        "history",
                        "must hold at least one item id",
                    ));
                }
                if ids.len() > self.limits.max_history {
                    return Err(ServiceError::invalid(
                        "history",
                        format!(
                            "holds {} ids, more than the limit of {} (--max-history)",
                            ids.len(),
                            self.limits.max_history
                        ),
                    ));
                }
                let mut seen = HashSet::with_capacity(ids.len());
                let mut distinct = Vec::with_capacity(ids.len());
                for (i, &id) in ids.iter().enumerate() {
                    if table.oov == OovPolicy::Reject && !table.contains(id) {
                        return Err(ServiceError::invalid(
                            format!("history[{i}]"),
                            outside(id, "history table", table),
                        ));
                    }
                    if seen.insert(id) {
                        distinct.push(id);
                    }
                }
                Source::History(distinct)
            }
        };
        if input.exclude.len() > self.limits.max_exclude {
            return Err(ServiceError::invalid(
                "exclude",
                format!(
                    "holds {} ids, more than the limit of {} (--max-exclude)",
                    input.exclude.len(),
                    self.limits.max_exclude
                ),
            ));
        }
        let mut exclude = Vec::with_capacity(input.exclude.len());
        for (i, &id) in input.exclude.iter().enumerate() {
            if self.item_table.contains(id) {
                exclude.push(id as u32);
            } else if self.item_table.oov == OovPolicy::Reject {
                return Err(ServiceError::invalid(
                    format!("exclude[{i}]"),
                    outside(id, "item table", &self.item_table),
                ));
            }
        }
        exclude.sort_unstable();
        exclude.dedup();
        Ok(Prepared {
            source,
            k: input.k,
            exclude,
            search: self.search(input.search, "nprobe")?,
        })
    }
}

/// How one query is searched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Search {
    /// Every item of the catalogue.
    Exact,
    /// Through the model's IVF index.
    Index(Probe),
}

/// One query to score.
#[derive(Debug)]
struct Query {
    source: Source,
    k: usize,
    exclude: Vec<u32>,
    search: Search,
    /// Passed through to the answer.
    history_used: Option<usize>,
}

/// The queries of one request, or of one chunk (at most `max_batch_rows` queries) of a request the model split:
/// one place in the queue, however many queries, as a ranking request's rows.
#[derive(Debug)]
pub struct RecallWork {
    queries: Vec<Query>,
}

impl Work for RecallWork {
    /// Each query's `k` best items, best first, in query order.
    type Output = Vec<Recalled>;
}

/// What every executor of one model reads.
#[derive(Debug)]
struct Tables {
    catalogue: Catalogue,
    /// The user table (index 0) and, when the model has one, the history table (index 1).
    store: CpuStore,
    dim: usize,
    /// Per row of the history table: whether its vector is zero (the item had no training interactions).
    history_zero: Vec<bool>,
    /// `[recall] popularity`, for histories without signal.
    popularity: Option<Popularity>,
    /// `[recall.index]`: the IVF index and how queries search it by default.
    index: Option<(IvfIndex, Probe)>,
}

impl Tables {
    /// Writes the query vector of `source` into `out` (`dim` values); `rows` is scratch for history rows.
    fn embed(
        &self,
        source: &Source,
        rows: &mut Vec<f32>,
        out: &mut [f32],
    ) -> Result<(), ExecError> {
        let gather = |e| ExecError::Failed(format!("reading the query's rows failed: {e}"));
        match source {
            Source::User(id) => self.store.gather(&[0], &[*id], out).map_err(gather)?,
            Source::History(ids) => {
                let dim = self.dim;
                rows.resize(ids.len() * dim, 0.0);
                self.store.gather(&[1], ids, rows).map_err(gather)?;
                // f64 sums in request order, then one rounding: the same value as the toolchain's numpy formula.
                let scale = 1.0 / (ids.len() as f64).sqrt();
                for (j, o) in out.iter_mut().enumerate() {
                    let mut sum = 0.0f64;
                    for row in rows.chunks_exact(dim) {
                        sum += f64::from(row[j]);
                    }
                    *o = (sum * scale) as f32;
                }
            }
        }
        if out.iter().all(|v| v.is_finite()) {
            Ok(())
        } else {
            // A history whose vectors sum beyond f32 (the tables are finite; their sum need not be).
            Err(ExecError::Failed(
                "the query vector is not finite".to_owned(),
            ))
        }
    }
}

/// An executor thread of a recall model: embeds a batch's queries and searches the catalogue for all of them
/// at once.
#[derive(Debug)]
struct RecallExecutor {
    tables: Arc<Tables>,
    vectors: Vec<f32>,
    rows: Vec<f32>,
    scratch: SearchScratch,
    index_scratch: IvfScratch,
    metrics: RecallMetrics,
}

impl RecallExecutor {
    /// Answers every job of `jobs`: their queries are scored together, and a job fails if one of its queries does.
    /// The query vectors' lookup and the search are the batch's gather and inference in `trace`.
    fn answer(&mut self, jobs: Vec<Job<RecallWork>>, trace: Option<&BatchTrace>) {
        let started = Instant::now();
        let dim = self.tables.dim;
        let all = || jobs.iter().flat_map(|job| &job.work.queries);
        self.vectors.resize(all().count() * dim, 0.0);
        let mut failed: Vec<Option<ExecError>> = Vec::with_capacity(all().count());
        for (query, out) in all().zip(self.vectors.chunks_exact_mut(dim)) {
            let (tables, rows) = (&self.tables, &mut self.rows);
            failed.push(catch_panic(|| tables.embed(&query.source, rows, out)).err());
        }
        let queries: Vec<(SearchQuery<'_>, Search)> = all()
            .zip(self.vectors.chunks_exact(dim))
            .zip(&failed)
            .filter(|(_, failure)| failure.is_none())
            .map(|((query, vector), _)| {
                let q = SearchQuery {
                    vector,
                    k: query.k,
                    exclude: &query.exclude,
                };
                (q, query.search)
            })
            .collect();
        let (tables, metrics) = (&self.tables, &self.metrics);
        let (scratch, index_scratch) = (&mut self.scratch, &mut self.index_scratch);
        let embedded = Instant::now();
        let searched = if queries.is_empty() {
            Ok(Vec::new())
        } else {
            catch_panic(|| search_all(tables, &queries, scratch, index_scratch, metrics))
        };
        if let Some(trace) = trace {
            trace.set_phases(embedded - started, embedded.elapsed());
        }
        drop(queries);
        let mut results = match searched {
            Ok(results) => results.into_iter().map(Ok).collect::<Vec<_>>(),
            Err(e) => {
                tracing::error!(error = %e, "recall batch failed");
                vec![Err(e); failed.iter().filter(|f| f.is_none()).count()]
            }
        }
        .into_iter();
        let mut failed = failed.into_iter();
        for job in jobs {
            let mut answers = Vec::with_capacity(job.work.queries.len());
            let mut error = None;
            for query in &job.work.queries {
                let items = match failed.next().flatten() {
                    Some(e) => {
                        tracing::error!(error = %e, "recall query failed");
                        Err(e)
                    }
                    None => results.next().unwrap_or(Err(ExecError::Panicked(
                        "a search result is missing".to_owned(),
                    ))),
                };
                match items {
                    Ok(items) => answers.push(Recalled {
                        items,
                        history_used: query.history_used,
                        fallback: None,
                    }),
                    Err(e) => {
                        error.get_or_insert(e);
                    }
                }
            }
            job.answer(match error {
                Some(e) => Err(e),
                None => Ok(answers),
            });
        }
    }
}

/// Searches every query as it asks (exact ones in one pass over the catalogue, index ones one by one), answers in
/// query order, and records what each search did.
fn search_all(
    tables: &Tables,
    queries: &[(SearchQuery<'_>, Search)],
    scratch: &mut SearchScratch,
    index_scratch: &mut IvfScratch,
    metrics: &RecallMetrics,
) -> Result<Vec<Vec<Scored>>, ExecError> {
    let exact: Vec<SearchQuery<'_>> = queries
        .iter()
        .filter(|(_, search)| *search == Search::Exact)
        .map(|(q, _)| *q)
        .collect();
    let mut exact_results = if exact.is_empty() {
        Vec::new()
    } else {
        let (results, stats) = tables.catalogue.search(&exact, scratch);
        metrics.topk_duration.observe(stats.seconds);
        metrics.items_scored.inc_by(stats.scored);
        metrics.exact_queries.inc_by(exact.len() as u64);
        results
    }
    .into_iter();
    let mut out = Vec::with_capacity(queries.len());
    for (q, search) in queries {
        match search {
            Search::Exact => out.push(exact_results.next().ok_or_else(|| {
                ExecError::Panicked("an exact search result is missing".to_owned())
            })?),
            Search::Index(probe) => {
                let (index, _) = tables.index.as_ref().ok_or_else(|| {
                    ExecError::Failed("an index search on a model without an index".to_owned())
                })?;
                let (mut results, stats) =
                    index.search(std::slice::from_ref(q), *probe, index_scratch);
                metrics.topk_duration.observe(stats.seconds);
                metrics.index_queries.inc();
                metrics.index_lists.inc_by(stats.lists);
                metrics.index_codes.inc_by(stats.codes);
                metrics.index_reranked.inc_by(stats.reranked);
                metrics.index_capped.inc_by(stats.capped);
                out.push(results.pop().unwrap_or_default());
            }
        }
    }
    Ok(out)
}

impl BatchExecutor for RecallExecutor {
    type Work = RecallWork;

    fn execute(&mut self, batch: Batch<Job<RecallWork>>, trace: &BatchTrace) {
        let jobs = batch.entries.into_iter().map(|e| e.job).collect();
        self.answer(jobs, Some(trace));
    }
}

/// A loaded recall model: its catalogue and tables, and the batcher in front of its executor threads.
#[derive(Debug)]
pub struct RecallModel {
    pub contract: RecallContract,
    tables: Arc<Tables>,
    /// Shards of each table of `model.toml`, in its order.
    shard_counts: Vec<usize>,
    batcher: Batcher<RecallWork>,
    batching: BatchConfig,
    default_deadline: Duration,
}

impl RecallModel {
    /// Opens the tables, lays the item table out as a [`Catalogue`] in `--shards` shards, measures a few batch
    /// sizes for the batcher's estimate, and starts the batcher.
    pub fn load(
        ctx: &LoadContext,
        mv: &ModelVersion,
        spec: Arc<ModelSpec>,
    ) -> Result<RecallModel, LoadError> {
        let toml = mv.dir.join("model.toml");
        let recall = spec
            .recall
            .as_ref()
            .ok_or_else(|| LoadError::new(&toml, "a lightgcn model needs [recall]"))?;
        let entry = |t: usize| spec.tables[t].clone();
        let item = entry(recall.item_table);
        let item_bytes = open_tables(&mv.dir, std::slice::from_ref(&item), ctx.preload)?;
        let catalogue = Catalogue::new(&item.spec, item_bytes[0].as_slice(), ctx.shards).map_err(
            |problem| {
                LoadError::new(
                    &mv.dir.join(&item.file),
                    format!("recall.item_table {:?} {problem}", item.spec.name),
                )
            },
        )?;
        let index = recall
            .index
            .as_ref()
            .map(|spec| open_index(&mv.dir, spec, &item.spec, &item_bytes[0], ctx.preload))
            .transpose()?;
        drop(item_bytes);

        let mut store_entries = vec![entry(recall.user_table)];
        store_entries.extend(recall.history_table.map(entry));
        let bytes = open_tables(&mv.dir, &store_entries, ctx.preload)?;
        let mut zero_rows = Vec::with_capacity(store_entries.len());
        for (e, b) in store_entries.iter().zip(&bytes) {
            zero_rows.push(scan_rows(&e.spec, b.as_slice()).map_err(|problem| {
                LoadError::new(
                    &mv.dir.join(&e.file),
                    format!("table {:?} {problem}", e.spec.name),
                )
            })?);
        }
        let history_zero = zero_rows.pop().filter(|_| recall.history_table.is_some());
        let popularity = recall
            .popularity
            .as_deref()
            .map(|tensor| Popularity::open(&mv.dir.join(&item.file), tensor, catalogue.items()))
            .transpose()?;
        let counters = store_entries
            .iter()
            .map(|e| ctx.metrics.oov_counter(&mv.name, &e.spec.name))
            .collect();
        let specs: Vec<TableSpec> = store_entries.iter().map(|e| e.spec.clone()).collect();
        let store = CpuStore::new(specs, bytes, ctx.shards, counters);

        let mut shard_counts = vec![1; spec.tables.len()];
        shard_counts[recall.item_table] = catalogue.shards();
        shard_counts[recall.user_table] = store.shard_layouts()[0].shards;
        if let Some(h) = recall.history_table {
            shard_counts[h] = store.shard_layouts()[1].shards;
        }
        for (i, t) in spec.tables.iter().enumerate() {
            let bytes = if i == recall.item_table {
                catalogue.bytes()
            } else {
                t.spec.bytes()
            };
            ctx.metrics.set_table_bytes(
                &mv.name,
                &t.spec.name,
                t.spec.storage.as_str(),
                "cpu",
                bytes,
            );
        }
        let (batching, default_deadline) = batch_config(ctx, &spec.batching);
        let contract = RecallContract {
            user_table: spec.tables[recall.user_table].spec.clone(),
            history_table: recall.history_table.map(|h| spec.tables[h].spec.clone()),
            item_table: item.spec,
            default_k: recall.default_k,
            limits: ctx.limits,
            queue: batching.fit(),
            index: index.as_ref().map(|(index, probe)| IndexContract {
                nlist: index.nlist(),
                default: *probe,
            }),
        };
        if let Some((index, _)) = &index {
            ctx.metrics.set_table_bytes(
                &mv.name,
                &format!("{}.index", contract.item_table.name),
                "int8",
                "cpu",
                index.bytes(),
            );
        }
        let tables = Arc::new(Tables {
            dim: catalogue.dim(),
            catalogue,
            store,
            history_zero: history_zero.unwrap_or_default(),
            popularity,
            index,
        });

        let estimator = Estimator::new(&batching.buckets);
        let metrics = ctx.metrics.recall(&mv.name);
        let mut executors: Vec<RecallExecutor> = (0..ctx.executors)
            .map(|_| RecallExecutor {
                tables: Arc::clone(&tables),
                vectors: Vec::new(),
                rows: Vec::new(),
                scratch: SearchScratch::default(),
                index_scratch: IvfScratch::default(),
                metrics: metrics.clone(),
            })
            .collect();
        if let Some(first) = executors.first_mut() {
            let started = Instant::now();
            warm_up(first, &batching, &estimator, contract.items())
                .map_err(|problem| LoadError::new(&mv.dir, problem))?;
            ctx.metrics
                .observe_warmup(&mv.name, started.elapsed().as_secs_f64());
        }
        tracing::info!(
            model = %mv.name,
            items = tables.catalogue.items(),
            dim = tables.dim,
            shards = tables.catalogue.shards(),
            storage = tables.catalogue.storage().as_str(),
            isa = tables.catalogue.isa().as_str(),
            index_lists = tables.index.as_ref().map(|(i, _)| i.nlist()),
            index_bytes = tables.index.as_ref().map(|(i, _)| i.bytes()),
            "recall catalogue ready"
        );
        let batcher = Batcher::start(
            &mv.name,
            batching.clone(),
            estimator,
            executors,
            ctx.metrics.batching(&mv.name),
        )
        .map_err(|e| LoadError::new(&mv.dir, format!("cannot start the executor threads: {e}")))?;
        Ok(RecallModel {
            contract,
            tables,
            shard_counts,
            batcher,
            batching,
            default_deadline,
        })
    }

    /// Recall always runs on the CPU (see docs/gpu.md).
    pub fn device(&self) -> &str {
        "cpu"
    }

    pub fn shard_counts(&self) -> Vec<usize> {
        self.shard_counts.clone()
    }

    pub fn batching(&self) -> &BatchConfig {
        &self.batching
    }

    /// Items in the catalogue.
    pub fn items(&self) -> usize {
        self.tables.catalogue.items()
    }

    /// The deadline of requests that come without one.
    pub fn default_deadline(&self) -> Duration {
        self.default_deadline
    }

    /// Refuses a request before it is decoded when admission would refuse it whatever its size.
    pub fn precheck(&self, deadline: Instant) -> Result<(), ServiceError> {
        self.batcher.precheck(deadline)
    }

    /// The answer to one request, best first (equal scores: lower id first).
    pub async fn recall(
        &self,
        input: RecallInput,
        deadline: Instant,
    ) -> Result<Recalled, ServiceError> {
        let mut answers = self.recall_many(vec![input], deadline).await?;
        answers
            .pop()
            .ok_or_else(|| ServiceError::Internal("recall: a query without an answer".to_owned()))
    }

    /// Several queries of one request, checked first (the first problem refuses the request), then queued
    /// together (all or none) in chunks of at most `max_batch_rows` queries, each one place in the queue, so
    /// they usually share passes over the catalogue. A history without signal is answered without a pass
    /// ([`signal`]). Answers in input order.
    pub async fn recall_many(
        &self,
        inputs: Vec<RecallInput>,
        deadline: Instant,
    ) -> Result<Vec<Recalled>, ServiceError> {
        let mut answers = Vec::with_capacity(inputs.len());
        let mut queries = Vec::with_capacity(inputs.len());
        for input in inputs {
            let p = self.contract.prepare(input)?;
            let history_used = self.history_used(&p.source);
            if history_used == Some(0) {
                let items = match &p.source {
                    Source::History(ids) => ids.len(),
                    Source::User(_) => 0,
                };
                let (items, fallback) =
                    signal::no_signal(self.tables.popularity.as_ref(), items, p.k, &p.exclude)?;
                answers.push(Some(Recalled {
                    items,
                    history_used,
                    fallback: Some(fallback),
                }));
                continue;
            }
            answers.push(None);
            queries.push(Query {
                source: p.source,
                k: p.k,
                exclude: p.exclude,
                search: p.search,
                history_used,
            });
        }
        let mut chunks = Vec::new();
        let mut queries = queries.into_iter().peekable();
        while queries.peek().is_some() {
            let chunk: Vec<Query> = queries
                .by_ref()
                .take(self.batching.max_batch_rows)
                .collect();
            let rows = chunk.len();
            chunks.push((RecallWork { queries: chunk }, rows));
        }
        let mut searched = if chunks.is_empty() {
            Vec::new()
        } else {
            self.batcher.run(chunks, deadline).await?
        }
        .into_iter()
        .flatten();
        answers
            .into_iter()
            .map(|answer| match answer {
                Some(fallback) => Ok(fallback),
                None => searched.next().ok_or_else(|| {
                    ServiceError::Internal("recall: a query without an answer".to_owned())
                }),
            })
            .collect()
    }

    /// The index's lists, when the model has an index.
    pub fn index_lists(&self) -> Option<usize> {
        self.tables.index.as_ref().map(|(index, _)| index.nlist())
    }

    /// For a history query: how many of its items have a nonzero history vector.
    fn history_used(&self, source: &Source) -> Option<usize> {
        let Source::History(ids) = source else {
            return None;
        };
        let table = self.contract.history_table.as_ref()?;
        let zero = &self.tables.history_zero;
        Some(
            ids.iter()
                .filter_map(|&id| table.resolve(id))
                .filter(|&row| !zero.get(row as usize).copied().unwrap_or(true))
                .count(),
        )
    }
}

/// Recall's batching: the model's `[batching]` with recall's own defaults (64 queries, no queue delay: a query
/// runs as soon as an executor is free, and queries that arrive meanwhile share the next pass), under the
/// server's flags. Unless buckets are configured, every batch size is its own bucket: recall pads nothing.
fn batch_config(ctx: &LoadContext, model: &BatchingSpec) -> (BatchConfig, Duration) {
    let mut spec = model.clone();
    spec.max_batch_rows.get_or_insert(DEFAULT_MAX_BATCH_QUERIES);
    spec.max_queue_delay_us.get_or_insert(0);
    let (mut config, deadline) = ctx.batching.resolve(&spec);
    if ctx.batching.buckets.is_none() && model.buckets.is_none() {
        config.buckets = (1..=config.max_batch_rows).collect();
    }
    (config, deadline)
}

/// Runs batches of 1, 2, 4, … zero queries (while each takes under [`WARM_UP_BUDGET`]) and records their times.
fn warm_up(
    executor: &mut RecallExecutor,
    batching: &BatchConfig,
    estimator: &Estimator,
    items: usize,
) -> Result<(), String> {
    let k = items.min(100);
    let search = match &executor.tables.index {
        Some((_, probe)) => Search::Index(*probe),
        None => Search::Exact,
    };
    let mut size = 1;
    loop {
        let size_now = size.min(batching.max_batch_rows);
        let queries = (0..size_now)
            .map(|_| Query {
                source: Source::User(0),
                k,
                exclude: Vec::new(),
                search,
                history_used: None,
            })
            .collect();
        let (job, mut answer) = Job::new(RecallWork { queries });
        let started = Instant::now();
        executor.answer(vec![job], None);
        let took = started.elapsed();
        match answer.try_recv().map(|a| a.result) {
            Ok(Ok(answers)) if answers.len() == size_now => {}
            Ok(Ok(_)) => return Err("a warm-up query got no answer".to_owned()),
            Ok(Err(e)) => return Err(format!("warm-up query failed: {e}")),
            Err(_) => return Err("warm-up query got no answer".to_owned()),
        }
        estimator.observe(size_now, took);
        if size_now >= batching.max_batch_rows || took > WARM_UP_BUDGET {
            return Ok(());
        }
        size *= 2;
    }
}

/// Maps `[recall.index]`'s file and checks it against the item table (`table`, mapped): what it was built from, its
/// structure, and `nprobe` against its `nlist`. The error names the file and the mismatch. Public so that tools
/// (`examples/ivf_bench.rs`) open an index exactly as the server does.
pub fn open_index(
    dir: &std::path::Path,
    spec: &IndexSpec,
    item: &TableSpec,
    table: &crate::embedding::TableBytes,
    preload: crate::embedding::Preload,
) -> Result<(IvfIndex, Probe), LoadError> {
    let path = dir.join(&spec.file);
    let map = crate::embedding::map_file(&path, preload)?;
    let file: ivf::Bytes = Arc::new(map);
    let index = IvfIndex::open(file, item, Arc::new(table.clone()))
        .map_err(|problem| LoadError::new(&path, format!("recall.index: {problem}")))?;
    if spec.nprobe > index.nlist() {
        return Err(LoadError::new(
            &path,
            format!(
                "recall.index.nprobe = {} is more than the index's {} lists",
                spec.nprobe,
                index.nlist()
            ),
        ));
    }
    let probe = Probe {
        nprobe: spec.nprobe,
        max_candidates: spec.max_candidates,
    };
    Ok((index, probe))
}

/// Which rows of a user or history table are zero vectors; refuses a table with a non-finite value (a NaN or
/// infinite user or history vector would have no ordered scores).
fn scan_rows(spec: &TableSpec, bytes: &[u8]) -> Result<Vec<bool>, String> {
    let row_bytes = spec.storage.row_bytes(spec.dim);
    let mut values = vec![0.0f32; spec.dim];
    let mut zero = Vec::with_capacity(spec.rows as usize);
    for (row, chunk) in bytes.chunks_exact(row_bytes).enumerate() {
        crate::embedding::cpu::decode_row(spec.storage, chunk, &mut values);
        if let Some(v) = values.iter().find(|v| !v.is_finite()) {
            return Err(format!(
                "row {row} holds a non-finite value ({v}): recall needs finite embeddings"
            ));
        }
        zero.push(values.iter().all(|&v| v == 0.0));
    }
    Ok(zero)
}

#[cfg(test)]
mod tests;
