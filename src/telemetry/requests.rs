//! What the connection layer does for each request when tracing (`--otlp-endpoint`) or the access log
//! (`--access-log-sample-ratio`) is on: reads the caller's `traceparent`, decides the server span and whether the
//! request is logged, puts the server span's `traceparent` on the response, and once the response is handed over
//! exports the request's spans and writes its access-log line. With both off the server holds no
//! [`RequestTelemetry`] and a request does none of this: no header is read or written, nothing is allocated.

use std::sync::Arc;

use axum::http::{HeaderValue, Request, header};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use recserve_core::trace::Finished;

use super::spans::{RequestInfo, ServerSpan, Spans};
use super::traceparent::{self, Parent};

/// The access log's `tracing` target: `RUST_LOG=recserve::access=off` silences it.
pub const ACCESS_TARGET: &str = "recserve::access";

/// Tracing and the access log, server-wide.
#[derive(Debug)]
pub struct RequestTelemetry {
    spans: Option<Spans>,
    access_ratio: f64,
    draws: RandomIdGenerator,
}

/// One request's part: its server span, and whether it is logged.
#[derive(Debug)]
pub struct Observed {
    span: Option<ServerSpan>,
    /// The caller's trace when tracing is off (the access log still names it).
    incoming: Option<Parent>,
    logged: bool,
    request: RequestInfo,
    request_bytes: Option<u64>,
}

impl RequestTelemetry {
    /// `None` when neither tracing nor the access log is on.
    pub fn new(spans: Option<Spans>, access_ratio: f64) -> Option<Arc<RequestTelemetry>> {
        (spans.is_some() || access_ratio > 0.0).then(|| {
            Arc::new(RequestTelemetry {
                spans,
                access_ratio,
                draws: RandomIdGenerator::default(),
            })
        })
    }

    /// A request's part, from its head; `None` when it is neither traced nor logged.
    pub fn observe<B>(&self, request: &Request<B>) -> Option<Box<Observed>> {
        let logged = self.access_ratio >= 1.0
            || (self.access_ratio > 0.0 && {
                // A uniform draw in [0, 1) from the 53 high bits of a random id.
                let draw = u64::from_be_bytes(self.draws.new_span_id().to_bytes()) >> 11;
                (draw as f64) / ((1u64 << 53) as f64) < self.access_ratio
            });
        if self.spans.is_none() && !logged {
            return None;
        }
        let incoming = request
            .headers()
            .get(traceparent::HEADER)
            .and_then(|v| traceparent::parse(v.as_bytes()));
        let request_bytes = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        Some(Box::new(Observed {
            span: self.spans.as_ref().map(|s| s.begin(incoming)),
            incoming,
            logged,
            request: RequestInfo {
                method: request.method().as_str().to_owned(),
                path: request.uri().path().to_owned(),
            },
            request_bytes,
        }))
    }

    /// Exports the spans still queued (blocks until done or the export times out).
    pub fn shutdown(&self) {
        if let Some(spans) = &self.spans {
            spans.shutdown();
        }
    }

    /// A request has been answered (`finished`: its stage trace; `None` for requests of no model, as health checks
    /// and `/metrics`, which are neither traced nor logged), `response_bytes` of its body handed over.
    pub fn finish(&self, observed: &Observed, finished: &Finished, response_bytes: u64) {
        if let (Some(spans), Some(span)) = (&self.spans, &observed.span) {
            spans.export(span, finished, &observed.request);
        }
        if observed.logged {
            access_line(observed, finished, response_bytes);
        }
    }
}

impl Observed {
    /// The `traceparent` the response carries: the server span's, when tracing is on.
    pub fn response_traceparent(&self) -> Option<HeaderValue> {
        let span = self.span.as_ref()?;
        HeaderValue::from_str(&traceparent::format(
            span.trace_id,
            span.span_id,
            span.sampled,
        ))
        .ok()
    }
}

/// One line per request, through the log subscriber (JSON with `--log-format json`).
fn access_line(observed: &Observed, f: &Finished, response_bytes: u64) {
    let (trace_id, span_id) = match (&observed.span, &observed.incoming) {
        (Some(span), _) => (
            traceparent::hex_string(&span.trace_id.to_bytes()),
            traceparent::hex_string(&span.span_id.to_bytes()),
        ),
        (None, Some(parent)) => (
            traceparent::hex_string(&parent.trace_id.to_bytes()),
            String::new(),
        ),
        (None, None) => (String::new(), String::new()),
    };
    let outcome = &f.outcome;
    tracing::info!(
        target: ACCESS_TARGET,
        method = %observed.request.method,
        path = %observed.request.path,
        protocol = outcome.protocol,
        endpoint = outcome.endpoint,
        model = %outcome.model,
        version = outcome.version,
        status = outcome.status,
        latency_ms = f.total.as_secs_f64() * 1e3,
        request_bytes = observed.request_bytes,
        response_bytes,
        trace_id = %trace_id,
        span_id = %span_id,
        "request"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_tracing_and_the_access_log_off_there_is_nothing_to_do() {
        assert!(RequestTelemetry::new(None, 0.0).is_none());
        let logged = RequestTelemetry::new(None, 1.0).expect("on");
        let request = Request::builder()
            .uri("/v1/rank/m")
            .header(
                traceparent::HEADER,
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )
            .body(())
            .expect("request");
        let observed = logged.observe(&request).expect("logged");
        assert!(
            observed.response_traceparent().is_none(),
            "no traceparent without tracing"
        );
        assert!(observed.incoming.is_some());
        let never = RequestTelemetry::new(None, f64::MIN_POSITIVE).expect("on");
        assert!(never.observe(&request).is_none());
    }
}
