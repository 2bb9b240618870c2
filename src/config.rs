//! Server configuration: command-line flags, each with a `RECSERVE_*` environment variable, over an optional TOML
//! file, over defaults. [`ServeArgs::resolve`] merges the layers and validates the result with messages that name
//! the flag.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::gpu::{self, DeviceRequest, ProviderRequest, TensorRtOptions};
use crate::repository::{MAX_BATCH_ROWS, MAX_DEFAULT_DEADLINE_MS, MAX_QUEUE_DELAY_US};

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
    /// Validate the configuration (flags, environment, file) without starting, and print it as TOML.
    CheckConfig(ServeArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Switch {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Flags of `serve`. Every flag is optional here so that a config file can supply it; defaults are applied by
/// [`ServeArgs::resolve`] and shown in each flag's help.
#[derive(Clone, Debug, Default, Args)]
pub struct ServeArgs {
    /// TOML file with any of the settings below (keys are the flag names with '_' for '-'); flags and
    /// environment variables override it.
    #[arg(long, env = "RECSERVE_CONFIG")]
    pub config: Option<PathBuf>,

    /// Model repository: <repository>/<model>/<version>/model.toml. Required.
    #[arg(long, env = "RECSERVE_REPOSITORY")]
    pub repository: Option<PathBuf>,

    /// Address of the HTTP API and /metrics [default: 0.0.0.0:8000].
    #[arg(long, env = "RECSERVE_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,

    /// Address of the KServe v2 gRPC API (inference.GRPCInferenceService, grpc.health.v1, reflection) [default:
    /// 0.0.0.0:8001].
    #[arg(long, env = "RECSERVE_GRPC_ADDR")]
    pub grpc_addr: Option<SocketAddr>,

    /// ONNX Runtime shared library (libonnxruntime.so, version 1.17 or newer) [default: $ORT_DYLIB_PATH, else
    /// libonnxruntime.so on the system library path].
    #[arg(long, env = "RECSERVE_ORT_LIBRARY")]
    pub ort_library: Option<PathBuf>,

    /// Threads ONNX Runtime uses inside one operator, per executor [default: 1].
    #[arg(long, env = "RECSERVE_INTRA_OP_THREADS")]
    pub intra_op_threads: Option<usize>,

    /// Executor threads per model, each with its own ONNX Runtime session [default: 1].
    #[arg(long, env = "RECSERVE_EXECUTORS")]
    pub executors: Option<usize>,

    /// Shards per embedding table (contiguous row ranges) [default: 1].
    #[arg(long, env = "RECSERVE_SHARDS")]
    pub shards: Option<usize>,

    /// Most candidates one ranking request may carry [default: 1000].
    #[arg(long, env = "RECSERVE_MAX_CANDIDATES")]
    pub max_candidates: Option<usize>,

    /// Most item ids in a recall request's `history` [default: 10000].
    #[arg(long, env = "RECSERVE_MAX_HISTORY")]
    pub max_history: Option<usize>,

    /// Most item ids in a recall or recommend request's `exclude` [default: 10000].
    #[arg(long, env = "RECSERVE_MAX_EXCLUDE")]
    pub max_exclude: Option<usize>,

    /// Largest request body accepted, in bytes [default: 4194304].
    #[arg(long, env = "RECSERVE_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,

    /// Requests (or chunks of large ones) that may wait per model; more are refused with 429 [default: 256].
    #[arg(long, env = "RECSERVE_QUEUE_CAPACITY")]
    pub queue_capacity: Option<usize>,

    /// Nice value (0-19) of the executor threads, above the HTTP/gRPC threads' 0: under overload, decoding,
    /// admission and 429s keep the CPU they need and inference takes the rest [default: 5].
    #[arg(long, env = "RECSERVE_EXECUTOR_NICENESS")]
    pub executor_niceness: Option<u8>,

    /// Dynamic batching: `on` groups queued requests into batches; `off` executes each request alone
    /// [default: on].
    #[arg(long, value_enum, env = "RECSERVE_BATCHING")]
    pub batching: Option<Switch>,

    /// A batch closes when it holds this many rows; larger requests are split [default: the model's
    /// [batching] max_batch_rows, else 1024].
    #[arg(long, env = "RECSERVE_MAX_BATCH_ROWS")]
    pub max_batch_rows: Option<usize>,

    /// A batch closes when its oldest request has waited this many microseconds [default: the model's
    /// [batching] max_queue_delay_us, else 500].
    #[arg(long, env = "RECSERVE_MAX_QUEUE_DELAY_US")]
    pub max_queue_delay_us: Option<u64>,

    /// Batch sizes executed, ascending; a batch is padded up to the next one and each is warmed up before ready
    /// [default: the model's [batching] buckets, else about 25% apart up to max-batch-rows].
    #[arg(long, env = "RECSERVE_BATCH_BUCKETS", value_delimiter = ',')]
    pub batch_buckets: Vec<usize>,

    /// Deadline of requests that do not set x-recserve-deadline-ms (or grpc-timeout), in milliseconds
    /// [default: the model's [batching] default_deadline_ms, else 1000].
    #[arg(long, env = "RECSERVE_DEFAULT_DEADLINE_MS")]
    pub default_deadline_ms: Option<u64>,

    /// Serve this version of a model instead of its highest, as MODEL=VERSION; repeat or comma-separate.
    #[arg(
        long = "pin",
        env = "RECSERVE_PIN",
        value_delimiter = ',',
        value_name = "MODEL=VERSION"
    )]
    pub pins: Vec<String>,

    /// Seconds to wait for in-flight requests after SIGTERM/SIGINT before exiting anyway [default: 30].
    #[arg(long, env = "RECSERVE_SHUTDOWN_TIMEOUT_S")]
    pub shutdown_timeout_s: Option<u64>,

    /// Log format on stderr; the level comes from RUST_LOG (default info) [default: text].
    #[arg(long, value_enum, env = "RECSERVE_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,

    /// Where embedding tables live: auto (every visible GPU when there is one, else the CPU), cpu, cuda (every
    /// visible GPU, or refuse to start) or cuda:N (GPU N only) [default: auto].
    #[arg(long, env = "RECSERVE_DEVICE", value_name = "auto|cpu|cuda[:N]")]
    pub device: Option<DeviceRequest>,

    /// ONNX Runtime execution provider for executors that gather on a GPU: auto (CUDA when the ONNX Runtime
    /// library has it, else the CPU), cpu, cuda or tensorrt (refuse to start when unavailable) [default: auto].
    #[arg(long, value_enum, env = "RECSERVE_EXECUTION_PROVIDER")]
    pub execution_provider: Option<ProviderRequest>,

    /// TensorRT may use fp16 kernels (only with --execution-provider tensorrt) [default: false].
    #[arg(long, env = "RECSERVE_TENSORRT_FP16", num_args = 0..=1, default_missing_value = "true")]
    pub tensorrt_fp16: Option<bool>,

    /// TensorRT may use int8 kernels, with the scales of the graph's QDQ nodes (only with --execution-provider
    /// tensorrt) [default: false].
    #[arg(long, env = "RECSERVE_TENSORRT_INT8", num_args = 0..=1, default_missing_value = "true")]
    pub tensorrt_int8: Option<bool>,

    /// Directory where TensorRT keeps built engines and timing caches, so restarts skip the build (only with
    /// --execution-provider tensorrt) [default: none, engines are rebuilt at every start].
    #[arg(long, env = "RECSERVE_TENSORRT_ENGINE_CACHE")]
    pub tensorrt_engine_cache: Option<PathBuf>,
}

/// The config file: the same settings as the flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    repository: Option<PathBuf>,
    http_addr: Option<SocketAddr>,
    grpc_addr: Option<SocketAddr>,
    ort_library: Option<PathBuf>,
    intra_op_threads: Option<usize>,
    executors: Option<usize>,
    shards: Option<usize>,
    max_candidates: Option<usize>,
    max_history: Option<usize>,
    max_exclude: Option<usize>,
    max_body_bytes: Option<usize>,
    queue_capacity: Option<usize>,
    executor_niceness: Option<u8>,
    batching: Option<Switch>,
    max_batch_rows: Option<usize>,
    max_queue_delay_us: Option<u64>,
    batch_buckets: Option<Vec<usize>>,
    default_deadline_ms: Option<u64>,
    #[serde(default)]
    pin: HashMap<String, u64>,
    shutdown_timeout_s: Option<u64>,
    log_format: Option<LogFormat>,
    device: Option<DeviceRequest>,
    execution_provider: Option<ProviderRequest>,
    tensorrt_fp16: Option<bool>,
    tensorrt_int8: Option<bool>,
    tensorrt_engine_cache: Option<PathBuf>,
    /// `[pipelines.NAME]`: only in the file (a pipeline is a table, not a flag).
    #[serde(default)]
    pipelines: BTreeMap<String, PipelineConfig>,
}

/// One `[pipelines.NAME]` table of the config file: `POST /v1/recommend/NAME` recalls `candidates` items with
/// `recall_model`, ranks them with `ranking_model` (whose `[item_features]` supplies the item side) and returns
/// the `k` best (docs/api.md).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    pub recall_model: String,
    pub ranking_model: String,
    /// Items recalled and ranked per request.
    pub candidates: usize,
    /// Items returned (the request may ask for fewer, or up to `candidates`).
    pub k: usize,
}

/// Most candidates a pipeline may rank per request.
pub const MAX_PIPELINE_CANDIDATES: usize = 100_000;

/// The resolved, validated configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Config {
    pub repository: PathBuf,
    pub http_addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    pub ort_library: PathBuf,
    pub intra_op_threads: usize,
    pub executors: usize,
    pub shards: usize,
    pub max_candidates: usize,
    pub max_history: usize,
    pub max_exclude: usize,
    pub max_body_bytes: usize,
    pub queue_capacity: usize,
    pub executor_niceness: u8,
    pub batching: Switch,
    /// Batching settings that override every model's `[batching]` section when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_batch_rows: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queue_delay_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_buckets: Option<Vec<usize>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_deadline_ms: Option<u64>,
    pub pin: HashMap<String, u64>,
    pub shutdown_timeout_s: u64,
    pub log_format: LogFormat,
    pub device: DeviceRequest,
    pub execution_provider: ProviderRequest,
    pub tensorrt_fp16: bool,
    pub tensorrt_int8: bool,
    pub tensorrt_engine_cache: Option<PathBuf>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub pipelines: BTreeMap<String, PipelineConfig>,
}

/// A configuration that cannot be used; the message names the flag.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn in_range(flag: &str, value: usize, min: usize, max: usize) -> Result<usize, ConfigError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        let env = format!(
            "RECSERVE_{}",
            flag.trim_start_matches("--")
                .replace('-', "_")
                .to_uppercase()
        );
        Err(ConfigError(format!(
            "{flag} ({env}) must be between {min} and {max}, got {value}"
        )))
    }
}

/// Checks each `[pipelines.NAME]` on its own; whether its models exist and fit is checked when they are loaded.
fn check_pipelines(pipelines: &BTreeMap<String, PipelineConfig>) -> Result<(), ConfigError> {
    for (name, p) in pipelines {
        if !crate::repository::is_valid_model_name(name) {
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

fn parse_pin(pin: &str) -> Result<(String, u64), ConfigError> {
    let bad = || {
        ConfigError(format!(
            "--pin (RECSERVE_PIN) takes MODEL=VERSION with a version ≥ 1, got {pin:?}"
        ))
    };
    let (model, version) = pin.split_once('=').ok_or_else(bad)?;
    let version: u64 = version.trim().parse().map_err(|_| bad())?;
    if model.trim().is_empty() || version == 0 {
        return Err(bad());
    }
    Ok((model.trim().to_owned(), version))
}

impl ServeArgs {
    /// Reads the config file if one is given, then applies flags/environment over it and defaults under it.
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        let file = match &self.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        let repository = self.repository.clone().or(file.repository).ok_or_else(|| {
            ConfigError(
                "--repository (RECSERVE_REPOSITORY) is required: the model repository directory"
                    .to_owned(),
            )
        })?;
        let ort_library = self
            .ort_library
            .clone()
            .or(file.ort_library)
            .or_else(|| {
                std::env::var_os("ORT_DYLIB_PATH")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .unwrap_or_else(|| PathBuf::from("libonnxruntime.so"));
        let mut pin = file.pin;
        for p in &self.pins {
            let (model, version) = parse_pin(p)?;
            pin.insert(model, version);
        }
        for (model, version) in &pin {
            if *version == 0 {
                return Err(ConfigError(format!(
                    "pin for model {model:?}: versions start at 1"
                )));
            }
        }
        check_pipelines(&file.pipelines)?;
        let http_addr = self
            .http_addr
            .or(file.http_addr)
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8000)));
        let grpc_addr = self
            .grpc_addr
            .or(file.grpc_addr)
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8001)));
        if grpc_addr == http_addr && grpc_addr.port() != 0 {
            return Err(ConfigError(format!(
                "--grpc-addr (RECSERVE_GRPC_ADDR) must differ from --http-addr (RECSERVE_HTTP_ADDR), both are {grpc_addr}"
            )));
        }
        let device = self.device.or(file.device).unwrap_or_default();
        let execution_provider = self
            .execution_provider
            .or(file.execution_provider)
            .unwrap_or_default();
        let tensorrt_fp16 = self.tensorrt_fp16.or(file.tensorrt_fp16).unwrap_or(false);
        let tensorrt_int8 = self.tensorrt_int8.or(file.tensorrt_int8).unwrap_or(false);
        let tensorrt_engine_cache = self
            .tensorrt_engine_cache
            .clone()
            .or(file.tensorrt_engine_cache);
        check_device(
            device,
            execution_provider,
            &TensorRtOptions {
                fp16: tensorrt_fp16,
                int8: tensorrt_int8,
                engine_cache: tensorrt_engine_cache.clone(),
            },
        )?;
        Ok(Config {
            repository,
            http_addr,
            grpc_addr,
            ort_library,
            intra_op_threads: in_range(
                "--intra-op-threads",
                self.intra_op_threads.or(file.intra_op_threads).unwrap_or(1),
                1,
                256,
            )?,
            executors: in_range(
                "--executors",
                self.executors.or(file.executors).unwrap_or(1),
                1,
                64,
            )?,
            shards: in_range(
                "--shards",
                self.shards.or(file.shards).unwrap_or(1),
                1,
                1024,
            )?,
            max_candidates: in_range(
                "--max-candidates",
                self.max_candidates.or(file.max_candidates).unwrap_or(1000),
                1,
                100_000,
            )?,
            max_history: in_range(
                "--max-history",
                self.max_history.or(file.max_history).unwrap_or(10_000),
                1,
                1_000_000,
            )?,
            max_exclude: in_range(
                "--max-exclude",
                self.max_exclude.or(file.max_exclude).unwrap_or(10_000),
                1,
                1_000_000,
            )?,
            max_body_bytes: in_range(
                "--max-body-bytes",
                self.max_body_bytes
                    .or(file.max_body_bytes)
                    .unwrap_or(4 << 20),
                1024,
                1 << 30,
            )?,
            queue_capacity: in_range(
                "--queue-capacity",
                self.queue_capacity.or(file.queue_capacity).unwrap_or(256),
                1,
                1 << 20,
            )?,
            executor_niceness: in_range(
                "--executor-niceness",
                usize::from(
                    self.executor_niceness
                        .or(file.executor_niceness)
                        .unwrap_or(5),
                ),
                0,
                19,
            )? as u8,
            batching: self.batching.or(file.batching).unwrap_or(Switch::On),
            max_batch_rows: self
                .max_batch_rows
                .or(file.max_batch_rows)
                .map(|v| in_range("--max-batch-rows", v, 1, MAX_BATCH_ROWS))
                .transpose()?,
            max_queue_delay_us: self
                .max_queue_delay_us
                .or(file.max_queue_delay_us)
                .map(|v| {
                    in_range(
                        "--max-queue-delay-us",
                        v as usize,
                        0,
                        MAX_QUEUE_DELAY_US as usize,
                    )
                    .map(|v| v as u64)
                })
                .transpose()?,
            batch_buckets: {
                let buckets = if self.batch_buckets.is_empty() {
                    file.batch_buckets
                } else {
                    Some(self.batch_buckets.clone())
                };
                if let Some(b) = &buckets {
                    crate::repository::check_buckets(b).map_err(|problem| {
                        ConfigError(format!(
                            "--batch-buckets (RECSERVE_BATCH_BUCKETS) {problem}"
                        ))
                    })?;
                }
                buckets
            },
            default_deadline_ms: self
                .default_deadline_ms
                .or(file.default_deadline_ms)
                .map(|v| {
                    in_range(
                        "--default-deadline-ms",
                        v as usize,
                        1,
                        MAX_DEFAULT_DEADLINE_MS as usize,
                    )
                    .map(|v| v as u64)
                })
                .transpose()?,
            pin,
            shutdown_timeout_s: in_range(
                "--shutdown-timeout-s",
                self.shutdown_timeout_s
                    .or(file.shutdown_timeout_s)
                    .unwrap_or(30) as usize,
                1,
                3600,
            )? as u64,
            log_format: self
                .log_format
                .or(file.log_format)
                .unwrap_or(LogFormat::Text),
            device,
            execution_provider,
            tensorrt_fp16,
            tensorrt_int8,
            tensorrt_engine_cache,
            pipelines: file.pipelines,
        })
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

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("--config {}: cannot read: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| ConfigError(format!("--config {}: {e}", path.display())))
}

impl Config {
    /// The TensorRT settings.
    pub fn tensorrt(&self) -> TensorRtOptions {
        TensorRtOptions {
            fp16: self.tensorrt_fp16,
            int8: self.tensorrt_int8,
            engine_cache: self.tensorrt_engine_cache.clone(),
        }
    }

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
            Command::Serve(args) | Command::CheckConfig(args) => args.resolve(),
        }
    }

    #[test]
    fn applies_defaults() {
        let config =
            parse(&["--repository", "/models", "--ort-library", "/lib/ort.so"]).expect("valid");
        assert_eq!(config.http_addr, "0.0.0.0:8000".parse().expect("addr"));
        assert_eq!(config.grpc_addr, "0.0.0.0:8001".parse().expect("addr"));
        assert_eq!(
            (
                config.intra_op_threads,
                config.executors,
                config.shards,
                config.max_candidates
            ),
            (1, 1, 1, 1000)
        );
        assert_eq!(config.log_format, LogFormat::Text);
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
            (config.device, config.execution_provider),
            (DeviceRequest::Auto, ProviderRequest::Auto)
        );
        assert_eq!(config.tensorrt(), TensorRtOptions::default());
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
        assert_eq!(config.execution_provider, ProviderRequest::Tensorrt);
        assert_eq!(
            config.tensorrt(),
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
        assert_eq!((config.max_history, config.max_exclude), (7, 50));
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
            (defaults.max_history, defaults.max_exclude),
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
    }
}
