//! The IVF index against brute force: with `nprobe = nlist` every answer equals the naive exact top `k` (ids and
//! score bits), with fewer lists it equals the naive top `k` of the probed lists' items, recall never falls as
//! `nprobe` grows, and exclusions, ties, batches, every ISA and the exact path's shard layouts all agree. Also the
//! refusals of a stale or malformed index file. Indexes are built here by a small builder that follows the
//! documented format and bound (docs/model-repository.md); the toolchain's builder is tested in models/tests.

use std::collections::HashMap;
use std::sync::Arc;

use safetensors::Dtype;
use safetensors::tensor::TensorView;

use super::*;
use crate::recall::catalogue::{SearchQuery, SearchScratch};
use crate::recall::reference;
use crate::recall::select::{Scored, TopK, answer_order};
use crate::recall::tests::{Rng, encode, search_queries, spec};

/// An f64-sized buffer, so that the file's f32 and u32 tensors are aligned as they are in a mapped file.
struct Aligned(Vec<u64>, usize);

impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.0)[..self.1]
    }
}

fn bytes(b: &[u8]) -> Bytes {
    let mut words = vec![0u64; b.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..b.len()].copy_from_slice(b);
    Arc::new(Aligned(words, b.len()))
}

/// `γ_n` of f32 (as in the reference).
fn gamma(n: usize) -> f64 {
    let nu = n as f64 / (1u64 << 24) as f64;
    nu / (1.0 - nu)
}

/// How a test index codes its items.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Coding {
    Int8,
    /// With this many sub-quantizers.
    Pq4(usize),
}

/// Builds an int8 index file (see [`build_as`]).
fn build(spec: &TableSpec, table: &[u8], nlist: usize, metadata: &[(&str, &str)]) -> Vec<u8> {
    build_as(Coding::Int8, spec, table, nlist, metadata)
}

/// What an item's exact f32 score ranges over: `max_j |x_j|`, or for an int8 row `|bias| + 255·|scale|`.
fn exact_range(spec: &TableSpec, table: &[u8], id: usize, row: &[f32]) -> f64 {
    match spec.storage {
        Storage::Int8 => {
            let params = &table[id * spec.storage.row_bytes(spec.dim) + spec.dim..];
            let ts = f32::from_le_bytes([params[0], params[1], params[2], params[3]]);
            let tb = f32::from_le_bytes([params[4], params[5], params[6], params[7]]);
            f64::from(tb.abs()) + 255.0 * f64::from(ts.abs())
        }
        Storage::Fp32 | Storage::Fp16 => row.iter().fold(0.0f64, |m, v| m.max(f64::from(v.abs()))),
    }
}

/// The PQ4 tensors of `lists` (item ids per list) of items `x` with coarse `centroids`: a simple codebook (any
/// codebook must give exact answers), codes the nearest centroids, `err` the documented bound. Returns (ids, codes, err, codebooks, offsets, sizes).
#[expect(clippy::type_complexity, reason = "a test builder's six tensors")]
fn pq4_tensors(
    spec: &TableSpec,
    table: &[u8],
    x: &[f32],
    centroids: &[f32],
    lists: &[Vec<u32>],
    m: usize,
) -> (Vec<u32>, Vec<u8>, Vec<f32>, Vec<f32>, Vec<i64>, Vec<i64>) {
    let (n, dim) = (spec.rows as usize, spec.dim);
    let sub = dim / m;
    let mut list_of = vec![0usize; n];
    for (l, list) in lists.iter().enumerate() {
        for &id in list {
            list_of[id as usize] = l;
        }
    }
    let residual = |id: usize| -> Vec<f64> {
        let c = &centroids[list_of[id] * dim..(list_of[id] + 1) * dim];
        (0..dim)
            .map(|j| f64::from(x[id * dim + j]) - f64::from(c[j]))
            .collect()
    };
    // Each sub-quantizer's centroids: the first 16 distinct residual sub-vectors in item order, then those of
    // evenly spaced items (a catalogue of at most 16 sub-vector values per sub-quantizer is coded without error).
    let mut books = vec![0.0f32; m * pq4::CENTROIDS * sub];
    for s in 0..m {
        let mut found: Vec<Vec<f32>> = Vec::new();
        for id in 0..n {
            let v: Vec<f32> = residual(id)[s * sub..(s + 1) * sub]
                .iter()
                .map(|&r| r as f32)
                .collect();
            if found.len() < pq4::CENTROIDS && !found.contains(&v) {
                found.push(v);
            }
        }
        for c in found.len()..pq4::CENTROIDS {
            let r = residual(c * n / pq4::CENTROIDS % n);
            found.push(
                r[s * sub..(s + 1) * sub]
                    .iter()
                    .map(|&r| r as f32)
                    .collect(),
            );
        }
        for (c, v) in found.iter().enumerate() {
            books[(s * pq4::CENTROIDS + c) * sub..][..sub].copy_from_slice(v);
        }
    }
    let (mut ids, mut codes, mut err) = (Vec::new(), Vec::new(), Vec::new());
    let (mut offsets, mut sizes) = (vec![0i64], Vec::new());
    for list in lists {
        let blocks = list.len().div_ceil(pq4::BLOCK);
        sizes.push(list.len() as i64);
        offsets.push(offsets.last().copied().unwrap_or(0) + blocks as i64);
        for chunk in 0..blocks {
            let mut block: [Vec<u8>; pq4::BLOCK] = std::array::from_fn(|_| vec![0u8; m]);
            for (i, item_codes) in block.iter_mut().enumerate() {
                let Some(&id) = list.get(chunk * pq4::BLOCK + i) else {
                    ids.push(u32::MAX);
                    err.push(0.0);
                    continue;
                };
                let r = residual(id as usize);
                let mut left = 0.0f64;
                for s in 0..m {
                    let dist = |c: usize| -> f64 {
                        (0..sub)
                            .map(|j| {
                                let d = r[s * sub + j]
                                    - f64::from(books[(s * pq4::CENTROIDS + c) * sub + j]);
                                d * d
                            })
                            .sum()
                    };
                    let best = (0..pq4::CENTROIDS)
                        .min_by(|&a, &b| dist(a).total_cmp(&dist(b)))
                        .unwrap_or(0);
                    item_codes[s] = best as u8;
                    left += dist(best);
                }
                let row = &x[id as usize * dim..(id as usize + 1) * dim];
                let range = exact_range(spec, table, id as usize, row);
                let e = (left.sqrt() + 2.0 * gamma(dim + 2) * (dim as f64).sqrt() * range)
                    * (1.0 + 1.0 / 1024.0);
                ids.push(id);
                err.push(round_up(e));
            }
            pq4::pack_block(&block, m, &mut codes);
        }
    }
    (ids, codes, err, books, offsets, sizes)
}

/// Builds an index file for `table` (layout of `spec.storage`) coded as `coding`: centroids are `nlist` evenly
/// spaced items, each item goes to the list whose centroid scores it highest, codes and bounds as documented.
/// `metadata` overrides metadata fields.
fn build_as(
    coding: Coding,
    spec: &TableSpec,
    table: &[u8],
    nlist: usize,
    metadata: &[(&str, &str)],
) -> Vec<u8> {
    let (n, dim) = (spec.rows as usize, spec.dim);
    let row_bytes = spec.storage.row_bytes(dim);
    let mut x = vec![0.0f32; n * dim];
    for (i, row) in x.chunks_exact_mut(dim).enumerate() {
        crate::embedding::cpu::decode_row(
            spec.storage,
            &table[i * row_bytes..(i + 1) * row_bytes],
            row,
        );
    }
    let centroids: Vec<f32> = (0..nlist)
        .flat_map(|c| x[(c * n / nlist) * dim..(c * n / nlist + 1) * dim].to_vec())
        .collect();
    let mut lists = vec![Vec::new(); nlist];
    for (i, row) in x.chunks_exact(dim).enumerate() {
        let score = |c: usize| -> f64 {
            row.iter()
                .zip(&centroids[c * dim..(c + 1) * dim])
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum()
        };
        let best = (0..nlist)
            .max_by(|&a, &b| score(a).total_cmp(&score(b)).then(b.cmp(&a)))
            .unwrap_or(0);
        lists[best].push(i as u32);
    }
    let le = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let mut meta: HashMap<String, String> = [
        ("format", FORMAT.to_owned()),
        ("format_version", FORMAT_VERSION.to_owned()),
        ("codes", "int8".to_owned()),
        ("items", n.to_string()),
        ("dim", dim.to_string()),
        ("nlist", nlist.to_string()),
        ("item_table", spec.name.clone()),
        ("item_storage", spec.storage.as_str().to_owned()),
        ("item_checksum", table_checksum(table)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut tensors: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> =
        vec![("centroids", Dtype::F32, vec![nlist, dim], le(&centroids))];
    let (ids, offsets, sizes, group) = if let Coding::Pq4(m) = coding {
        let (ids, codes, err, books, offsets, sizes) =
            pq4_tensors(spec, table, &x, &centroids, &lists, m);
        let blocks = ids.len() / pq4::BLOCK;
        meta.insert("codes".to_owned(), "pq4".to_owned());
        meta.insert("pq_m".to_owned(), m.to_string());
        tensors.extend([
            ("codes", Dtype::U8, vec![blocks, m / 2, pq4::BLOCK], codes),
            ("err", Dtype::F32, vec![blocks, pq4::BLOCK], le(&err)),
            (
                "codebooks",
                Dtype::F32,
                vec![m, pq4::CENTROIDS, dim / m],
                le(&books),
            ),
        ]);
        (ids, offsets, sizes, pq4::BLOCK)
    } else {
        let (mut offsets, mut sizes) = (vec![0i64], Vec::new());
        let (mut ids, mut codes, mut scale, mut bias, mut err) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for list in &lists {
            let panels = list.len().div_ceil(LANES);
            sizes.push(list.len() as i64);
            offsets.push(offsets.last().copied().unwrap_or(0) + panels as i64);
            let mut panel_codes = vec![0u8; panels * dim * LANES];
            for slot in 0..panels * LANES {
                let Some(&id) = list.get(slot) else {
                    ids.push(u32::MAX);
                    scale.push(0.0f32);
                    bias.push(0.0f32);
                    err.push(0.0f32);
                    continue;
                };
                let row = &x[id as usize * dim..(id as usize + 1) * dim];
                let min = row.iter().copied().fold(f32::INFINITY, f32::min);
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                // The table quantizer's rule: a constant row has scale 1.0 (models/recserve_models/quantize.py).
                let s = if max > min { (max - min) / 255.0 } else { 1.0 };
                let mut diff = 0.0f64;
                let (p, l) = (slot / LANES, slot % LANES);
                for (j, &v) in row.iter().enumerate() {
                    let c = ((v - min) / s).round().clamp(0.0, 255.0);
                    panel_codes[(p * dim + j) * LANES + l] = c as u8;
                    let decoded = f64::from(c) * f64::from(s) + f64::from(min);
                    diff = diff.max((f64::from(v) - decoded).abs());
                }
                let exact_range = exact_range(spec, table, id as usize, row);
                let approx_range = f64::from(min.abs()) + 255.0 * f64::from(s.abs());
                let e = (diff + 2.0 * gamma(dim + 2) * (exact_range + approx_range))
                    * (1.0 + 1.0 / 1024.0);
                ids.push(id);
                scale.push(s);
                bias.push(min);
                err.push(e as f32);
            }
            codes.extend(panel_codes);
        }
        let panels = *offsets.last().unwrap_or(&0) as usize;
        tensors.extend([
            ("codes", Dtype::U8, vec![panels, dim, LANES], codes),
            ("scale", Dtype::F32, vec![panels, LANES], le(&scale)),
            ("bias", Dtype::F32, vec![panels, LANES], le(&bias)),
            ("err", Dtype::F32, vec![panels, LANES], le(&err)),
        ]);
        (ids, offsets, sizes, LANES)
    };
    for (k, v) in metadata {
        meta.insert((*k).to_owned(), (*v).to_owned());
    }
    let lanes = ids.len();
    debug_assert_eq!(lanes % group, 0);
    tensors.extend([
        (
            "list_offsets",
            Dtype::I64,
            vec![nlist + 1],
            offsets.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        (
            "list_sizes",
            Dtype::I64,
            vec![nlist],
            sizes.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        (
            "ids",
            Dtype::U32,
            vec![lanes],
            ids.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
    ]);
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                *name,
                TensorView::new(*dtype, shape.clone(), data).expect("a consistent tensor"),
            )
        })
        .collect();
    safetensors::serialize(views, Some(meta)).expect("serializes")
}

/// A catalogue of `clusters` groups of items around random centres (so that lists mean something), encoded as
/// `storage`.
fn clustered(
    rng: &mut Rng,
    items: usize,
    dim: usize,
    clusters: usize,
    storage: Storage,
) -> (TableSpec, Vec<u8>) {
    let centres: Vec<f32> = (0..clusters * dim).map(|_| 2.0 * rng.unit()).collect();
    let values: Vec<f32> = (0..items)
        .flat_map(|_| {
            let c = rng.below(clusters);
            (0..dim)
                .map(|j| centres[c * dim + j] + 0.4 * rng.unit())
                .collect::<Vec<_>>()
        })
        .collect();
    (spec(items, dim, storage), encode(&values, dim, storage))
}

fn open(spec: &TableSpec, table: &[u8], nlist: usize) -> IvfIndex {
    open_as(Coding::Int8, spec, table, nlist)
}

fn open_as(coding: Coding, spec: &TableSpec, table: &[u8], nlist: usize) -> IvfIndex {
    let index = IvfIndex::open(
        bytes(&build_as(coding, spec, table, nlist, &[])),
        spec,
        bytes(table),
    )
    .expect("a valid index");
    let name = if coding == Coding::Int8 {
        "int8"
    } else {
        "pq4"
    };
    assert_eq!(index.codes_name(), name);
    index
}

/// The codings a test of `dim` runs with: int8, and PQ4 with 2 values per sub-quantizer and with one
/// sub-quantizer pair (where `dim` allows).
fn codings(dim: usize) -> Vec<Coding> {
    let mut out = vec![Coding::Int8];
    if dim.is_multiple_of(4) && dim / 2 <= pq4::MAX_M {
        out.push(Coding::Pq4(dim / 2));
    }
    if dim.is_multiple_of(2) && dim > 4 {
        out.push(Coding::Pq4(2));
    }
    out
}

fn query(rng: &mut Rng, dim: usize) -> Vec<f32> {
    (0..dim).map(|_| rng.unit()).collect()
}

fn same(got: &[Scored], want: &[Scored]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(a, b)| a.id == b.id && a.score.to_bits() == b.score.to_bits())
}

const ALL: usize = usize::MAX;

#[test]
fn with_every_list_probed_the_answer_is_the_exact_answer() {
    let mut rng = Rng(0x1F_0001);
    let mut checked = 0;
    for storage in [Storage::Fp32, Storage::Fp16, Storage::Int8] {
        for (items, dim, nlist) in [
            (1, 1, 1),
            (1, 4, 1),
            (40, 3, 4),
            (40, 4, 4),
            (300, 16, 7),
            (1000, 24, 16),
            (2049, 64, 32),
        ] {
            let (spec, table) = clustered(&mut rng, items, dim, 5, storage);
            for coding in codings(dim) {
                let index = open_as(coding, &spec, &table, nlist);
                let queries: Vec<(Vec<f32>, usize, Vec<u32>)> = (0..6)
                    .map(|i| {
                        let k = [
                            1,
                            10,
                            items,
                            (items / 3).max(1),
                            100.min(items),
                            1 + rng.below(items),
                        ][i];
                        let exclude: Vec<u32> = {
                            let mut e: Vec<u32> = (0..i * items / 12)
                                .map(|_| rng.below(items) as u32)
                                .collect();
                            e.sort_unstable();
                            e.dedup();
                            e
                        };
                        (query(&mut rng, dim), k, exclude)
                    })
                    .collect();
                let search = search_queries(&queries);
                for isa in Isa::available() {
                    let probe = Probe {
                        nprobe: nlist,
                        max_candidates: ALL,
                    };
                    let (got, stats) =
                        index.search_with(isa, &search, probe, &mut IvfScratch::default());
                    assert_eq!(stats.capped, 0);
                    assert_eq!(stats.codes, (queries.len() * items) as u64);
                    for (i, ((vector, k, exclude), got)) in queries.iter().zip(&got).enumerate() {
                        let want = reference::top_k(
                            &reference::scores(&spec, &table, vector),
                            *k,
                            exclude,
                        );
                        assert!(
                            same(got, &want),
                            "{storage:?} {coding:?} {items}×{dim} nlist {nlist} {} query {i} k {k}:\n got  {:?}\n want {:?}",
                            isa.as_str(),
                            &got[..got.len().min(6)],
                            &want[..want.len().min(6)]
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked >= 90 * 2, "{checked}");
}

/// The naive top `k` of the items of `lists`, as the index promises.
fn top_of_lists(
    index: &IvfIndex,
    lists: &[u32],
    scores: &[f32],
    k: usize,
    exclude: &[u32],
) -> Vec<Scored> {
    let mut inside = vec![false; scores.len()];
    for &l in lists {
        for id in index.list_items(l as usize) {
            inside[id as usize] = true;
        }
    }
    let mut outside: Vec<u32> = (0..scores.len() as u32)
        .filter(|&id| !inside[id as usize])
        .collect();
    outside.extend_from_slice(exclude);
    outside.sort_unstable();
    outside.dedup();
    reference::top_k(scores, k, &outside)
}

#[test]
fn with_fewer_lists_the_answer_is_the_exact_top_k_of_the_probed_lists_and_recall_never_falls() {
    let mut rng = Rng(0x1F_0002);
    for (storage, coding) in [
        (Storage::Fp32, Coding::Int8),
        (Storage::Int8, Coding::Int8),
        (Storage::Fp32, Coding::Pq4(16)),
        (Storage::Fp16, Coding::Pq4(8)),
        (Storage::Int8, Coding::Pq4(16)),
    ] {
        let (items, dim, nlist) = (3000, 32, 24);
        let (spec, table) = clustered(&mut rng, items, dim, 12, storage);
        let index = open_as(coding, &spec, &table, nlist);
        let mut scratch = IvfScratch::default();
        let (mut recall_one, mut recall_all) = (0.0f64, 0.0f64);
        for qi in 0..20 {
            let vector = query(&mut rng, dim);
            let k = [10, 100, 1][qi % 3];
            let exclude: Vec<u32> = if qi % 2 == 0 {
                vec![]
            } else {
                (0..300).map(|i| i * 7).collect()
            };
            let scores = reference::scores(&spec, &table, &vector);
            let exact = reference::top_k(&scores, k, &exclude);
            let mut last_recall = 0.0;
            for nprobe in 1..=nlist {
                let q = SearchQuery {
                    vector: &vector,
                    k,
                    exclude: &exclude,
                };
                let probe = Probe {
                    nprobe,
                    max_candidates: ALL,
                };
                let (mut got, stats) = index.search(&[q], probe, &mut scratch);
                let got = got.pop().expect("one answer");
                let lists = index.probed_lists(&vector, k, exclude.len(), nprobe, &mut scratch);
                assert_eq!(stats.lists, lists.len() as u64);
                let want = top_of_lists(&index, &lists, &scores, k, &exclude);
                assert!(
                    same(&got, &want),
                    "{storage:?} {coding:?} query {qi} nprobe {nprobe}: {got:?}\n{want:?}"
                );
                assert_eq!(got.len(), exact.len(), "as many items as the exact answer");
                let hits = got
                    .iter()
                    .filter(|g| exact.iter().any(|e| e.id == g.id))
                    .count();
                let recall = hits as f64 / exact.len() as f64;
                assert!(
                    recall >= last_recall,
                    "query {qi}: recall fell at nprobe {nprobe}"
                );
                last_recall = recall;
                if nprobe == 1 {
                    recall_one += recall;
                }
                if nprobe == nlist {
                    recall_all += recall;
                }
            }
            assert_eq!(last_recall, 1.0);
        }
        assert!(
            recall_one < recall_all,
            "one list does not find everything: the test means something"
        );
    }
}

#[test]
fn ties_and_the_zero_query_are_broken_by_lower_id() {
    // Rows repeat every 5 items, so every score appears items / 5 times; a zero query ties every item at 0.
    let (items, dim) = (203, 10);
    let mut rng = Rng(0x1F_0003);
    let base: Vec<f32> = (0..5 * dim).map(|_| rng.unit()).collect();
    let values: Vec<f32> = (0..items)
        .flat_map(|i| base[(i % 5) * dim..(i % 5 + 1) * dim].to_vec())
        .collect();
    for storage in [Storage::Fp32, Storage::Int8] {
        let (spec, table) = (spec(items, dim, storage), encode(&values, dim, storage));
        for coding in [Coding::Int8, Coding::Pq4(2)] {
            let index = open_as(coding, &spec, &table, 6);
            let zero = vec![0.0f32; dim];
            let q = query(&mut rng, dim);
            for (vector, k, exclude) in [
                (&zero, 10, vec![]),
                (&zero, items, vec![0, 1, 2]),
                (&q, 7, vec![]),
                (&q, 41, vec![3, 8]),
            ] {
                let search = SearchQuery {
                    vector,
                    k,
                    exclude: &exclude,
                };
                let probe = Probe {
                    nprobe: 6,
                    max_candidates: ALL,
                };
                let (got, _) = index.search(&[search], probe, &mut IvfScratch::default());
                let want = reference::top_k(&reference::scores(&spec, &table, vector), k, &exclude);
                assert!(
                    same(&got[0], &want),
                    "{storage:?} {coding:?} k {k}: {:?}\n{want:?}",
                    got[0]
                );
            }
        }
    }
}

#[test]
fn batches_answer_as_single_queries_and_as_the_exact_path_in_every_shard_layout() {
    let mut rng = Rng(0x1F_0004);
    let (items, dim) = (1500, 16);
    let (spec, table) = clustered(&mut rng, items, dim, 6, Storage::Int8);
    for coding in codings(dim) {
        let index = open_as(coding, &spec, &table, 12);
        let queries: Vec<(Vec<f32>, usize, Vec<u32>)> = (0..9)
            .map(|i| {
                (
                    query(&mut rng, dim),
                    1 + 37 * i,
                    vec![i as u32, 100 + i as u32],
                )
            })
            .collect();
        let search = search_queries(&queries);
        let all = Probe {
            nprobe: 12,
            max_candidates: ALL,
        };
        let few = Probe { nprobe: 3, ..all };
        let mut scratch = IvfScratch::default();
        let (batch, _) = index.search(&search, few, &mut scratch);
        for (q, got) in search.iter().zip(&batch) {
            let (alone, _) = index.search(std::slice::from_ref(q), few, &mut IvfScratch::default());
            assert!(same(got, &alone[0]));
        }
        let (exact_index, _) = index.search(&search, all, &mut scratch);
        for shards in [1, 2, 5] {
            let catalogue = Catalogue::new(&spec, &table, shards).expect("valid table");
            let (exact, _) = catalogue.search(&search, &mut SearchScratch::default());
            for (a, b) in exact_index.iter().zip(&exact) {
                assert!(same(a, b), "{coding:?} {shards} shards");
            }
        }
    }
}

#[test]
fn a_small_candidate_cap_is_counted_and_still_answers_k_items_best_first() {
    let mut rng = Rng(0x1F_0005);
    let (spec, table) = clustered(&mut rng, 2000, 8, 3, Storage::Fp32);
    let index = open(&spec, &table, 4);
    let vector = vec![0.0f32; 8];
    let q = SearchQuery {
        vector: &vector,
        k: 20,
        exclude: &[],
    };
    let probe = Probe {
        nprobe: 4,
        max_candidates: 20,
    };
    let (got, stats) = index.search(&[q], probe, &mut IvfScratch::default());
    // The zero query ties all 2000 items, all of them candidates: the cap of 20 cuts in.
    assert_eq!(stats.capped, 1);
    assert_eq!(got[0].len(), 20);
    assert!(
        got[0]
            .windows(2)
            .all(|w| answer_order(&w[0], &w[1]).is_lt())
    );
    assert_eq!(stats.reranked, 20);
}

#[test]
fn with_few_items_per_list_more_lists_are_probed_until_k_items_can_be_answered() {
    let mut rng = Rng(0x1F_0006);
    let (spec, table) = clustered(&mut rng, 400, 8, 20, Storage::Fp32);
    let index = open(&spec, &table, 40);
    let vector = query(&mut rng, 8);
    let exclude: Vec<u32> = (0..50).collect();
    let q = SearchQuery {
        vector: &vector,
        k: 300,
        exclude: &exclude,
    };
    let probe = Probe {
        nprobe: 1,
        max_candidates: ALL,
    };
    let (got, stats) = index.search(&[q], probe, &mut IvfScratch::default());
    assert_eq!(got[0].len(), 300);
    assert!(stats.lists > 1);
    assert!(got[0].iter().all(|s| s.id >= 50));
}

#[test]
fn the_lists_probed_past_nprobe_are_the_next_in_the_order_of_every_centroid() {
    // 40 lists of about 10 items: a query asking for more than its first lists hold is ranked again for more of
    // them, maybe several times; its lists must be those of ranking all 40 at once.
    let mut rng = Rng(0x1F_0011);
    let (spec, table) = clustered(&mut rng, 400, 8, 20, Storage::Fp32);
    let index = open(&spec, &table, 40);
    let mut scratch = IvfScratch::default();
    let mut centroid_scratch = SearchScratch::default();
    let mut grown = 0;
    for _ in 0..20 {
        let vector = query(&mut rng, 8);
        let all = SearchQuery {
            vector: &vector,
            k: index.nlist(),
            exclude: &[],
        };
        let (order, _) = index
            .centroids
            .search_with(index.isa, &[all], &mut centroid_scratch);
        for k in [1, 5, 12, 30, 45, 90, 200, 399] {
            for excluded in [0, 7] {
                for nprobe in [1, 2, 3, 5, 40] {
                    let need = (k + excluded).min(400);
                    let mut want = Vec::new();
                    let mut held = 0;
                    for c in &order[0] {
                        if want.len() >= nprobe && held >= need {
                            break;
                        }
                        want.push(c.id);
                        held += index.sizes[c.id as usize];
                    }
                    let got = index.probed_lists(&vector, k, excluded, nprobe, &mut scratch);
                    assert_eq!(got, want, "k {k}, {excluded} excluded, nprobe {nprobe}");
                    grown += usize::from(want.len() > nprobe * super::search::SHORT_GROWTH);
                }
            }
        }
    }
    assert!(grown > 0, "no query needed its lists ranked twice over");
}

fn refusal(spec: &TableSpec, table: &[u8], file: Vec<u8>) -> String {
    IvfIndex::open(bytes(&file), spec, bytes(table)).expect_err("refused")
}

#[test]
fn a_stale_or_malformed_index_is_refused_naming_the_mismatch() {
    let mut rng = Rng(0x1F_0007);
    let (spec, table) = clustered(&mut rng, 100, 8, 3, Storage::Fp32);
    let good = build(&spec, &table, 4, &[]);
    assert!(IvfIndex::open(bytes(&good), &spec, bytes(&table)).is_ok());

    // The table changed after the build (one value).
    let mut changed = table.clone();
    changed[37] ^= 1;
    let err = IvfIndex::open(bytes(&good), &spec, bytes(&changed)).expect_err("stale");
    assert!(
        err.contains("checksum") && err.contains("changed since the index was built"),
        "{err}"
    );

    // Built for another table.
    let (other_spec, other) = clustered(&mut rng, 120, 8, 3, Storage::Fp32);
    let err = refusal(&spec, &table, build(&other_spec, &other, 4, &[]));
    assert!(
        err.contains("built for 120 items") && err.contains("100 rows"),
        "{err}"
    );
    let (wide_spec, wide) = clustered(&mut rng, 100, 16, 3, Storage::Fp32);
    let err = refusal(&spec, &table, build(&wide_spec, &wide, 4, &[]));
    assert!(err.contains("built for dim 16"), "{err}");
    let int8 = spec.clone();
    let err = IvfIndex::open(
        bytes(&good),
        &TableSpec {
            storage: Storage::Int8,
            ..int8
        },
        bytes(&encode(&vec![0.5; 100 * 8], 8, Storage::Int8)),
    )
    .expect_err("storage");
    assert!(err.contains("stored as \"fp32\""), "{err}");

    for (key, value, says) in [
        ("format", "other", "format \"other\""),
        ("format_version", "9", "format_version \"9\""),
        ("codes", "pq8", "codes \"pq8\""),
        ("nlist", "five", "nlist = \"five\""),
    ] {
        let err = refusal(&spec, &table, build(&spec, &table, 4, &[(key, value)]));
        assert!(err.contains(says), "{key}: {err}");
    }
    let err = refusal(&spec, &table, build(&spec, &table, 4, &[("nlist", "5")]));
    assert!(err.contains("list_offsets"), "{err}");
    let err = refusal(&spec, &table, b"not a safetensors file".to_vec());
    assert!(err.contains("not a valid safetensors file"), "{err}");

    // A duplicated id: the first two lanes' ids made equal.
    let file = build(&spec, &table, 1, &[]);
    let at = find_tensor(&file, "ids");
    let mut dup = file.clone();
    let first: [u8; 4] = dup[at..at + 4].try_into().expect("4 bytes");
    dup[at + 4..at + 8].copy_from_slice(&first);
    let err = refusal(&spec, &table, dup);
    assert!(err.contains("more than one list lane"), "{err}");
}

#[test]
fn an_index_holding_a_non_finite_centroid_scale_bias_or_bound_is_refused_naming_the_tensor() {
    let mut rng = Rng(0x1F_0008);
    let (spec, table) = clustered(&mut rng, 100, 8, 3, Storage::Fp32);
    let good = build(&spec, &table, 4, &[]);
    for (tensor, value, says) in [
        (
            "centroids",
            f32::NAN,
            "tensor \"centroids\" row 0 holds a non-finite value (NaN)",
        ),
        ("scale", f32::INFINITY, "tensor \"scale\" holds inf"),
        ("bias", f32::NEG_INFINITY, "tensor \"bias\" holds -inf"),
        ("err", f32::NAN, "tensor \"err\" holds NaN"),
        ("err", -1.0, "tensor \"err\" holds -1"),
    ] {
        poke_refused(&spec, &table, &good, tensor, value, says);
    }
}

/// `good` with the first value of `tensor` set to `value` is refused, saying `says`.
fn poke_refused(spec: &TableSpec, table: &[u8], good: &[u8], tensor: &str, value: f32, says: &str) {
    let mut file = good.to_vec();
    let at = find_tensor(&file, tensor);
    file[at..at + 4].copy_from_slice(&value.to_le_bytes());
    let err = refusal(spec, table, file);
    assert!(err.contains(says), "{tensor} = {value}: {err}");
}

/// Where a tensor's data starts in an index file.
fn find_tensor(file: &[u8], name: &str) -> usize {
    let parsed = safetensors::SafeTensors::deserialize(file).expect("valid");
    let data = parsed.tensor(name).expect(name).data();
    data.as_ptr() as usize - file.as_ptr() as usize
}

#[test]
fn exact_score_is_the_reference_score_bit_for_bit() {
    let mut rng = Rng(0x1F_0008);
    for storage in [Storage::Fp32, Storage::Fp16, Storage::Int8] {
        let (spec, table) = clustered(&mut rng, 50, 13, 2, storage);
        let q = query(&mut rng, 13);
        let qsum = q.iter().fold(0.0f32, |s, &x| s + x);
        let want = reference::scores(&spec, &table, &q);
        let rb = storage.row_bytes(13);
        for (i, w) in want.iter().enumerate() {
            let got = exact_score(storage, &table[i * rb..(i + 1) * rb], &q, qsum);
            assert_eq!(got.to_bits(), w.to_bits(), "{storage:?} row {i}");
        }
    }
}

/// The search of one query as the index did it before batches were searched together, written plainly: its own
/// centroid search (again over every centroid if its lists hold too few items), its lists one after another with
/// scalar code dot products (summed in `j` order from 0.0, a multiply then an add, as the kernels sum them), every
/// panel's upper bounds kept, then the same selection, cap and re-rank. Returns the answer and its stats.
fn one_at_a_time(index: &IvfIndex, q: &SearchQuery<'_>, probe: Probe) -> (Vec<Scored>, IvfStats) {
    let (dim, nlist) = (index.dim, index.nlist());
    let need = (q.k + q.exclude.len()).min(index.items);
    let mut want = probe.nprobe.clamp(1, nlist);
    let mut centroid_scratch = SearchScratch::default();
    let lists = loop {
        let c = SearchQuery {
            vector: q.vector,
            k: want,
            exclude: &[],
        };
        let (mut found, _) = index.centroids.search(&[c], &mut centroid_scratch);
        let (mut lists, mut held) = (Vec::new(), 0);
        for s in &found.pop().expect("one answer") {
            if lists.len() >= probe.nprobe.max(1) && held >= need {
                break;
            }
            lists.push(s.id);
            held += index.sizes[s.id as usize];
        }
        if held >= need || want == nlist {
            lists.sort_unstable();
            break lists;
        }
        want = nlist;
    };
    let (mut qsum, mut qabs) = (0.0f32, 0.0f32);
    for &x in q.vector {
        qsum += x;
        qabs += x.abs();
    }
    let qabs = qabs * (1.0 + NORM_SLACK);
    let (ids, codes) = (index.ids(), index.codes());
    let Codes::Int8 { scale, bias } = &index.coding else {
        panic!("the one-at-a-time reference reads int8 codes");
    };
    let (scale, bias, err) = (
        index.floats(scale),
        index.floats(bias),
        index.floats(&index.ranges.err),
    );
    let total: usize = lists.iter().map(|&l| index.sizes[l as usize]).sum();
    let mut lower = TopK::default();
    lower.reset(q.k, total);
    let mut upper: Vec<(usize, [f32; LANES])> = Vec::new();
    for &l in &lists {
        for p in index.offsets[l as usize]..index.offsets[l as usize + 1] {
            let (mut lo, mut up) = ([0.0f32; LANES], [0.0f32; LANES]);
            let mut best = f32::NEG_INFINITY;
            for lane in 0..LANES {
                let mut dot = 0.0f32;
                for j in 0..dim {
                    dot += q.vector[j] * f32::from(codes[p * dim + j].0[lane]);
                }
                let approx = dot * scale[p][lane] + bias[p][lane] * qsum;
                let w = err[p][lane] * qabs;
                let padding = ids[p * LANES + lane] == PADDING;
                lo[lane] = if padding {
                    f32::NEG_INFINITY
                } else {
                    approx - w
                };
                up[lane] = if padding {
                    f32::NEG_INFINITY
                } else {
                    approx + w
                };
                best = best.max(lo[lane]);
            }
            upper.push((p, up));
            if !lower.wants(best) {
                continue;
            }
            for (lane, &low) in lo.iter().enumerate() {
                let at = p * LANES + lane;
                if low != f32::NEG_INFINITY
                    && lower.wants(low)
                    && q.exclude.binary_search(&ids[at]).is_err()
                {
                    lower.push(at as u32, low);
                }
            }
        }
    }
    let lows = lower.finish();
    let floor = if lows.len() >= q.k {
        lows[q.k - 1].score
    } else {
        f32::NEG_INFINITY
    };
    let mut candidates = Vec::new();
    for (p, up) in &upper {
        for (lane, &u) in up.iter().enumerate() {
            let at = p * LANES + lane;
            if u >= floor && u != f32::NEG_INFINITY && q.exclude.binary_search(&ids[at]).is_err() {
                candidates.push(Scored {
                    id: at as u32,
                    score: u,
                });
            }
        }
    }
    let mut stats = IvfStats {
        lists: lists.len() as u64,
        codes: total as u64,
        ..IvfStats::default()
    };
    let most = probe.max_candidates.max(q.k);
    if candidates.len() > most {
        stats.capped = 1;
        candidates.select_nth_unstable_by(most - 1, answer_order);
        candidates.truncate(most);
    }
    let table = (*index.table).as_ref();
    let row_bytes = index.storage.row_bytes(dim);
    let mut answer: Vec<Scored> = candidates
        .iter()
        .map(|c| {
            let id = ids[c.id as usize];
            let row = &table[id as usize * row_bytes..(id as usize + 1) * row_bytes];
            Scored {
                id,
                score: exact_score(index.storage, row, q.vector, qsum),
            }
        })
        .collect();
    stats.reranked = answer.len() as u64;
    answer.sort_unstable_by(answer_order);
    answer.truncate(q.k);
    (answer, stats)
}

/// Stats without the time.
fn counts(s: &IvfStats) -> [u64; 4] {
    [s.lists, s.codes, s.reranked, s.capped]
}

#[test]
fn a_batch_answers_each_query_as_it_is_answered_alone_and_as_brute_force_over_its_lists() {
    let mut rng = Rng(0x1F_0009);
    let (mut checked, mut capped, mut widened) = (0, 0, 0);
    for storage in [Storage::Fp32, Storage::Fp16, Storage::Int8] {
        // Many small lists (some smaller than k), a few large ones, and a catalogue of one list.
        for (items, dim, clusters, nlist) in [(2500, 24, 10, 40), (1200, 16, 4, 7), (300, 8, 3, 1)]
        {
            let (spec, table) = clustered(&mut rng, items, dim, clusters, storage);
            let index = open(&spec, &table, nlist);
            let queries: Vec<(Vec<f32>, usize, Vec<u32>)> = (0..33)
                .map(|i| {
                    let mut vector = query(&mut rng, dim);
                    if i == 5 || i == 6 {
                        // The same vector twice in one batch.
                        vector = (0..dim).map(|j| j as f32 * 0.1 - 0.5).collect();
                    }
                    let k = [1, 10, 100, items / 2, 1 + rng.below(items)][i % 5];
                    let mut exclude: Vec<u32> = (0..[0, 3, 40, 200][i % 4])
                        .map(|_| rng.below(items + 10) as u32)
                        .collect();
                    exclude.sort_unstable();
                    exclude.dedup();
                    (vector, k, exclude)
                })
                .collect();
            let search = search_queries(&queries);
            for (nprobe, max_candidates) in
                [(1, ALL), (3, ALL), (nlist, ALL), (2, 150), (nlist + 5, 40)]
            {
                let probe = Probe {
                    nprobe,
                    max_candidates,
                };
                let alone: Vec<(Vec<Scored>, IvfStats)> = search
                    .iter()
                    .map(|q| one_at_a_time(&index, q, probe))
                    .collect();
                capped += alone.iter().filter(|(_, s)| s.capped > 0).count();
                widened += alone
                    .iter()
                    .filter(|(_, s)| s.lists as usize > nprobe.min(nlist))
                    .count();
                for isa in Isa::available() {
                    let mut scratch = IvfScratch::default();
                    // Batches of 1, 2, 5, 32 and 33, one scratch for all (reused across sizes).
                    for size in [1, 2, 5, 32, 33] {
                        for (chunk, want) in search.chunks(size).zip(alone.chunks(size)) {
                            let (got, stats) = index.search_with(isa, chunk, probe, &mut scratch);
                            let mut summed = IvfStats::default();
                            for (i, (got, (want, _))) in got.iter().zip(want).enumerate() {
                                // The counts of the query searched alone (the reference re-ranks every
                                // candidate; the search stops early, with the same answer).
                                let (_, want_stats) = index.search_with(
                                    isa,
                                    std::slice::from_ref(&chunk[i]),
                                    probe,
                                    &mut IvfScratch::default(),
                                );
                                assert!(
                                    same(got, want),
                                    "{storage:?} {items}×{dim} nlist {nlist} nprobe {nprobe} cap {max_candidates} \
                                     {} batch {size} query {i}:\n got  {:?}\n want {:?}",
                                    isa.as_str(),
                                    &got[..got.len().min(6)],
                                    &want[..want.len().min(6)]
                                );
                                summed.lists += want_stats.lists;
                                summed.codes += want_stats.codes;
                                summed.reranked += want_stats.reranked;
                                summed.capped += want_stats.capped;
                                checked += 1;
                            }
                            assert_eq!(counts(&stats), counts(&summed), "batch {size}");
                        }
                    }
                }
                // And each answer is the brute-force top k of its probed lists.
                for ((vector, k, exclude), (want, _)) in queries.iter().zip(&alone) {
                    let lists = index.probed_lists(
                        vector,
                        *k,
                        exclude.len(),
                        nprobe,
                        &mut IvfScratch::default(),
                    );
                    let scores = reference::scores(&spec, &table, vector);
                    if max_candidates == ALL {
                        let brute = top_of_lists(&index, &lists, &scores, *k, exclude);
                        assert!(same(want, &brute), "{storage:?} nprobe {nprobe} k {k}");
                    }
                }
            }
        }
    }
    // The cases the test is about did occur: capped candidates, and lists added for a large k + |exclude|.
    assert!(
        checked > 5000 && capped > 10 && widened > 10,
        "{checked} {capped} {widened}"
    );
}

#[test]
fn a_malformed_pq4_index_is_refused_naming_the_field() {
    let mut rng = Rng(0x1F_0009);
    let (spec, table) = clustered(&mut rng, 100, 8, 3, Storage::Fp32);
    let good = build_as(Coding::Pq4(4), &spec, &table, 4, &[]);
    assert!(IvfIndex::open(bytes(&good), &spec, bytes(&table)).is_ok());
    for (value, says) in [
        ("3", "pq_m = 3"),
        ("6", "pq_m = 6"),
        ("0", "pq_m = 0"),
        ("512", "pq_m = 512"),
        ("four", "pq_m = \"four\""),
    ] {
        let file = build_as(Coding::Pq4(4), &spec, &table, 4, &[("pq_m", value)]);
        let err = refusal(&spec, &table, file);
        assert!(err.contains(says), "pq_m {value}: {err}");
    }
    // A file of sub-quantizer pairs other than pq_m says: the codes tensor's shape is named.
    let file = build_as(Coding::Pq4(2), &spec, &table, 4, &[("pq_m", "4")]);
    let err = refusal(&spec, &table, file);
    assert!(err.contains("tensor \"codes\" is U8"), "{err}");
    // pq4 codes without a pq_m.
    let err = refusal(&spec, &table, build(&spec, &table, 4, &[("codes", "pq4")]));
    assert!(err.contains("has no \"pq_m\""), "{err}");
    for (tensor, value, says) in [
        ("codebooks", f32::NAN, "tensor \"codebooks\" holds NaN"),
        ("err", f32::INFINITY, "tensor \"err\" holds inf"),
        ("err", -1.0, "tensor \"err\" holds -1"),
    ] {
        poke_refused(&spec, &table, &good, tensor, value, says);
    }
}

/// A catalogue whose values are drawn from 4 levels: with one list (centred on item 0) and 2 values per
/// sub-quantizer, every residual sub-vector is one of 16, coded without error, so the query's table quantization
/// is all that separates the PQ4 score from the exact one.
fn four_levels(rng: &mut Rng, items: usize, dim: usize, storage: Storage) -> (TableSpec, Vec<u8>) {
    let levels = [-1.0f32, -0.375, 0.25, 0.875];
    let values: Vec<f32> = (0..items * dim).map(|_| levels[rng.below(4)]).collect();
    (spec(items, dim, storage), encode(&values, dim, storage))
}

#[test]
fn pq4_bounds_hold_every_exact_score_and_are_tight_where_the_codes_are_exact() {
    let mut rng = Rng(0x1F_000A);
    for (storage, dim, nlist, levels) in [
        (Storage::Fp32, 16, 1, true),
        (Storage::Fp16, 8, 1, true),
        (Storage::Fp32, 32, 6, false),
        (Storage::Int8, 24, 4, false),
    ] {
        let (spec, table) = if levels {
            four_levels(&mut rng, 700, dim, storage)
        } else {
            clustered(&mut rng, 700, dim, 5, storage)
        };
        let index = open_as(Coding::Pq4(dim / 2), &spec, &table, nlist);
        let mut scratch = IvfScratch::default();
        let mut widest = 0.0f64;
        for qi in 0..30 {
            let vector: Vec<f32> = query(&mut rng, dim)
                .iter()
                .map(|x| x * (1 + qi) as f32)
                .collect();
            let exact = reference::scores(&spec, &table, &vector);
            let bounds = index.item_bounds(Isa::detect(), &vector, &mut scratch);
            assert_eq!(bounds.len(), spec.rows as usize);
            let spread = exact.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))
                - exact.iter().fold(f32::INFINITY, |m, &x| m.min(x));
            for (id, lo, up) in bounds {
                let e = exact[id as usize];
                assert!(
                    lo <= e && e <= up,
                    "{storage:?} query {qi} item {id}: {e} outside [{lo}, {up}]"
                );
                widest = widest.max(f64::from(up - lo) / f64::from(spread));
            }
        }
        if levels {
            // Exact codes: the width is the table quantization (M · Δ / 2 each way), a small share of the scores'
            // spread.
            assert!(
                widest < 0.2,
                "{storage:?}: bounds {widest} of the spread wide"
            );
            let (items, k) = (700, 50);
            for isa in Isa::available() {
                let vector = query(&mut rng, dim);
                let q = SearchQuery {
                    vector: &vector,
                    k,
                    exclude: &[3, 9],
                };
                let probe = Probe {
                    nprobe: 1,
                    max_candidates: ALL,
                };
                let (got, stats) = index.search_with(isa, &[q], probe, &mut scratch);
                let want = reference::top_k(&reference::scores(&spec, &table, &vector), k, &[3, 9]);
                assert!(same(&got[0], &want), "{isa:?}");
                assert!(
                    stats.reranked < items as u64 / 2,
                    "tight bounds prune: {}",
                    stats.reranked
                );
            }
        }
    }
}
