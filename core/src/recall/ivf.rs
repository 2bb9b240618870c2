//! The IVF index: approximate recall over large catalogues whose answers are still exact scores.
//!
//! An index file (written by `python -m recserve_models index`, format in docs/model-repository.md) holds a coarse
//! quantizer of `nlist` centroids and, per list, its items as int8 row-wise codes laid out in the catalogue's
//! 16-item panels, or (`codes = "pq4"`) as 4-bit product-quantization codes of their residuals to the list's
//! centroid in blocks of 32 ([`pq4`]). A query scores the centroids (an fp32 [`Catalogue`] of them, so ties go to
//! the lower list), scans the codes of its best `nprobe` lists (int8: the catalogue's own code-domain kernel,
//! [`super::kernel::code_dots`]; pq4: the fast-scan scanner [`pq4::scan`]), and re-ranks the candidates with the documented exact score read from the item table
//! itself ([`exact_score`]), so every score in an answer is bit for bit the exact path's.
//!
//! Which items are candidates is decided by a bound, not a fixed depth: each item carries `err`, such that for any
//! query `q` its exact f32 score lies within `err · ‖q‖₁` of its approximate (code) score (pq4: within
//! `err · ‖q‖₂ + w`, below). A first pass over the
//! probed lists finds `L`, the `k`-th best lower bound of their (non-excluded) items, and keeps every item's upper
//! bound; a second pass takes as candidates the items whose upper bound reaches `L` (no sort: a handful more than
//! `k` on trained catalogues), and only those are re-ranked. An item whose upper bound is below `L` has an exact
//! score strictly below the `k`-th best exact score of the scanned items, so it cannot be in their top `k`, not
//! even by a tie. The candidates are re-ranked highest upper bound first, a chunk at a time, and the re-rank stops
//! when the next upper bound is below the `k`-th best exact score found so far: every later candidate's exact
//! score is below it too. The answer is therefore **the exact top `k` of the items of the probed lists**
//! (same order, same ties by lower id, same exclusions): `nprobe = nlist` is the exact answer, and recall never
//! falls as `nprobe` grows. `max_candidates` caps the re-ranked set (the highest upper bounds are re-ranked); an
//! answer whose cap stopped the re-rank before the rule did is counted in [`IvfStats::capped`].
//!
//! If the probed lists hold fewer than `k + |exclude|` items, further lists are probed in centroid order until they
//! do, so an answer has as many items as the exact one.
//!
//! The queries of one call (a request with many users, an executor's batch) are searched together
//! (`ivf_search.rs`): the centroids are scored for all of them in one pass, and each probed list is read once for
//! every query that probes it. Each answer is bit for bit the one its query gets alone (tested against the
//! one-query-at-a-time search and brute force in `ivf_tests.rs`).
//!
//! **The pq4 bound.** Item `x` of list `l` is coded as `x̂`, its residual `x − c_l` quantized, and carries `err ≥
//! (‖x − c_l − x̂‖₂ + 2·γ(dim + 2)·√dim·R)·(1 + 2⁻¹⁰)` (the builder's float64, rounded up): by Cauchy–Schwarz
//! `|<q, x> − <q, c_l> − <q, x̂>| ≤ ‖q‖₂·‖x − c_l − x̂‖₂`, and the exact f32 score is within `γ(dim + 2)·R·‖q‖₁ ≤
//! γ(dim + 2)·R·√dim·‖q‖₂` of `<q, x>` (`R`: `max_j |x_j|`, or an int8 row's `|bias| + 255·|scale|`). The query's
//! tables ([`Lut`]) give `<q, x̂> ≈ Δ·S + Σ_m offset_m`, `S` the item's u16 sum of table entries, within `M·Δ/2`
//! plus their float64 rounding (`Lut::error`); `<q, c_l>` is summed in float64 (products exact). The code score is
//! `a = f32(<q, c_l> + Σ_m offset_m) + f32(Δ)·S` in f32, within `8·2⁻²⁴·(|<q, c_l> + Σ offset| + 255·M·Δ)` of the
//! same in real numbers. So per list `w = (Lut::error + that + 2·(dim + 2)·2⁻⁵³·Σ_j |q_j·c_lj|)·(1 + 2⁻¹⁰)`,
//! rounded up to f32, and the bounds are `a ± (err·‖q‖₂·(1 + 10⁻⁴) + w)`; the slack factors cover the f32
//! rounding of these last products and sums. A test catalogue whose codes are exact (`ivf_tests.rs`) fails
//! without `w` or with half the residual term: bounds then miss exact scores.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use safetensors::{Dtype, SafeTensors};

use super::catalogue::{Catalogue, CodeRow, LANES};
use super::kernel::Isa;
use super::pq4;
use crate::repository::{OovPolicy, Storage, TableSpec};

#[path = "ivf_search.rs"]
mod search;
pub use search::IvfScratch;

/// Bytes that stay where they are (a mapped file, or a buffer in tests).
pub(crate) type Bytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// The `format` an index file's metadata names, and the version of its layout.
pub(crate) const FORMAT: &str = "recserve-ivf";
pub const FORMAT_VERSION: &str = "1";

/// A lane of a panel that holds no item (the tail of a list).
const PADDING: u32 = u32::MAX;

/// Relative slack on `‖q‖₁` and `‖q‖₂` as computed in f32 (their rounding is at most `dim · 2⁻²⁴` relative).
const NORM_SLACK: f32 = 1e-4;

/// The unit roundoffs of f32 and f64.
const F32_UNIT: f64 = 1.0 / (1u64 << 24) as f64;
const F64_UNIT: f64 = f64::EPSILON / 2.0;
/// Relative slack on a PQ4 query's width `w`, which covers the f32 products and sums of the bounds themselves.
const BOUND_SLACK: f64 = 1.0 / 1024.0;

/// `x` as the least f32 not below it.
fn round_up(x: f64) -> f32 {
    let y = x as f32;
    if f64::from(y) < x { y.next_up() } else { y }
}

/// How one query searches the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Lists scanned (1 to `nlist`; more if those hold fewer than `k + |exclude|` items).
    pub nprobe: usize,
    /// The most candidates re-ranked (at least `k`).
    pub max_candidates: usize,
}

/// What a search did, summed over its queries (for metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IvfStats {
    pub(crate) seconds: f64,
    /// Lists scanned.
    pub(crate) lists: u64,
    /// Item codes scored.
    pub codes: u64,
    /// Candidates re-ranked with the exact score.
    pub reranked: u64,
    /// Queries whose candidates were cut by `max_candidates` (their answer may differ from the exact top `k` of the
    /// probed lists).
    pub(crate) capped: u64,
}

/// Where the big arrays lie in the index file.
#[derive(Clone, Debug)]
struct Ranges {
    ids: Range<usize>,
    codes: Range<usize>,
    err: Range<usize>,
}

/// How the items of a list are coded (the file's `codes`).
#[derive(Clone, Debug)]
enum Codes {
    /// Row-wise int8 in panels of [`LANES`] items, with each item's scale and bias.
    Int8 {
        scale: Range<usize>,
        bias: Range<usize>,
    },
    /// 4-bit PQ of the residual to the list's centroid, in blocks of [`pq4::BLOCK`] items ([`pq4`]).
    Pq4 {
        /// Sub-quantizers.
        m: usize,
        /// `[m][16][dim / m]`.
        codebooks: Vec<f32>,
        /// The coarse centroids `[nlist][dim]`, whose scores the residuals' are added to.
        centroids: Vec<f32>,
    },
}

/// An IVF index over one item table, with the table itself for re-ranking.
pub struct IvfIndex {
    dim: usize,
    items: usize,
    storage: Storage,
    file: Bytes,
    ranges: Ranges,
    coding: Codes,
    /// First panel (16 lanes; a pq4 block is two) of each list, and one past the last.
    offsets: Vec<usize>,
    /// Items of each list.
    sizes: Vec<usize>,
    centroids: Catalogue,
    /// The item table in its documented row layout (`storage`).
    table: Bytes,
    isa: Isa,
}

impl std::fmt::Debug for IvfIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IvfIndex")
            .field("dim", &self.dim)
            .field("items", &self.items)
            .field("nlist", &self.nlist())
            .field("storage", &self.storage)
            .finish_non_exhaustive()
    }
}

/// The checksum an index records of the item table it was built from: `Σ_i w_i · (2i + 1) mod 2⁶⁴` over the
/// table tensor's bytes read as little-endian u64 words `w_i` (the last one zero-padded), as 16 hex digits.
/// Position-weighted, so a changed, moved or swapped row changes it.
pub fn table_checksum(bytes: &[u8]) -> String {
    let (words, tail) = bytes.as_chunks::<8>();
    let mut sum = 0u64;
    for (i, w) in words.iter().enumerate() {
        sum = sum.wrapping_add(u64::from_le_bytes(*w).wrapping_mul(2 * i as u64 + 1));
    }
    if !tail.is_empty() {
        let mut last = [0u8; 8];
        last[..tail.len()].copy_from_slice(tail);
        let i = words.len() as u64;
        sum = sum.wrapping_add(u64::from_le_bytes(last).wrapping_mul(2 * i + 1));
    }
    format!("{sum:016x}")
}

/// The documented exact score of item row `row` (its bytes in the layout of `storage`) for `query`, whose element
/// sum (in index order, f32) is `qsum`: bit for bit what the catalogue's kernels compute.
#[inline]
pub fn exact_score(storage: Storage, row: &[u8], query: &[f32], qsum: f32) -> f32 {
    let mut s = 0.0f32;
    match storage {
        Storage::Fp32 => {
            for (&q, x) in query.iter().zip(row.as_chunks::<4>().0) {
                s += q * f32::from_le_bytes(*x);
            }
            s
        }
        Storage::Fp16 => {
            for (&q, x) in query.iter().zip(row.as_chunks::<2>().0) {
                s += q * half::f16::from_le_bytes(*x).to_f32();
            }
            s
        }
        Storage::Int8 => {
            let (codes, params) = row.split_at(query.len());
            for (&q, &c) in query.iter().zip(codes) {
                s += q * f32::from(c);
            }
            let (params, _) = params.as_chunks::<4>();
            let (scale, bias) = (f32::from_le_bytes(params[0]), f32::from_le_bytes(params[1]));
            s * scale + bias * qsum
        }
    }
}

fn tensor_range(buffer: &[u8], data: &[u8]) -> Range<usize> {
    let start = data.as_ptr() as usize - buffer.as_ptr() as usize;
    start..start + data.len()
}

impl IvfIndex {
    /// Reads an index file (`file`, the whole safetensors buffer) built for the item table `spec` (`table`, its
    /// tensor's bytes), checking what it was built from (format, item count, dim, storage, the table's checksum)
    /// and every structural invariant the search relies on. The problem names what does not match.
    pub(crate) fn open(file: Bytes, spec: &TableSpec, table: Bytes) -> Result<IvfIndex, String> {
        let buffer = (*file).as_ref();
        let (_, metadata) = SafeTensors::read_metadata(buffer)
            .map_err(|e| format!("is not a valid safetensors file (truncated or corrupt?): {e}"))?;
        let empty = HashMap::new();
        let meta = metadata.metadata().as_ref().unwrap_or(&empty);
        let field = |key: &str| -> Result<&str, String> {
            meta.get(key).map(String::as_str).ok_or_else(|| {
                format!("has no {key:?} in its metadata: not an index written by `recserve_models index`")
            })
        };
        if field("format")? != FORMAT {
            return Err(format!(
                "has format {:?} in its metadata, not {FORMAT:?}",
                field("format")?
            ));
        }
        if field("format_version")? != FORMAT_VERSION {
            return Err(format!(
                "has format_version {:?}; this server reads version {FORMAT_VERSION}",
                field("format_version")?
            ));
        }
        let pq = match field("codes")? {
            "int8" => false,
            "pq4" => true,
            other => {
                return Err(format!(
                    "has codes {other:?} in its metadata; this server reads \"int8\" and \"pq4\" codes"
                ));
            }
        };
        let number = |key: &str| -> Result<usize, String> {
            let v = field(key)?;
            v.parse()
                .map_err(|_| format!("has {key} = {v:?} in its metadata, not a count"))
        };
        let (items, dim, nlist) = (number("items")?, number("dim")?, number("nlist")?);
        let stale = "the index is stale or for another table: rebuild it with `python -m recserve_models index`";
        if items as u64 != spec.rows {
            return Err(format!(
                "was built for {items} items, but item table {:?} has {} rows; {stale}",
                spec.name, spec.rows
            ));
        }
        if dim != spec.dim {
            return Err(format!(
                "was built for dim {dim}, but item table {:?} has dim {}; {stale}",
                spec.name, spec.dim
            ));
        }
        let storage = field("item_storage")?;
        if storage != spec.storage.as_str() {
            return Err(format!(
                "was built from a table stored as {storage:?}, but item table {:?} is stored as {:?}; {stale}",
                spec.name,
                spec.storage.as_str()
            ));
        }
        let table_bytes = (*table).as_ref();
        if table_bytes.len() != spec.bytes() as usize {
            return Err(format!(
                "item table {:?} holds {} bytes, expected {}",
                spec.name,
                table_bytes.len(),
                spec.bytes()
            ));
        }
        let recorded = field("item_checksum")?;
        let actual = table_checksum(table_bytes);
        if recorded != actual {
            return Err(format!(
                "records item table checksum {recorded}, but item table {:?} has checksum {actual}: the table \
                 changed since the index was built; {stale}",
                spec.name
            ));
        }
        if nlist == 0 || dim == 0 {
            return Err("has nlist or dim 0".to_owned());
        }
        let m = if pq {
            let m = number("pq_m")?;
            if m < 2 || !m.is_multiple_of(2) || m > pq4::MAX_M || !dim.is_multiple_of(m) {
                return Err(format!(
                    "has pq_m = {m} in its metadata: it must be even, from 2 to {}, and divide dim {dim}",
                    pq4::MAX_M
                ));
            }
            m
        } else {
            0
        };
        let group = if pq { pq4::BLOCK } else { LANES };

        let tensors = SafeTensors::deserialize(buffer)
            .map_err(|e| format!("is not a valid safetensors file (truncated or corrupt?): {e}"))?;
        let tensor = |name: &str, dtype: Dtype, shape: &[usize]| -> Result<&[u8], String> {
            let view = tensors
                .tensor(name)
                .map_err(|_| format!("has no tensor {name:?}"))?;
            if view.dtype() != dtype || view.shape() != shape {
                return Err(format!(
                    "tensor {name:?} is {:?} {:?}, expected {dtype:?} {shape:?}",
                    view.dtype(),
                    view.shape()
                ));
            }
            Ok(view.data())
        };
        let offsets: Vec<usize> = tensor("list_offsets", Dtype::I64, &[nlist + 1])?
            .as_chunks::<8>()
            .0
            .iter()
            .map(|b| usize::try_from(i64::from_le_bytes(*b)).unwrap_or(usize::MAX))
            .collect();
        let sizes: Vec<usize> = tensor("list_sizes", Dtype::I64, &[nlist])?
            .as_chunks::<8>()
            .0
            .iter()
            .map(|b| usize::try_from(i64::from_le_bytes(*b)).unwrap_or(usize::MAX))
            .collect();
        let groups = *offsets.last().unwrap_or(&0);
        if offsets[0] != 0 {
            return Err("tensor \"list_offsets\" does not start at 0".to_owned());
        }
        let unit = if pq { "blocks" } else { "panels" };
        for l in 0..nlist {
            let want = sizes[l].div_ceil(group);
            if offsets[l] > offsets[l + 1] || offsets[l + 1] - offsets[l] != want {
                return Err(format!(
                    "list {l} holds {} items but spans {unit} {}..{} (expected {want} {unit} of {group})",
                    sizes[l],
                    offsets[l],
                    offsets[l + 1]
                ));
            }
        }
        if sizes.iter().sum::<usize>() != items {
            return Err(format!(
                "its lists hold {} items in all, not the {items} of the catalogue",
                sizes.iter().sum::<usize>()
            ));
        }
        let centroid_bytes = tensor("centroids", Dtype::F32, &[nlist, dim])?;
        let centroid_spec = TableSpec {
            name: "centroids".to_owned(),
            rows: nlist as u64,
            dim,
            storage: Storage::Fp32,
            oov: OovPolicy::Reject,
        };
        let centroids = Catalogue::new(&centroid_spec, centroid_bytes, 1)
            .map_err(|problem| format!("tensor \"centroids\" {problem}"))?;
        let lanes = groups * group;
        let ranges = Ranges {
            ids: tensor_range(buffer, tensor("ids", Dtype::U32, &[lanes])?),
            codes: tensor_range(
                buffer,
                if pq {
                    tensor("codes", Dtype::U8, &[groups, m / 2, pq4::BLOCK])?
                } else {
                    tensor("codes", Dtype::U8, &[groups, dim, LANES])?
                },
            ),
            err: tensor_range(buffer, tensor("err", Dtype::F32, &[groups, group])?),
        };
        let coding = if pq {
            let books = tensor("codebooks", Dtype::F32, &[m, pq4::CENTROIDS, dim / m])?;
            let codebooks: Vec<f32> = books
                .as_chunks::<4>()
                .0
                .iter()
                .map(|b| f32::from_le_bytes(*b))
                .collect();
            if let Some(v) = codebooks.iter().find(|v| !v.is_finite()) {
                return Err(format!("tensor \"codebooks\" holds {v}"));
            }
            let centroids = centroid_bytes
                .as_chunks::<4>()
                .0
                .iter()
                .map(|b| f32::from_le_bytes(*b))
                .collect();
            Codes::Pq4 {
                m,
                codebooks,
                centroids,
            }
        } else {
            Codes::Int8 {
                scale: tensor_range(buffer, tensor("scale", Dtype::F32, &[groups, LANES])?),
                bias: tensor_range(buffer, tensor("bias", Dtype::F32, &[groups, LANES])?),
            }
        };
        drop(tensors);
        let index = IvfIndex {
            dim,
            items,
            storage: spec.storage,
            file,
            ranges,
            coding,
            // In panels of 16 lanes whatever the codes (a pq4 block is two), as the search addresses lanes.
            offsets: offsets.iter().map(|&o| o * (group / LANES)).collect(),
            sizes,
            centroids,
            table,
            isa: Isa::detect(),
        };
        index.check_lanes()?;
        Ok(index)
    }

    /// Checks that the file's arrays can be read in place, that every item is in exactly one list lane and every
    /// padding lane is marked, and that scales, biases and bounds are finite (bounds not negative).
    fn check_lanes(&self) -> Result<(), String> {
        let aligned = |name: &str, range: &Range<usize>| {
            if ((*self.file).as_ref()[range.clone()].as_ptr() as usize).is_multiple_of(4) {
                Ok(())
            } else {
                Err(format!(
                    "tensor {name:?} is not 4-byte aligned in the file (write it with the safetensors library, \
                     which aligns tensors)"
                ))
            }
        };
        let mut floats = vec![("err", &self.ranges.err)];
        if let Codes::Int8 { scale, bias } = &self.coding {
            floats.extend([("scale", scale), ("bias", bias)]);
        }
        aligned("ids", &self.ranges.ids)?;
        for (name, range) in &floats {
            aligned(name, range)?;
        }
        let ids = self.ids();
        let group = self.group();
        let mut seen = vec![false; self.items];
        for (l, (&size, first)) in self.sizes.iter().zip(&self.offsets).enumerate() {
            let lanes = &ids[first * LANES..first * LANES + size.div_ceil(group) * group];
            for (i, &id) in lanes.iter().enumerate() {
                if i >= size {
                    if id != PADDING {
                        return Err(format!(
                            "list {l}: lane {i} is past its {size} items but holds id {id}, not {PADDING}"
                        ));
                    }
                    continue;
                }
                match seen.get_mut(id as usize) {
                    Some(s) if !*s => *s = true,
                    Some(_) => return Err(format!("item {id} is in more than one list lane")),
                    None => {
                        return Err(format!(
                            "list {l} holds id {id}, outside the {} items",
                            self.items
                        ));
                    }
                }
            }
        }
        for (name, range) in floats {
            if let Some(v) = self
                .floats(range)
                .iter()
                .flatten()
                .find(|v| !v.is_finite() || (name == "err" && **v < 0.0))
            {
                return Err(format!("tensor {name:?} holds {v}"));
            }
        }
        Ok(())
    }

    /// Items per group of a list's codes: a panel (int8) or a block (PQ4).
    fn group(&self) -> usize {
        match self.coding {
            Codes::Int8 { .. } => LANES,
            Codes::Pq4 { .. } => pq4::BLOCK,
        }
    }

    /// The file's `codes`: `"int8"` or `"pq4"`.
    pub fn codes_name(&self) -> &'static str {
        match self.coding {
            Codes::Int8 { .. } => "int8",
            Codes::Pq4 { .. } => "pq4",
        }
    }

    fn ids(&self) -> &[u32] {
        bytemuck::cast_slice(&(*self.file).as_ref()[self.ranges.ids.clone()])
    }

    fn codes(&self) -> &[CodeRow] {
        bytemuck::cast_slice(self.code_bytes())
    }

    fn code_bytes(&self) -> &[u8] {
        &(*self.file).as_ref()[self.ranges.codes.clone()]
    }

    fn floats(&self, range: &Range<usize>) -> &[[f32; LANES]] {
        bytemuck::cast_slice(&(*self.file).as_ref()[range.clone()])
    }

    pub fn items(&self) -> usize {
        self.items
    }

    pub fn nlist(&self) -> usize {
        self.sizes.len()
    }

    /// Bytes of the index file (codes, ids, per-item parameters, centroids), besides the item table.
    pub fn bytes(&self) -> u64 {
        (*self.file).as_ref().len() as u64
    }

    #[cfg(test)]
    /// The ids of list `l`'s items, in lane order.
    pub(crate) fn list_items(&self, l: usize) -> Vec<u32> {
        let first = self.offsets[l] * LANES;
        self.ids()[first..first + self.sizes[l]].to_vec()
    }
}

#[cfg(test)]
#[path = "ivf_tests.rs"]
mod tests;
