//! The embedding tables' families: their size in memory (host and GPU), ids read from a default row, and the Redis
//! tier (its row cache, fetches, breakers, client, and the update stream that keeps the cache fresh).

use prometheus::{HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Registry};

use super::{LATENCY_BUCKETS, Metrics, counter, gauge, histogram, register};

/// The embedding tables' families.
#[derive(Debug, Clone)]
pub(super) struct Embedding {
    oov: IntCounterVec,
    table_bytes: IntGaugeVec,
    gpu_memory: IntGaugeVec,
    cache_lookups: IntCounterVec,
    cache_evictions: IntCounterVec,
    cache_bytes: IntGaugeVec,
    tier_fetch_duration: HistogramVec,
    tier_rows_fetched: IntCounterVec,
    tier_errors: IntCounterVec,
    tier_open_groups: IntGaugeVec,
    tier_client_replaced: IntCounterVec,
    unfetched_default: IntCounterVec,
    update_visible: HistogramVec,
    update_entries: IntCounterVec,
    update_rows: IntCounterVec,
    update_errors: IntCounterVec,
    update_following: IntGaugeVec,
}

impl Embedding {
    pub(super) fn new() -> Embedding {
        Embedding {
            oov: counter(
                "recserve_embedding_oov_total",
                "Ids outside a table's vocabulary that were read from the table's default row.",
                &["model", "table"],
            ),
            table_bytes: gauge(
                "recserve_embedding_table_bytes",
                "Bytes of each embedding table as stored, by model, table, storage type and device.",
                &["model", "table", "storage", "device"],
            ),
            gpu_memory: gauge(
                "recserve_gpu_memory_bytes",
                "Bytes of GPU memory each shard of each embedding table occupies, by model, table, shard and device.",
                &["model", "table", "shard", "device"],
            ),
            cache_lookups: counter(
                "recserve_embedding_cache_lookups_total",
                "Ids of Redis-tier tables looked up in the in-process row cache, by model and result (hit, miss).",
                &["model", "result"],
            ),
            cache_evictions: counter(
                "recserve_embedding_cache_evictions_total",
                "Rows the in-process row cache evicted to stay within --embedding-cache-bytes.",
                &["model"],
            ),
            cache_bytes: gauge(
                "recserve_embedding_cache_bytes",
                "Bytes the in-process row cache holds (rows as stored plus 64 bytes each).",
                &["model"],
            ),
            tier_fetch_duration: histogram(
                "recserve_embedding_tier_fetch_duration_seconds",
                "Time to fetch one batch's missing rows from the Redis tier (every group, in flight together).",
                LATENCY_BUCKETS,
                &["model"],
            ),
            tier_rows_fetched: counter(
                "recserve_embedding_tier_rows_fetched_total",
                "Rows fetched from the Redis tier.",
                &["model"],
            ),
            tier_errors: counter(
                "recserve_embedding_tier_errors_total",
                "Rows not fetched from the Redis tier, by why: timeout (the batch's deadline came first), \
                 connection, server (an error reply), missing (no such key), bad_row (wrong length), skipped (not \
                 asked: their hash-tag group failed recently and its breaker is open).",
                &["model", "kind"],
            ),
            tier_open_groups: gauge(
                "recserve_embedding_tier_open_groups",
                "Hash-tag groups of the Redis tier whose breaker is open: their rows are not fetched (one probe per \
                 backoff) and follow their table's unfetched policy.",
                &["model"],
            ),
            tier_client_replaced: counter(
                "recserve_embedding_tier_client_replaced_total",
                "Times the Redis tier's cluster connection was replaced by a new one because it had answered \
                 nothing, not even an error, for 3 s while a probe was out (the client's routing task was stuck).",
                &[],
            ),
            unfetched_default: counter(
                "recserve_embedding_unfetched_default_total",
                "Ids of Redis-tier tables with unfetched = \"default_row\" read from the default row because their \
                 row was not fetched in time.",
                &["model", "table"],
            ),
            update_visible: histogram(
                "recserve_embedding_update_visible_seconds",
                "Online row updates of the Redis tier: from an update stream entry's timestamp to its rows dropped \
                 from the row cache (the next batch reads the new rows).",
                LATENCY_BUCKETS,
                &["model"],
            ),
            update_entries: counter(
                "recserve_embedding_update_entries_total",
                "Update stream entries applied to the row cache.",
                &["model"],
            ),
            update_rows: counter(
                "recserve_embedding_updated_rows_total",
                "Rows named by applied update stream entries (dropped from the row cache if it held them).",
                &["model"],
            ),
            update_errors: counter(
                "recserve_embedding_update_errors_total",
                "Following the update stream, by what went wrong: connection (reading failed; retried), \
                 bad_entry (an entry or part of one skipped), gap (unread entries were trimmed; the cache was \
                 dropped).",
                &["model", "kind"],
            ),
            update_following: gauge(
                "recserve_embedding_update_following",
                "Loaded versions whose last read of their update stream succeeded (0 while reading fails).",
                &["model"],
            ),
        }
    }

    pub(super) fn register(&self, registry: &Registry) {
        register(
            registry,
            vec![
                Box::new(self.oov.clone()),
                Box::new(self.table_bytes.clone()),
                Box::new(self.gpu_memory.clone()),
                Box::new(self.cache_lookups.clone()),
                Box::new(self.cache_evictions.clone()),
                Box::new(self.cache_bytes.clone()),
                Box::new(self.tier_fetch_duration.clone()),
                Box::new(self.tier_rows_fetched.clone()),
                Box::new(self.tier_errors.clone()),
                Box::new(self.tier_open_groups.clone()),
                Box::new(self.tier_client_replaced.clone()),
                Box::new(self.unfetched_default.clone()),
                Box::new(self.update_visible.clone()),
                Box::new(self.update_entries.clone()),
                Box::new(self.update_rows.clone()),
                Box::new(self.update_errors.clone()),
                Box::new(self.update_following.clone()),
            ],
        );
    }
}

impl Metrics {
    pub(crate) fn oov_counter(&self, model: &str, table: &str) -> IntCounter {
        self.embedding.oov.with_label_values(&[model, table])
    }

    pub(crate) fn set_table_bytes(
        &self,
        model: &str,
        table: &str,
        storage: &str,
        device: &str,
        bytes: u64,
    ) {
        self.embedding
            .table_bytes
            .with_label_values(&[model, table, storage, device])
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Records the device memory of one shard of a GPU-resident table.
    pub(crate) fn set_gpu_memory_bytes(
        &self,
        model: &str,
        table: &str,
        shard: usize,
        device: &str,
        bytes: u64,
    ) {
        self.embedding
            .gpu_memory
            .with_label_values(&[model, table, &shard.to_string(), device])
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// `recserve_embedding_unfetched_default_total` of one Redis-tier table.
    pub(crate) fn unfetched_default_counter(&self, model: &str, table: &str) -> IntCounter {
        self.embedding
            .unfetched_default
            .with_label_values(&[model, table])
    }

    /// `recserve_embedding_tier_client_replaced_total`: the shared Redis Cluster connection's replacements.
    pub fn tier_client_replaced(&self) -> IntCounter {
        self.embedding
            .tier_client_replaced
            .with_label_values::<&str>(&[])
    }

    /// What the Redis tier and its row cache of `model` report into.
    pub fn tier(&self, model: &str) -> crate::embedding::remote::TierMetrics {
        use crate::embedding::remote::redis::FetchFailure;
        use crate::embedding::remote::updates::FollowError;
        let e = &self.embedding;
        crate::embedding::remote::TierMetrics {
            hits: e.cache_lookups.with_label_values(&[model, "hit"]),
            misses: e.cache_lookups.with_label_values(&[model, "miss"]),
            fetch_duration: e.tier_fetch_duration.with_label_values(&[model]),
            rows_fetched: e.tier_rows_fetched.with_label_values(&[model]),
            failures: FetchFailure::ALL
                .map(|f| e.tier_errors.with_label_values(&[model, f.as_str()])),
            open_groups: e.tier_open_groups.with_label_values(&[model]),
            cache: crate::embedding::remote::cache::CacheMetrics {
                evictions: e.cache_evictions.with_label_values(&[model]),
                bytes: e.cache_bytes.with_label_values(&[model]),
            },
            updates: crate::embedding::remote::updates::UpdateMetrics {
                visible: e.update_visible.with_label_values(&[model]),
                entries: e.update_entries.with_label_values(&[model]),
                rows: e.update_rows.with_label_values(&[model]),
                errors: FollowError::ALL
                    .map(|err| e.update_errors.with_label_values(&[model, err.as_str()])),
                following: e.update_following.with_label_values(&[model]),
            },
        }
    }
}
