//! The model registry's families: which versions serve, their loads and warm-ups, and the replaced versions still
//! draining.

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec, Registry};

use super::{LOAD_BUCKETS, Metrics, counter, gauge, histogram, register};

/// The model registry's families.
#[derive(Debug, Clone)]
pub(super) struct Models {
    model_info: IntGaugeVec,
    model_loads: IntCounterVec,
    model_load_duration: HistogramVec,
    model_warmup_duration: HistogramVec,
    versions_draining: IntGaugeVec,
    shadow_requests: IntCounterVec,
}

impl Models {
    pub(super) fn new() -> Models {
        Models {
            model_info: gauge(
                "recserve_model_info",
                "Always 1 for each served model; the labels say which version, kind, precision and device.",
                &["model", "version", "kind", "precision", "device"],
            ),
            model_loads: counter(
                "recserve_model_loads_total",
                "Model version loads, at start and while serving, by model and outcome: loaded, or why not \
                 (invalid_model: the loader refused a file; refused: a pipeline would no longer run on it).",
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
            shadow_requests: counter(
                "recserve_shadow_requests_total",
                "Copies of requests sent to a model's shadow version (answers thrown away), by model, shadow version \
                 and outcome: scored, refused (its queue or deadline), unfit (the request does not fit its \
                 contract), failed.",
                &["model", "version", "outcome"],
            ),
        }
    }

    pub(super) fn register(&self, registry: &Registry) {
        register(
            registry,
            vec![
                Box::new(self.model_info.clone()),
                Box::new(self.model_loads.clone()),
                Box::new(self.model_load_duration.clone()),
                Box::new(self.model_warmup_duration.clone()),
                Box::new(self.versions_draining.clone()),
                Box::new(self.shadow_requests.clone()),
            ],
        );
    }
}

impl Metrics {
    /// Counts one copy of a request sent to `model`'s shadow `version`, by how it ended.
    pub fn shadow_request(&self, model: &str, version: u64, outcome: &str) {
        self.models
            .shadow_requests
            .with_label_values(&[model, &version.to_string(), outcome])
            .inc();
    }

    pub(crate) fn set_model_info(
        &self,
        model: &str,
        version: u64,
        kind: &str,
        precision: &str,
        device: &str,
    ) {
        self.models
            .model_info
            .with_label_values(&[model, &version.to_string(), kind, precision, device])
            .set(1);
    }

    /// Drops the `recserve_model_info` series of a version that no longer serves.
    pub(crate) fn clear_model_info(
        &self,
        model: &str,
        version: u64,
        kind: &str,
        precision: &str,
        device: &str,
    ) {
        let _ = self.models.model_info.remove_label_values(&[
            model,
            &version.to_string(),
            kind,
            precision,
            device,
        ]);
    }

    /// Counts a load of a version of `model` and its duration.
    pub(crate) fn model_loaded(&self, model: &str, outcome: &str, seconds: f64) {
        self.models
            .model_loads
            .with_label_values(&[model, outcome])
            .inc();
        self.models
            .model_load_duration
            .with_label_values(&[model])
            .observe(seconds);
    }

    /// The warm-up of a loaded version of `model`.
    pub(crate) fn observe_warmup(&self, model: &str, seconds: f64) {
        self.models
            .model_warmup_duration
            .with_label_values(&[model])
            .observe(seconds);
    }

    /// How many replaced versions of `model` are still answering admitted requests.
    pub(crate) fn set_versions_draining(&self, model: &str, versions: usize) {
        self.models
            .versions_draining
            .with_label_values(&[model])
            .set(versions as i64);
    }
}
