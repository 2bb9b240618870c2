//! The KServe v2 / Open Inference Protocol, transport-independent: the request and response as both transports
//! (HTTP in [`http`], gRPC in [`crate::api::grpc`]) decode and encode them, server and model metadata, and
//! [`infer`], which checks a request against the model's tensor contract and calls the one service function of
//! its kind. Each model kind has its contract in a module of its own ([`deepfm`], [`lightgcn`]); [`contract_of`] picks it, so a
//! new kind is one module and one match arm.

pub mod deepfm;
pub mod http;
pub mod lightgcn;
pub mod tensor;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

pub use tensor::{Datatype, InputTensor, OutputData, OutputTensor, TensorData, Typed};

use crate::error::ServiceError;
use crate::service::{ModelHandle, Readiness, ServedModel, Service};

/// What `GET /v2` and `ServerMetadata` call this server.
pub const SERVER_NAME: &str = "recserve";

/// The protocol extensions this server implements, as `GET /v2` and `ServerMetadata` list them.
pub const EXTENSIONS: &[&str] = &["binary_tensor_data"];

/// The `endpoint` label of an inference request for a model that is not served (its kind is unknown).
pub const UNKNOWN_ENDPOINT: &str = "infer";

/// A request or tensor parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum Parameter {
    Bool(bool),
    Int64(i64),
    Uint64(u64),
    Double(f64),
    String(String),
}

/// Parameters by name.
pub type Parameters = BTreeMap<String, Parameter>;

/// An inference request as a transport decoded it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InferRequest {
    /// Echoed in the response; empty when the client sent none.
    pub id: String,
    pub parameters: Parameters,
    pub inputs: Vec<InputTensor>,
    /// The outputs the client asked for, in its order; empty means every output of the model.
    pub outputs: Vec<String>,
}

/// An inference response, before a transport encodes it.
#[derive(Clone, Debug, PartialEq)]
pub struct InferResponse {
    pub model_name: String,
    pub model_version: String,
    pub id: String,
    pub outputs: Vec<OutputTensor>,
}

/// One input or output of a model's tensor contract.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub datatype: Datatype,
    /// `-1` for the batch axis.
    pub shape: Vec<i64>,
    /// What each position of the last axis holds (field or feature names), when it has names.
    pub columns: Vec<String>,
}

/// A model's metadata: `GET /v2/models/{model}` and `ModelMetadata`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelMetadata {
    pub name: String,
    /// The versions a request may name: the served one.
    pub versions: Vec<String>,
    pub platform: String,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

/// The outputs of one call of a kind's service function.
pub type Outputs<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<OutputTensor>, ServiceError>> + Send + 'a>>;

/// The tensor contract of one model kind: what it takes and returns, and how a checked request becomes a call of
/// the service function.
pub trait TensorContract: Send + Sync {
    /// The `endpoint` label of its requests (the operation, as `/v1` names it).
    fn endpoint(&self) -> &'static str;
    fn inputs(&self) -> Vec<TensorSpec>;
    fn outputs(&self) -> Vec<TensorSpec>;
    /// Decodes `inputs` into the kind's typed input (every problem a client error naming the tensor), calls the
    /// service and returns every output of the model.
    fn run<'a>(
        &'a self,
        service: &'a Service,
        inputs: Vec<InputTensor>,
        parameters: &'a Parameters,
        deadline: Option<Instant>,
    ) -> Outputs<'a>;
}

/// The tensor contract of `model`'s kind.
pub fn contract_of(model: &ServedModel) -> Box<dyn TensorContract + '_> {
    match &model.handle {
        ModelHandle::Ranking(ranking) => Box::new(deepfm::DeepFm::new(model, ranking)),
        ModelHandle::Recall(recall) => Box::new(lightgcn::LightGcn::new(model, recall)),
    }
}

/// The `endpoint` label of an inference request for `model`.
pub fn endpoint_of(model: Option<&ServedModel>) -> &'static str {
    model.map_or(UNKNOWN_ENDPOINT, |m| contract_of(m).endpoint())
}

/// The metadata of a served model.
pub fn metadata(model: &ServedModel) -> ModelMetadata {
    let contract = contract_of(model);
    ModelMetadata {
        name: model.name.clone(),
        versions: vec![model.version.to_string()],
        platform: format!("recserve_{}", model.spec.kind.as_str()),
        inputs: contract.inputs(),
        outputs: contract.outputs(),
    }
}

/// Whether `model` (and, when given, that version) is ready: served, and the server not draining.
pub fn model_ready(
    service: &Service,
    model: &str,
    version: Option<u64>,
) -> Result<bool, ServiceError> {
    service.model(model, version)?;
    Ok(service.readiness() == Readiness::Ready)
}

/// The request's deadline: the earliest of the transport's (`x-recserve-deadline-ms`, `grpc-timeout`) and the
/// `timeout` parameter (microseconds from `arrival`, as Triton defines it; 0 means none).
pub fn deadline(
    parameters: &Parameters,
    transport: Option<Instant>,
    arrival: Instant,
) -> Result<Option<Instant>, ServiceError> {
    let micros = match parameters.get("timeout") {
        None => None,
        Some(Parameter::Int64(us)) if *us >= 0 => Some(us.unsigned_abs()),
        Some(Parameter::Uint64(us)) => Some(*us),
        Some(other) => {
            return Err(ServiceError::invalid(
                "parameters.timeout",
                format!("must be a whole number of microseconds ≥ 0, got {other:?}"),
            ));
        }
    };
    let from_parameter = micros
        .filter(|&us| us > 0)
        .and_then(|us| arrival.checked_add(Duration::from_micros(us)));
    Ok(match (transport, from_parameter) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

/// Refuses, before the request is decoded, what a ranking model's queue would refuse whatever it holds: checked
/// against the transport's deadline, which the `timeout` parameter can only bring closer. Without a transport
/// deadline the parameter could set any, so nothing is checked here (admission still is, after decoding).
pub fn precheck(model: &ServedModel, transport: Option<Instant>) -> Result<(), ServiceError> {
    match (model.ranking(), transport) {
        (Ok(ranking), Some(deadline)) => ranking.precheck(Some(deadline)),
        _ => Ok(()),
    }
}

/// Runs an inference request on `model`: checks the requested outputs, decodes the inputs against the kind's
/// contract, calls the service function and returns the requested outputs in the requested order.
pub async fn infer(
    service: &Service,
    model: &ServedModel,
    request: InferRequest,
    deadline: Option<Instant>,
) -> Result<InferResponse, ServiceError> {
    let contract = contract_of(model);
    let declared = contract.outputs();
    for (i, name) in request.outputs.iter().enumerate() {
        if !declared.iter().any(|o| &o.name == name) {
            let names: Vec<&str> = declared.iter().map(|o| o.name.as_str()).collect();
            return Err(ServiceError::invalid(
                name,
                format!(
                    "is not an output of model {:?} (outputs: {})",
                    model.name,
                    names.join(", ")
                ),
            ));
        }
        if request.outputs[..i].contains(name) {
            return Err(ServiceError::invalid(name, "is requested twice"));
        }
    }
    let mut outputs = contract
        .run(service, request.inputs, &request.parameters, deadline)
        .await?;
    if !request.outputs.is_empty() {
        let mut picked = Vec::with_capacity(request.outputs.len());
        for name in &request.outputs {
            if let Some(i) = outputs.iter().position(|o| &o.name == name) {
                picked.push(outputs.swap_remove(i));
            }
        }
        outputs = picked;
    }
    Ok(InferResponse {
        model_name: model.name.clone(),
        model_version: model.version.to_string(),
        id: request.id,
        outputs,
    })
}

/// Parses a model version as both transports carry it (a string); empty means "the served one".
pub fn parse_version(version: &str) -> Result<Option<u64>, ServiceError> {
    if version.is_empty() {
        return Ok(None);
    }
    version.parse::<u64>().map(Some).map_err(|_| {
        ServiceError::invalid("version", format!("{version:?} is not a version number"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_deadline_wins_and_zero_timeout_is_none() {
        let now = Instant::now();
        let header = Some(now + Duration::from_millis(50));
        let timeout = |us: Parameter| Parameters::from([("timeout".to_owned(), us)]);
        assert_eq!(deadline(&Parameters::new(), None, now).expect("ok"), None);
        assert_eq!(
            deadline(&Parameters::new(), header, now).expect("ok"),
            header
        );
        assert_eq!(
            deadline(&timeout(Parameter::Int64(20_000)), header, now).expect("ok"),
            Some(now + Duration::from_millis(20))
        );
        assert_eq!(
            deadline(&timeout(Parameter::Uint64(90_000)), header, now).expect("ok"),
            header
        );
        assert_eq!(
            deadline(&timeout(Parameter::Int64(0)), None, now).expect("ok"),
            None
        );
        for bad in [
            Parameter::Int64(-1),
            Parameter::Double(1.5),
            Parameter::Bool(true),
        ] {
            let err = deadline(&timeout(bad), None, now).expect_err("refused");
            assert!(
                err.to_string()
                    .starts_with("parameters.timeout: must be a whole number of microseconds"),
                "{err}"
            );
        }
    }

    #[test]
    fn versions_parse_or_name_the_problem() {
        assert_eq!(parse_version("").expect("ok"), None);
        assert_eq!(parse_version("3").expect("ok"), Some(3));
        assert_eq!(
            parse_version("v3").expect_err("refused").to_string(),
            "version: \"v3\" is not a version number"
        );
    }
}
