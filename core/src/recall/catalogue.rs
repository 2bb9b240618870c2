//! The item catalogue of a recall model: the item table re-laid out at load for the scoring kernels, sharded, and
//! the exact top-K search over it (score every item of every shard, select per shard, merge).
//!
//! Layout: each shard (a contiguous id range, [`ShardLayout`] as for every table) is cut into panels of
//! [`LANES`] items stored dimension-major, so the kernels read one SIMD vector per dimension and panel. fp32 and
//! fp16 tables become fp32 panels (fp16 widens exactly); int8 tables keep their codes (one byte per value) with
//! each panel's 16 scales and biases beside them, and are scored in the code domain (see [`super::kernel`]). The
//! lanes of a shard's last panel beyond its items hold zeros and are never selected. Every value is checked to be
//! finite at load, so every score is ordered.

use std::time::Instant;

use super::kernel::{self, Isa, ShardScan};
use super::select::{Scored, TopK, merge};
use crate::embedding::ShardLayout;
use crate::repository::{Storage, TableSpec};

/// Items per panel: one 512-bit (or two 256-bit) vector of f32.
pub const LANES: usize = 16;

/// One dimension of one fp32 panel.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub struct F32Row(pub [f32; LANES]);

/// One dimension of one int8 panel: the codes of 16 items. Byte-aligned, so that an IVF index file's codes are
/// read where they are mapped (the kernels load codes unaligned).
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub struct CodeRow(pub [u8; LANES]);

// SAFETY: a transparent wrapper of a byte array: no padding, every bit pattern valid.
unsafe impl bytemuck::Zeroable for CodeRow {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for CodeRow {}

/// The panels of one shard, `panels × dim` rows.
#[derive(Debug)]
pub enum Panels {
    F32(Vec<F32Row>),
    Int8 {
        codes: Vec<CodeRow>,
        scale: Vec<[f32; LANES]>,
        bias: Vec<[f32; LANES]>,
    },
}

/// A contiguous range of item ids.
#[derive(Debug)]
pub struct Shard {
    /// Id of its first item.
    pub(crate) start: u32,
    /// Items in it.
    pub(crate) len: usize,
    pub(crate) panels: usize,
    pub(crate) data: Panels,
}

impl Shard {
    fn bytes(&self) -> u64 {
        let bytes = match &self.data {
            Panels::F32(rows) => std::mem::size_of_val(rows.as_slice()),
            Panels::Int8 { codes, scale, bias } => {
                std::mem::size_of_val(codes.as_slice())
                    + std::mem::size_of_val(scale.as_slice())
                    + std::mem::size_of_val(bias.as_slice())
            }
        };
        bytes as u64
    }
}

/// One query of a search: its vector, how many items it wants, and item ids it must not get.
#[derive(Clone, Copy, Debug)]
pub struct SearchQuery<'a> {
    pub vector: &'a [f32],
    /// At least 1.
    pub k: usize,
    /// Ascending, without duplicates; ids outside the catalogue are allowed (and mean nothing).
    pub exclude: &'a [u32],
}

/// Buffers one executor reuses from search to search.
#[derive(Debug, Default)]
pub struct SearchScratch {
    topk: Vec<TopK>,
    qsums: Vec<f32>,
}

/// How long a search took, for metrics.
#[derive(Clone, Copy, Debug)]
pub struct SearchStats {
    pub(crate) seconds: f64,
    /// (query, item) pairs scored.
    pub(crate) scored: u64,
}

/// An item table ready for exact top-K search by inner product.
#[derive(Debug)]
pub struct Catalogue {
    dim: usize,
    items: usize,
    /// How the panels store values: `Fp32` (from fp32 or fp16 tables) or `Int8`.
    storage: Storage,
    shards: Vec<Shard>,
    isa: Isa,
}

impl Catalogue {
    /// Lays out `bytes` (the whole table, in the documented row layout of `spec.storage`) in `shards` shards.
    /// Refuses tables with a non-finite value or more than `u32::MAX` rows.
    pub fn new(spec: &TableSpec, bytes: &[u8], shards: usize) -> Result<Catalogue, String> {
        let rows = usize::try_from(spec.rows)
            .ok()
            .filter(|&r| r <= u32::MAX as usize)
            .ok_or_else(|| {
                format!(
                    "has {} rows; a recall catalogue holds at most {} items",
                    spec.rows,
                    u32::MAX
                )
            })?;
        let dim = spec.dim;
        let row_bytes = spec.storage.row_bytes(dim);
        if bytes.len() != rows * row_bytes {
            return Err(format!(
                "holds {} bytes, expected {rows} rows × {row_bytes} bytes",
                bytes.len()
            ));
        }
        let layout = ShardLayout::new(spec.rows, shards);
        let mut out = Vec::with_capacity(layout.shards);
        let mut values = vec![0.0f32; dim];
        for s in 0..layout.shards {
            let range = layout.range(s, spec.rows);
            let (start, end) = (range.start as usize, range.end as usize);
            let len = end - start;
            let panels = len.div_ceil(LANES);
            let data = match spec.storage {
                Storage::Fp32 | Storage::Fp16 => {
                    let mut data = vec![F32Row([0.0; LANES]); panels * dim];
                    for local in 0..len {
                        let id = start + local;
                        let row = &bytes[id * row_bytes..(id + 1) * row_bytes];
                        crate::embedding::cpu::decode_row(spec.storage, row, &mut values);
                        check_finite(id, &values)?;
                        let (p, l) = (local / LANES, local % LANES);
                        for (j, &v) in values.iter().enumerate() {
                            data[p * dim + j].0[l] = v;
                        }
                    }
                    Panels::F32(data)
                }
                Storage::Int8 => {
                    let mut codes = vec![CodeRow([0; LANES]); panels * dim];
                    let mut scale = vec![[0.0f32; LANES]; panels];
                    let mut bias = vec![[0.0f32; LANES]; panels];
                    for local in 0..len {
                        let id = start + local;
                        let row = &bytes[id * row_bytes..(id + 1) * row_bytes];
                        let (row_codes, tail) = row.split_at(dim);
                        let (params, _) = tail.as_chunks::<4>();
                        let (s, b) = (f32::from_le_bytes(params[0]), f32::from_le_bytes(params[1]));
                        // The largest magnitude a row can decode to is at code 0 or 255.
                        check_finite(id, &[s, b, 255.0 * s, 255.0 * s + b])?;
                        let (p, l) = (local / LANES, local % LANES);
                        scale[p][l] = s;
                        bias[p][l] = b;
                        for (j, &c) in row_codes.iter().enumerate() {
                            codes[p * dim + j].0[l] = c;
                        }
                    }
                    Panels::Int8 { codes, scale, bias }
                }
            };
            out.push(Shard {
                start: start as u32,
                len,
                panels,
                data,
            });
        }
        Ok(Catalogue {
            dim,
            items: rows,
            storage: match spec.storage {
                Storage::Int8 => Storage::Int8,
                Storage::Fp32 | Storage::Fp16 => Storage::Fp32,
            },
            shards: out,
            isa: Isa::detect(),
        })
    }

    pub(crate) fn dim(&self) -> usize {
        self.dim
    }

    /// Items in the catalogue (ids `0..items`).
    pub(crate) fn items(&self) -> usize {
        self.items
    }

    pub(crate) fn shards(&self) -> usize {
        self.shards.len()
    }

    /// `Fp32` or `Int8`: how the items are scored.
    pub(crate) fn storage(&self) -> Storage {
        self.storage
    }

    /// The instruction set searches use.
    pub(crate) fn isa(&self) -> Isa {
        self.isa
    }

    /// Memory the panels occupy.
    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(Shard::bytes).sum()
    }

    /// The exact top-K of every query: the `min(k, items not excluded)` items with the highest inner product,
    /// higher score first, equal scores by lower id.
    ///
    /// # Panics
    /// If a query's vector does not hold `dim` values (callers build them from the model's own tables).
    pub fn search(
        &self,
        queries: &[SearchQuery<'_>],
        scratch: &mut SearchScratch,
    ) -> (Vec<Vec<Scored>>, SearchStats) {
        self.search_with(self.isa, queries, scratch)
    }

    /// [`Catalogue::search`] with the kernels of `isa` (which the CPU must support).
    pub fn search_with(
        &self,
        isa: Isa,
        queries: &[SearchQuery<'_>],
        scratch: &mut SearchScratch,
    ) -> (Vec<Vec<Scored>>, SearchStats) {
        let started = Instant::now();
        let nq = queries.len();
        let vectors: Vec<&[f32]> = queries.iter().map(|q| q.vector).collect();
        for v in &vectors {
            assert_eq!(v.len(), self.dim, "a query vector holds dim values");
        }
        scratch.qsums.clear();
        scratch.qsums.extend(vectors.iter().map(|v| {
            let mut sum = 0.0f32;
            for &x in v.iter() {
                sum += x;
            }
            sum
        }));
        scratch.topk.resize_with(nq, TopK::default);
        let mut per_shard: Vec<Vec<Vec<Scored>>> = vec![Vec::with_capacity(self.shards.len()); nq];
        for shard in &self.shards {
            let end = shard.start as u64 + shard.len as u64;
            let exclude: Vec<&[u32]> = queries
                .iter()
                .map(|q| {
                    let lo = q.exclude.partition_point(|&id| id < shard.start);
                    let hi = q.exclude.partition_point(|&id| (id as u64) < end);
                    &q.exclude[lo..hi]
                })
                .collect();
            for (top, q) in scratch.topk.iter_mut().zip(queries) {
                top.reset(q.k, shard.len);
            }
            kernel::scan_shard(
                isa,
                shard,
                ShardScan {
                    dim: self.dim,
                    queries: &vectors,
                    qsums: &scratch.qsums,
                    topk: &mut scratch.topk[..nq],
                    exclude: &exclude,
                },
            );
            for (lists, top) in per_shard.iter_mut().zip(scratch.topk.iter_mut()) {
                lists.push(top.finish());
            }
        }
        let results = per_shard
            .into_iter()
            .zip(queries)
            .map(|(lists, q)| merge(lists, q.k))
            .collect();
        let stats = SearchStats {
            seconds: started.elapsed().as_secs_f64(),
            scored: (nq * self.items) as u64,
        };
        (results, stats)
    }
}

fn check_finite(id: usize, values: &[f32]) -> Result<(), String> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(j) => Err(format!(
            "row {id} holds a non-finite value ({}): recall needs finite item embeddings to order scores",
            values[j]
        )),
    }
}
