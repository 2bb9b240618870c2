//! The CUDA embedding store: every shard of every table uploaded to GPU memory (spread over the GPUs by bytes),
//! and the per-executor [`CudaLane`] that gathers a batch with `kernels/embedding_gather.cu`.
//!
//! A gather (one batch) on a lane whose home GPU is `h`:
//! 1. on the host: shape check, then [`screen_ids`] counts the ids that will read a default row and refuses
//!    batches with ids a `reject` table does not know (as the CPU store does);
//! 2. the field → table map and the ids are written into the lane's pinned (page-locked) staging buffer and
//!    copied to GPU `h` in one asynchronous copy on the lane's stream;
//! 3. every GPU that holds shards runs the kernel on the lane's stream for that GPU, writing the rows it holds
//!    into the output on GPU `h` (peer access when there are several GPUs; events order the streams);
//! 4. for a host output the result is copied back; either way the lane waits for its stream before returning, so
//!    the staging buffer is free again when the next gather starts.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};
use prometheus::IntCounter;

use super::driver;
use super::kernels::{self, EMBEDDING_GATHER, EMBEDDING_GATHER_SRC};
use crate::embedding::{DeviceOutput, ShardMemory};
use crate::embedding::{
    EmbeddingStore, GatherError, GatherLane, ShardLayout, TableBytes, check_gather_shape,
    check_gather_shape_len,
};
use crate::gpu::{GpuError, GpuInfo};
use crate::repository::{OovPolicy, Storage, TableSpec};

/// Threads per block of the gather kernel.
const BLOCK_THREADS: u32 = 256;
/// Bytes of a `TableDesc` and of a `Shard` in `kernels/embedding_gather.cu`.
const TABLE_DESC_BYTES: usize = 40;
const SHARD_DESC_BYTES: usize = 16;
/// GPU memory left free per device when uploading tables, for ONNX Runtime, lanes and the driver.
const RESERVED_BYTES: u64 = 512 << 20;

fn storage_code(storage: Storage) -> i32 {
    match storage {
        Storage::Fp32 => 0,
        Storage::Fp16 => 1,
        Storage::Int8 => 2,
    }
}

/// Device memory from `cuMemAlloc`, freed on drop.
#[derive(Debug)]
pub(super) struct DeviceBuffer {
    pub(super) ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    pub(super) fn new(
        ctx: &Arc<CudaContext>,
        bytes: usize,
    ) -> Result<DeviceBuffer, cu::DriverError> {
        ctx.bind_to_thread()?;
        // SAFETY: plain allocation in the bound context; at least one byte so the pointer is a real allocation.
        let ptr = unsafe { cu::malloc_sync(bytes.max(1)) }?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx: Arc::clone(ctx),
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_sync in this context and freed once; every user waits for its stream
            // before the owner (store or lane) can be dropped.
            let _ = unsafe { cu::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory from `cuMemHostAlloc`, freed on drop.
#[derive(Debug)]
struct PinnedBuffer {
    ptr: *mut u8,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer is plain memory owned by one lane; the lane is moved to its executor thread, never shared.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<PinnedBuffer, cu::DriverError> {
        ctx.bind_to_thread()?;
        // Portable: usable from every context (the lane's GPUs). Write-combined: the host only writes it, the GPU
        // reads it, and write-combined pages cross PCIe faster.
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_WRITECOMBINED;
        // SAFETY: plain allocation in the bound context.
        let ptr = unsafe { cu::malloc_host(bytes.max(1), flags) }?;
        Ok(PinnedBuffer {
            ptr: ptr.cast(),
            bytes,
            ctx: Arc::clone(ctx),
        })
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `bytes` bytes allocated by malloc_host, exclusively borrowed through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_host and freed once, after the lane's last copy finished.
            let _ = unsafe { cu::free_host(self.ptr.cast::<c_void>()) };
        }
    }
}

/// One GPU of the store: its context, the compiled kernel, the shards it holds and the table descriptors the
/// kernel reads there.
#[derive(Debug)]
struct Gpu {
    info: GpuInfo,
    ctx: Arc<CudaContext>,
    gather: CudaFunction,
    shards: Vec<DeviceBuffer>,
    descriptors: Option<DeviceBuffer>,
}

#[derive(Debug)]
struct Inner {
    specs: Vec<TableSpec>,
    layouts: Vec<ShardLayout>,
    oov: Vec<IntCounter>,
    gpus: Vec<Gpu>,
    /// `(device index, bytes)` of each shard, per table.
    placement: Vec<Vec<(usize, u64)>>,
}

/// Tables in GPU memory. Cloning the handle to the tables is cheap; each executor gathers through its own
/// [`CudaLane`].
#[derive(Debug)]
pub(crate) struct CudaStore {
    inner: Arc<Inner>,
    label: String,
    /// A lane for [`EmbeddingStore::gather`] calls that come without one (tests, tools).
    shared: Mutex<Option<CudaLane>>,
}

fn gpu_error(call: &'static str) -> impl Fn(cu::DriverError) -> GpuError {
    move |e| driver(call, e)
}

fn device_error(call: &'static str) -> impl Fn(cu::DriverError) -> GatherError {
    move |e| GatherError::Device(driver(call, e).to_string())
}

impl CudaStore {
    /// Uploads every shard (`shards` per table, as the CPU store splits them) to `gpus`, compiles the gather kernel
    /// for each GPU and checks that the GPUs can reach each other's memory when there are several.
    pub(crate) fn open(
        gpus: &[GpuInfo],
        specs: Vec<TableSpec>,
        bytes: Vec<TableBytes>,
        shards: usize,
        oov: Vec<IntCounter>,
    ) -> Result<CudaStore, GpuError> {
        assert_eq!(specs.len(), bytes.len(), "one byte view per table");
        assert_eq!(specs.len(), oov.len(), "one OOV counter per table");
        assert!(!gpus.is_empty(), "a CUDA store needs a GPU");
        let supported = kernels::supported_arches()?;
        let mut devices = Vec::with_capacity(gpus.len());
        for info in gpus {
            let ctx =
                CudaContext::new(info.ordinal).map_err(gpu_error("cuDevicePrimaryCtxRetain"))?;
            let target = kernels::target_for(info.compute_capability, &supported)?;
            if let kernels::Target::Ptx(arch) = target {
                tracing::warn!(
                    device = %info.label(),
                    "this NVRTC does not know the GPU's architecture; loading PTX for compute_{arch}, which the \
                     driver compiles"
                );
            }
            let image = kernels::compile(EMBEDDING_GATHER_SRC, EMBEDDING_GATHER, target)?;
            let module = match target {
                kernels::Target::Cubin(_) => cudarc::nvrtc::Ptx::from_binary(image),
                kernels::Target::Ptx(_) => cudarc::nvrtc::Ptx::from_src(
                    String::from_utf8_lossy(&image)
                        .trim_end_matches('\0')
                        .to_owned(),
                ),
            };
            let module = ctx
                .load_module(module)
                .map_err(gpu_error("cuModuleLoadData"))?;
            let gather = module
                .load_function(EMBEDDING_GATHER)
                .map_err(gpu_error("cuModuleGetFunction"))?;
            devices.push(Gpu {
                info: info.clone(),
                ctx,
                gather,
                shards: Vec::new(),
                descriptors: None,
            });
        }
        enable_peer_access(&devices)?;

        // Place shards: each on the GPU with the fewest bytes so far (ties: the lowest index), so tables spread
        // evenly whatever their sizes.
        let mut used = vec![0u64; devices.len()];
        let mut free = Vec::with_capacity(devices.len());
        for d in &devices {
            d.ctx
                .bind_to_thread()
                .map_err(gpu_error("cuCtxSetCurrent"))?;
            let (f, _) = cu::mem_get_info().map_err(gpu_error("cuMemGetInfo"))?;
            free.push(f as u64);
        }
        let mut layouts = Vec::with_capacity(specs.len());
        let mut placement = Vec::with_capacity(specs.len());
        // `buffers[table][shard]` = (device index, index in that device's shard list)
        let mut buffers: Vec<Vec<(usize, usize)>> = Vec::with_capacity(specs.len());
        for (spec, table) in specs.iter().zip(&bytes) {
            let layout = ShardLayout::new(spec.rows, shards);
            let row_bytes = spec.storage.row_bytes(spec.dim);
            let mut table_placement = Vec::with_capacity(layout.shards);
            let mut table_buffers = Vec::with_capacity(layout.shards);
            for s in 0..layout.shards {
                let rows = layout.range(s, spec.rows);
                let host = &table.as_slice()
                    [rows.start as usize * row_bytes..rows.end as usize * row_bytes];
                let d = (0..devices.len())
                    .min_by_key(|&d| (used[d], d))
                    .unwrap_or(0);
                let len = host.len() as u64;
                if used[d] + len + RESERVED_BYTES > free[d] {
                    return Err(GpuError::OutOfMemory {
                        device: devices[d].info.label(),
                        table: spec.name.clone(),
                        shard: s,
                        bytes: len,
                        free: free[d].saturating_sub(used[d]),
                    });
                }
                let buffer = DeviceBuffer::new(&devices[d].ctx, host.len())
                    .map_err(gpu_error("cuMemAlloc"))?;
                // SAFETY: `buffer` holds `host.len()` bytes; the copy is synchronous for pageable host memory.
                unsafe { sys::cuMemcpyHtoD_v2(buffer.ptr, host.as_ptr().cast(), host.len()) }
                    .result()
                    .map_err(gpu_error("cuMemcpyHtoD"))?;
                used[d] += len;
                table_placement.push((d, len));
                table_buffers.push((d, devices[d].shards.len()));
                devices[d].shards.push(buffer);
            }
            layouts.push(layout);
            placement.push(table_placement);
            buffers.push(table_buffers);
        }

        // The descriptors: [TableDesc; tables] then every table's [Shard; shards], on each GPU.
        let total_shards: usize = buffers.iter().map(Vec::len).sum();
        let blob_bytes = specs.len() * TABLE_DESC_BYTES + total_shards * SHARD_DESC_BYTES;
        for d in 0..devices.len() {
            let buffer =
                DeviceBuffer::new(&devices[d].ctx, blob_bytes).map_err(gpu_error("cuMemAlloc"))?;
            let mut blob = Vec::with_capacity(blob_bytes);
            let shards_base = buffer.ptr + (specs.len() * TABLE_DESC_BYTES) as u64;
            let mut shard_index = 0usize;
            for ((spec, layout), table_buffers) in specs.iter().zip(&layouts).zip(&buffers) {
                let default_row = match spec.oov {
                    OovPolicy::Default { row } => row as i64,
                    OovPolicy::Reject => -1,
                };
                blob.extend((shards_base + (shard_index * SHARD_DESC_BYTES) as u64).to_le_bytes());
                blob.extend((spec.rows as i64).to_le_bytes());
                blob.extend((layout.rows_per_shard as i64).to_le_bytes());
                blob.extend(default_row.to_le_bytes());
                blob.extend(storage_code(spec.storage).to_le_bytes());
                blob.extend((spec.storage.row_bytes(spec.dim) as i32).to_le_bytes());
                shard_index += table_buffers.len();
            }
            for table_buffers in &buffers {
                for &(owner, i) in table_buffers {
                    blob.extend(devices[owner].shards[i].ptr.to_le_bytes());
                    blob.extend((owner as i32).to_le_bytes());
                    blob.extend(0i32.to_le_bytes());
                }
            }
            debug_assert_eq!(blob.len(), blob_bytes);
            // SAFETY: `buffer` holds `blob_bytes` bytes.
            unsafe { sys::cuMemcpyHtoD_v2(buffer.ptr, blob.as_ptr().cast(), blob.len()) }
                .result()
                .map_err(gpu_error("cuMemcpyHtoD"))?;
            devices[d].descriptors = Some(buffer);
        }

        let label = match devices.as_slice() {
            [one] => one.info.label(),
            many => format!(
                "cuda:{}",
                many.iter()
                    .map(|d| d.info.ordinal.to_string())
                    .collect::<Vec<_>>()
                    .join("+")
            ),
        };
        let inner = Arc::new(Inner {
            specs,
            layouts,
            oov,
            gpus: devices,
            placement,
        });
        Ok(CudaStore {
            inner,
            label,
            shared: Mutex::new(None),
        })
    }

    /// A lane whose output lives on GPU `home` (an index into the store's GPUs).
    pub(crate) fn new_lane(&self, home: usize) -> Result<CudaLane, GatherError> {
        CudaLane::new(Arc::clone(&self.inner), home % self.inner.gpus.len())
    }
}

fn enable_peer_access(devices: &[Gpu]) -> Result<(), GpuError> {
    if devices.len() < 2 {
        return Ok(());
    }
    for a in devices {
        for b in devices {
            if a.info.ordinal == b.info.ordinal {
                continue;
            }
            let mut can = 0;
            // SAFETY: writes one int; both devices come from the driver.
            unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.ctx.cu_device(), b.ctx.cu_device()) }
                .result()
                .map_err(gpu_error("cuDeviceCanAccessPeer"))?;
            if can == 0 {
                return Err(GpuError::NoPeerAccess {
                    devices: devices.len(),
                    from: a.info.label(),
                    to: b.info.label(),
                });
            }
            a.ctx
                .bind_to_thread()
                .map_err(gpu_error("cuCtxSetCurrent"))?;
            // SAFETY: lets the current context (a) address b's memory; enabling twice is reported and ignored.
            match unsafe { sys::cuCtxEnablePeerAccess(b.ctx.cu_ctx(), 0) } {
                sys::CUresult::CUDA_SUCCESS
                | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
                other => return Err(driver("cuCtxEnablePeerAccess", cu::DriverError(other))),
            }
        }
    }
    Ok(())
}

impl EmbeddingStore for CudaStore {
    fn tables(&self) -> &[TableSpec] {
        &self.inner.specs
    }

    fn shard_layouts(&self) -> &[ShardLayout] {
        &self.inner.layouts
    }

    fn device(&self) -> &str {
        &self.label
    }

    fn gather(&self, fields: &[usize], ids: &[i64], out: &mut [f32]) -> Result<(), GatherError> {
        let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        let lane = match shared.as_mut() {
            Some(lane) => lane,
            None => shared.insert(self.new_lane(0)?),
        };
        lane.gather_host(fields, ids, out)
    }

    fn lane(&self, executor: usize) -> Option<Result<Box<dyn GatherLane>, GatherError>> {
        Some(
            self.new_lane(executor)
                .map(|lane| Box::new(lane) as Box<dyn GatherLane>),
        )
    }

    fn device_memory(&self) -> Vec<ShardMemory> {
        let mut out = Vec::new();
        for (spec, shards) in self.inner.specs.iter().zip(&self.inner.placement) {
            for (shard, &(d, bytes)) in shards.iter().enumerate() {
                out.push(ShardMemory {
                    table: spec.name.clone(),
                    shard,
                    device: self.inner.gpus[d].info.label(),
                    bytes,
                });
            }
        }
        out
    }
}

/// One executor's gather state: a stream on every GPU of the store, pinned staging for the ids, and the device
/// buffers a batch is staged and (for host output) gathered into on the home GPU.
#[derive(Debug)]
pub(crate) struct CudaLane {
    inner: Arc<Inner>,
    home: usize,
    /// One per GPU of the store; `streams[home]` carries the copies.
    streams: Vec<Arc<CudaStream>>,
    /// Recorded on the home stream once the ids are on the home GPU; the other GPUs wait for it.
    staged_event: Option<CudaEvent>,
    /// Recorded on each other GPU's stream after its kernel; the home stream waits for them.
    done_events: Vec<Option<CudaEvent>>,
    /// Ids the buffers below hold room for.
    capacity: usize,
    /// Field count the staging layout was made for.
    staging: Option<PinnedBuffer>,
    staged: Option<DeviceBuffer>,
    out: Option<DeviceBuffer>,
}

impl CudaLane {
    fn new(inner: Arc<Inner>, home: usize) -> Result<CudaLane, GatherError> {
        let mut streams = Vec::with_capacity(inner.gpus.len());
        let mut done_events = Vec::with_capacity(inner.gpus.len());
        for (d, gpu) in inner.gpus.iter().enumerate() {
            streams.push(
                gpu.ctx
                    .new_stream()
                    .map_err(device_error("cuStreamCreate"))?,
            );
            done_events.push(if d == home || inner.gpus.len() == 1 {
                None
            } else {
                Some(
                    gpu.ctx
                        .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                        .map_err(device_error("cuEventCreate"))?,
                )
            });
        }
        let staged_event = if inner.gpus.len() > 1 {
            Some(
                inner.gpus[home]
                    .ctx
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .map_err(device_error("cuEventCreate"))?,
            )
        } else {
            None
        };
        Ok(CudaLane {
            inner,
            home,
            streams,
            staged_event,
            done_events,
            capacity: 0,
            staging: None,
            staged: None,
            out: None,
        })
    }

    /// Bytes of the staging layout for `ids` ids of `fields` fields: the field → table map as i32, padded to 8
    /// bytes, then the ids as i64.
    fn staging_bytes(fields: usize, ids: usize) -> (usize, usize) {
        let ids_at = (fields * 4).next_multiple_of(8);
        (ids_at, ids_at + ids * 8)
    }

    /// Grows the buffers to hold `ids` ids (and `ids * dim` outputs) when they are too small.
    fn reserve(&mut self, fields: usize, ids: usize, dim: usize) -> Result<(), GatherError> {
        let (_, bytes) = Self::staging_bytes(fields, ids);
        let out_bytes = ids * dim * 4;
        let fits = |b: &Option<DeviceBuffer>, n: usize| b.as_ref().is_some_and(|b| b.bytes >= n);
        let staging_fits = self.staging.as_ref().is_some_and(|s| s.bytes >= bytes);
        if staging_fits && fits(&self.staged, bytes) && fits(&self.out, out_bytes) {
            return Ok(());
        }
        // Room for twice as many, so a growing batch size does not reallocate every time.
        let ctx = &self.inner.gpus[self.home].ctx;
        let (_, grow) = Self::staging_bytes(fields, ids.max(self.capacity) * 2);
        self.staging = None;
        self.staged = None;
        self.out = None;
        self.staging = Some(PinnedBuffer::new(ctx, grow).map_err(device_error("cuMemHostAlloc"))?);
        self.staged = Some(DeviceBuffer::new(ctx, grow).map_err(device_error("cuMemAlloc"))?);
        self.out =
            Some(DeviceBuffer::new(ctx, out_bytes.max(1) * 2).map_err(device_error("cuMemAlloc"))?);
        self.capacity = ids.max(self.capacity) * 2;
        Ok(())
    }

    /// Stages the batch and launches the kernel on every GPU; the result lands in `out` (device address on the
    /// home GPU) once the home stream reaches this point.
    fn enqueue(
        &mut self,
        fields: &[usize],
        ids: &[i64],
        dim: usize,
        out: sys::CUdeviceptr,
    ) -> Result<(), GatherError> {
        let (ids_at, bytes) = Self::staging_bytes(fields.len(), ids.len());
        let home = self.home;
        let staging = self
            .staging
            .as_mut()
            .ok_or_else(|| GatherError::Device("staging buffer missing".into()))?;
        {
            // The previous gather waited for its stream, so no copy reads this buffer now.
            let host = staging.as_mut_slice();
            for (chunk, &t) in host[..fields.len() * 4].chunks_exact_mut(4).zip(fields) {
                chunk.copy_from_slice(&(t as i32).to_le_bytes());
            }
            for (chunk, &id) in host[ids_at..bytes].chunks_exact_mut(8).zip(ids) {
                chunk.copy_from_slice(&id.to_le_bytes());
            }
        }
        let staged = self
            .staged
            .as_ref()
            .ok_or_else(|| GatherError::Device("staged buffer missing".into()))?
            .ptr;
        let home_stream = &self.streams[home];
        let home_ctx = &self.inner.gpus[home].ctx;
        home_ctx
            .bind_to_thread()
            .map_err(device_error("cuCtxSetCurrent"))?;
        // SAFETY: both buffers hold `bytes` bytes; the pinned source stays untouched until the stream is waited for.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                staged,
                staging.ptr.cast::<c_void>(),
                bytes,
                home_stream.cu_stream(),
            )
        }
        .result()
        .map_err(device_error("cuMemcpyHtoDAsync"))?;
        if let Some(event) = &self.staged_event {
            event
                .record(home_stream)
                .map_err(device_error("cuEventRecord"))?;
        }

        let n = ids.len() as i64;
        let fields_count = fields.len() as i32;
        let dim_arg = dim as i32;
        let lanes = (dim.div_ceil(4).next_power_of_two()).clamp(1, 32) as u32;
        let lanes_log2 = lanes.trailing_zeros() as i32;
        let rows_per_block = BLOCK_THREADS / lanes;
        let blocks = u32::try_from(ids.len().div_ceil(rows_per_block as usize))
            .unwrap_or(u32::MAX)
            .clamp(1, 1 << 20);
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let ids_ptr = staged + ids_at as u64;
        let fields_ptr = staged;
        // Other GPUs first, so they run while the home GPU does its part.
        let order = (0..self.inner.gpus.len())
            .filter(|&d| d != home)
            .chain(std::iter::once(home));
        for d in order {
            let gpu = &self.inner.gpus[d];
            if gpu.shards.is_empty() {
                continue;
            }
            let stream = &self.streams[d];
            if d != home
                && let Some(event) = &self.staged_event
            {
                stream
                    .wait(event)
                    .map_err(device_error("cuStreamWaitEvent"))?;
            }
            let tables = gpu
                .descriptors
                .as_ref()
                .ok_or_else(|| GatherError::Device("descriptors missing".into()))?
                .ptr;
            let device = d as i32;
            let mut launch = stream.launch_builder(&gpu.gather);
            launch
                .arg(&ids_ptr)
                .arg(&fields_ptr)
                .arg(&fields_count)
                .arg(&tables)
                .arg(&n)
                .arg(&dim_arg)
                .arg(&lanes_log2)
                .arg(&device)
                .arg(&out);
            // SAFETY: the arguments match the kernel's parameters in type and order; every address is a live
            // buffer of the store or this lane of the sizes the shape check and `reserve` guarantee, reachable from
            // GPU `d` (its own memory, or the home GPU's through peer access).
            unsafe { launch.launch(config) }.map_err(device_error("cuLaunchKernel"))?;
            if let Some(Some(event)) = self.done_events.get(d) {
                event
                    .record(stream)
                    .map_err(device_error("cuEventRecord"))?;
                home_stream
                    .wait(event)
                    .map_err(device_error("cuStreamWaitEvent"))?;
            }
        }
        Ok(())
    }

    /// Waits for every stream of the lane; `result` is returned unless waiting fails.
    fn finish(&self, result: Result<(), GatherError>) -> Result<(), GatherError> {
        let mut waited = Ok(());
        for stream in &self.streams {
            if let Err(e) = stream.synchronize() {
                waited = Err(GatherError::Device(
                    driver("cuStreamSynchronize", e).to_string(),
                ));
            }
        }
        result.and(waited)
    }

    fn prepare(&mut self, fields: &[usize], ids: &[i64], dim: usize) -> Result<(), GatherError> {
        screen_ids(&self.inner.specs, &self.inner.oov, fields, ids)?;
        self.reserve(fields.len(), ids.len(), dim)
    }
}

impl GatherLane for CudaLane {
    fn cuda_device(&self) -> Option<usize> {
        Some(self.inner.gpus[self.home].info.ordinal)
    }

    fn gather_host(
        &mut self,
        fields: &[usize],
        ids: &[i64],
        out: &mut [f32],
    ) -> Result<(), GatherError> {
        let dim = check_gather_shape(&self.inner.specs, fields, ids, out)?;
        if ids.is_empty() {
            return Ok(());
        }
        self.prepare(fields, ids, dim)?;
        let device_out = self
            .out
            .as_ref()
            .ok_or_else(|| GatherError::Device("output buffer missing".into()))?
            .ptr;
        let mut result = self.enqueue(fields, ids, dim, device_out);
        if result.is_ok() {
            result = self.inner.gpus[self.home]
                .ctx
                .bind_to_thread()
                .map_err(device_error("cuCtxSetCurrent"));
        }
        if result.is_ok() {
            let stream = self.streams[self.home].cu_stream();
            // SAFETY: `out` holds ids × dim values (shape check) and `device_out` at least as many (`reserve`);
            // the stream is waited for below before `out` is handed back.
            result = unsafe { cu::memcpy_dtoh_async(out, device_out, stream) }
                .map_err(device_error("cuMemcpyDtoHAsync"));
        }
        self.finish(result)
    }

    fn gather_device(
        &mut self,
        fields: &[usize],
        ids: &[i64],
        out: DeviceOutput,
    ) -> Result<(), GatherError> {
        let home = &self.inner.gpus[self.home].info;
        if out.device != home.ordinal {
            return Err(GatherError::Device(format!(
                "output is on cuda:{}, but this lane gathers on {}",
                out.device,
                home.label()
            )));
        }
        let dim = check_gather_shape_len(&self.inner.specs, fields, ids, out.len)?;
        if ids.is_empty() {
            return Ok(());
        }
        self.prepare(fields, ids, dim)?;
        let result = self.enqueue(fields, ids, dim, out.ptr);
        self.finish(result)
    }
}

/// Checks every id against its table's policy without reading any row: counts those that will read the default
/// row, and refuses the batch at the first id a `reject` table does not know. What a store that resolves ids
/// elsewhere (on a GPU) runs on the host first.
fn screen_ids(
    tables: &[TableSpec],
    oov: &[IntCounter],
    fields: &[usize],
    ids: &[i64],
) -> Result<(), GatherError> {
    let nf = fields.len();
    let mut defaults = vec![0u64; tables.len()];
    for (p, &id) in ids.iter().enumerate() {
        let t = fields[p % nf];
        let spec = &tables[t];
        if !spec.contains(id) {
            match spec.oov {
                OovPolicy::Default { .. } => defaults[t] += 1,
                OovPolicy::Reject => {
                    return Err(GatherError::Rejected {
                        table: spec.name.clone(),
                        row: p / nf,
                        id,
                    });
                }
            }
        }
    }
    for (counter, n) in oov.iter().zip(defaults) {
        if n > 0 {
            counter.inc_by(n);
        }
    }
    Ok(())
}
