//! Embedding tables: their storage formats, the id → (shard, row) mapping, the out-of-vocabulary policy, and the
//! device-agnostic [`EmbeddingStore`] trait that the executors gather through.
//!
//! The CPU store ([`cpu::CpuStore`]) is always built and is the one the GPU store is tested against; the naive
//! [`reference::gather`] is in turn the reference for the CPU store. Each executor thread gathers through its own
//! [`GatherLane`] (made by [`lane`]): for the CPU store a thin wrapper, for the GPU store (`crate::gpu`) a CUDA
//! stream with its own pinned staging and device buffers, which can also leave the batch in device memory.
//! [`SharedGather`] gathers a ranking batch's user columns once per request (per run of equal user ids).

pub mod cpu;
mod file;
#[cfg(test)]
pub(crate) mod reference;
pub mod remote;
mod shared;

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crate::repository::TableSpec;

pub use cpu::CpuStore;
pub use file::{Preload, TableBytes, TensorFile, map_file, open_tables, read_i64_tensor};
pub(crate) use shared::SharedGather;

/// Row-wise sharding of one table into contiguous ranges: `shard = id / rows_per_shard`,
/// `row_in_shard = id % rows_per_shard`. Identical on every device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    pub(crate) rows_per_shard: u64,
    pub(crate) shards: usize,
}

impl ShardLayout {
    /// Splits `rows` rows into at most `requested` shards (at least one row each). Because ranges are equal
    /// (`ceil(rows / requested)` rows, the last one shorter), fewer shards than requested can result, e.g.
    /// 10 rows in 6 shards of 2.
    pub(crate) fn new(rows: u64, requested: usize) -> ShardLayout {
        let requested = (requested.max(1) as u64).min(rows.max(1));
        let rows_per_shard = rows.div_ceil(requested).max(1);
        let shards = rows.div_ceil(rows_per_shard).max(1) as usize;
        ShardLayout {
            rows_per_shard,
            shards,
        }
    }

    #[inline]
    pub(crate) fn locate(&self, row: u64) -> (usize, u64) {
        (
            (row / self.rows_per_shard) as usize,
            row % self.rows_per_shard,
        )
    }

    /// The global row range held by `shard`.
    pub(crate) fn range(&self, shard: usize, rows: u64) -> std::ops::Range<u64> {
        let start = shard as u64 * self.rows_per_shard;
        start..(start + self.rows_per_shard).min(rows)
    }
}

/// Why a gather could not be done. Request validation checks ids against `reject` tables before a request is
/// queued, so a `Rejected` here means a caller skipped validation.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum GatherError {
    #[error(
        "id {id} at row {row} is outside the vocabulary of table {table:?}, which rejects unknown ids"
    )]
    Rejected { table: String, row: usize, id: i64 },
    #[error("gather shape mismatch: {0}")]
    Shape(String),
    /// The GPU failed (a CUDA call returned an error), or the lane cannot write where it was asked to.
    #[error("GPU gather failed: {0}")]
    Device(String),
    /// Rows of a Redis-tier table whose policy is `unfetched = "unavailable"` were not fetched in time.
    #[error(
        "{rows} rows of the batch were not fetched from the Redis tier in time, table {table:?} refuses to go \
         without them ({failure})"
    )]
    Unfetched {
        table: String,
        rows: usize,
        failure: &'static str,
    },
}

/// The embedding tables of one model, on some device, read by gathering rows.
///
/// `fields[f]` is the table index that column `f` of `ids` reads; every such table must have the same `dim`.
/// `ids` is `[rows, fields.len()]` row-major and `out` is `[rows, fields.len(), dim]`.
pub trait EmbeddingStore: Send + Sync + fmt::Debug {
    /// The tables, in `model.toml` order.
    fn tables(&self) -> &[TableSpec];
    /// Shard layout of each table.
    fn shard_layouts(&self) -> &[ShardLayout];
    /// Device label for metrics and logs, e.g. `cpu` or `cuda:0`.
    fn device(&self) -> &str;
    /// The version's warm-up is over: its gathers are traffic from now on. A store that counts its own work in
    /// the metrics (the Redis tier's cache lookups and fetches) counts nothing before.
    fn serving(&self) {}
    /// Gathers rows into host memory, applying each table's OOV policy and counting defaults.
    fn gather(&self, fields: &[usize], ids: &[i64], out: &mut [f32]) -> Result<(), GatherError>;
    /// [`EmbeddingStore::gather`] for a batch that must be answered by `deadline`: a store with a remote tier
    /// waits for rows until then at most. Stores in local memory ignore it.
    fn gather_until(
        &self,
        fields: &[usize],
        ids: &[i64],
        out: &mut [f32],
        deadline: Instant,
    ) -> Result<(), GatherError> {
        let _ = deadline;
        self.gather(fields, ids, out)
    }
    /// A lane of its own for executor `executor`, when this store has one (GPU stores: a stream and buffers on
    /// the executor's GPU). `None`: executors gather through [`EmbeddingStore::gather`].
    fn lane(&self, executor: usize) -> Option<Result<Box<dyn GatherLane>, GatherError>> {
        let _ = executor;
        None
    }
    /// Device memory held per shard (empty for host memory), for `recserve_gpu_memory_bytes`.
    fn device_memory(&self) -> Vec<ShardMemory> {
        Vec::new()
    }
}

/// One executor's way of gathering: owned by the executor thread, so it can keep streams and buffers without locks.
pub trait GatherLane: Send + fmt::Debug {
    /// The CUDA device ordinal the lane gathers on, or `None` for host memory. An executor whose lane is on a GPU
    /// may run its dense graph there too.
    fn cuda_device(&self) -> Option<usize>;
    /// Gathers into host memory, as [`EmbeddingStore::gather`].
    fn gather_host(
        &mut self,
        fields: &[usize],
        ids: &[i64],
        out: &mut [f32],
    ) -> Result<(), GatherError>;
    /// Gathers into host memory by `deadline`, as [`EmbeddingStore::gather_until`].
    fn gather_host_until(
        &mut self,
        fields: &[usize],
        ids: &[i64],
        out: &mut [f32],
        deadline: Instant,
    ) -> Result<(), GatherError> {
        let _ = deadline;
        self.gather_host(fields, ids, out)
    }
    /// Gathers into device memory on [`GatherLane::cuda_device`]; returns once the values are there.
    fn gather_device(
        &mut self,
        fields: &[usize],
        ids: &[i64],
        out: DeviceOutput,
    ) -> Result<(), GatherError>;
}

/// The lane of executor `executor`: the store's own, or one that gathers through the shared store.
pub(crate) fn lane(
    store: &Arc<dyn EmbeddingStore>,
    executor: usize,
) -> Result<Box<dyn GatherLane>, GatherError> {
    match store.lane(executor) {
        Some(lane) => lane,
        None => Ok(Box::new(HostLane(Arc::clone(store)))),
    }
}

/// The lane of a store in host memory.
#[derive(Debug)]
struct HostLane(Arc<dyn EmbeddingStore>);

impl GatherLane for HostLane {
    fn cuda_device(&self) -> Option<usize> {
        None
    }

    fn gather_host(
        &mut self,
        fields: &[usize],
        ids: &[i64],
        out: &mut [f32],
    ) -> Result<(), GatherError> {
        self.0.gather(fields, ids, out)
    }

    fn gather_host_until(
        &mut self,
        fields: &[usize],
        ids: &[i64],
        out: &mut [f32],
        deadline: Instant,
    ) -> Result<(), GatherError> {
        self.0.gather_until(fields, ids, out, deadline)
    }

    fn gather_device(
        &mut self,
        _fields: &[usize],
        _ids: &[i64],
        out: DeviceOutput,
    ) -> Result<(), GatherError> {
        Err(GatherError::Device(format!(
            "the {} store cannot write into memory of cuda:{}",
            self.0.device(),
            out.device
        )))
    }
}

/// A device buffer that a gather writes `[rows, fields, dim]` float32 values into (memory ONNX Runtime allocated
/// for a GPU session's input).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceOutput {
    /// CUDA device address.
    pub(crate) ptr: u64,
    /// Capacity in f32 values.
    pub(crate) len: usize,
    /// CUDA device ordinal.
    pub(crate) device: usize,
}

/// Bytes of device memory that one shard of one table occupies, for `recserve_gpu_memory_bytes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMemory {
    pub(crate) table: String,
    pub(crate) shard: usize,
    /// `cuda:N`.
    pub(crate) device: String,
    pub(crate) bytes: u64,
}

/// Checks `ids`/`out` against `fields` and returns the shared `dim`.
pub(crate) fn check_gather_shape(
    tables: &[TableSpec],
    fields: &[usize],
    ids: &[i64],
    out: &[f32],
) -> Result<usize, GatherError> {
    check_gather_shape_len(tables, fields, ids, out.len())
}

/// [`check_gather_shape`] for an output known by its length (device memory).
pub(crate) fn check_gather_shape_len(
    tables: &[TableSpec],
    fields: &[usize],
    ids: &[i64],
    out_len: usize,
) -> Result<usize, GatherError> {
    let Some(&first) = fields.first() else {
        return Err(GatherError::Shape("no fields".to_owned()));
    };
    let table = |t: usize| {
        tables.get(t).ok_or_else(|| {
            GatherError::Shape(format!("field reads table {t}, which does not exist"))
        })
    };
    let dim = table(first)?.dim;
    for &t in fields {
        if table(t)?.dim != dim {
            return Err(GatherError::Shape(format!(
                "tables {:?} and {:?} have different dims",
                tables[first].name, tables[t].name
            )));
        }
    }
    if !ids.len().is_multiple_of(fields.len()) {
        return Err(GatherError::Shape(format!(
            "{} ids are not a whole number of rows of {} fields",
            ids.len(),
            fields.len()
        )));
    }
    if out_len != ids.len() * dim {
        return Err(GatherError::Shape(format!(
            "output holds {} values, expected {} ids × dim {dim}",
            out_len,
            ids.len()
        )));
    }
    Ok(dim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_layout_covers_every_row_once() {
        for rows in [1u64, 2, 7, 10, 64, 1000, 1001] {
            for requested in [1usize, 2, 3, 4, 6, 16, 2000] {
                let layout = ShardLayout::new(rows, requested);
                assert!(layout.shards >= 1 && layout.shards <= requested.max(1));
                let mut seen = 0;
                for shard in 0..layout.shards {
                    let range = layout.range(shard, rows);
                    assert!(
                        !range.is_empty(),
                        "rows {rows} requested {requested} shard {shard} is empty"
                    );
                    for row in range.clone() {
                        assert_eq!(layout.locate(row), (shard, row - range.start));
                        seen += 1;
                    }
                }
                assert_eq!(seen, rows);
            }
        }
        assert_eq!(
            ShardLayout::new(10, 6),
            ShardLayout {
                rows_per_shard: 2,
                shards: 5
            }
        );
        assert_eq!(
            ShardLayout::new(10, 4),
            ShardLayout {
                rows_per_shard: 3,
                shards: 4
            }
        );
    }
}
