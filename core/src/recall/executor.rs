//! The executor: what one executor thread of a recall model does with a batch. It embeds each query (a user's
//! row, or the `1 / sqrt(|H|)`-scaled sum of a history's rows), scores every exact query together in one pass over
//! the catalogue and the index queries together through the IVF index, and answers each job in query order. A query whose
//! vector cannot be made fails its own job and no other; a failed search fails every job that reached it.

use std::sync::Arc;
use std::time::Instant;

use super::contract::{Recalled, Search, Source};
use super::signal::Popularity;
use super::{Catalogue, IvfIndex, IvfScratch, Probe, Scored, SearchQuery, SearchScratch};
use crate::batching::{Batch, BatchExecutor, BatchTrace, ExecError, Job, Work, catch_panic};
use crate::embedding::{CpuStore, EmbeddingStore};
use crate::metrics::RecallMetrics;

/// One query to score.
#[derive(Debug)]
pub(super) struct Query {
    pub(super) source: Source,
    pub(super) k: usize,
    pub(super) exclude: Vec<u32>,
    pub(super) search: Search,
    /// Passed through to the answer.
    pub(super) history_used: Option<usize>,
}

/// The queries of one request, or of one chunk (at most `max_batch_rows` queries) of a request the model split:
/// one place in the queue, however many queries, as a ranking request's rows.
#[derive(Debug)]
pub struct RecallWork {
    pub(super) queries: Vec<Query>,
}

impl Work for RecallWork {
    /// Each query's `k` best items, best first, in query order.
    type Output = Vec<Recalled>;
}

/// What every executor of one model reads.
#[derive(Debug)]
pub(super) struct Tables {
    pub(super) catalogue: Catalogue,
    /// The user table (index 0) and, when the model has one, the history table (index 1).
    pub(super) store: CpuStore,
    pub(super) dim: usize,
    /// Per row of the history table: whether its vector is zero (the item had no training interactions).
    pub(super) history_zero: Vec<bool>,
    /// `[recall] popularity`, for histories without signal.
    pub(super) popularity: Option<Popularity>,
    /// `[recall.index]`: the IVF index and how queries search it by default.
    pub(super) index: Option<(IvfIndex, Probe)>,
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
pub(super) struct RecallExecutor {
    pub(super) tables: Arc<Tables>,
    vectors: Vec<f32>,
    rows: Vec<f32>,
    scratch: SearchScratch,
    index_scratch: IvfScratch,
    pub(super) metrics: RecallMetrics,
}

impl RecallExecutor {
    /// An executor of `tables`, with empty scratch that grows to the largest batch it answers.
    pub(super) fn new(tables: Arc<Tables>, metrics: RecallMetrics) -> RecallExecutor {
        RecallExecutor {
            tables,
            vectors: Vec::new(),
            rows: Vec::new(),
            scratch: SearchScratch::default(),
            index_scratch: IvfScratch::default(),
            metrics,
        }
    }

    /// Answers every job of `jobs`: their queries are scored together, and a job fails if one of its queries does.
    /// The query vectors' lookup and the search are the batch's gather and inference in `trace`.
    pub(super) fn answer(&mut self, jobs: Vec<Job<RecallWork>>, trace: Option<&BatchTrace>) {
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

/// Searches every query as it asks (exact ones in one pass over the catalogue; index ones together, one search per
/// distinct [`Probe`], so that they share the centroid pass and each list's read), answers in query order, and
/// records what each search did.
fn search_all(
    tables: &Tables,
    queries: &[(SearchQuery<'_>, Search)],
    scratch: &mut SearchScratch,
    index_scratch: &mut IvfScratch,
    metrics: &RecallMetrics,
) -> Result<Vec<Vec<Scored>>, ExecError> {
    let mut out: Vec<Option<Vec<Scored>>> = vec![None; queries.len()];
    let mut searched = |search: Search, out: &mut [Option<Vec<Scored>>]| -> Result<(), ExecError> {
        let (at, batch): (Vec<usize>, Vec<SearchQuery<'_>>) = queries
            .iter()
            .enumerate()
            .filter(|(_, (_, s))| *s == search)
            .map(|(i, (q, _))| (i, *q))
            .unzip();
        let results = match search {
            Search::Exact => {
                let (results, stats) = tables.catalogue.search(&batch, scratch);
                metrics.topk_duration.observe(stats.seconds);
                metrics.items_scored.inc_by(stats.scored);
                metrics.exact_queries.inc_by(batch.len() as u64);
                results
            }
            Search::Index(probe) => {
                let (index, _) = tables.index.as_ref().ok_or_else(|| {
                    ExecError::Failed("an index search on a model without an index".to_owned())
                })?;
                let (results, stats) = index.search(&batch, probe, index_scratch);
                metrics.topk_duration.observe(stats.seconds);
                metrics.index_queries.inc_by(batch.len() as u64);
                metrics.index_lists.inc_by(stats.lists);
                metrics.index_codes.inc_by(stats.codes);
                metrics.index_reranked.inc_by(stats.reranked);
                metrics.index_capped.inc_by(stats.capped);
                results
            }
        };
        if results.len() != at.len() {
            return Err(ExecError::Panicked("a search result is missing".to_owned()));
        }
        for (i, result) in at.into_iter().zip(results) {
            out[i] = Some(result);
        }
        Ok(())
    };
    // Each distinct search once, in the order it first appears.
    let mut seen: Vec<Search> = Vec::new();
    for (_, search) in queries {
        if !seen.contains(search) {
            seen.push(*search);
            searched(*search, &mut out)?;
        }
    }
    out.into_iter()
        .map(|r| r.ok_or_else(|| ExecError::Panicked("a search result is missing".to_owned())))
        .collect()
}

impl BatchExecutor for RecallExecutor {
    type Work = RecallWork;

    fn execute(&mut self, batch: Batch<Job<RecallWork>>, trace: &BatchTrace) {
        let jobs = batch.entries.into_iter().map(|e| e.job).collect();
        self.answer(jobs, Some(trace));
    }
}
