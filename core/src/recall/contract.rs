//! The request contract: what a recall request may carry ([`RecallInput`]), what a model accepts
//! ([`RecallContract`], derived from its `model.toml` and the server's limits), and the check that turns a request
//! into a validated query ([`RecallContract::prepare`]) before it is queued. Every transport decodes into these
//! types, so every transport refuses the same requests with the same messages.

use std::collections::HashSet;

use super::{Fallback, Probe, Scored};
use crate::batching::QueueFit;
use crate::error::ServiceError;
use crate::registry::RequestLimits;
use crate::repository::{OovPolicy, TableSpec};

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
pub(super) enum Source {
    User(i64),
    /// Distinct ids, in request order.
    History(Vec<i64>),
}

/// A validated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Prepared {
    pub(super) source: Source,
    pub(super) k: usize,
    /// Catalogue ids, ascending, distinct.
    pub(super) exclude: Vec<u32>,
    pub(super) search: Search,
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

    /// Checks a user id against the user table's OOV policy.
    pub fn check_user_id(&self, id: i64) -> Result<(), String> {
        if self.user_table.oov == OovPolicy::Reject && !self.user_table.contains(id) {
            Err(outside(id, "user table", &self.user_table))
        } else {
            Ok(())
        }
    }

    /// Checks the length of a request's `history` against `--max-history`.
    pub fn check_history_len(&self, len: usize) -> Result<(), ServiceError> {
        if len > self.limits.max_history {
            return Err(ServiceError::invalid(
                "history",
                format!(
                    "holds {len} ids, more than the limit of {} (--max-history)",
                    self.limits.max_history
                ),
            ));
        }
        Ok(())
    }

    /// Checks a request against the model: exactly one of user id and history, `k` within the catalogue, lengths
    /// within the limits, every id within its table unless the table's `oov = "default"` policy covers it (user
    /// and history ids then read the default row; excluded ids outside the catalogue are dropped, since they can
    /// never be returned). Duplicate history and exclude ids count once.
    pub(super) fn prepare(&self, input: RecallInput) -> Result<Prepared, ServiceError> {
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
                self.check_history_len(ids.len())?;
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
