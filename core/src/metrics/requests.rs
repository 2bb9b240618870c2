//! The request path's families: requests answered and their duration, each stage of answered requests (through
//! the [`TraceSink`], which also keeps the slow-request record), and the per-batch rows, gather and inference of
//! ranking models.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, Registry};

use super::{LATENCY_BUCKETS, Metrics, ROW_BUCKETS, counter, histogram, register};
use crate::trace::slow::SlowRequests;
use crate::trace::{Finished, Stage};

/// The request path's families.
#[derive(Debug, Clone)]
pub(super) struct Requests {
    requests: IntCounterVec,
    request_duration: HistogramVec,
    traces: Arc<TraceSink>,
    request_rows: HistogramVec,
    gather_duration: HistogramVec,
    inference_duration: HistogramVec,
    non_finite_scores: IntCounterVec,
}

impl Requests {
    pub(super) fn new() -> Requests {
        Requests {
            requests: counter(
                "recserve_requests_total",
                "Requests answered, by model (or pipeline, for recommend), the version that answered (the ranking \
                 model's, for recommend; empty when none did), endpoint, protocol and status code.",
                &[
                    "model", "pipeline", "version", "endpoint", "protocol", "code",
                ],
            ),
            request_duration: histogram(
                "recserve_request_duration_seconds",
                "Time from receiving a request to having its response ready, by model (or pipeline, for \
                 recommend), version (as recserve_requests_total), endpoint and protocol.",
                LATENCY_BUCKETS,
                &["model", "pipeline", "version", "endpoint", "protocol"],
            ),
            traces: Arc::new(TraceSink {
                stages: histogram(
                    "recserve_request_stage_seconds",
                    "Time answered requests spent in each stage, from their first byte to their response handed \
                     to the connection (stages in docs/metrics.md), by model (or pipeline, for recommend) and stage.",
                    LATENCY_BUCKETS,
                    &["model", "pipeline", "stage"],
                ),
                by_name: std::sync::Mutex::new([HashMap::new(), HashMap::new()]),
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
            non_finite_scores: counter(
                "recserve_non_finite_scores_total",
                "Scoring calls refused (500) because the model computed a score that is not a finite number: \
                 its tables or dense graph hold NaN or infinity.",
                &["model"],
            ),
        }
    }

    pub(super) fn register(&self, registry: &Registry) {
        register(
            registry,
            vec![
                Box::new(self.requests.clone()),
                Box::new(self.request_duration.clone()),
                Box::new(self.traces.stages.clone()),
                Box::new(self.request_rows.clone()),
                Box::new(self.gather_duration.clone()),
                Box::new(self.inference_duration.clone()),
                Box::new(self.non_finite_scores.clone()),
            ],
        );
    }
}

/// The `model` and `pipeline` labels of a request that named `name` at `endpoint`: a recommend request names a
/// pipeline (`model` empty), every other a model (`pipeline` empty).
fn named<'a>(name: &'a str, endpoint: &str) -> (&'a str, &'a str) {
    if endpoint == "recommend" {
        ("", name)
    } else {
        (name, "")
    }
}

impl Metrics {
    /// Counts one answered request and its duration; `model` is the name the request called (a pipeline's for
    /// recommend), `version` the version that answered it (the ranking model's, for recommend).
    pub fn observe_request(
        &self,
        model: &str,
        version: Option<u64>,
        endpoint: &str,
        protocol: &str,
        code: u16,
        seconds: f64,
    ) {
        let code = code.to_string();
        let (model, pipeline) = named(model, endpoint);
        let version = version.map(|v| v.to_string()).unwrap_or_default();
        self.requests
            .requests
            .with_label_values(&[model, pipeline, &version, endpoint, protocol, code.as_str()])
            .inc();
        self.requests
            .request_duration
            .with_label_values(&[model, pipeline, &version, endpoint, protocol])
            .observe(seconds);
    }

    /// Where the connection layer hands finished request traces.
    pub fn traces(&self) -> Arc<TraceSink> {
        Arc::clone(&self.requests.traces)
    }

    /// The handles one model's hot path uses, resolved once so no label lookup happens per request.
    pub(crate) fn model(&self, model: &str, device: &str) -> ModelMetrics {
        let r = &self.requests;
        ModelMetrics {
            request_rows: r.request_rows.with_label_values(&[model]),
            gather_duration: r.gather_duration.with_label_values(&[model, device]),
            inference_duration: r.inference_duration.with_label_values(&[model]),
            non_finite_scores: r.non_finite_scores.with_label_values(&[model]),
        }
    }
}

/// Per-model metric handles for the request path.
#[derive(Debug, Clone)]
pub struct ModelMetrics {
    pub(crate) request_rows: Histogram,
    pub(crate) gather_duration: Histogram,
    pub(crate) inference_duration: Histogram,
    pub(crate) non_finite_scores: IntCounter,
}

/// Where finished request traces go: the per-stage histograms (answered requests only) and the slow-request
/// record (every request that reached a model).
#[derive(Debug)]
pub struct TraceSink {
    stages: HistogramVec,
    /// Each model's stage histograms (`[0]`) and each pipeline's (`[1]`), by name, resolved once so that a
    /// finished request costs no label lookup per stage.
    by_name: std::sync::Mutex<[HashMap<String, Arc<[Histogram; Stage::ALL.len()]>>; 2]>,
    slow: SlowRequests,
}

impl TraceSink {
    pub fn finish(&self, finished: Finished) {
        if finished.outcome.status == 200 {
            let histograms = self.histograms(&finished.outcome.model, finished.outcome.endpoint);
            for (stage, took) in &finished.stages {
                let i = Stage::ALL.iter().position(|s| s == stage).unwrap_or(0);
                histograms[i].observe(took.as_secs_f64());
            }
        }
        self.slow.offer(finished);
    }

    fn histograms(&self, name: &str, endpoint: &str) -> Arc<[Histogram; Stage::ALL.len()]> {
        let (model, pipeline) = named(name, endpoint);
        let mut by_name = self
            .by_name
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let by_name = &mut by_name[usize::from(!pipeline.is_empty())];
        if let Some(found) = by_name.get(name) {
            return Arc::clone(found);
        }
        let made: Arc<[Histogram; Stage::ALL.len()]> = Arc::new(Stage::ALL.map(|stage| {
            self.stages
                .with_label_values(&[model, pipeline, stage.as_str()])
        }));
        by_name.insert(name.to_owned(), Arc::clone(&made));
        made
    }

    pub fn slow(&self) -> &SlowRequests {
        &self.slow
    }
}
