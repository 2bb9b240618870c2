//! Transports. Each decodes its protocol into the typed inputs of [`crate::service::Service`] and encodes the
//! results; no logic is written twice per protocol.

pub mod grpc;
pub mod http;
pub mod http_recall;
pub mod kserve;
pub mod rank_body;
pub mod rank_reference;
pub mod v1;
pub mod v1_recall;

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

/// The small DeepFM contract the transports' decoding tests share.
#[cfg(test)]
pub(crate) mod test_contract {
    use std::sync::Arc;

    use crate::ranking::RankContract;
    use crate::repository::ModelSpec;

    /// Fields in model.toml order: u (user, reject, 10 rows), item (item, default), cat (item, reject, 5 rows).
    pub const SPEC: &str = r#"
format_version = 1
kind = "deepfm"
[ranking]
dense_features = ["d0", "d1"]
item_id_field = "item"
[dense_graph]
file = "g.onnx"
precision = "fp32"
output = "ctr"
[[tables]]
name = "u"
file = "t.safetensors"
rows = 10
dim = 3
storage = "fp32"
oov = "reject"
[[tables]]
name = "item"
file = "t.safetensors"
rows = 100
dim = 3
storage = "fp32"
[[tables]]
name = "cat"
file = "t.safetensors"
rows = 5
dim = 3
storage = "fp32"
oov = "reject"
[[fields]]
name = "u"
side = "user"
[[fields]]
name = "item"
side = "item"
[[fields]]
name = "cat"
side = "item"
"#;

    pub fn contract() -> RankContract {
        RankContract::new(Arc::new(ModelSpec::parse(SPEC).expect("spec")), 3)
    }
}
