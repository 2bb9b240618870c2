//! Prometheus metrics: every metric is described once, with its unit in its name, in the file of the subsystem
//! that reports it. Label values are bounded: model and table names come from the repository, endpoints and
//! protocols from the code.
//!
//! Each file holds one group of families: the struct that owns them, the function that creates them, the one that
//! registers them, and the `Metrics` methods that hand their per-model handles out. [`Metrics::new`] composes the
//! groups into one registry, so `/metrics` renders every family (sorted by name, whatever the registration order).
//!
//! The full list, with what each is for, is in `docs/metrics.md`.

mod batching;
mod connections;
mod embedding;
mod models;
mod pipeline;
mod recall;
mod requests;
mod server;

use prometheus::core::Collector;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

pub use connections::ConnectionMetrics;
pub(crate) use recall::RecallMetrics;
pub use requests::{ModelMetrics, TraceSink};

/// Latency buckets from 10 µs to 10 s, three per decade.
pub(crate) const LATENCY_BUCKETS: &[f64] = &[
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// Row-count buckets: powers of two up to 8192.
pub(crate) const ROW_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
];

/// Ratio buckets for actual ÷ estimated execution time.
pub(crate) const RATIO_BUCKETS: &[f64] =
    &[0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0];

/// Buckets for loading a model: 10 ms to 20 minutes.
pub(crate) const LOAD_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0,
];

/// The `model` label of requests for a model that is not served: bounded, unlike the name in the URL.
pub const UNKNOWN_MODEL: &str = "";

/// Every metric the server exports, one field per group of families.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    requests: requests::Requests,
    batching: batching::Batching,
    embedding: embedding::Embedding,
    models: models::Models,
    recall: recall::Recall,
    pipeline: pipeline::Pipeline,
    connections: connections::Connections,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Creates every group's families and registers them in one registry.
    pub fn new() -> Metrics {
        let m = Metrics {
            registry: Registry::new(),
            requests: requests::Requests::new(),
            batching: batching::Batching::new(),
            embedding: embedding::Embedding::new(),
            models: models::Models::new(),
            recall: recall::Recall::new(),
            pipeline: pipeline::Pipeline::new(),
            connections: connections::Connections::new(),
        };
        m.requests.register(&m.registry);
        m.batching.register(&m.registry);
        m.embedding.register(&m.registry);
        m.models.register(&m.registry);
        m.recall.register(&m.registry);
        m.pipeline.register(&m.registry);
        m.connections.register(&m.registry);
        server::register(&m.registry);
        m
    }

    /// The text exposition format of every metric.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        String::from_utf8(buf).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

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

/// Registers each of a group's families; a name registered twice is a mistake in the groups' definitions.
fn register(registry: &Registry, collectors: Vec<Box<dyn Collector>>) {
    for c in collectors {
        registry
            .register(c)
            .expect("each metric is registered once");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_with_units_in_names() {
        let m = Metrics::new();
        m.observe_request("deepfm", Some(1), "rank", "http", 200, 0.001);
        m.model("deepfm", "cpu").gather_duration.observe(1e-4);
        m.oov_counter("deepfm", "C1").inc();
        m.set_model_info("deepfm", 3, "deepfm", "int8", "cpu");
        m.set_gpu_memory_bytes("deepfm", "C1", 1, "cuda:0", 4096);
        m.shadow_request("deepfm", 4, "scored");
        let text = m.render().expect("render");
        for needle in [
            "recserve_requests_total{code=\"200\",endpoint=\"rank\",model=\"deepfm\",pipeline=\"\",protocol=\"http\",version=\"1\"} 1",
            "recserve_request_duration_seconds_bucket{endpoint=\"rank\",model=\"deepfm\",pipeline=\"\",protocol=\"http\",version=\"1\",le=\"0.001\"} 1",
            "recserve_shadow_requests_total{model=\"deepfm\",outcome=\"scored\",version=\"4\"} 1",
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
        connections.handshake_timeouts.inc();
        connections.handshake_failures.inc();
        connections.auth_wrong.inc();
        m.tls_reloaded(false);
        let text = m.render().expect("render");
        for needle in [
            "recserve_connections_timed_out_total{listener=\"grpc\",timeout=\"tls_handshake\"} 1",
            "recserve_tls_handshake_failures_total{listener=\"grpc\"} 1",
            "recserve_tls_reloads_total{result=\"failed\"} 1",
            "recserve_auth_refused_total{listener=\"grpc\",reason=\"wrong\"} 1",
            "recserve_auth_refused_total{listener=\"grpc\",reason=\"missing\"} 0",
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
