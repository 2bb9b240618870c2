//! Where requests go: the [`Target`] trait is everything the single worker loop needs from a protocol (open a
//! connection, send one prepared request, tell success from failure), so HTTP JSON now and KServe v2 HTTP or gRPC
//! later share that loop, its timing and its accounting. [`http::HttpTarget`] is the HTTP/1.1 implementation.

pub mod http;

use std::future::Future;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::stats::ErrorKind;
use crate::workload::Request;

pub use http::{Envelope, HttpTarget, TensorLayout};

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
}

impl Failure {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Failure::Status { status, .. } => ErrorKind::Status(*status),
            Failure::Connect { .. } => ErrorKind::Connect,
            Failure::Connection(_) => ErrorKind::Connection,
        }
    }

    /// The connection cannot carry another request after this failure.
    pub fn breaks_connection(&self) -> bool {
        match self {
            Failure::Status { .. } => false,
            Failure::Connect { .. } | Failure::Connection(_) => true,
        }
    }
}

/// What a report says about the target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetInfo {
    pub url: String,
    /// `http-json` (the body as the workload made it), `kserve-v2-bytes` (wrapped in a KServe v2 request) or
    /// `kserve-v2-tensors` (rewritten into the model's KServe v2 tensors).
    pub protocol: String,
    /// The KServe v2 model the body is sent to, for `kserve-v2-bytes`.
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
