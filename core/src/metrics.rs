//! Prometheus metrics: every metric is described once here, with its unit in its name. Label values are bounded:
//! model and table names come from the repository, endpoints and protocols from the code.
//!
//! The full list, with what each is for, is in `docs/metrics.md`.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::trace::slow::SlowRequests;
use crate::trace::{Finished, Stage};

/// Latency buckets from 10 µs to 10 s, three per decade.
pub const LATENCY_BUCKETS: &[f64] = &[
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// Row-count buckets: powers of two up to 8192.
pub const ROW_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
];

/// Ratio buckets for actual ÷ estimated execution time.
pub const RATIO_BUCKETS: &[f64] = &[0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0];

/// The `model` label of requests for a model that is not served: bounded, unlike the name in the URL.
pub const UNKNOWN_MODEL: &str = "";

/// Every metric the server exports.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    request_duration: HistogramVec,
    traces: Arc<TraceSink>,
    request_rows: HistogramVec,
    gather_duration: HistogramVec,
    inference_duration: HistogramVec,
    oov: IntCounterVec,
    rejected: IntCounterVec,
    abandoned: IntCounterVec,
    expired: IntCounterVec,
    model_info: IntGaugeVec,
    table_bytes: IntGaugeVec,
    queue_duration: HistogramVec,
    batch_rows: HistogramVec,
    padding_rows: IntCounterVec,
    batches: IntCounterVec,
    queue_depth: IntGaugeVec,
    admission_margin: GaugeVec,
    batch_cost: GaugeVec,
    execution: HistogramVec,
    estimate_ratio: HistogramVec,
    gpu_memory: IntGaugeVec,
    topk_duration: HistogramVec,
    recall_items_scored: IntCounterVec,
    recall_queries: IntCounterVec,
    index_lists: IntCounterVec,
    index_codes: IntCounterVec,
    index_reranked: IntCounterVec,
    index_capped: IntCounterVec,
    pipeline_stage_duration: HistogramVec,
    model_loads: IntCounterVec,
    model_load_duration: HistogramVec,
    model_warmup_duration: HistogramVec,
    versions_draining: IntGaugeVec,
    connections_open: IntGaugeVec,
    connections_refused: IntCounterVec,
    connections_timed_out: IntCounterVec,
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

/// Where finished request traces go: the per-stage histograms (answered requests only) and the slow-request
/// record (every request that reached a model).
#[derive(Debug)]
pub struct TraceSink {
    stages: HistogramVec,
    /// Each model's stage histograms, resolved once (a label lookup per stage of every request cost more).
    by_model: std::sync::Mutex<HashMap<String, Arc<[Histogram; Stage::ALL.len()]>>>,
    slow: SlowRequests,
}

impl TraceSink {
    pub fn finish(&self, finished: Finished) {
        if finished.outcome.status == 200 {
            let histograms = self.histograms(&finished.outcome.model);
            for (stage, took) in &finished.stages {
                let i = Stage::ALL.iter().position(|s| s == stage).unwrap_or(0);
                histograms[i].observe(took.as_secs_f64());
            }
        }
        self.slow.offer(finished);
    }

    fn histograms(&self, model: &str) -> Arc<[Histogram; Stage::ALL.len()]> {
        let mut by_model = self
            .by_model
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(found) = by_model.get(model) {
            return Arc::clone(found);
        }
        let made: Arc<[Histogram; Stage::ALL.len()]> = Arc::new(
            Stage::ALL.map(|stage| self.stages.with_label_values(&[model, stage.as_str()])),
        );
        by_model.insert(model.to_owned(), Arc::clone(&made));
        made
    }

    pub fn slow(&self) -> &SlowRequests {
        &self.slow
    }
}

/// Buckets for loading a model: 10 ms to 20 minutes.
pub const LOAD_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0,
];

fn histogram(name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("metric definitions are static and valid")
}

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels)
        .expect("metric definitions are static and valid")
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels)
        .expect("metric definitions are static and valid")
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let m = Metrics {
            registry: Registry::new(),
            requests: counter(
                "recserve_requests_total",
                "Requests answered, by model, endpoint, protocol and status code.",
                &["model", "endpoint", "protocol", "code"],
            ),
            request_duration: histogram(
                "recserve_request_duration_seconds",
                "Time from receiving a request to having its response ready, by model, endpoint and protocol.",
                LATENCY_BUCKETS,
                &["model", "endpoint", "protocol"],
            ),
            traces: Arc::new(TraceSink {
                stages: histogram(
                    "recserve_request_stage_seconds",
                    "Time answered requests spent in each stage, from their first byte to their response handed \
                     to the connection (stages in docs/metrics.md), by model and stage.",
                    LATENCY_BUCKETS,
                    &["model", "stage"],
                ),
                by_model: std::sync::Mutex::new(HashMap::new()),
                slow: SlowRequests::default(),
            }),
            request_rows: histogram(
                "recserve_request_rows",
                "Rows (candidates) per ranking request.",
                ROW_BUCKETS,
                &["model"],
            ),
            gather_duration: histogram(
                "recserve_gather_duration_seconds",
                "Time to gather the embedding rows of one batch, by model and device.",
                LATENCY_BUCKETS,
                &["model", "device"],
            ),
            inference_duration: histogram(
                "recserve_inference_duration_seconds",
                "Time ONNX Runtime takes to run the dense network on one batch.",
                LATENCY_BUCKETS,
                &["model"],
            ),
            oov: counter(
                "recserve_embedding_oov_total",
                "Ids outside a table's vocabulary that were read from the table's default row.",
                &["model", "table"],
            ),
            rejected: counter(
                "recserve_rejected_total",
                "Requests refused without being executed, by model and reason.",
                &["model", "reason"],
            ),
            abandoned: counter(
                "recserve_abandoned_total",
                "Queued requests dropped before execution because their client had gone.",
                &["model"],
            ),
            expired: counter(
                "recserve_expired_total",
                "Queued requests dropped before execution because their deadline had passed.",
                &["model"],
            ),
            model_info: gauge(
                "recserve_model_info",
                "Always 1 for each served model; the labels say which version, kind, precision and device.",
                &["model", "version", "kind", "precision", "device"],
            ),
            table_bytes: gauge(
                "recserve_embedding_table_bytes",
                "Bytes of each embedding table as stored, by model, table, storage type and device.",
                &["model", "table", "storage", "device"],
            ),
            queue_duration: histogram(
                "recserve_queue_duration_seconds",
                "Time requests waited in the batcher's queue before their batch was handed to an executor.",
                LATENCY_BUCKETS,
                &["model"],
            ),
            batch_rows: histogram(
                "recserve_batch_rows",
                "Rows of each executed batch, before padding to its bucket.",
                ROW_BUCKETS,
                &["model"],
            ),
            padding_rows: counter(
                "recserve_batch_padding_rows_total",
                "Rows added to batches to pad them up to a bucket size (computed and thrown away).",
                &["model"],
            ),
            batches: counter(
                "recserve_batches_total",
                "Batches executed, by why they were closed: full, executor_free, delay, deadline, unbatched, drain.",
                &["model", "reason"],
            ),
            queue_depth: gauge(
                "recserve_queue_depth",
                "Requests (or chunks of large ones) waiting in the batcher's queue.",
                &["model"],
            ),
            admission_margin: GaugeVec::new(
                Opts::new(
                    "recserve_admission_margin_seconds",
                    "Margin admission adds to each predicted wait: the 99th percentile of how much later than \
                     predicted recent requests were answered.",
                ),
                &["model"],
            )
            .expect("metric definitions are static and valid"),
            batch_cost: GaugeVec::new(
                Opts::new(
                    "recserve_batch_cost_seconds",
                    "The line through the measured batch times against their rows that batching decides by: \
                     part=\"fixed\" its intercept (what running two batches as one saves), part=\"row\" its slope \
                     (what one more row adds).",
                ),
                &["model", "part"],
            )
            .expect("metric definitions are static and valid"),
            execution: histogram(
                "recserve_batch_execution_seconds",
                "Time to execute one batch (gather and inference of the padded batch).",
                LATENCY_BUCKETS,
                &["model"],
            ),
            estimate_ratio: histogram(
                "recserve_batch_execution_estimate_ratio",
                "Actual ÷ estimated execution time of each batch: how well the batcher predicts.",
                RATIO_BUCKETS,
                &["model"],
            ),
            gpu_memory: gauge(
                "recserve_gpu_memory_bytes",
                "Bytes of GPU memory each shard of each embedding table occupies, by model, table, shard and device.",
                &["model", "table", "shard", "device"],
            ),
            topk_duration: histogram(
                "recserve_topk_duration_seconds",
                "Time to score every catalogue item for one batch of recall queries and select each query's top K.",
                LATENCY_BUCKETS,
                &["model"],
            ),
            recall_items_scored: counter(
                "recserve_recall_items_scored_total",
                "(query, item) pairs scored by recall's exact search: catalogue items times queries.",
                &["model"],
            ),
            recall_queries: counter(
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
            pipeline_stage_duration: histogram(
                "recserve_pipeline_stage_duration_seconds",
                "Time each stage of a recommend pipeline took (recall, features, rank), queueing included.",
                LATENCY_BUCKETS,
                &["pipeline", "stage"],
            ),
            model_loads: counter(
                "recserve_model_loads_total",
                "Model version loads, by model and outcome: loaded, or why not (invalid_model, pipeline, \
                 not_in_repository).",
                &["model", "outcome"],
            ),
            model_load_duration: histogram(
                "recserve_model_load_duration_seconds",
                "Time to load a model version and warm it up, whether or not it then served.",
                LOAD_BUCKETS,
                &["model"],
            ),
            model_warmup_duration: histogram(
                "recserve_model_warmup_duration_seconds",
                "Time to warm a loaded model version up (every batch bucket on every executor) before it serves.",
                LOAD_BUCKETS,
                &["model"],
            ),
            versions_draining: gauge(
                "recserve_model_versions_draining",
                "Replaced or unloaded model versions still answering requests admitted before the switch.",
                &["model"],
            ),
            connections_open: gauge(
                "recserve_connections_open",
                "Client connections open, by listener (http, grpc).",
                &["listener"],
            ),
            connections_refused: counter(
                "recserve_connections_refused_total",
                "Connections closed as soon as they were accepted because --max-connections were open, by listener.",
                &["listener"],
            ),
            connections_timed_out: counter(
                "recserve_connections_timed_out_total",
                "Connections the server closed because the client was too slow, by listener and timeout: header \
                 (no complete request head within --header-read-timeout-ms) or idle (--idle-timeout-ms).",
                &["listener", "timeout"],
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
        };
        let collectors: [Box<dyn prometheus::core::Collector>; 52] = [
            Box::new(m.requests.clone()),
            Box::new(m.request_duration.clone()),
            Box::new(m.traces.stages.clone()),
            Box::new(m.request_rows.clone()),
            Box::new(m.gather_duration.clone()),
            Box::new(m.inference_duration.clone()),
            Box::new(m.oov.clone()),
            Box::new(m.rejected.clone()),
            Box::new(m.abandoned.clone()),
            Box::new(m.expired.clone()),
            Box::new(m.model_info.clone()),
            Box::new(m.table_bytes.clone()),
            Box::new(m.gpu_memory.clone()),
            Box::new(build_info()),
            Box::new(m.queue_duration.clone()),
            Box::new(m.batch_rows.clone()),
            Box::new(m.padding_rows.clone()),
            Box::new(m.batches.clone()),
            Box::new(m.queue_depth.clone()),
            Box::new(m.admission_margin.clone()),
            Box::new(m.batch_cost.clone()),
            Box::new(m.execution.clone()),
            Box::new(m.estimate_ratio.clone()),
            Box::new(m.topk_duration.clone()),
            Box::new(m.recall_items_scored.clone()),
            Box::new(m.recall_queries.clone()),
            Box::new(m.index_lists.clone()),
            Box::new(m.index_codes.clone()),
            Box::new(m.index_reranked.clone()),
            Box::new(m.index_capped.clone()),
            Box::new(m.pipeline_stage_duration.clone()),
            Box::new(m.model_loads.clone()),
            Box::new(m.model_load_duration.clone()),
            Box::new(m.model_warmup_duration.clone()),
            Box::new(m.versions_draining.clone()),
            Box::new(m.connections_open.clone()),
            Box::new(m.connections_refused.clone()),
            Box::new(m.connections_timed_out.clone()),
            Box::new(m.cache_lookups.clone()),
            Box::new(m.cache_evictions.clone()),
            Box::new(m.cache_bytes.clone()),
            Box::new(m.tier_fetch_duration.clone()),
            Box::new(m.tier_rows_fetched.clone()),
            Box::new(m.tier_errors.clone()),
            Box::new(m.tier_open_groups.clone()),
            Box::new(m.tier_client_replaced.clone()),
            Box::new(m.unfetched_default.clone()),
            Box::new(m.update_visible.clone()),
            Box::new(m.update_entries.clone()),
            Box::new(m.update_rows.clone()),
            Box::new(m.update_errors.clone()),
            Box::new(m.update_following.clone()),
        ];
        for c in collectors {
            m.registry
                .register(c)
                .expect("each metric is registered once");
        }
        // Read at each scrape, not updated: the server's threads and the machine's steal (`crate::threads`).
        m.registry
            .register(Box::new(crate::threads::ThreadCollector::new()))
            .expect("each metric is registered once");
        m
    }

    /// The text exposition format of every metric.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        String::from_utf8(buf).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }

    /// Counts one answered request and its duration.
    pub fn observe_request(
        &self,
        model: &str,
        endpoint: &str,
        protocol: &str,
        code: u16,
        seconds: f64,
    ) {
        let code = code.to_string();
        self.requests
            .with_label_values(&[model, endpoint, protocol, code.as_str()])
            .inc();
        self.request_duration
            .with_label_values(&[model, endpoint, protocol])
            .observe(seconds);
    }

    /// Where the connection layer hands finished request traces.
    pub fn traces(&self) -> Arc<TraceSink> {
        Arc::clone(&self.traces)
    }

    /// The handles one model's hot path uses, resolved once so no label lookup happens per request.
    pub fn model(&self, model: &str, device: &str) -> ModelMetrics {
        ModelMetrics {
            request_rows: self.request_rows.with_label_values(&[model]),
            gather_duration: self.gather_duration.with_label_values(&[model, device]),
            inference_duration: self.inference_duration.with_label_values(&[model]),
        }
    }

    /// Counts a request refused before queueing, by reason.
    pub fn rejected(&self, model: &str, reason: &str) {
        self.rejected.with_label_values(&[model, reason]).inc();
    }

    /// The batcher's handles for one model.
    pub fn batching(&self, model: &str) -> crate::batching::BatchMetrics {
        let reason = |r: &str| self.batches.with_label_values(&[model, r]);
        // Every refusal reason starts at 0: a counter whose first sample is already above 0 loses that increase
        // in rate(), and the dashboard's refusals panel would not show a model's first burst of refusals.
        for refusal in crate::batching::Refusal::REASONS {
            self.rejected.with_label_values(&[model, refusal]);
        }
        crate::batching::BatchMetrics {
            queue_duration: self.queue_duration.with_label_values(&[model]),
            batch_rows: self.batch_rows.with_label_values(&[model]),
            padding_rows: self.padding_rows.with_label_values(&[model]),
            batches: crate::batching::CloseReason::ALL.map(|r| reason(r.as_str())),
            queue_depth: self.queue_depth.with_label_values(&[model]),
            execution: self.execution.with_label_values(&[model]),
            estimate_ratio: self.estimate_ratio.with_label_values(&[model]),
            expired: self.expired.with_label_values(&[model]),
            abandoned: self.abandoned.with_label_values(&[model]),
            admission_margin: self.admission_margin.with_label_values(&[model]),
            fixed_cost: self.batch_cost.with_label_values(&[model, "fixed"]),
            row_cost: self.batch_cost.with_label_values(&[model, "row"]),
            rejected: self.rejected.clone(),
        }
    }

    pub fn oov_counter(&self, model: &str, table: &str) -> IntCounter {
        self.oov.with_label_values(&[model, table])
    }

    /// `recserve_embedding_unfetched_default_total` of one Redis-tier table.
    pub fn unfetched_default_counter(&self, model: &str, table: &str) -> IntCounter {
        self.unfetched_default.with_label_values(&[model, table])
    }

    /// `recserve_embedding_tier_client_replaced_total`: the shared Redis Cluster connection's replacements.
    pub fn tier_client_replaced(&self) -> IntCounter {
        self.tier_client_replaced.with_label_values::<&str>(&[])
    }

    /// What the Redis tier and its row cache of `model` report into.
    pub fn tier(&self, model: &str) -> crate::embedding::remote::TierMetrics {
        use crate::embedding::remote::redis::FetchFailure;
        use crate::embedding::remote::updates::FollowError;
        crate::embedding::remote::TierMetrics {
            hits: self.cache_lookups.with_label_values(&[model, "hit"]),
            misses: self.cache_lookups.with_label_values(&[model, "miss"]),
            fetch_duration: self.tier_fetch_duration.with_label_values(&[model]),
            rows_fetched: self.tier_rows_fetched.with_label_values(&[model]),
            failures: FetchFailure::ALL
                .map(|f| self.tier_errors.with_label_values(&[model, f.as_str()])),
            open_groups: self.tier_open_groups.with_label_values(&[model]),
            cache: crate::embedding::remote::cache::CacheMetrics {
                evictions: self.cache_evictions.with_label_values(&[model]),
                bytes: self.cache_bytes.with_label_values(&[model]),
            },
            updates: crate::embedding::remote::updates::UpdateMetrics {
                visible: self.update_visible.with_label_values(&[model]),
                entries: self.update_entries.with_label_values(&[model]),
                rows: self.update_rows.with_label_values(&[model]),
                errors: FollowError::ALL
                    .map(|e| self.update_errors.with_label_values(&[model, e.as_str()])),
                following: self.update_following.with_label_values(&[model]),
            },
        }
    }

    pub fn set_model_info(
        &self,
        model: &str,
        version: u64,
        kind: &str,
        precision: &str,
        device: &str,
    ) {
        self.model_info
            .with_label_values(&[model, &version.to_string(), kind, precision, device])
            .set(1);
    }

    /// Drops the `recserve_model_info` series of a version that no longer serves.
    pub fn clear_model_info(
        &self,
        model: &str,
        version: u64,
        kind: &str,
        precision: &str,
        device: &str,
    ) {
        let _ = self.model_info.remove_label_values(&[
            model,
            &version.to_string(),
            kind,
            precision,
            device,
        ]);
    }

    /// Counts a load of a version of `model` and its duration.
    pub fn model_loaded(&self, model: &str, outcome: &str, seconds: f64) {
        self.model_loads.with_label_values(&[model, outcome]).inc();
        self.model_load_duration
            .with_label_values(&[model])
            .observe(seconds);
    }

    /// The warm-up of a loaded version of `model`.
    pub fn observe_warmup(&self, model: &str, seconds: f64) {
        self.model_warmup_duration
            .with_label_values(&[model])
            .observe(seconds);
    }

    /// How many replaced versions of `model` are still answering admitted requests.
    pub fn set_versions_draining(&self, model: &str, versions: usize) {
        self.versions_draining
            .with_label_values(&[model])
            .set(versions as i64);
    }

    pub fn set_table_bytes(
        &self,
        model: &str,
        table: &str,
        storage: &str,
        device: &str,
        bytes: u64,
    ) {
        self.table_bytes
            .with_label_values(&[model, table, storage, device])
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
}

impl Metrics {
    /// Records the device memory of one shard of a GPU-resident table.
    pub fn set_gpu_memory_bytes(
        &self,
        model: &str,
        table: &str,
        shard: usize,
        device: &str,
        bytes: u64,
    ) {
        self.gpu_memory
            .with_label_values(&[model, table, &shard.to_string(), device])
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
}

impl Metrics {
    /// The handles a recall model's executors use.
    pub fn recall(&self, model: &str) -> RecallMetrics {
        RecallMetrics {
            topk_duration: self.topk_duration.with_label_values(&[model]),
            items_scored: self.recall_items_scored.with_label_values(&[model]),
            exact_queries: self.recall_queries.with_label_values(&[model, "exact"]),
            index_queries: self.recall_queries.with_label_values(&[model, "index"]),
            index_lists: self.index_lists.with_label_values(&[model]),
            index_codes: self.index_codes.with_label_values(&[model]),
            index_reranked: self.index_reranked.with_label_values(&[model]),
            index_capped: self.index_capped.with_label_values(&[model]),
        }
    }

    /// The duration histogram of one stage of one pipeline.
    pub fn pipeline_stage(&self, pipeline: &str, stage: &str) -> Histogram {
        self.pipeline_stage_duration
            .with_label_values(&[pipeline, stage])
    }
}

/// The handles of one listener's connections (`listener`: `http` or `grpc`).
impl Metrics {
    pub fn connections(&self, listener: &str) -> ConnectionMetrics {
        ConnectionMetrics {
            open: self.connections_open.with_label_values(&[listener]),
            refused: self.connections_refused.with_label_values(&[listener]),
            header_timeouts: self
                .connections_timed_out
                .with_label_values(&[listener, "header"]),
            idle_timeouts: self
                .connections_timed_out
                .with_label_values(&[listener, "idle"]),
        }
    }
}

/// Metric handles of one listener's connections.
#[derive(Debug, Clone)]
pub struct ConnectionMetrics {
    pub open: IntGauge,
    pub refused: IntCounter,
    pub header_timeouts: IntCounter,
    pub idle_timeouts: IntCounter,
}

/// Metric handles of one recall model.
#[derive(Debug, Clone)]
pub struct RecallMetrics {
    pub topk_duration: Histogram,
    pub items_scored: IntCounter,
    pub exact_queries: IntCounter,
    pub index_queries: IntCounter,
    pub index_lists: IntCounter,
    pub index_codes: IntCounter,
    pub index_reranked: IntCounter,
    pub index_capped: IntCounter,
}

/// Per-model metric handles for the request path.
#[derive(Debug, Clone)]
pub struct ModelMetrics {
    pub request_rows: Histogram,
    pub gather_duration: Histogram,
    pub inference_duration: Histogram,
}

fn build_info() -> IntGauge {
    let gauge = IntGauge::with_opts(
        Opts::new(
            "recserve_build_info",
            "Always 1; the label says which recserve version is running.",
        )
        .const_label("version", env!("CARGO_PKG_VERSION")),
    )
    .expect("metric definitions are static and valid");
    gauge.set(1);
    gauge
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_with_units_in_names() {
        let m = Metrics::new();
        m.observe_request("deepfm", "rank", "http", 200, 0.001);
        m.model("deepfm", "cpu").gather_duration.observe(1e-4);
        m.oov_counter("deepfm", "C1").inc();
        m.set_model_info("deepfm", 3, "deepfm", "int8", "cpu");
        m.set_gpu_memory_bytes("deepfm", "C1", 1, "cuda:0", 4096);
        let text = m.render().expect("render");
        for needle in [
            "recserve_requests_total{code=\"200\",endpoint=\"rank\",model=\"deepfm\",protocol=\"http\"} 1",
            "recserve_request_duration_seconds_bucket{endpoint=\"rank\",model=\"deepfm\",protocol=\"http\",le=\"0.001\"} 1",
            "recserve_gather_duration_seconds_bucket{device=\"cpu\",model=\"deepfm\",le=\"0.0001\"} 1",
            "recserve_embedding_oov_total{model=\"deepfm\",table=\"C1\"} 1",
            "recserve_model_info{device=\"cpu\",kind=\"deepfm\",model=\"deepfm\",precision=\"int8\",version=\"3\"} 1",
            "recserve_gpu_memory_bytes{device=\"cuda:0\",model=\"deepfm\",shard=\"1\",table=\"C1\"} 4096",
            "recserve_build_info{version=",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert!(LATENCY_BUCKETS.first() == Some(&1e-5) && LATENCY_BUCKETS.last() == Some(&10.0));
    }

    #[test]
    fn renders_recall_pipeline_and_connection_families() {
        let m = Metrics::new();
        let recall = m.recall("lightgcn");
        recall.topk_duration.observe(2e-4);
        recall.items_scored.inc_by(41_000);
        m.pipeline_stage("feed", "rank").observe(3e-3);
        let connections = m.connections("grpc");
        connections.open.inc();
        connections.refused.inc();
        connections.header_timeouts.inc();
        let text = m.render().expect("render");
        for needle in [
            "recserve_connections_open{listener=\"grpc\"} 1",
            "recserve_connections_refused_total{listener=\"grpc\"} 1",
            "recserve_connections_timed_out_total{listener=\"grpc\",timeout=\"header\"} 1",
            "recserve_connections_timed_out_total{listener=\"grpc\",timeout=\"idle\"} 0",
            "recserve_topk_duration_seconds_bucket{model=\"lightgcn\",le=\"0.00025\"} 1",
            "recserve_recall_items_scored_total{model=\"lightgcn\"} 41000",
            "recserve_pipeline_stage_duration_seconds_bucket{pipeline=\"feed\",stage=\"rank\",le=\"0.005\"} 1",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }
}
