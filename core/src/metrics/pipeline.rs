//! The recommend pipelines' family: how long each stage (recall, features, rank) took.

use prometheus::{Histogram, HistogramVec, Registry};

use super::{LATENCY_BUCKETS, Metrics, histogram, register};

/// The recommend pipelines' family.
#[derive(Debug, Clone)]
pub(super) struct Pipeline {
    stage_duration: HistogramVec,
}

impl Pipeline {
    pub(super) fn new() -> Pipeline {
        Pipeline {
            stage_duration: histogram(
                "recserve_pipeline_stage_duration_seconds",
                "Time each stage of a recommend pipeline took (recall, features, rank), queueing included.",
                LATENCY_BUCKETS,
                &["pipeline", "stage"],
            ),
        }
    }

    pub(super) fn register(&self, registry: &Registry) {
        register(registry, vec![Box::new(self.stage_duration.clone())]);
    }
}

impl Metrics {
    /// The duration histogram of one stage of one pipeline.
    pub(crate) fn pipeline_stage(&self, pipeline: &str, stage: &str) -> Histogram {
        self.pipeline
            .stage_duration
            .with_label_values(&[pipeline, stage])
    }
}
