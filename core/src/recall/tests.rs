//! The catalogue's search against the naive reference: identical ids and bit-identical scores (the documented
//! formula is evaluated in the same order), on every instruction set this CPU has, for random and adversarial
//! tables, batches, shard layouts, `k` and exclusions; and every score within the proven f32 rounding bound of
//! the float64 score.

use std::sync::Arc;

use super::contract::Source;
use super::reference;
use super::*;
use crate::registry::RequestLimits;
use crate::repository::{OovPolicy, Storage, TableSpec};

/// A small deterministic generator (xorshift64*), so failures reproduce.
pub(crate) struct Rng(pub(super) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

pub(super) fn spec(rows: usize, dim: usize, storage: Storage) -> TableSpec {
    TableSpec {
        name: "item".to_owned(),
        rows: rows as u64,
        dim,
        storage,
        oov: OovPolicy::Reject,
    }
}

/// Encodes row-major values in the documented layout of `storage` (int8: the documented quantizer).
pub(super) fn encode(values: &[f32], dim: usize, storage: Storage) -> Vec<u8> {
    match storage {
        Storage::Fp32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Storage::Fp16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        Storage::Int8 => {
            let mut out = Vec::new();
            for row in values.chunks_exact(dim) {
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
    }
}

struct Case {
    spec: TableSpec,
    bytes: Vec<u8>,
}

impl Case {
    fn new(values: &[f32], dim: usize, storage: Storage) -> Case {
        Case {
            spec: spec(values.len() / dim, dim, storage),
            bytes: encode(values, dim, storage),
        }
    }

    fn items(&self) -> usize {
        self.spec.rows as usize
    }
}

/// The search queries of (vector, k, exclude) triples.
pub(super) fn search_queries(queries: &[(Vec<f32>, usize, Vec<u32>)]) -> Vec<SearchQuery<'_>> {
    queries
        .iter()
        .map(|(vector, k, exclude)| SearchQuery {
            vector,
            k: *k,
            exclude,
        })
        .collect()
}

/// Searches `queries` (vector, k, exclude) on `case` in `shards` shards with every ISA, and checks each answer
/// against the reference; returns how many answers were checked.
fn check(case: &Case, shards: usize, queries: &[(Vec<f32>, usize, Vec<u32>)], what: &str) -> usize {
    let copied = Catalogue::new(&case.spec, &case.bytes, shards).expect("valid table");
    let mapped =
        Catalogue::mapped(&case.spec, Arc::new(case.bytes.clone()), shards).expect("valid table");
    assert!(mapped.is_mapped() && !copied.is_mapped());
    let search = search_queries(queries);
    let wanted: Vec<Vec<Scored>> = queries
        .iter()
        .map(|(vector, k, exclude)| {
            reference::top_k(
                &reference::scores(&case.spec, &case.bytes, vector),
                *k,
                exclude,
            )
        })
        .collect();
    let mut checked = 0;
    for (isa, catalogue) in Isa::available()
        .into_iter()
        .flat_map(|isa| [(isa, &copied), (isa, &mapped)])
    {
        let mut scratch = SearchScratch::default();
        let (got, stats) = catalogue.search_with(isa, &search, &mut scratch);
        assert_eq!(stats.scored, (queries.len() * case.items()) as u64);
        for (i, (got, want)) in got.iter().zip(&wanted).enumerate() {
            let same = got.len() == want.len()
                && got
                    .iter()
                    .zip(want)
                    .all(|(a, b)| a.id == b.id && a.score.to_bits() == b.score.to_bits());
            assert!(
                same,
                "{what}: {} items × dim {} {:?}, {shards} shards, {}, mapped {}, query {i} (k {}, {} excluded):\n got  {:?}\n want {:?}",
                case.items(),
                case.spec.dim,
                case.spec.storage,
                isa.as_str(),
                catalogue.is_mapped(),
                queries[i].1,
                queries[i].2.len(),
                &got[..got.len().min(8)],
                &want[..want.len().min(8)]
            );
            checked += 1;
        }
    }
    checked
}

fn random_values(rng: &mut Rng, items: usize, dim: usize) -> Vec<f32> {
    (0..items * dim).map(|_| rng.unit()).collect()
}

fn random_exclude(rng: &mut Rng, items: usize, count: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..count).map(|_| rng.below(items) as u32).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[test]
fn random_tables_batches_and_shards_match_the_reference_bit_for_bit() {
    let mut rng = Rng(0x5EED_0001);
    let mut checked = 0;
    for storage in [Storage::Fp32, Storage::Fp16, Storage::Int8] {
        for (items, dim) in [
            (1, 1),
            (15, 3),
            (16, 16),
            (17, 24),
            (300, 64),
            (1000, 7),
            (2049, 33),
        ] {
            let case = Case::new(&random_values(&mut rng, items, dim), dim, storage);
            // Batches of 1, 3 and 9 queries exercise every query-tile shape (4, 2, 1) and their remainders.
            for batch in [1usize, 3, 9] {
                let queries: Vec<_> = (0..batch)
                    .map(|i| {
                        let vector: Vec<f32> = (0..dim).map(|_| rng.unit()).collect();
                        let k = match i % 4 {
                            0 => 1,
                            1 => (items / 3).max(1),
                            2 => items,
                            _ => 1 + rng.below(items),
                        };
                        let exclude = random_exclude(&mut rng, items, i * items / 10);
                        (vector, k, exclude)
                    })
                    .collect();
                for shards in [1usize, 2, 3, 7, items] {
                    checked += check(&case, shards, &queries, "random");
                }
            }
        }
    }
    assert!(checked > 300, "{checked}");
}

#[test]
fn a_mapped_catalogue_scans_block_after_block_as_the_laid_out_one_does() {
    // 5,000 × 64 spans several of the mapped catalogue's blocks per shard (1,024 fp32 items, 3,632 int8 items).
    let mut rng = Rng(0x5EED_0007);
    let (items, dim) = (5000, 64);
    let mut checked = 0;
    for storage in [Storage::Fp32, Storage::Fp16, Storage::Int8] {
        let case = Case::new(&random_values(&mut rng, items, dim), dim, storage);
        let queries: Vec<_> = (0..5)
            .map(|i| {
                let vector: Vec<f32> = (0..dim).map(|_| rng.unit()).collect();
                let k = [1, 100, 1500, items, 37][i];
                // Exclusions on both sides of block boundaries, and many of them.
                let mut exclude = vec![1023, 1024, 1025, 3631, 3632, 4095, 4096];
                exclude.extend(random_exclude(&mut rng, items, i * 300));
                exclude.sort_unstable();
                exclude.dedup();
                (vector, k, exclude)
            })
            .collect();
        for shards in [1, 3] {
            checked += check(&case, shards, &queries, "blocks");
        }
    }
    assert!(checked >= 60, "{checked}");
}

#[test]
fn ties_are_broken_by_lower_id_in_every_layout() {
    // Rows repeat every 5 items, so every score appears items / 5 times; a zero query ties every item at 0.
    let (items, dim) = (203, 9);
    let mut rng = Rng(0x5EED_0002);
    let base = random_values(&mut rng, 5, dim);
    let values: Vec<f32> = (0..items)
        .flat_map(|i| base[(i % 5) * dim..(i % 5 + 1) * dim].to_vec())
        .collect();
    for storage in [Storage::Fp32, Storage::Int8] {
        let case = Case::new(&values, dim, storage);
        let zero = vec![0.0f32; dim];
        let q: Vec<f32> = (0..dim).map(|_| rng.unit()).collect();
        let queries = vec![
            (zero.clone(), 10, vec![]),
            (zero.clone(), items, vec![0, 1, 2]),
            (q.clone(), 7, vec![]),
            (q.clone(), items, random_exclude(&mut rng, items, 50)),
            (q.clone(), 41, vec![]),
        ];
        for shards in [1usize, 2, 4, 16, items] {
            check(&case, shards, &queries, "ties");
        }
        // The zero query returns the lowest ids, in order.
        let catalogue = Catalogue::new(&case.spec, &case.bytes, 3).expect("valid");
        let (got, _) = catalogue.search(
            &[SearchQuery {
                vector: &zero,
                k: 5,
                exclude: &[1, 3],
            }],
            &mut SearchScratch::default(),
        );
        let ids: Vec<u32> = got[0].iter().map(|s| s.id).collect();
        assert_eq!(ids, vec![0, 2, 4, 5, 6]);
    }
}

#[test]
fn k_bounds_and_exclusions_at_shard_boundaries() {
    let (items, dim) = (100, 12);
    let mut rng = Rng(0x5EED_0003);
    let case = Case::new(&random_values(&mut rng, items, dim), dim, Storage::Fp32);
    let q: Vec<f32> = (0..dim).map(|_| rng.unit()).collect();
    let all: Vec<u32> = (0..items as u32).collect();
    for shards in [1usize, 3, 7, 10, 100] {
        let layout = crate::embedding::ShardLayout::new(items as u64, shards);
        // The first and last id of every shard.
        let mut boundaries: Vec<u32> = (0..layout.shards)
            .flat_map(|s| {
                let r = layout.range(s, items as u64);
                [r.start as u32, r.end as u32 - 1]
            })
            .collect();
        boundaries.sort_unstable();
        boundaries.dedup();
        let queries = vec![
            (q.clone(), 1, vec![]),
            (q.clone(), items, vec![]),
            (q.clone(), items, boundaries.clone()),
            (q.clone(), 5, boundaries.clone()),
            (q.clone(), items, all.clone()),
            (q.clone(), 1, all[1..].to_vec()),
            (q.clone(), 3, vec![0, 1_000, u32::MAX]),
        ];
        check(&case, shards, &queries, "boundaries");
        let catalogue = Catalogue::new(&case.spec, &case.bytes, shards).expect("valid");
        let search: Vec<_> = queries
            .iter()
            .map(|(vector, k, exclude)| SearchQuery {
                vector,
                k: *k,
                exclude,
            })
            .collect();
        let (got, _) = catalogue.search(&search, &mut SearchScratch::default());
        assert_eq!(got[1].len(), items, "k = catalogue returns every item");
        assert_eq!(got[2].len(), items - boundaries.len());
        assert!(got[2].iter().all(|s| !boundaries.contains(&s.id)));
        assert!(got[4].is_empty(), "everything excluded: empty answer");
        assert_eq!(got[5].len(), 1);
        assert_eq!(got[5][0].id, 0, "only item 0 is left");
    }
}

#[test]
fn padding_lanes_are_never_returned() {
    // Positive items and a negative query: every real score is below the 0.0 that padding lanes would score.
    let (items, dim) = (17, 5);
    let mut rng = Rng(0x5EED_0004);
    let values: Vec<f32> = (0..items * dim).map(|_| rng.unit().abs() + 0.01).collect();
    let q = vec![-1.0f32; dim];
    for storage in [Storage::Fp32, Storage::Int8] {
        let case = Case::new(&values, dim, storage);
        for shards in [1usize, 2] {
            check(&case, shards, &[(q.clone(), items, vec![])], "padding");
        }
    }
}

#[test]
fn scores_are_within_the_rounding_bound_of_float64() {
    let mut rng = Rng(0x5EED_0005);
    for storage in [Storage::Fp32, Storage::Fp16, Storage::Int8] {
        for (items, dim) in [(500usize, 64usize), (300, 100), (64, 3)] {
            // Magnitudes that differ by rows, so absolute and relative errors both matter.
            let values: Vec<f32> = (0..items * dim)
                .map(|i| rng.unit() * (1.0 + (i / dim % 7) as f32 * 10.0))
                .collect();
            let case = Case::new(&values, dim, storage);
            let catalogue = Catalogue::new(&case.spec, &case.bytes, 3).expect("valid");
            let q: Vec<f32> = (0..dim).map(|_| rng.unit() * 3.0).collect();
            let exact = reference::exact_scores(&case.spec, &case.bytes, &q);
            let (got, _) = catalogue.search(
                &[SearchQuery {
                    vector: &q,
                    k: items,
                    exclude: &[],
                }],
                &mut SearchScratch::default(),
            );
            let max_bound = exact.iter().map(|e| e.1).fold(0.0, f64::max);
            let mut sorted: Vec<f64> = exact.iter().map(|e| e.0).collect();
            sorted.sort_by(|a, b| b.total_cmp(a));
            for (rank, s) in got[0].iter().enumerate() {
                let (value, bound) = exact[s.id as usize];
                let err = (f64::from(s.score) - value).abs();
                assert!(
                    err <= bound,
                    "{storage:?} item {}: |{} − {value}| = {err:e} > bound {bound:e}",
                    s.id,
                    s.score
                );
                // The i-th returned score is within the largest bound of the i-th best exact score.
                assert!(
                    (f64::from(s.score) - sorted[rank]).abs() <= max_bound,
                    "{storage:?} rank {rank}"
                );
            }
        }
    }
}

#[test]
fn refuses_non_finite_tables() {
    let mut values = vec![0.5f32; 3 * 4];
    values[6] = f32::NAN;
    let case = Case::new(&values, 4, Storage::Fp32);
    let err = Catalogue::new(&case.spec, &case.bytes, 1).expect_err("NaN");
    assert!(
        err.contains("row 1 holds a non-finite value (NaN)"),
        "{err}"
    );
    let mut bytes = encode(&[0.5f32; 8], 4, Storage::Int8);
    bytes[4..8].copy_from_slice(&f32::INFINITY.to_le_bytes());
    let err = Catalogue::new(&spec(2, 4, Storage::Int8), &bytes, 1).expect_err("inf scale");
    assert!(err.contains("row 0 holds a non-finite value"), "{err}");
    let err = Catalogue::new(&spec(3, 4, Storage::Fp32), &[0u8; 8], 1).expect_err("short");
    assert!(err.contains("expected 3 rows × 16 bytes"), "{err}");
}

fn contract(item_oov: OovPolicy) -> RecallContract {
    let table = |name: &str, rows: u64, oov: OovPolicy| TableSpec {
        name: name.to_owned(),
        rows,
        dim: 4,
        storage: Storage::Fp32,
        oov,
    };
    RecallContract {
        user_table: table("user", 10, OovPolicy::Reject),
        item_table: table("item", 50, item_oov),
        history_table: Some(table("history", 50, OovPolicy::Reject)),
        default_k: 20,
        limits: RequestLimits {
            max_history: 3,
            max_exclude: 5,
            max_candidates: 8,
            max_reply_items: 100,
        },
        queue: crate::batching::QueueFit::UNBOUNDED,
        index: None,
    }
}

fn input(query: RecallQuery, k: usize, exclude: &[i64]) -> RecallInput {
    RecallInput {
        query,
        k,
        exclude: exclude.to_vec(),
        search: SearchRequest::Default,
    }
}

#[test]
fn a_request_searches_as_it_asks_within_the_index_it_has() {
    let plain = contract(OovPolicy::Reject);
    let default = Probe {
        nprobe: 4,
        max_candidates: 500,
    };
    let indexed = RecallContract {
        index: Some(IndexContract { nlist: 16, default }),
        ..contract(OovPolicy::Reject)
    };
    let ask = |c: &RecallContract, search| {
        c.prepare(RecallInput {
            search,
            ..input(RecallQuery::UserId(1), 3, &[])
        })
        .map(|p| p.search)
        .ok()
    };
    assert_eq!(ask(&plain, SearchRequest::Default), Some(Search::Exact));
    assert_eq!(ask(&plain, SearchRequest::Exact), Some(Search::Exact));
    assert_eq!(
        ask(&indexed, SearchRequest::Default),
        Some(Search::Index(default))
    );
    assert_eq!(ask(&indexed, SearchRequest::Exact), Some(Search::Exact));
    assert_eq!(
        ask(&indexed, SearchRequest::Nprobe(16)),
        Some(Search::Index(Probe {
            nprobe: 16,
            max_candidates: 500
        }))
    );
    for (c, n, says) in [
        (
            &indexed,
            0,
            "nprobe: is 0; it must be from 1 to the 16 lists of the model's index",
        ),
        (
            &indexed,
            17,
            "nprobe: is 17; it must be from 1 to the 16 lists",
        ),
        (
            &plain,
            2,
            "nprobe: is for models with an IVF index, and this model has none",
        ),
    ] {
        let err = c
            .prepare(RecallInput {
                search: SearchRequest::Nprobe(n),
                ..input(RecallQuery::UserId(1), 3, &[])
            })
            .expect_err("refused");
        assert_eq!(err.http_status(), 400);
        assert!(err.to_string().starts_with(says), "{err}");
    }
    let err = indexed
        .search(SearchRequest::Nprobe(99), "parameters.nprobe")
        .expect_err("refused");
    assert!(
        err.to_string().starts_with("parameters.nprobe: is 99"),
        "{err}"
    );
}

#[test]
fn the_contract_dedups_and_applies_each_tables_policy() {
    let lenient = contract(OovPolicy::Default { row: 0 });
    let prepared = lenient
        .prepare(input(RecallQuery::UserId(3), 5, &[7, -1, 60, 7, 2]))
        .expect("valid");
    assert_eq!(prepared.source, Source::User(3));
    assert_eq!(
        prepared.exclude,
        vec![2, 7],
        "sorted, distinct; unknown ids dropped under oov = default"
    );
    let prepared = lenient
        .prepare(input(RecallQuery::History(vec![4, 9, 4]), 50, &[]))
        .expect("duplicates count once; k may be the whole catalogue");
    assert_eq!(prepared.source, Source::History(vec![4, 9]));

    let strict = contract(OovPolicy::Reject);
    let cases = [
        (
            input(RecallQuery::UserId(1), 0, &[]),
            "k: must be at least 1",
        ),
        (
            input(RecallQuery::UserId(1), 51, &[]),
            "k: is 51, more than the 50 items of the catalogue",
        ),
        (
            input(RecallQuery::UserId(10), 1, &[]),
            "user_id: id 10 is outside the user table \"user\" (ids 0 to 9), which rejects unknown ids",
        ),
        (
            input(RecallQuery::History(vec![]), 1, &[]),
            "history: must hold at least one item id",
        ),
        (
            input(RecallQuery::History(vec![1, 2, 3, 4]), 1, &[]),
            "history: holds 4 ids, more than the limit of 3 (--max-history)",
        ),
        (
            input(RecallQuery::History(vec![1, 50]), 1, &[]),
            "history[1]: id 50 is outside the history table \"history\"",
        ),
        (
            input(RecallQuery::UserId(1), 1, &[1, 2, 3, 4, 5, 6]),
            "exclude: holds 6 ids, more than the limit of 5 (--max-exclude)",
        ),
        (
            input(RecallQuery::UserId(1), 1, &[3, -1]),
            "exclude[1]: id -1 is outside the item table \"item\" (ids 0 to 49), which rejects unknown ids",
        ),
    ];
    for (input, expected) in cases {
        let got = strict.prepare(input).expect_err(expected).to_string();
        assert!(
            got.starts_with(expected),
            "expected {expected:?}, got {got:?}"
        );
    }
    let mut no_history = contract(OovPolicy::Reject);
    no_history.history_table = None;
    let got = no_history
        .prepare(input(RecallQuery::History(vec![1]), 1, &[]))
        .expect_err("no history table")
        .to_string();
    assert!(
        got.starts_with("history: is not supported by this model"),
        "{got}"
    );
}

#[test]
fn a_reply_holds_at_most_max_reply_items() {
    let c = contract(OovPolicy::Reject);
    c.check_reply(1, 100, "k")
        .expect("100 items fit a limit of 100");
    c.check_reply(4, 25, "parameters.k").expect("4 × 25 too");
    assert_eq!(
        c.check_reply(1, 101, "k").expect_err("over").to_string(),
        "k: is 101, more items than one reply may hold (100, --max-reply-items)"
    );
    assert_eq!(
        c.check_reply(4, 26, "parameters.k")
            .expect_err("over")
            .to_string(),
        "parameters.k: is 26 for 4 users: 104 items, more than one reply may hold (100, --max-reply-items); ask \
         for fewer users or a smaller k"
    );
    assert!(
        c.check_reply(usize::MAX, 2, "k").is_err(),
        "the product saturates"
    );
}

#[test]
fn fuzz_recall_contract_checks_every_query() {
    use proptest::collection::vec;
    use proptest::prelude::*;
    let id = |valid: i64| prop_oneof![20 => 0..valid, 1 => -3i64..60, 1 => any::<i64>()];
    let query = prop_oneof![
        id(10).prop_map(RecallQuery::UserId),
        prop_oneof![8 => vec(id(50), 1..4), 1 => vec(id(50), 0..6)].prop_map(RecallQuery::History),
    ];
    let k = prop_oneof![20 => 1usize..50, 1 => 0usize..60, 1 => any::<usize>()];
    let exclude = prop_oneof![8 => vec(id(50), 0..5), 1 => vec(id(50), 0..8)];
    let inputs = (query, k, exclude).prop_map(|(query, k, exclude)| RecallInput {
        query,
        k,
        exclude,
        search: SearchRequest::Default,
    });
    let strict = contract(OovPolicy::Reject);
    let lenient = contract(OovPolicy::Default { row: 0 });
    crate::testing::fuzz::run("recall contract", inputs, |input| {
        let mut outcome = crate::testing::fuzz::Outcome::Refused;
        for c in [&strict, &lenient] {
            match c.prepare(input.clone()) {
                Ok(p) => {
                    prop_assert!((1..=c.items()).contains(&p.k));
                    prop_assert!(p.exclude.windows(2).all(|w| w[0] < w[1]));
                    prop_assert!(p.exclude.iter().all(|&e| (e as usize) < c.items()));
                    outcome = crate::testing::fuzz::Outcome::Accepted;
                }
                Err(e) => {
                    crate::testing::fuzz::clear(&e)?;
                }
            }
        }
        Ok(outcome)
    });
}
