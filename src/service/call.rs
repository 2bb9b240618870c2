//! The one envelope every request goes through, whatever its protocol. A transport reads what comes before the
//! body (the model or pipeline named, its version, the deadline the transport carries) into a [`ModelRequest`] or
//! [`PipelineRequest`] and hands the service a closure that decodes the body and runs it. The service:
//!
//! 1. resolves the model (and version) or pipeline from one registry snapshot, which the call keeps to its end;
//! 2. refuses an operation the model does not do (`/v1` rank on a recall model) before decoding the body;
//! 3. resolves the deadline once: the transport's, else the model's default, both counted from the request's
//!    arrival, its first byte ([`crate::trace::arrival`]; the body has been read by then, but not decoded);
//! 4. refuses at once what the model's queue would refuse whatever the request holds (when the deadline is known
//!    before the body: always, except for a KServe request without a transport deadline, whose body may set one),
//!    which saves the decode, not the read;
//! 5. runs the closure with a [`ModelCall`] or [`PipelineCall`], which scores, recalls or recommends and builds the
//!    response;
//! 6. records the request (`recserve_requests_total`, `recserve_request_duration_seconds` from its first byte) by
//!    model, endpoint, protocol and the HTTP status of its outcome, and notes the outcome on its trace.
//!
//! The transport then encodes the answer or maps the error to its status codes.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{ResolvedPipeline, ServedModel, Service};
use crate::error::ServiceError;
use crate::metrics::UNKNOWN_MODEL;
use crate::pipeline::{RecommendInput, Recommendation};
use crate::ranking::{RankInput, RankingModel};
use crate::recall::{RecallInput, RecallModel, Recalled};
use crate::trace::{self, Outcome, Stage};

/// The protocol a request came in by: the `protocol` label of the request metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// recserve's own JSON API (`/v1/...`).
    V1,
    /// KServe v2 over HTTP (`/v2/...`).
    V2Http,
    /// KServe v2 over gRPC (`inference.GRPCInferenceService`).
    Grpc,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::V1 => "v1",
            Protocol::V2Http => "v2_http",
            Protocol::Grpc => "grpc",
        }
    }
}

/// What a request asks of a model: the `endpoint` label of the request metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Rank,
    Recall,
    Recommend,
    /// KServe inference: whatever the model does (`rank` or `recall`; `infer` for a model that is not served).
    Infer,
}

impl Operation {
    pub fn endpoint(self) -> &'static str {
        match self {
            Operation::Rank => "rank",
            Operation::Recall => "recall",
            Operation::Recommend => "recommend",
            Operation::Infer => "infer",
        }
    }
}

/// Parses a model version as requests carry it (a string); absent or empty means "the one serving".
pub fn parse_version(version: Option<&str>) -> Result<Option<u64>, ServiceError> {
    match version {
        None | Some("") => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            ServiceError::invalid("version", format!("{v:?} is not a version number"))
        }),
    }
}

/// A request for one model, as its transport read it before the body.
#[derive(Debug)]
pub struct ModelRequest<'a> {
    pub protocol: Protocol,
    pub operation: Operation,
    pub model: &'a str,
    /// The version the request names, unparsed; `None` or empty: the one serving.
    pub version: Option<&'a str>,
    /// When the request arrived; deadlines count from here.
    pub arrival: Instant,
    /// The deadline the transport carries (`x-recserve-deadline-ms`, `grpc-timeout`), or why it is unreadable.
    pub deadline: Result<Option<Instant>, ServiceError>,
    /// Whether the body may set a deadline of its own (KServe's `timeout` parameter): without a transport
    /// deadline, the queue is then not checked before the body is read.
    pub deadline_in_body: bool,
}

/// A request for a pipeline, as its transport read it before the body.
#[derive(Debug)]
pub struct PipelineRequest<'a> {
    pub protocol: Protocol,
    pub pipeline: &'a str,
    pub arrival: Instant,
    pub deadline: Result<Option<Instant>, ServiceError>,
}

/// A request's deadline, resolved once.
#[derive(Clone, Copy, Debug)]
struct Deadline {
    at: Instant,
    transport: Option<Instant>,
    /// The model's default, when neither transport nor body sets one.
    default: Instant,
}

impl Deadline {
    fn new(transport: Option<Instant>, arrival: Instant, default: Duration) -> Deadline {
        let default = arrival + default;
        Deadline {
            at: transport.unwrap_or(default),
            transport,
            default,
        }
    }

    /// Applies a deadline the body sets: it can only bring the transport's closer; without one, it replaces the
    /// default.
    fn with_body(&mut self, body: Option<Instant>) {
        self.at = match (self.transport, body) {
            (Some(t), Some(b)) => t.min(b),
            (Some(t), None) => t,
            (None, Some(b)) => b,
            (None, None) => self.default,
        };
    }
}

/// An admitted request for one model: the model (of the snapshot it was resolved in) and the deadline.
#[derive(Debug)]
pub struct ModelCall {
    pub model: Arc<ServedModel>,
    deadline: Deadline,
}

impl ModelCall {
    /// When the client stops waiting: work for the request is dropped once it has passed.
    pub fn deadline(&self) -> Instant {
        self.deadline.at
    }

    /// Applies a deadline read from the body (KServe's `timeout` parameter).
    pub fn set_body_deadline(&mut self, body: Option<Instant>) {
        self.deadline.with_body(body);
    }

    pub fn ranking(&self) -> Result<&RankingModel, ServiceError> {
        self.model.ranking()
    }

    pub fn recall_model(&self) -> Result<&RecallModel, ServiceError> {
        self.model.recall()
    }

    /// Scores validated rows on the ranking model.
    pub async fn rank(&self, input: RankInput) -> Result<Vec<f32>, ServiceError> {
        trace::mark(Stage::Decode);
        self.ranking()?.score(input, self.deadline.at).await
    }

    /// The answers of a request's recall queries, queued together, in input order.
    pub async fn recall(&self, inputs: Vec<RecallInput>) -> Result<Vec<Recalled>, ServiceError> {
        trace::mark(Stage::Decode);
        self.recall_model()?
            .recall_many(inputs, self.deadline.at)
            .await
    }
}

/// An admitted recommend request: the pipeline with its two models, and the deadline both stages share.
#[derive(Debug)]
pub struct PipelineCall {
    pub pipeline: ResolvedPipeline,
    deadline: Deadline,
}

impl PipelineCall {
    /// Recall then rank.
    pub async fn recommend(&self, input: RecommendInput) -> Result<Recommendation, ServiceError> {
        trace::mark(Stage::Decode);
        let p = &self.pipeline;
        p.pipeline
            .recommend(
                p.recall.recall()?,
                p.ranking.ranking()?,
                input,
                self.deadline.at,
            )
            .await
    }
}

impl Service {
    /// Runs a request for one model through the envelope (the module's steps 1 to 6); `run` decodes its body and
    /// calls the model.
    pub async fn model_call<T, F, Fut>(
        &self,
        request: ModelRequest<'_>,
        run: F,
    ) -> Result<T, ServiceError>
    where
        F: FnOnce(ModelCall) -> Fut,
        Fut: Future<Output = Result<T, ServiceError>>,
    {
        let found = self.snapshot().and_then(|models| {
            let version = parse_version(request.version)?;
            models.get(request.model, version).cloned()
        });
        let result = match &found {
            Ok(model) => {
                async {
                    let transport = request.deadline?;
                    model.check_operation(request.operation)?;
                    let deadline =
                        Deadline::new(transport, request.arrival, model.model.default_deadline());
                    if transport.is_some() || !request.deadline_in_body {
                        model.model.precheck(deadline.at)?;
                    }
                    run(ModelCall {
                        model: Arc::clone(model),
                        deadline,
                    })
                    .await
                }
                .await
            }
            Err(e) => Err(e.clone()),
        };
        let (label, endpoint) = match (&found, request.operation) {
            (Ok(m), Operation::Infer) => (m.name.as_str(), m.model.operation().endpoint()),
            (Ok(m), operation) => (m.name.as_str(), operation.endpoint()),
            (Err(_), operation) => (UNKNOWN_MODEL, operation.endpoint()),
        };
        self.record(request.protocol, label, endpoint, &result, request.arrival);
        result
    }

    /// Runs a recommend request through the envelope: both models from one snapshot, the queue of the ranking
    /// model (then of the recall model) checked before the body is read, one deadline for both stages (without
    /// one from the transport, the ranking model's default).
    pub async fn pipeline_call<T, F, Fut>(
        &self,
        request: PipelineRequest<'_>,
        run: F,
    ) -> Result<T, ServiceError>
    where
        F: FnOnce(PipelineCall) -> Fut,
        Fut: Future<Output = Result<T, ServiceError>>,
    {
        let found = self.snapshot().and_then(|models| {
            let pipeline = self.pipeline(request.pipeline)?;
            ResolvedPipeline::new(&pipeline, &models)
        });
        let result = match &found {
            Ok(resolved) => {
                async {
                    let transport = request.deadline?;
                    let ranking = &resolved.ranking.model;
                    let deadline =
                        Deadline::new(transport, request.arrival, ranking.default_deadline());
                    // Under overload the ranking model refuses most requests: refuse before spending a recall on
                    // one that its queue would turn away whatever the number of candidates.
                    ranking.precheck(deadline.at)?;
                    resolved.recall.model.precheck(deadline.at)?;
                    run(PipelineCall {
                        pipeline: resolved.clone(),
                        deadline,
                    })
                    .await
                }
                .await
            }
            Err(e) => Err(e.clone()),
        };
        // The `model` label of recommend requests is the pipeline's name (bounded: pipelines come from the config).
        let label = match &found {
            Ok(p) => p.pipeline.name.as_str(),
            Err(_) => UNKNOWN_MODEL,
        };
        self.record(
            request.protocol,
            label,
            Operation::Recommend.endpoint(),
            &result,
            request.arrival,
        );
        result
    }

    fn record<T>(
        &self,
        protocol: Protocol,
        label: &str,
        endpoint: &'static str,
        result: &Result<T, ServiceError>,
        arrival: Instant,
    ) {
        let status = result
            .as_ref()
            .map_or_else(ServiceError::http_status, |_| 200);
        let now = Instant::now();
        self.metrics.observe_request(
            label,
            endpoint,
            protocol.as_str(),
            status,
            now.saturating_duration_since(arrival).as_secs_f64(),
        );
        trace::record(|t| {
            t.mark_at(Stage::Encode, now);
            t.outcome(Outcome {
                model: label.to_owned(),
                endpoint,
                protocol: protocol.as_str(),
                status,
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_is_the_transports_else_the_default_and_the_body_may_bring_it_closer() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let default = ms(1000);
        let mut none = Deadline::new(None, now, default);
        assert_eq!(none.at, now + default);
        none.with_body(Some(now + ms(5000)));
        assert_eq!(
            none.at,
            now + ms(5000),
            "without a transport deadline the body's wins"
        );
        none.with_body(None);
        assert_eq!(none.at, now + default);

        let mut header = Deadline::new(Some(now + ms(50)), now, default);
        assert_eq!(header.at, now + ms(50));
        header.with_body(Some(now + ms(20)));
        assert_eq!(header.at, now + ms(20));
        header.with_body(Some(now + ms(90)));
        assert_eq!(
            header.at,
            now + ms(50),
            "the body cannot move the transport's later"
        );
    }

    #[test]
    fn versions_parse_or_name_the_problem() {
        assert_eq!(parse_version(None).expect("ok"), None);
        assert_eq!(parse_version(Some("")).expect("ok"), None);
        assert_eq!(parse_version(Some("3")).expect("ok"), Some(3));
        assert_eq!(
            parse_version(Some("v3")).expect_err("refused").to_string(),
            "version: \"v3\" is not a version number"
        );
    }
}
