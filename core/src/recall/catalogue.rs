//! The item catalogue of a recall model and the exact top-K search over it (score every item of every shard, select
//! per shard, merge).
//!
//! Layout: each shard (a contiguous id range, [`ShardLayout`] as for every table) is cut into panels of
//! [`LANES`] items stored dimension-major, so the kernels read one SIMD vector per dimension and panel. fp32 and
//! fp16 tables become fp32 panels (fp16 widens exactly); int8 tables keep their codes (one byte per value) with
//! each panel's 16 scales and biases beside them, and are scored in the code domain (see [`super::kernel`]). The
//! lanes of a shard's last panel beyond its items hold zeros and are never selected. Every value is checked to be
//! finite at load, so every score is ordered.
//!
//! The panels are held one of two ways. [`Catalogue::new`] lays the whole table out at load: a second copy of the
//! table beside the mapped file, and the fastest exact scan. [`Catalogue::mapped`] keeps only the table's mapped
//! rows and lays each block of about [`BLOCK_BYTES`] out as panels when a search reaches it (once per search, for
//! all its queries), so the model holds one copy of the table: what a model with an IVF index does, whose re-rank
//! reads the same rows and whose exact searches (`exact: true`) are the exception. Both give the same scores, bit
//! for bit (the kernels' contract), and the same answers.

use std::ops::Range;
use std::time::Instant;

use super::ivf::Bytes;
use super::kernel::{self, BLOCK_BYTES, Isa, ShardScan};
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
    /// The block of a mapped catalogue being scanned, laid out as panels.
    block: Option<Shard>,
    values: Vec<f32>,
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
    held: Held,
    isa: Isa,
}

/// Where a catalogue's panels come from.
enum Held {
    /// Laid out at load, per shard.
    Panels(Vec<Shard>),
    /// The table's mapped rows (layout of `storage`), laid out block by block as a search reaches them; each shard
    /// an id range.
    Rows {
        table: Bytes,
        storage: Storage,
        shards: Vec<Range<usize>>,
    },
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Held::Panels(shards) => f.debug_tuple("Panels").field(&shards.len()).finish(),
            Held::Rows {
                storage, shards, ..
            } => f
                .debug_struct("Rows")
                .field("storage", storage)
                .field("shards", shards)
                .finish_non_exhaustive(),
        }
    }
}

impl Catalogue {
    /// Lays out `bytes` (the whole table, in the documented row layout of `spec.storage`) in `shards` shards.
    /// Refuses tables with a non-finite value or more than `u32::MAX` rows.
    pub fn new(spec: &TableSpec, bytes: &[u8], shards: usize) -> Result<Catalogue, String> {
        let rows = check(spec, bytes)?;
        let (dim, row_bytes) = (spec.dim, spec.storage.row_bytes(spec.dim));
        let layout = ShardLayout::new(spec.rows, shards);
        let mut out = Vec::with_capacity(layout.shards);
        let mut values = vec![0.0f32; dim];
        for s in 0..layout.shards {
            let range = layout.range(s, spec.rows);
            let (start, end) = (range.start as usize, range.end as usize);
            let mut data = Panels::F32(Vec::new());
            let panels = lay_out(
                spec.storage,
                dim,
                &bytes[start * row_bytes..end * row_bytes],
                &mut data,
                &mut values,
            );
            out.push(Shard {
                start: start as u32,
                len: end - start,
                panels,
                data,
            });
        }
        Ok(Catalogue::with(spec, rows, Held::Panels(out)))
    }

    /// A catalogue over the table's own rows where they lie (`table`, in the documented row layout of
    /// `spec.storage`), in `shards` shards: nothing is copied at load; each search lays out the blocks it scans.
    /// Refuses what [`Catalogue::new`] refuses.
    pub fn mapped(spec: &TableSpec, table: Bytes, shards: usize) -> Result<Catalogue, String> {
        let rows = check(spec, (*table).as_ref())?;
        let layout = ShardLayout::new(spec.rows, shards);
        let shards = (0..layout.shards)
            .map(|s| {
                let range = layout.range(s, spec.rows);
                range.start as usize..range.end as usize
            })
            .collect();
        let held = Held::Rows {
            table,
            storage: spec.storage,
            shards,
        };
        Ok(Catalogue::with(spec, rows, held))
    }

    fn with(spec: &TableSpec, rows: usize, held: Held) -> Catalogue {
        Catalogue {
            dim: spec.dim,
            items: rows,
            storage: match spec.storage {
                Storage::Int8 => Storage::Int8,
                Storage::Fp32 | Storage::Fp16 => Storage::Fp32,
            },
            held,
            isa: Isa::detect(),
        }
    }

    pub(crate) fn dim(&self) -> usize {
        self.dim
    }

    /// Items in the catalogue (ids `0..items`).
    pub(crate) fn items(&self) -> usize {
        self.items
    }

    pub(crate) fn shards(&self) -> usize {
        match &self.held {
            Held::Panels(shards) => shards.len(),
            Held::Rows { shards, .. } => shards.len(),
        }
    }

    /// `Fp32` or `Int8`: how the items are scored.
    pub(crate) fn storage(&self) -> Storage {
        self.storage
    }

    /// The instruction set searches use.
    pub(crate) fn isa(&self) -> Isa {
        self.isa
    }

    /// Memory the items occupy: the panels laid out at load, or the mapped table's rows.
    pub fn bytes(&self) -> u64 {
        match &self.held {
            Held::Panels(shards) => shards.iter().map(Shard::bytes).sum(),
            Held::Rows { table, .. } => (**table).as_ref().len() as u64,
        }
    }

    /// Whether the catalogue reads the mapped table ([`Catalogue::mapped`]) rather than a copy laid out at load.
    pub fn is_mapped(&self) -> bool {
        matches!(self.held, Held::Rows { .. })
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
        let mut per_shard: Vec<Vec<Vec<Scored>>> = vec![Vec::with_capacity(self.shards()); nq];
        let dim = self.dim;
        let scan = |shard: &Shard, topk: &mut [TopK], qsums: &[f32]| {
            let exclude = within(
                queries,
                shard.start as usize..shard.start as usize + shard.len,
            );
            kernel::scan_shard(
                isa,
                shard,
                ShardScan {
                    dim,
                    queries: &vectors,
                    qsums,
                    topk,
                    exclude: &exclude,
                },
            );
        };
        let ranges: Vec<Range<usize>> = match &self.held {
            Held::Panels(shards) => shards
                .iter()
                .map(|s| s.start as usize..s.start as usize + s.len)
                .collect(),
            Held::Rows { shards, .. } => shards.clone(),
        };
        for (s, range) in ranges.into_iter().enumerate() {
            for (top, q) in scratch.topk.iter_mut().zip(queries) {
                top.reset(q.k, range.len());
            }
            match &self.held {
                Held::Panels(shards) => scan(&shards[s], &mut scratch.topk[..nq], &scratch.qsums),
                Held::Rows { table, storage, .. } => {
                    // Blocks of whole panels of about BLOCK_BYTES, in id order, into the same selections.
                    let (bytes, row_bytes) = ((**table).as_ref(), storage.row_bytes(dim));
                    let panel_bytes = match self.storage {
                        Storage::Int8 => dim * LANES + 2 * 4 * LANES,
                        Storage::Fp32 | Storage::Fp16 => dim * LANES * 4,
                    };
                    let block_items = (BLOCK_BYTES / panel_bytes).max(1) * LANES;
                    scratch.values.resize(dim, 0.0);
                    let block = scratch.block.get_or_insert_with(|| Shard {
                        start: 0,
                        len: 0,
                        panels: 0,
                        data: Panels::F32(Vec::new()),
                    });
                    let mut start = range.start;
                    while start < range.end {
                        let end = (start + block_items).min(range.end);
                        block.panels = lay_out(
                            *storage,
                            dim,
                            &bytes[start * row_bytes..end * row_bytes],
                            &mut block.data,
                            &mut scratch.values,
                        );
                        block.start = start as u32;
                        block.len = end - start;
                        scan(block, &mut scratch.topk[..nq], &scratch.qsums);
                        start = end;
                    }
                }
            }
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

/// Per query: its excluded ids inside `range`, ascending.
fn within<'a>(queries: &[SearchQuery<'a>], range: Range<usize>) -> Vec<&'a [u32]> {
    queries
        .iter()
        .map(|q| {
            let lo = q.exclude.partition_point(|&id| (id as usize) < range.start);
            let hi = q.exclude.partition_point(|&id| (id as usize) < range.end);
            &q.exclude[lo..hi]
        })
        .collect()
}

/// The table's row count, after checking its size, that it has at most `u32::MAX` rows, and that every value it
/// decodes to is finite.
fn check(spec: &TableSpec, bytes: &[u8]) -> Result<usize, String> {
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
    let mut values = vec![0.0f32; dim];
    for (id, row) in bytes.chunks_exact(row_bytes.max(1)).enumerate() {
        match spec.storage {
            Storage::Fp32 | Storage::Fp16 => {
                crate::embedding::cpu::decode_row(spec.storage, row, &mut values);
                check_finite(id, &values)?;
            }
            Storage::Int8 => {
                let (s, b) = int8_params(row, dim);
                // The largest magnitude a row can decode to is at code 0 or 255.
                check_finite(id, &[s, b, 255.0 * s, 255.0 * s + b])?;
            }
        }
    }
    Ok(rows)
}

/// An int8 row's scale and bias (the two f32 after its `dim` codes).
fn int8_params(row: &[u8], dim: usize) -> (f32, f32) {
    let (params, _) = row[dim..].as_chunks::<4>();
    (f32::from_le_bytes(params[0]), f32::from_le_bytes(params[1]))
}

/// Lays out the rows of `bytes` (layout of `storage`, `dim` values each) as panels in `data`, reusing its memory;
/// the lanes past the last row hold zeros. Returns the number of panels.
fn lay_out(
    storage: Storage,
    dim: usize,
    bytes: &[u8],
    data: &mut Panels,
    values: &mut [f32],
) -> usize {
    let row_bytes = storage.row_bytes(dim);
    let len = bytes.len() / row_bytes.max(1);
    let panels = len.div_ceil(LANES);
    let taken = std::mem::replace(data, Panels::F32(Vec::new()));
    *data = match storage {
        Storage::Fp32 | Storage::Fp16 => {
            let mut rows = match taken {
                Panels::F32(rows) => rows,
                Panels::Int8 { .. } => Vec::new(),
            };
            rows.clear();
            rows.resize(panels * dim, F32Row([0.0; LANES]));
            for (local, row) in bytes.chunks_exact(row_bytes).enumerate() {
                crate::embedding::cpu::decode_row(storage, row, values);
                let (p, l) = (local / LANES, local % LANES);
                for (j, &v) in values.iter().enumerate() {
                    rows[p * dim + j].0[l] = v;
                }
            }
            Panels::F32(rows)
        }
        Storage::Int8 => {
            let (mut codes, mut scale, mut bias) = match taken {
                Panels::Int8 { codes, scale, bias } => (codes, scale, bias),
                Panels::F32(_) => (Vec::new(), Vec::new(), Vec::new()),
            };
            codes.clear();
            codes.resize(panels * dim, CodeRow([0; LANES]));
            scale.clear();
            scale.resize(panels, [0.0f32; LANES]);
            bias.clear();
            bias.resize(panels, [0.0f32; LANES]);
            for (local, row) in bytes.chunks_exact(row_bytes).enumerate() {
                let (s, b) = int8_params(row, dim);
                let (p, l) = (local / LANES, local % LANES);
                scale[p][l] = s;
                bias[p][l] = b;
                for (j, &c) in row[..dim].iter().enumerate() {
                    codes[p * dim + j].0[l] = c;
                }
            }
            Panels::Int8 { codes, scale, bias }
        }
    };
    panels
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
