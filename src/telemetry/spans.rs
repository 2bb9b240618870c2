//! OpenTelemetry spans of requests, exported over OTLP/gRPC (`--otlp-endpoint`), made after each request from its
//! stage trace ([`recserve_core::trace`]) rather than by instrumenting the request path: the spans' start and end
//! times are the very marks the stage histograms are made of, so a span and the metrics agree, and a request that
//! is not sampled costs no span work at all.
//!
//! The tree of one request (see docs/tracing.md):
//!
//! ```text
//! <protocol> <endpoint>          server span; parent: the caller's span from `traceparent`
//! ├── read, decode               the body read; decoding and validating it
//! ├── <model stage>              rank | recall (a recommend call: recall, then rank)
//! │   ├── admit                  admission into the model's queue
//! │   ├── queue                  waiting until its batch closed
//! │   ├── batch                  the batch it rode in (id, rows, requests, why it closed)
//! │   │   ├── dispatch, gather, inference
//! │   └── answer                 the batch's end to the request's task holding its answer
//! ├── encode, write              building the response, handing it to the connection
//! ```
//!
//! A batch serves many requests: each request's trace has its own `batch` span, with the same times and the
//! batch's id in `recserve.batch.id`, so that a slow request's trace shows the whole batch it waited for and the
//! requests that shared it can be found by that id. Links to a separate trace per batch would need a span exported
//! for every batch whether or not any of its requests was sampled.

use std::borrow::Cow;
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{SpanContext, SpanKind, Status, TraceFlags, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue, SpanId, TraceId};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, IdGenerator, RandomIdGenerator, SpanData, SpanEvents, SpanLinks,
    SpanProcessor,
};
use recserve_core::trace::{BatchInfo, Finished, Stage};

use super::traceparent::Parent;

/// How long one export to the collector may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The server's span exporter: ids, the sampling decision, and a batch processor that sends finished spans to the
/// collector from a thread of its own (a full queue drops spans rather than waiting).
pub struct Spans {
    processor: BatchSpanProcessor,
    ratio: f64,
    ids: RandomIdGenerator,
    scope: InstrumentationScope,
}

impl std::fmt::Debug for Spans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spans")
            .field("ratio", &self.ratio)
            .finish_non_exhaustive()
    }
}

/// The server span of one request, decided when its head arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerSpan {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// The caller's span, from the request's `traceparent`.
    pub parent: Option<Parent>,
    pub sampled: bool,
}

/// What the connection saw of the request, for the server span's attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    pub method: String,
    pub path: String,
}

impl Spans {
    /// An exporter to the OTLP/gRPC collector at `endpoint` (`http://host:4317`), sampling `ratio` of the traces
    /// that no caller decided. Must be called inside the server's tokio runtime (the gRPC channel lives there).
    /// The service name is `OTEL_SERVICE_NAME`, else `recserve`; `OTEL_RESOURCE_ATTRIBUTES` adds to the resource.
    pub fn start(endpoint: &str, ratio: f64) -> Result<Spans, String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| format!("--otlp-endpoint {endpoint}: {e}"))?;
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("recserve");
        }
        let resource = resource
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let mut processor = BatchSpanProcessor::builder(exporter).build();
        processor.set_resource(&resource);
        Ok(Spans {
            processor,
            ratio,
            ids: RandomIdGenerator::default(),
            scope: InstrumentationScope::builder("recserve")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        })
    }

    /// The server span of a request whose `traceparent` named `parent`: a child of it in the caller's trace, sampled
    /// when the caller sampled its span; without one, a new trace sampled at the configured ratio.
    pub fn begin(&self, parent: Option<Parent>) -> ServerSpan {
        let trace_id = parent.map_or_else(|| self.ids.new_trace_id(), |p| p.trace_id);
        ServerSpan {
            trace_id,
            span_id: self.ids.new_span_id(),
            parent,
            sampled: sampled(parent, trace_id, self.ratio),
        }
    }

    /// Exports the spans of a finished, sampled request.
    pub fn export(&self, span: &ServerSpan, finished: &Finished, request: &RequestInfo) {
        if !span.sampled {
            return;
        }
        for data in self.spans_of(span, finished, request) {
            self.processor.on_end(data);
        }
    }

    /// Sends the spans still queued and stops the export thread; blocks until then.
    pub fn shutdown(&self) {
        if let Err(e) = self.processor.shutdown() {
            tracing::warn!("OpenTelemetry spans not all exported at shutdown: {e}");
        }
    }

    fn spans_of(&self, server: &ServerSpan, f: &Finished, request: &RequestInfo) -> Vec<SpanData> {
        let mut tree = Tree {
            out: Vec::with_capacity(f.marks.len() + 4),
            server,
            finished: f,
            scope: &self.scope,
        };
        let outcome = &f.outcome;
        let mut attributes = vec![
            KeyValue::new("recserve.protocol", outcome.protocol),
            KeyValue::new("recserve.endpoint", outcome.endpoint),
            KeyValue::new("recserve.model", outcome.model.clone()),
            KeyValue::new("http.request.method", request.method.clone()),
            KeyValue::new("url.path", request.path.clone()),
            KeyValue::new("http.response.status_code", i64::from(outcome.status)),
        ];
        if let Some(version) = outcome.version {
            attributes.push(KeyValue::new(
                "recserve.model.version",
                i64::try_from(version).unwrap_or(i64::MAX),
            ));
        }
        let status = if outcome.status >= 500 {
            Status::error(format!("HTTP status {}", outcome.status))
        } else {
            Status::Unset
        };
        let (parent, remote) = server
            .parent
            .map_or((SpanId::INVALID, false), |p| (p.span_id, true));
        let root = tree.push(
            server.span_id,
            (parent, remote),
            SpanKind::Server,
            format!("{} {}", outcome.protocol, outcome.endpoint).into(),
            (f.first_byte, f.at),
            attributes,
        );
        tree.out[root].status = status;

        // Each model stage begins with `admit`; a recommend call's first is recall, its second rank.
        let model_stage = |n: usize| match (outcome.endpoint, n) {
            ("recommend", 0) => "recall",
            ("recommend", _) => "rank",
            (endpoint, _) => endpoint,
        };
        let mut model: Option<(usize, SpanId)> = None;
        let mut models = 0;
        let mut batch: Option<(usize, SpanId)> = None;
        let mut batches = f.batches.iter().flatten();
        let mut before = f.first_byte;
        for &(stage, at) in &f.marks {
            match stage {
                Stage::Admit => {
                    let id = self.ids.new_span_id();
                    let index =
                        tree.internal(id, server.span_id, model_stage(models), (before, at));
                    models += 1;
                    model = Some((index, id));
                    tree.internal(self.ids.new_span_id(), id, "admit", (before, at));
                }
                Stage::Queue => {
                    let parent = model.map_or(server.span_id, |(_, id)| id);
                    tree.internal(self.ids.new_span_id(), parent, "queue", (before, at));
                    let id = self.ids.new_span_id();
                    let index = tree.internal(id, parent, "batch", (at, at));
                    if let Some(info) = batches.next() {
                        tree.out[index].attributes.extend(batch_attributes(info));
                    }
                    batch = Some((index, id));
                }
                Stage::Dispatch | Stage::Gather | Stage::Inference => {
                    let parent = batch.map_or(server.span_id, |(_, id)| id);
                    tree.internal(self.ids.new_span_id(), parent, stage.as_str(), (before, at));
                    if let Some((index, _)) = batch {
                        tree.end(index, at);
                    }
                }
                Stage::Answer => {
                    let parent = model.map_or(server.span_id, |(_, id)| id);
                    batch = None;
                    tree.internal(self.ids.new_span_id(), parent, "answer", (before, at));
                }
                Stage::Read | Stage::Decode | Stage::Encode | Stage::Write => {
                    model = None;
                    batch = None;
                    tree.internal(
                        self.ids.new_span_id(),
                        server.span_id,
                        stage.as_str(),
                        (before, at),
                    );
                }
            }
            if let Some((index, _)) = model {
                tree.end(index, at);
            }
            before = at;
        }
        tree.out
    }
}

/// The spans of one request as they are made.
struct Tree<'a> {
    out: Vec<SpanData>,
    server: &'a ServerSpan,
    finished: &'a Finished,
    scope: &'a InstrumentationScope,
}

impl Tree<'_> {
    /// A span of the request's trace; `parent`: the parent's id and whether it is the caller's (remote).
    fn push(
        &mut self,
        id: SpanId,
        (parent, parent_is_remote): (SpanId, bool),
        kind: SpanKind,
        name: Cow<'static, str>,
        (start, end): (Instant, Instant),
        attributes: Vec<KeyValue>,
    ) -> usize {
        self.out.push(SpanData {
            span_context: SpanContext::new(
                self.server.trace_id,
                id,
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            ),
            parent_span_id: parent,
            parent_span_is_remote: parent_is_remote,
            span_kind: kind,
            name,
            start_time: self.wall(start),
            end_time: self.wall(end),
            attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: self.scope.clone(),
        });
        self.out.len() - 1
    }

    /// An internal span of the request, child of `parent`.
    fn internal(
        &mut self,
        id: SpanId,
        parent: SpanId,
        name: &'static str,
        times: (Instant, Instant),
    ) -> usize {
        self.push(
            id,
            (parent, false),
            SpanKind::Internal,
            name.into(),
            times,
            Vec::new(),
        )
    }

    /// Moves the end of span `index` to `at`.
    fn end(&mut self, index: usize, at: Instant) {
        self.out[index].end_time = self.wall(at);
    }

    fn wall(&self, t: Instant) -> SystemTime {
        self.finished.wall_of(t)
    }
}

fn batch_attributes(info: &BatchInfo) -> [KeyValue; 4] {
    let int = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    [
        KeyValue::new(
            "recserve.batch.id",
            i64::try_from(info.id).unwrap_or(i64::MAX),
        ),
        KeyValue::new("recserve.batch.rows", int(info.rows)),
        KeyValue::new("recserve.batch.requests", int(info.requests)),
        KeyValue::new("recserve.batch.reason", info.reason),
    ]
}

/// Parent-based sampling: a caller's decision is followed; a trace the server starts is sampled when its id falls
/// in the lowest `ratio` of the id space (as OpenTelemetry's `TraceIdRatioBased` does, so every service of a
/// trace that samples by ratio decides the same for the same id).
pub fn sampled(parent: Option<Parent>, trace_id: TraceId, ratio: f64) -> bool {
    match parent {
        Some(p) => p.sampled,
        None if ratio >= 1.0 => true,
        None if ratio <= 0.0 => false,
        None => {
            let bytes = trace_id.to_bytes();
            let mut low = [0u8; 8];
            low.copy_from_slice(&bytes[8..]);
            let draw = u64::from_be_bytes(low) >> 1;
            // Below 2^63 the product is exact enough: ratios are given to a few digits.
            (draw as f64) < ratio * (1u64 << 63) as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(low: u64) -> TraceId {
        let mut bytes = [0u8; 16];
        bytes[0] = 1;
        bytes[8..].copy_from_slice(&low.to_be_bytes());
        TraceId::from_bytes(bytes)
    }

    #[test]
    fn a_callers_decision_is_followed_and_the_ratio_decides_the_rest() {
        let parent = |sampled| Parent {
            trace_id: trace(u64::MAX),
            span_id: SpanId::from_bytes([1; 8]),
            sampled,
        };
        assert!(sampled(Some(parent(true)), trace(u64::MAX), 0.0));
        assert!(!sampled(Some(parent(false)), trace(0), 1.0));
        assert!(sampled(None, trace(u64::MAX), 1.0));
        assert!(!sampled(None, trace(0), 0.0));
        assert!(sampled(None, trace(0), 0.01));
        assert!(!sampled(None, trace(u64::MAX), 0.01));
        // About a tenth of evenly spread ids.
        let n = 10_000u64;
        let hits = (0..n)
            .filter(|i| sampled(None, trace(i * (u64::MAX / n)), 0.1))
            .count();
        assert!((900..=1100).contains(&hits), "{hits}");
    }
}
