//! `/v1` rank body decoding, side by side: the server's decoder (`rank_body::decode_rank`: its byte scanner for
//! bodies in the usual shape), its one-pass serde decoder alone (`rank_body::decode_rank_serde`, what it falls back
//! to) and the plain serde-derive decoding that one replaced (`rank_reference::decode_rank`), on bodies for the demo DeepFM
//! (`models/demo/deepfm`: 19 user fields, 6 item fields, the item id, 13 dense features) with 4 and 100
//! candidates, ids drawn uniformly from each table; then the same requests with their candidates in the columnar
//! form (`*_columnar`: the item fields named once, the ids as a matrix), through the same three decoders.
//! `RECSERVE_BENCH_RANK_MODEL` names another `model.toml` to generate the bodies for (the realistic benchmark
//! model: `target/synth-small/realistic-int8/1/model.toml`, written by `python -m recserve_models synth --preset
//! realistic ...`). Criterion reports candidates per second ("elem/s").
//!
//! Run: `cargo bench --bench rank_decode` (figures in docs/benchmarks.md). Under `cargo test` (no `--bench`
//! argument) Criterion runs each case once as a smoke test.

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use recserve::api::v1::rank_body::{self, RankBody};
use recserve::testing::rank_reference::{self, to_columnar};
use recserve_core::error::ServiceError;
use recserve_core::ranking::RankContract;
use recserve_core::repository::ModelSpec;
use serde_json::Value;

/// A rank body decoder.
type Decode = fn(&RankContract, &[u8]) -> Result<RankBody, ServiceError>;

/// Bodies generated up front and cycled through, so generation is not measured.
const BODIES: usize = 32;

/// A body as clients write it: every candidate's fields in model order, compact JSON.
fn body(spec: &ModelSpec, contract: &RankContract, candidates: usize, rng: &mut StdRng) -> Vec<u8> {
    let mut id = |f: usize| rng.random_range(0..spec.tables[spec.fields[f].table].spec.rows as i64);
    let fields = |ids: &mut dyn FnMut(usize) -> i64, of: &[usize]| {
        let members: Vec<String> = of
            .iter()
            .map(|&f| format!("\"{}\":{}", contract.field_name(f), ids(f)))
            .collect();
        format!("{{{}}}", members.join(","))
    };
    let user = fields(&mut id, &contract.user_fields);
    let dense: Vec<String> = (0..contract.dense_features)
        .map(|i| format!("{}.0", (i * 7) % 50))
        .collect();
    let item_id = contract
        .item_id_field
        .expect("the model has an item id field");
    let rows: Vec<String> = (0..candidates)
        .map(|_| {
            let item = fields(&mut id, &contract.item_fields);
            format!("{{\"id\":{},\"fields\":{item}}}", id(item_id))
        })
        .collect();
    format!(
        "{{\"user\":{{\"fields\":{user},\"dense\":[{}]}},\"candidates\":[{}]}}",
        dense.join(","),
        rows.join(",")
    )
    .into_bytes()
}

/// `body` with its candidates in the columnar form, its columns in model order, compact JSON as clients write it.
fn columnar(contract: &RankContract, body: &[u8]) -> Vec<u8> {
    let request: Value = serde_json::from_slice(body).expect("a generated body");
    let names: Vec<String> = contract
        .item_fields
        .iter()
        .map(|&f| contract.field_name(f).to_owned())
        .collect();
    let columns = to_columnar(&request, Some(&names));
    format!(
        "{{\"user\":{},\"candidates\":{{\"fields\":{},\"ids\":{},\"id\":{}}}}}",
        columns["user"],
        columns["candidates"]["fields"],
        columns["candidates"]["ids"],
        columns["candidates"]["id"]
    )
    .into_bytes()
}

fn bench_decode(c: &mut Criterion) {
    let path = std::env::var("RECSERVE_BENCH_RANK_MODEL").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/models/demo/deepfm/1/model.toml"
        )
        .to_owned()
    });
    let toml = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let spec = Arc::new(ModelSpec::parse(&toml).expect("the model.toml parses"));
    let contract = RankContract::new(Arc::clone(&spec), 1000);
    let mut rng = StdRng::seed_from_u64(5);
    let mut group = c.benchmark_group("rank_decode");
    for candidates in [4usize, 100] {
        let rows: Vec<Vec<u8>> = (0..BODIES)
            .map(|_| body(&spec, &contract, candidates, &mut rng))
            .collect();
        let columns: Vec<Vec<u8>> = rows.iter().map(|b| columnar(&contract, b)).collect();
        for (b, c) in rows.iter().zip(&columns) {
            let scanned = rank_body::decode_rank(&contract, b).expect("valid");
            for (what, decode) in [
                ("the serde decoder", rank_body::decode_rank_serde as Decode),
                ("the reference", rank_reference::decode_rank),
            ] {
                assert_eq!(scanned, decode(&contract, b).expect("valid"), "{what}");
                assert_eq!(
                    scanned,
                    decode(&contract, c).expect("valid"),
                    "{what}, columnar"
                );
            }
            assert_eq!(
                scanned,
                rank_body::decode_rank(&contract, c).expect("valid"),
                "every decoder reads the same rows from either form"
            );
        }
        eprintln!(
            "rank_decode: {candidates} candidates, {} bytes in the row form, {} in the columnar form (first body)",
            rows[0].len(),
            columns[0].len()
        );
        group.throughput(Throughput::Elements(candidates as u64));
        let decoders: [(&str, Decode); 3] = [
            ("reference", rank_reference::decode_rank),
            ("one_pass", rank_body::decode_rank_serde),
            ("scan", rank_body::decode_rank),
        ];
        for (form, bodies) in [("", &rows), ("_columnar", &columns)] {
            for (name, decode) in decoders {
                let mut next = 0;
                group.bench_function(BenchmarkId::new(format!("{name}{form}"), candidates), |b| {
                    b.iter(|| {
                        let decoded = decode(&contract, &bodies[next % BODIES]).expect("valid");
                        next += 1;
                        std::hint::black_box(decoded)
                    })
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench_decode);
criterion_main!(benches);
