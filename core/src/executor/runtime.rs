//! Loading the ONNX Runtime shared library (at run time, from the path the config gives) and creating sessions.
//! A missing or too old library is a start-up error with a hint, never a panic: `ort`'s lazy loader panics, so
//! the library is always loaded here first, explicitly.
//!
//! A session of an executor that gathers on a GPU gets the CUDA or TensorRT execution provider on that GPU
//! (`--execution-provider`); when the library has no such provider (the CPU-only build fails with "not enabled in
//! this build") `auto` falls back to the CPU provider with a log line, and an explicit request is a load error.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use ort::environment::Environment;
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;

use crate::error::LoadError;
use crate::gpu::{self, GpuProvider, ProviderRequest, TensorRtOptions};

/// The library could not be loaded or initialised.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "cannot load the ONNX Runtime library from {path}: {error}. Set --ort-library (RECSERVE_ORT_LIBRARY) or \
         ORT_DYLIB_PATH to a libonnxruntime.so of version 1.17 or newer (`scripts/setup.sh` installs one under \
         .venv from the pinned PyPI onnxruntime wheel)"
    )]
    /// (`error` is in the message and deliberately not a `source`: a report of the chain would repeat it.)
    Load {
        path: PathBuf,
        error: ort::LoadDynamicError,
    },
    #[error("cannot create the ONNX Runtime environment: {0}")]
    Environment(ort::Error),
}

/// Per-session settings. Serialized with the keys of the config file (`check-config` prints them).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SessionOptions {
    /// Threads ONNX Runtime may use inside one operator for one session.
    pub intra_op_threads: usize,
    /// The execution provider for sessions on a GPU.
    #[serde(rename = "execution_provider")]
    pub provider: ProviderRequest,
    #[serde(flatten)]
    pub tensorrt: TensorRtOptions,
    /// The CUDA device of the executor that owns the session (its gather lane's), or `None` on the CPU.
    #[serde(skip)]
    pub cuda_device: Option<usize>,
}

impl SessionOptions {
    /// These options for an executor whose gather lane is on `cuda_device`.
    pub(crate) fn on_device(&self, cuda_device: Option<usize>) -> SessionOptions {
        SessionOptions {
            cuda_device,
            ..self.clone()
        }
    }

    /// The GPU provider to try, and whether failing to get it is an error (else: the CPU provider, logged).
    fn gpu_provider(&self) -> Option<(usize, GpuProvider, bool)> {
        let device = self.cuda_device?;
        match self.provider {
            ProviderRequest::Cpu => None,
            ProviderRequest::Auto => Some((device, GpuProvider::Cuda, false)),
            ProviderRequest::Cuda => Some((device, GpuProvider::Cuda, true)),
            ProviderRequest::Tensorrt => Some((device, GpuProvider::TensorRt, true)),
        }
    }
}

/// A loaded ONNX Runtime: the library and its one process-wide environment.
#[derive(Clone)]
pub struct Runtime {
    env: Environment,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

impl Runtime {
    /// Loads the library at `path` (a bare file name is looked up on the system's library path) and creates the
    /// environment. ONNX Runtime allows one library and one environment per process: later calls return the
    /// first runtime (tests start several servers in one process).
    pub fn load(path: &Path) -> Result<Runtime, RuntimeError> {
        static LOADED: Mutex<Option<(PathBuf, Runtime)>> = Mutex::new(None);
        let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((first, runtime)) = loaded.as_ref() {
            if first != path {
                tracing::warn!(
                    requested = %path.display(),
                    loaded = %first.display(),
                    "ONNX Runtime is already loaded in this process; using the loaded library"
                );
            }
            return Ok(runtime.clone());
        }
        let env = ort::init_from(path)
            .map_err(|error| RuntimeError::Load {
                path: path.to_path_buf(),
                error,
            })?
            .with_name("recserve")
            .with_telemetry(false)
            .build()
            .map_err(RuntimeError::Environment)?;
        let runtime = Runtime { env };
        *loaded = Some((path.to_path_buf(), runtime.clone()));
        Ok(runtime)
    }

    /// Opens `path` as a session with `options`. Errors name the file. Returns the session and the CUDA device
    /// its inputs are read from (`None`: host memory, the CPU provider).
    pub(crate) fn session(
        &self,
        path: &Path,
        options: &SessionOptions,
    ) -> Result<(Session, Option<usize>), LoadError> {
        let fail = |e: ort::Error| {
            LoadError::new(path, format!("ONNX Runtime cannot load the graph: {e}"))
        };
        if !path.is_file() {
            return Err(LoadError::new(path, "dense graph file does not exist"));
        }
        // ONNX Runtime would only say it cannot open the file; who may read it is what the operator needs.
        std::fs::File::open(path)
            .map_err(|e| LoadError::cannot_open(path, "cannot open the dense graph", &e))?;
        let mut builder = Session::builder(&self.env)
            .map_err(fail)?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(|e| fail(e.into()))?
            .with_intra_threads(options.intra_op_threads)
            .map_err(|e| fail(e.into()))?
            .with_inter_threads(1)
            .map_err(|e| fail(e.into()))?;
        let mut device = None;
        if let Some((ordinal, provider, required)) = options.gpu_provider() {
            if let Some(dir) = &options.tensorrt.engine_cache
                && provider == GpuProvider::TensorRt
            {
                std::fs::create_dir_all(dir).map_err(|e| {
                    LoadError::new(
                        dir,
                        format!("cannot create the --tensorrt-engine-cache directory: {e}"),
                    )
                })?;
            }
            let flag = options.provider.as_str();
            let providers = gpu::execution_providers(provider, ordinal, &options.tensorrt)
                .map_err(|e| LoadError::new(path, format!("--execution-provider {flag}: {e}")))?;
            match builder.with_execution_providers(providers) {
                Ok(with_gpu) => {
                    builder = with_gpu;
                    device = Some(ordinal);
                }
                Err(e) if !required => {
                    tracing::warn!(
                        graph = %path.display(),
                        device = %format!("cuda:{ordinal}"),
                        "--execution-provider auto: ONNX Runtime's {} execution provider is not available ({e}); \
                         the dense network runs on the CPU provider, with embeddings gathered on the GPU and copied \
                         to host memory (install onnxruntime-gpu for the GPU path, see docs/gpu.md)",
                        provider.as_str(),
                    );
                    builder = e.recover();
                }
                Err(e) => {
                    return Err(LoadError::new(
                        path,
                        format!(
                            "--execution-provider {flag}: ONNX Runtime cannot use its {} execution provider on \
                             cuda:{ordinal}: {e}. The ONNX Runtime library must be a GPU build (onnxruntime-gpu, \
                             with its CUDA{} libraries on the library path); see docs/gpu.md",
                            provider.as_str(),
                            if provider == GpuProvider::TensorRt {
                                " and TensorRT"
                            } else {
                                ""
                            }
                        ),
                    ));
                }
            }
        }
        let session = builder.commit_from_file(path).map_err(fail)?;
        Ok((session, device))
    }
}
