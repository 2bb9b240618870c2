//! The scoring kernels: inner products of a tile of queries with a tile of catalogue panels, and the scan of one
//! shard that feeds every query's [`TopK`].
//!
//! The catalogue is stored in panels of [`LANES`] items, dimension-major (`panel[j][l]` is value `j` of item `l`),
//! so one panel row is one SIMD vector and a query value is broadcast against it: the score of lane `l`
//! accumulates `q[j] · x[j][l]` for `j = 0, 1, …, dim − 1` in that order, a multiply then an add (never fused),
//! starting from 0.0. That is exactly the naive `for j in 0..dim { s += q[j] * x[j] }`, so every kernel, ISA,
//! tile shape, block size, batch composition and shard layout produces bit-identical scores, and the tests
//! compare them with a scalar loop bit for bit.
//!
//! A tile is `Q` queries × `G` panels, its `Q·G·LANES` accumulators held in registers across the whole `dim`
//! loop: a small matrix product. The shard is scanned in blocks of about [`BLOCK_BYTES`] (kept in L2) and every
//! query tile of the batch passes over a block before the next block is read, so a batch of queries costs one
//! pass over the catalogue's memory. The same portable Rust is compiled three times: for the build target, with
//! AVX2 and with AVX-512F; [`Isa::detect`] picks the widest the CPU has, once. Tile shapes per ISA keep 8 vector
//! accumulators live (16 on AVX-512 would spill nothing either, but 8 already hide the add latency).

use super::catalogue::{CodeRow, F32Row, LANES, Panels, Shard};
use super::select::TopK;

/// Bytes of catalogue panels scanned by every query tile of a batch before moving on: comfortably inside the L2
/// cache of current server cores (512 KiB – 2 MiB).
pub const BLOCK_BYTES: usize = 256 * 1024;

/// The instruction set the kernels run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Whatever the build target guarantees (SSE2 on x86-64, NEON on aarch64).
    Generic,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The widest instruction set this CPU supports (`is_x86_feature_detected!` caches its answer).
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Generic
    }

    /// Every instruction set this CPU can run, narrowest first (for tests and benchmarks).
    pub fn available() -> Vec<Isa> {
        let mut out = vec![Isa::Generic];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                out.push(Isa::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                out.push(Isa::Avx512);
            }
        }
        out
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Isa::Generic => "generic",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => "avx512",
        }
    }
}

/// One shard's share of a batch: the queries, their selections and exclusions.
pub struct ShardScan<'a> {
    pub dim: usize,
    /// One vector of `dim` values per query.
    pub queries: &'a [&'a [f32]],
    /// `Σ_j q[j]`, summed in index order, per query (read by int8 panels only).
    pub qsums: &'a [f32],
    /// One selection per query, reset for this shard.
    pub topk: &'a mut [TopK],
    /// Per query: the excluded ids that fall inside this shard, ascending.
    pub exclude: &'a [&'a [u32]],
}

/// Scans `shard` for every query of `scan` with the kernels of `isa`.
pub fn scan_shard(isa: Isa, shard: &Shard, scan: ShardScan<'_>) {
    assert!(
        scan.queries.len() == scan.qsums.len()
            && scan.queries.len() == scan.topk.len()
            && scan.queries.len() == scan.exclude.len(),
        "one qsum, selection and exclusion list per query"
    );
    assert!(
        scan.queries.iter().all(|q| q.len() == scan.dim),
        "every query has dim values"
    );
    match isa {
        Isa::Generic => scan_generic(shard, scan),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            assert!(std::arch::is_x86_feature_detected!("avx2"), "no AVX2");
            // SAFETY: the CPU supports AVX2 (checked just above).
            unsafe { scan_avx2(shard, scan) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            assert!(
                std::arch::is_x86_feature_detected!("avx512f"),
                "no AVX-512F"
            );
            // SAFETY: the CPU supports AVX-512F (checked just above).
            unsafe { scan_avx512(shard, scan) }
        }
    }
}

// Tile shapes (panels per tile for 4, 2 and 1 queries) keep 8 vector accumulators: a 16-lane row is two 256-bit
// registers (4 with SSE2/NEON, which then spill a little) or one 512-bit register.
fn scan_generic(shard: &Shard, scan: ShardScan<'_>) {
    scan_any::<1, 2, 4>(shard, scan);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scan_avx2(shard: &Shard, scan: ShardScan<'_>) {
    scan_any::<1, 2, 4>(shard, scan);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn scan_avx512(shard: &Shard, scan: ShardScan<'_>) {
    scan_any::<2, 4, 8>(shard, scan);
}

/// A panel row as 16 f32 values.
trait Row: Copy {
    /// Bytes per value, for the block size.
    const BYTES: usize;
    fn widen(self) -> [f32; LANES];
}

impl Row for F32Row {
    const BYTES: usize = 4;
    #[inline(always)]
    fn widen(self) -> [f32; LANES] {
        self.0
    }
}

impl Row for CodeRow {
    const BYTES: usize = 1;
    #[inline(always)]
    fn widen(self) -> [f32; LANES] {
        let mut out = [0.0f32; LANES];
        for (o, &c) in out.iter_mut().zip(self.0.iter()) {
            *o = f32::from(c);
        }
        out
    }
}

/// A shard's panels of one storage type.
trait PanelSet {
    type R: Row;
    /// `G` panels starting at panel `p`, each as its `dim` rows.
    fn rows(&self) -> &[Self::R];
    /// Turns the accumulated dot products of panel `p` into scores.
    fn finish(&self, p: usize, acc: &mut [f32; LANES], qsum: f32);
}

struct F32Set<'a>(&'a [F32Row]);

impl PanelSet for F32Set<'_> {
    type R = F32Row;
    #[inline(always)]
    fn rows(&self) -> &[F32Row] {
        self.0
    }
    #[inline(always)]
    fn finish(&self, _p: usize, _acc: &mut [f32; LANES], _qsum: f32) {}
}

/// Int8 panels are scored in the code domain: with `x[j] = c[j]·scale + bias`, `<q, x> = scale·Σ q[j]·c[j] +
/// bias·Σ q[j]`; the kernel accumulates `Σ q[j]·c[j]` and this adds the rest per item (error bound in
/// docs/model-repository.md).
struct Int8Set<'a> {
    codes: &'a [CodeRow],
    scale: &'a [[f32; LANES]],
    bias: &'a [[f32; LANES]],
}

impl PanelSet for Int8Set<'_> {
    type R = CodeRow;
    #[inline(always)]
    fn rows(&self) -> &[CodeRow] {
        self.codes
    }
    #[inline(always)]
    fn finish(&self, p: usize, acc: &mut [f32; LANES], qsum: f32) {
        let (scale, bias) = (&self.scale[p], &self.bias[p]);
        for l in 0..LANES {
            acc[l] = acc[l] * scale[l] + bias[l] * qsum;
        }
    }
}

#[inline(always)]
fn scan_any<const G4: usize, const G2: usize, const G1: usize>(shard: &Shard, scan: ShardScan<'_>) {
    match &shard.data {
        Panels::F32(rows) => scan_set::<_, G4, G2, G1>(&F32Set(rows), shard, scan),
        Panels::Int8 { codes, scale, bias } => {
            scan_set::<_, G4, G2, G1>(&Int8Set { codes, scale, bias }, shard, scan)
        }
    }
}

/// What a tile offers its results to.
struct Sink<'a, 'b> {
    topk: &'a mut [TopK],
    exclude: &'a [&'b [u32]],
    qsums: &'a [f32],
    start: u32,
    len: usize,
}

#[inline(always)]
fn scan_set<S: PanelSet, const G4: usize, const G2: usize, const G1: usize>(
    set: &S,
    shard: &Shard,
    scan: ShardScan<'_>,
) {
    let dim = scan.dim;
    let panel_bytes = dim * LANES * <S::R as Row>::BYTES;
    // A multiple of 8 panels, so every tile width divides it.
    let block = ((BLOCK_BYTES / panel_bytes.max(1)) / 8 * 8).max(8);
    let nq = scan.queries.len();
    let mut sink = Sink {
        topk: scan.topk,
        exclude: scan.exclude,
        qsums: scan.qsums,
        start: shard.start,
        len: shard.len,
    };
    let mut lo = 0;
    while lo < shard.panels {
        let hi = (lo + block).min(shard.panels);
        let mut q = 0;
        while q < nq {
            let left = nq - q;
            if left >= 4 {
                run::<S, 4, G4>(set, dim, lo..hi, &scan.queries[q..q + 4], q, &mut sink);
                q += 4;
            } else if left >= 2 {
                run::<S, 2, G2>(set, dim, lo..hi, &scan.queries[q..q + 2], q, &mut sink);
                q += 2;
            } else {
                run::<S, 1, G1>(set, dim, lo..hi, &scan.queries[q..q + 1], q, &mut sink);
                q += 1;
            }
        }
        lo = hi;
    }
}

/// Queries `first..first + Q` over panels `panels`, `G` panels per tile (then one at a time).
#[inline(always)]
fn run<S: PanelSet, const Q: usize, const G: usize>(
    set: &S,
    dim: usize,
    panels: std::ops::Range<usize>,
    queries: &[&[f32]],
    first: usize,
    sink: &mut Sink<'_, '_>,
) {
    let qs: [&[f32]; Q] = std::array::from_fn(|i| &queries[i][..dim]);
    let mut p = panels.start;
    while p + G <= panels.end {
        let mut acc = tile::<S::R, Q, G>(&set.rows()[p * dim..(p + G) * dim], dim, &qs);
        offer::<S, Q, G>(set, p, &mut acc, first, sink);
        p += G;
    }
    while p < panels.end {
        let mut acc = tile::<S::R, Q, 1>(&set.rows()[p * dim..(p + 1) * dim], dim, &qs);
        offer::<S, Q, 1>(set, p, &mut acc, first, sink);
        p += 1;
    }
}

/// `acc[q][g][l] = Σ_j qs[q][j] · rows[g·dim + j][l]`, summed in `j` order without fused multiply-adds.
#[inline(always)]
fn tile<R: Row, const Q: usize, const G: usize>(
    rows: &[R],
    dim: usize,
    qs: &[&[f32]; Q],
) -> [[[f32; LANES]; G]; Q] {
    let panels: [&[R]; G] = std::array::from_fn(|g| &rows[g * dim..(g + 1) * dim]);
    let mut acc = [[[0.0f32; LANES]; G]; Q];
    for j in 0..dim {
        let mut x = [[0.0f32; LANES]; G];
        for g in 0..G {
            x[g] = panels[g][j].widen();
        }
        for q in 0..Q {
            let s = qs[q][j];
            for g in 0..G {
                for l in 0..LANES {
                    acc[q][g][l] += s * x[g][l];
                }
            }
        }
    }
    acc
}

/// Hands a tile's scores to the selections. One comparison of the tile's best score against each query's
/// threshold usually settles it.
#[inline(always)]
fn offer<S: PanelSet, const Q: usize, const G: usize>(
    set: &S,
    p: usize,
    acc: &mut [[[f32; LANES]; G]; Q],
    first: usize,
    sink: &mut Sink<'_, '_>,
) {
    for (q, tiles) in acc.iter_mut().enumerate() {
        let qi = first + q;
        let qsum = sink.qsums[qi];
        for (g, scores) in tiles.iter_mut().enumerate() {
            set.finish(p + g, scores, qsum);
            let mut best = f32::NEG_INFINITY;
            for &s in scores.iter() {
                best = best.max(s);
            }
            if sink.topk[qi].wants(best) {
                offer_lanes(sink, qi, (p + g) * LANES, scores);
            }
        }
    }
}

/// The slow path: some lane of this panel may enter query `qi`'s selection.
#[inline(never)]
fn offer_lanes(sink: &mut Sink<'_, '_>, qi: usize, first_local: usize, scores: &[f32; LANES]) {
    let exclude = sink.exclude[qi];
    let top = &mut sink.topk[qi];
    for (l, &s) in scores.iter().enumerate() {
        let local = first_local + l;
        if local >= sink.len {
            break;
        }
        if top.wants(s) {
            let id = sink.start + local as u32;
            if exclude.binary_search(&id).is_err() {
                top.push(id, s);
            }
        }
    }
}
