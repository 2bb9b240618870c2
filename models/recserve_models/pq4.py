"""4-bit product-quantization codes of the IVF index (`index --codes pq4`; layout and bound in
docs/model-repository.md, the scanner `src/recall/pq4.rs`).

Each item is coded as its residual `x − c` to its list's centroid `c`, cut into `m` sub-vectors of `dim / m`
values; sub-quantizer `s` has 16 centroids (k-means on the residuals of a sample) and codes each sub-vector as the
nearest, 4 bits. A list's items lie in blocks of 32; block `b` holds `m / 2` groups of 32 bytes, group `p` for
sub-quantizers `2p` and `2p + 1`:

    byte t < 16:  low nibble = code of item t for 2p,        high nibble = code of item t + 16 for 2p
    byte t ≥ 16:  low nibble = code of item t − 16 for 2p+1, high nibble = code of item t for 2p+1

Each item carries `err`, such that for any query `q` the server's exact f32 score lies within `err · ‖q‖₂` of
`<q, c + x̂>` (`x̂` its decoded residual):

    err = (‖x − c − x̂‖₂ + 2·γ(dim + 2)·√dim·R) · (1 + 2⁻¹⁰)

(Cauchy–Schwarz on the code error, plus the f32 rounding of the exact score; `R` as for int8 codes; computed in
float64, rounded up to float32). The server adds the error of its u8 look-up tables per query.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import ivf

BLOCK = 32  # items per block (src/recall/pq4.rs)
CENTROIDS = 16  # per sub-quantizer
MAX_M = 256  # m · 255 must fit the server's u16 sums


def default_m(dim: int) -> int:
    """`dim / 2` sub-quantizers (2 values each) when that is even, else the most even divisor of `dim` below it;
    raises `IndexError_` when `dim` has no even divisor."""
    for m in range(min(dim // 2, MAX_M), 1, -1):
        if m % 2 == 0 and dim % m == 0:
            return m
    if dim % 2 == 0 and dim <= MAX_M:
        return dim  # dim 2: one value per sub-quantizer
    raise ivf.IndexError_(f"pq4 codes need an even number of sub-quantizers dividing dim {dim}")


def check_m(m: int, dim: int) -> None:
    """Raises `IndexError_` unless `m` is even, from 2 to 256 and divides `dim`."""
    if m < 2 or m % 2 or m > MAX_M or dim % m:
        raise ivf.IndexError_(f"--pq-m must be even, from 2 to {MAX_M}, and divide dim {dim}, not {m}")


def train(
    residuals: np.ndarray, m: int, iterations: int, seed: int, report: Callable[[str], None] | None = None
) -> np.ndarray:
    """The codebooks (float32 [m, 16, dim / m]): k-means (`ivf.kmeans`) on each sub-vector of `residuals` (float32
    [n, dim]). With fewer than 16 distinct rows, the missing centroids repeat the first one."""
    n, dim = residuals.shape
    sub = dim // m
    books = np.zeros((m, CENTROIDS, sub), dtype=np.float32)
    if report:
        report(f"pq4: {m} sub-quantizers of 16 centroids from {n} residuals, {iterations} iterations")
    for s in range(m):
        part = np.ascontiguousarray(residuals[:, s * sub : (s + 1) * sub], dtype=np.float32)
        distinct = np.unique(part, axis=0)
        if len(distinct) <= CENTROIDS:
            books[s, : len(distinct)] = distinct
            books[s, len(distinct) :] = distinct[0]
        else:
            books[s] = ivf.kmeans(part, CENTROIDS, iterations, seed + s)
    return books


def encode(residuals: np.ndarray, books: np.ndarray) -> np.ndarray:
    """Each row's codes (uint8 [n, m]): the nearest centroid of each sub-vector by squared L2."""
    n = residuals.shape[0]
    m, _, sub = books.shape
    codes = np.empty((n, m), dtype=np.uint8)
    for s in range(m):
        codes[:, s] = ivf.nearest(residuals[:, s * sub : (s + 1) * sub], books[s])
    return codes


def decode(codes: np.ndarray, books: np.ndarray) -> np.ndarray:
    """The residuals the codes (uint8 [n, m]) stand for, float64 [n, dim]."""
    m = books.shape[0]
    return np.concatenate([books[s][codes[:, s]].astype(np.float64) for s in range(m)], axis=1)


def bound(left: np.ndarray, exact_range: np.ndarray, dim: int) -> np.ndarray:
    """`err` (see the module docs) from the code error `left` and each row's exact range `R`, rounded up to
    float32."""
    err64 = (left + 2.0 * ivf.gamma(dim + 2) * np.sqrt(dim) * exact_range) * (1.0 + 2.0**-10)
    err = err64.astype(np.float32)
    return np.where(err.astype(np.float64) < err64, np.nextafter(err, np.float32(np.inf)), err).astype(np.float32)


def pack(codes: np.ndarray) -> np.ndarray:
    """Lane codes (uint8 [blocks · 32, m], padding lanes 0) as blocks (uint8 [blocks, m / 2, 32]) in the documented
    layout."""
    lanes, m = codes.shape
    by_block = codes.reshape(lanes // BLOCK, BLOCK, m)
    nibbles = by_block[:, :16, :] | (by_block[:, 16:, :] << 4)  # [blocks, t, m]
    pairs = nibbles.reshape(lanes // BLOCK, 16, m // 2, 2)  # [blocks, t, p, half]
    return np.ascontiguousarray(pairs.transpose(0, 2, 3, 1).reshape(lanes // BLOCK, m // 2, BLOCK))


def unpack(blocks: np.ndarray) -> np.ndarray:
    """The inverse of `pack`: uint8 [blocks, m / 2, 32] to lane codes uint8 [blocks · 32, m]."""
    count, pairs, _ = blocks.shape
    halves = blocks.reshape(count, pairs, 2, 16).transpose(0, 3, 1, 2).reshape(count, 16, 2 * pairs)
    return np.concatenate([halves & 0x0F, halves >> 4], axis=1).reshape(count * BLOCK, 2 * pairs)
