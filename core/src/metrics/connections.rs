//! The listeners' families: connections open, refused at the connection limit, and closed for a slow client.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{Metrics, counter, gauge, register};

/// The listeners' families.
#[derive(Debug, Clone)]
pub(super) struct Connections {
    open: IntGaugeVec,
    refused: IntCounterVec,
    timed_out: IntCounterVec,
}

impl Connections {
    pub(super) fn new() -> Connections {
        Connections {
            open: gauge(
                "recserve_connections_open",
                "Client connections open, by listener (http, grpc).",
                &["listener"],
            ),
            refused: counter(
                "recserve_connections_refused_total",
                "Connections closed as soon as they were accepted because --max-connections were open, by listener.",
                &["listener"],
            ),
            timed_out: counter(
                "recserve_connections_timed_out_total",
                "Connections the server closed because the client was too slow, by listener and timeout: header \
                 (no complete request head within --header-read-timeout-ms), idle (--idle-timeout-ms) or write \
                 (its responses unread for --write-timeout-ms, or for 1 s while more than 64 MiB of them are).",
                &["listener", "timeout"],
            ),
        }
    }

    pub(super) fn register(&self, registry: &Registry) {
        register(
            registry,
            vec![
                Box::new(self.open.clone()),
                Box::new(self.refused.clone()),
                Box::new(self.timed_out.clone()),
            ],
        );
    }
}

impl Metrics {
    /// The handles of one listener's connections (`listener`: `http` or `grpc`).
    pub fn connections(&self, listener: &str) -> ConnectionMetrics {
        let c = &self.connections;
        ConnectionMetrics {
            open: c.open.with_label_values(&[listener]),
            refused: c.refused.with_label_values(&[listener]),
            header_timeouts: c.timed_out.with_label_values(&[listener, "header"]),
            idle_timeouts: c.timed_out.with_label_values(&[listener, "idle"]),
            write_timeouts: c.timed_out.with_label_values(&[listener, "write"]),
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
    pub write_timeouts: IntCounter,
}
