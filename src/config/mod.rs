//! Server configuration: command-line flags, each with a `RECSERVE_*` environment variable, over an optional TOML
//! file, over defaults. The settings are spelled once ([`ServeArgs`], in [`settings`], which clap and serde both
//! read); [`ServeArgs::resolve`] merges the layers into a [`Config`], validates it with messages that name the
//! flag, and builds the typed settings that components take whole ([`RequestLimits`], [`BatchSettings`],
//! [`SessionOptions`], [`Timeouts`]).

mod models;
mod settings;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

pub(crate) use models::split_of;
pub use models::{ModelSettings, ShadowSettings};
use settings::{
    ACCESS_LOG_SAMPLE_RATIO, BATCH_DELAY, BATCHING, BODY_READ_TIMEOUT_MS,
    DEFAULT_DEADLINE_MS_SETTING, DEVICE, EMBEDDING_CACHE_BYTES, EXECUTION_PROVIDER,
    EXECUTOR_NICENESS, EXECUTORS, GATHER_USER_ONCE, GRPC_ADDR, HEADER_READ_TIMEOUT_MS, HTTP_ADDR,
    HTTP2_PING_INTERVAL_MS, IDLE_TIMEOUT_MS, INTRA_OP_THREADS, LOG_FORMAT, MAX_BATCH_ROWS_SETTING,
    MAX_BODY_BYTES, MAX_CANDIDATES, MAX_CONNECTIONS, MAX_EXCLUDE, MAX_HISTORY,
    MAX_QUEUE_DELAY_US_SETTING, MAX_REPLY_ITEMS, MODEL_CONTROL, ORT_LIBRARY_FALLBACK, PRELOAD,
    QUEUE_CAPACITY, REDIS_FETCH_TIMEOUT_MS, REPOSITORY_POLL_S, SHARDS, SHUTDOWN_TIMEOUT_S,
    SLOW_REQUESTS, SPLIT_GRAPH, TENSORRT_FP16, TENSORRT_INT8, TRACE_SAMPLE_RATIO, WRITE_TIMEOUT_MS,
};
pub use settings::{Choice, Pin, ServeArgs, Setting, env_var, file_key, shown_defaults};

use recserve_core::batching::BatchSettings;
use recserve_core::embedding::Preload;
use recserve_core::embedding::remote::TierContext;
use recserve_core::executor::{Runtime, SessionOptions};
use recserve_core::gpu::{self, DeviceRequest, Placement, ProviderRequest, TensorRtOptions};
use recserve_core::metrics::Metrics;
pub(crate) use recserve_core::pipeline::PipelineConfig;
use recserve_core::registry::{LoadContext, RequestLimits};
use recserve_core::repository::VersionPolicy;

/// recserve: a low-latency inference server for recommendation models (DeepFM ranking, LightGCN recall).
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the models of a model repository over HTTP and gRPC.
    Serve(ServeArgs),
    /// Validate the configuration (flags, environment, file) and print it as TOML, then load what `serve` would
    /// load at start (the admin token file, ONNX Runtime, the device, every model of the repository, not warmed
    /// up, and the pipelines over them) without serving: exit status 1 when the server would not start.
    CheckConfig(CheckConfigArgs),
    /// Check every version of every model of a repository with the server's loader, without serving: one line
    /// per version, exit status 1 when the server would refuse any.
    CheckRepository(CheckRepositoryArgs),
}

/// Flags of `check-config`: those of `serve`, and one of its own.
#[derive(Clone, Debug, Args)]
pub struct CheckConfigArgs {
    #[command(flatten)]
    pub serve: ServeArgs,

    /// Check the settings only: do not read the repository, the token file or ONNX Runtime (for a configuration
    /// written for another machine, such as a container image's paths).
    #[arg(long, env = "RECSERVE_SETTINGS_ONLY")]
    pub settings_only: bool,
}

/// Flags of `check-repository`.
#[derive(Clone, Debug, Args)]
pub struct CheckRepositoryArgs {
    /// Model repository: <repository>/<model>/<version>/model.toml.
    pub(crate) repository: PathBuf,

    /// Print the report as one JSON document on stdout instead of one line per version.
    #[arg(long)]
    pub(crate) json: bool,

    /// The server's TOML config file: the check loads with its settings (warm-up batch sizes, device, split
    /// graph), as `serve --config` would.
    #[arg(long, env = "RECSERVE_CONFIG")]
    pub(crate) config: Option<PathBuf>,

    /// ONNX Runtime shared library [default: $ORT_DYLIB_PATH, else libonnxruntime.so on the system library path].
    #[arg(long, env = "RECSERVE_ORT_LIBRARY")]
    pub(crate) ort_library: Option<PathBuf>,

    /// The server's --max-candidates: the largest warm-up batch [default: the server's].
    #[arg(long, env = "RECSERVE_MAX_CANDIDATES")]
    pub(crate) max_candidates: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    On,
    Off,
}

/// When a free executor waits for more requests to share its batch (`--batch-delay`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchDelay {
    /// Only when the model's measured batch times predict that waiting pays (never on a CPU, where a batch costs
    /// about the same per row at any size), at most `max_queue_delay_us`.
    #[default]
    Adaptive,
    /// Always, up to `max_queue_delay_us` or a full batch, as Triton's dynamic batcher does.
    Fixed,
}

/// How model versions change while serving (`--model-control`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelControl {
    /// Every model is loaded once, at start.
    #[default]
    None,
    /// The repository is watched; new versions are swapped in, removed models unloaded.
    Poll,
    /// The repository API loads and unloads models.
    Explicit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Tracing and the access log, as the server's connections take them (`--otlp-endpoint`, `--trace-sample-ratio`,
/// `--access-log-sample-ratio`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TelemetrySettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    pub trace_sample_ratio: f64,
    pub access_log_sample_ratio: f64,
}

// The ratios were checked to lie in [0, 1] (never NaN).
impl Eq for TelemetrySettings {}

/// Most candidates a pipeline may rank per request.
pub(crate) const MAX_PIPELINE_CANDIDATES: usize = 100_000;

/// The resolved, validated configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Config {
    pub repository: PathBuf,
    pub http_addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    pub ort_library: PathBuf,
    /// ONNX Runtime sessions, as every executor's takes them (`--intra-op-threads`, `--execution-provider`,
    /// `--tensorrt-*`).
    #[serde(flatten)]
    pub(crate) session: SessionOptions,
    pub(crate) executors: usize,
    pub(crate) shards: usize,
    /// What one request may carry, as the models' contracts take it.
    #[serde(flatten)]
    pub(crate) limits: RequestLimits,
    pub max_body_bytes: usize,
    /// Batching, as every model's batcher takes it (over the model's `[batching]`).
    #[serde(flatten)]
    pub batch: BatchSettings,
    /// `--gather-user-once`.
    pub(crate) gather_user_once: Switch,
    /// `--preload`.
    pub(crate) preload: Switch,
    /// `--split-graph`.
    pub(crate) split_graph: Switch,
    pub pin: HashMap<String, u64>,
    pub(crate) shutdown_timeout_s: u64,
    /// How long connections may take and stay idle, as the server's connections take it.
    #[serde(flatten)]
    pub(crate) timeouts: Timeouts,
    pub(crate) max_connections: usize,
    pub(crate) slow_requests: usize,
    pub log_format: LogFormat,
    /// Tracing and the access log.
    #[serde(flatten)]
    pub telemetry: TelemetrySettings,
    pub device: DeviceRequest,
    pub(crate) model_control: ModelControl,
    pub(crate) repository_poll_s: u64,
    /// The token's file, never the token (`check-config` prints this configuration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) admin_token_file: Option<PathBuf>,
    /// The tokens' file, never the tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) inference_tokens_file: Option<PathBuf>,
    /// `--tls-cert`, `--tls-key`, `--tls-client-ca`; `None`: plain TCP.
    #[serde(flatten)]
    pub(crate) tls: Option<TlsFiles>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) redis_url: Vec<String>,
    pub(crate) embedding_cache_bytes: u64,
    pub redis_fetch_timeout_ms: u64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) pipelines: BTreeMap<String, PipelineConfig>,
    /// `[models.NAME]`, checked.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) models: BTreeMap<String, ModelSettings>,
    /// Each model's version policy: `[models.NAME] versions`, and `--pin` as `specific = [V]`.
    #[serde(skip)]
    pub policies: HashMap<String, VersionPolicy>,
}

impl Config {
    /// What loading a model takes: the settings of this configuration that the core's components read, with the
    /// runtime, metrics and device placement the server has set up.
    pub fn load_context(
        &self,
        runtime: Runtime,
        metrics: Metrics,
        placement: Placement,
    ) -> LoadContext {
        let tier_client_replaced = metrics.tier_client_replaced();
        LoadContext {
            runtime,
            metrics,
            session: self.session.clone(),
            placement,
            executors: self.executors,
            shards: self.shards,
            limits: self.limits,
            batching: self.batch.clone(),
            gather_user_once: self.gather_user_once == Switch::On,
            preload: match self.preload {
                Switch::On => Preload::Populate,
                Switch::Off => Preload::OnDemand,
            },
            split_graph: self.split_graph == Switch::On,
            tier: TierContext::new(
                self.redis_url.clone(),
                self.embedding_cache_bytes,
                std::time::Duration::from_millis(self.redis_fetch_timeout_ms),
                tier_client_replaced,
            ),
            warm_up: true,
        }
    }
}

/// The files both listeners serve TLS with (`tls.rs` reads them at start and on SIGHUP).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct TlsFiles {
    #[serde(rename = "tls_cert")]
    pub(crate) cert: PathBuf,
    #[serde(rename = "tls_key")]
    pub(crate) key: PathBuf,
    /// Clients must present a certificate one of these CAs issued.
    #[serde(rename = "tls_client_ca", skip_serializing_if = "Option::is_none")]
    pub(crate) client_ca: Option<PathBuf>,
}

/// The connection settings of the configuration, which the connection layer (`server/connections.rs`) takes. Serialized with the keys of the config file, in milliseconds
/// (`check-config` prints them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Timeouts {
    #[serde(rename = "header_read_timeout_ms", serialize_with = "millis")]
    pub(crate) header_read: Duration,
    #[serde(rename = "body_read_timeout_ms", serialize_with = "millis")]
    pub(crate) body_read: Duration,
    #[serde(rename = "idle_timeout_ms", serialize_with = "millis")]
    pub(crate) idle: Duration,
    #[serde(rename = "write_timeout_ms", serialize_with = "millis")]
    pub(crate) write: Duration,
    /// `None`: no HTTP/2 pings (0 in the file).
    #[serde(rename = "http2_ping_interval_ms", serialize_with = "millis_or_0")]
    pub(crate) http2_ping: Option<Duration>,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn millis_or_0<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    millis(&d.unwrap_or_default(), s)
}

/// A configuration that cannot be used; the message names the flag.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Checks each `[pipelines.NAME]` on its own; whether its models exist and fit is checked when they are loaded.
fn check_pipelines(pipelines: &BTreeMap<String, PipelineConfig>) -> Result<(), ConfigError> {
    for (name, p) in pipelines {
        if !recserve_core::repository::is_valid_model_name(name) {
            return Err(ConfigError(format!(
                "[pipelines.{name}]: pipeline names may contain only letters, digits, '_' and '-' (at most 128)"
            )));
        }
        for (key, model) in [
            ("recall_model", &p.recall_model),
            ("ranking_model", &p.ranking_model),
        ] {
            if model.is_empty() {
                return Err(ConfigError(format!(
                    "pipelines.{name}.{key} must name a model of the repository"
                )));
            }
        }
        if !(1..=MAX_PIPELINE_CANDIDATES).contains(&p.candidates) {
            return Err(ConfigError(format!(
                "pipelines.{name}.candidates must be between 1 and {MAX_PIPELINE_CANDIDATES}, got {}",
                p.candidates
            )));
        }
        if !(1..=p.candidates).contains(&p.k) {
            return Err(ConfigError(format!(
                "pipelines.{name}.k must be between 1 and candidates ({}), got {}",
                p.candidates, p.k
            )));
        }
    }
    Ok(())
}

impl ServeArgs {
    /// Reads the config file if one is given, lays these settings (flags and environment) over it and the
    /// defaults under it, and checks the result.
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        self.over_file()?.settle()
    }

    /// These settings over the config file's: a setting given here wins, and tables (`[pin]`) merge key by key.
    fn over_file(&self) -> Result<ServeArgs, ConfigError> {
        let Some(path) = &self.config else {
            return Ok(self.clone());
        };
        let in_file =
            |e: &dyn std::fmt::Display| ConfigError(format!("--config {}: {e}", path.display()));
        let text = std::fs::read_to_string(path)
            .map_err(|e| in_file(&format_args!("cannot read: {e}")))?;
        // Parsed once as settings, so that a problem of the file alone is reported with its line.
        toml::from_str::<ServeArgs>(&text).map_err(|e| in_file(&e))?;
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| in_file(&e))?;
        let flags = toml::Table::try_from(self)
            .map_err(|e| ConfigError(format!("cannot merge the flags with --config: {e}")))?;
        merge(&mut table, flags);
        table.try_into().map_err(|e| in_file(&e))
    }

    /// The configuration these settings make, with defaults for what they do not set, every value checked.
    fn settle(self) -> Result<Config, ConfigError> {
        let repository = self.repository.ok_or_else(|| {
            ConfigError(
                "--repository (RECSERVE_REPOSITORY) is required: the model repository directory"
                    .to_owned(),
            )
        })?;
        let ort_library = self
            .ort_library
            .or_else(|| {
                std::env::var_os("ORT_DYLIB_PATH")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .unwrap_or_else(|| PathBuf::from(ORT_LIBRARY_FALLBACK));
        let mut pin = HashMap::new();
        for Pin { model, version } in self.pin {
            if version == 0 {
                return Err(ConfigError(format!(
                    "pin for model {model:?}: versions start at 1"
                )));
            }
            pin.insert(model, version);
        }
        check_pipelines(&self.pipelines)?;
        let policies = models::check(&self.models, &pin)?;
        let http_addr = HTTP_ADDR.resolve(self.http_addr);
        let grpc_addr = GRPC_ADDR.resolve(self.grpc_addr);
        if grpc_addr == http_addr && grpc_addr.port() != 0 {
            return Err(ConfigError(format!(
                "--grpc-addr (RECSERVE_GRPC_ADDR) must differ from --http-addr (RECSERVE_HTTP_ADDR), both are {grpc_addr}"
            )));
        }
        let device = DEVICE.resolve(self.device);
        let execution_provider = EXECUTION_PROVIDER.resolve(self.execution_provider);
        let tensorrt = TensorRtOptions {
            fp16: TENSORRT_FP16.resolve(self.tensorrt_fp16),
            int8: TENSORRT_INT8.resolve(self.tensorrt_int8),
            engine_cache: self.tensorrt_engine_cache,
        };
        check_device(device, execution_provider, &tensorrt)?;
        if let Some(buckets) = &self.batch_buckets {
            recserve_core::repository::check_buckets(buckets).map_err(|problem| {
                ConfigError(format!(
                    "--batch-buckets (RECSERVE_BATCH_BUCKETS) {problem}"
                ))
            })?;
        }
        let tls = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                client_ca: self.tls_client_ca,
            }),
            (None, None) if self.tls_client_ca.is_some() => {
                return Err(ConfigError(
                    "--tls-client-ca (RECSERVE_TLS_CLIENT_CA) needs --tls-cert and --tls-key: client certificates \
                     are asked for only over TLS"
                        .to_owned(),
                ));
            }
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                return Err(ConfigError(
                    "--tls-cert (RECSERVE_TLS_CERT) and --tls-key (RECSERVE_TLS_KEY) go together: give both, or \
                     neither for plain TCP"
                        .to_owned(),
                ));
            }
        };
        Ok(Config {
            repository,
            http_addr,
            grpc_addr,
            ort_library,
            session: SessionOptions {
                intra_op_threads: INTRA_OP_THREADS.resolve(self.intra_op_threads)?,
                provider: execution_provider,
                tensorrt,
                cuda_device: None,
            },
            executors: EXECUTORS.resolve(self.executors)?,
            shards: SHARDS.resolve(self.shards)?,
            limits: RequestLimits {
                max_candidates: MAX_CANDIDATES.resolve(self.max_candidates)?,
                max_history: MAX_HISTORY.resolve(self.max_history)?,
                max_exclude: MAX_EXCLUDE.resolve(self.max_exclude)?,
                max_reply_items: MAX_REPLY_ITEMS.resolve(self.max_reply_items)?,
            },
            max_body_bytes: MAX_BODY_BYTES.resolve(self.max_body_bytes)?,
            batch: BatchSettings {
                enabled: BATCHING.resolve(self.batching) == Switch::On,
                fixed_delay: BATCH_DELAY.resolve(self.batch_delay) == BatchDelay::Fixed,
                max_batch_rows: self
                    .max_batch_rows
                    .map(|v| MAX_BATCH_ROWS_SETTING.check(v))
                    .transpose()?,
                max_queue_delay_us: self
                    .max_queue_delay_us
                    .map(|v| MAX_QUEUE_DELAY_US_SETTING.check(v))
                    .transpose()?,
                buckets: self.batch_buckets,
                default_deadline_ms: self
                    .default_deadline_ms
                    .map(|v| DEFAULT_DEADLINE_MS_SETTING.check(v))
                    .transpose()?,
                queue_capacity: QUEUE_CAPACITY.resolve(self.queue_capacity)?,
                executor_niceness: EXECUTOR_NICENESS.resolve(self.executor_niceness)?,
            },
            gather_user_once: GATHER_USER_ONCE.resolve(self.gather_user_once),
            preload: PRELOAD.resolve(self.preload),
            split_graph: SPLIT_GRAPH.resolve(self.split_graph),
            pin,
            policies,
            shutdown_timeout_s: SHUTDOWN_TIMEOUT_S.resolve(self.shutdown_timeout_s)?,
            timeouts: Timeouts {
                header_read: Duration::from_millis(
                    HEADER_READ_TIMEOUT_MS.resolve(self.header_read_timeout_ms)?,
                ),
                body_read: Duration::from_millis(
                    BODY_READ_TIMEOUT_MS.resolve(self.body_read_timeout_ms)?,
                ),
                idle: Duration::from_millis(IDLE_TIMEOUT_MS.resolve(self.idle_timeout_ms)?),
                write: Duration::from_millis(WRITE_TIMEOUT_MS.resolve(self.write_timeout_ms)?),
                http2_ping: Some(HTTP2_PING_INTERVAL_MS.resolve(self.http2_ping_interval_ms)?)
                    .filter(|&ms| ms > 0)
                    .map(Duration::from_millis),
            },
            max_connections: MAX_CONNECTIONS.resolve(self.max_connections)?,
            slow_requests: SLOW_REQUESTS.resolve(self.slow_requests)?,
            log_format: LOG_FORMAT.resolve(self.log_format),
            telemetry: TelemetrySettings {
                otlp_endpoint: self
                    .otlp_endpoint
                    .map(|url| check_otlp_endpoint(&url).map(|()| url))
                    .transpose()?,
                trace_sample_ratio: TRACE_SAMPLE_RATIO.resolve(self.trace_sample_ratio)?,
                access_log_sample_ratio: ACCESS_LOG_SAMPLE_RATIO
                    .resolve(self.access_log_sample_ratio)?,
            },
            device,
            model_control: MODEL_CONTROL.resolve(self.model_control),
            repository_poll_s: REPOSITORY_POLL_S.resolve(self.repository_poll_s)?,
            admin_token_file: self.admin_token_file,
            inference_tokens_file: self.inference_tokens_file,
            tls,
            redis_url: self.redis_url,
            embedding_cache_bytes: EMBEDDING_CACHE_BYTES.resolve(self.embedding_cache_bytes)?,
            redis_fetch_timeout_ms: REDIS_FETCH_TIMEOUT_MS.resolve(self.redis_fetch_timeout_ms)?,
            pipelines: self.pipelines,
            models: self.models,
        })
    }
}

/// The collector's address must be a plain-HTTP gRPC URL: TLS to the collector is not built in (a collector
/// agent beside the server is the usual set-up).
fn check_otlp_endpoint(url: &str) -> Result<(), ConfigError> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        ConfigError(format!(
            "--otlp-endpoint (RECSERVE_OTLP_ENDPOINT) must be http://HOST:PORT (OTLP over gRPC without TLS), got \
             {url:?}"
        ))
    })?;
    if rest.trim_end_matches('/').is_empty() {
        return Err(ConfigError(format!(
            "--otlp-endpoint (RECSERVE_OTLP_ENDPOINT) names no host: {url:?}"
        )));
    }
    Ok(())
}

/// Lays `over` onto `under`: values of `over` replace those of `under`, except that two tables merge key by key.
fn merge(under: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (under.get_mut(&key), value) {
            (Some(toml::Value::Table(below)), toml::Value::Table(above)) => merge(below, above),
            (_, value) => {
                under.insert(key, value);
            }
        }
    }
}

/// Checks `--device`, `--execution-provider` and the `--tensorrt-*` flags against each other and the build.
fn check_device(
    device: DeviceRequest,
    provider: ProviderRequest,
    tensorrt: &TensorRtOptions,
) -> Result<(), ConfigError> {
    if let DeviceRequest::Cuda(_) = device
        && !gpu::BUILT_WITH_CUDA
    {
        return Err(ConfigError(format!(
            "--device (RECSERVE_DEVICE) {device}: {}",
            gpu::GpuError::NotBuilt
        )));
    }
    match provider {
        ProviderRequest::Auto | ProviderRequest::Cpu => {}
        ProviderRequest::Cuda | ProviderRequest::Tensorrt => {
            if device == DeviceRequest::Cpu {
                return Err(ConfigError(format!(
                    "--execution-provider (RECSERVE_EXECUTION_PROVIDER) {} runs the dense network on the GPU that \
                     gathers the embeddings, so it needs --device auto or cuda, not cpu",
                    provider.as_str()
                )));
            }
            if !gpu::BUILT_WITH_CUDA {
                return Err(ConfigError(format!(
                    "--execution-provider (RECSERVE_EXECUTION_PROVIDER) {}: {}",
                    provider.as_str(),
                    gpu::GpuError::NotBuilt
                )));
            }
        }
    }
    if provider != ProviderRequest::Tensorrt {
        for (set, flag) in [
            (tensorrt.fp16, "--tensorrt-fp16 (RECSERVE_TENSORRT_FP16)"),
            (tensorrt.int8, "--tensorrt-int8 (RECSERVE_TENSORRT_INT8)"),
            (
                tensorrt.engine_cache.is_some(),
                "--tensorrt-engine-cache (RECSERVE_TENSORRT_ENGINE_CACHE)",
            ),
        ] {
            if set {
                return Err(ConfigError(format!(
                    "{flag} applies only with --execution-provider tensorrt, not {}",
                    provider.as_str()
                )));
            }
        }
    }
    if let Some(dir) = &tensorrt.engine_cache
        && dir.exists()
        && !dir.is_dir()
    {
        return Err(ConfigError(format!(
            "--tensorrt-engine-cache (RECSERVE_TENSORRT_ENGINE_CACHE) {} exists and is not a directory",
            dir.display()
        )));
    }
    Ok(())
}

impl Config {
    /// The configuration as a TOML config file would hold it.
    pub fn to_toml(&self) -> String {
        toml::to_string(self)
            .unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec!["recserve", "serve"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| ConfigError(e.to_string()))?;
        match cli.command {
            Command::Serve(args) => args.resolve(),
            Command::CheckConfig(args) => args.serve.resolve(),
            Command::CheckRepository(_) => unreachable!("parse passes `serve`"),
        }
    }

    #[test]
    fn tracing_is_off_unless_an_endpoint_is_given_and_ratios_lie_in_0_1() {
        let base = ["--repository", "/models", "--ort-library", "/lib/ort.so"];
        let with = |extra: &[&str]| {
            let mut args = base.to_vec();
            args.extend_from_slice(extra);
            parse(&args)
        };
        let off = with(&[]).expect("valid");
        assert_eq!(off.telemetry.otlp_endpoint, None);
        assert_eq!(off.telemetry.access_log_sample_ratio, 0.0);
        let on = with(&[
            "--otlp-endpoint",
            "http://collector:4317",
            "--trace-sample-ratio",
            "0.5",
        ])
        .expect("valid");
        assert_eq!(
            on.telemetry.otlp_endpoint.as_deref(),
            Some("http://collector:4317")
        );
        assert_eq!(on.telemetry.trace_sample_ratio, 0.5);
        let refused = |extra: &[&str]| with(extra).expect_err("refused").0;
        assert!(
            refused(&["--otlp-endpoint", "https://collector:4317"]).contains("http://HOST:PORT")
        );
        assert!(refused(&["--otlp-endpoint", "http://"]).contains("names no host"));
        assert_eq!(
            refused(&["--trace-sample-ratio", "1.5"]),
            "--trace-sample-ratio (RECSERVE_TRACE_SAMPLE_RATIO) must be between 0 and 1, got 1.5"
        );
        assert!(refused(&["--access-log-sample-ratio=-0.1"]).contains("between 0 and 1"));
    }

    #[test]
    fn applies_defaults() {
        let config =
            parse(&["--repository", "/models", "--ort-library", "/lib/ort.so"]).expect("valid");
        assert_eq!(config.http_addr, "0.0.0.0:8000".parse().expect("addr"));
        assert_eq!(config.grpc_addr, "0.0.0.0:8001".parse().expect("addr"));
        assert_eq!(
            (
                config.session.intra_op_threads,
                config.executors,
                config.shards,
                config.limits.max_candidates
            ),
            (1, 1, 1, 1000)
        );
        assert_eq!(config.log_format, LogFormat::Text);
        assert_eq!(config.limits.max_reply_items, 100_000);
    }

    #[test]
    fn connection_settings_have_defaults_file_keys_and_ranges() {
        let config = parse(&["--repository", "r"]).expect("valid");
        let ms = |d: Duration| d.as_millis() as u64;
        let connections = |c: &Config| {
            (
                ms(c.timeouts.header_read),
                ms(c.timeouts.body_read),
                ms(c.timeouts.idle),
                c.timeouts.http2_ping.map_or(0, ms),
                c.max_connections,
            )
        };
        assert_eq!(
            connections(&config),
            (10_000, 30_000, 75_000, 20_000, 10_000)
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("recserve.toml");
        std::fs::write(
            &file,
            "repository = \"r\"\nheader_read_timeout_ms = 200\nbody_read_timeout_ms = 300\n\
             idle_timeout_ms = 400\nhttp2_ping_interval_ms = 0\nmax_connections = 3\n",
        )
        .expect("write");
        let config = parse(&["--config", file.to_str().expect("utf-8")]).expect("valid");
        assert_eq!(connections(&config), (200, 300, 400, 0, 3));
        assert_eq!(
            parse(&["--repository", "r", "--max-connections", "0"]).expect_err("0"),
            ConfigError(
                "--max-connections (RECSERVE_MAX_CONNECTIONS) must be between 1 and 1000000, got 0"
                    .to_owned()
            )
        );
        assert_eq!(
            parse(&["--repository", "r", "--header-read-timeout-ms", "1"]).expect_err("1 ms"),
            ConfigError(
                "--header-read-timeout-ms (RECSERVE_HEADER_READ_TIMEOUT_MS) must be between 10 and 3600000, got 1"
                    .to_owned()
            )
        );
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("recserve.toml");
        std::fs::write(
            &file,
            "repository = \"/from-file\"\nexecutors = 3\nshards = 2\n[pin]\ndeepfm = 4\nother = 1\n",
        )
        .expect("write");
        let config = parse(&[
            "--config",
            file.to_str().expect("utf-8"),
            "--shards",
            "8",
            "--pin",
            "deepfm=2",
        ])
        .expect("valid");
        assert_eq!(config.repository, PathBuf::from("/from-file"));
        assert_eq!((config.executors, config.shards), (3, 8));
        assert_eq!(
            config.pin,
            HashMap::from([("deepfm".into(), 2), ("other".into(), 1)])
        );
    }

    #[test]
    fn messages_name_the_flag() {
        let cases: [(&[&str], &str); 7] = [
            (&[], "--repository (RECSERVE_REPOSITORY) is required"),
            (
                &["--repository", "r", "--executors", "0"],
                "--executors (RECSERVE_EXECUTORS) must be between 1 and 64, got 0",
            ),
            (
                &["--repository", "r", "--max-body-bytes", "10"],
                "--max-body-bytes (RECSERVE_MAX_BODY_BYTES) must be between 1024",
            ),
            (
                &["--repository", "r", "--pin", "deepfm"],
                "--pin (RECSERVE_PIN) takes MODEL=VERSION",
            ),
            (
                &["--repository", "r", "--pin", "deepfm=0"],
                "--pin (RECSERVE_PIN) takes MODEL=VERSION",
            ),
            (&["--repository", "r", "--http-addr", "nope"], "--http-addr"),
            (
                &["--repository", "r", "--grpc-addr", "0.0.0.0:8000"],
                "--grpc-addr (RECSERVE_GRPC_ADDR) must differ from --http-addr",
            ),
        ];
        for (args, expected) in cases {
            let err = parse(args).expect_err("invalid");
            assert!(
                err.0.contains(expected),
                "expected {expected:?} in {:?}",
                err.0
            );
        }
    }

    #[test]
    fn device_and_provider_flags() {
        let config = parse(&["--repository", "r"]).expect("defaults");
        assert_eq!(
            (config.device, config.session.provider),
            (DeviceRequest::Auto, ProviderRequest::Auto)
        );
        assert_eq!(config.session.tensorrt, TensorRtOptions::default());
        let config = parse(&["--repository", "r", "--device", "cpu"]).expect("cpu");
        assert_eq!(config.device, DeviceRequest::Cpu);

        let err = parse(&["--repository", "r", "--device", "gpu0"]).expect_err("bad value");
        assert!(
            err.0.contains("expected auto, cpu, cuda or cuda:N"),
            "{}",
            err.0
        );
        let err = parse(&[
            "--repository",
            "r",
            "--device",
            "cpu",
            "--execution-provider",
            "cuda",
        ])
        .expect_err("GPU provider on the CPU");
        assert!(
            err.0
                .contains("--execution-provider (RECSERVE_EXECUTION_PROVIDER) cuda")
                && err.0.contains("not cpu"),
            "{}",
            err.0
        );
        let err = parse(&["--repository", "r", "--tensorrt-fp16"]).expect_err("no TensorRT");
        assert!(
            err.0
                .contains("--tensorrt-fp16 (RECSERVE_TENSORRT_FP16) applies only with"),
            "{}",
            err.0
        );
        let err = parse(&["--repository", "r", "--device", "cuda:1"]);
        if gpu::BUILT_WITH_CUDA {
            assert_eq!(
                err.expect("valid in a CUDA build").device,
                DeviceRequest::Cuda(Some(1))
            );
        } else {
            let err = err.expect_err("no CUDA in this build");
            assert!(
                err.0.contains("--device (RECSERVE_DEVICE) cuda:1")
                    && err.0.contains("--features cuda"),
                "{}",
                err.0
            );
        }
    }

    #[test]
    fn tensorrt_settings_from_the_file() {
        if !gpu::BUILT_WITH_CUDA {
            // Without CUDA the provider itself is refused (device_and_provider_flags checks that message).
            let err = parse(&["--repository", "r", "--execution-provider", "tensorrt"])
                .expect_err("no CUDA in this build");
            assert!(err.0.contains("--features cuda"), "{}", err.0);
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "repository = \"/m\"\ndevice = \"cuda:0\"\nexecution_provider = \"tensorrt\"\n\
             tensorrt_fp16 = true\ntensorrt_engine_cache = \"/var/cache/trt\"\n",
        )
        .expect("write");
        let config =
            parse(&["--config", file.to_str().expect("utf-8"), "--tensorrt-int8"]).expect("valid");
        assert_eq!(config.device, DeviceRequest::Cuda(Some(0)));
        assert_eq!(config.session.provider, ProviderRequest::Tensorrt);
        assert_eq!(
            config.session.tensorrt,
            TensorRtOptions {
                fp16: true,
                int8: true,
                engine_cache: Some(PathBuf::from("/var/cache/trt")),
            }
        );
        let text = config.to_toml();
        assert!(text.contains("device = \"cuda:0\""), "{text}");
        assert!(text.contains("execution_provider = \"tensorrt\""), "{text}");
    }

    #[test]
    fn refuses_unknown_file_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "repository = \"/m\"\nexecutor = 2\n").expect("write");
        let err = parse(&["--config", file.to_str().expect("utf-8")]).expect_err("typo");
        assert!(err.0.contains("unknown field `executor`"), "{}", err.0);
    }

    #[test]
    fn renders_back_to_toml() {
        let config = parse(&[
            "--repository",
            "/m",
            "--ort-library",
            "/o.so",
            "--pin",
            "a=3",
        ])
        .expect("valid");
        let text = config.to_toml();
        assert!(text.contains("repository = \"/m\""), "{text}");
        assert!(text.contains("[pin]\na = 3"), "{text}");
    }

    #[test]
    fn pipelines_and_recall_limits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("c.toml");
        let write = |text: &str| std::fs::write(&file, text).expect("write");
        let path = file.to_str().expect("utf-8").to_owned();
        write(
            "repository = \"/m\"\nmax_exclude = 50\n\n[pipelines.feed]\nrecall_model = \"lightgcn\"\n\
             ranking_model = \"deepfm\"\ncandidates = 200\nk = 20\n",
        );
        let config = parse(&["--config", &path, "--max-history", "7"]).expect("valid");
        assert_eq!(
            (config.limits.max_history, config.limits.max_exclude),
            (7, 50)
        );
        assert_eq!(
            config.pipelines["feed"],
            PipelineConfig {
                recall_model: "lightgcn".into(),
                ranking_model: "deepfm".into(),
                candidates: 200,
                k: 20,
            }
        );
        let text = config.to_toml();
        assert!(text.contains("[pipelines.feed]"), "{text}");
        let defaults = parse(&["--repository", "r"]).expect("defaults");
        assert_eq!(
            (defaults.limits.max_history, defaults.limits.max_exclude),
            (10_000, 10_000)
        );
        assert!(defaults.pipelines.is_empty());

        let cases = [
            (
                "k = 20",
                "k = 0",
                "pipelines.feed.k must be between 1 and candidates (200), got 0",
            ),
            (
                "k = 20",
                "k = 201",
                "pipelines.feed.k must be between 1 and candidates (200), got 201",
            ),
            (
                "candidates = 200",
                "candidates = 0",
                "pipelines.feed.candidates must be between 1 and 100000",
            ),
            (
                "recall_model = \"lightgcn\"",
                "recall_model = \"\"",
                "pipelines.feed.recall_model must name a model",
            ),
            (
                "[pipelines.feed]",
                "[pipelines.\"a b\"]",
                "[pipelines.a b]: pipeline names may contain only",
            ),
            ("k = 20", "k = 20\nn = 1", "unknown field `n`"),
            ("k = 20\n", "", "missing field `k`"),
        ];
        for (from, to, expected) in cases {
            write(
                &"repository = \"/m\"\n[pipelines.feed]\nrecall_model = \"lightgcn\"\nranking_model = \"deepfm\"\n\
                  candidates = 200\nk = 20\n"
                    .replace(from, to),
            );
            let err = parse(&["--config", &path]).expect_err(expected);
            assert!(
                err.0.contains(expected),
                "expected {expected:?} in {:?}",
                err.0
            );
        }
        let err = parse(&["--repository", "r", "--max-exclude", "0"]).expect_err("0");
        assert!(
            err.0
                .contains("--max-exclude (RECSERVE_MAX_EXCLUDE) must be between 1 and 1000000"),
            "{}",
            err.0
        );
        let err = parse(&["--repository", "r", "--max-reply-items", "0"]).expect_err("0");
        assert!(
            err.0.contains(
                "--max-reply-items (RECSERVE_MAX_REPLY_ITEMS) must be between 1 and 100000000"
            ),
            "{}",
            err.0
        );
    }

    #[test]
    fn tls_files_go_together() {
        let base = ["--repository", "r", "--ort-library", "/lib/ort.so"];
        let with = |extra: &[&str]| {
            let mut args = base.to_vec();
            args.extend_from_slice(extra);
            parse(&args)
        };
        assert_eq!(with(&[]).expect("plain").tls, None);
        let config = with(&[
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--tls-client-ca",
            "ca.pem",
        ])
        .expect("mutual TLS");
        assert_eq!(
            config.tls,
            Some(TlsFiles {
                cert: "c.pem".into(),
                key: "k.pem".into(),
                client_ca: Some("ca.pem".into()),
            })
        );
        let printed = config.to_toml();
        assert!(
            printed.contains("tls_cert = \"c.pem\"")
                && printed.contains("tls_client_ca = \"ca.pem\""),
            "{printed}"
        );
        for (extra, expected) in [
            (
                &["--tls-cert", "c.pem"][..],
                "--tls-cert (RECSERVE_TLS_CERT) and --tls-key",
            ),
            (
                &["--tls-key", "k.pem"][..],
                "--tls-cert (RECSERVE_TLS_CERT) and --tls-key",
            ),
            (
                &["--tls-client-ca", "ca.pem"][..],
                "--tls-client-ca (RECSERVE_TLS_CLIENT_CA) needs",
            ),
        ] {
            let err = with(extra).expect_err(expected);
            assert!(err.0.contains(expected), "{extra:?}: {}", err.0);
        }
    }
}
