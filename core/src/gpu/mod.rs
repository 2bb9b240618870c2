//! GPU support, in one place: choosing the device (`--device auto|cpu|cuda[:N]`), the CUDA embedding store
//! (tables sharded over GPU memory, gathered by `kernels/embedding_gather.cu`), and ONNX Runtime's CUDA and
//! TensorRT execution providers.
//!
//! This module and its types are always compiled, so the rest of the server never mentions the `cuda` feature:
//! with `--features cuda` the work is done by the `cuda` submodule (cudarc, loading libcuda and libnvrtc at run
//! time); without it the `disabled` submodule has the same functions, which report that the build has no CUDA
//! support. Detection never panics: a machine without a driver, without NVRTC or without a device is an error value
//! (a log line under `--device auto`, a start-up error under `--device cuda`).

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
use cuda as backend;
#[cfg(not(feature = "cuda"))]
mod disabled;
#[cfg(not(feature = "cuda"))]
use disabled as backend;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use prometheus::IntCounter;
use serde::{Deserialize, Serialize};

use crate::embedding::{CpuStore, EmbeddingStore, TableBytes};

use crate::repository::TableSpec;

/// Whether this binary was built with `--features cuda`.
pub const BUILT_WITH_CUDA: bool = cfg!(feature = "cuda");

/// Where `--device` asks the embedding tables (and, with a GPU execution provider, the dense network) to live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceRequest {
    /// Every visible GPU when there is one (and the build supports CUDA), else the CPU.
    #[default]
    Auto,
    Cpu,
    /// `cuda`: every visible GPU; `cuda:N`: GPU N only.
    Cuda(Option<usize>),
}

impl FromStr for DeviceRequest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Cpu),
            "cuda" => Ok(DeviceRequest::Cuda(None)),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(DeviceRequest::Cuda(Some(n))),
                _ => Err(format!(
                    "expected auto, cpu, cuda or cuda:N (N a GPU ordinal), got {other:?}"
                )),
            },
        }
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRequest::Auto => f.write_str("auto"),
            DeviceRequest::Cpu => f.write_str("cpu"),
            DeviceRequest::Cuda(None) => f.write_str("cuda"),
            DeviceRequest::Cuda(Some(n)) => write!(f, "cuda:{n}"),
        }
    }
}

impl Serialize for DeviceRequest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DeviceRequest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Which ONNX Runtime execution provider runs the dense network of an executor whose gather runs on a GPU
/// (`--execution-provider`). Executors on the CPU always use the CPU provider.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ProviderRequest {
    /// CUDA when the ONNX Runtime library has it, else the CPU provider (with a log line).
    #[default]
    Auto,
    Cpu,
    /// CUDA, or refuse to start.
    Cuda,
    /// TensorRT (with CUDA for what TensorRT does not take), or refuse to start.
    Tensorrt,
}

impl ProviderRequest {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderRequest::Auto => "auto",
            ProviderRequest::Cpu => "cpu",
            ProviderRequest::Cuda => "cuda",
            ProviderRequest::Tensorrt => "tensorrt",
        }
    }
}

/// A GPU execution provider to register on a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GpuProvider {
    Cuda,
    TensorRt,
}

impl GpuProvider {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            GpuProvider::Cuda => "CUDA",
            GpuProvider::TensorRt => "TensorRT",
        }
    }
}

/// TensorRT settings (`--tensorrt-*`), used with `--execution-provider tensorrt`. Serialized with the keys of the
/// config file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TensorRtOptions {
    /// Let TensorRT pick fp16 kernels.
    #[serde(rename = "tensorrt_fp16")]
    pub fp16: bool,
    /// Let TensorRT pick int8 kernels (the graph's QDQ nodes give the scales).
    #[serde(rename = "tensorrt_int8")]
    pub int8: bool,
    /// Directory where built engines are kept, so a restart does not rebuild them (minutes per shape profile).
    #[serde(
        rename = "tensorrt_engine_cache",
        skip_serializing_if = "Option::is_none"
    )]
    pub engine_cache: Option<PathBuf>,
}

/// One GPU as the driver describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// CUDA device ordinal (as `CUDA_VISIBLE_DEVICES` numbers them).
    pub(crate) ordinal: usize,
    pub(crate) name: String,
    /// (major, minor), e.g. (7, 5) for a T4, (8, 0) for an A100, (9, 0) for an H100.
    pub(crate) compute_capability: (i32, i32),
    pub(crate) total_memory: usize,
}

impl GpuInfo {
    /// The label of this device in metrics and logs: `cuda:N`.
    pub(crate) fn label(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }
}

/// Where a model's tables are served from, as resolved from `--device` at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    Cpu,
    /// Shards spread over these GPUs (at least one).
    Cuda(Vec<GpuInfo>),
}

/// What went wrong with the GPU. Start-up errors name the flag; gather-time errors become
/// [`crate::embedding::GatherError::Device`].
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "this recserve binary was built without CUDA support: rebuild with `cargo build --release --features cuda`, \
         or use --device cpu"
    )]
    NotBuilt,
    #[error(
        "the NVIDIA driver library (libcuda.so) cannot be loaded: no NVIDIA driver is installed, or it is not on \
         the library path"
    )]
    NoDriver,
    #[error(
        "NVRTC (libnvrtc.so) cannot be loaded; recserve compiles its CUDA kernels at start-up and needs it on the \
         library path (CUDA toolkit, or the nvidia-cuda-nvrtc wheel's lib directory in LD_LIBRARY_PATH)"
    )]
    NoNvrtc,
    #[error("the NVIDIA driver reports no CUDA device{0}")]
    NoDevice(String),
    #[error("--device cuda:{ordinal}: there is no such GPU ({count} visible, numbered from 0)")]
    NoSuchDevice { ordinal: usize, count: usize },
    #[error("CUDA {call} failed: {message}")]
    Driver { call: &'static str, message: String },
    #[error("NVRTC cannot compile {kernel} for {arch}: {message}")]
    Compile {
        kernel: &'static str,
        arch: String,
        message: String,
    },
    #[error(
        "not enough GPU memory on {device} for shard {shard} of table {table:?} ({bytes} bytes; {free} bytes free): \
         use more GPUs, --shards to spread the table, int8 storage, or --device cpu"
    )]
    OutOfMemory {
        device: String,
        table: String,
        shard: usize,
        bytes: u64,
        free: u64,
    },
    #[error(
        "the tables are spread over {devices} GPUs, which needs peer access between them, but {from} cannot access \
         the memory of {to}: serve from one GPU with --device cuda:N"
    )]
    NoPeerAccess {
        devices: usize,
        from: String,
        to: String,
    },
    #[error("ONNX Runtime {provider} execution provider: {message}")]
    Provider {
        provider: &'static str,
        message: String,
    },
}

/// The GPUs this process can use, or why it cannot use any. Never panics.
pub(crate) fn probe() -> Result<Vec<GpuInfo>, GpuError> {
    backend::probe()
}

/// Resolves `--device` against the machine. `auto` falls back to the CPU with a log line that says why; an explicit
/// `cuda` that cannot be served is an error.
pub fn select(request: DeviceRequest) -> Result<Placement, GpuError> {
    match request {
        DeviceRequest::Cpu => Ok(Placement::Cpu),
        DeviceRequest::Auto => match probe() {
            Ok(gpus) => {
                log_devices(&gpus);
                Ok(Placement::Cuda(gpus))
            }
            Err(why) => {
                tracing::info!("--device auto: using the CPU, because {why}");
                Ok(Placement::Cpu)
            }
        },
        DeviceRequest::Cuda(only) => {
            let gpus = probe()?;
            let gpus = match only {
                None => gpus,
                Some(ordinal) => {
                    let count = gpus.len();
                    vec![
                        gpus.into_iter()
                            .find(|g| g.ordinal == ordinal)
                            .ok_or(GpuError::NoSuchDevice { ordinal, count })?,
                    ]
                }
            };
            log_devices(&gpus);
            Ok(Placement::Cuda(gpus))
        }
    }
}

fn log_devices(gpus: &[GpuInfo]) {
    for g in gpus {
        tracing::info!(
            device = %g.label(),
            name = %g.name,
            compute_capability = %format!("{}.{}", g.compute_capability.0, g.compute_capability.1),
            memory_bytes = g.total_memory,
            "using GPU"
        );
    }
}

/// Opens the embedding store for `placement`: the CPU store, or the tables uploaded to the GPUs.
pub(crate) fn open_store(
    placement: &Placement,
    specs: Vec<TableSpec>,
    bytes: Vec<TableBytes>,
    shards: usize,
    oov: Vec<IntCounter>,
) -> Result<Arc<dyn EmbeddingStore>, GpuError> {
    match placement {
        Placement::Cpu => Ok(Arc::new(CpuStore::new(specs, bytes, shards, oov))),
        Placement::Cuda(gpus) => backend::open_store(gpus, specs, bytes, shards, oov),
    }
}

/// The execution providers to register, in order, for `provider` on CUDA device `device`.
pub(crate) fn execution_providers(
    provider: GpuProvider,
    device: usize,
    tensorrt: &TensorRtOptions,
) -> Result<Vec<ort::ep::ExecutionProviderDispatch>, GpuError> {
    backend::execution_providers(provider, device, tensorrt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_device_requests() {
        for (text, want) in [
            ("auto", DeviceRequest::Auto),
            ("cpu", DeviceRequest::Cpu),
            ("cuda", DeviceRequest::Cuda(None)),
            ("cuda:0", DeviceRequest::Cuda(Some(0))),
            ("cuda:3", DeviceRequest::Cuda(Some(3))),
        ] {
            let got: DeviceRequest = text.parse().expect("valid");
            assert_eq!(got, want);
            assert_eq!(got.to_string(), text);
        }
        for bad in ["gpu", "cuda:", "cuda:-1", "cuda:x", "CUDA", ""] {
            let err = bad.parse::<DeviceRequest>().expect_err(bad);
            assert!(err.contains("expected auto, cpu, cuda or cuda:N"), "{err}");
        }
    }

    #[test]
    fn cpu_is_always_available() {
        assert_eq!(select(DeviceRequest::Cpu).expect("cpu"), Placement::Cpu);
    }

    #[test]
    fn auto_never_fails() {
        // On a machine without a GPU (or a build without CUDA) this is the CPU; on a GPU machine every GPU.
        match select(DeviceRequest::Auto).expect("auto never fails") {
            Placement::Cpu => {}
            Placement::Cuda(gpus) => assert!(!gpus.is_empty()),
        }
    }

    #[test]
    #[cfg(not(feature = "cuda"))]
    fn a_build_without_cuda_says_so() {
        let err = select(DeviceRequest::Cuda(None)).expect_err("no CUDA in this build");
        assert!(matches!(err, GpuError::NotBuilt), "{err}");
        assert!(err.to_string().contains("--features cuda"), "{err}");
    }
}
