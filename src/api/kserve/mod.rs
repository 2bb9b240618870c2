//! The KServe v2 / Open Inference Protocol: the request and response as both transports (HTTP in [`http`], gRPC in
//! [`grpc`], with the standard health service in [`health`]) decode and encode them, server and model metadata,
//! and [`infer`], which checks a request against the model's tensor contract and calls its model through the
//! service's envelope; Triton's model repository, model configuration and statistics extensions each have their module
//! ([`repository`], [`model_config`], [`statistics`]). Each model kind has its contract in a module of its own ([`deepfm`], [`lightgcn`]); [`contract_of`] picks it, so a
//! new kind is one module and one match arm.

pub mod deepfm;
pub mod grpc;
pub(crate) mod grpc_status;
pub(crate) mod health;
pub(crate) mod http;
pub(crate) mod lightgcn;
pub(crate) mod model_config;
pub(crate) mod repository;
pub(crate) mod statistics;
pub(crate) mod tensor;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

pub(crate) use tensor::{Datatype, InputTensor, OutputData, OutputTensor, TensorData, Typed};

use crate::service::{Model, ModelCall, ServedModel};
use recserve_core::error::{Echo, ServiceError};

/// What `GET /v2` and `ServerMetadata` call this server.
pub(crate) const SERVER_NAME: &str = "recserve";

/// The protocol extensions this server implements, as `GET /v2` and `ServerMetadata` list them.
pub(crate) const EXTENSIONS: &[&str] = &[
    "binary_tensor_data",
    "model_repository",
    "model_configuration",
    "statistics",
];

/// A request or tensor parameter.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Parameter {
    Bool(bool),
    Int64(i64),
    Uint64(u64),
    Double(f64),
    String(String),
}

/// A parameter's value as error messages show it: its type and the value as the client wrote it (`the integer
/// -1`, `the string "1000"`), client text cut ([`Echo`]).
impl std::fmt::Display for Parameter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Parameter::Bool(b) => write!(f, "the boolean {b}"),
            Parameter::Int64(n) => write!(f, "the integer {n}"),
            Parameter::Uint64(n) => write!(f, "the integer {n}"),
            Parameter::Double(x) => write!(f, "the number {x}"),
            Parameter::String(text) => write!(f, "the string {:?}", Echo(text)),
        }
    }
}

/// Parameters by name.
pub(crate) type Parameters = BTreeMap<String, Parameter>;

/// An inference request as a transport decoded it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct InferRequest {
    /// Echoed in the response; empty when the client sent none.
    pub(crate) id: String,
    pub(crate) parameters: Parameters,
    pub(crate) inputs: Vec<InputTensor>,
    /// The outputs the client asked for, in its order; empty means every output of the model.
    pub(crate) outputs: Vec<String>,
}

/// An inference response, before a transport encodes it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct InferResponse {
    pub(crate) model_name: String,
    pub(crate) model_version: String,
    pub(crate) id: String,
    pub(crate) outputs: Vec<OutputTensor>,
}

/// One input or output of a model's tensor contract.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TensorSpec {
    pub(crate) name: String,
    pub(crate) datatype: Datatype,
    /// `-1` for the batch axis.
    pub(crate) shape: Vec<i64>,
    /// What each position of the last axis holds (field or feature names), when it has names.
    pub(crate) columns: Vec<String>,
}

/// A model's metadata: `GET /v2/models/{model}` and `ModelMetadata`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ModelMetadata {
    pub(crate) name: String,
    /// The versions a request may name: those loaded.
    pub(crate) versions: Vec<String>,
    pub(crate) platform: String,
    pub(crate) inputs: Vec<TensorSpec>,
    pub(crate) outputs: Vec<TensorSpec>,
    /// The protocol's optional model `properties`: what the tensor shapes cannot say (an optional input, its
    /// default), by name.
    pub(crate) properties: BTreeMap<String, String>,
}

/// The outputs of one call of a kind's service function.
pub(crate) type Outputs<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<OutputTensor>, ServiceError>> + Send + 'a>>;

/// The tensor contract of one model kind: what it takes and returns, and how a checked request becomes a call of
/// the service function.
pub(crate) trait TensorContract: Send + Sync {
    fn inputs(&self) -> Vec<TensorSpec>;
    fn outputs(&self) -> Vec<TensorSpec>;
    /// The metadata's `properties`: none unless the kind has something the tensors cannot say.
    fn properties(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Decodes `inputs` into the kind's typed input (every problem a client error naming the tensor), runs it
    /// through `call` and returns every output of the model.
    fn run<'a>(
        &'a self,
        call: &'a ModelCall,
        inputs: Vec<InputTensor>,
        parameters: &'a Parameters,
    ) -> Outputs<'a>;
}

/// The tensor contract of `model`'s kind.
pub(crate) fn contract_of(model: &ServedModel) -> Box<dyn TensorContract + '_> {
    match &model.model {
        Model::Ranking(ranking) => Box::new(deepfm::DeepFm::new(model, ranking)),
        Model::Recall(recall) => Box::new(lightgcn::LightGcn::new(model, recall)),
    }
}

/// The metadata of a served model; `versions`: every loaded version of it (empty: this one).
pub(crate) fn metadata(model: &ServedModel, versions: Vec<u64>) -> ModelMetadata {
    let contract = contract_of(model);
    let versions = if versions.is_empty() {
        vec![model.version]
    } else {
        versions
    };
    ModelMetadata {
        name: model.name.clone(),
        versions: versions.iter().map(u64::to_string).collect(),
        platform: format!("recserve_{}", model.spec.kind.as_str()),
        inputs: contract.inputs(),
        outputs: contract.outputs(),
        properties: contract.properties().into_iter().collect(),
    }
}

/// The deadline a request's `timeout` parameter sets: microseconds from `arrival`, as Triton defines it; 0 means
/// none. The service combines it with the transport's ([`ModelCall::set_body_deadline`]).
pub(crate) fn timeout_parameter(
    parameters: &Parameters,
    arrival: Instant,
) -> Result<Option<Instant>, ServiceError> {
    let micros = match parameters.get("timeout") {
        None => None,
        Some(Parameter::Int64(us)) if *us >= 0 => Some(us.unsigned_abs()),
        Some(Parameter::Uint64(us)) => Some(*us),
        Some(other) => {
            return Err(ServiceError::invalid(
                "parameters.timeout",
                format!("must be a whole number of microseconds ≥ 0, got {other}"),
            ));
        }
    };
    Ok(micros
        .filter(|&us| us > 0)
        .and_then(|us| arrival.checked_add(Duration::from_micros(us))))
}

/// Runs an inference request admitted as `call`: checks the requested outputs, decodes the inputs against the
/// kind's contract, runs them and returns the requested outputs in the requested order.
pub(crate) async fn infer(
    call: &ModelCall,
    request: InferRequest,
) -> Result<InferResponse, ServiceError> {
    let model = &*call.model;
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
        .run(call, request.inputs, &request.parameters)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_parameter_counts_microseconds_from_arrival_and_zero_is_none() {
        let now = Instant::now();
        let timeout = |us: Parameter| Parameters::from([("timeout".to_owned(), us)]);
        assert_eq!(
            timeout_parameter(&Parameters::new(), now).expect("ok"),
            None
        );
        assert_eq!(
            timeout_parameter(&timeout(Parameter::Int64(20_000)), now).expect("ok"),
            Some(now + Duration::from_millis(20))
        );
        assert_eq!(
            timeout_parameter(&timeout(Parameter::Uint64(90_000)), now).expect("ok"),
            Some(now + Duration::from_millis(90))
        );
        assert_eq!(
            timeout_parameter(&timeout(Parameter::Int64(0)), now).expect("ok"),
            None
        );
        // The message shows the value as the client wrote it, with its type, never as a Rust value.
        for (bad, shown) in [
            (Parameter::Int64(-1), "the integer -1"),
            (Parameter::Double(1.5), "the number 1.5"),
            (Parameter::Bool(true), "the boolean true"),
            (Parameter::String("1000".into()), "the string \"1000\""),
        ] {
            let err = timeout_parameter(&timeout(bad), now).expect_err("refused");
            assert_eq!(
                err.to_string(),
                format!(
                    "parameters.timeout: must be a whole number of microseconds ≥ 0, got {shown}"
                )
            );
        }
        let long = Parameter::String("9".repeat(5000));
        assert_eq!(
            long.to_string(),
            format!(
                "the string \"{}\"… (first 100 of 5000 characters)",
                "9".repeat(100)
            )
        );
    }
}
