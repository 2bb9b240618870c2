//! Triton's model configuration extension: `GET /v2/models/{model}[/versions/{version}]/config` here, gRPC
//! `ModelConfig` in [`super::grpc`]; both encode the [`ModelConfig`] that [`model_config`] reads off the served
//! model. Only what is true of recserve is filled: its tensors (as the metadata has them), its batching (the
//! batcher's `max_batch_rows`, buckets and queue delay), which version it serves and why, and its executors.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Map, Value, json};

use super::grpc::proto;
use super::{Datatype, TensorSpec};
use crate::api::envelope::{ModelPath, error_response};
use crate::service::{Model, ServedModel, Service};
use recserve_core::error::ServiceError;
use recserve_core::registry::Loadable;

/// The routes, for [`crate::api::router::router`] to mount.
pub(crate) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route("/v2/models/{model}/config", get(config))
        .route("/v2/models/{model}/versions/{version}/config", get(config))
}

use recserve_core::repository::VersionPolicy;

/// Where the executors run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InstanceKind {
    Cpu,
    Gpu(i32),
}

/// One input or output: its dims are the metadata's shape, without the batch axis when the model is batched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TensorConfig {
    pub(crate) name: String,
    pub(crate) datatype: Datatype,
    pub(crate) dims: Vec<i64>,
    pub(crate) optional: bool,
}

/// What the server runs a model with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ModelConfig {
    pub(crate) name: String,
    pub(crate) platform: String,
    pub(crate) backend: &'static str,
    pub(crate) version_policy: VersionPolicy,
    /// The batcher's `max_batch_rows` when every tensor has the batch axis first, else 0 (Triton's "no batch
    /// axis"): a recall model's `k` is one value per request.
    pub(crate) max_batch_size: usize,
    pub(crate) inputs: Vec<TensorConfig>,
    pub(crate) outputs: Vec<TensorConfig>,
    /// The batch buckets and the queue delay in µs, when requests are batched (`--batching on`).
    pub(crate) dynamic_batching: Option<(Vec<usize>, u64)>,
    pub(crate) instances: (usize, InstanceKind),
    /// What Triton's fields cannot say: `max_batch_rows` whatever `max_batch_size` is.
    pub(crate) parameters: BTreeMap<String, String>,
}

/// The configuration of a served model, under its version policy.
pub(crate) fn model_config(model: &ServedModel, policy: VersionPolicy) -> ModelConfig {
    let metadata = super::metadata(model, Vec::new());
    let batching = model.model.batching();
    let batched = metadata
        .inputs
        .iter()
        .chain(&metadata.outputs)
        .all(|t| t.shape.first() == Some(&-1));
    let optional: Vec<&str> = metadata
        .properties
        .get("optional_inputs")
        .map(|list| list.split(',').filter(|n| !n.is_empty()).collect())
        .unwrap_or_default();
    let tensors = |specs: &[TensorSpec]| -> Vec<TensorConfig> {
        specs
            .iter()
            .map(|t| TensorConfig {
                name: t.name.clone(),
                datatype: t.datatype,
                dims: if batched {
                    t.shape[1..].to_vec()
                } else {
                    t.shape.clone()
                },
                optional: optional.contains(&t.name.as_str()),
            })
            .collect()
    };
    let kind = match model
        .model
        .device()
        .strip_prefix("cuda:")
        .and_then(|n| n.parse().ok())
    {
        Some(ordinal) => InstanceKind::Gpu(ordinal),
        None => InstanceKind::Cpu,
    };
    let backend = match &model.model {
        Model::Ranking(_) => "onnxruntime",
        Model::Recall(_) => "recserve",
    };
    ModelConfig {
        name: model.name.clone(),
        platform: metadata.platform.clone(),
        backend,
        version_policy: policy,
        max_batch_size: if batched { batching.max_batch_rows } else { 0 },
        inputs: tensors(&metadata.inputs),
        outputs: tensors(&metadata.outputs),
        dynamic_batching: batching.enabled().then(|| {
            let delay = batching.max_queue_delay().as_micros();
            (
                batching.buckets.clone(),
                u64::try_from(delay).unwrap_or(u64::MAX),
            )
        }),
        instances: (model.model.executors(), kind),
        parameters: BTreeMap::from([(
            "max_batch_rows".to_owned(),
            batching.max_batch_rows.to_string(),
        )]),
    }
}

/// Triton's name of a datatype (`TYPE_FP32`; BYTES is `TYPE_STRING`).
fn type_name(datatype: Datatype) -> &'static str {
    match datatype {
        Datatype::Bool => "TYPE_BOOL",
        Datatype::Uint8 => "TYPE_UINT8",
        Datatype::Uint16 => "TYPE_UINT16",
        Datatype::Uint32 => "TYPE_UINT32",
        Datatype::Uint64 => "TYPE_UINT64",
        Datatype::Int8 => "TYPE_INT8",
        Datatype::Int16 => "TYPE_INT16",
        Datatype::Int32 => "TYPE_INT32",
        Datatype::Int64 => "TYPE_INT64",
        Datatype::Fp16 => "TYPE_FP16",
        Datatype::Bf16 => "TYPE_BF16",
        Datatype::Fp32 => "TYPE_FP32",
        Datatype::Fp64 => "TYPE_FP64",
        Datatype::Bytes => "TYPE_STRING",
    }
}

fn type_proto(datatype: Datatype) -> proto::DataType {
    match datatype {
        Datatype::Bool => proto::DataType::TypeBool,
        Datatype::Uint8 => proto::DataType::TypeUint8,
        Datatype::Uint16 => proto::DataType::TypeUint16,
        Datatype::Uint32 => proto::DataType::TypeUint32,
        Datatype::Uint64 => proto::DataType::TypeUint64,
        Datatype::Int8 => proto::DataType::TypeInt8,
        Datatype::Int16 => proto::DataType::TypeInt16,
        Datatype::Int32 => proto::DataType::TypeInt32,
        Datatype::Int64 => proto::DataType::TypeInt64,
        Datatype::Fp16 => proto::DataType::TypeFp16,
        Datatype::Bf16 => proto::DataType::TypeBf16,
        Datatype::Fp32 => proto::DataType::TypeFp32,
        Datatype::Fp64 => proto::DataType::TypeFp64,
        Datatype::Bytes => proto::DataType::TypeString,
    }
}

fn int32(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The configuration as Triton's HTTP endpoint writes it: its protobuf fields by name, numbers as numbers, enums
/// by name.
pub(crate) fn to_json(c: &ModelConfig) -> Value {
    let mut out = Map::new();
    out.insert("name".into(), json!(c.name));
    out.insert("platform".into(), json!(c.platform));
    out.insert("backend".into(), json!(c.backend));
    out.insert(
        "version_policy".into(),
        match &c.version_policy {
            VersionPolicy::Latest(n) => json!({"latest": {"num_versions": n}}),
            VersionPolicy::Specific(v) => json!({"specific": {"versions": v}}),
        },
    );
    out.insert("max_batch_size".into(), json!(c.max_batch_size));
    let input: Vec<Value> = c
        .inputs
        .iter()
        .map(|t| {
            json!({"name": t.name, "data_type": type_name(t.datatype), "dims": t.dims, "optional": t.optional})
        })
        .collect();
    let output: Vec<Value> = c
        .outputs
        .iter()
        .map(|t| json!({"name": t.name, "data_type": type_name(t.datatype), "dims": t.dims}))
        .collect();
    out.insert("input".into(), json!(input));
    out.insert("output".into(), json!(output));
    if let Some((preferred, delay)) = &c.dynamic_batching {
        out.insert(
            "dynamic_batching".into(),
            json!({"preferred_batch_size": preferred, "max_queue_delay_microseconds": delay}),
        );
    }
    let (count, kind) = c.instances;
    let group = match kind {
        InstanceKind::Cpu => json!({"name": c.name, "kind": "KIND_CPU", "count": count}),
        InstanceKind::Gpu(ordinal) => {
            json!({"name": c.name, "kind": "KIND_GPU", "count": count, "gpus": [ordinal]})
        }
    };
    out.insert("instance_group".into(), json!([group]));
    let parameters: Map<String, Value> = c
        .parameters
        .iter()
        .map(|(k, v)| (k.clone(), json!({"string_value": v})))
        .collect();
    out.insert("parameters".into(), Value::Object(parameters));
    Value::Object(out)
}

/// `ModelConfigResponse`.
pub(crate) fn to_proto(c: ModelConfig) -> proto::ModelConfigResponse {
    use proto::model_instance_group::Kind;
    use proto::model_version_policy::{Latest, PolicyChoice, Specific};
    let version_policy = proto::ModelVersionPolicy {
        policy_choice: Some(match &c.version_policy {
            VersionPolicy::Latest(n) => PolicyChoice::Latest(Latest {
                num_versions: u32::try_from(*n).unwrap_or(u32::MAX),
            }),
            VersionPolicy::Specific(v) => PolicyChoice::Specific(Specific {
                versions: v
                    .iter()
                    .map(|&v| i64::try_from(v).unwrap_or(i64::MAX))
                    .collect(),
            }),
        }),
    };
    let (count, kind) = c.instances;
    let (kind, gpus) = match kind {
        InstanceKind::Cpu => (Kind::Cpu, Vec::new()),
        InstanceKind::Gpu(ordinal) => (Kind::Gpu, vec![ordinal]),
    };
    proto::ModelConfigResponse {
        config: Some(proto::ModelConfig {
            name: c.name.clone(),
            platform: c.platform,
            version_policy: Some(version_policy),
            max_batch_size: int32(c.max_batch_size),
            input: c
                .inputs
                .into_iter()
                .map(|t| proto::ModelInput {
                    name: t.name,
                    data_type: type_proto(t.datatype).into(),
                    dims: t.dims,
                    optional: t.optional,
                })
                .collect(),
            output: c
                .outputs
                .into_iter()
                .map(|t| proto::ModelOutput {
                    name: t.name,
                    data_type: type_proto(t.datatype).into(),
                    dims: t.dims,
                })
                .collect(),
            instance_group: vec![proto::ModelInstanceGroup {
                name: c.name,
                count: int32(count),
                gpus,
                kind: kind.into(),
            }],
            dynamic_batching: c.dynamic_batching.map(|(preferred, delay)| {
                proto::ModelDynamicBatching {
                    preferred_batch_size: preferred.into_iter().map(int32).collect(),
                    max_queue_delay_microseconds: delay,
                }
            }),
            parameters: c
                .parameters
                .into_iter()
                .map(|(k, v)| (k, proto::ModelParameter { string_value: v }))
                .collect(),
            backend: c.backend.to_owned(),
        }),
    }
}

/// The configuration of `model` at `version` (the served one when `None` or empty).
pub(crate) fn lookup(
    service: &Service,
    model: &str,
    version: Option<&str>,
) -> Result<ModelConfig, ServiceError> {
    let served = service.model(model, version)?;
    Ok(model_config(&served, service.version_policy(&served.name)))
}

async fn config(State(service): State<Arc<Service>>, path: ModelPath) -> Response {
    match lookup(&service, &path.model, path.version.as_deref()) {
        Ok(c) => axum::Json(to_json(&c)).into_response(),
        Err(e) => error_response(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranking() -> ModelConfig {
        ModelConfig {
            name: "deepfm".into(),
            platform: "recserve_deepfm".into(),
            backend: "onnxruntime",
            version_policy: VersionPolicy::Specific(vec![2]),
            max_batch_size: 1024,
            inputs: vec![TensorConfig {
                name: "categorical".into(),
                datatype: Datatype::Int64,
                dims: vec![26],
                optional: false,
            }],
            outputs: vec![TensorConfig {
                name: "probability".into(),
                datatype: Datatype::Fp32,
                dims: vec![1],
                optional: false,
            }],
            dynamic_batching: Some((vec![1, 2, 1024], 500)),
            instances: (2, InstanceKind::Gpu(1)),
            parameters: BTreeMap::from([("max_batch_rows".into(), "1024".into())]),
        }
    }

    #[test]
    fn json_names_fields_and_enums_as_triton_does() {
        let json = to_json(&ranking());
        assert_eq!(json["backend"], "onnxruntime");
        assert_eq!(
            json["version_policy"],
            json!({"specific": {"versions": [2]}})
        );
        assert_eq!(json["max_batch_size"], 1024);
        assert_eq!(
            json["input"][0],
            json!({"name": "categorical", "data_type": "TYPE_INT64", "dims": [26], "optional": false})
        );
        assert_eq!(json["output"][0]["data_type"], "TYPE_FP32");
        assert_eq!(
            json["dynamic_batching"],
            json!({"preferred_batch_size": [1, 2, 1024], "max_queue_delay_microseconds": 500})
        );
        assert_eq!(
            json["instance_group"],
            json!([{"name": "deepfm", "kind": "KIND_GPU", "count": 2, "gpus": [1]}])
        );
        assert_eq!(
            json["parameters"],
            json!({"max_batch_rows": {"string_value": "1024"}})
        );
        let mut unbatched = ranking();
        unbatched.dynamic_batching = None;
        unbatched.version_policy = VersionPolicy::Latest(1);
        let json = to_json(&unbatched);
        assert!(json.get("dynamic_batching").is_none());
        assert_eq!(
            json["version_policy"],
            json!({"latest": {"num_versions": 1}})
        );
    }

    #[test]
    fn proto_carries_the_same_configuration() {
        let p = to_proto(ranking()).config.expect("config");
        assert_eq!(
            (p.max_batch_size, p.backend.as_str()),
            (1024, "onnxruntime")
        );
        assert_eq!(p.input[0].data_type, proto::DataType::TypeInt64 as i32);
        assert_eq!(p.input[0].dims, vec![26]);
        assert_eq!(
            p.instance_group[0].kind,
            proto::model_instance_group::Kind::Gpu as i32
        );
        assert_eq!(p.instance_group[0].gpus, vec![1]);
        let batching = p.dynamic_batching.expect("dynamic_batching");
        assert_eq!(batching.preferred_batch_size, vec![1, 2, 1024]);
        assert_eq!(batching.max_queue_delay_microseconds, 500);
        assert_eq!(
            p.version_policy.and_then(|v| v.policy_choice),
            Some(proto::model_version_policy::PolicyChoice::Specific(
                proto::model_version_policy::Specific { versions: vec![2] }
            ))
        );
    }
}
