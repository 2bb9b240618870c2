//! The report of one run: its JSON form (schema `recload.run/v1`, documented in docs/recload.md) and the text
//! printed at the end of a run.

use std::collections::BTreeMap;
use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::engine::{Mode, RunOptions, RunStats};
use crate::stats::{LatencySummary, Ms};
use crate::target::TargetInfo;
use crate::workload::WorkloadInfo;

pub const RUN_SCHEMA: &str = "recload.run/v1";

/// The current time as RFC 3339, to the second, UTC.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// Requests of the measurement window, by outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCounts {
    /// Scheduled (open loop) or started (closed loop) in the window.
    pub scheduled: u64,
    /// Of those, sent (the others timed out waiting for a free connection).
    pub sent: u64,
    pub ok: u64,
    pub errors: u64,
}

/// One run, as `recload run --json` writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub schema: String,
    pub recload_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub started_at: String,
    pub target: TargetInfo,
    pub workload: WorkloadInfo,
    pub mode: Mode,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub timeout_s: f64,
    /// Requests per second scheduled in the window; `null` in closed loop.
    pub offered_rps: Option<f64>,
    /// Successful answers per second received in the window.
    pub achieved_rps: f64,
    pub requests: RequestCounts,
    /// Failed requests of the window by kind: `http_<status>`, `timeout`, `connect`, `connection`.
    pub errors: BTreeMap<String, u64>,
    /// Failed requests of the window that were sent and answered (`http_<status>`, `connection`), by kind:
    /// answer time minus send time, i.e. how fast the server failed them.
    #[serde(default)]
    pub error_response_ms: BTreeMap<String, LatencySummary>,
    /// Successful requests of the window: answer time minus scheduled send time (open loop) or minus send time
    /// (closed loop). `null` when none succeeded.
    pub latency_ms: Option<LatencySummary>,
    /// Send time minus scheduled time of the window's sent requests.
    pub send_delay_ms: Option<LatencySummary>,
    pub peak_in_flight: u64,
    pub wall_s: f64,
    /// recload's own CPU time over `wall_s` (user + system, all its threads), in seconds; `null` where the OS
    /// would not say (and in reports older than the field).
    #[serde(default)]
    pub cpu_s: Option<f64>,
    /// Seconds spent, before the run, waiting for the server to answer promptly again (`--settle-*`), and
    /// whether it did (`false`: the run started after `--settle-timeout` anyway).
    #[serde(default)]
    pub settle_s: f64,
    #[serde(default = "settled_default")]
    pub settled: bool,
    /// How long opening connections took (TCP, and the TLS handshake of an `https://` target); `null` in reports
    /// older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<ConnectionReport>,
    /// Every answer checked against saved scores (`--check-scores`), warm-up included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_check: Option<crate::check::AnswerCounts>,
}

/// Connection set-up of a run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConnectionReport {
    /// The connections opened before the clock started: their set-up is in no request's latency.
    pub before_run: Option<LatencySummary>,
    /// Connections opened again during the run (warm-up included), because the server had closed one or a request
    /// timed out on it: each one's set-up is in the latency of the request that needed it.
    pub during_run: Option<LatencySummary>,
}

fn settled_default() -> bool {
    true
}

impl RunReport {
    pub fn new(
        label: Option<String>,
        started_at: String,
        target: TargetInfo,
        workload: WorkloadInfo,
        options: &RunOptions,
        stats: &RunStats,
    ) -> RunReport {
        let r = &stats.recorder;
        RunReport {
            schema: RUN_SCHEMA.to_owned(),
            recload_version: env!("CARGO_PKG_VERSION").to_owned(),
            label,
            started_at,
            target,
            workload,
            mode: options.mode,
            warmup_s: options.warmup.as_secs_f64(),
            duration_s: options.duration.as_secs_f64(),
            timeout_s: options.timeout.as_secs_f64(),
            offered_rps: stats.offered_rps,
            achieved_rps: stats.achieved_rps,
            requests: RequestCounts {
                scheduled: r.scheduled,
                sent: r.sent,
                ok: r.ok,
                errors: r.error_count(),
            },
            errors: r.errors_by_label(),
            error_response_ms: r.error_response_by_label(),
            latency_ms: r.latency.summary(),
            send_delay_ms: r.send_delay.summary(),
            peak_in_flight: stats.peak_in_flight,
            wall_s: stats.wall.as_secs_f64(),
            cpu_s: stats.cpu.map(|c| c.as_secs_f64()),
            settle_s: stats.settle_wait.as_secs_f64(),
            settled: stats.settled,
            connections: Some(ConnectionReport {
                before_run: stats.setup.before.summary(),
                during_run: stats.setup.during.summary(),
            }),
            score_check: None,
        }
    }

    /// Failed requests over requests of the window (0 when there were none).
    pub fn error_ratio(&self) -> f64 {
        if self.requests.scheduled == 0 {
            0.0
        } else {
            self.requests.errors as f64 / self.requests.scheduled as f64
        }
    }

    /// recload's CPU over the run as a share of one core (1.0 = a full core): a generator near its limit
    /// measures itself, not the server.
    pub fn cpu_share(&self) -> Option<f64> {
        self.cpu_s
            .filter(|_| self.wall_s > 0.0)
            .map(|c| c / self.wall_s)
    }

    /// p99 latency in milliseconds, when any request succeeded.
    pub fn p99_ms(&self) -> Option<f64> {
        self.latency_ms.map(|l| l.p99_ms)
    }
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = &self.workload;
        let what = match (w.candidates, w.k) {
            (Some(c), _) if w.body == Some(crate::workload::BodyForm::Columnar) => {
                format!("{c} candidates (columnar body)")
            }
            (Some(c), _) => format!("{c} candidates"),
            (None, Some(k)) => format!("k = {k}"),
            (None, None) => String::new(),
        };
        writeln!(
            f,
            "{} {} ({}) · {} {} · {what} · ids {}",
            self.label.as_deref().unwrap_or("target"),
            self.target.url,
            self.target.protocol,
            w.kind,
            w.path,
            w.ids
        )?;
        match self.mode {
            Mode::Open {
                rate,
                arrivals,
                connections,
            } => writeln!(
                f,
                "open loop: {arrivals:?} arrivals at {rate}/s on {connections} connections · warm-up {} s · measured {} s",
                self.warmup_s, self.duration_s
            )?,
            Mode::Closed { concurrency } => writeln!(
                f,
                "closed loop: {concurrency} workers, each sending when answered · warm-up {} s · measured {} s",
                self.warmup_s, self.duration_s
            )?,
        }
        match self.offered_rps {
            Some(offered) => writeln!(
                f,
                "  rate        offered {offered:.1}/s · achieved {:.1}/s",
                self.achieved_rps
            )?,
            None => writeln!(f, "  rate        achieved {:.1}/s", self.achieved_rps)?,
        }
        let c = &self.requests;
        write!(
            f,
            "  requests    {} scheduled · {} sent · {} ok · {} failed",
            c.scheduled, c.sent, c.ok, c.errors
        )?;
        if !self.errors.is_empty() {
            let kinds: Vec<String> = self
                .errors
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            write!(f, " ({})", kinds.join(", "))?;
        }
        writeln!(f)?;
        for (kind, l) in &self.error_response_ms {
            writeln!(f, "  {kind:<11} answered {l} (from the send time)")?;
        }
        let since = match self.mode {
            Mode::Open { .. } => "from the scheduled send time",
            Mode::Closed { .. } => "from the send time",
        };
        match &self.latency_ms {
            Some(l) => writeln!(f, "  latency     {l} ({since})")?,
            None => writeln!(f, "  latency     no successful request")?,
        }
        if !self.settled {
            writeln!(
                f,
                "  warning     the server was still slow after {:.0} s of waiting for it to settle before this run",
                self.settle_s
            )?;
        }
        if let Some(c) = &self.score_check {
            let matched: Vec<String> = c.matched.iter().map(u64::to_string).collect();
            writeln!(
                f,
                "  scores      {} answers, {} candidates checked (warm-up included): matched file by file {} \
                 (largest difference {:.1e}) · {} matched none, in {} answers · {} unreadable",
                c.answers,
                c.candidates,
                matched.join(" / "),
                c.worst_match,
                c.mismatched,
                c.answers_mismatched,
                c.unreadable
            )?;
            if let Some(first) = &c.first_mismatch {
                writeln!(f, "  first       {first}")?;
            }
        }
        if let Some(share) = self.cpu_share() {
            writeln!(
                f,
                "  recload CPU {:.0}% of one core over the run's {:.1} s (user + system, warm-up included)",
                100.0 * share,
                self.wall_s
            )?;
        }
        if let Some(c) = &self.connections {
            let tls = if self.target.url.starts_with("https://") {
                " with the TLS handshake"
            } else {
                ""
            };
            if let Some(b) = &c.before_run {
                write!(
                    f,
                    "  connect     {} opened before the clock{tls}: p50 {} · max {}",
                    b.count,
                    Ms(b.p50_ms),
                    Ms(b.max_ms)
                )?;
            }
            match &c.during_run {
                None => writeln!(f, " · none reopened during the run")?,
                Some(d) => writeln!(
                    f,
                    " · {} reopened during the run (in those requests' latency): p50 {} · max {}",
                    d.count,
                    Ms(d.p50_ms),
                    Ms(d.max_ms)
                )?,
            }
        }
        if let (Mode::Open { .. }, Some(d)) = (self.mode, &self.send_delay_ms) {
            writeln!(
                f,
                "  send delay  p50 {} · p99 {} · max {} (waiting for the generator or a free connection)",
                Ms(d.p50_ms),
                Ms(d.p99_ms),
                Ms(d.max_ms)
            )?;
        }
        Ok(())
    }
}
