//! Bearer tokens of the inference calls (`--inference-tokens-file`), apart from the repository API's admin token.
//! With the file given, every call needs `Authorization: Bearer TOKEN` (gRPC: the `authorization` metadata) with
//! one of its tokens, except what must stay open to probes and scrapers and what has its own token:
//!
//! - HTTP: `/health/live`, `/health/ready`, `/v2/health/...` and `/metrics` are open; `/v2/repository/...` needs
//!   the admin token instead; every other route (`/v1`, the rest of `/v2`, `/debug/slow-requests`) needs a token.
//! - gRPC: `ServerLive`, `ServerReady`, `grpc.health.v1` and reflection are open; `Repository*` needs the admin
//!   token instead; every other call (inference, metadata, model readiness, statistics, configuration) needs one.
//!
//! No token is 401 with `WWW-Authenticate: Bearer` (gRPC `UNAUTHENTICATED`), a token not in the file 403
//! (`PERMISSION_DENIED`), both with a JSON body that says so and counted in `recserve_auth_refused_total`. Tokens
//! are compared in constant time, each against every token of the file. The file is reread on SIGHUP and when it
//! changes ([`InferenceTokens::reload`]), so tokens rotate without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use subtle::{Choice, ConstantTimeEq};

use super::envelope::{error_response, refuse_unread};
use recserve_core::error::ServiceError;
use recserve_core::metrics::{ConnectionMetrics, Metrics};

/// Why the tokens' file cannot be used: its path and the problem.
#[derive(Debug, thiserror::Error)]
#[error("--inference-tokens-file {}: {problem}", .file.display())]
pub(crate) struct TokensError {
    file: PathBuf,
    problem: String,
}

/// The tokens of `--inference-tokens-file`, swapped whole by a reload.
pub(crate) struct InferenceTokens {
    file: PathBuf,
    tokens: RwLock<Arc<[Box<[u8]>]>>,
}

impl std::fmt::Debug for InferenceTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens.
        f.debug_struct("InferenceTokens")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

/// What a request's credentials are worth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Allowed,
    /// No `Authorization`, or not `Bearer <token>`.
    Missing,
    /// A bearer token that is not one of the file's.
    Wrong,
}

impl InferenceTokens {
    /// Reads the file: one token per line, surrounding whitespace trimmed; blank lines and `#` comments skipped.
    pub(crate) fn load(file: &Path) -> Result<InferenceTokens, TokensError> {
        Ok(InferenceTokens {
            tokens: RwLock::new(read(file)?),
            file: file.to_path_buf(),
        })
    }

    /// Rereads the file; on an error the tokens in use stay. Returns how many tokens it holds.
    pub(crate) fn reload(&self) -> Result<usize, TokensError> {
        let fresh = read(&self.file)?;
        let count = fresh.len();
        *self.tokens.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(count)
    }

    /// How many tokens the file held when last read.
    pub(crate) fn count(&self) -> usize {
        self.tokens
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The file read.
    pub(crate) fn path(&self) -> &Path {
        &self.file
    }

    /// `authorization`: the request's `Authorization` header (or gRPC metadata), as bytes.
    fn verdict(&self, authorization: Option<&[u8]>) -> Verdict {
        let Some(given) = authorization.and_then(bearer) else {
            return Verdict::Missing;
        };
        let tokens = Arc::clone(&self.tokens.read().unwrap_or_else(PoisonError::into_inner));
        // Every token is compared, whichever matches: the time taken says nothing of which one did.
        let matched = tokens
            .iter()
            .fold(Choice::from(0), |any, token| any | given.ct_eq(token));
        if bool::from(matched) {
            Verdict::Allowed
        } else {
            Verdict::Wrong
        }
    }
}

fn read(file: &Path) -> Result<Arc<[Box<[u8]>]>, TokensError> {
    let problem = |problem: String| TokensError {
        file: file.to_path_buf(),
        problem,
    };
    let text = std::fs::read_to_string(file).map_err(|e| problem(format!("cannot read: {e}")))?;
    let tokens: Vec<Box<[u8]>> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|token| token.as_bytes().into())
        .collect();
    if tokens.is_empty() {
        return Err(problem(
            "holds no token: write one token per line (blank lines and lines starting with '#' are skipped)"
                .to_owned(),
        ));
    }
    if let Some(bad) = tokens
        .iter()
        .position(|t| t.iter().any(|b| b.is_ascii_whitespace()))
    {
        return Err(problem(format!(
            "token {} holds whitespace: a bearer token cannot",
            bad + 1
        )));
    }
    Ok(tokens.into())
}

/// The token of `Bearer <token>` (the scheme in any case).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    let (scheme, token) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    Some(token.trim_ascii()).filter(|t| !t.is_empty())
}

/// What the middleware of one listener holds.
#[derive(Clone, Debug)]
pub(crate) struct Auth {
    tokens: Arc<InferenceTokens>,
    /// Its listener's handles, for the refusals' counts.
    counts: ConnectionMetrics,
    max_body_bytes: usize,
}

impl Auth {
    /// `listener`: `http` or `grpc`, the label of the refusals' counts.
    pub(crate) fn new(
        tokens: Arc<InferenceTokens>,
        metrics: &Metrics,
        listener: &str,
        max_body_bytes: usize,
    ) -> Auth {
        Auth {
            tokens,
            counts: metrics.connections(listener),
            max_body_bytes,
        }
    }

    /// The refusal of a request that needs a token, if it is refused.
    fn refusal(&self, request: &Request) -> Option<ServiceError> {
        let authorization = request
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        match self.tokens.verdict(authorization) {
            Verdict::Allowed => None,
            Verdict::Missing => {
                self.counts.auth_missing.inc();
                Some(ServiceError::Unauthenticated(
                    "inference calls on this server need the header `Authorization: Bearer <token>` with a \
                     token of its --inference-tokens-file"
                        .to_owned(),
                ))
            }
            Verdict::Wrong => {
                self.counts.auth_wrong.inc();
                Some(ServiceError::PermissionDenied(
                    "the bearer token is not one of this server's inference tokens".to_owned(),
                ))
            }
        }
    }
}

/// Whether an HTTP route is open without a token (or has the admin token's check instead).
fn http_open(path: &str) -> bool {
    matches!(path, "/health/live" | "/health/ready" | "/metrics")
        || path.starts_with("/v2/health/")
        || path == "/v2/repository"
        || path.starts_with("/v2/repository/")
}

/// Whether a gRPC method is open without a token (or has the admin token's check instead).
fn grpc_open(path: &str) -> bool {
    match path.strip_prefix("/inference.GRPCInferenceService/") {
        Some(method) => {
            matches!(method, "ServerLive" | "ServerReady") || method.starts_with("Repository")
        }
        None => {
            path.starts_with("/grpc.health.v1.Health/") || path.starts_with("/grpc.reflection.")
        }
    }
}

/// The HTTP middleware.
pub(crate) async fn http(State(auth): State<Auth>, request: Request, next: Next) -> Response {
    if http_open(request.uri().path()) {
        return next.run(request).await;
    }
    match auth.refusal(&request) {
        None => next.run(request).await,
        Some(refused) => {
            // A client sending its body reads the answer rather than a reset while it writes.
            refuse_unread(request.into_body(), auth.max_body_bytes);
            error_response(&refused)
        }
    }
}

/// The gRPC middleware: a refusal is a trailers-only response with the status.
pub(crate) async fn grpc(State(auth): State<Auth>, request: Request, next: Next) -> Response {
    if grpc_open(request.uri().path()) {
        return next.run(request).await;
    }
    match auth.refusal(&request) {
        None => next.run(request).await,
        Some(refused) => {
            refuse_unread(request.into_body(), auth.max_body_bytes);
            super::kserve::grpc::status(&refused).into_http()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Result<InferenceTokens, TokensError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokens");
        std::fs::write(&path, text).expect("write");
        InferenceTokens::load(&path)
    }

    #[test]
    fn reads_one_token_per_line_and_judges_bearer_headers() {
        let t = tokens("# team a\n  alpha  \n\nbeta\n").expect("two tokens");
        assert_eq!(t.verdict(Some(b"Bearer alpha")), Verdict::Allowed);
        assert_eq!(t.verdict(Some(b"bearer  beta ")), Verdict::Allowed);
        assert_eq!(t.verdict(Some(b"Bearer gamma")), Verdict::Wrong);
        assert_eq!(t.verdict(Some(b"Bearer alph")), Verdict::Wrong);
        assert_eq!(t.verdict(Some(b"Bearer # team a")), Verdict::Wrong);
        assert_eq!(t.verdict(None), Verdict::Missing);
        assert_eq!(t.verdict(Some(b"Basic YWxwaGE=")), Verdict::Missing);
        assert_eq!(t.verdict(Some(b"Bearer ")), Verdict::Missing);
        assert_eq!(t.verdict(Some(b"alpha")), Verdict::Missing);
    }

    #[test]
    fn refuses_a_file_without_tokens_naming_it() {
        let message = tokens("# nothing\n\n").expect_err("empty").to_string();
        assert!(
            message.starts_with("--inference-tokens-file ") && message.contains("holds no token"),
            "{message}"
        );
        let message = tokens("a b\n").expect_err("space").to_string();
        assert!(message.contains("token 1 holds whitespace"), "{message}");
    }

    #[test]
    fn health_metrics_and_the_repository_api_are_open() {
        for path in [
            "/health/live",
            "/health/ready",
            "/metrics",
            "/v2/health/ready",
            "/v2/repository/index",
        ] {
            assert!(http_open(path), "{path}");
        }
        for path in [
            "/v1/models/m/rank",
            "/v2",
            "/v2/models/m/infer",
            "/v2/models/m",
            "/debug/slow-requests",
            "/",
        ] {
            assert!(!http_open(path), "{path}");
        }
        for path in [
            "/inference.GRPCInferenceService/ServerLive",
            "/inference.GRPCInferenceService/RepositoryIndex",
            "/grpc.health.v1.Health/Check",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        ] {
            assert!(grpc_open(path), "{path}");
        }
        for path in [
            "/inference.GRPCInferenceService/ModelInfer",
            "/inference.GRPCInferenceService/ModelMetadata",
            "/inference.GRPCInferenceService/ServerMetadata",
        ] {
            assert!(!grpc_open(path), "{path}");
        }
    }
}
