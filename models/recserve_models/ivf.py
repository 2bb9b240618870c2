"""The IVF index of a LightGCN (two-tower) version: k-means centroids, items per list as int8 codes, and what the
server needs to re-rank exactly (docs/model-repository.md, "IVF index"; the search is `src/recall/ivf.rs`).

    build_index(version_dir, nlist=4096)   # writes ivf.safetensors, adds [recall.index] to model.toml

Steps: k-means (Lloyd, squared L2, on a random sample of the items) gives `nlist` centroids; every item goes to
its nearest centroid; each list's items (ascending id) are laid out in panels of 16 items, dimension-major, as
the server's kernels read them; each item row is coded as fused row-wise int8 (the table quantizer of
`quantize.py`), and carries `err`, a bound such that for any query `q` the server's exact f32 score and its f32
code-domain score differ by at most `err · ‖q‖₁`:

    err = (max_j |x_j − (c_j·scale + bias)| + 2·γ(dim + 2)·(R + A)) · (1 + 2⁻¹⁰),   γ(n) = n·u / (1 − n·u),
    u = 2⁻²⁴, A = |bias| + 255·|scale|, R = max_j |x_j| (fp32/fp16 tables) or |bias_t| + 255·|scale_t| (int8)

(the quantization error, plus the f32 rounding of both scores; computed in float64, rounded up to float32).
The file records what it was built from (items, dim, storage, and `table_checksum` of the item tensor), and the
server refuses it when any of these no longer matches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from . import files, pq4
from .model_toml import LightGCNToml, TableSpec
from .progress import Progress
from .quantize import INT8_TRAILER, quantize_rowwise_int8

FORMAT = "recserve-ivf"
FORMAT_VERSION = "1"
INDEX_FILE = "ivf.safetensors"
LANES = 16  # items per panel (src/recall/catalogue.rs)
PADDING = np.uint32(2**32 - 1)  # the id of a lane past a list's last item
TENSORS = ("centroids", "list_offsets", "list_sizes", "ids", "codes", "scale", "bias", "err")
PQ4_TENSORS = ("centroids", "list_offsets", "list_sizes", "ids", "codes", "codebooks", "err")
CODES = ("int8", "pq4")
_U = 2.0**-24


class IndexError_(ValueError):
    """An index that cannot be built, or a file that does not match its version."""


def gamma(n: int) -> float:
    """The relative bound of `n` chained float32 roundings."""
    return n * _U / (1 - n * _U)


def table_checksum(stored: np.ndarray) -> str:
    """`Σ_i w_i·(2i + 1) mod 2⁶⁴` over the tensor's bytes as little-endian u64 words (the last zero-padded), as 16
    hex digits: what the server computes over the mapped item tensor (`table_checksum` in src/recall/ivf.rs)."""
    raw = np.ascontiguousarray(stored).view(np.uint8).reshape(-1)
    pad = (-raw.size) % 8
    if pad:
        raw = np.concatenate([raw, np.zeros(pad, np.uint8)])
    words = raw.view("<u8")
    total = np.uint64(0)
    step = 1 << 22
    with np.errstate(over="ignore"):
        for start in range(0, words.size, step):
            w = words[start : start + step]
            weights = np.arange(start, start + w.size, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
            total = np.uint64(total + np.sum(w * weights, dtype=np.uint64))
    return f"{int(total):016x}"


def nearest(
    x: np.ndarray,
    centroids: np.ndarray,
    chunk: int | None = None,
    progress: Progress | None = None,
) -> np.ndarray:
    """For every row of `x`, the index of its nearest centroid by squared L2 (ties: the lower index). Rows are
    taken `chunk` at a time (default: as many as keep the distance block near 64 MB, so memory does not grow with
    the catalogue); `progress` advances by the rows of each chunk."""
    c32 = np.ascontiguousarray(centroids, dtype=np.float32)
    half = np.float32(0.5) * np.einsum("ij,ij->i", c32, c32)
    if chunk is None:
        chunk = max(256, (1 << 24) // max(1, c32.shape[0]))
    out = np.empty(x.shape[0], dtype=np.int64)
    for start in range(0, x.shape[0], chunk):
        block = np.asarray(x[start : start + chunk], dtype=np.float32)
        # ‖x − c‖² = ‖x‖² − 2·(x·c − ‖c‖²/2); ‖x‖² is the same for every c, and scaling by −2 is exact in float32,
        # so the largest x·c − ‖c‖²/2 is the smallest ‖c‖² − 2x·c, ties included.
        scores = block @ c32.T
        scores -= half
        out[start : start + chunk] = np.argmax(scores, axis=1)
        if progress:
            progress.advance(len(block))
    return out


def kmeans(
    x: np.ndarray,
    nlist: int,
    iterations: int = 10,
    seed: int = 0,
    report: Callable[[str], None] | None = None,
) -> np.ndarray:
    """Lloyd's k-means on the rows of `x` (float32 [n, dim]): `nlist` initial centroids are distinct rows drawn
    with `seed`; each iteration assigns rows to their nearest centroid (`nearest`) and moves each centroid to the
    mean of its rows (float64 sums). A centroid left without rows takes the place of half of the largest cluster: it
    becomes that cluster's centroid moved by 1e-4 of its scale, the other copy moved the other way."""
    n = x.shape[0]
    if not 1 <= nlist <= n:
        raise IndexError_(f"nlist must be from 1 to the {n} training rows, not {nlist}")
    rng = np.random.default_rng(seed)
    centroids = x[np.sort(rng.choice(n, size=nlist, replace=False))].astype(np.float64)
    steps = Progress("k-means iterations", total=iterations, report=report) if report else None
    for _ in range(iterations):
        assign = nearest(x, centroids)
        counts = np.bincount(assign, minlength=nlist)
        sums = np.zeros_like(centroids)
        _add_sorted(sums, assign, x)
        filled = counts > 0
        centroids[filled] = sums[filled] / counts[filled, None]
        for empty in np.flatnonzero(~filled):
            big = int(np.argmax(counts))
            shift = 1e-4 * (np.abs(centroids[big]) + 1e-12)
            centroids[empty] = centroids[big] + shift
            centroids[big] = centroids[big] - shift
            counts[big] = counts[big] // 2
            counts[empty] = counts[big]
        if steps:
            steps.advance(note=f"{int((~filled).sum())} empty lists split")
    return centroids.astype(np.float32)


def _add_sorted(sums: np.ndarray, assign: np.ndarray, x: np.ndarray) -> None:
    order = np.argsort(assign, kind="stable")
    sorted_assign = assign[order]
    starts = np.flatnonzero(np.r_[True, sorted_assign[1:] != sorted_assign[:-1]])
    sums[sorted_assign[starts]] = np.add.reduceat(x[order].astype(np.float64), starts, axis=0)


@dataclass(frozen=True)
class Codes:
    """Fused row-wise int8 codes of every item, and each item's score bound `err`."""

    codes: np.ndarray  # uint8 [items, dim]
    scale: np.ndarray  # float32 [items]
    bias: np.ndarray  # float32 [items]
    err: np.ndarray  # float32 [items]


def encode(values: np.ndarray, spec: TableSpec, stored: np.ndarray, block: int = 1 << 18) -> Codes:
    """The int8 codes of `values` (the item table as the server decodes it, float32 [items, dim]) and each row's
    bound, for an item table stored as `stored` under `spec` (see the module docs); `block` rows at a time, so the
    float64 intermediates stay a few hundred MB whatever the catalogue."""
    rows, dim = values.shape
    out = Codes(
        np.empty((rows, dim), np.uint8), np.empty(rows, np.float32), np.empty(rows, np.float32), np.empty(rows, np.float32)
    )
    for a in range(0, rows, block):
        b = min(rows, a + block)
        part = _encode_block(np.asarray(values[a:b], dtype=np.float32), spec, np.asarray(stored[a:b]))
        for name in ("codes", "scale", "bias", "err"):
            getattr(out, name)[a:b] = getattr(part, name)
    return out


def exact_ranges(values: np.ndarray, spec: TableSpec, stored: np.ndarray) -> np.ndarray:
    """Per row, float64: what its exact f32 score ranges over, `max_j |x_j|`, or `|bias| + 255·|scale|` of an int8
    row (`stored` holds the rows' fused codes and trailer)."""
    rows, dim = values.shape
    if spec.storage == "int8":
        t = np.ascontiguousarray(stored[:, dim : dim + INT8_TRAILER])
        t_scale = t[:, :4].copy().view("<f4").reshape(rows).astype(np.float64)
        t_bias = t[:, 4:].copy().view("<f4").reshape(rows).astype(np.float64)
        return np.abs(t_bias) + 255.0 * np.abs(t_scale)
    return np.abs(values.astype(np.float64)).max(axis=1)


def _encode_block(values: np.ndarray, spec: TableSpec, stored: np.ndarray) -> Codes:
    rows, dim = values.shape
    fused = quantize_rowwise_int8(spec.name, values)
    codes = fused[:, :dim]
    trailer = np.ascontiguousarray(fused[:, dim:])
    scale = trailer[:, :4].copy().view("<f4").reshape(rows)
    bias = trailer[:, 4:].copy().view("<f4").reshape(rows)
    decoded = codes.astype(np.float64) * scale.astype(np.float64)[:, None] + bias.astype(np.float64)[:, None]
    diff = np.abs(values.astype(np.float64) - decoded).max(axis=1)
    exact_range = exact_ranges(values, spec, stored)
    approx_range = np.abs(bias.astype(np.float64)) + 255.0 * np.abs(scale.astype(np.float64))
    err64 = (diff + 2.0 * gamma(dim + 2) * (exact_range + approx_range)) * (1.0 + 2.0**-10)
    err = err64.astype(np.float32)
    err = np.where(err.astype(np.float64) < err64, np.nextafter(err, np.float32(np.inf)), err).astype(np.float32)
    return Codes(np.ascontiguousarray(codes), scale, bias, err)


def layout(assign: np.ndarray, nlist: int, codes: Codes, block: int = 1 << 20) -> dict[str, np.ndarray]:
    """The index tensors (all but `centroids`) for items assigned to lists by `assign` (int64 [items]); codes are
    placed `block` items at a time."""
    items, dim = codes.codes.shape
    sizes, offsets, order, lane, ids = _lanes(assign, nlist, LANES)
    total = ids.size
    per_lane = {}
    for name in ("scale", "bias", "err"):
        column = np.zeros(total, dtype=np.float32)
        column[lane] = getattr(codes, name)[order]
        per_lane[name] = column.reshape(-1, LANES)
    # Codes go straight into their panels ([panel, dim, lane]), a block of items at a time: no second copy of them.
    panel_codes = np.zeros((total // LANES, dim, LANES), dtype=np.uint8)
    by_lane = panel_codes.transpose(0, 2, 1)  # a view: [panel, lane, dim]
    for a in range(0, items, block):
        at = lane[a : a + block]
        by_lane[at // LANES, at % LANES] = codes.codes[order[a : a + block]]
    return {
        "list_offsets": offsets,
        "list_sizes": sizes,
        "ids": ids,
        "codes": panel_codes,
        **per_lane,
    }


def _lanes(assign: np.ndarray, nlist: int, group: int) -> tuple[np.ndarray, ...]:
    """Where the items assigned to lists by `assign` go, in groups of `group` lanes: list sizes, list offsets (in
    groups), the items by list (ascending id within a list), the lane of each of those, and the id of each lane."""
    items = assign.size
    sizes = np.bincount(assign, minlength=nlist).astype(np.int64)
    offsets = np.zeros(nlist + 1, dtype=np.int64)
    np.cumsum((sizes + group - 1) // group, out=offsets[1:])
    order = np.argsort(assign, kind="stable")
    list_start = np.zeros(nlist, dtype=np.int64)
    np.cumsum(sizes[:-1], out=list_start[1:])
    sorted_list = assign[order]
    rank = np.arange(items, dtype=np.int64) - list_start[sorted_list]
    lane = offsets[sorted_list] * group + rank
    ids = np.full(int(offsets[-1]) * group, PADDING, dtype=np.uint32)
    ids[lane] = order.astype(np.uint32)
    return sizes, offsets, order, lane, ids


def layout_pq4(
    assign: np.ndarray,
    nlist: int,
    values: np.ndarray,
    spec: TableSpec,
    stored: np.ndarray,
    centroids: np.ndarray,
    books: np.ndarray,
    block: int = 1 << 18,
) -> dict[str, np.ndarray]:
    """The PQ4 index tensors (all but `centroids`): each item's residual to its centroid coded with `books`, in
    blocks of 32 lanes, and its bound (`pq4` module docs); `block` items at a time."""
    items, dim = values.shape
    m = books.shape[0]
    sizes, offsets, order, lane, ids = _lanes(assign, nlist, pq4.BLOCK)
    lane_of = np.empty(items, dtype=np.int64)
    lane_of[order] = lane
    lane_codes = np.zeros((ids.size, m), dtype=np.uint8)
    err = np.zeros(ids.size, dtype=np.float32)
    for a in range(0, items, block):
        b = min(items, a + block)
        x = np.asarray(values[a:b], dtype=np.float32)
        codes = pq4.encode(x - centroids[assign[a:b]], books)
        # What the codes leave, measured in float64 against the float32 centroid the server adds back.
        exact = x.astype(np.float64) - centroids[assign[a:b]].astype(np.float64)
        left = np.sqrt(((exact - pq4.decode(codes, books)) ** 2).sum(axis=1))
        lane_codes[lane_of[a:b]] = codes
        err[lane_of[a:b]] = pq4.bound(left, exact_ranges(x, spec, np.asarray(stored[a:b])), dim)
    return {
        "list_offsets": offsets,
        "list_sizes": sizes,
        "ids": ids,
        "codes": pq4.pack(lane_codes),
        "codebooks": books,
        "err": err.reshape(-1, pq4.BLOCK),
    }


@dataclass(frozen=True)
class Built:
    """What `build_index` did."""

    path: Path
    items: int
    nlist: int
    trained_on: int
    seconds: float
    bytes: int
    largest_list: int


def build_file(
    path: Path,
    spec: TableSpec,
    stored: np.ndarray,
    values: np.ndarray,
    nlist: int,
    sample: int,
    iterations: int = 10,
    seed: int = 0,
    report: Callable[[str], None] | None = None,
    codes: str = "int8",
    pq_m: int | None = None,
) -> Built:
    """Writes the index of the item table `spec` (its tensor `stored`, decoded `values`) to `path`, its items
    coded as `codes` ("int8", or "pq4" with `pq_m` sub-quantizers, default `pq4.default_m`)."""
    started = time.monotonic()
    items, dim = values.shape
    if not 1 <= nlist <= items:
        raise IndexError_(f"--nlist must be from 1 to the {items} items of item table {spec.name!r}, not {nlist}")
    if codes not in CODES:
        raise IndexError_(f"--codes must be one of {', '.join(CODES)}, not {codes!r}")
    if codes == "pq4":
        pq_m = pq4.default_m(dim) if pq_m is None else pq_m
        pq4.check_m(pq_m, dim)
    rng = np.random.default_rng(seed)
    trained_on = min(items, max(sample, nlist))
    train = values if trained_on == items else values[np.sort(rng.choice(items, size=trained_on, replace=False))]
    if report:
        report(f"k-means: {nlist} lists from {trained_on} of {items} items, {iterations} iterations")
    centroids = kmeans(train, nlist, iterations, seed, report)
    if report:
        report(f"assigning {items} items to their nearest centroid")
    progress = Progress("items assigned", total=items, report=report) if report else None
    assign = nearest(values, centroids, progress=progress)
    if codes == "pq4":
        assert pq_m is not None
        sample = np.sort(rng.choice(items, size=min(items, max(sample, 256 * pq4.CENTROIDS)), replace=False))
        residuals = np.asarray(values[sample], dtype=np.float32) - centroids[assign[sample]]
        books = pq4.train(residuals, pq_m, iterations, seed, report)
        if report:
            report(f"coding {items} items as pq4 ({pq_m} sub-quantizers) and laying out {nlist} lists")
        tensors = layout_pq4(assign, nlist, values, spec, stored, centroids, books)
    else:
        if report:
            report(f"coding {items} items as int8 and laying out {nlist} lists")
        tensors = layout(assign, nlist, encode(values, spec, stored))
    del assign
    if report:
        report(f"checksum of the item table and writing {path}")
    tensors["centroids"] = centroids
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "codes": codes,
        **({"pq_m": str(pq_m)} if codes == "pq4" else {}),
        "items": str(items),
        "dim": str(dim),
        "nlist": str(nlist),
        "item_table": spec.name,
        "item_storage": spec.storage,
        "item_checksum": table_checksum(stored),
        "trained_on": str(trained_on),
        "iterations": str(iterations),
        "seed": str(seed),
    }
    save_file(tensors, str(path), metadata=metadata)
    files.finish(path)  # save_file writes 0600
    sizes = tensors["list_sizes"]
    return Built(
        path, items, nlist, trained_on, time.monotonic() - started, path.stat().st_size, int(sizes.max(initial=0))
    )


def verify(path: Path, spec: TableSpec, stored: np.ndarray, values: np.ndarray) -> int:
    """Checks an index file against the item table as the server's loader does, and also that every `err` bounds
    its row's quantization error; returns `nlist`. Raises `IndexError_` naming the file and the mismatch."""

    def fail(problem: str) -> IndexError_:
        return IndexError_(f"{path}: {problem}")

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (OSError, Exception) as e:  # safetensors raises its own error types
        raise fail(f"is not a readable safetensors file: {e}") from e
    stale = "the index is stale or for another table: rebuild it with `python -m recserve_models index`"
    for key, want in (("format", FORMAT), ("format_version", FORMAT_VERSION)):
        if meta.get(key) != want:
            raise fail(f"has {key} {meta.get(key)!r} in its metadata, not {want!r}")
    codes_kind = meta.get("codes")
    if codes_kind not in CODES:
        raise fail(f"has codes {codes_kind!r} in its metadata, not one of {', '.join(CODES)}")
    rows, dim = values.shape
    for key, want in (("items", str(rows)), ("dim", str(dim)), ("item_storage", spec.storage)):
        if meta.get(key) != want:
            raise fail(f"was built for {key} {meta.get(key)!r}, but item table {spec.name!r} has {want!r}; {stale}")
    checksum = table_checksum(stored)
    if meta.get("item_checksum") != checksum:
        raise fail(
            f"records item table checksum {meta.get('item_checksum')}, but item table {spec.name!r} has checksum "
            f"{checksum}: the table changed since the index was built; {stale}"
        )
    try:
        nlist = int(meta.get("nlist", ""))
    except ValueError as e:
        raise fail(f"has nlist {meta.get('nlist')!r} in its metadata, not a count") from e
    missing = [t for t in (PQ4_TENSORS if codes_kind == "pq4" else TENSORS) if t not in tensors]
    if missing:
        raise fail(f"has no tensor {missing[0]!r}")
    group = pq4.BLOCK if codes_kind == "pq4" else LANES
    sizes, offsets, ids = tensors["list_sizes"], tensors["list_offsets"], tensors["ids"]
    if sizes.shape != (nlist,) or offsets.shape != (nlist + 1,) or offsets[0] != 0:
        raise fail(f"list_sizes / list_offsets do not describe {nlist} lists")
    if not np.array_equal(np.diff(offsets), (sizes + group - 1) // group) or sizes.sum() != rows:
        raise fail("list_offsets do not match list_sizes, or the lists do not hold every item once")
    if codes_kind == "pq4":
        _verify_pq4(fail, meta, tensors, nlist, values, spec, stored)
        return nlist
    panels = int(offsets[-1])
    shapes = {
        "centroids": (nlist, dim),
        "ids": (panels * LANES,),
        "codes": (panels, dim, LANES),
        "scale": (panels, LANES),
        "bias": (panels, LANES),
        "err": (panels, LANES),
    }
    for name, shape in shapes.items():
        if tensors[name].shape != shape:
            raise fail(f"tensor {name!r} has shape {list(tensors[name].shape)}, expected {list(shape)}")
    lane_in_list = np.arange(panels * LANES) - np.repeat(offsets[:-1] * LANES, (offsets[1:] - offsets[:-1]) * LANES)
    used = lane_in_list < np.repeat(sizes, (offsets[1:] - offsets[:-1]) * LANES)
    if np.any(ids[~used] != PADDING) or not np.array_equal(np.sort(ids[used]), np.arange(rows, dtype=np.uint32)):
        raise fail("tensor 'ids' does not hold every item exactly once, with padding lanes marked")
    codes = tensors["codes"].transpose(0, 2, 1).reshape(-1, dim)[used]
    scale = tensors["scale"].reshape(-1)[used].astype(np.float64)
    bias = tensors["bias"].reshape(-1)[used].astype(np.float64)
    err = tensors["err"].reshape(-1)[used].astype(np.float64)
    item = ids[used].astype(np.int64)
    decoded = codes.astype(np.float64) * scale[:, None] + bias[:, None]
    diff = np.abs(values[item].astype(np.float64) - decoded).max(axis=1)
    bad = np.flatnonzero(~(err >= diff))
    if bad.size:
        raise fail(f"item {int(item[bad[0]])}'s err {err[bad[0]]} does not bound its code error {diff[bad[0]]}")
    return nlist


def _verify_pq4(
    fail: Callable[[str], IndexError_],
    meta: dict[str, str],
    tensors: dict[str, np.ndarray],
    nlist: int,
    values: np.ndarray,
    spec: TableSpec,
    stored: np.ndarray,
) -> None:
    """`verify` of a PQ4 file: `pq_m`, the shapes, the ids, and that every `err` bounds its item's code error."""
    rows, dim = values.shape
    try:
        m = int(meta.get("pq_m", ""))
        pq4.check_m(m, dim)
    except (ValueError, IndexError_) as e:
        raise fail(f"has pq_m {meta.get('pq_m')!r} in its metadata: it must be even, from 2 to 256, and divide dim") from e
    offsets, sizes, ids = tensors["list_offsets"], tensors["list_sizes"], tensors["ids"]
    blocks = int(offsets[-1])
    shapes = {
        "centroids": (nlist, dim),
        "ids": (blocks * pq4.BLOCK,),
        "codes": (blocks, m // 2, pq4.BLOCK),
        "codebooks": (m, pq4.CENTROIDS, dim // m),
        "err": (blocks, pq4.BLOCK),
    }
    for name, shape in shapes.items():
        if tensors[name].shape != shape:
            raise fail(f"tensor {name!r} has shape {list(tensors[name].shape)}, expected {list(shape)}")
    spans = (offsets[1:] - offsets[:-1]) * pq4.BLOCK
    lane_in_list = np.arange(blocks * pq4.BLOCK) - np.repeat(offsets[:-1] * pq4.BLOCK, spans)
    used = lane_in_list < np.repeat(sizes, spans)
    if np.any(ids[~used] != PADDING) or not np.array_equal(np.sort(ids[used]), np.arange(rows, dtype=np.uint32)):
        raise fail("tensor 'ids' does not hold every item exactly once, with padding lanes marked")
    item = ids[used].astype(np.int64)
    list_of = np.repeat(np.arange(nlist), spans)[used]
    codes = pq4.unpack(tensors["codes"])[used]
    decoded = tensors["centroids"][list_of].astype(np.float64) + pq4.decode(codes, tensors["codebooks"])
    left = np.sqrt(((values[item].astype(np.float64) - decoded) ** 2).sum(axis=1))
    err = tensors["err"].reshape(-1)[used].astype(np.float64)
    bad = np.flatnonzero(~(err >= left))
    if bad.size:
        raise fail(f"item {int(item[bad[0]])}'s err {err[bad[0]]} does not bound its code error {left[bad[0]]}")


def build_index(
    directory: Path,
    model: LightGCNToml,
    stored: np.ndarray,
    values: np.ndarray,
    nlist: int,
    sample: int,
    iterations: int,
    seed: int,
    report: Callable[[str], None] | None = None,
    file: str = INDEX_FILE,
    codes: str = "int8",
    pq_m: int | None = None,
) -> Built:
    """Writes `file` into the version `directory` for its item table (see `build_file`)."""
    spec = model.table(model.recall.item_table)
    return build_file(directory / file, spec, stored, values, nlist, sample, iterations, seed, report, codes, pq_m)
