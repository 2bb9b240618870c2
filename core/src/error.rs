//! The two error types of the server: [`LoadError`] for models that cannot be served (start-up), and
//! [`ServiceError`] for requests that cannot be answered. Each transport maps `ServiceError` to its status codes in
//! one exhaustive `match` ([`ServiceError::http_status`] for HTTP and the metrics, one for gRPC), so a new variant
//! cannot be forgotten.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Most characters of one piece of client text (a model name, a key, a header value, a string value) that an error
/// message repeats; longer text is cut there, and the message says so and how long it was.
pub(crate) const ECHO_CHARS: usize = 100;

/// Most characters of a client error's field path or problem: the last guard, for client text that no quoting
/// delimits.
pub(crate) const MESSAGE_CHARS: usize = 1000;

/// A duration in milliseconds with microsecond resolution, as messages give them: `3.214 ms`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Millis(pub Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3} ms", self.0.as_secs_f64() * 1e3)
    }
}

/// Client text as an error message repeats it: `{}` writes it as it is, `{:?}` quoted, each cut to
/// [`ECHO_CHARS`] characters with a note of its length when longer (`"mmm…"… (first 100 of 50000 characters)`).
#[derive(Clone, Copy)]
pub struct Echo<'a>(pub &'a str);

impl Echo<'_> {
    /// The text up to [`ECHO_CHARS`] characters, and its length in characters when that cut it.
    fn cut(&self) -> (&str, Option<usize>) {
        match self.0.char_indices().nth(ECHO_CHARS) {
            None => (self.0, None),
            Some((end, _)) => (&self.0[..end], Some(self.0.chars().count())),
        }
    }
}

fn cut_note(f: &mut fmt::Formatter<'_>, chars: Option<usize>) -> fmt::Result {
    match chars {
        Some(n) => write!(f, "… (first {ECHO_CHARS} of {n} characters)"),
        None => Ok(()),
    }
}

impl fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (text, chars) = self.cut();
        f.write_str(text)?;
        cut_note(f, chars)
    }
}

impl fmt::Debug for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (text, chars) = self.cut();
        write!(f, "{text:?}")?;
        cut_note(f, chars)
    }
}

/// `message` with every quoted run longer than [`ECHO_CHARS`] characters cut as [`Echo`] cuts it: the client text
/// that messages of serde and of this server repeat is quoted (`"…"`, with backslash escapes, or `` `…` ``). Then
/// the whole is cut to `limit` characters, for client text that is not quoted.
pub(crate) fn elide(message: &str, limit: usize) -> Cow<'_, str> {
    if message.len() <= ECHO_CHARS.min(limit) {
        return Cow::Borrowed(message);
    }
    let mut out = String::with_capacity(message.len().min(4 * limit));
    let mut rest = message;
    while let Some(open) = rest.find(['"', '`']) {
        let quote = rest.as_bytes()[open];
        let inner = &rest[open + 1..];
        let Some(close) = closing(inner, quote) else {
            break;
        };
        out.push_str(&rest[..=open]);
        let quoted = &inner[..close];
        match quoted.char_indices().nth(ECHO_CHARS) {
            None => out.push_str(quoted),
            Some((end, _)) => {
                // A cut must not leave half of an escape before the closing quote.
                let kept = quoted[..end].trim_end_matches('\\');
                out.push_str(kept);
                out.push(char::from(quote));
                out.push_str(&format!(
                    "… (first {ECHO_CHARS} of {} characters)",
                    quoted.chars().count()
                ));
                rest = &inner[close + 1..];
                continue;
            }
        }
        out.push(char::from(quote));
        rest = &inner[close + 1..];
    }
    out.push_str(rest);
    match out.char_indices().nth(limit) {
        None if out == message => Cow::Borrowed(message),
        None => Cow::Owned(out),
        Some((end, _)) => {
            let chars = out.chars().count();
            out.truncate(end);
            out.push_str(&format!("… (first {limit} of {chars} characters)"));
            Cow::Owned(out)
        }
    }
}

/// The offset in `text` of the quote that closes a run opened by `quote` (`"` runs skip backslash escapes).
fn closing(text: &str, quote: u8) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quote == b'"' => i += 2,
            b if b == quote => return Some(i),
            _ => i += 1,
        }
    }
    None
}

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

    /// A file of the repository that cannot be opened (`what`: "cannot open table file"). A permission error also
    /// says who the server runs as and who may read the file (its owner and mode), since the usual cause is a
    /// container running as another user than the one who wrote the files.
    pub fn cannot_open(path: &Path, what: &str, error: &std::io::Error) -> LoadError {
        let mut problem = format!("{what}: {error}");
        if error.kind() == std::io::ErrorKind::PermissionDenied {
            problem.push_str(&permission_detail(path));
        }
        LoadError::new(path, problem)
    }
}

/// `; the server runs as uid U (gid G); the file is owned by uid O (gid P) with mode 0600: …`.
fn permission_detail(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid and getegid only read the process's credentials; they cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let server = format!("; the server runs as uid {uid} (gid {gid})");
    match std::fs::metadata(path) {
        Ok(m) => format!(
            "{server}; the file is owned by uid {} (gid {}) with mode {:04o}: make it readable by the server's \
             user (chmod a+r, or write it with the model toolchain, which writes files 0644 by default)",
            m.uid(),
            m.gid(),
            m.mode() & 0o7777
        ),
        Err(_) => format!(
            "{server}, which cannot search a directory on the way to the file: make the directories \
             searchable (chmod a+rx DIR)"
        ),
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
    #[error("model {:?} is not served (served models: {served})", Echo(.model))]
    ModelNotFound { model: String, served: String },
    #[error("model {model:?} version {version} is not served ({})", serving_versions(.serving))]
    VersionNotFound {
        model: String,
        version: u64,
        /// The versions that are, ascending.
        serving: Vec<u64>,
    },
    #[error("pipeline {:?} is not configured (pipelines: {served})", Echo(.pipeline))]
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
    /// The request's deadline is shorter than its own execution is predicted to take with nothing queued ahead:
    /// the same request would be refused again, however idle the server.
    #[error(
        "model {model:?}: the request's deadline is too short: executing it is predicted to take {} even with \
         nothing queued ahead, and its deadline leaves {}, of which admission plans on at most {}; retrying the \
         same request will not help: give it a longer deadline or send fewer rows",
        Millis(*.predicted),
        Millis(*.left),
        Millis(*.budget)
    )]
    DeadlineTooShort {
        model: String,
        predicted: Duration,
        left: Duration,
        budget: Duration,
    },
    /// The request's deadline passed before it could be executed; it was dropped unexecuted.
    #[error("model {model:?}: the request's deadline passed before it could be executed")]
    DeadlineExceeded { model: String },
    /// Models are still loading, or the server is shutting down.
    #[error("the server is not ready: {0}")]
    Unavailable(&'static str),
    /// Embedding rows of a table whose `unfetched = "unavailable"` could not be fetched from the Redis tier within
    /// the batch's budget.
    #[error(
        "model {model:?}: embedding rows could not be fetched from the Redis tier before the request's deadline"
    )]
    TierUnavailable { model: String },
    /// A protected call (the repository API) came without the credentials it needs.
    #[error("{0}")]
    Unauthenticated(String),
    /// A protected call came with wrong credentials, or is disabled on this server.
    #[error("{0}")]
    PermissionDenied(String),
    /// The call is not allowed in the server's mode or state (a load with `--model-control poll`, unloading a
    /// model a pipeline needs).
    #[error("{0}")]
    NotAllowed(String),
    /// A model version could not be loaded or swapped in; the version serving before, if any, goes on serving.
    #[error("model {:?} was not loaded: {reason}", Echo(.model))]
    LoadFailed { model: String, reason: String },
    /// The model computed a score that is not a finite number for a row of the request (its tables or dense graph
    /// hold NaN or infinity, or the computation overflowed): the request is refused rather than answered with a
    /// score JSON cannot carry.
    #[error(
        "model {model:?} computed a non-finite score ({value}) for row {row} of the request: the model's tables \
         or dense graph hold a value that is not a finite number; this is the model's fault, not the request's"
    )]
    NonFiniteScore {
        model: String,
        row: usize,
        value: f32,
    },
    /// A failure that is not the client's doing. The detail is logged, never sent.
    #[error("internal error")]
    Internal(String),
}

/// "serving version 3", or "serving versions 7, 8".
fn serving_versions(versions: &[u64]) -> String {
    let list = versions
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    match versions.len() {
        1 => format!("serving version {list}"),
        _ => format!("serving versions {list}"),
    }
}

impl ServiceError {
    /// A client error at `field`. Client text in either is cut ([`elide`]): `field` as a whole to
    /// [`ECHO_CHARS`] (paths are short unless a client's key is in them), quoted runs of `problem` to
    /// [`ECHO_CHARS`] and the whole to [`MESSAGE_CHARS`].
    pub fn invalid(field: impl Into<String>, problem: impl Into<String>) -> ServiceError {
        let (field, problem) = (field.into(), problem.into());
        ServiceError::InvalidInput {
            field: match elide(&field, ECHO_CHARS) {
                Cow::Borrowed(_) => field,
                Cow::Owned(cut) => cut,
            },
            problem: match elide(&problem, MESSAGE_CHARS) {
                Cow::Borrowed(_) => problem,
                Cow::Owned(cut) => cut,
            },
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
            // The request itself, not the load, decides it: a client error (docs/api.md).
            ServiceError::DeadlineTooShort { .. } => 400,
            ServiceError::PayloadTooLarge { .. } => 413,
            ServiceError::BodyTimeout { .. } => 408,
            ServiceError::ModelNotFound { .. }
            | ServiceError::VersionNotFound { .. }
            | ServiceError::PipelineNotFound { .. } => 404,
            ServiceError::Overloaded { .. } => 429,
            ServiceError::DeadlineExceeded { .. } => 504,
            ServiceError::Unavailable(_) | ServiceError::TierUnavailable { .. } => 503,
            ServiceError::Unauthenticated(_) => 401,
            ServiceError::PermissionDenied(_) => 403,
            ServiceError::NotAllowed(_) => 409,
            ServiceError::LoadFailed { .. } => 400,
            ServiceError::NonFiniteScore { .. } | ServiceError::Internal(_) => 500,
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
            ServiceError::DeadlineTooShort { .. } => "deadline_too_short",
            ServiceError::DeadlineExceeded { .. } => "deadline_exceeded",
            ServiceError::Unavailable(_) => "unavailable",
            ServiceError::TierUnavailable { .. } => "tier_unavailable",
            ServiceError::Unauthenticated(_) => "unauthenticated",
            ServiceError::PermissionDenied(_) => "permission_denied",
            ServiceError::NotAllowed(_) => "not_allowed",
            ServiceError::LoadFailed { .. } => "load_failed",
            ServiceError::NonFiniteScore { .. } => "non_finite_score",
            ServiceError::Internal(_) => "internal",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file the server may not read: the error says who the server runs as, who owns the file and its mode.
    /// (The tests run as root, which reads any file, so the error is made here rather than provoked.)
    #[test]
    fn a_permission_error_names_the_servers_user_and_the_files_owner_and_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tables.safetensors");
        std::fs::write(&file, b"x").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let err = LoadError::cannot_open(&file, "cannot open table file", &denied).to_string();
        // SAFETY: reads the process's credentials.
        let uid = unsafe { libc::geteuid() };
        assert!(
            err.starts_with(&format!("{}: cannot open table file: ", file.display())),
            "{err}"
        );
        assert!(
            err.contains(&format!("the server runs as uid {uid} (gid ")),
            "{err}"
        );
        assert!(
            err.contains(&format!("the file is owned by uid {uid} (gid ")),
            "{err}"
        );
        assert!(
            err.contains("with mode 0600") && err.contains("chmod a+r"),
            "{err}"
        );

        let gone = dir.path().join("hidden/tables.safetensors");
        let err = LoadError::cannot_open(&gone, "cannot open table file", &denied).to_string();
        assert!(
            err.contains("cannot search a directory on the way to the file"),
            "{err}"
        );

        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        let err = LoadError::cannot_open(&file, "cannot open table file", &missing).to_string();
        assert!(
            !err.contains("uid"),
            "only permission errors say who may read: {err}"
        );
    }

    #[test]
    fn echoed_client_text_is_cut_and_says_so() {
        assert_eq!(format!("{:?}", Echo("short")), "\"short\"");
        let long = "m".repeat(50_000);
        let cut = format!("{:?}", Echo(&long));
        assert_eq!(
            cut,
            format!("\"{}\"… (first 100 of 50000 characters)", "m".repeat(100))
        );
        assert_eq!(
            format!("{}", Echo(&"é".repeat(101))),
            format!("{}… (first 100 of 101 characters)", "é".repeat(100)),
            "characters, not bytes"
        );
        let not_found = ServiceError::ModelNotFound {
            model: long,
            served: "a, b".to_owned(),
        };
        assert!(not_found.to_string().len() < 250, "{not_found}");
    }

    #[test]
    fn quoted_runs_of_messages_are_cut_and_the_whole_bounded() {
        assert_eq!(elide("short", 10), "short");
        let key = "k".repeat(10_000);
        let message = format!("unknown field `{key}`, expected `fields` or `dense`");
        assert_eq!(
            elide(&message, MESSAGE_CHARS),
            format!(
                "unknown field `{}`… (first 100 of 10000 characters), expected `fields` or `dense`",
                "k".repeat(100)
            )
        );
        // Escaped quotes do not close a run, and a cut does not leave half of an escape.
        let value = format!(
            "invalid type: string \"{}\\\"{}\", expected i64",
            "a".repeat(99),
            "b".repeat(200)
        );
        let cut = elide(&value, MESSAGE_CHARS);
        assert_eq!(
            cut,
            format!(
                "invalid type: string \"{}\"… (first 100 of 301 characters), expected i64",
                "a".repeat(99)
            )
        );
        // Unquoted client text: the whole is bounded.
        let field = format!("user.fields.{key}");
        let error = ServiceError::invalid(&field, format!("is {key}"));
        let ServiceError::InvalidInput { field, problem } = &error else {
            panic!("{error:?}");
        };
        assert_eq!(
            field,
            &format!(
                "user.fields.{}… (first 100 of 10012 characters)",
                "k".repeat(88)
            )
        );
        assert!(
            problem.ends_with("… (first 1000 of 10003 characters)"),
            "{problem}"
        );
    }
}
