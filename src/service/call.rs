//! The life of a request, whatever its protocol, in one function per kind ([`Service::model_call`],
//! [`Service::pipeline_call`]). A transport reads what comes before the body (the model or pipeline named, its
//! version, the deadline the transport carries) into a [`ModelRequest`] or [`PipelineRequest`], stamped with the
//! request's arrival (its first byte, [`recserve_core::trace::arrival`]), and hands the service its unread body
//! ([`RequestBody`]) and a handler that decodes it, runs it and builds the answer. The service:
//!
//! 1. **resolves** the model (and version) or pipeline from one registry snapshot, which the call keeps to its end:
//!    the version the request names, else the one the model's traffic split gives the request's routing key
//!    (`x-recserve-routing-key`), and the shadow version that scores a copy of it, if any;
//! 2. **admits** it: every refusal that does not need the body, decided once: an operation the model does not do
//!    (`/v1` rank on a recall model), an unreadable deadline, and what the model's queue would refuse whatever the
//!    request holds (when the deadline is known before the body: always, except for a KServe request without a
//!    transport deadline, whose body may set one). The deadline is resolved here: the transport's, else the
//!    model's default, both counted from the arrival;
//! 3. **reads** the body, only once the request is admitted: a request refused before is answered without its body
//!    being read (HTTP: a client that sent `Expect: 100-continue` never sends it; one that did not has what it sent
//!    drained, bounded, while the answer goes out). gRPC messages are read by tonic before the service sees them,
//!    and the model's name is inside, so for gRPC this step has nothing left to read;
//! 4. runs the handler with a [`ModelCall`] or [`PipelineCall`]: the contract types decode and validate the body
//!    into a typed input, the call scores, recalls or recommends it, and the transport builds its answer;
//! 5. records the request (`recserve_requests_total`, `recserve_request_duration_seconds` from its first byte) by
//!    model, version, endpoint, protocol and the HTTP status of its outcome, and notes the outcome on its trace.
//!
//! A shadow's copy is scored on a task of its own, after the primary's input is decoded and without the primary
//! waiting for it; its own queue refuses it when full, and its answer is only counted
//! (`recserve_shadow_requests_total`).
//!
//! The transport then encodes the answer or maps the error to its status codes.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Operation, ResolvedPipeline, ServedModel, Service};
use recserve_core::error::ServiceError;
use recserve_core::metrics::{Metrics, UNKNOWN_MODEL};
use recserve_core::pipeline::{RecommendInput, Recommendation};
use recserve_core::ranking::{RankInput, RankingModel};
use recserve_core::recall::{RecallInput, RecallModel, Recalled};
use recserve_core::registry;
use recserve_core::trace::{self, Outcome, Stage};

/// Where a request for a model goes: the version that answers it and its shadow.
type Routed = registry::Routed<recserve_core::models::Model>;

/// The protocol a request came in by: the `protocol` label of the request metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// recserve's own JSON API (`/v1/...`).
    V1,
    /// KServe v2 over HTTP (`/v2/...`).
    V2Http,
    /// KServe v2 over gRPC (`inference.GRPCInferenceService`).
    Grpc,
}

impl Protocol {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Protocol::V1 => "v1",
            Protocol::V2Http => "v2_http",
            Protocol::Grpc => "grpc",
        }
    }
}

/// Parses a model version as requests carry it (a string); absent or empty means "the one serving".
pub(crate) fn parse_version(version: Option<&str>) -> Result<Option<u64>, ServiceError> {
    match version {
        None | Some("") => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            ServiceError::invalid("version", format!("{v:?} is not a version number"))
        }),
    }
}

/// A request's body as its transport holds it when the service admits the request: read only if the request is
/// admitted ([`Service::model_call`]'s step 3).
pub(crate) trait RequestBody: Send {
    /// What reading it gives: the bytes of an HTTP body, or the message tonic has already decoded.
    type Read: Send;
    /// Reads it whole, within the transport's limit.
    fn read(&mut self) -> impl Future<Output = Result<Self::Read, ServiceError>> + Send;
    /// The request was refused before its body was read: what the transport does with the rest of it.
    fn refused(&mut self);
}

/// A body its transport has already read (a gRPC message: its model's name is inside it).
#[derive(Debug)]
pub(crate) struct Received<T>(Option<T>);

impl<T> Received<T> {
    pub(crate) fn new(message: T) -> Received<T> {
        Received(Some(message))
    }
}

impl<T: Send> RequestBody for Received<T> {
    type Read = T;

    async fn read(&mut self) -> Result<T, ServiceError> {
        self.0
            .take()
            .ok_or_else(|| ServiceError::Internal("a request body read twice".into()))
    }

    fn refused(&mut self) {}
}

/// A request for one model, as its transport read it before the body.
#[derive(Debug)]
pub(crate) struct ModelRequest<'a> {
    pub(crate) protocol: Protocol,
    pub(crate) operation: Operation,
    pub(crate) model: &'a str,
    /// The version the request names, unparsed; `None` or empty: the one its routing key is routed to.
    pub(crate) version: Option<&'a str>,
    /// What a traffic split routes by (`x-recserve-routing-key`: the user's id); `None`: spread without stickiness.
    pub(crate) routing_key: Option<&'a str>,
    /// When the request arrived; deadlines count from here.
    pub(crate) arrival: Instant,
    /// The deadline the transport carries (`x-recserve-deadline-ms`, `grpc-timeout`), or why it is unreadable.
    pub(crate) deadline: Result<Option<Instant>, ServiceError>,
    /// Whether the body may set a deadline of its own (KServe's `timeout` parameter): without a transport
    /// deadline, the queue is then not checked before the body is read.
    pub(crate) deadline_in_body: bool,
}

/// A request for a pipeline, as its transport read it before the body.
#[derive(Debug)]
pub(crate) struct PipelineRequest<'a> {
    pub(crate) protocol: Protocol,
    pub(crate) pipeline: &'a str,
    /// As [`ModelRequest::routing_key`], for both of the pipeline's models.
    pub(crate) routing_key: Option<&'a str>,
    pub(crate) arrival: Instant,
    pub(crate) deadline: Result<Option<Instant>, ServiceError>,
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

/// An admitted request for one model: the model (of the snapshot it was resolved in), the shadow version that
/// scores a copy of it, and the deadline.
#[derive(Debug)]
pub(crate) struct ModelCall {
    pub(crate) model: Arc<ServedModel>,
    /// The shadow version, and where its copies are counted.
    shadow: Option<(Arc<ServedModel>, Metrics)>,
    deadline: Deadline,
}

impl ModelCall {
    /// Applies a deadline read from the body (KServe's `timeout` parameter).
    pub(crate) fn set_body_deadline(&mut self, body: Option<Instant>) {
        self.deadline.with_body(body);
    }

    pub(crate) fn ranking(&self) -> Result<&RankingModel, ServiceError> {
        self.model.ranking()
    }

    pub(crate) fn recall_model(&self) -> Result<&RecallModel, ServiceError> {
        self.model.recall()
    }

    /// Scores validated rows on the ranking model (and a copy on its shadow, if it has one for this request).
    pub(crate) async fn rank(&self, input: RankInput) -> Result<Vec<f32>, ServiceError> {
        trace::mark(Stage::Decode);
        let ranking = self.ranking()?;
        if let Some((shadow, metrics)) = &self.shadow {
            shadow_rank(&self.model, shadow, metrics, &input, self.deadline.at);
        }
        ranking.score(input, self.deadline.at).await
    }

    /// The answers of a request's recall queries, queued together, in input order.
    pub(crate) async fn recall(
        &self,
        inputs: Vec<RecallInput>,
    ) -> Result<Vec<Recalled>, ServiceError> {
        trace::mark(Stage::Decode);
        self.recall_model()?
            .recall_many(inputs, self.deadline.at)
            .await
    }
}

/// Sends a copy of `input` to `shadow` on a task of its own, if it fits the shadow's contract; counts how it ends.
fn shadow_rank(
    primary: &ServedModel,
    shadow: &Arc<ServedModel>,
    metrics: &Metrics,
    input: &RankInput,
    deadline: Instant,
) {
    let count = |outcome: &str| metrics.shadow_request(&shadow.name, shadow.version, outcome);
    let (Ok(from), Ok(to)) = (primary.ranking(), shadow.ranking()) else {
        return count("unfit");
    };
    if let Err(problem) = to.contract.fits(&from.contract, input) {
        tracing::debug!(model = %shadow.name, version = shadow.version, %problem, "a request does not fit the shadow version");
        return count("unfit");
    }
    if shadow.model.precheck(deadline).is_err() {
        return count("refused");
    }
    let (shadow, input, metrics) = (Arc::clone(shadow), input.clone(), metrics.clone());
    tokio::spawn(async move {
        let Ok(ranking) = shadow.ranking() else {
            return;
        };
        let outcome = match ranking.score(input, deadline).await {
            Ok(_) => "scored",
            Err(ServiceError::Overloaded { .. } | ServiceError::DeadlineExceeded { .. }) => {
                "refused"
            }
            Err(_) => "failed",
        };
        metrics.shadow_request(&shadow.name, shadow.version, outcome);
    });
}

/// An admitted recommend request: the pipeline with its two models, and the deadline both stages share.
#[derive(Debug)]
pub(crate) struct PipelineCall {
    pub(crate) pipeline: ResolvedPipeline,
    deadline: Deadline,
}

impl PipelineCall {
    /// Recall then rank.
    pub(crate) async fn recommend(
        &self,
        input: RecommendInput,
    ) -> Result<Recommendation, ServiceError> {
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
    /// The life of a request for one model (the module's steps 1 to 5): resolve, admit, read the body, run
    /// `handle` (decode and validate, run, answer), record.
    pub(crate) async fn model_call<B, T, F, Fut>(
        &self,
        request: ModelRequest<'_>,
        body: &mut B,
        handle: F,
    ) -> Result<T, ServiceError>
    where
        B: RequestBody,
        F: FnOnce(ModelCall, B::Read) -> Fut,
        Fut: Future<Output = Result<T, ServiceError>>,
    {
        let found = self.resolve_model(request.model, request.version, request.routing_key);
        let admitted = found
            .clone()
            .and_then(|routed| admit_model(routed, &request, &self.metrics));
        let result = read_and_run(admitted, body, handle).await;
        let (label, endpoint) = match (&found, request.operation) {
            (Ok(r), Operation::Infer) => (
                r.primary.name.as_str(),
                r.primary.model.operation().endpoint(),
            ),
            (Ok(r), operation) => (r.primary.name.as_str(), operation.endpoint()),
            (Err(_), operation) => (UNKNOWN_MODEL, operation.endpoint()),
        };
        let version = found.as_ref().ok().map(|r| r.primary.version);
        self.record(
            request.protocol,
            (label, version),
            endpoint,
            &result,
            request.arrival,
        );
        result
    }

    /// The life of a recommend request, as [`Service::model_call`]'s: both models resolved from one snapshot, one
    /// deadline for both stages (without one from the transport, the ranking model's default).
    pub(crate) async fn pipeline_call<B, T, F, Fut>(
        &self,
        request: PipelineRequest<'_>,
        body: &mut B,
        handle: F,
    ) -> Result<T, ServiceError>
    where
        B: RequestBody,
        F: FnOnce(PipelineCall, B::Read) -> Fut,
        Fut: Future<Output = Result<T, ServiceError>>,
    {
        let found = self.snapshot().and_then(|models| {
            let pipeline = self.pipeline(request.pipeline)?;
            ResolvedPipeline::routed(&pipeline, &models, request.routing_key.map(str::as_bytes))
        });
        let admitted = found
            .clone()
            .and_then(|resolved| admit_pipeline(&resolved, &request));
        let result = read_and_run(admitted, body, handle).await;
        // The `model` label of recommend requests is the pipeline's name (bounded: pipelines come from the config).
        let (label, version) = match &found {
            Ok(p) => (p.pipeline.name.as_str(), Some(p.ranking.version)),
            Err(_) => (UNKNOWN_MODEL, None),
        };
        self.record(
            request.protocol,
            (label, version),
            Operation::Recommend.endpoint(),
            &result,
            request.arrival,
        );
        result
    }

    /// The model and version a request names (else the one its routing key is routed to, and the shadow), from
    /// the serving snapshot.
    fn resolve_model(
        &self,
        model: &str,
        version: Option<&str>,
        routing_key: Option<&str>,
    ) -> Result<Routed, ServiceError> {
        let models = self.snapshot()?;
        let version = parse_version(version)?;
        models.route(model, version, routing_key.map(str::as_bytes))
    }

    fn record<T>(
        &self,
        protocol: Protocol,
        (label, version): (&str, Option<u64>),
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
            version,
            endpoint,
            protocol.as_str(),
            status,
            now.saturating_duration_since(arrival).as_secs_f64(),
        );
        trace::record(|t| {
            t.mark_at(Stage::Encode, now);
            t.outcome(Outcome {
                model: label.to_owned(),
                version,
                endpoint,
                protocol: protocol.as_str(),
                status,
            });
        });
    }
}

/// Admits a request for the model it was routed to: every refusal that does not need its body.
fn admit_model(
    routed: Routed,
    request: &ModelRequest<'_>,
    metrics: &Metrics,
) -> Result<ModelCall, ServiceError> {
    let Routed {
        primary: model,
        shadow,
    } = routed;
    let model = &model;
    let transport = request.deadline.clone()?;
    model.check_operation(request.operation)?;
    let deadline = Deadline::new(transport, request.arrival, model.model.default_deadline());
    if transport.is_some() || !request.deadline_in_body {
        model.model.precheck(deadline.at)?;
    }
    Ok(ModelCall {
        model: Arc::clone(model),
        shadow: shadow.map(|s| (s, metrics.clone())),
        deadline,
    })
}

/// Admits a recommend request: under overload the ranking model refuses most requests, so it is asked first,
/// before a recall is spent on one that its queue would turn away whatever the number of candidates.
fn admit_pipeline(
    resolved: &ResolvedPipeline,
    request: &PipelineRequest<'_>,
) -> Result<PipelineCall, ServiceError> {
    let transport = request.deadline.clone()?;
    let ranking = &resolved.ranking.model;
    let deadline = Deadline::new(transport, request.arrival, ranking.default_deadline());
    ranking.precheck(deadline.at)?;
    resolved.recall.model.precheck(deadline.at)?;
    Ok(PipelineCall {
        pipeline: resolved.clone(),
        deadline,
    })
}

/// The rest of an admitted request's life: its body read, then `handle` run on it (decode and validate, run,
/// answer). A request refused before is answered without its body being read: the transport deals with the rest.
/// The read stage of its trace ends here either way.
async fn read_and_run<B, C, T, F, Fut>(
    admitted: Result<C, ServiceError>,
    body: &mut B,
    handle: F,
) -> Result<T, ServiceError>
where
    B: RequestBody,
    F: FnOnce(C, B::Read) -> Fut,
    Fut: Future<Output = Result<T, ServiceError>>,
{
    let call = match admitted {
        Ok(call) => call,
        Err(e) => {
            body.refused();
            trace::mark(Stage::Read);
            return Err(e);
        }
    };
    let read = body.read().await;
    trace::mark(Stage::Read);
    handle(call, read?).await
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
