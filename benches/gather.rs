//! CPU gather throughput: fp32 and int8 tables of 10^4 and 10^7 rows × 16 dims, in 1 and 4 shards, gathering
//! batches of 100 rows × 26 fields (2,600 embedding rows) with Zipf-distributed ids, as a DeepFM ranking request
//! of 100 candidates does. Criterion reports throughput in embedding rows per second ("elem/s").
//!
//! Run: `cargo bench --bench gather` (figures and machine in docs/benchmarks.md). Under `cargo test` (no `--bench`
//! argument) Criterion runs each case once as a smoke test; the 10^7-row tables are left out there, since writing
//! them in an unoptimized build takes minutes.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use prometheus::IntCounter;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Zipf};
use recserve_core::embedding::{CpuStore, EmbeddingStore};
use recserve_core::repository::{OovPolicy, Storage};
use recserve_core::testing::tables::{TestTable, write_tables};

const DIM: usize = 16;
const FIELDS: usize = 26;
const CANDIDATES: usize = 100;
/// Batches drawn up front and cycled through, so id generation is not measured.
const BATCHES: usize = 64;

/// Zipf(1.05) ranks scattered over the table by a bijection (multiplication by a constant coprime to the row
/// count), as hashed categorical ids are: hot ids are not neighbours.
fn zipf_batches(rows: u64, seed: u64) -> Vec<Vec<i64>> {
    let zipf = Zipf::new(rows as f64, 1.05).expect("valid Zipf parameters");
    let mut rng = StdRng::seed_from_u64(seed);
    let scatter = 2_654_435_761u64; // odd and not a multiple of 5: coprime to 10^4 and 10^7
    (0..BATCHES)
        .map(|_| {
            (0..CANDIDATES * FIELDS)
                .map(|_| {
                    let rank = zipf.sample(&mut rng) as u64 - 1;
                    ((rank * scatter) % rows) as i64
                })
                .collect()
        })
        .collect()
}

fn bench_gather(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut group = c.benchmark_group("cpu_gather");
    group.throughput(Throughput::Elements((CANDIDATES * FIELDS) as u64));
    let smoke = !std::env::args().any(|a| a == "--bench");
    let sizes: &[u64] = if smoke {
        &[10_000]
    } else {
        &[10_000, 10_000_000]
    };
    for &rows in sizes {
        let batches = zipf_batches(rows, rows);
        for storage in [Storage::Fp32, Storage::Int8] {
            let stem = format!("{}-{rows}", storage.as_str());
            let table = TestTable::new("t", rows, DIM, storage, OovPolicy::Default { row: 0 });
            let (specs, bytes, _) = write_tables(dir.path(), &stem, &[table]);
            for shards in [1usize, 4] {
                let counter = IntCounter::new("oov", "oov").expect("counter");
                let store = CpuStore::new(specs.clone(), bytes.clone(), shards, vec![counter]);
                let fields = [0usize; FIELDS];
                let mut out = vec![0f32; CANDIDATES * FIELDS * DIM];
                let id = BenchmarkId::new(format!("{}/{shards}-shards", storage.as_str()), rows);
                let mut next = 0;
                group.bench_function(id, |b| {
                    b.iter(|| {
                        let ids = &batches[next % BATCHES];
                        next += 1;
                        store.gather(&fields, ids, &mut out).expect("gather");
                        std::hint::black_box(&out);
                    })
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench_gather);
criterion_main!(benches);
