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
