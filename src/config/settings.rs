//! The settings of `serve`, spelled once: [`ServeArgs`] is read by clap (flags) and by serde (the `--config` TOML
//! file, whose keys are the flag names with `_` for `-`). Each setting's default (and a numeric one's range) is a
//! named [`Setting`] or [`Choice`] beside it. A flag's environment variable ([`env_var`]) and the default its help
//! shows ([`shown_defaults`]) are derived from its name and its setting when clap builds the command, never
//! written beside the flag. [`super::ServeArgs::resolve`] layers flags over the file over the defaults, checks the
//! result and builds the typed settings each component takes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use clap::{Arg, Args};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{
    BatchDelay, ConfigError, LogFormat, ModelControl, ModelSettings, PipelineConfig, Switch,
};
use recserve_core::gpu::{DeviceRequest, ProviderRequest};
use recserve_core::repository::{MAX_BATCH_ROWS, MAX_DEFAULT_DEADLINE_MS, MAX_QUEUE_DELAY_US};

/// A numeric setting: the flag that names it in messages, its default, and the range it must lie in.
#[derive(Clone, Copy, Debug)]
pub struct Setting<T> {
    pub(crate) flag: &'static str,
    pub(crate) default: T,
    pub(crate) min: T,
    pub(crate) max: T,
}

impl<T: PartialOrd + Display + Copy> Setting<T> {
    /// The value given, else the default, checked against the range.
    pub(crate) fn resolve(&self, given: Option<T>) -> Result<T, ConfigError> {
        self.check(given.unwrap_or(self.default))
    }

    /// `value`, if it lies in the range; else an error that names the flag and its environment variable.
    pub(crate) fn check(&self, value: T) -> Result<T, ConfigError> {
        if self.min <= value && value <= self.max {
            Ok(value)
        } else {
            Err(ConfigError(format!(
                "{} ({}) must be between {} and {}, got {value}",
                self.flag,
                env_var(self.flag),
                self.min,
                self.max
            )))
        }
    }
}

/// A setting without a range: the flag that names it in messages and its default.
#[derive(Clone, Copy, Debug)]
pub struct Choice<T> {
    pub(crate) flag: &'static str,
    pub(crate) default: T,
}

impl<T: Copy> Choice<T> {
    /// The value given, else the default.
    pub(crate) fn resolve(&self, given: Option<T>) -> T {
        given.unwrap_or(self.default)
    }
}

/// The environment variable of a flag: `--max-batch-rows` → `RECSERVE_MAX_BATCH_ROWS`.
pub fn env_var(flag: &str) -> String {
    format!("RECSERVE_{}", file_key(flag).to_uppercase())
}

/// The config-file key of a flag: `--max-batch-rows` → `max_batch_rows`.
pub fn file_key(flag: &str) -> String {
    flag.trim_start_matches("--").replace('-', "_")
}

/// A setting whose default the help of its flag shows.
trait Shown {
    fn flag(&self) -> &'static str;
    /// The default as the config file would spell it (strings unquoted).
    fn shown_default(&self) -> String;
}

impl<T: Serialize> Shown for Setting<T> {
    fn flag(&self) -> &'static str {
        self.flag
    }
    fn shown_default(&self) -> String {
        shown(&self.default)
    }
}

impl<T: Serialize> Shown for Choice<T> {
    fn flag(&self) -> &'static str {
        self.flag
    }
    fn shown_default(&self) -> String {
        shown(&self.default)
    }
}

/// A batching setting that, unset, leaves the model's `[batching]` section to decide, and else its default.
struct ModelFirst<'a>(&'a dyn Shown);

impl Shown for ModelFirst<'_> {
    fn flag(&self) -> &'static str {
        self.0.flag()
    }
    fn shown_default(&self) -> String {
        format!(
            "the model's [batching] {}, else {}",
            file_key(self.0.flag()),
            self.0.shown_default()
        )
    }
}

/// A value as a config file holds it, without the quotes of a string.
fn shown(value: &impl Serialize) -> String {
    match toml::Value::try_from(value) {
        Ok(toml::Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(e) => format!("({e})"),
    }
}

/// Without `--ort-library` or `ORT_DYLIB_PATH`: the library the system's loader finds by this name.
pub(crate) const ORT_LIBRARY_FALLBACK: &str = "libonnxruntime.so";

/// The default that each flag of `serve` with one shows in its help, by flag.
pub fn shown_defaults() -> BTreeMap<&'static str, String> {
    let settings: [&dyn Shown; 39] = [
        &HTTP_ADDR,
        &GRPC_ADDR,
        &INTRA_OP_THREADS,
        &EXECUTORS,
        &SHARDS,
        &MAX_CANDIDATES,
        &MAX_HISTORY,
        &MAX_EXCLUDE,
        &MAX_REPLY_ITEMS,
        &MAX_BODY_BYTES,
        &QUEUE_CAPACITY,
        &EXECUTOR_NICENESS,
        &BATCHING,
        &BATCH_DELAY,
        &GATHER_USER_ONCE,
        &PRELOAD,
        &SPLIT_GRAPH,
        &ModelFirst(&MAX_BATCH_ROWS_SETTING),
        &ModelFirst(&MAX_QUEUE_DELAY_US_SETTING),
        &ModelFirst(&DEFAULT_DEADLINE_MS_SETTING),
        &SHUTDOWN_TIMEOUT_S,
        &HEADER_READ_TIMEOUT_MS,
        &BODY_READ_TIMEOUT_MS,
        &IDLE_TIMEOUT_MS,
        &WRITE_TIMEOUT_MS,
        &HTTP2_PING_INTERVAL_MS,
        &MAX_CONNECTIONS,
        &SLOW_REQUESTS,
        &LOG_FORMAT,
        &TRACE_SAMPLE_RATIO,
        &ACCESS_LOG_SAMPLE_RATIO,
        &DEVICE,
        &EXECUTION_PROVIDER,
        &TENSORRT_FP16,
        &TENSORRT_INT8,
        &MODEL_CONTROL,
        &REPOSITORY_POLL_S,
        &EMBEDDING_CACHE_BYTES,
        &REDIS_FETCH_TIMEOUT_MS,
    ];
    let mut shown: BTreeMap<_, _> = settings
        .iter()
        .map(|s| (s.flag(), s.shown_default()))
        .collect();
    // Defaults that are a rule rather than a value.
    shown.extend([
        (
            "--ort-library",
            format!("$ORT_DYLIB_PATH, else {ORT_LIBRARY_FALLBACK} on the system library path"),
        ),
        (
            "--batch-buckets",
            "the model's [batching] buckets, else about 25% apart up to max-batch-rows".to_owned(),
        ),
        (
            "--tensorrt-engine-cache",
            "none, engines are rebuilt at every start".to_owned(),
        ),
        (
            "--redis-url",
            "none; a model with such a table then fails to load".to_owned(),
        ),
    ]);
    shown
}

/// Gives an argument of `serve` its environment variable (the [`env_var`] of its flag) and ends its help with
/// its default from [`shown_defaults`], so that neither is written by hand beside the flag.
fn with_env_and_default(arg: Arg) -> Arg {
    if !serve_arg_ids().is_some_and(|ids| ids.contains(arg.get_id().as_str())) {
        return arg;
    }
    let Some(flag) = arg.get_long().map(|long| format!("--{long}")) else {
        return arg;
    };
    let arg = arg.env(leaked_once(env_var(&flag)));
    let Some(default) = shown_defaults().remove(flag.as_str()) else {
        return arg;
    };
    let with_default = |help: Option<&clap::builder::StyledStr>| match help {
        Some(help) => format!("{help} [default: {default}]"),
        None => format!("[default: {default}]"),
    };
    let help = with_default(arg.get_help());
    let long_help = arg.get_long_help().map(|h| with_default(Some(h)));
    let arg = arg.help(help);
    match long_help {
        Some(long_help) => arg.long_help(long_help),
        None => arg,
    }
}

/// The ids of [`ServeArgs`]'s own arguments. `mut_args` sees every argument of the command that flattens it, and a
/// command that flattens it beside arguments of its own (recload's `ceiling`) keeps those as they are. `None`
/// while the list itself is being built (which runs `mut_args` too).
fn serve_arg_ids() -> Option<&'static BTreeSet<String>> {
    thread_local! {
        static BUILDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    static IDS: std::sync::OnceLock<BTreeSet<String>> = std::sync::OnceLock::new();
    if let Some(ids) = IDS.get() {
        return Some(ids);
    }
    if BUILDING.get() {
        return None;
    }
    BUILDING.set(true);
    let ids = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"))
        .get_arguments()
        .map(|a| a.get_id().as_str().to_owned())
        .collect();
    BUILDING.set(false);
    Some(IDS.get_or_init(|| ids))
}

/// `name` as a `&'static str`, which clap takes environment variable names as (its `string` feature is off);
/// each distinct name is leaked once, however many times the command is built.
fn leaked_once(name: String) -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&known) = names.get(name.as_str()) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.into_boxed_str());
    names.insert(leaked);
    leaked
}

pub(crate) const INTRA_OP_THREADS: Setting<usize> = Setting {
    flag: "--intra-op-threads",
    default: 1,
    min: 1,
    max: 256,
};
pub(crate) const EXECUTORS: Setting<usize> = Setting {
    flag: "--executors",
    default: 1,
    min: 1,
    max: 64,
};
pub(crate) const EMBEDDING_CACHE_BYTES: Setting<u64> = Setting {
    flag: "--embedding-cache-bytes",
    default: 256 << 20,
    min: 1 << 16,
    max: 1 << 42,
};
pub(crate) const REDIS_FETCH_TIMEOUT_MS: Setting<u64> = Setting {
    flag: "--redis-fetch-timeout-ms",
    default: 50,
    min: 1,
    max: 60_000,
};
pub(crate) const SHARDS: Setting<usize> = Setting {
    flag: "--shards",
    default: 1,
    min: 1,
    max: 1024,
};
pub(crate) const MAX_CANDIDATES: Setting<usize> = Setting {
    flag: "--max-candidates",
    default: 1000,
    min: 1,
    max: 100_000,
};
pub(crate) const MAX_HISTORY: Setting<usize> = Setting {
    flag: "--max-history",
    default: 10_000,
    min: 1,
    max: 1_000_000,
};
pub(crate) const MAX_EXCLUDE: Setting<usize> = Setting {
    flag: "--max-exclude",
    default: 10_000,
    min: 1,
    max: 1_000_000,
};
/// Users × `k` of a KServe recall request is 200 × a 40,981-item catalogue = 8.2 M items (134 MB of JSON) without
/// it; 100,000 items is about 2.5 MB of JSON, e.g. 1,000 users × top 100.
pub(crate) const MAX_REPLY_ITEMS: Setting<usize> = Setting {
    flag: "--max-reply-items",
    default: 100_000,
    min: 1,
    max: 100_000_000,
};
pub(crate) const MAX_BODY_BYTES: Setting<usize> = Setting {
    flag: "--max-body-bytes",
    default: 4 << 20,
    min: 1024,
    max: 1 << 30,
};
pub(crate) const QUEUE_CAPACITY: Setting<usize> = Setting {
    flag: "--queue-capacity",
    default: 256,
    min: 1,
    max: 1 << 20,
};
pub(crate) const EXECUTOR_NICENESS: Setting<u8> = Setting {
    flag: "--executor-niceness",
    default: 5,
    min: 0,
    max: 19,
};
/// Unset, the model's `[batching]` decides (and else `batching::DEFAULT_MAX_BATCH_ROWS`).
pub(crate) const MAX_BATCH_ROWS_SETTING: Setting<usize> = Setting {
    flag: "--max-batch-rows",
    default: recserve_core::batching::DEFAULT_MAX_BATCH_ROWS,
    min: 1,
    max: MAX_BATCH_ROWS,
};
/// Unset, the model's `[batching]` decides (and else `batching::DEFAULT_MAX_QUEUE_DELAY_US`).
pub(crate) const MAX_QUEUE_DELAY_US_SETTING: Setting<u64> = Setting {
    flag: "--max-queue-delay-us",
    default: recserve_core::batching::DEFAULT_MAX_QUEUE_DELAY_US,
    min: 0,
    max: MAX_QUEUE_DELAY_US,
};
/// Unset, the model's `[batching]` decides (and else `batching::DEFAULT_DEADLINE_MS`).
pub(crate) const DEFAULT_DEADLINE_MS_SETTING: Setting<u64> = Setting {
    flag: "--default-deadline-ms",
    default: recserve_core::batching::DEFAULT_DEADLINE_MS,
    min: 1,
    max: MAX_DEFAULT_DEADLINE_MS,
};
pub(crate) const REPOSITORY_POLL_S: Setting<u64> = Setting {
    flag: "--repository-poll-s",
    default: 15,
    min: 1,
    max: 86_400,
};
/// The slow-request record (`GET /debug/slow-requests`, `recserve_core::trace::slow`): requests kept per minute.
pub(crate) const SLOW_REQUESTS: Setting<usize> = Setting {
    flag: "--slow-requests",
    default: recserve_core::trace::slow::DEFAULT_KEEP,
    min: 0,
    max: 100_000,
};
/// Tracing (`crate::telemetry::spans`): the share of traces the server starts that it samples; a caller's
/// `traceparent` decides for its own.
pub(crate) const TRACE_SAMPLE_RATIO: Setting<f64> = Setting {
    flag: "--trace-sample-ratio",
    default: 0.01,
    min: 0.0,
    max: 1.0,
};
/// The access log (`crate::telemetry::requests`): the share of requests logged; off by default.
pub(crate) const ACCESS_LOG_SAMPLE_RATIO: Setting<f64> = Setting {
    flag: "--access-log-sample-ratio",
    default: 0.0,
    min: 0.0,
    max: 1.0,
};
pub(crate) const SHUTDOWN_TIMEOUT_S: Setting<u64> = Setting {
    flag: "--shutdown-timeout-s",
    default: 30,
    min: 1,
    max: 3600,
};
/// Connections (`server::connections`): a request head must arrive within this of the connection's opening, or of
/// its first byte after an idle spell.
pub(crate) const HEADER_READ_TIMEOUT_MS: Setting<u64> = Setting {
    flag: "--header-read-timeout-ms",
    default: 10_000,
    min: 10,
    max: 3_600_000,
};
/// A request body must arrive whole within this of its head.
pub(crate) const BODY_READ_TIMEOUT_MS: Setting<u64> = Setting {
    flag: "--body-read-timeout-ms",
    default: 30_000,
    min: 10,
    max: 3_600_000,
};
/// A connection with no request in flight is closed after this. Longer than the 60 s that load balancers and
/// proxies commonly keep idle upstream connections, so that they close first and never send on a closing one.
pub(crate) const IDLE_TIMEOUT_MS: Setting<u64> = Setting {
    flag: "--idle-timeout-ms",
    default: 75_000,
    min: 10,
    max: 86_400_000,
};
/// A response that makes no progress (the client reads none of it) for this long closes its connection.
pub(crate) const WRITE_TIMEOUT_MS: Setting<u64> = Setting {
    flag: "--write-timeout-ms",
    default: 30_000,
    min: 10,
    max: 3_600_000,
};
/// HTTP/2 pings after this long without a frame from the client; 0 turns them off.
pub(crate) const HTTP2_PING_INTERVAL_MS: Setting<u64> = Setting {
    flag: "--http2-ping-interval-ms",
    default: 20_000,
    min: 0,
    max: 3_600_000,
};
/// HTTP and gRPC connections together.
pub(crate) const MAX_CONNECTIONS: Setting<usize> = Setting {
    flag: "--max-connections",
    default: 10_000,
    min: 1,
    max: 1_000_000,
};
pub(crate) const HTTP_ADDR: Choice<SocketAddr> = Choice {
    flag: "--http-addr",
    default: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8000)),
};
pub(crate) const GRPC_ADDR: Choice<SocketAddr> = Choice {
    flag: "--grpc-addr",
    default: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8001)),
};
pub(crate) const BATCHING: Choice<Switch> = Choice {
    flag: "--batching",
    default: Switch::On,
};
pub(crate) const BATCH_DELAY: Choice<BatchDelay> = Choice {
    flag: "--batch-delay",
    default: BatchDelay::Adaptive,
};
pub(crate) const GATHER_USER_ONCE: Choice<Switch> = Choice {
    flag: "--gather-user-once",
    default: Switch::On,
};
pub(crate) const PRELOAD: Choice<Switch> = Choice {
    flag: "--preload",
    default: Switch::On,
};
pub(crate) const SPLIT_GRAPH: Choice<Switch> = Choice {
    flag: "--split-graph",
    default: Switch::On,
};
pub(crate) const LOG_FORMAT: Choice<LogFormat> = Choice {
    flag: "--log-format",
    default: LogFormat::Text,
};
pub(crate) const DEVICE: Choice<DeviceRequest> = Choice {
    flag: "--device",
    default: DeviceRequest::Auto,
};
pub(crate) const EXECUTION_PROVIDER: Choice<ProviderRequest> = Choice {
    flag: "--execution-provider",
    default: ProviderRequest::Auto,
};
pub(crate) const TENSORRT_FP16: Choice<bool> = Choice {
    flag: "--tensorrt-fp16",
    default: false,
};
pub(crate) const TENSORRT_INT8: Choice<bool> = Choice {
    flag: "--tensorrt-int8",
    default: false,
};
pub(crate) const MODEL_CONTROL: Choice<ModelControl> = Choice {
    flag: "--model-control",
    default: ModelControl::None,
};

/// Flags of `serve`, and keys of its config file. Every setting is optional here so that the file can supply what
/// the flags do not; [`super::ServeArgs::resolve`] applies the defaults (shown in each flag's help).
#[derive(Clone, Debug, Default, Args, Deserialize, Serialize)]
#[command(mut_args = with_env_and_default)]
#[serde(deny_unknown_fields)]
pub struct ServeArgs {
    /// TOML file with any of the settings below (keys are the flag names with '_' for '-'); flags and
    /// environment variables override it.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Model repository: <repository>/<model>/<version>/model.toml. Required.
    #[arg(long)]
    pub repository: Option<PathBuf>,

    /// Address of the HTTP API and /metrics.
    #[arg(long)]
    pub http_addr: Option<SocketAddr>,

    /// Address of the KServe v2 gRPC API (inference.GRPCInferenceService, grpc.health.v1, reflection).
    #[arg(long)]
    pub grpc_addr: Option<SocketAddr>,

    /// ONNX Runtime shared library (libonnxruntime.so, version 1.17 or newer).
    #[arg(long)]
    pub ort_library: Option<PathBuf>,

    /// Threads ONNX Runtime uses inside one operator, per executor.
    #[arg(long)]
    pub intra_op_threads: Option<usize>,

    /// Executor threads per model, each with its own ONNX Runtime session.
    #[arg(long)]
    pub executors: Option<usize>,

    /// Shards per embedding table (contiguous row ranges).
    #[arg(long)]
    pub shards: Option<usize>,

    /// Most candidates one ranking request may carry.
    #[arg(long)]
    pub max_candidates: Option<usize>,

    /// Most item ids in a recall request's `history`.
    #[arg(long)]
    pub max_history: Option<usize>,

    /// Most item ids in a recall or recommend request's `exclude`.
    #[arg(long)]
    pub max_exclude: Option<usize>,

    /// Most items one reply may hold: users × k of a recall request (k for /v1 recall), k of a recommend request;
    /// larger requests are refused with 400.
    #[arg(long)]
    pub max_reply_items: Option<usize>,

    /// Largest request body accepted, in bytes.
    #[arg(long)]
    pub max_body_bytes: Option<usize>,

    /// Requests (or chunks of large ones) that may wait per model; more are refused with 429.
    #[arg(long)]
    pub queue_capacity: Option<usize>,

    /// Nice value (0-19) of the executor threads, above the HTTP/gRPC threads' 0: under overload, decoding,
    /// admission and 429s keep the CPU they need and inference takes the rest.
    #[arg(long)]
    pub executor_niceness: Option<u8>,

    /// Dynamic batching: `on` groups queued requests into batches; `off` executes each request alone.
    #[arg(long, value_enum)]
    pub batching: Option<Switch>,

    /// When a free executor waits up to the queue delay for more requests to share its batch: `adaptive` only
    /// when the model's measured batch times predict that saves more than the wait (never on a CPU); `fixed`
    /// always, as Triton's dynamic batcher does (throughput on a GPU at the price of latency at low load).
    #[arg(long, value_enum)]
    pub batch_delay: Option<BatchDelay>,

    /// Ranking: `on` gathers each request's user-side embedding rows once and copies them to its candidates;
    /// `off` gathers them once per candidate, as the device gather does (the scores are the same).
    #[arg(long, value_enum)]
    pub gather_user_once: Option<Switch>,

    /// Embedding tables and indexes: `on` reads every page of their files in before a version is ready, so the
    /// first requests pay no page faults; `off` maps them and reads each page in when a request first touches it
    /// (ready sooner, less memory resident, slower first requests).
    #[arg(long, value_enum)]
    pub preload: Option<Switch>,

    /// Ranking: `on` runs a model whose `model.toml` has `[dense_graph.split]` as its user graph once per request
    /// and its item graph per candidate; `off` runs its whole graph (`[dense_graph] file`) on every row. CPU
    /// executors only.
    #[arg(long, value_enum)]
    pub split_graph: Option<Switch>,

    /// A batch closes when it holds this many rows; larger requests are split.
    #[arg(long)]
    pub max_batch_rows: Option<usize>,

    /// A batch closes when its oldest request has waited this many microseconds.
    #[arg(long)]
    pub max_queue_delay_us: Option<u64>,

    /// Batch sizes, ascending: each is warmed up before ready and estimates the batches up to it; executors on a
    /// GPU pad a batch up to the next one.
    #[arg(long, value_delimiter = ',')]
    pub batch_buckets: Option<Vec<usize>>,

    /// Deadline of requests that do not set x-recserve-deadline-ms (or grpc-timeout), in milliseconds.
    #[arg(long)]
    pub default_deadline_ms: Option<u64>,

    /// Serve this version of a model instead of its highest, as MODEL=VERSION; repeat or comma-separate. In the
    /// file: a `[pin]` table of versions by model.
    #[arg(
        long = "pin",
        value_delimiter = ',',
        value_name = "MODEL=VERSION",
        value_parser = parse_pin
    )]
    #[serde(default, with = "pin_table", skip_serializing_if = "Vec::is_empty")]
    pub pin: Vec<Pin>,

    /// Seconds to wait for in-flight requests after SIGTERM/SIGINT before exiting anyway.
    #[arg(long)]
    pub shutdown_timeout_s: Option<u64>,

    /// Milliseconds a connection may take to send a request's head (request line and headers), counted from its
    /// opening or from its first byte after an idle spell; slower connections are closed.
    #[arg(long)]
    pub header_read_timeout_ms: Option<u64>,

    /// Milliseconds a request's body (a gRPC request's messages) may take to arrive whole after its head; slower
    /// requests are answered 408 (gRPC: DEADLINE_EXCEEDED).
    #[arg(long)]
    pub body_read_timeout_ms: Option<u64>,

    /// Milliseconds a connection (HTTP/1 keep-alive, or HTTP/2 without an open stream) may stay idle before it is
    /// closed (HTTP/2 with GOAWAY).
    #[arg(long)]
    pub idle_timeout_ms: Option<u64>,

    /// Milliseconds a response may go without progress (the client reading none of it: HTTP/1 writes blocked,
    /// HTTP/2 flow control closed) before its connection is closed, with every response it holds; a connection
    /// holding more than 64 MiB of responses its client has not read is closed after 1 s without progress.
    #[arg(long)]
    pub write_timeout_ms: Option<u64>,

    /// HTTP/2 (gRPC) connections are pinged after this many milliseconds without a frame from the client, and
    /// closed when the ping is not answered within as long again; 0 turns pings off.
    #[arg(long)]
    pub http2_ping_interval_ms: Option<u64>,

    /// Most open client connections, HTTP and gRPC together; one more is closed as soon as it is accepted, and
    /// counted in recserve_connections_refused_total.
    #[arg(long)]
    pub max_connections: Option<usize>,

    /// How many of each minute's slowest requests `GET /debug/slow-requests` keeps, with their stages; 0 keeps
    /// none.
    #[arg(long)]
    pub slow_requests: Option<usize>,

    /// Log format on stderr; the level comes from RUST_LOG (default info).
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,

    /// OTLP/gRPC collector (http://HOST:4317) that OpenTelemetry spans of requests are sent to; unset, tracing is
    /// off: no spans, and responses carry no traceparent. Service name from OTEL_SERVICE_NAME (else recserve).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// Share (0-1) of the traces the server starts that it samples, with --otlp-endpoint; a request whose
    /// traceparent comes from a sampled span is always sampled, one from an unsampled span never.
    #[arg(long)]
    pub trace_sample_ratio: Option<f64>,

    /// Share (0-1) of requests to models written to the access log: one line each (JSON with --log-format json),
    /// target recserve::access; 0 logs none.
    #[arg(long)]
    pub access_log_sample_ratio: Option<f64>,

    /// Where embedding tables live: auto (every visible GPU when there is one, else the CPU), cpu, cuda (every
    /// visible GPU, or refuse to start) or cuda:N (GPU N only).
    #[arg(long, value_name = "auto|cpu|cuda[:N]")]
    pub device: Option<DeviceRequest>,

    /// ONNX Runtime execution provider for executors that gather on a GPU: auto (CUDA when the ONNX Runtime
    /// library has it, else the CPU), cpu, cuda or tensorrt (refuse to start when unavailable).
    #[arg(long, value_enum)]
    pub execution_provider: Option<ProviderRequest>,

    /// TensorRT may use fp16 kernels (only with --execution-provider tensorrt).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub tensorrt_fp16: Option<bool>,

    /// TensorRT may use int8 kernels, with the scales of the graph's QDQ nodes (only with --execution-provider
    /// tensorrt).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub tensorrt_int8: Option<bool>,

    /// Directory where TensorRT keeps built engines and timing caches, so restarts skip the build (only with
    /// --execution-provider tensorrt).
    #[arg(long)]
    pub tensorrt_engine_cache: Option<PathBuf>,

    /// How model versions change while serving: none (loaded once at start), poll (watch the repository every
    /// --repository-poll-s: new highest or pinned versions are swapped in, removed models unloaded) or explicit
    /// (only the repository API loads and unloads: POST /v2/repository/models/NAME/load).
    #[arg(long, value_enum)]
    pub model_control: Option<ModelControl>,

    /// Seconds between two looks at the repository with --model-control poll.
    #[arg(long)]
    pub repository_poll_s: Option<u64>,

    /// File holding the bearer token that the repository API (/v2/repository/..., gRPC Repository*) requires in
    /// `Authorization: Bearer TOKEN`; without it those calls are refused. Inference calls never need it.
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,

    /// File of the bearer tokens that inference calls need (every /v1 and /v2 route but health and the repository
    /// API; gRPC: every KServe call but ServerLive, ServerReady and Repository*), one token per line; blank lines and
    /// lines starting with '#' are skipped. Reread on SIGHUP and when it changes. Without it inference calls need no
    /// token.
    #[arg(long)]
    pub inference_tokens_file: Option<PathBuf>,

    /// PEM certificate chain (the server's own first) that both listeners serve TLS with (HTTP: ALPN h2 and
    /// http/1.1; gRPC: h2); needs --tls-key. Reread with the key and --tls-client-ca on SIGHUP and when one changes.
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificates: with it, every client must present a certificate issued by one of them (mutual TLS);
    /// needs --tls-cert.
    #[arg(long)]
    pub tls_client_ca: Option<PathBuf>,

    /// Nodes of the Redis Cluster that tables with `tier = "redis"` live in, as redis://HOST:PORT (or
    /// HOST:PORT); comma-separate several, any one of them is enough to find the rest.
    #[arg(long, value_delimiter = ',')]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redis_url: Vec<String>,

    /// Bytes of hot rows each model keeps in memory from its tables with `tier = "redis"` (rows as stored plus
    /// 64 bytes each).
    #[arg(long)]
    pub embedding_cache_bytes: Option<u64>,

    /// Longest a batch waits for the rows it fetches from the Redis tier, in milliseconds, within its deadline;
    /// rows not fetched by then follow their table's `unfetched` policy. Bounds how long a dead or slow node holds
    /// an executor.
    #[arg(long)]
    pub redis_fetch_timeout_ms: Option<u64>,

    /// `[pipelines.NAME]`: only in the file (a pipeline is a table, not a flag).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pipelines: BTreeMap<String, PipelineConfig>,

    /// `[models.NAME]`: a model's version policy, traffic split and shadow; only in the file.
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, ModelSettings>,
}

/// A version to serve instead of a model's highest (`--pin MODEL=VERSION`, `[pin] MODEL = VERSION`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pin {
    pub model: String,
    pub version: u64,
}

/// Parses `MODEL=VERSION`.
fn parse_pin(pin: &str) -> Result<Pin, String> {
    let bad =
        || format!("--pin (RECSERVE_PIN) takes MODEL=VERSION with a version ≥ 1, got {pin:?}");
    let (model, version) = pin.split_once('=').ok_or_else(bad)?;
    let version: u64 = version.trim().parse().map_err(|_| bad())?;
    if model.trim().is_empty() || version == 0 {
        return Err(bad());
    }
    Ok(Pin {
        model: model.trim().to_owned(),
        version,
    })
}

/// `[pin]` in the file and the pins of the flags, as one table (a later pin of a model wins).
pub(super) mod pin_table {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(pins: &[Pin], serializer: S) -> Result<S::Ok, S::Error> {
        let table: BTreeMap<&str, u64> =
            pins.iter().map(|p| (p.model.as_str(), p.version)).collect();
        table.serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<Pin>, D::Error> {
        let table = BTreeMap::<String, u64>::deserialize(deserializer)?;
        Ok(table
            .into_iter()
            .map(|(model, version)| Pin { model, version })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use clap::CommandFactory;

    use super::*;
    use crate::config::Cli;

    /// Every flag of `serve` and `check-config` reads the environment variable its name derives, shows at most one
    /// default, from its setting, and that default is the one `resolve` applies when nothing is given.
    #[test]
    fn flags_show_their_env_and_their_settings_default() {
        let defaults = shown_defaults();
        let nothing_given = ServeArgs {
            repository: Some("r".into()),
            ..ServeArgs::default()
        };
        let applied: toml::Table =
            toml::from_str(&nothing_given.resolve().expect("defaults").to_toml()).expect("TOML");
        assert!(
            defaults["--max-batch-rows"]
                .ends_with(&format!("else {}", MAX_BATCH_ROWS_SETTING.default))
        );

        let cli = Cli::command();
        for name in ["serve", "check-config"] {
            let command = cli.find_subcommand(name).expect(name);
            let mut flags = BTreeSet::new();
            for arg in command.get_arguments() {
                let flag = format!("--{}", arg.get_long().expect("settings are long flags"));
                assert_eq!(
                    arg.get_env(),
                    Some(OsStr::new(&env_var(&flag))),
                    "{name} {flag}"
                );
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                assert!(
                    help.matches("[default: ").count() <= 1,
                    "{flag}: a default written by hand as well: {help}"
                );
                match defaults.get(flag.as_str()) {
                    Some(default) => assert!(
                        help.ends_with(&format!(" [default: {default}]")),
                        "{flag}: {help}"
                    ),
                    None => assert!(
                        !help.contains("[default: "),
                        "{flag} shows a default of no setting: {help}"
                    ),
                }
                // The repository is given above, the library's default depends on ORT_DYLIB_PATH (a rule), and a
                // table (`[pin]`) is empty.
                if let Some(value) = applied.get(&file_key(&flag))
                    && !value.is_table()
                    && !["--repository", "--ort-library"].contains(&flag.as_str())
                {
                    assert_eq!(
                        defaults.get(flag.as_str()),
                        Some(&shown(value)),
                        "{flag}: the default shown is not the one applied"
                    );
                }
                flags.insert(flag);
            }
            for flag in defaults.keys() {
                assert!(flags.contains(*flag), "{flag} is no flag of {name}");
            }
        }
    }
}
