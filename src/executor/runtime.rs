//! Loading the ONNX Runtime shared library (at run time, from the path the config gives) and creating sessions.
//! A missing or too old library is a start-up error with a hint, never a panic: `ort`'s lazy loader panics, so
//! the library is always loaded here first, explicitly.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use ort::environment::Environment;
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;

use crate::error::LoadError;

/// The library could not be loaded or initialised.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "cannot load the ONNX Runtime library from {path}: {source}. Set --ort-library (RECSERVE_ORT_LIBRARY) or \
         ORT_DYLIB_PATH to a libonnxruntime.so of version 1.17 or newer (`scripts/setup.sh` installs one under \
         .venv from the pinned PyPI onnxruntime wheel)"
    )]
    Load {
        path: PathBuf,
        source: ort::LoadDynamicError,
    },
    #[error("cannot create the ONNX Runtime environment: {0}")]
    Environment(ort::Error),
}

/// Per-session settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Threads ONNX Runtime may use inside one operator for one session.
    pub intra_op_threads: usize,
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
            .map_err(|source| RuntimeError::Load {
                path: path.to_path_buf(),
                source,
            })?
            .with_name("recserve")
            .with_telemetry(false)
            .build()
            .map_err(RuntimeError::Environment)?;
        let runtime = Runtime { env };
        *loaded = Some((path.to_path_buf(), runtime.clone()));
        Ok(runtime)
    }

    /// Opens `path` as a session with `options`. Errors name the file.
    pub fn session(&self, path: &Path, options: SessionOptions) -> Result<Session, LoadError> {
        let fail = |e: ort::Error| {
            LoadError::new(path, format!("ONNX Runtime cannot load the graph: {e}"))
        };
        if !path.is_file() {
            return Err(LoadError::new(path, "dense graph file does not exist"));
        }
        Session::builder(&self.env)
            .map_err(fail)?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(|e| fail(e.into()))?
            .with_intra_threads(options.intra_op_threads)
            .map_err(|e| fail(e.into()))?
            .with_inter_threads(1)
            .map_err(|e| fail(e.into()))?
            .commit_from_file(path)
            .map_err(fail)
    }
}
