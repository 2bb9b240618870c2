//! The CPU embedding store: shards are views of the memory-mapped safetensors files, and the gather resolves every
//! id first, then copies rows while prefetching the ones a few positions ahead, dequantizing as it copies.

use prometheus::IntCounter;

use super::{EmbeddingStore, GatherError, ShardLayout, TableBytes, check_gather_shape};

use crate::repository::{Storage, TableSpec};

/// How many ids ahead of the row being copied the gather prefetches. Random rows come from DRAM (~100 ns each);
/// eight in flight hide most of that latency without evicting rows before they are used.
const PREFETCH_DISTANCE: usize = 8;

#[derive(Debug)]
struct CpuTable {
    shards: Vec<TableBytes>,
    row_bytes: usize,
    oov: IntCounter,
}

/// Tables in host memory, sharded row-wise.
#[derive(Debug)]
pub struct CpuStore {
    specs: Vec<TableSpec>,
    layouts: Vec<ShardLayout>,
    tables: Vec<CpuTable>,
}

impl CpuStore {
    /// `bytes[t]` holds table `t` whole (as [`super::open_tables`] returns it); `oov[t]` counts its ids that were
    /// read from the default row.
    pub fn new(
        specs: Vec<TableSpec>,
        bytes: Vec<TableBytes>,
        shards: usize,
        oov: Vec<IntCounter>,
    ) -> CpuStore {
        assert_eq!(specs.len(), bytes.len(), "one byte view per table");
        assert_eq!(specs.len(), oov.len(), "one OOV counter per table");
        let mut layouts = Vec::with_capacity(specs.len());
        let mut tables = Vec::with_capacity(specs.len());
        for ((spec, bytes), oov) in specs.iter().zip(bytes).zip(oov) {
            let layout = ShardLayout::new(spec.rows, shards);
            let row_bytes = spec.storage.row_bytes(spec.dim);
            let shards = (0..layout.shards)
                .map(|s| {
                    let rows = layout.range(s, spec.rows);
                    bytes.slice(rows.start as usize * row_bytes..rows.end as usize * row_bytes)
                })
                .collect();
            layouts.push(layout);
            tables.push(CpuTable {
                shards,
                row_bytes,
                oov,
            });
        }
        CpuStore {
            specs,
            layouts,
            tables,
        }
    }

    #[inline]
    fn row(&self, table: usize, row: u64) -> &[u8] {
        let (shard, local) = self.layouts[table].locate(row);
        let t = &self.tables[table];
        let start = local as usize * t.row_bytes;
        &t.shards[shard].as_slice()[start..start + t.row_bytes]
    }
}

impl EmbeddingStore for CpuStore {
    fn tables(&self) -> &[TableSpec] {
        &self.specs
    }

    fn shard_layouts(&self) -> &[ShardLayout] {
        &self.layouts
    }

    fn device(&self) -> &str {
        "cpu"
    }

    fn gather(&self, fields: &[usize], ids: &[i64], out: &mut [f32]) -> Result<(), GatherError> {
        let dim = check_gather_shape(&self.specs, fields, ids, out)?;
        let nf = fields.len();

        // Pass 1: resolve every id to its row (cheap arithmetic, no loads from the tables).
        let mut rows: Vec<&[u8]> = Vec::with_capacity(ids.len());
        for (p, &id) in ids.iter().enumerate() {
            let t = fields[p % nf];
            let row = resolve_row(&self.specs[t], id, p / nf, &self.tables[t].oov)?;
            rows.push(self.row(t, row));
        }

        // Pass 2: copy and dequantize, with the rows PREFETCH_DISTANCE ahead already on their way.
        for row in rows.iter().take(PREFETCH_DISTANCE) {
            prefetch(row);
        }
        for (p, (row, dst)) in rows.iter().zip(out.chunks_exact_mut(dim)).enumerate() {
            if let Some(ahead) = rows.get(p + PREFETCH_DISTANCE) {
                prefetch(ahead);
            }
            decode_row(self.specs[fields[p % nf]].storage, row, dst);
        }
        Ok(())
    }
}

/// The row that `id` (in row `at` of the batch) reads under its table's OOV policy, counting defaults in `oov`.
#[inline]
pub(crate) fn resolve_row(
    spec: &TableSpec,
    id: i64,
    at: usize,
    oov: &IntCounter,
) -> Result<u64, GatherError> {
    if spec.contains(id) {
        return Ok(id as u64);
    }
    let row = spec.resolve(id).ok_or_else(|| GatherError::Rejected {
        table: spec.name.clone(),
        row: at,
        id,
    })?;
    oov.inc();
    Ok(row)
}

/// Dequantizes one stored row into `dst` (`dim` values).
#[inline]
pub fn decode_row(storage: Storage, row: &[u8], dst: &mut [f32]) {
    match storage {
        Storage::Fp32 => {
            for (d, b) in dst.iter_mut().zip(row.as_chunks::<4>().0) {
                *d = f32::from_le_bytes(*b);
            }
        }
        Storage::Fp16 => match bytemuck::try_cast_slice::<u8, half::f16>(row) {
            // Aligned (safetensors aligns tensors): the slice conversion uses F16C when the CPU has it.
            Ok(halves) => half::slice::HalfFloatSliceExt::convert_to_f32_slice(halves, dst),
            Err(_) => {
                for (d, b) in dst.iter_mut().zip(row.as_chunks::<2>().0) {
                    *d = half::f16::from_le_bytes(*b).to_f32();
                }
            }
        },
        Storage::Int8 => {
            let (codes, tail) = row.split_at(dst.len());
            let (params, _) = tail.as_chunks::<4>();
            let scale = f32::from_le_bytes(params[0]);
            let bias = f32::from_le_bytes(params[1]);
            for (d, &q) in dst.iter_mut().zip(codes) {
                *d = f32::from(q) * scale + bias;
            }
        }
    }
}

/// Asks the CPU to start loading every cache line of `row`.
#[inline(always)]
fn prefetch(row: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        for offset in (0..row.len()).step_by(64) {
            // SAFETY: prefetching is a hint and never faults; the pointer is inside `row`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().add(offset).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedding::reference;
    use crate::repository::OovPolicy;
    use crate::testing::tables::{TestTable, oov_counter as counter, write_tables};

    /// Random ids with a share of out-of-vocabulary ones (negative and too large).
    fn ids_for(
        specs: &[TableSpec],
        fields: &[usize],
        rows: usize,
        seed: u64,
        allow_oov: bool,
    ) -> Vec<i64> {
        let mut state = seed;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state >> 33
        };
        let mut ids = Vec::new();
        for _ in 0..rows {
            for &t in fields {
                let spec = &specs[t];
                let r = next();
                let oov_ok = allow_oov && spec.oov != OovPolicy::Reject;
                let id = match r % 10 {
                    0 if oov_ok => -1 - (next() % 5) as i64,
                    1 if oov_ok => spec.rows as i64 + (next() % 5) as i64,
                    2 => spec.rows as i64 - 1,
                    3 => 0,
                    _ => (next() % spec.rows) as i64,
                };
                ids.push(id);
            }
        }
        ids
    }

    #[test]
    fn matches_the_reference_for_every_storage_shard_count_and_oov_case() {
        let dir = tempfile::tempdir().expect("tempdir");
        for storage in [Storage::Fp32, Storage::Fp16, Storage::Int8] {
            let tables = [
                TestTable::new("a", 37, 5, storage, OovPolicy::Default { row: 0 }),
                TestTable::new("b", 1, 5, storage, OovPolicy::Default { row: 0 }),
                TestTable::new("c", 64, 5, storage, OovPolicy::Default { row: 63 }),
                TestTable::new("d", 100, 5, storage, OovPolicy::Reject),
            ];
            let (specs, bytes, file) = write_tables(dir.path(), storage.as_str(), &tables);
            let fields = [0usize, 1, 2, 3, 0, 2];
            for shards in [1usize, 2, 3, 4, 7, 200] {
                let counters: Vec<_> = specs.iter().map(|_| counter()).collect();
                let store = CpuStore::new(specs.clone(), bytes.clone(), shards, counters.clone());
                for (rows, seed) in [(1usize, 1u64), (13, 2), (100, 3)] {
                    let ids = ids_for(&specs, &fields, rows, seed * 31 + shards as u64, true);
                    let mut got = vec![f32::NAN; ids.len() * 5];
                    store.gather(&fields, &ids, &mut got).expect("gather");
                    let mut want = vec![f32::NAN; ids.len() * 5];
                    reference::gather(&file, &specs, &fields, &ids, &mut want).expect("reference");
                    // Both compute each value with the same f32 operations, so they agree exactly.
                    assert_eq!(got, want, "storage {storage:?} shards {shards} rows {rows}");
                }
                let oov: u64 = counters.iter().map(IntCounter::get).sum();
                assert!(oov > 0, "the id mix includes out-of-vocabulary ids");
                assert_eq!(
                    counters[3].get(),
                    0,
                    "a reject table never reads a default row"
                );
            }
        }
    }

    #[test]
    fn counts_default_rows_and_refuses_rejected_ids() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tables = [
            TestTable::new("a", 4, 3, Storage::Fp32, OovPolicy::Default { row: 2 }),
            TestTable::new("r", 4, 3, Storage::Int8, OovPolicy::Reject),
        ];
        let (specs, bytes, file) = write_tables(dir.path(), "t", &tables);
        let counters = vec![counter(), counter()];
        let store = CpuStore::new(specs.clone(), bytes, 2, counters.clone());
        let mut out = vec![0.0; 2 * 2 * 3];
        store
            .gather(&[0, 1], &[9, 3, -4, 0], &mut out)
            .expect("gather");
        assert_eq!(counters[0].get(), 2);
        let mut want = vec![0.0; 2 * 3];
        reference::gather(&file, &specs, &[0], &[2, 2], &mut want).expect("reference");
        assert_eq!(&out[0..3], &want[0..3], "OOV id reads the default row");
        assert_eq!(&out[6..9], &want[3..6]);

        let err = store
            .gather(&[0, 1], &[0, 1, 0, 4], &mut out)
            .expect_err("4 is outside rows = 4");
        assert_eq!(
            err,
            GatherError::Rejected {
                table: "r".into(),
                row: 1,
                id: 4
            }
        );
    }

    #[test]
    fn refuses_mismatched_shapes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tables = [
            TestTable::new("a", 4, 3, Storage::Fp32, OovPolicy::Reject),
            TestTable::new("b", 4, 2, Storage::Fp32, OovPolicy::Reject),
        ];
        let (specs, bytes, _) = write_tables(dir.path(), "t", &tables);
        let store = CpuStore::new(specs, bytes, 1, vec![counter(), counter()]);
        let mut out = vec![0.0; 6];
        assert!(matches!(
            store.gather(&[0, 1], &[0, 0], &mut out),
            Err(GatherError::Shape(_))
        ));
        assert!(matches!(
            store.gather(&[0], &[0, 0], &mut out[..5]),
            Err(GatherError::Shape(_))
        ));
        assert!(matches!(
            store.gather(&[0, 0], &[0, 0, 0], &mut out),
            Err(GatherError::Shape(_))
        ));
        assert!(matches!(
            store.gather(&[], &[], &mut out),
            Err(GatherError::Shape(_))
        ));
    }
}
