//! The two error types of the server: [`LoadError`] for models that cannot be served (start-up), and
//! [`ServiceError`] for requests that cannot be answered. Each transport maps `ServiceError` to its status codes in
//! one exhaustive `match` ([`ServiceError::http_status`] for HTTP and the metrics, one for gRPC), so a new variant
//! cannot be forgotten.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A model that cannot be loaded: the file, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    pub path: PathBuf,
    pub problem: String,
}

impl LoadError {
    pub fn new(path: &Path, problem: impl Into<String>) -> LoadError {
        LoadError {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.problem)
    }
}

impl std::error::Error for LoadError {}

/// Why a request was not answered. Client-caused variants carry a message for the client; `Internal` carries
/// detail for the log only.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServiceError {
    /// The request is malformed or violates the model's contract. `field` is a path into the request
    /// (`candidates[3].fields.C21`), `problem` says what is wrong with it.
    #[error("{field}: {problem}")]
    InvalidInput { field: String, problem: String },
    /// The body could not be parsed at all.
    #[error("malformed request body: {0}")]
    Malformed(String),
    #[error("the body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// The body did not arrive whole within `--body-read-timeout-ms` of the request's head.
    #[error("the request body did not arrive within {ms} ms of its head")]
    BodyTimeout { ms: u64 },
    #[error("model {model:?} is not served (served models: {served})")]
    ModelNotFound { model: String, served: String },
    #[error("model {model:?} version {version} is not served (serving version {serving})")]
    VersionNotFound {
        model: String,
        version: u64,
        serving: u64,
    },
    #[error("pipeline {pipeline:?} is not configured (pipelines: {served})")]
    PipelineNotFound { pipeline: String, served: String },
    #[error("model {model:?} is a {kind} model and does not support {operation}")]
    WrongKind {
        model: String,
        kind: &'static str,
        operation: &'static str,
    },
    /// The model's queue is full; the client should retry after `retry_after`.
    #[error("model {model:?} is overloaded; retry later")]
    Overloaded {
        model: String,
        retry_after: Duration,
    },
    /// The request's deadline passed before it could be executed; it was dropped unexecuted.
    #[error("model {model:?}: the request's deadline passed before it could be executed")]
    DeadlineExceeded { model: String },
    /// Models are still loading, or the server is shutting down.
    #[error("the server is not ready: {0}")]
    Unavailable(&'static str),
    /// A failure that is not the client's doing. The detail is logged, never sent.
    #[error("internal error")]
    Internal(String),
}

impl ServiceError {
    pub fn invalid(field: impl Into<String>, problem: impl Into<String>) -> ServiceError {
        ServiceError::InvalidInput {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The HTTP status of this outcome: the one mapping to HTTP statuses, which HTTP responses use and which
    /// labels every protocol's requests in the metrics (gRPC maps to its codes in `api::kserve::grpc`).
    /// Exhaustive: a new variant must be mapped here.
    pub fn http_status(&self) -> u16 {
        match self {
            ServiceError::InvalidInput { .. }
            | ServiceError::Malformed(_)
            | ServiceError::WrongKind { .. } => 400,
            ServiceError::PayloadTooLarge { .. } => 413,
            ServiceError::BodyTimeout { .. } => 408,
            ServiceError::ModelNotFound { .. }
            | ServiceError::VersionNotFound { .. }
            | ServiceError::PipelineNotFound { .. } => 404,
            ServiceError::Overloaded { .. } => 429,
            ServiceError::DeadlineExceeded { .. } => 504,
            ServiceError::Unavailable(_) => 503,
            ServiceError::Internal(_) => 500,
        }
    }

    /// A short, bounded label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            ServiceError::InvalidInput { .. } => "invalid_input",
            ServiceError::Malformed(_) => "malformed",
            ServiceError::PayloadTooLarge { .. } => "payload_too_large",
            ServiceError::BodyTimeout { .. } => "body_timeout",
            ServiceError::ModelNotFound { .. } => "model_not_found",
            ServiceError::VersionNotFound { .. } => "version_not_found",
            ServiceError::PipelineNotFound { .. } => "pipeline_not_found",
            ServiceError::WrongKind { .. } => "wrong_kind",
            ServiceError::Overloaded { .. } => "overloaded",
            ServiceError::DeadlineExceeded { .. } => "deadline_exceeded",
            ServiceError::Unavailable(_) => "unavailable",
            ServiceError::Internal(_) => "internal",
        }
    }
}
