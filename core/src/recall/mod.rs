//! Recall: the `kind = "lightgcn"` model (any two-tower model with a user table and an item table), exact top-K
//! by inner product over its item catalogue.
//!
//! A query's vector is the user's row of the user table (`user_id`), or, for a user the table does not hold, the
//! LightGCN embedding of an item history: `e_u = (1 / sqrt(|H|)) · Σ_{i ∈ H} h_i` over the history table
//! (docs/model-repository.md). Queries are batched by the shared [`Batcher`]: a batch of queries is scored
//! together as a matrix product over cache-sized blocks of the catalogue ([`Catalogue`]), each query keeps its own
//! top K ([`TopK`]) per shard, and the shards' lists are merged. Scores are exact (no approximate index) and
//! reproducible bit for bit whatever the batch, shard layout or CPU.
//!
//! By concern:
//! - `contract`: the request every transport decodes into ([`RecallInput`]) and its check against the model
//!   ([`RecallContract`]);
//! - `executor`: what an executor thread does with a batch of queries;
//! - `load`: opening the tables and the IVF index, warm-up, and starting the batcher ([`RecallModel::load`]);
//! - `catalogue`, `kernel`, `select`: the exact search; `ivf`: the IVF index; `signal`: histories without signal.
//!
//! This file holds [`RecallModel`], the loaded model every route calls.

mod catalogue;
mod contract;
mod executor;
mod ivf;
mod kernel;
mod load;
mod pq4;
#[cfg(test)]
mod reference;
mod select;
mod signal;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use catalogue::{
    Catalogue, CodeRow, F32Row, LANES, Panels, SearchQuery, SearchScratch, SearchStats, Shard,
};
pub use contract::{
    IndexContract, RecallContract, RecallInput, RecallQuery, Recalled, Search, SearchRequest,
};
pub use executor::RecallWork;
pub use ivf::{IvfIndex, IvfScratch, IvfStats, Probe, exact_score, table_checksum};
pub use kernel::{BLOCK_BYTES, Isa};
pub use load::{DEFAULT_MAX_BATCH_QUERIES, open_index};
pub use select::{Scored, TopK, answer_order, merge};
pub(crate) use signal::Fallback;

use crate::batching::{BatchConfig, Batcher, StatisticsSnapshot};
use crate::error::ServiceError;
use contract::Source;
use executor::{Query, Tables};

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
    /// Recall always runs on the CPU (see docs/gpu.md).
    pub(crate) fn device(&self) -> &str {
        "cpu"
    }

    pub(crate) fn shard_counts(&self) -> Vec<usize> {
        self.shard_counts.clone()
    }

    /// Items in the catalogue.
    pub(crate) fn items(&self) -> usize {
        self.tables.catalogue.items()
    }

    /// The deadline of requests that come without one.
    pub(crate) fn default_deadline(&self) -> Duration {
        self.default_deadline
    }

    /// Refuses a request before it is decoded when admission would refuse it whatever its size.
    pub(crate) fn precheck(&self, deadline: Instant) -> Result<(), ServiceError> {
        self.batcher.precheck(deadline)
    }

    /// The batching it runs with.
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

    /// The answer to one request, best first (equal scores: lower id first).
    pub(crate) async fn recall(
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
        let mut prepared = Vec::with_capacity(inputs.len());
        for input in inputs {
            prepared.push(self.contract.prepare(input)?);
        }
        // From here on the input is valid: the call counts in the model's statistics.
        let result = self.recall_prepared(prepared, deadline).await;
        self.batcher.called(&result);
        result
    }

    /// The answers of checked queries, as [`Self::recall_many`] gives them.
    async fn recall_prepared(
        &self,
        prepared: Vec<contract::Prepared>,
        deadline: Instant,
    ) -> Result<Vec<Recalled>, ServiceError> {
        let mut answers = Vec::with_capacity(prepared.len());
        let mut queries = Vec::with_capacity(prepared.len());
        for p in prepared {
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

#[cfg(test)]
mod tests;
