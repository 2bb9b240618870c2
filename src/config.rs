//! Server configuration: command-line flags, each with a `RECSERVE_*` environment variable, over an optional TOML
//! file, over defaults. [`ServeArgs::resolve`] merges the layers and validates the result with messages that name
//! the flag.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

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

    /// Largest request body accepted, in bytes [default: 4194304].
    #[arg(long, env = "RECSERVE_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,

    /// Requests that may wait for an executor, per model; more are refused with 429 [default: 256].
    #[arg(long, env = "RECSERVE_QUEUE_CAPACITY")]
    pub queue_capacity: Option<usize>,

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
    max_body_bytes: Option<usize>,
    queue_capacity: Option<usize>,
    #[serde(default)]
    pin: HashMap<String, u64>,
    shutdown_timeout_s: Option<u64>,
    log_format: Option<LogFormat>,
}

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
    pub max_body_bytes: usize,
    pub queue_capacity: usize,
    pub pin: HashMap<String, u64>,
    pub shutdown_timeout_s: u64,
    pub log_format: LogFormat,
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
        })
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("--config {}: cannot read: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| ConfigError(format!("--config {}: {e}", path.display())))
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
}
