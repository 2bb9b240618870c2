//! The GPU functions of a build without `--features cuda`: the same signatures as the `cuda` submodule, each
//! reporting [`GpuError::NotBuilt`], so `--device auto` falls back to the CPU and `--device cuda` is refused with
//! a message that says how to get a CUDA build.

use std::sync::Arc;

use prometheus::IntCounter;

use super::{GpuError, GpuInfo, GpuProvider, TensorRtOptions};
use crate::embedding::{EmbeddingStore, TableBytes};
use crate::repository::TableSpec;

pub(super) fn probe() -> Result<Vec<GpuInfo>, GpuError> {
    Err(GpuError::NotBuilt)
}

pub(super) fn open_store(
    _gpus: &[GpuInfo],
    _specs: Vec<TableSpec>,
    _bytes: Vec<TableBytes>,
    _shards: usize,
    _oov: Vec<IntCounter>,
) -> Result<Arc<dyn EmbeddingStore>, GpuError> {
    Err(GpuError::NotBuilt)
}

pub(super) fn execution_providers(
    _provider: GpuProvider,
    _device: usize,
    _tensorrt: &TensorRtOptions,
) -> Result<Vec<ort::ep::ExecutionProviderDispatch>, GpuError> {
    Err(GpuError::NotBuilt)
}
