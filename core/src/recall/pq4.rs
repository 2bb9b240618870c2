//! 4-bit product-quantization codes with a fast-scan scanner: the IVF index's `codes = "pq4"` (format in
//! docs/model-repository.md, bound in [`super::ivf`]).
//!
//! An item's residual to its list's centroid is cut into `M` sub-vectors of `dim / M` values; sub-quantizer `m`
//! codes its sub-vector as the nearest of 16 centroids (`codebooks[m]`), 4 bits. A list's items are stored in
//! blocks of [`BLOCK`] = 32 items; a block holds `M / 2` groups of 32 bytes, group `p` for sub-quantizers `2p` and
//! `2p + 1`:
//!
//! ```text
//! byte t < 16:  low nibble = code of item t for 2p,        high nibble = code of item t + 16 for 2p
//! byte t ≥ 16:  low nibble = code of item t − 16 for 2p+1, high nibble = code of item t for 2p+1
//! ```
//!
//! so one 256-bit load of a group, masked to its low (or high) nibbles, is the index vector of a byte shuffle
//! (`_mm256_shuffle_epi8`) whose 128-bit halves hold the 16-entry tables of `2p` and `2p + 1`: one instruction
//! looks up 32 items' table entries. AVX-512BW does two groups per instruction. A query's tables ([`Lut`]) are its
//! inner products with every sub-centroid, quantized to u8 with one step `delta` shared by all sub-quantizers and
//! an offset per sub-quantizer, so an item's sum of `M` table entries (at most `M · 255`, kept in u16 lanes; `M ≤
//! 256`) times `delta`, plus the offsets, approximates its residual's inner product with the query. Every ISA's
//! scanner returns the same integer sums (tested against a naive scalar sum).

use super::kernel::Isa;

/// Items per block of codes.
pub const BLOCK: usize = 32;
/// Centroids per sub-quantizer.
pub const CENTROIDS: usize = 16;
/// The most sub-quantizers: `M · 255` must fit a u16 lane.
pub const MAX_M: usize = 256;

/// Bytes of one block's codes for `m` sub-quantizers.
pub const fn block_bytes(m: usize) -> usize {
    m / 2 * BLOCK
}

/// The code of item `item` (0..32) of a block for sub-quantizer `sub` (the layout in the module docs).
#[cfg(test)]
pub fn code_at(block: &[u8], sub: usize, item: usize) -> u8 {
    let group = &block[sub / 2 * BLOCK..][..BLOCK];
    let byte = group[(sub % 2) * 16 + item % 16];
    if item < 16 { byte & 0x0f } else { byte >> 4 }
}

/// Packs 32 items' codes (`codes[item][sub]`, each below 16; items past the list's end all 0) into one block.
#[cfg(test)]
pub fn pack_block(codes: &[Vec<u8>; BLOCK], m: usize, out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + block_bytes(m), 0);
    let block = &mut out[start..];
    for (item, row) in codes.iter().enumerate() {
        for (sub, &c) in row.iter().enumerate().take(m) {
            debug_assert!(usize::from(c) < CENTROIDS);
            let at = sub / 2 * BLOCK + (sub % 2) * 16 + item % 16;
            block[at] |= if item < 16 { c } else { c << 4 };
        }
    }
}

/// One query's tables ([`Lut::fill`]): `table[m · 16 + c]` ≈ (`<q_m, codebooks[m][c]>` − `offset_m`) / `delta`, rounded.
#[derive(Clone, Debug, Default)]
pub struct Lut {
    pub table: Vec<u8>,
    /// The quantization step shared by every sub-quantizer (positive).
    pub delta: f64,
    /// `Σ_m offset_m`.
    pub offset: f64,
    /// A bound on `|delta · Σ_m table[m][c_m] + offset − Σ_m <q_m, codebooks[m][c_m]>|` for any codes: half a step
    /// per sub-quantizer, plus the float64 rounding of the products and quotients.
    pub error: f64,
}

impl Lut {
    /// The tables of `query` for `codebooks` (`[m][16][dim / m]`, flattened).
    pub fn fill(&mut self, query: &[f32], codebooks: &[f32], m: usize) {
        let dim = query.len();
        let sub = dim / m;
        debug_assert!(sub * m == dim && codebooks.len() == m * CENTROIDS * sub);
        let mut exact = [0.0f64; CENTROIDS];
        let mut lows = Vec::with_capacity(m);
        let mut floats = Vec::with_capacity(m * CENTROIDS);
        let (mut width, mut magnitude) = (0.0f64, 0.0f64);
        for s in 0..m {
            let q = &query[s * sub..(s + 1) * sub];
            let mut big = 0.0f64;
            for (c, e) in exact.iter_mut().enumerate() {
                let centroid = &codebooks[(s * CENTROIDS + c) * sub..][..sub];
                let (mut dot, mut abs) = (0.0f64, 0.0f64);
                for (&a, &b) in q.iter().zip(centroid) {
                    // A product of two f32 is exact in f64; only the sum rounds.
                    let p = f64::from(a) * f64::from(b);
                    dot += p;
                    abs += p.abs();
                }
                *e = dot;
                big = big.max(abs);
            }
            let lo = exact.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = exact.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            width = width.max(hi - lo);
            magnitude += big;
            lows.push(lo);
            floats.extend_from_slice(&exact);
        }
        let delta = if width > 0.0 && width.is_finite() {
            width / 255.0
        } else {
            1.0
        };
        self.table.clear();
        for (s, row) in floats.chunks_exact(CENTROIDS).enumerate() {
            self.table.extend(
                row.iter()
                    .map(|&t| ((t - lows[s]) / delta).round().clamp(0.0, 255.0) as u8),
            );
        }
        self.delta = delta;
        self.offset = lows.iter().sum();
        // f64 sums of `sub` products: γ₆₄(sub + 2) relative to Σ|products| (doubled, for the lows and offsets);
        // the quotient and rounding: half a step, plus 2⁻⁴⁰ of the 255 steps per sub-quantizer.
        let u64_ = f64::EPSILON / 2.0;
        self.error = m as f64 * delta * (0.5 + 255.0 * 2f64.powi(-40))
            + 4.0 * (sub as f64 + 2.0) * u64_ * magnitude;
    }
}

/// Appends, per block of `codes` (whole blocks of `m` sub-quantizers), its 32 items' sums of table entries
/// `Σ_m lut[m · 16 + code(item, m)]`, in item order, computed with the instructions of `isa` (AVX-512BW where the
/// CPU has it and `isa` is AVX-512; AVX2 for AVX2 and AVX-512F without BW; else portable code).
///
/// # Panics
/// If `m` is odd or above [`MAX_M`], `codes` is not whole blocks, `lut` does not hold `16 · m` entries, or the CPU
/// lacks `isa`.
pub fn scan(isa: Isa, codes: &[u8], m: usize, lut: &[u8], out: &mut Vec<[u16; BLOCK]>) {
    assert!(
        m >= 2 && m.is_multiple_of(2) && m <= MAX_M,
        "an even number of sub-quantizers, at most {MAX_M}"
    );
    assert!(
        codes.len().is_multiple_of(block_bytes(m)) && lut.len() == m * CENTROIDS,
        "whole blocks and 16 table entries per sub-quantizer"
    );
    match isa {
        Isa::Generic => scan_portable(codes, m, lut, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 => {
            if isa == Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512bw") {
                // SAFETY: the CPU supports AVX-512BW (checked just above), and so AVX2.
                unsafe { x86::scan_avx512(codes, m, lut, out) }
            } else {
                assert!(std::arch::is_x86_feature_detected!("avx2"), "no AVX2");
                // SAFETY: the CPU supports AVX2 (checked just above).
                unsafe { x86::scan_avx2(codes, m, lut, out) }
            }
        }
    }
}

fn scan_portable(codes: &[u8], m: usize, lut: &[u8], out: &mut Vec<[u16; BLOCK]>) {
    for block in codes.chunks_exact(block_bytes(m)) {
        let mut sums = [0u16; BLOCK];
        for (p, group) in block.chunks_exact(BLOCK).enumerate() {
            let (even, odd) = lut[2 * p * CENTROIDS..(2 * p + 2) * CENTROIDS].split_at(CENTROIDS);
            for i in 0..16 {
                let (a, b) = (group[i], group[16 + i]);
                sums[i] +=
                    u16::from(even[usize::from(a & 0x0f)]) + u16::from(odd[usize::from(b & 0x0f)]);
                sums[i + 16] +=
                    u16::from(even[usize::from(a >> 4)]) + u16::from(odd[usize::from(b >> 4)]);
            }
        }
        out.push(sums);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{BLOCK, CENTROIDS, block_bytes};

    /// Four vectors of 8 u16 sums as the block's 32, in order.
    #[inline(always)]
    fn sums(parts: [__m128i; 4]) -> [u16; BLOCK] {
        // SAFETY: both are 64 plain bytes; any bits are valid u16 values.
        unsafe { std::mem::transmute::<[__m128i; 4], [u16; BLOCK]>(parts) }
    }

    /// Splits a group's looked-up bytes into the even and odd items' sums: `all` accumulates the bytes as u16
    /// lanes (`even + 256 · odd`, wrapping), `odd` the odd bytes alone; `even = all − odd · 256` at the end, exact
    /// because every lane's even sum stays below 2¹⁶.
    #[target_feature(enable = "avx2")]
    pub(super) fn scan_avx2(codes: &[u8], m: usize, lut: &[u8], out: &mut Vec<[u16; BLOCK]>) {
        let bytes = block_bytes(m);
        let groups = m / 2;
        let low = _mm256_set1_epi8(0x0f);
        for block in codes.chunks_exact(bytes) {
            let (mut all_lo, mut odd_lo, mut all_hi, mut odd_hi) = (
                _mm256_setzero_si256(),
                _mm256_setzero_si256(),
                _mm256_setzero_si256(),
                _mm256_setzero_si256(),
            );
            for p in 0..groups {
                // SAFETY: the block holds `groups` groups of 32 bytes and the table 32 bytes per group (checked
                // by `scan`); unaligned loads.
                let (c, t) = unsafe {
                    (
                        _mm256_loadu_si256(block.as_ptr().add(p * BLOCK).cast()),
                        _mm256_loadu_si256(lut.as_ptr().add(p * 2 * CENTROIDS).cast()),
                    )
                };
                let lo = _mm256_shuffle_epi8(t, _mm256_and_si256(c, low));
                let hi = _mm256_shuffle_epi8(t, _mm256_and_si256(_mm256_srli_epi16(c, 4), low));
                all_lo = _mm256_add_epi16(all_lo, lo);
                odd_lo = _mm256_add_epi16(odd_lo, _mm256_srli_epi16(lo, 8));
                all_hi = _mm256_add_epi16(all_hi, hi);
                odd_hi = _mm256_add_epi16(odd_hi, _mm256_srli_epi16(hi, 8));
            }
            let fold = |all: __m256i, odd: __m256i| -> [__m128i; 2] {
                let even = _mm256_sub_epi16(all, _mm256_slli_epi16(odd, 8));
                // The two halves hold sub-quantizers 2p and 2p + 1 of the same items.
                let even = _mm_add_epi16(
                    _mm256_castsi256_si128(even),
                    _mm256_extracti128_si256(even, 1),
                );
                let odd = _mm_add_epi16(
                    _mm256_castsi256_si128(odd),
                    _mm256_extracti128_si256(odd, 1),
                );
                [_mm_unpacklo_epi16(even, odd), _mm_unpackhi_epi16(even, odd)]
            };
            let [a, b] = fold(all_lo, odd_lo);
            let [c, d] = fold(all_hi, odd_hi);
            out.push(sums([a, b, c, d]));
        }
    }

    /// [`scan_avx2`] two groups at a time: the four 128-bit quarters hold sub-quantizers `4r … 4r + 3`.
    #[target_feature(enable = "avx512bw,avx512f,avx2")]
    pub(super) fn scan_avx512(codes: &[u8], m: usize, lut: &[u8], out: &mut Vec<[u16; BLOCK]>) {
        let bytes = block_bytes(m);
        let groups = m / 2;
        let low = _mm512_set1_epi8(0x0f);
        for block in codes.chunks_exact(bytes) {
            let (mut all_lo, mut odd_lo, mut all_hi, mut odd_hi) = (
                _mm512_setzero_si512(),
                _mm512_setzero_si512(),
                _mm512_setzero_si512(),
                _mm512_setzero_si512(),
            );
            let mut p = 0;
            while p < groups {
                // SAFETY: as in `scan_avx2`; a last single group is loaded as 256 bits, zero-extended (a zero
                // table and zero codes add nothing).
                let (c, t) = unsafe {
                    if p + 2 <= groups {
                        (
                            _mm512_loadu_si512(block.as_ptr().add(p * BLOCK).cast()),
                            _mm512_loadu_si512(lut.as_ptr().add(p * 2 * CENTROIDS).cast()),
                        )
                    } else {
                        (
                            _mm512_zextsi256_si512(_mm256_loadu_si256(
                                block.as_ptr().add(p * BLOCK).cast(),
                            )),
                            _mm512_zextsi256_si512(_mm256_loadu_si256(
                                lut.as_ptr().add(p * 2 * CENTROIDS).cast(),
                            )),
                        )
                    }
                };
                let lo = _mm512_shuffle_epi8(t, _mm512_and_si512(c, low));
                let hi = _mm512_shuffle_epi8(t, _mm512_and_si512(_mm512_srli_epi16(c, 4), low));
                all_lo = _mm512_add_epi16(all_lo, lo);
                odd_lo = _mm512_add_epi16(odd_lo, _mm512_srli_epi16(lo, 8));
                all_hi = _mm512_add_epi16(all_hi, hi);
                odd_hi = _mm512_add_epi16(odd_hi, _mm512_srli_epi16(hi, 8));
                p += 2;
            }
            let quarters = |v: __m512i| -> __m128i {
                let half =
                    _mm256_add_epi16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
                _mm_add_epi16(
                    _mm256_castsi256_si128(half),
                    _mm256_extracti128_si256(half, 1),
                )
            };
            let fold = |all: __m512i, odd: __m512i| -> [__m128i; 2] {
                let even = quarters(_mm512_sub_epi16(all, _mm512_slli_epi16(odd, 8)));
                let odd = quarters(odd);
                [_mm_unpacklo_epi16(even, odd), _mm_unpackhi_epi16(even, odd)]
            };
            let [a, b] = fold(all_lo, odd_lo);
            let [c, d] = fold(all_hi, odd_hi);
            out.push(sums([a, b, c, d]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recall::tests::Rng;

    fn random_codes(rng: &mut Rng, items: usize, m: usize) -> Vec<Vec<u8>> {
        (0..items)
            .map(|_| (0..m).map(|_| (rng.next() % 16) as u8).collect())
            .collect()
    }

    fn pack(codes: &[Vec<u8>], m: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in codes.chunks(BLOCK) {
            let block: [Vec<u8>; BLOCK] =
                std::array::from_fn(|i| chunk.get(i).cloned().unwrap_or_else(|| vec![0; m]));
            pack_block(&block, m, &mut out);
        }
        out
    }

    #[test]
    fn the_packed_layout_is_the_documented_one_and_code_at_reads_it_back() {
        let mut rng = Rng(7);
        for m in [2, 4, 6, 32] {
            let codes = random_codes(&mut rng, 70, m);
            let packed = pack(&codes, m);
            assert_eq!(packed.len(), 3 * block_bytes(m));
            for (i, row) in codes.iter().enumerate() {
                let block = &packed[i / BLOCK * block_bytes(m)..][..block_bytes(m)];
                let item = i % BLOCK;
                for (s, &c) in row.iter().enumerate() {
                    assert_eq!(code_at(block, s, item), c, "m {m} item {i} sub {s}");
                    // The documented byte and nibble, spelled out.
                    let byte = block[s / 2 * 32
                        + if s % 2 == 0 {
                            item % 16
                        } else {
                            16 + item % 16
                        }];
                    let nibble = if item < 16 { byte & 15 } else { byte >> 4 };
                    assert_eq!(nibble, c);
                }
            }
            // Lanes past the 70 items hold code 0.
            let last = &packed[2 * block_bytes(m)..];
            for item in 70 - 2 * BLOCK..BLOCK {
                assert!((0..m).all(|s| code_at(last, s, item) == 0));
            }
        }
    }

    #[test]
    fn every_scanner_sums_the_tables_as_a_naive_scalar_loop_does() {
        let mut rng = Rng(11);
        for m in [2, 4, 6, 8, 30, 32, 64, 256] {
            let blocks = 5;
            let codes = random_codes(&mut rng, blocks * BLOCK, m);
            let packed = pack(&codes, m);
            for extreme in [false, true] {
                // Random tables, and all-255 tables (the largest sums: M · 255 must not wrap).
                let lut: Vec<u8> = (0..m * CENTROIDS)
                    .map(|_| {
                        if extreme {
                            255
                        } else {
                            (rng.next() % 256) as u8
                        }
                    })
                    .collect();
                let want: Vec<[u16; BLOCK]> = codes
                    .chunks(BLOCK)
                    .map(|items| {
                        std::array::from_fn(|i| {
                            (0..m)
                                .map(|s| u16::from(lut[s * CENTROIDS + usize::from(items[i][s])]))
                                .sum()
                        })
                    })
                    .collect();
                for isa in Isa::available() {
                    let mut got = vec![[1u16; BLOCK]];
                    scan(isa, &packed, m, &lut, &mut got);
                    assert_eq!(&got[1..], &want[..], "{isa:?} m {m} extreme {extreme}");
                    assert_eq!(got[0], [1u16; BLOCK], "appends");
                }
            }
        }
    }

    #[test]
    fn the_quantized_tables_are_within_their_error_of_the_exact_sums() {
        let mut rng = Rng(3);
        for (dim, m) in [(8, 4), (16, 8), (12, 6), (64, 32)] {
            let sub = dim / m;
            let books: Vec<f32> = (0..m * CENTROIDS * sub).map(|_| rng.unit()).collect();
            let query: Vec<f32> = (0..dim).map(|_| rng.unit() * 3.0).collect();
            let mut lut = Lut::default();
            lut.fill(&query, &books, m);
            assert!(lut.delta > 0.0 && lut.error > 0.0);
            for _ in 0..200 {
                let codes: Vec<usize> = (0..m).map(|_| (rng.next() % 16) as usize).collect();
                let exact: f64 = codes
                    .iter()
                    .enumerate()
                    .map(|(s, &c)| {
                        (0..sub)
                            .map(|j| {
                                f64::from(query[s * sub + j])
                                    * f64::from(books[(s * CENTROIDS + c) * sub + j])
                            })
                            .sum::<f64>()
                    })
                    .sum();
                let sum: u32 = codes
                    .iter()
                    .enumerate()
                    .map(|(s, &c)| u32::from(lut.table[s * CENTROIDS + c]))
                    .sum();
                let approx = lut.delta * f64::from(sum) + lut.offset;
                assert!(
                    (approx - exact).abs() <= lut.error,
                    "dim {dim}: |{approx} − {exact}| > {}",
                    lut.error
                );
            }
        }
        // A zero query: every table entry 0, a positive step, no error beyond rounding.
        let mut lut = Lut::default();
        lut.fill(&[0.0; 8], &vec![1.0; 4 * CENTROIDS * 2], 4);
        assert!(lut.table.iter().all(|&t| t == 0) && lut.delta == 1.0 && lut.offset == 0.0);
    }
}
