//! The KServe v2 HTTP routes (`/v2/...`): health, server and model metadata, and inference with JSON tensors or
//! the binary tensor data extension (`Inference-Header-Content-Length`, `binary_data_size`, `binary_data`,
//! `binary_data_output`) in both directions. Decoding and encoding only: the rest is [`super::infer`].

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{
    EXTENSIONS, InferRequest, InferResponse, InputTensor, ModelMetadata, OutputData, Parameter,
    Parameters, SERVER_NAME, TensorData, TensorSpec,
};
use crate::api::envelope::{HttpBody, ModelPath, error_response, parse_json};
use crate::service::{Operation, Protocol, Readiness, Service};
use recserve_core::error::ServiceError;

/// The header giving the length of the JSON part of a body that carries binary tensors after it.
pub(crate) const HEADER_LENGTH: &str = "inference-header-content-length";

/// The `/v2` routes, for [`crate::api::router::router`] to mount.
pub(crate) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2/models/{model}", get(model_metadata))
        .route("/v2/models/{model}/versions/{version}", get(model_metadata))
        .route("/v2/models/{model}/ready", get(model_ready))
        .route(
            "/v2/models/{model}/versions/{version}/ready",
            get(model_ready),
        )
        .route("/v2/models/{model}/infer", post(infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(infer))
}

async fn server_metadata() -> Response {
    axum::Json(json!({
        "name": SERVER_NAME,
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": EXTENSIONS,
    }))
    .into_response()
}

async fn live() -> Response {
    axum::Json(json!({ "live": true })).into_response()
}

async fn ready(State(service): State<Arc<Service>>) -> Response {
    let ready = service.readiness() == Readiness::Ready;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(json!({ "ready": ready }))).into_response()
}

/// Model metadata as JSON. `columns` is a recserve addition that clients unaware of it ignore: what each position
/// of the last axis holds. `properties` is the protocol's (optional, omitted when empty).
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct MetadataJson {
    pub(crate) name: String,
    pub(crate) versions: Vec<String>,
    pub(crate) platform: String,
    pub(crate) inputs: Vec<TensorMetadataJson>,
    pub(crate) outputs: Vec<TensorMetadataJson>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) properties: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct TensorMetadataJson {
    pub(crate) name: String,
    pub(crate) datatype: String,
    pub(crate) shape: Vec<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) columns: Vec<String>,
}

impl From<ModelMetadata> for MetadataJson {
    fn from(m: ModelMetadata) -> MetadataJson {
        let tensors = |specs: Vec<TensorSpec>| {
            specs
                .into_iter()
                .map(|t| TensorMetadataJson {
                    name: t.name,
                    datatype: t.datatype.as_str().to_owned(),
                    shape: t.shape,
                    columns: t.columns,
                })
                .collect()
        };
        MetadataJson {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: tensors(m.inputs),
            outputs: tensors(m.outputs),
            properties: m.properties,
        }
    }
}

async fn model_metadata(State(service): State<Arc<Service>>, path: ModelPath) -> Response {
    match service.model(&path.model, path.version.as_deref()) {
        Ok(served) => {
            let versions = service.versions(&served.name);
            axum::Json(MetadataJson::from(super::metadata(&served, versions))).into_response()
        }
        Err(e) => error_response(&e),
    }
}

/// Whether the model (and, when given, that version) is ready: served, and the server not draining.
async fn model_ready(State(service): State<Arc<Service>>, path: ModelPath) -> Response {
    match service.model(&path.model, path.version.as_deref()) {
        Ok(_) if service.readiness() == Readiness::Ready => {
            axum::Json(json!({ "name": path.model, "ready": true })).into_response()
        }
        Ok(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "name": path.model, "ready": false })),
        )
            .into_response(),
        Err(e) => error_response(&e),
    }
}

/// `$inference_request`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestJson {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Map<String, Value>,
    inputs: Vec<InputJson>,
    #[serde(default)]
    outputs: Vec<OutputJson>,
}

/// `$request_input`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputJson {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Map<String, Value>,
    #[serde(default)]
    data: Option<Value>,
}

/// `$request_output`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: Map<String, Value>,
}

/// Which outputs a request wants as binary data.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct BinaryOutputs {
    /// For outputs without their own `binary_data`: the request's `binary_data_output`.
    pub(crate) default: bool,
    /// Outputs that set `binary_data`, by name.
    pub(crate) by_name: Vec<(String, bool)>,
}

impl BinaryOutputs {
    pub(crate) fn is_binary(&self, output: &str) -> bool {
        self.by_name
            .iter()
            .find(|(name, _)| name == output)
            .map_or(self.default, |&(_, binary)| binary)
    }
}

fn parameter(path: &str, value: Value) -> Result<Parameter, ServiceError> {
    match value {
        Value::Bool(b) => Ok(Parameter::Bool(b)),
        Value::String(s) => Ok(Parameter::String(s)),
        Value::Number(n) => Ok(n
            .as_i64()
            .map(Parameter::Int64)
            .or_else(|| n.as_u64().map(Parameter::Uint64))
            .unwrap_or_else(|| Parameter::Double(n.as_f64().unwrap_or(f64::NAN)))),
        Value::Null | Value::Array(_) | Value::Object(_) => Err(ServiceError::invalid(
            path,
            "must be a boolean, a number or a string",
        )),
    }
}

fn parameters(path: &str, map: Map<String, Value>) -> Result<Parameters, ServiceError> {
    map.into_iter()
        .map(|(key, value)| {
            let p = parameter(&format!("{path}.{key}"), value)?;
            Ok((key, p))
        })
        .collect()
}

fn flag(parameters: &Parameters, path: &str, key: &str) -> Result<Option<bool>, ServiceError> {
    match parameters.get(key) {
        None => Ok(None),
        Some(Parameter::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(ServiceError::invalid(
            format!("{path}.{key}"),
            format!("must be true or false, got {other}"),
        )),
    }
}

/// Splits a body into its JSON header and the binary tensor data after it. The header must be given once: two
/// lengths would split the body two ways.
fn split_body(headers: &HeaderMap, body: Bytes) -> Result<(Bytes, Bytes), ServiceError> {
    let given = headers.get_all(HEADER_LENGTH).iter().count();
    if given > 1 {
        return Err(ServiceError::invalid(
            "Inference-Header-Content-Length",
            format!("is given {given} times: send it once"),
        ));
    }
    let Some(value) = headers.get(HEADER_LENGTH) else {
        return Ok((body, Bytes::new()));
    };
    let length = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .ok_or_else(|| {
            ServiceError::invalid(
                "Inference-Header-Content-Length",
                format!("must be a whole number of bytes, got {value:?}"),
            )
        })?;
    if length > body.len() {
        return Err(ServiceError::invalid(
            "Inference-Header-Content-Length",
            format!(
                "{length} is beyond the end of the body ({} bytes)",
                body.len()
            ),
        ));
    }
    let mut json = body;
    let binary = json.split_off(length);
    Ok((json, binary))
}

/// Decodes an inference request body (JSON, or JSON followed by binary tensors).
pub(crate) fn decode(
    headers: &HeaderMap,
    body: Bytes,
) -> Result<(InferRequest, BinaryOutputs), ServiceError> {
    let has_binary_header = headers.contains_key(HEADER_LENGTH);
    let (json, mut binary) = split_body(headers, body)?;
    let raw: RequestJson = parse_json(&json)?;
    let request_parameters = parameters("parameters", raw.parameters)?;
    let binary_default =
        flag(&request_parameters, "parameters", "binary_data_output")?.unwrap_or(false);

    let mut inputs = Vec::with_capacity(raw.inputs.len());
    for input in raw.inputs {
        let tensor_parameters =
            parameters(&format!("{}.parameters", input.name), input.parameters)?;
        let size = match tensor_parameters.get("binary_data_size") {
            None => None,
            Some(Parameter::Int64(n)) if *n >= 0 => Some(n.unsigned_abs()),
            Some(Parameter::Uint64(n)) => Some(*n),
            Some(other) => {
                return Err(ServiceError::invalid(
                    &input.name,
                    format!(
                        "parameters.binary_data_size must be a whole number of bytes, got {other}"
                    ),
                ));
            }
        };
        let data = match (size, input.data) {
            (Some(_), Some(_)) => {
                return Err(ServiceError::invalid(
                    &input.name,
                    "has both `data` and parameters.binary_data_size: send one",
                ));
            }
            (None, None) => {
                return Err(ServiceError::invalid(
                    &input.name,
                    "has no data: give `data`, or parameters.binary_data_size with the bytes after the JSON",
                ));
            }
            (None, Some(value)) => TensorData::Json(value),
            (Some(_), None) if !has_binary_header => {
                return Err(ServiceError::invalid(
                    &input.name,
                    "parameters.binary_data_size needs the Inference-Header-Content-Length header",
                ));
            }
            (Some(size), None) => {
                let size = usize::try_from(size).unwrap_or(usize::MAX);
                if size > binary.len() {
                    return Err(ServiceError::invalid(
                        &input.name,
                        format!(
                            "binary_data_size {size} reaches beyond the end of the body ({} bytes of binary data left)",
                            binary.len()
                        ),
                    ));
                }
                let rest = binary.split_off(size);
                TensorData::Raw(std::mem::replace(&mut binary, rest))
            }
        };
        inputs.push(InputTensor {
            name: input.name,
            datatype: input.datatype,
            shape: input.shape,
            data,
        });
    }
    if !binary.is_empty() {
        return Err(ServiceError::invalid(
            "Inference-Header-Content-Length",
            format!(
                "the body holds {} bytes after the binary data of the inputs",
                binary.len()
            ),
        ));
    }

    let mut outputs = Vec::with_capacity(raw.outputs.len());
    let mut binary_flags = Vec::new();
    for output in raw.outputs {
        let output_parameters =
            parameters(&format!("{}.parameters", output.name), output.parameters)?;
        if let Some(b) = flag(&output_parameters, &output.name, "binary_data")? {
            binary_flags.push((output.name.clone(), b));
        }
        outputs.push(output.name);
    }
    Ok((
        InferRequest {
            id: raw.id.unwrap_or_default(),
            parameters: request_parameters,
            inputs,
            outputs,
        },
        BinaryOutputs {
            default: binary_default,
            by_name: binary_flags,
        },
    ))
}

#[derive(Serialize)]
struct ResponseJson<'a> {
    model_name: &'a str,
    model_version: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
    outputs: Vec<ResponseOutputJson<'a>>,
}

#[derive(Serialize)]
struct ResponseOutputJson<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [i64],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<DataJson<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum DataJson<'a> {
    Int64(&'a [i64]),
    Fp32(&'a [f32]),
}

/// Encodes a response: JSON, followed by the binary outputs when any output is binary.
pub(crate) fn encode(
    response: &InferResponse,
    binary_outputs: &BinaryOutputs,
) -> Result<Response, ServiceError> {
    let mut binary = Vec::new();
    let outputs = response
        .outputs
        .iter()
        .map(|o| {
            let (parameters, data) = if binary_outputs.is_binary(&o.name) {
                let bytes = o.data.to_le_bytes();
                let size = bytes.len();
                binary.extend_from_slice(&bytes);
                (Some(json!({ "binary_data_size": size })), None)
            } else {
                let data = match &o.data {
                    OutputData::Int64(v) => DataJson::Int64(v),
                    OutputData::Fp32(v) => DataJson::Fp32(v),
                };
                (None, Some(data))
            };
            ResponseOutputJson {
                name: &o.name,
                datatype: o.data.datatype().as_str(),
                shape: &o.shape,
                parameters,
                data,
            }
        })
        .collect();
    let json = serde_json::to_vec(&ResponseJson {
        model_name: &response.model_name,
        model_version: &response.model_version,
        id: &response.id,
        outputs,
    })
    .map_err(|e| ServiceError::Internal(format!("encode the response: {e}")))?;
    if binary.is_empty() {
        return Ok(([(header::CONTENT_TYPE, "application/json")], json).into_response());
    }
    let header_length = HeaderValue::from(json.len());
    let mut body = json;
    body.extend_from_slice(&binary);
    let mut response = ([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response();
    response.headers_mut().insert(HEADER_LENGTH, header_length);
    Ok(response)
}

async fn infer(
    State(service): State<Arc<Service>>,
    path: ModelPath,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let request = path.request(Protocol::V2Http, Operation::Infer, &headers, true);
    let arrival = request.arrival;
    let mut body = HttpBody::new(&headers, body, service.limits.max_body_bytes);
    let headers_ref = &headers;
    let result = service
        .model_call(request, &mut body, |mut call, body| async move {
            let (request, binary_outputs) = decode(headers_ref, body)?;
            call.set_body_deadline(super::timeout_parameter(&request.parameters, arrival)?);
            let response = super::infer(&call, request).await?;
            encode(&response, &binary_outputs)
        })
        .await;
    body.respond(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::kserve::OutputTensor;

    fn headers(length: Option<usize>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(n) = length {
            h.insert(HEADER_LENGTH, HeaderValue::from(n));
        }
        h
    }

    /// A body of `json` followed by `binary`, with the header giving the JSON's length.
    fn binary_body(json: &str, binary: &[u8]) -> (HeaderMap, Bytes) {
        let mut body = json.as_bytes().to_vec();
        body.extend_from_slice(binary);
        (headers(Some(json.len())), Bytes::from(body))
    }

    fn message(result: Result<impl std::fmt::Debug, ServiceError>) -> String {
        result.expect_err("must be refused").to_string()
    }

    #[test]
    fn splits_binary_tensors_in_input_order() {
        let a: Vec<u8> = [1i64, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
        let b: Vec<u8> = [0.5f32].iter().flat_map(|v| v.to_le_bytes()).collect();
        let json = r#"{"id": "r1", "inputs": [
            {"name": "a", "shape": [1, 2], "datatype": "INT64", "parameters": {"binary_data_size": 16}},
            {"name": "j", "shape": [1], "datatype": "INT64", "data": [7]},
            {"name": "b", "shape": [1, 1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}],
            "outputs": [{"name": "x", "parameters": {"binary_data": false}}, {"name": "y"}],
            "parameters": {"binary_data_output": true, "priority": 3}}"#;
        let (h, body) = binary_body(json, &[a.clone(), b.clone()].concat());
        let (request, binary) = decode(&h, body).expect("valid");
        assert_eq!(request.id, "r1");
        assert_eq!(request.inputs[0].data, TensorData::Raw(Bytes::from(a)));
        assert_eq!(request.inputs[1].data, TensorData::Json(json!([7])));
        assert_eq!(request.inputs[2].data, TensorData::Raw(Bytes::from(b)));
        assert_eq!(request.outputs, ["x", "y"]);
        assert_eq!(
            request.parameters.get("priority"),
            Some(&Parameter::Int64(3))
        );
        assert!(
            !binary.is_binary("x"),
            "binary_data: false overrides binary_data_output"
        );
        assert!(
            binary.is_binary("y"),
            "binary_data_output applies to the rest"
        );
    }

    #[test]
    fn names_the_problem_of_every_bad_body() {
        let one = |params: &str| {
            format!(
                r#"{{"inputs": [{{"name": "ids", "shape": [2], "datatype": "INT64"{params}}}]}}"#
            )
        };
        let sized = one(r#", "parameters": {"binary_data_size": 16}"#);
        let cases: Vec<(HeaderMap, Bytes, &str)> = vec![
            (
                headers(Some(500)),
                Bytes::from(sized.clone()),
                "Inference-Header-Content-Length: 500 is beyond the end of the body",
            ),
            (
                {
                    let mut h = HeaderMap::new();
                    h.insert(HEADER_LENGTH, HeaderValue::from_static("ten"));
                    h
                },
                Bytes::from(sized.clone()),
                "Inference-Header-Content-Length: must be a whole number of bytes, got \"ten\"",
            ),
            (
                binary_body(&sized, &[0; 8]).0,
                binary_body(&sized, &[0; 8]).1,
                "ids: binary_data_size 16 reaches beyond the end of the body (8 bytes of binary data left)",
            ),
            (
                binary_body(&sized, &[0; 20]).0,
                binary_body(&sized, &[0; 20]).1,
                "Inference-Header-Content-Length: the body holds 4 bytes after the binary data of the inputs",
            ),
            (
                headers(None),
                Bytes::from(sized.clone()),
                "ids: parameters.binary_data_size needs the Inference-Header-Content-Length header",
            ),
            (
                headers(None),
                Bytes::from(one(r#", "parameters": {"binary_data_size": -1}"#)),
                "ids: parameters.binary_data_size must be a whole number of bytes",
            ),
            (headers(None), Bytes::from(one("")), "ids: has no data"),
            (
                headers(None),
                Bytes::from(one(
                    r#", "data": [1, 2], "parameters": {"binary_data_size": 16}"#,
                )),
                "ids: has both `data` and parameters.binary_data_size",
            ),
            (
                headers(None),
                Bytes::from(r#"{"inputs": [], "parameters": {"binary_data_output": 1}}"#),
                "parameters.binary_data_output: must be true or false",
            ),
            (
                headers(None),
                Bytes::from(r#"{"inputs": [], "parameters": {"x": null}}"#),
                "parameters.x: must be a boolean, a number or a string",
            ),
            (
                headers(None),
                Bytes::from(
                    r#"{"inputs": [{"name": "ids", "shape": "2", "datatype": "INT64", "data": []}]}"#,
                ),
                "inputs[0].shape: invalid type",
            ),
            (
                headers(None),
                Bytes::from(r#"{"inputs": [], "input": []}"#),
                "input: unknown field `input`",
            ),
            (headers(None), Bytes::from("{"), "malformed request body"),
            (
                headers(None),
                Bytes::from(one(r#", "data": [1, Infinity]"#)),
                "inputs[0].data[1]: Infinity is not a number JSON can carry",
            ),
            (
                headers(None),
                Bytes::from(r#"{"inputs": [], "parameters": {"timeout": 1e400}}"#),
                "parameters.timeout: 1e400 is beyond the range of 64-bit floating point",
            ),
            (
                {
                    let mut h = headers(Some(sized.len()));
                    h.append(HEADER_LENGTH, HeaderValue::from(5));
                    h
                },
                Bytes::from(sized.clone()),
                "Inference-Header-Content-Length: is given 2 times: send it once",
            ),
        ];
        for (h, body, expected) in cases {
            let got = message(decode(&h, body));
            assert!(
                got.starts_with(expected),
                "expected {expected:?}\ngot      {got:?}"
            );
        }
    }

    #[test]
    fn encodes_json_and_binary_outputs() {
        let response = InferResponse {
            model_name: "m".into(),
            model_version: "2".into(),
            id: String::new(),
            outputs: vec![
                OutputTensor {
                    name: "p".into(),
                    shape: vec![2, 1],
                    data: OutputData::Fp32(vec![0.1, 0.75]),
                },
                OutputTensor {
                    name: "ids".into(),
                    shape: vec![1],
                    data: OutputData::Int64(vec![-3]),
                },
            ],
        };
        let json_only = encode(&response, &BinaryOutputs::default()).expect("encode");
        assert!(json_only.headers().get(HEADER_LENGTH).is_none());
        let mixed = encode(
            &response,
            &BinaryOutputs {
                default: false,
                by_name: vec![("ids".into(), true)],
            },
        )
        .expect("encode");
        let length: usize = mixed
            .headers()
            .get(HEADER_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .expect("Inference-Header-Content-Length");
        let body = futures_body(mixed);
        let header: Value = serde_json::from_slice(&body[..length]).expect("JSON header");
        assert_eq!(
            header,
            json!({"model_name": "m", "model_version": "2", "outputs": [
                {"name": "p", "datatype": "FP32", "shape": [2, 1], "data": [0.1, 0.75]},
                {"name": "ids", "datatype": "INT64", "shape": [1], "parameters": {"binary_data_size": 8}}]})
        );
        assert_eq!(&body[length..], (-3i64).to_le_bytes());
    }

    fn futures_body(response: Response) -> Bytes {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        runtime
            .block_on(axum::body::to_bytes(response.into_body(), usize::MAX))
            .expect("body")
    }
}
