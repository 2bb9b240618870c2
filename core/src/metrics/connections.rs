//! The listeners' families: connections open, refused at the connection limit, closed for a slow client or a failed
//! TLS handshake; certificate reloads; inference calls refused for their bearer token.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{Metrics, counter, gauge, register};

/// The listeners' families.
#[derive(Debug, Clone)]
pub(super) struct Connections {
    open: IntGaugeVec,
    refused: IntCounterVec,
    timed_out: IntCounterVec,
    handshake_failures: IntCounterVec,
    tls_reloads: IntCounterVec,
    auth_refused: IntCounterVec,
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
                 (its responses unread for --write-timeout-ms, or for 1 s while more than 64 MiB of them are) or \
                 tls_handshake (no TLS handshake within --header-read-timeout-ms).",
                &["listener", "timeout"],
            ),
            handshake_failures: counter(
                "recserve_tls_handshake_failures_total",
                "TLS handshakes that failed (no common protocol, a client certificate missing or not issued by \
                 --tls-client-ca, not TLS at all), by listener; timeouts are in recserve_connections_timed_out_total.",
                &["listener"],
            ),
            tls_reloads: counter(
                "recserve_tls_reloads_total",
                "Rereadings of --tls-cert, --tls-key and --tls-client-ca on SIGHUP, by result (ok, or failed: the \
                 previous certificate stays in use and the log says why).",
                &["result"],
            ),
            auth_refused: counter(
                "recserve_auth_refused_total",
                "Inference calls refused for their bearer token (--inference-tokens-file), by listener and reason: \
                 missing (401 / UNAUTHENTICATED) or wrong (403 / PERMISSION_DENIED).",
                &["listener", "reason"],
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
                Box::new(self.handshake_failures.clone()),
                Box::new(self.tls_reloads.clone()),
                Box::new(self.auth_refused.clone()),
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
            handshake_timeouts: c.timed_out.with_label_values(&[listener, "tls_handshake"]),
            handshake_failures: c.handshake_failures.with_label_values(&[listener]),
            auth_missing: c.auth_refused.with_label_values(&[listener, "missing"]),
            auth_wrong: c.auth_refused.with_label_values(&[listener, "wrong"]),
        }
    }

    /// Counts a rereading of the TLS files on SIGHUP.
    pub fn tls_reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.connections
            .tls_reloads
            .with_label_values(&[result])
            .inc();
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
    pub handshake_timeouts: IntCounter,
    pub handshake_failures: IntCounter,
    /// Inference calls refused without a bearer token.
    pub auth_missing: IntCounter,
    /// Inference calls refused with a token not in --inference-tokens-file.
    pub auth_wrong: IntCounter,
}
