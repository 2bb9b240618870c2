//! The batcher's families: its queue, the batches it closes and executes, how well it predicts their time, and
//! the requests it refuses, drops as expired or drops as abandoned.

use prometheus::{GaugeVec, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::{
    LATENCY_BUCKETS, Metrics, RATIO_BUCKETS, ROW_BUCKETS, counter, gauge, histogram, register,
};

/// The batcher's families.
#[derive(Debug, Clone)]
pub(super) struct Batching {
    rejected: IntCounterVec,
    abandoned: IntCounterVec,
    expired: IntCounterVec,
    queue_duration: HistogramVec,
    batch_rows: HistogramVec,
    padding_rows: IntCounterVec,
    batches: IntCounterVec,
    queue_depth: IntGaugeVec,
    admission_margin: GaugeVec,
    batch_cost: GaugeVec,
    execution: HistogramVec,
    estimate_ratio: HistogramVec,
}

impl Batching {
    pub(super) fn new() -> Batching {
        Batching {
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
                "Requests (or chunks of large ones) waiting in the batcher's queue, by model and version.",
                &["model", "version"],
            ),
            admission_margin: GaugeVec::new(
                Opts::new(
                    "recserve_admission_margin_seconds",
                    "Margin admission adds to each predicted wait: the 99th percentile of how much later than \
                     predicted recent requests were answered; by model and version.",
                ),
                &["model", "version"],
            )
            .expect("metric definitions are static and valid"),
            batch_cost: GaugeVec::new(
                Opts::new(
                    "recserve_batch_cost_seconds",
                    "The line through the measured batch times against their rows that batching decides by: \
                     part=\"fixed\" its intercept (what running two batches as one saves), part=\"row\" its slope \
                     (what one more row adds); by model and version.",
                ),
                &["model", "version", "part"],
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
        }
    }

    pub(super) fn register(&self, registry: &Registry) {
        register(
            registry,
            vec![
                Box::new(self.rejected.clone()),
                Box::new(self.abandoned.clone()),
                Box::new(self.expired.clone()),
                Box::new(self.queue_duration.clone()),
                Box::new(self.batch_rows.clone()),
                Box::new(self.padding_rows.clone()),
                Box::new(self.batches.clone()),
                Box::new(self.queue_depth.clone()),
                Box::new(self.admission_margin.clone()),
                Box::new(self.batch_cost.clone()),
                Box::new(self.execution.clone()),
                Box::new(self.estimate_ratio.clone()),
            ],
        );
    }
}

impl Metrics {
    /// The batcher's handles for one version of a model: its gauges are per version (several versions may serve
    /// at once), its counters and histograms per model (summed over its versions).
    pub(crate) fn batching(&self, model: &str, version: u64) -> crate::batching::BatchMetrics {
        let version = version.to_string();
        let version = version.as_str();
        let b = &self.batching;
        let reason = |r: &str| b.batches.with_label_values(&[model, r]);
        // Every refusal reason starts at 0: a counter whose first sample is already above 0 loses that increase
        // in rate(), and the dashboard's refusals panel would not show a model's first burst of refusals.
        for refusal in crate::batching::Refusal::REASONS {
            b.rejected.with_label_values(&[model, refusal]);
        }
        crate::batching::BatchMetrics {
            queue_duration: b.queue_duration.with_label_values(&[model]),
            batch_rows: b.batch_rows.with_label_values(&[model]),
            padding_rows: b.padding_rows.with_label_values(&[model]),
            batches: crate::batching::CloseReason::ALL.map(|r| reason(r.as_str())),
            queue_depth: b.queue_depth.with_label_values(&[model, version]),
            execution: b.execution.with_label_values(&[model]),
            estimate_ratio: b.estimate_ratio.with_label_values(&[model]),
            expired: b.expired.with_label_values(&[model]),
            abandoned: b.abandoned.with_label_values(&[model]),
            admission_margin: b.admission_margin.with_label_values(&[model, version]),
            fixed_cost: b.batch_cost.with_label_values(&[model, version, "fixed"]),
            row_cost: b.batch_cost.with_label_values(&[model, version, "row"]),
            rejected: b.rejected.clone(),
        }
    }

    /// Drops the per-version batcher gauges of a version that no longer serves.
    pub(crate) fn clear_batching(&self, model: &str, version: u64) {
        let b = &self.batching;
        let version = version.to_string();
        let _ = b.queue_depth.remove_label_values(&[model, &version]);
        let _ = b.admission_margin.remove_label_values(&[model, &version]);
        for part in ["fixed", "row"] {
            let _ = b.batch_cost.remove_label_values(&[model, &version, part]);
        }
    }
}
