//! Recall top-K latency: the exact top 100 by inner product over the Gowalla catalogue (40,981 items × 64, the
//! demo LightGCN's item table when `models/demo/lightgcn` is present, else random values of that shape) and over a
//! synthetic 1,000,000 × 64 catalogue, with fp32 and int8 items, one query at a time and batches of 32 queries
//! (one pass over the catalogue per batch). Latency is the time of one `Catalogue::search` call; p50 and p99 come
//! from every call made (at least 30, and as many as fit in the time budget).
//!
//! Beside them, the memory-bandwidth bound: the time of a plain sequential read (a sum) of as many bytes as one fp32
//! scan of the catalogue reads, so a single fp32 query cannot be faster than that. The int8 catalogue is read the
//! same way for comparison.
//!
//! Run: `cargo bench --bench topk` (prints a Markdown table, docs/benchmarks.md). Options after `--`:
//! `--budget-s N` (seconds per row, default 4), `--isa all` (also every narrower instruction set this CPU has),
//! `--shards N` (default 1).
//!
//! Under `cargo test` (no `--bench` argument) it runs as a smoke test only: a small random catalogue, a few calls
//! per row, so the test suite checks that the benchmark works without spending minutes in an unoptimized build.

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};
use recserve_core::recall::{Catalogue, Isa, SearchQuery, SearchScratch};
use recserve_core::repository::{OovPolicy, Storage, TableSpec};

const K: usize = 100;
const DIM: usize = 64;
const BATCH: usize = 32;

struct Options {
    /// `cargo bench` passes `--bench`; without it (`cargo test --all-targets`) this is a smoke run.
    smoke: bool,
    budget: Duration,
    all_isas: bool,
    shards: usize,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let smoke = !args.iter().any(|a| a == "--bench");
    Options {
        smoke,
        budget: Duration::from_secs_f64(
            value("--budget-s")
                .and_then(|v| v.parse().ok())
                .unwrap_or(if smoke { 0.0 } else { 4.0 }),
        ),
        all_isas: value("--isa").as_deref() == Some("all"),
        shards: value("--shards").and_then(|v| v.parse().ok()).unwrap_or(1),
    }
}

/// Item values `[items, DIM]` and query vectors.
struct Data {
    name: String,
    items: usize,
    values: Vec<f32>,
    queries: Vec<Vec<f32>>,
}

/// The demo LightGCN's item and user tables (int8, dequantized as documented), if the demo repository is there.
fn gowalla() -> Option<Data> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/demo/lightgcn/1/tables.safetensors");
    let bytes = std::fs::read(&path).ok()?;
    let tensors = safetensors::SafeTensors::deserialize(&bytes).ok()?;
    let decode = |name: &str| -> Option<(usize, Vec<f32>)> {
        let view = tensors.tensor(name).ok()?;
        let width = view.shape()[1];
        let dim = width - 8;
        let mut out = Vec::with_capacity(view.shape()[0] * dim);
        for row in view.data().chunks_exact(width) {
            let scale = f32::from_le_bytes([row[dim], row[dim + 1], row[dim + 2], row[dim + 3]]);
            let bias = f32::from_le_bytes([row[dim + 4], row[dim + 5], row[dim + 6], row[dim + 7]]);
            out.extend(row[..dim].iter().map(|&c| f32::from(c) * scale + bias));
        }
        Some((dim, out))
    };
    let (dim, values) = decode("item")?;
    let (_, users) = decode("user")?;
    if dim != DIM {
        return None;
    }
    Some(Data {
        name: "Gowalla (demo LightGCN)".to_owned(),
        items: values.len() / DIM,
        values,
        queries: users
            .chunks_exact(DIM)
            .take(4096)
            .map(<[f32]>::to_vec)
            .collect(),
    })
}

fn synthetic(name: &str, items: usize, seed: u64) -> Data {
    let mut rng = StdRng::seed_from_u64(seed);
    let normal = Normal::new(0.0f32, 0.1).expect("valid normal");
    let values = (0..items * DIM).map(|_| normal.sample(&mut rng)).collect();
    // Query norms vary (0.5× to 2×), as users' do.
    let queries = (0..1024)
        .map(|i| {
            let scale = 0.5 + 1.5 * (i % 7) as f32 / 6.0;
            (0..DIM).map(|_| normal.sample(&mut rng) * scale).collect()
        })
        .collect();
    Data {
        name: name.to_owned(),
        items,
        values,
        queries,
    }
}

/// The table bytes of `values` in the documented layout of `storage` (int8: the documented quantizer).
fn encode(values: &[f32], storage: Storage) -> Vec<u8> {
    match storage {
        Storage::Int8 => {
            let mut out = Vec::with_capacity(values.len() / DIM * (DIM + 8));
            for row in values.chunks_exact(DIM) {
                let min = row.iter().copied().fold(f32::INFINITY, f32::min);
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let scale = if max > min { (max - min) / 255.0 } else { 1.0 };
                out.extend(
                    row.iter()
                        .map(|v| ((v - min) / scale).round().clamp(0.0, 255.0) as u8),
                );
                out.extend(scale.to_le_bytes());
                out.extend(min.to_le_bytes());
            }
            out
        }
        Storage::Fp32 | Storage::Fp16 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Calls `f` until `budget` has passed (at least 30 times) and returns the sorted durations.
fn measure(budget: Duration, min_calls: usize, mut f: impl FnMut()) -> Vec<Duration> {
    f(); // warm the caches and the allocator
    let started = Instant::now();
    let mut out = Vec::new();
    while out.len() < min_calls || (started.elapsed() < budget && out.len() < 100_000) {
        let t = Instant::now();
        f();
        out.push(t.elapsed());
    }
    out.sort_unstable();
    out
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn us(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{us:.0} µs")
    }
}

/// A plain sequential read of `data` (a sum), portable version.
fn read_all(data: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    for chunk in data.chunks_exact(16) {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a += x;
        }
    }
    acc.iter().sum()
}

/// The same with AVX2 loads into 8 independent vector sums, so the loads, not the adds, set the pace.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn read_all_avx2(data: &[f32]) -> f32 {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_loadu_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let mut acc: [__m256; 8] = [_mm256_setzero_ps(); 8];
    let chunks = data.chunks_exact(64);
    for chunk in chunks {
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: `chunk` holds 64 values; i · 8 + 8 ≤ 64.
            *a = _mm256_add_ps(*a, unsafe { _mm256_loadu_ps(chunk.as_ptr().add(i * 8)) });
        }
    }
    let mut lanes = [0.0f32; 8];
    let mut total = 0.0;
    for a in acc {
        // SAFETY: `lanes` holds 8 values.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), a) };
        total += lanes.iter().sum::<f32>();
    }
    total
}

fn sequential_read(data: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { read_all_avx2(data) };
    }
    read_all(data)
}

fn main() {
    let opts = options();
    let isa = Isa::detect();
    let isas = if opts.all_isas {
        Isa::available()
    } else {
        vec![isa]
    };
    let datasets = if opts.smoke {
        vec![synthetic("smoke test, random", 2_000, 7)]
    } else {
        vec![
            gowalla().unwrap_or_else(|| {
                synthetic("Gowalla-shaped, random (demo model absent)", 40_981, 7)
            }),
            synthetic("synthetic 1M", 1_000_000, 11),
        ]
    };
    let min_calls = if opts.smoke { 3 } else { 30 };
    println!(
        "top-{K}, dim {DIM}, {} shard(s); {} s per row; CPU {}; kernels {}",
        opts.shards,
        opts.budget.as_secs_f64(),
        cpu_name(),
        isas.iter()
            .map(|i| i.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!();
    println!(
        "| catalogue | items | storage | queries per call | ISA | p50 per call | p99 per call | p50 per query | calls |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut bounds = Vec::new();
    for data in &datasets {
        for storage in [Storage::Fp32, Storage::Int8] {
            let spec = TableSpec {
                name: "item".to_owned(),
                rows: data.items as u64,
                dim: DIM,
                storage,
                oov: OovPolicy::Reject,
            };
            let bytes = encode(&data.values, storage);
            let catalogue = Catalogue::new(&spec, &bytes, opts.shards).expect("valid catalogue");
            drop(bytes);
            for &isa in &isas {
                for batch in [1usize, BATCH] {
                    let mut scratch = SearchScratch::default();
                    let mut next = 0;
                    let times = measure(opts.budget, min_calls, || {
                        let queries: Vec<SearchQuery<'_>> = (0..batch)
                            .map(|i| SearchQuery {
                                vector: &data.queries[(next + i) % data.queries.len()],
                                k: K,
                                exclude: &[],
                            })
                            .collect();
                        next += batch;
                        let (results, _) = catalogue.search_with(isa, &queries, &mut scratch);
                        black_box(results);
                    });
                    let p50 = quantile(&times, 0.5);
                    println!(
                        "| {} | {} | {} | {batch} | {} | {} | {} | {} | {} |",
                        data.name,
                        data.items,
                        storage.as_str(),
                        isa.as_str(),
                        us(p50),
                        us(quantile(&times, 0.99)),
                        us(p50 / batch as u32),
                        times.len()
                    );
                }
            }
            // The bound: a sequential read of as many bytes as one scan of this catalogue (fp32: 4 bytes per
            // value; int8: 1 byte per value plus each item's scale and bias).
            let floats = match storage {
                Storage::Int8 => data.items * (DIM + 8) / 4,
                Storage::Fp32 | Storage::Fp16 => data.items * DIM,
            };
            let buffer: Vec<f32> = data.values.iter().copied().cycle().take(floats).collect();
            let times = measure(opts.budget, min_calls, || {
                black_box(sequential_read(black_box(&buffer)));
            });
            let p50 = quantile(&times, 0.5);
            let bytes = floats * 4;
            bounds.push(format!(
                "| {} | {} | {:.1} MB | {} | {:.1} GB/s |",
                data.name,
                storage.as_str(),
                bytes as f64 / 1e6,
                us(p50),
                bytes as f64 / p50.as_secs_f64() / 1e9
            ));
        }
    }
    println!();
    println!(
        "Memory-bandwidth bound: a plain sequential read of as many bytes as one scan of the catalogue (p50):"
    );
    println!();
    println!("| catalogue | items | bytes per scan | sequential read | bandwidth |");
    println!("| --- | --- | --- | --- | --- |");
    for line in bounds {
        println!("{line}");
    }
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}
