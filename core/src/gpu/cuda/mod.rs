//! The CUDA side of [`crate::gpu`] (`--features cuda`): GPU detection through the driver API, the NVRTC-compiled
//! kernels ([`kernels`]), the GPU embedding store ([`CudaStore`]) and ONNX Runtime's CUDA/TensorRT providers.
//!
//! cudarc loads libcuda and libnvrtc at run time and panics when a library is missing, so every entry point here
//! checks that the library can be loaded before the first call into it.

#[cfg(test)]
mod device_tests;
pub(crate) mod kernels;
mod store;

use std::sync::Arc;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use prometheus::IntCounter;

pub(crate) use store::CudaStore;

use super::{GpuError, GpuInfo, GpuProvider, TensorRtOptions};
use crate::embedding::{EmbeddingStore, TableBytes};
use crate::repository::TableSpec;

/// A driver error as a [`GpuError`], with the driver's own description.
pub(crate) fn driver(call: &'static str, e: cu::DriverError) -> GpuError {
    GpuError::Driver {
        call,
        message: e.to_string(),
    }
}

pub(super) fn probe() -> Result<Vec<GpuInfo>, GpuError> {
    // SAFETY: only tries to dlopen libcuda under its usual names.
    if !unsafe { sys::is_culib_present() } {
        return Err(GpuError::NoDriver);
    }
    match cu::init() {
        Ok(()) => {}
        Err(cu::DriverError(sys::CUresult::CUDA_ERROR_NO_DEVICE)) => {
            return Err(GpuError::NoDevice(String::new()));
        }
        Err(e) => return Err(driver("cuInit", e)),
    }
    let count = cu::device::get_count().map_err(|e| driver("cuDeviceGetCount", e))?;
    if count <= 0 {
        let hint = match std::env::var("CUDA_VISIBLE_DEVICES") {
            Ok(v) => format!(" (CUDA_VISIBLE_DEVICES={v:?})"),
            Err(_) => String::new(),
        };
        return Err(GpuError::NoDevice(hint));
    }
    if !super::cuda::kernels::nvrtc_present() {
        return Err(GpuError::NoNvrtc);
    }
    let mut gpus = Vec::with_capacity(count as usize);
    for ordinal in 0..count {
        let dev = cu::device::get(ordinal).map_err(|e| driver("cuDeviceGet", e))?;
        let attr = |a| {
            // SAFETY: `dev` comes from cuDeviceGet.
            unsafe { cu::device::get_attribute(dev, a) }
                .map_err(|e| driver("cuDeviceGetAttribute", e))
        };
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        // SAFETY: `dev` comes from cuDeviceGet.
        let total_memory =
            unsafe { cu::device::total_mem(dev) }.map_err(|e| driver("cuDeviceTotalMem", e))?;
        gpus.push(GpuInfo {
            ordinal: ordinal as usize,
            name: cu::device::get_name(dev).map_err(|e| driver("cuDeviceGetName", e))?,
            compute_capability: (major, minor),
            total_memory,
        });
    }
    Ok(gpus)
}

#[cfg(test)]
/// Memory bandwidth the GPU's memory interface allows, in bytes per second (from the memory clock and bus width
/// the driver reports: clock × 2 transfers per clock × bus bytes), or `None` when the driver does not say.
pub(crate) fn peak_memory_bandwidth(ordinal: usize) -> Option<f64> {
    let dev = cu::device::get(ordinal as i32).ok()?;
    // SAFETY: `dev` comes from cuDeviceGet.
    let attr = |a| unsafe { cu::device::get_attribute(dev, a) }.ok();
    let clock_khz = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?;
    let bus_bits = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?;
    (clock_khz > 0 && bus_bits > 0)
        .then(|| f64::from(clock_khz) * 1e3 * 2.0 * f64::from(bus_bits) / 8.0)
}

pub(super) fn open_store(
    gpus: &[GpuInfo],
    specs: Vec<TableSpec>,
    bytes: Vec<TableBytes>,
    shards: usize,
    oov: Vec<IntCounter>,
) -> Result<Arc<dyn EmbeddingStore>, GpuError> {
    Ok(Arc::new(CudaStore::open(gpus, specs, bytes, shards, oov)?))
}

pub(super) fn execution_providers(
    provider: GpuProvider,
    device: usize,
    tensorrt: &TensorRtOptions,
) -> Result<Vec<ort::ep::ExecutionProviderDispatch>, GpuError> {
    let device_id = i32::try_from(device).map_err(|_| GpuError::Provider {
        provider: provider.as_str(),
        message: format!("device ordinal {device} is out of range"),
    })?;
    let cuda = ort::ep::CUDA::default()
        .with_device_id(device_id)
        .build()
        .error_on_failure();
    match provider {
        GpuProvider::Cuda => Ok(vec![cuda]),
        GpuProvider::TensorRt => {
            let mut trt = ort::ep::TensorRT::default()
                .with_device_id(device_id)
                .with_fp16(tensorrt.fp16)
                .with_int8(tensorrt.int8);
            if let Some(dir) = &tensorrt.engine_cache {
                trt = trt
                    .with_engine_cache(true)
                    .with_engine_cache_path(dir.display())
                    .with_timing_cache(true)
                    .with_timing_cache_path(dir.display());
            }
            // TensorRT takes the subgraphs it supports; CUDA runs the rest.
            Ok(vec![trt.build().error_on_failure(), cuda])
        }
    }
}
