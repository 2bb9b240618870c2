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
//! pass over the catalogue's memory. The scan is compiled three times: for the build target (plain Rust that LLVM
//! vectorizes as it can), and with AVX2 and with AVX-512F, whose tiles use `std::arch` vector types so that the
//! accumulators provably stay in registers; [`Isa::detect`] picks the widest the CPU has, once, and
//! [`scan_shard`] is the safe wrapper that checks it. Everything around the tile (blocks, selection, merge) is
//! the same code for every ISA.

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
pub(crate) struct ShardScan<'a> {
    pub(crate) dim: usize,
    /// One vector of `dim` values per query.
    pub(crate) queries: &'a [&'a [f32]],
    /// `Σ_j q[j]`, summed in index order, per query (read by int8 panels only).
    pub(crate) qsums: &'a [f32],
    /// One selection per query, reset for this shard.
    pub(crate) topk: &'a mut [TopK],
    /// Per query: the excluded ids that fall inside this shard, ascending.
    pub(crate) exclude: &'a [&'a [u32]],
}

/// Scans `shard` for every query of `scan` with the kernels of `isa`.
pub(crate) fn scan_shard(isa: Isa, shard: &Shard, scan: ShardScan<'_>) {
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

/// What a scan of codes ([`code_dots`]) hands each query's dot products with each panel to.
pub(crate) trait DotSink {
    /// The dot products of query `which[i]` with panel `panel`'s 16 lanes. Called inside the kernel's
    /// instruction set (implementations are inlined there, so their arithmetic is vectorized with it).
    fn take(&mut self, i: usize, panel: usize, dots: &[f32; LANES]);
}

/// The code-domain dot products of a group of queries with a run of int8 panels (one IVF list): `sink` receives,
/// for each query `queries[which[i]]` and panel `p` of `codes` (`codes.len() / dim` panels of `dim` rows each),
/// `Σ_j q[j] · c[j][l]` for its 16 lanes, summed in `j` order exactly as the catalogue's tiles sum them (so the same
/// codes give the same bits, whatever the group). The codes are read once per tile of up to 4 queries, so a list
/// that several queries probe is converted once for all of them. The IVF index's scan ([`super::ivf`]) turns them
/// into bounds with each item's scale, bias and error bound.
///
/// # Panics
/// If `codes` is not a whole number of panels, a query does not hold `dim` values, `which` names a query that is not
/// there, or the CPU lacks `isa`.
pub(crate) fn code_dots<S: DotSink>(
    isa: Isa,
    codes: &[CodeRow],
    dim: usize,
    queries: &[&[f32]],
    which: &[u32],
    sink: &mut S,
) {
    assert!(
        dim > 0 && codes.len().is_multiple_of(dim),
        "whole panels of dim rows"
    );
    assert!(
        which
            .iter()
            .all(|&q| queries.get(q as usize).is_some_and(|v| v.len() == dim)),
        "every query is there and holds dim values"
    );
    match isa {
        Isa::Generic => dots_any::<Portable, S, 1, 2, 4>(codes, dim, queries, which, sink),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            assert!(std::arch::is_x86_feature_detected!("avx2"), "no AVX2");
            // SAFETY: the CPU supports AVX2 (checked just above).
            unsafe { dots_avx2(codes, dim, queries, which, sink) }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            assert!(
                std::arch::is_x86_feature_detected!("avx512f"),
                "no AVX-512F"
            );
            // SAFETY: the CPU supports AVX-512F (checked just above).
            unsafe { dots_avx512(codes, dim, queries, which, sink) }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dots_avx2<S: DotSink>(
    codes: &[CodeRow],
    dim: usize,
    queries: &[&[f32]],
    which: &[u32],
    sink: &mut S,
) {
    dots_any::<x86::Avx2, S, 1, 2, 4>(codes, dim, queries, which, sink);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn dots_avx512<S: DotSink>(
    codes: &[CodeRow],
    dim: usize,
    queries: &[&[f32]],
    which: &[u32],
    sink: &mut S,
) {
    dots_any::<x86::Avx512, S, 4, 4, 8>(codes, dim, queries, which, sink);
}

/// The queries of `which` in tiles of 4, 2 and 1 (the scan's tile shapes, `G4`, `G2`, `G1` panels per tile).
#[inline(always)]
fn dots_any<K: Kernel, S: DotSink, const G4: usize, const G2: usize, const G1: usize>(
    codes: &[CodeRow],
    dim: usize,
    queries: &[&[f32]],
    which: &[u32],
    sink: &mut S,
) {
    let mut i = 0;
    while i < which.len() {
        let left = which.len() - i;
        if left >= 4 {
            dots_tiles::<K, S, 4, G4>(codes, dim, queries, &which[i..i + 4], i, sink);
            i += 4;
        } else if left >= 2 {
            dots_tiles::<K, S, 2, G2>(codes, dim, queries, &which[i..i + 2], i, sink);
            i += 2;
        } else {
            dots_tiles::<K, S, 1, G1>(codes, dim, queries, &which[i..i + 1], i, sink);
            i += 1;
        }
    }
}

/// `Q` queries (the group's `first..first + Q`) against `G` panels per tile, then one panel at a time.
#[inline(always)]
fn dots_tiles<K: Kernel, S: DotSink, const Q: usize, const G: usize>(
    codes: &[CodeRow],
    dim: usize,
    queries: &[&[f32]],
    which: &[u32],
    first: usize,
    sink: &mut S,
) {
    let qs: [&[f32]; Q] = std::array::from_fn(|i| &queries[which[i] as usize][..dim]);
    let panels = codes.len() / dim;
    let mut p = 0;
    while p + G <= panels {
        // SAFETY: the entry point checked the CPU; the rows are G·dim long and every query dim values.
        let acc = unsafe { K::tile::<CodeRow, Q, G>(&codes[p * dim..(p + G) * dim], dim, &qs) };
        for (q, tiles) in acc.iter().enumerate() {
            for (g, dots) in tiles.iter().enumerate() {
                sink.take(first + q, p + g, dots);
            }
        }
        p += G;
    }
    while p < panels {
        // SAFETY: as above, for one panel.
        let acc = unsafe { K::tile::<CodeRow, Q, 1>(&codes[p * dim..(p + 1) * dim], dim, &qs) };
        for (q, tiles) in acc.iter().enumerate() {
            sink.take(first + q, p, &tiles[0]);
        }
        p += 1;
    }
}

// Tile shapes (panels per tile for 4, 2 and 1 queries): AVX2 keeps 8 accumulators (a 16-lane row is two 256-bit
// registers), enough to hide the add latency; AVX-512 has 32 registers and keeps 16 for 4 queries (each loaded row
// then serves 4 queries, each broadcast 4 panels) and 8 otherwise. The portable kernel uses the AVX2 shapes.
fn scan_generic(shard: &Shard, scan: ShardScan<'_>) {
    scan_any::<Portable, 1, 2, 4>(shard, scan);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scan_avx2(shard: &Shard, scan: ShardScan<'_>) {
    scan_any::<x86::Avx2, 1, 2, 4>(shard, scan);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn scan_avx512(shard: &Shard, scan: ShardScan<'_>) {
    scan_any::<x86::Avx512, 4, 4, 8>(shard, scan);
}

/// How a tile is computed: `acc[q][g][l] = Σ_j qs[q][j] · rows[g·dim + j][l]`, summed in `j` order, each term a
/// multiply then an add (never fused), from 0.0.
trait Kernel {
    /// # Safety
    /// The CPU supports the kernel's instruction set, `rows` holds `G · dim` rows and every query `dim` values.
    unsafe fn tile<R: Row, const Q: usize, const G: usize>(
        rows: &[R],
        dim: usize,
        qs: &[&[f32]; Q],
    ) -> [[[f32; LANES]; G]; Q];
}

/// Plain Rust on arrays, which LLVM vectorizes for the build target.
struct Portable;

impl Kernel for Portable {
    #[inline(always)]
    unsafe fn tile<R: Row, const Q: usize, const G: usize>(
        rows: &[R],
        dim: usize,
        qs: &[&[f32]; Q],
    ) -> [[[f32; LANES]; G]; Q] {
        let panels: [&[R]; G] = std::array::from_fn(|g| &rows[g * dim..(g + 1) * dim]);
        let mut acc = [[[0.0f32; LANES]; G]; Q];
        for j in 0..dim {
            for g in 0..G {
                let x = panels[g][j].widen();
                for q in 0..Q {
                    let s = qs[q][j];
                    for l in 0..LANES {
                        acc[q][g][l] += s * x[l];
                    }
                }
            }
        }
        acc
    }
}

/// The x86-64 kernels, written with `std::arch` vector types so that the accumulators stay in vector registers
/// for the whole `dim` loop (LLVM does not reliably keep `[f32; 16]` arrays in registers across a loop).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Kernel, LANES, Row};

    /// One vector register of f32 lanes. Methods are `#[inline(always)]` and only ever run inside the
    /// `#[target_feature]` entry points, where the intrinsics inline.
    ///
    /// # Safety
    /// Every method needs a CPU with the vector's instruction set; pointers must cover `WIDTH` values (codes).
    pub(super) trait Vector: Copy {
        const WIDTH: usize;
        unsafe fn zero() -> Self;
        unsafe fn splat(x: f32) -> Self;
        unsafe fn load(p: *const f32) -> Self;
        /// `WIDTH` codes widened to f32 (exact).
        unsafe fn load_codes(p: *const u8) -> Self;
        /// `acc + s * x`: a multiply, then an add.
        unsafe fn mul_add(acc: Self, s: Self, x: Self) -> Self;
        unsafe fn store(self, p: *mut f32);
    }

    #[derive(Clone, Copy)]
    pub(super) struct V256(__m256);

    // SAFETY (every method of both impls): the trait's contract, i.e. the CPU supports the instruction set
    // (AVX2, AVX-512F) and pointers cover WIDTH values.
    impl Vector for V256 {
        const WIDTH: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> Self {
            V256(unsafe { _mm256_setzero_ps() })
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            V256(unsafe { _mm256_set1_ps(x) })
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            V256(unsafe { _mm256_loadu_ps(p) })
        }
        #[inline(always)]
        unsafe fn load_codes(p: *const u8) -> Self {
            V256(unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()))) })
        }
        #[inline(always)]
        unsafe fn mul_add(acc: Self, s: Self, x: Self) -> Self {
            V256(unsafe { _mm256_add_ps(acc.0, _mm256_mul_ps(s.0, x.0)) })
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm256_storeu_ps(p, self.0) }
        }
    }

    #[derive(Clone, Copy)]
    pub(super) struct V512(__m512);

    impl Vector for V512 {
        const WIDTH: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> Self {
            V512(unsafe { _mm512_setzero_ps() })
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            V512(unsafe { _mm512_set1_ps(x) })
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            V512(unsafe { _mm512_loadu_ps(p) })
        }
        #[inline(always)]
        unsafe fn load_codes(p: *const u8) -> Self {
            V512(unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()))) })
        }
        #[inline(always)]
        unsafe fn mul_add(acc: Self, s: Self, x: Self) -> Self {
            V512(unsafe { _mm512_add_ps(acc.0, _mm512_mul_ps(s.0, x.0)) })
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            unsafe { _mm512_storeu_ps(p, self.0) }
        }
    }

    /// A tile with `P` vectors per 16-lane row.
    ///
    /// # Safety
    /// As [`Kernel::tile`], with `P · V::WIDTH == LANES`.
    #[inline(always)]
    #[expect(
        clippy::needless_range_loop,
        reason = "q, g and p address the register tile in three arrays at once"
    )]
    unsafe fn tile<V: Vector, R: Row, const Q: usize, const G: usize, const P: usize>(
        rows: &[R],
        dim: usize,
        qs: &[&[f32]; Q],
    ) -> [[[f32; LANES]; G]; Q] {
        debug_assert!(P * V::WIDTH == LANES && rows.len() == G * dim);
        debug_assert!(qs.iter().all(|q| q.len() == dim));
        let panels: [*const R; G] = std::array::from_fn(|g| rows[g * dim..].as_ptr());
        let queries: [*const f32; Q] = std::array::from_fn(|q| qs[q].as_ptr());
        // SAFETY (whole body): the CPU has the vector's instruction set (caller), rows are G·dim long and queries
        // dim long (caller), so every `add(j)` with j < dim stays inside.
        unsafe {
            let mut acc = [[[V::zero(); P]; G]; Q];
            for j in 0..dim {
                let s: [V; Q] = std::array::from_fn(|q| V::splat(*queries[q].add(j)));
                for g in 0..G {
                    let row = panels[g].add(j);
                    for p in 0..P {
                        let x = R::load::<V>(row, p);
                        for q in 0..Q {
                            acc[q][g][p] = V::mul_add(acc[q][g][p], s[q], x);
                        }
                    }
                }
            }
            let mut out = [[[0.0f32; LANES]; G]; Q];
            for (acc_q, out_q) in acc.iter().zip(out.iter_mut()) {
                for (acc_g, out_g) in acc_q.iter().zip(out_q.iter_mut()) {
                    for (v, lanes) in acc_g.iter().zip(out_g.chunks_exact_mut(V::WIDTH)) {
                        v.store(lanes.as_mut_ptr());
                    }
                }
            }
            out
        }
    }

    pub(super) struct Avx2;

    impl Kernel for Avx2 {
        #[inline(always)]
        unsafe fn tile<R: Row, const Q: usize, const G: usize>(
            rows: &[R],
            dim: usize,
            qs: &[&[f32]; Q],
        ) -> [[[f32; LANES]; G]; Q] {
            // SAFETY: the caller's guarantees, and 2 × 8 = LANES.
            unsafe { tile::<V256, R, Q, G, 2>(rows, dim, qs) }
        }
    }

    pub(super) struct Avx512;

    impl Kernel for Avx512 {
        #[inline(always)]
        unsafe fn tile<R: Row, const Q: usize, const G: usize>(
            rows: &[R],
            dim: usize,
            qs: &[&[f32]; Q],
        ) -> [[[f32; LANES]; G]; Q] {
            // SAFETY: the caller's guarantees, and 1 × 16 = LANES.
            unsafe { tile::<V512, R, Q, G, 1>(rows, dim, qs) }
        }
    }
}

/// A panel row as 16 f32 values.
trait Row: Copy {
    /// Bytes per value, for the block size.
    const BYTES: usize;
    fn widen(self) -> [f32; LANES];
    /// Part `part` (of `LANES / V::WIDTH`) of the row at `row` as one vector.
    ///
    /// # Safety
    /// `row` points at a row; the CPU has the vector's instruction set.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load<V: x86::Vector>(row: *const Self, part: usize) -> V;
}

impl Row for F32Row {
    const BYTES: usize = 4;
    #[inline(always)]
    fn widen(self) -> [f32; LANES] {
        self.0
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load<V: x86::Vector>(row: *const Self, part: usize) -> V {
        // SAFETY: `row` points at 16 values (caller); part · WIDTH + WIDTH ≤ 16.
        unsafe { V::load(row.cast::<f32>().add(part * V::WIDTH)) }
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
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load<V: x86::Vector>(row: *const Self, part: usize) -> V {
        // SAFETY: `row` points at 16 codes (caller); part · WIDTH + WIDTH ≤ 16.
        unsafe { V::load_codes(row.cast::<u8>().add(part * V::WIDTH)) }
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
fn scan_any<K: Kernel, const G4: usize, const G2: usize, const G1: usize>(
    shard: &Shard,
    scan: ShardScan<'_>,
) {
    match &shard.data {
        Panels::F32(rows) => scan_set::<K, _, G4, G2, G1>(&F32Set(rows), shard, scan),
        Panels::Int8 { codes, scale, bias } => {
            scan_set::<K, _, G4, G2, G1>(&Int8Set { codes, scale, bias }, shard, scan)
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
fn scan_set<K: Kernel, S: PanelSet, const G4: usize, const G2: usize, const G1: usize>(
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
                run::<K, S, 4, G4>(set, dim, lo..hi, &scan.queries[q..q + 4], q, &mut sink);
                q += 4;
            } else if left >= 2 {
                run::<K, S, 2, G2>(set, dim, lo..hi, &scan.queries[q..q + 2], q, &mut sink);
                q += 2;
            } else {
                run::<K, S, 1, G1>(set, dim, lo..hi, &scan.queries[q..q + 1], q, &mut sink);
                q += 1;
            }
        }
        lo = hi;
    }
}

/// Queries `first..first + Q` over panels `panels`, `G` panels per tile (then one at a time).
#[inline(always)]
fn run<K: Kernel, S: PanelSet, const Q: usize, const G: usize>(
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
        let rows = &set.rows()[p * dim..(p + G) * dim];
        // SAFETY: the entry point checked the CPU; `rows` holds G·dim rows, every query dim values.
        let mut acc = unsafe { K::tile::<S::R, Q, G>(rows, dim, &qs) };
        offer::<S, Q, G>(set, p, &mut acc, first, sink);
        p += G;
    }
    while p < panels.end {
        let rows = &set.rows()[p * dim..(p + 1) * dim];
        // SAFETY: as above, for one panel.
        let mut acc = unsafe { K::tile::<S::R, Q, 1>(rows, dim, &qs) };
        offer::<S, Q, 1>(set, p, &mut acc, first, sink);
        p += 1;
    }
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
