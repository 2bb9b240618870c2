//! Where requests go: the [`Target`] trait is everything the single worker loop needs from a protocol (open a
//! connection, send one prepared request, tell success from failure), so HTTP (JSON or KServe v2) and KServe v2
//! gRPC share that loop, its timing and its accounting. [`http::HttpTarget`] is the HTTP/1.1 implementation,
//! [`grpc::GrpcTarget`] the gRPC one; both build KServe v2 tensors with [`tensors`].

pub mod grpc;
pub mod http;
pub mod tensors;
pub mod tls;

use std::future::Future;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::stats::ErrorKind;
use crate::workload::Request;

pub use grpc::GrpcTarget;
pub use http::{Envelope, HttpTarget};
pub use tensors::TensorLayout;
pub use tls::{Access, TlsClient, TlsFiles};

/// Why one request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Failure {
    /// The server answered, with a status other than 2xx. `body` is the start of its answer, for messages.
    #[error("HTTP {status}: {body}")]
    Status { status: u16, body: String },
    /// No connection could be opened.
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    /// The connection failed while the request was in flight.
    #[error("connection failed: {0}")]
    Connection(String),
    /// The server answered a gRPC call with a status other than OK.
    #[error("gRPC {code:?}: {message}")]
    Grpc { code: tonic::Code, message: String },
    /// The server answered with success, but not with what was asked (e.g. not one score per candidate).
    #[error("wrong answer: {0}")]
    Answer(String),
}

impl Failure {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Failure::Status { status, .. } => ErrorKind::Status(*status),
            Failure::Connect { .. } => ErrorKind::Connect,
            Failure::Connection(_) => ErrorKind::Connection,
            Failure::Grpc { code, .. } => ErrorKind::Grpc(*code as i32),
            Failure::Answer(_) => ErrorKind::WrongAnswer,
        }
    }

    /// The connection cannot carry another request after this failure.
    pub fn breaks_connection(&self) -> bool {
        match self {
            Failure::Status { .. } | Failure::Grpc { .. } | Failure::Answer(_) => false,
            Failure::Connect { .. } | Failure::Connection(_) => true,
        }
    }
}

/// What a report says about the target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetInfo {
    pub url: String,
    /// `http-json` (the body as the workload made it), `kserve-v2-bytes` (wrapped in a KServe v2 request),
    /// `kserve-v2-tensors` or `kserve-v2-grouped-batched` (rewritten into the model's KServe v2 tensors), or
    /// `kserve-v2-grpc` (the model's KServe v2 tensors over gRPC).
    pub protocol: String,
    /// The KServe v2 model the request is sent to, for every `kserve-v2-*` protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v2_model: Option<String>,
}

/// A server reached through one protocol.
pub trait Target: Send + Sync + 'static {
    /// One connection (a worker owns one at a time).
    type Conn: Send + 'static;
    /// A request in this target's wire form, built before the run.
    type Prepared: Send + Sync + 'static;

    fn info(&self) -> TargetInfo;

    /// Turns a workload request into this target's wire form (done for the whole pool before the run).
    fn prepare(&self, request: &Request) -> Self::Prepared;

    fn connect(&self) -> impl Future<Output = Result<Self::Conn, Failure>> + Send;

    /// Whether `conn` can still carry a request (the server may have closed it).
    fn is_open(&self, conn: &Self::Conn) -> bool;

    /// Sends one request and waits for the whole answer; `Ok` holds the body of a 2xx answer.
    fn send(
        &self,
        conn: &mut Self::Conn,
        request: &Self::Prepared,
    ) -> impl Future<Output = Result<Bytes, Failure>> + Send;

    /// The scores of a successful ranking answer, in candidate order (for `recload check`).
    fn rank_scores(&self, answer: &[u8]) -> Result<Vec<f32>, String>;
}
