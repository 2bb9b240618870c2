//! Tests that need a CUDA device. They are `#[ignore]`d, so `cargo test` lists them as ignored on machines
//! without a GPU (and `scripts/test.sh` prints a SKIPPED line for them); `scripts/gpu-check.sh` runs them on a GPU
//! machine with `--ignored`, where a missing device is a failure, not a skip.
//!
//! The parity tests compare the GPU gather with the naive reference gather bit for bit (the kernel computes every
//! value with the same f32 operations); the throughput test prints figures and asserts nothing about speed.

use std::time::Instant;

use cudarc::driver::CudaContext;
use cudarc::driver::result as cu;
use cudarc::driver::sys;
use prometheus::IntCounter;

use super::store::{CudaStore, DeviceBuffer};
use crate::embedding::DeviceOutput;
use crate::embedding::{CpuStore, EmbeddingStore, GatherError, GatherLane, reference};
use crate::gpu::{GpuInfo, probe};
use crate::repository::{OovPolicy, Storage, TableSpec};
use crate::testing::tables::{TestTable, write_tables};

fn gpus() -> Vec<GpuInfo> {
    probe().unwrap_or_else(|e| panic!("this test needs a CUDA device: {e}"))
}

fn counter() -> IntCounter {
    IntCounter::new("test_oov_total", "test").expect("counter")
}

/// Deterministic ids: in-vocabulary ones (including both ends) and, where the table allows, out-of-vocabulary
/// ones (negative, too large, extreme).
fn ids_for(specs: &[TableSpec], fields: &[usize], rows: usize, seed: u64, oov: bool) -> Vec<i64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let mut ids = Vec::with_capacity(rows * fields.len());
    for _ in 0..rows {
        for &t in fields {
            let spec = &specs[t];
            let oov_ok = oov && spec.oov != OovPolicy::Reject;
            let id = match next() % 12 {
                0 if oov_ok => -1 - (next() % 5) as i64,
                1 if oov_ok => spec.rows as i64 + (next() % 5) as i64,
                2 if oov_ok => i64::MIN,
                3 => spec.rows as i64 - 1,
                4 => 0,
                _ => (next() % spec.rows) as i64,
            };
            ids.push(id);
        }
    }
    ids
}

#[test]
#[ignore = "needs a CUDA device; scripts/gpu-check.sh runs it"]
fn gpu_gather_equals_the_reference_for_every_storage_dim_shard_layout_and_oov_case() {
    let gpus = gpus();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cases = 0;
    // dims: scalar paths (1, 3, 5), fp16 pairs (6), 4-wide (4, 12), 8-wide (8, 16, 64), more than a warp of
    // vectors (200).
    for dim in [1usize, 3, 4, 5, 6, 8, 12, 16, 64, 200] {
        for storage in [Storage::Fp32, Storage::Fp16, Storage::Int8] {
            let tables = [
                TestTable::new("a", 37, dim, storage, OovPolicy::Default { row: 0 }),
                TestTable::new("b", 1, dim, storage, OovPolicy::Default { row: 0 }),
                TestTable::new("c", 64, dim, storage, OovPolicy::Default { row: 63 }),
                TestTable::new("d", 100, dim, storage, OovPolicy::Reject),
                TestTable::new("e", 1000, dim, storage, OovPolicy::Default { row: 500 }),
            ];
            let stem = format!("{}-{dim}", storage.as_str());
            let (specs, bytes, file) = write_tables(dir.path(), &stem, &tables);
            let fields = [0usize, 1, 2, 3, 4, 0, 2, 4];
            for shards in [1usize, 2, 3, 4, 7, 200] {
                let gpu_oov: Vec<_> = specs.iter().map(|_| counter()).collect();
                let cpu_oov: Vec<_> = specs.iter().map(|_| counter()).collect();
                let store =
                    CudaStore::open(&gpus, specs.clone(), bytes.clone(), shards, gpu_oov.clone())
                        .unwrap_or_else(|e| {
                            panic!("open dim {dim} {storage:?} shards {shards}: {e}")
                        });
                let cpu = CpuStore::new(specs.clone(), bytes.clone(), shards, cpu_oov.clone());
                for (rows, seed) in [(1usize, 1u64), (13, 2), (100, 3), (1000, 4)] {
                    let ids = ids_for(&specs, &fields, rows, seed * 131 + shards as u64, true);
                    let mut want = vec![f32::NAN; ids.len() * dim];
                    reference::gather(&file, &specs, &fields, &ids, &mut want).expect("reference");
                    let mut got = vec![f32::NAN; ids.len() * dim];
                    store.gather(&fields, &ids, &mut got).expect("gpu gather");
                    let what = format!("dim {dim} {storage:?} shards {shards} rows {rows}");
                    assert_bits_eq(&got, &want, &what);
                    let mut on_cpu = vec![f32::NAN; ids.len() * dim];
                    cpu.gather(&fields, &ids, &mut on_cpu).expect("cpu gather");
                    assert_bits_eq(&got, &on_cpu, &what);
                    cases += 1;
                }
                let gpu_counts: Vec<u64> = gpu_oov.iter().map(IntCounter::get).collect();
                let cpu_counts: Vec<u64> = cpu_oov.iter().map(IntCounter::get).collect();
                assert_eq!(
                    gpu_counts, cpu_counts,
                    "OOV counts, dim {dim} {storage:?} shards {shards}"
                );
                assert!(gpu_counts.iter().sum::<u64>() > 0, "the id mix has OOV ids");
                assert_eq!(gpu_counts[3], 0, "a reject table never reads a default row");
            }
        }
    }
    println!(
        "gpu parity: {cases} batches equal to the reference bit for bit on {} GPU(s)",
        gpus.len()
    );
}

fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{what}: value {i} is {g:e} ({:#010x}), expected {w:e} ({:#010x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

#[test]
#[ignore = "needs a CUDA device; scripts/gpu-check.sh runs it"]
fn mixed_storage_tables_and_rejected_ids() {
    let gpus = gpus();
    let dir = tempfile::tempdir().expect("tempdir");
    let tables = [
        TestTable::new("f32", 50, 16, Storage::Fp32, OovPolicy::Default { row: 7 }),
        TestTable::new("f16", 60, 16, Storage::Fp16, OovPolicy::Default { row: 0 }),
        TestTable::new("i8", 70, 16, Storage::Int8, OovPolicy::Reject),
    ];
    let (specs, bytes, file) = write_tables(dir.path(), "mixed", &tables);
    let oov: Vec<_> = specs.iter().map(|_| counter()).collect();
    let store = CudaStore::open(&gpus, specs.clone(), bytes, 3, oov.clone()).expect("open");
    let fields = [0usize, 1, 2];
    let ids = [3, -9, 69, 50, 59, 0, i64::MAX, 1, 2];
    let mut got = vec![0.0; ids.len() * 16];
    store.gather(&fields, &ids, &mut got).expect("gather");
    let mut want = vec![0.0; ids.len() * 16];
    reference::gather(&file, &specs, &fields, &ids, &mut want).expect("reference");
    assert_bits_eq(&got, &want, "mixed storage");
    assert_eq!((oov[0].get(), oov[1].get(), oov[2].get()), (2, 1, 0));

    let err = store
        .gather(&fields, &[0, 0, 0, 1, 1, 70], &mut got[..6 * 16])
        .expect_err("70 is outside a reject table of 70 rows");
    assert_eq!(
        err,
        GatherError::Rejected {
            table: "i8".into(),
            row: 1,
            id: 70
        }
    );
    // The lane is still usable after a refused batch.
    store.gather(&fields, &ids, &mut got).expect("gather again");
    assert_bits_eq(&got, &want, "after a refusal");
}

#[test]
#[ignore = "needs a CUDA device; scripts/gpu-check.sh runs it"]
fn gathers_into_device_memory_on_every_lane() {
    let gpus = gpus();
    let dir = tempfile::tempdir().expect("tempdir");
    let tables = [
        TestTable::new("a", 5000, 32, Storage::Int8, OovPolicy::Default { row: 1 }),
        TestTable::new("b", 300, 32, Storage::Fp16, OovPolicy::Default { row: 2 }),
    ];
    let (specs, bytes, file) = write_tables(dir.path(), "device", &tables);
    let store =
        CudaStore::open(&gpus, specs.clone(), bytes, 4, vec![counter(), counter()]).expect("open");
    let fields = [0usize, 1, 1, 0];
    // One lane per GPU (and one more, which wraps around to the first), as executors get them.
    for executor in 0..=gpus.len() {
        let mut lane = store.new_lane(executor).expect("lane");
        let ordinal = lane.cuda_device().expect("a GPU lane");
        let ctx = CudaContext::new(ordinal).expect("context");
        for rows in [1usize, 64, 513] {
            let ids = ids_for(&specs, &fields, rows, rows as u64 + executor as u64, true);
            let len = ids.len() * 32;
            let buffer = DeviceBuffer::new(&ctx, len * 4).expect("device buffer");
            lane.gather_device(
                &fields,
                &ids,
                DeviceOutput {
                    ptr: buffer.ptr,
                    len,
                    device: ordinal,
                },
            )
            .expect("gather into device memory");
            let mut got = vec![0f32; len];
            ctx.bind_to_thread().expect("bind");
            // SAFETY: `buffer` holds `len` floats, written by the finished gather.
            unsafe { sys::cuMemcpyDtoH_v2(got.as_mut_ptr().cast(), buffer.ptr, len * 4) }
                .result()
                .expect("copy back");
            let mut want = vec![0f32; len];
            reference::gather(&file, &specs, &fields, &ids, &mut want).expect("reference");
            assert_bits_eq(&got, &want, &format!("lane {executor} rows {rows}"));

            let wrong = DeviceOutput {
                ptr: buffer.ptr,
                len: len - 1,
                device: ordinal,
            };
            assert!(matches!(
                lane.gather_device(&fields, &ids, wrong),
                Err(GatherError::Shape(_))
            ));
        }
    }
}

/// Median of `runs` timings of `f`, in seconds.
fn median_seconds(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Prints rows/s and GB/s of the GPU gather (into device memory, and into host memory as the CPU provider path
/// does), a device-to-device copy measured in the same run, the memory interface's peak, and the CPU store on the
/// same batches, for fp32, fp16 and int8 tables of 2,000,000 rows. Asserts only that the figures are finite.
#[test]
#[ignore = "needs a CUDA device; scripts/gpu-check.sh runs it"]
fn device_gather_throughput() {
    let gpus = gpus();
    let gpu = &gpus[0];
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = CudaContext::new(gpu.ordinal).expect("context");

    // A device-to-device copy of 1 GiB: what the memory system sustains for streaming reads and writes.
    let copy_bytes = 1usize << 30;
    let src = DeviceBuffer::new(&ctx, copy_bytes).expect("alloc");
    let dst = DeviceBuffer::new(&ctx, copy_bytes).expect("alloc");
    let copy = median_seconds(5, || {
        ctx.bind_to_thread().expect("bind");
        // SAFETY: both buffers hold `copy_bytes` bytes.
        unsafe { sys::cuMemcpyDtoD_v2(dst.ptr, src.ptr, copy_bytes) }
            .result()
            .expect("copy");
        cu::ctx::synchronize().expect("sync");
    });
    let copy_gbs = 2.0 * copy_bytes as f64 / copy / 1e9;
    let peak = super::peak_memory_bandwidth(gpu.ordinal);
    println!(
        "gpu: {} ({}), compute capability {}.{}, {:.1} GiB",
        gpu.label(),
        gpu.name,
        gpu.compute_capability.0,
        gpu.compute_capability.1,
        gpu.total_memory as f64 / (1u64 << 30) as f64
    );
    match peak {
        Some(p) => println!(
            "memory interface peak (clock x bus width): {:.0} GB/s",
            p / 1e9
        ),
        None => println!("memory interface peak: not reported by the driver"),
    }
    println!("device-to-device copy of 1 GiB (read + write): {copy_gbs:.0} GB/s");
    println!(
        "{:<6} {:>4} {:>7} | {:>14} {:>9} {:>7} | {:>14} | {:>14} | {:>8}",
        "table",
        "dim",
        "ids",
        "gpu rows/s",
        "GB/s",
        "of copy",
        "gpu->host rows/s",
        "cpu rows/s",
        "gpu/cpu"
    );
    const ROWS: u64 = 2_000_000;
    const FIELDS: usize = 26;
    for (storage, dim) in [
        (Storage::Fp32, 16usize),
        (Storage::Fp32, 64),
        (Storage::Fp16, 64),
        (Storage::Int8, 16),
        (Storage::Int8, 64),
    ] {
        let table = TestTable::new("t", ROWS, dim, storage, OovPolicy::Default { row: 0 });
        let stem = format!("bench-{}-{dim}", storage.as_str());
        let (specs, bytes, _) = write_tables(dir.path(), &stem, &[table]);
        let store = CudaStore::open(
            std::slice::from_ref(gpu),
            specs.clone(),
            bytes.clone(),
            1,
            vec![counter()],
        )
        .expect("open");
        let cpu = CpuStore::new(specs.clone(), bytes, 1, vec![counter()]);
        let fields = [0usize; FIELDS];
        for candidates in [100usize, 4096] {
            let n = candidates * FIELDS;
            let ids: Vec<i64> = {
                let mut state = 0x2545_F491_4F6C_DD1Du64 ^ n as u64;
                (0..n)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        (state % ROWS) as i64
                    })
                    .collect()
            };
            let mut lane = store.new_lane(0).expect("lane");
            let out = DeviceBuffer::new(&ctx, n * dim * 4).expect("alloc");
            let target = DeviceOutput {
                ptr: out.ptr,
                len: n * dim,
                device: gpu.ordinal,
            };
            let runs = if candidates > 1000 { 50 } else { 200 };
            lane.gather_device(&fields, &ids, target).expect("warm-up");
            let device_s = median_seconds(runs, || {
                lane.gather_device(&fields, &ids, target).expect("gather");
            });
            let mut host = vec![0f32; n * dim];
            let host_s = median_seconds(runs, || {
                lane.gather_host(&fields, &ids, &mut host).expect("gather");
            });
            let cpu_s = median_seconds(runs.min(50), || {
                cpu.gather(&fields, &ids, &mut host).expect("gather");
            });
            // Bytes the kernel moves: each row read, each value written, each id read.
            let moved = n * (storage.row_bytes(dim) + 4 * dim + 8);
            let gbs = moved as f64 / device_s / 1e9;
            assert!(gbs.is_finite() && gbs > 0.0);
            println!(
                "{:<6} {:>4} {:>7} | {:>14.3e} {:>9.1} {:>6.1}% | {:>16.3e} | {:>14.3e} | {:>7.1}x",
                storage.as_str(),
                dim,
                n,
                n as f64 / device_s,
                gbs,
                100.0 * gbs / copy_gbs,
                n as f64 / host_s,
                n as f64 / cpu_s,
                cpu_s / device_s,
            );
        }
    }
    println!(
        "(median wall time per batch including the id upload and the stream wait; rows are random over 2,000,000 \
         rows, one shard; `gpu->host` adds the copy back, as with the CPU execution provider)"
    );
}
