//! KServe v2 over gRPC: `inference.GRPCInferenceService` (generated from `proto/grpc_predict_v2.proto`), beside
//! the standard health service ([`super::health`]) and server reflection. Requests decode into the same
//! [`InferRequest`] as the HTTP routes and run through the service's envelope and [`super::infer`]; [`code_of`] is
//! the one mapping from service errors to gRPC status codes.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status};

use super::{
    Datatype, EXTENSIONS, InferRequest, InferResponse, InputTensor, OutputData, Parameter,
    Parameters, SERVER_NAME, TensorData, Typed,
};
use crate::service::{ModelRequest, Operation, Protocol, Readiness, Received, Service};
use recserve_core::error::ServiceError;
use recserve_core::trace;

/// The code generated from `proto/grpc_predict_v2.proto`.
pub mod proto {
    #![expect(
        clippy::allow_attributes_without_reason,
        reason = "generated code: prost and tonic write `#[allow(clippy::all)]` without a reason"
    )]
    tonic::include_proto!("inference");

    /// The encoded descriptors of `inference.*`, for server reflection.
    pub(crate) const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("inference_descriptor");
}

use proto::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use proto::model_infer_response::InferOutputTensor;
use proto::model_metadata_response::TensorMetadata;
use proto::{InferParameter, InferTensorContents, infer_parameter::ParameterChoice};

/// The gRPC status code for each service error. Exhaustive: a new variant must be mapped here.
pub(crate) fn code_of(error: &ServiceError) -> Code {
    match error {
        ServiceError::InvalidInput { .. }
        | ServiceError::Malformed(_)
        | ServiceError::WrongKind { .. } => Code::InvalidArgument,
        // As HTTP's 400: the request itself, not the load, decides it, so no retry of it can succeed.
        ServiceError::DeadlineTooShort { .. } => Code::InvalidArgument,
        ServiceError::PayloadTooLarge { .. } | ServiceError::Overloaded { .. } => {
            Code::ResourceExhausted
        }
        ServiceError::ModelNotFound { .. }
        | ServiceError::VersionNotFound { .. }
        | ServiceError::PipelineNotFound { .. } => Code::NotFound,
        ServiceError::DeadlineExceeded { .. } | ServiceError::BodyTimeout { .. } => {
            Code::DeadlineExceeded
        }
        ServiceError::Unavailable(_) | ServiceError::TierUnavailable { .. } => Code::Unavailable,
        ServiceError::Unauthenticated(_) => Code::Unauthenticated,
        ServiceError::PermissionDenied(_) => Code::PermissionDenied,
        ServiceError::NotAllowed(_) => Code::FailedPrecondition,
        ServiceError::LoadFailed { .. } => Code::InvalidArgument,
        ServiceError::NonFiniteScore { .. } | ServiceError::Internal(_) => Code::Internal,
    }
}

/// The status sent for `error`; internal detail goes to the log, not to the client.
pub(crate) fn status(error: &ServiceError) -> Status {
    if let ServiceError::Internal(detail) = error {
        tracing::error!(%detail, "internal error");
    }
    Status::new(code_of(error), error.to_string())
}

/// Every gRPC service served, by full name.
const SERVICES: super::grpc_status::Services = &[
    proto::grpc_inference_service_server::SERVICE_NAME,
    tonic_health::pb::health_server::SERVICE_NAME,
    tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME,
    tonic_reflection::pb::v1alpha::server_reflection_server::SERVICE_NAME,
];

/// The gRPC routes: inference, health and reflection, behind [`super::grpc_status::check`]. Health starts
/// NOT_SERVING and follows the service's readiness from then on (a task that ends when the service is dropped).
/// `auth`: the inference tokens' check, if the server has tokens ([`crate::api::auth`]).
pub(crate) async fn routes(
    service: Arc<Service>,
    auth: Option<crate::api::auth::Auth>,
) -> Result<axum::Router, std::io::Error> {
    let health = super::health::server(Arc::clone(&service)).await;

    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_error = |e| std::io::Error::other(format!("gRPC reflection: {e}"));
    let reflection_v1 = reflection().build_v1().map_err(reflection_error)?;
    let reflection_v1alpha = reflection().build_v1alpha().map_err(reflection_error)?;

    let max_message = service.limits.max_body_bytes;
    let inference = GrpcInferenceServiceServer::new(Inference { service })
        .max_decoding_message_size(max_message);
    let mut routes = tonic::service::Routes::new(inference)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .prepare()
        .into_axum_router();
    if let Some(auth) = auth {
        routes = routes.layer(axum::middleware::from_fn_with_state(
            auth,
            crate::api::auth::grpc,
        ));
    }
    Ok(routes.layer(axum::middleware::from_fn_with_state(
        SERVICES,
        super::grpc_status::check,
    )))
}

/// Parses `grpc-timeout` (1 to 8 digits and a unit: H, M, S, m, u, n) into the time the client waits.
pub(crate) fn grpc_timeout(metadata: &MetadataMap) -> Result<Option<Duration>, ServiceError> {
    let Some(value) = metadata.get("grpc-timeout") else {
        return Ok(None);
    };
    let bad = || {
        ServiceError::invalid(
            "grpc-timeout",
            format!("must be 1 to 8 digits and a unit (H, M, S, m, u, n), got {value:?}"),
        )
    };
    let text = value.to_str().map_err(|_| bad())?;
    let split = text.len().checked_sub(1).ok_or_else(bad)?;
    let (digits, unit) = text.split_at_checked(split).ok_or_else(bad)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let timeout = match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return Err(bad()),
    };
    Ok(Some(timeout))
}

fn parameter(p: InferParameter) -> Option<Parameter> {
    Some(match p.parameter_choice? {
        ParameterChoice::BoolParam(b) => Parameter::Bool(b),
        ParameterChoice::Int64Param(i) => Parameter::Int64(i),
        ParameterChoice::StringParam(s) => Parameter::String(s),
        ParameterChoice::DoubleParam(d) => Parameter::Double(d),
        ParameterChoice::Uint64Param(u) => Parameter::Uint64(u),
    })
}

fn parameters(map: std::collections::HashMap<String, InferParameter>) -> Parameters {
    map.into_iter()
        .filter_map(|(k, v)| parameter(v).map(|p| (k, p)))
        .collect()
}

/// The typed contents of one input: exactly one field may be filled (none: empty data of the tensor's type).
fn typed(
    name: &str,
    datatype: &str,
    contents: InferTensorContents,
) -> Result<TensorData, ServiceError> {
    let InferTensorContents {
        bool_contents,
        int_contents,
        int64_contents,
        uint_contents,
        uint64_contents,
        fp32_contents,
        fp64_contents,
        bytes_contents,
    } = contents;
    let mut filled: Vec<Typed> = Vec::with_capacity(1);
    let mut add = |empty: bool, value: Typed| {
        if !empty {
            filled.push(value);
        }
    };
    add(bool_contents.is_empty(), Typed::Bool(bool_contents));
    add(int_contents.is_empty(), Typed::Int(int_contents));
    add(int64_contents.is_empty(), Typed::Int64(int64_contents));
    add(uint_contents.is_empty(), Typed::Uint(uint_contents));
    add(uint64_contents.is_empty(), Typed::Uint64(uint64_contents));
    add(fp32_contents.is_empty(), Typed::Fp32(fp32_contents));
    add(fp64_contents.is_empty(), Typed::Fp64(fp64_contents));
    add(bytes_contents.is_empty(), Typed::Bytes(bytes_contents));
    match filled.len() {
        0 => Ok(match Datatype::parse(datatype) {
            Some(Datatype::Bool) => TensorData::Typed(Typed::Bool(Vec::new())),
            Some(Datatype::Int8 | Datatype::Int16 | Datatype::Int32) => {
                TensorData::Typed(Typed::Int(Vec::new()))
            }
            Some(Datatype::Int64) => TensorData::Typed(Typed::Int64(Vec::new())),
            Some(Datatype::Uint8 | Datatype::Uint16 | Datatype::Uint32) => {
                TensorData::Typed(Typed::Uint(Vec::new()))
            }
            Some(Datatype::Uint64) => TensorData::Typed(Typed::Uint64(Vec::new())),
            Some(Datatype::Fp32) => TensorData::Typed(Typed::Fp32(Vec::new())),
            Some(Datatype::Fp64) => TensorData::Typed(Typed::Fp64(Vec::new())),
            Some(Datatype::Bytes) => TensorData::Typed(Typed::Bytes(Vec::new())),
            // FP16 and BF16 have no typed field: only raw contents carry them.
            Some(Datatype::Fp16 | Datatype::Bf16) | None => TensorData::Raw(Bytes::new()),
        }),
        1 => Ok(TensorData::Typed(filled.remove(0))),
        _ => Err(ServiceError::invalid(
            name,
            format!(
                "contents: fills {}: fill only the field of the tensor's datatype",
                filled
                    .iter()
                    .map(Typed::field)
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
        )),
    }
}

/// Decodes a `ModelInferRequest`; also says whether it used `raw_input_contents` (the response then uses
/// `raw_output_contents`, as tritonclient expects; typed `contents` otherwise).
pub(crate) fn decode(
    request: proto::ModelInferRequest,
) -> Result<(InferRequest, bool), ServiceError> {
    let raw = request.raw_input_contents;
    let use_raw = !raw.is_empty() || request.inputs.is_empty();
    if !raw.is_empty() && raw.len() != request.inputs.len() {
        return Err(ServiceError::invalid(
            "raw_input_contents",
            format!(
                "holds {} entries, but the request has {} inputs: give one per input, in the order of `inputs`",
                raw.len(),
                request.inputs.len()
            ),
        ));
    }
    let mut raw = raw.into_iter();
    let mut inputs = Vec::with_capacity(request.inputs.len());
    for input in request.inputs {
        let data = match (raw.next(), input.contents) {
            (Some(_), Some(contents)) if contents != InferTensorContents::default() => {
                return Err(ServiceError::invalid(
                    &input.name,
                    "has `contents` although the request uses raw_input_contents: use one or the other for every input",
                ));
            }
            (Some(bytes), _) => TensorData::Raw(bytes),
            (None, contents) => typed(&input.name, &input.datatype, contents.unwrap_or_default())?,
        };
        inputs.push(InputTensor {
            name: input.name,
            datatype: input.datatype,
            shape: input.shape,
            data,
        });
    }
    Ok((
        InferRequest {
            id: request.id,
            parameters: parameters(request.parameters),
            inputs,
            outputs: request.outputs.into_iter().map(|o| o.name).collect(),
        },
        use_raw,
    ))
}

/// Encodes a response: raw output contents, or typed contents.
pub(crate) fn encode(response: InferResponse, raw: bool) -> proto::ModelInferResponse {
    let mut raw_output_contents = Vec::new();
    let outputs = response
        .outputs
        .into_iter()
        .map(|o| {
            let datatype = o.data.datatype().as_str().to_owned();
            let contents = if raw {
                raw_output_contents.push(Bytes::from(o.data.to_le_bytes()));
                None
            } else {
                Some(match o.data {
                    OutputData::Int64(v) => InferTensorContents {
                        int64_contents: v,
                        ..InferTensorContents::default()
                    },
                    OutputData::Fp32(v) => InferTensorContents {
                        fp32_contents: v,
                        ..InferTensorContents::default()
                    },
                })
            };
            InferOutputTensor {
                name: o.name,
                datatype,
                shape: o.shape,
                parameters: Default::default(),
                contents,
            }
        })
        .collect();
    proto::ModelInferResponse {
        model_name: response.model_name,
        model_version: response.model_version,
        id: response.id,
        parameters: Default::default(),
        outputs,
        raw_output_contents,
    }
}

/// `inference.GRPCInferenceService` over the shared [`Service`].
#[derive(Debug, Clone)]
pub(crate) struct Inference {
    service: Arc<Service>,
}

impl Inference {
    /// The repository calls need the admin token in the `authorization` metadata.
    fn authorize(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let header = metadata.get("authorization").and_then(|v| v.to_str().ok());
        self.service.authorize_admin(header).map_err(|e| status(&e))
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for Inference {
    async fn server_live(
        &self,
        _request: Request<proto::ServerLiveRequest>,
    ) -> Result<Response<proto::ServerLiveResponse>, Status> {
        Ok(Response::new(proto::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _request: Request<proto::ServerReadyRequest>,
    ) -> Result<Response<proto::ServerReadyResponse>, Status> {
        Ok(Response::new(proto::ServerReadyResponse {
            ready: self.service.readiness() == Readiness::Ready,
        }))
    }

    async fn model_ready(
        &self,
        request: Request<proto::ModelReadyRequest>,
    ) -> Result<Response<proto::ModelReadyResponse>, Status> {
        let request = request.into_inner();
        self.service
            .model(&request.name, Some(&request.version))
            .map_err(|e| status(&e))?;
        Ok(Response::new(proto::ModelReadyResponse {
            ready: self.service.readiness() == Readiness::Ready,
        }))
    }

    async fn server_metadata(
        &self,
        _request: Request<proto::ServerMetadataRequest>,
    ) -> Result<Response<proto::ServerMetadataResponse>, Status> {
        Ok(Response::new(proto::ServerMetadataResponse {
            name: SERVER_NAME.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            extensions: EXTENSIONS.iter().map(|&e| e.to_owned()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<proto::ModelMetadataRequest>,
    ) -> Result<Response<proto::ModelMetadataResponse>, Status> {
        let request = request.into_inner();
        let served = self
            .service
            .model(&request.name, Some(&request.version))
            .map_err(|e| status(&e))?;
        let m = super::metadata(&served, self.service.versions(&served.name));
        let tensors = |specs: Vec<super::TensorSpec>| {
            specs
                .into_iter()
                .map(|t| TensorMetadata {
                    name: t.name,
                    datatype: t.datatype.as_str().to_owned(),
                    shape: t.shape,
                })
                .collect()
        };
        Ok(Response::new(proto::ModelMetadataResponse {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: tensors(m.inputs),
            outputs: tensors(m.outputs),
            properties: m.properties.into_iter().collect(),
        }))
    }

    async fn repository_index(
        &self,
        request: Request<proto::RepositoryIndexRequest>,
    ) -> Result<Response<proto::RepositoryIndexResponse>, Status> {
        self.authorize(request.metadata())?;
        let request = request.into_inner();
        let models = self
            .service
            .repository_index(request.ready)
            .map_err(|e| status(&e))?
            .into_iter()
            .map(|e| proto::repository_index_response::ModelIndex {
                name: e.name,
                version: e.version,
                state: e.state.to_owned(),
                reason: e.reason,
            })
            .collect();
        Ok(Response::new(proto::RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<proto::RepositoryModelLoadRequest>,
    ) -> Result<Response<proto::RepositoryModelLoadResponse>, Status> {
        self.authorize(request.metadata())?;
        let request = request.into_inner();
        if let Some(key) = request.parameters.keys().min() {
            return Err(status(&ServiceError::invalid(
                format!("parameters.{key}"),
                "is not supported: recserve loads the model as its repository holds it",
            )));
        }
        self.service
            .load_model(&request.model_name)
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(proto::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<proto::RepositoryModelUnloadRequest>,
    ) -> Result<Response<proto::RepositoryModelUnloadResponse>, Status> {
        self.authorize(request.metadata())?;
        let request = request.into_inner();
        self.service
            .unload_model(&request.model_name)
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(proto::RepositoryModelUnloadResponse {}))
    }

    async fn model_config(
        &self,
        request: Request<proto::ModelConfigRequest>,
    ) -> Result<Response<proto::ModelConfigResponse>, Status> {
        let request = request.into_inner();
        super::model_config::lookup(&self.service, &request.name, Some(&request.version))
            .map(|c| Response::new(super::model_config::to_proto(c)))
            .map_err(|e| status(&e))
    }

    async fn model_statistics(
        &self,
        request: Request<proto::ModelStatisticsRequest>,
    ) -> Result<Response<proto::ModelStatisticsResponse>, Status> {
        let request = request.into_inner();
        super::statistics::statistics(&self.service, Some(&request.name), Some(&request.version))
            .map(|s| Response::new(super::statistics::to_proto(s)))
            .map_err(|e| status(&e))
    }

    async fn model_infer(
        &self,
        request: Request<proto::ModelInferRequest>,
    ) -> Result<Response<proto::ModelInferResponse>, Status> {
        let arrival = trace::arrival();
        let (metadata, _, mut request) = request.into_parts();
        let model = std::mem::take(&mut request.model_name);
        let version = std::mem::take(&mut request.model_version);
        let envelope = ModelRequest {
            protocol: Protocol::Grpc,
            operation: Operation::Infer,
            model: &model,
            version: Some(&version),
            routing_key: metadata
                .get(crate::api::envelope::ROUTING_KEY)
                .and_then(|v| v.to_str().ok()),
            arrival,
            deadline: grpc_timeout(&metadata).map(|t| t.and_then(|t| arrival.checked_add(t))),
            deadline_in_body: true,
        };
        self.service
            .model_call(
                envelope,
                &mut Received::new(request),
                |mut call, request| async move {
                    let (request, raw) = decode(request)?;
                    call.set_body_deadline(super::timeout_parameter(&request.parameters, arrival)?);
                    let response = super::infer(&call, request).await?;
                    Ok(encode(response, raw))
                },
            )
            .await
            .map(Response::new)
            .map_err(|e| status(&e))
    }
}

#[cfg(test)]
mod tests {
    use tonic::metadata::MetadataValue;

    use super::*;

    #[test]
    fn every_error_maps_to_the_code_its_http_status_means() {
        let cases = [
            (ServiceError::invalid("t", "bad"), Code::InvalidArgument),
            (ServiceError::Malformed("x".into()), Code::InvalidArgument),
            (
                ServiceError::PayloadTooLarge { limit: 1 },
                Code::ResourceExhausted,
            ),
            (
                ServiceError::Overloaded {
                    model: "m".into(),
                    retry_after: Duration::from_secs(1),
                },
                Code::ResourceExhausted,
            ),
            (
                ServiceError::ModelNotFound {
                    model: "m".into(),
                    served: String::new(),
                },
                Code::NotFound,
            ),
            (
                ServiceError::DeadlineExceeded { model: "m".into() },
                Code::DeadlineExceeded,
            ),
            (
                ServiceError::BodyTimeout { ms: 200 },
                Code::DeadlineExceeded,
            ),
            (ServiceError::Unavailable("loading"), Code::Unavailable),
            (
                ServiceError::Internal("secret detail".into()),
                Code::Internal,
            ),
        ];
        for (error, code) in cases {
            let s = status(&error);
            assert_eq!(s.code(), code, "{error}");
            assert!(
                !s.message().contains("secret"),
                "internal detail leaked: {s:?}"
            );
        }
    }

    fn timeout(value: &str) -> Result<Option<Duration>, ServiceError> {
        let mut metadata = MetadataMap::new();
        metadata.insert(
            "grpc-timeout",
            MetadataValue::try_from(value).expect("ascii"),
        );
        grpc_timeout(&metadata)
    }

    #[test]
    fn parses_grpc_timeout() {
        assert_eq!(grpc_timeout(&MetadataMap::new()).expect("ok"), None);
        assert_eq!(
            timeout("250m").expect("ok"),
            Some(Duration::from_millis(250))
        );
        assert_eq!(timeout("3S").expect("ok"), Some(Duration::from_secs(3)));
        assert_eq!(timeout("2H").expect("ok"), Some(Duration::from_secs(7200)));
        assert_eq!(
            timeout("99999999n").expect("ok"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "m", "123456789m", "10x", "-1m", "1.5S"] {
            let err = timeout(bad).expect_err(bad).to_string();
            assert!(
                err.starts_with("grpc-timeout: must be 1 to 8 digits"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn raw_and_typed_requests_decode_alike_and_mixing_is_refused() {
        use proto::model_infer_request::InferInputTensor;
        let input = |contents: Option<InferTensorContents>| InferInputTensor {
            name: "categorical".into(),
            datatype: "INT64".into(),
            shape: vec![1, 2],
            parameters: Default::default(),
            contents,
        };
        let typed_request = proto::ModelInferRequest {
            inputs: vec![input(Some(InferTensorContents {
                int64_contents: vec![3, -4],
                ..Default::default()
            }))],
            ..Default::default()
        };
        let (typed_decoded, raw) = decode(typed_request).expect("typed");
        assert!(!raw, "typed in, typed out");
        let bytes: Vec<u8> = [3i64, -4].iter().flat_map(|v| v.to_le_bytes()).collect();
        let raw_request = proto::ModelInferRequest {
            inputs: vec![input(None)],
            raw_input_contents: vec![Bytes::from(bytes.clone())],
            ..Default::default()
        };
        let (raw_decoded, raw) = decode(raw_request).expect("raw");
        assert!(raw, "raw in, raw out");
        assert_eq!(
            typed_decoded.inputs[0].clone().into_i64().expect("ids"),
            raw_decoded.inputs[0].clone().into_i64().expect("ids")
        );

        let mixed = proto::ModelInferRequest {
            inputs: vec![input(Some(InferTensorContents {
                int64_contents: vec![3, -4],
                ..Default::default()
            }))],
            raw_input_contents: vec![Bytes::from(bytes.clone())],
            ..Default::default()
        };
        assert_eq!(
            decode(mixed).expect_err("mixed").to_string(),
            "categorical: has `contents` although the request uses raw_input_contents: use one or the other for every input"
        );
        let short = proto::ModelInferRequest {
            inputs: vec![input(None), input(None)],
            raw_input_contents: vec![Bytes::from(bytes)],
            ..Default::default()
        };
        assert!(
            decode(short)
                .expect_err("short")
                .to_string()
                .starts_with("raw_input_contents: holds 1 entries, but the request has 2 inputs"),
        );
        let two_fields = proto::ModelInferRequest {
            inputs: vec![input(Some(InferTensorContents {
                int64_contents: vec![3, -4],
                fp32_contents: vec![1.0],
                ..Default::default()
            }))],
            ..Default::default()
        };
        assert_eq!(
            decode(two_fields).expect_err("two fields").to_string(),
            "categorical: contents: fills int64_contents and fp32_contents: fill only the field of the tensor's datatype"
        );
    }

    #[test]
    fn responses_are_raw_or_typed() {
        let response = || InferResponse {
            model_name: "m".into(),
            model_version: "2".into(),
            id: "req-1".into(),
            outputs: vec![super::super::OutputTensor {
                name: "probability".into(),
                shape: vec![2, 1],
                data: OutputData::Fp32(vec![0.25, 0.75]),
            }],
        };
        let raw = encode(response(), true);
        assert_eq!(raw.id, "req-1");
        assert_eq!(raw.outputs[0].datatype, "FP32");
        assert_eq!(raw.outputs[0].shape, vec![2, 1]);
        assert_eq!(raw.outputs[0].contents, None);
        assert_eq!(
            raw.raw_output_contents,
            vec![Bytes::from(
                [0.25f32.to_le_bytes(), 0.75f32.to_le_bytes()].concat()
            )]
        );
        let typed = encode(response(), false);
        assert!(typed.raw_output_contents.is_empty());
        assert_eq!(
            typed.outputs[0]
                .contents
                .as_ref()
                .map(|c| c.fp32_contents.clone()),
            Some(vec![0.25, 0.75])
        );
    }
}
