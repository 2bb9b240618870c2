//! Recall's families: the time of each batch's search, the work exact search does, and how queries searched
//! through the IVF index spent theirs.

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, Registry};

use super::{LATENCY_BUCKETS, Metrics, counter, histogram, register};

/// Recall's families.
#[derive(Debug, Clone)]
pub(super) struct Recall {
    topk_duration: HistogramVec,
    items_scored: IntCounterVec,
    queries: IntCounterVec,
    index_lists: IntCounterVec,
    index_codes: IntCounterVec,
    index_reranked: IntCounterVec,
    index_capped: IntCounterVec,
}

impl Recall {
    pub(super) fn new() -> Recall {
        Recall {
            topk_duration: histogram(
                "recserve_topk_duration_seconds",
                "Time to score every catalogue item for one batch of recall queries and select each query's top K.",
                LATENCY_BUCKETS,
                &["model"],
            ),
            items_scored: counter(
                "recserve_recall_items_scored_total",
                "(query, item) pairs scored by recall's exact search: catalogue items times queries.",
                &["model"],
            ),
            queries: counter(
                "recserve_recall_queries_total",
                "Recall queries searched, by how: search=\"exact\" (every item) or \"index\" (the IVF index).",
                &["model", "search"],
            ),
            index_lists: counter(
                "recserve_recall_index_lists_scanned_total",
                "IVF lists scanned by recall queries searched through the index.",
                &["model"],
            ),
            index_codes: counter(
                "recserve_recall_index_codes_scored_total",
                "Item codes scored (approximately, in int8) by recall queries searched through the index.",
                &["model"],
            ),
            index_reranked: counter(
                "recserve_recall_index_candidates_reranked_total",
                "Candidates re-ranked with the exact score by recall queries searched through the index.",
                &["model"],
            ),
            index_capped: counter(
                "recserve_recall_index_capped_total",
                "Index queries whose candidates were cut by max_candidates (their answer may miss an item of the \
                 probed lists' exact top K).",
                &["model"],
            ),
        }
    }

    pub(super) fn register(&self, registry: &Registry) {
        register(
            registry,
            vec![
                Box::new(self.topk_duration.clone()),
                Box::new(self.items_scored.clone()),
                Box::new(self.queries.clone()),
                Box::new(self.index_lists.clone()),
                Box::new(self.index_codes.clone()),
                Box::new(self.index_reranked.clone()),
                Box::new(self.index_capped.clone()),
            ],
        );
    }
}

impl Metrics {
    /// The handles a recall model's executors use.
    pub(crate) fn recall(&self, model: &str) -> RecallMetrics {
        RecallMetrics::of(&self.recall, model)
    }
}

impl RecallMetrics {
    /// Handles that no registry exports, for work that is not traffic (a loaded version's warm-up).
    pub(crate) fn unexported(model: &str) -> RecallMetrics {
        RecallMetrics::of(&Recall::new(), model)
    }

    fn of(r: &Recall, model: &str) -> RecallMetrics {
        RecallMetrics {
            topk_duration: r.topk_duration.with_label_values(&[model]),
            items_scored: r.items_scored.with_label_values(&[model]),
            exact_queries: r.queries.with_label_values(&[model, "exact"]),
            index_queries: r.queries.with_label_values(&[model, "index"]),
            index_lists: r.index_lists.with_label_values(&[model]),
            index_codes: r.index_codes.with_label_values(&[model]),
            index_reranked: r.index_reranked.with_label_values(&[model]),
            index_capped: r.index_capped.with_label_values(&[model]),
        }
    }
}

/// Metric handles of one recall model.
#[derive(Debug, Clone)]
pub(crate) struct RecallMetrics {
    pub(crate) topk_duration: Histogram,
    pub(crate) items_scored: IntCounter,
    pub(crate) exact_queries: IntCounter,
    pub(crate) index_queries: IntCounter,
    pub(crate) index_lists: IntCounter,
    pub(crate) index_codes: IntCounter,
    pub(crate) index_reranked: IntCounter,
    pub(crate) index_capped: IntCounter,
}
