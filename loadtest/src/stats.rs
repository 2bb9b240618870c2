//! What a run records: latencies in an HdrHistogram (nanoseconds, three significant digits), how late each
//! request left compared with its scheduled time, outcomes by kind, and the summaries the reports print.
//! Recording is cheap (a histogram increment under an uncontended lock) so it can sit in the worker loop.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Largest latency the histograms hold exactly; longer ones are recorded as this value (an hour).
const HIGHEST_NS: u64 = 3_600 * 1_000_000_000;

/// Why a request did not get a successful answer. Bounded: one label per kind (HTTP statuses by code).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorKind {
    /// The server answered with a status other than 2xx.
    Status(u16),
    /// No complete answer within `--timeout` of the request's scheduled time (sent late, or answered late).
    Timeout,
    /// A connection could not be opened.
    Connect,
    /// The connection broke while the request was in flight (reset, closed early, malformed response).
    Connection,
    /// The server answered a gRPC call with this status code (`tonic::Code` as its number), other than OK.
    Grpc(i32),
    /// The server answered with success, but not with what was asked (e.g. not one score per candidate).
    WrongAnswer,
}

impl ErrorKind {
    /// The key under `errors` in the JSON report: `http_503`, `timeout`, `connect`, `connection`,
    /// `grpc_resource_exhausted` (the gRPC code's name in snake case), `wrong_answer`.
    pub fn label(self) -> String {
        match self {
            ErrorKind::Grpc(code) => format!(
                "grpc_{}",
                snake_case(&format!("{:?}", tonic::Code::from_i32(code)))
            ),
            ErrorKind::WrongAnswer => "wrong_answer".to_owned(),
            ErrorKind::Status(code) => format!("http_{code}"),
            ErrorKind::Timeout => "timeout".to_owned(),
            ErrorKind::Connect => "connect".to_owned(),
            ErrorKind::Connection => "connection".to_owned(),
        }
    }
}

/// `ResourceExhausted` as `resource_exhausted`.
fn snake_case(name: &str) -> String {
    let mut snake = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            snake.push('_');
        }
        snake.push(c.to_ascii_lowercase());
    }
    snake
}

/// A histogram of durations in nanoseconds.
#[derive(Clone, Debug)]
pub struct Durations(Histogram<u64>);

impl Default for Durations {
    fn default() -> Self {
        Durations::new()
    }
}

impl Durations {
    pub fn new() -> Durations {
        Durations(
            Histogram::new_with_bounds(1, HIGHEST_NS, 3)
                .expect("constant bounds and precision are valid"),
        )
    }

    pub fn record(&mut self, value: Duration) {
        let ns = u64::try_from(value.as_nanos()).unwrap_or(u64::MAX);
        self.0.saturating_record(ns.clamp(1, HIGHEST_NS));
    }

    pub fn add(&mut self, other: &Durations) {
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    pub fn count(&self) -> u64 {
        self.0.len()
    }

    pub fn clear(&mut self) {
        self.0.reset();
    }

    /// The duration at quantile `q` (0..=1).
    pub fn quantile(&self, q: f64) -> Duration {
        Duration::from_nanos(self.0.value_at_quantile(q))
    }

    /// Percentiles in milliseconds, or `None` when nothing was recorded.
    pub fn summary(&self) -> Option<LatencySummary> {
        if self.0.is_empty() {
            return None;
        }
        let ms = |ns: u64| ns as f64 / 1e6;
        Some(LatencySummary {
            count: self.0.len(),
            min_ms: ms(self.0.min()),
            mean_ms: self.0.mean() / 1e6,
            p50_ms: ms(self.0.value_at_quantile(0.50)),
            p90_ms: ms(self.0.value_at_quantile(0.90)),
            p99_ms: ms(self.0.value_at_quantile(0.99)),
            p999_ms: ms(self.0.value_at_quantile(0.999)),
            max_ms: ms(self.0.max()),
        })
    }
}

/// Percentiles of a set of durations, in milliseconds (HdrHistogram values: within 0.1% of the exact ones).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub min_ms: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl fmt::Display for LatencySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "p50 {} · p90 {} · p99 {} · p99.9 {} · max {}",
            Ms(self.p50_ms),
            Ms(self.p90_ms),
            Ms(self.p99_ms),
            Ms(self.p999_ms),
            Ms(self.max_ms)
        )
    }
}

/// Milliseconds with a precision that suits their size (`0.183 ms`, `12.4 ms`, `1204 ms`).
#[derive(Clone, Copy, Debug)]
pub struct Ms(pub f64);

impl fmt::Display for Ms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if v < 1.0 {
            write!(f, "{v:.3} ms")
        } else if v < 100.0 {
            write!(f, "{v:.2} ms")
        } else {
            write!(f, "{v:.0} ms")
        }
    }
}

/// Everything recorded about the requests of the measurement window.
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    /// Successful requests: answer time minus scheduled time (open loop) or send time (closed loop).
    pub latency: Durations,
    /// Send time minus scheduled time, for every request sent (open loop: the generator's own lateness plus
    /// waiting for a free connection; always zero in closed loop).
    pub send_delay: Durations,
    /// Requests scheduled in the window.
    pub scheduled: u64,
    /// Of those, requests actually sent (the others timed out before a connection was free).
    pub sent: u64,
    pub ok: u64,
    pub errors: BTreeMap<ErrorKind, u64>,
    /// Failed requests that were sent and answered (`http_<status>`, broken connections), by kind: answer time
    /// minus send time, how fast the server failed them (the send delay excluded).
    pub error_response: BTreeMap<ErrorKind, Durations>,
    /// Successful answers that arrived inside the window, whenever they were scheduled: the achieved rate's
    /// numerator.
    pub ok_in_window: u64,
}

impl Recorder {
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    pub fn errors_by_label(&self) -> BTreeMap<String, u64> {
        self.errors.iter().map(|(k, n)| (k.label(), *n)).collect()
    }

    pub fn error_response_by_label(&self) -> BTreeMap<String, LatencySummary> {
        self.error_response
            .iter()
            .filter_map(|(k, d)| Some((k.label(), d.summary()?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_are_in_milliseconds_and_within_a_tenth_of_a_percent() {
        let mut d = Durations::new();
        for us in 1..=1000u64 {
            d.record(Duration::from_micros(us));
        }
        let s = d.summary().expect("recorded");
        assert_eq!(s.count, 1000);
        for (got, want) in [
            (s.p50_ms, 0.5),
            (s.p90_ms, 0.9),
            (s.p99_ms, 0.99),
            (s.p999_ms, 0.999),
            (s.max_ms, 1.0),
            (s.min_ms, 0.001),
        ] {
            assert!(
                (got - want).abs() <= want * 1e-3,
                "{got} is not within 0.1% of {want}"
            );
        }
        assert!(Durations::new().summary().is_none());
    }

    #[test]
    fn out_of_range_values_saturate_instead_of_failing() {
        let mut d = Durations::new();
        d.record(Duration::ZERO);
        d.record(Duration::from_secs(10_000));
        let s = d.summary().expect("recorded");
        assert_eq!(s.count, 2);
        assert!(s.max_ms >= 3_600_000.0 * 0.999, "{s:?}");
    }

    #[test]
    fn error_labels_are_bounded_and_readable() {
        let mut r = Recorder::default();
        *r.errors.entry(ErrorKind::Status(503)).or_default() += 2;
        *r.errors.entry(ErrorKind::Timeout).or_default() += 1;
        *r.errors.entry(ErrorKind::Connect).or_default() += 1;
        assert_eq!(r.error_count(), 4);
        let labels: Vec<(String, u64)> = r.errors_by_label().into_iter().collect();
        assert_eq!(
            labels,
            vec![
                ("connect".to_owned(), 1),
                ("http_503".to_owned(), 2),
                ("timeout".to_owned(), 1)
            ]
        );
        let grpc = |code: tonic::Code| ErrorKind::Grpc(code as i32).label();
        assert_eq!(grpc(tonic::Code::NotFound), "grpc_not_found");
        assert_eq!(
            grpc(tonic::Code::ResourceExhausted),
            "grpc_resource_exhausted"
        );
        assert_eq!(grpc(tonic::Code::Unavailable), "grpc_unavailable");
        assert_eq!(ErrorKind::WrongAnswer.label(), "wrong_answer");
    }
}
