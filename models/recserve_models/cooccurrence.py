"""The item co-occurrence table of a ranking model (`[cooccurrence]` in model.toml) and the `cooccurrence`
candidate feature it gives.

**The file** (docs/model-repository.md): a safetensors file with the CSR tensors `indptr` I64 [items + 1],
`indices` I64 [nnz] and `weights` F32 [nnz]; row `h` holds the neighbours `c` of item `h` with their weights
`w(h→c)`, indices strictly increasing within a row, every index in `0..items`, every weight finite. `read`
checks exactly that.

**The feature** of a candidate `c` for a request with history `H`: `Σ_{h ∈ distinct(H), 0 ≤ h < items} w(h→c)`
(0 where `c` is not in row `h`), accumulated in float64 and rounded to float32 once, which is what the server
computes in a recall → rank pipeline. `feature` is the naive reference of one request; `features` computes it for
many users at once (a sparse product in float64, so its sums differ from the reference's by float64 rounding
only).

**The weights** `build` writes (the demo's choice, any finite weights are valid): cosine ItemKNN on the training
interactions, `w(h→c) = n(h, c) / sqrt(d_h · d_c)` for `c ≠ h`, where `n(h, c)` counts the users who have both
items and `d` is an item's training interactions; each row keeps its `neighbours` largest weights (ties: the
lower item id), so the table is bounded by `items · neighbours` entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import safe_open, save

from . import files

if TYPE_CHECKING:
    import scipy.sparse as sp  # imported where used: scipy is slow to import

INDPTR, INDICES, WEIGHTS = "indptr", "indices", "weights"


class CooccurrenceError(ValueError):
    """A co-occurrence file that breaks the format; the message names the file and the tensor."""


@dataclass(frozen=True)
class Cooccurrence:
    """The CSR table: row `h` is `indices[indptr[h]:indptr[h + 1]]` with `weights` alongside."""

    indptr: np.ndarray  # int64 [items + 1]
    indices: np.ndarray  # int64 [nnz]
    weights: np.ndarray  # float32 [nnz]

    @property
    def items(self) -> int:
        return len(self.indptr) - 1

    def matrix(self) -> sp.csr_matrix:
        """The table as a float64 items × items sparse matrix (the float32 weights, widened exactly)."""
        import scipy.sparse as sp

        return sp.csr_matrix(
            (self.weights.astype(np.float64), self.indices, self.indptr), shape=(self.items, self.items)
        )


def build(indptr: np.ndarray, indices: np.ndarray, items: int, neighbours: int, chunk: int = 2048) -> Cooccurrence:
    """Cosine ItemKNN on the user → items CSR (`indptr` [users + 1], `indices` sorted distinct items per user),
    each row cut to its `neighbours` largest weights."""
    import scipy.sparse as sp

    users = len(indptr) - 1
    x = sp.csr_matrix((np.ones(len(indices), np.float64), indices, indptr), shape=(users, items))
    xt = x.T.tocsr()
    degrees = np.bincount(indices, minlength=items).astype(np.float64)
    out_indptr = np.zeros(items + 1, np.int64)
    rows_indices: list[np.ndarray] = []
    rows_weights: list[np.ndarray] = []
    for start in range(0, items, chunk):
        counts = (xt[start : start + chunk] @ x).tocsr()  # co-occurrence counts n(h, c), exact in float64
        counts.sort_indices()
        for row in range(counts.shape[0]):
            h = start + row
            cols = counts.indices[counts.indptr[row] : counts.indptr[row + 1]].astype(np.int64)
            n = counts.data[counts.indptr[row] : counts.indptr[row + 1]]
            keep = cols != h
            cols, n = cols[keep], n[keep]
            w = n / np.sqrt(degrees[h] * degrees[cols])
            if len(cols) > neighbours:
                best = np.lexsort((cols, -w))[:neighbours]  # largest weight first, ties: lower id
                best.sort()  # cols is increasing, so sorted positions keep the row's indices increasing
                cols, w = cols[best], w[best]
            rows_indices.append(cols)
            rows_weights.append(w.astype(np.float32))
            out_indptr[h + 1] = out_indptr[h] + len(cols)
    empty_i, empty_w = np.zeros(0, np.int64), np.zeros(0, np.float32)
    return Cooccurrence(
        out_indptr,
        np.concatenate(rows_indices) if rows_indices else empty_i,
        np.concatenate(rows_weights) if rows_weights else empty_w,
    )


def feature(table: Cooccurrence, history: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """The `cooccurrence` feature of each candidate for one request's `history`, float32 [len(candidates)]: the
    naive reference of the server's sum."""
    out = np.zeros(len(candidates), np.float64)
    for h in np.unique(np.asarray(history, dtype=np.int64)):
        if not 0 <= h < table.items:
            continue
        row = table.indices[table.indptr[h] : table.indptr[h + 1]]
        weights = table.weights[table.indptr[h] : table.indptr[h + 1]]
        at = np.searchsorted(row, candidates)
        found = (at < len(row)) & (row[np.minimum(at, len(row) - 1)] == candidates)
        out[found] += weights[at[found]].astype(np.float64)
    return out.astype(np.float32)


def features(
    table: Cooccurrence, history_indptr: np.ndarray, history_indices: np.ndarray, users: np.ndarray,
    candidates: np.ndarray, *, matrix: sp.csr_matrix | None = None, chunk: int = 256,
) -> np.ndarray:  # fmt: skip
    """The feature of `candidates` [B, N] for the users `users` [B], whose histories are the rows of the CSR
    (`history_indptr`, `history_indices`, distinct items per row, all inside the table): float32 [B, N]."""
    import scipy.sparse as sp

    w = table.matrix() if matrix is None else matrix
    out = np.empty(candidates.shape, np.float32)
    for start in range(0, len(users), chunk):
        batch = users[start : start + chunk]
        lengths = history_indptr[batch + 1] - history_indptr[batch]
        cols = np.concatenate([history_indices[history_indptr[u] : history_indptr[u + 1]] for u in batch])
        rows = np.repeat(np.arange(len(batch)), lengths)
        h = sp.csr_matrix((np.ones(len(cols)), (rows, cols)), shape=(len(batch), table.items))
        sums = (h @ w).toarray()  # float64
        out[start : start + len(batch)] = np.take_along_axis(sums, candidates[start : start + len(batch)], axis=1)
    return out


def write(path: Path, table: Cooccurrence) -> None:
    files.write_bytes(path, save({INDPTR: table.indptr, INDICES: table.indices, WEIGHTS: table.weights}))


def read(path: Path, items: int | None = None) -> Cooccurrence:
    """The table in `path`, checked against the format (and against `items` rows when given); raises
    `CooccurrenceError`."""
    wanted = {INDPTR: np.dtype(np.int64), INDICES: np.dtype(np.int64), WEIGHTS: np.dtype(np.float32)}
    tensors = {}
    try:
        with safe_open(path, framework="numpy") as f:
            for name in wanted:
                if name not in f.keys():  # noqa: SIM118 (safe_open is no dict)
                    raise CooccurrenceError(
                        f"{path}: no tensor named {name!r} ([cooccurrence] needs {', '.join(wanted)})"
                    )
                tensors[name] = f.get_tensor(name)
    except (OSError, SafetensorError) as e:
        raise CooccurrenceError(f"{path}: cannot read the co-occurrence table: {e}") from e
    for name, dtype in wanted.items():
        if tensors[name].dtype != dtype or tensors[name].ndim != 1:
            raise CooccurrenceError(
                f"{path}: tensor {name!r} is {tensors[name].dtype} {list(tensors[name].shape)}, but [cooccurrence] "
                f"needs a 1-d {'I64' if dtype == np.int64 else 'F32'} tensor"
            )
    indptr, indices, weights = tensors[INDPTR], tensors[INDICES], tensors[WEIGHTS]
    rows = len(indptr) - 1
    if rows < 1:
        raise CooccurrenceError(f"{path}: tensor 'indptr' has {len(indptr)} values: needs items + 1, at least 2")
    if items is not None and rows != items:
        raise CooccurrenceError(
            f"{path}: tensor 'indptr' has {len(indptr)} values, so the table has {rows} rows, but the catalogue has "
            f"{items} items: it needs {items + 1}"
        )
    if indptr[0] != 0 or (np.diff(indptr) < 0).any() or indptr[-1] != len(indices):
        raise CooccurrenceError(
            f"{path}: tensor 'indptr' must start at 0, never decrease and end at the {len(indices)} entries of "
            "'indices'"
        )
    if len(weights) != len(indices):
        raise CooccurrenceError(f"{path}: tensor 'weights' has {len(weights)} values, 'indices' {len(indices)}")
    outside = np.flatnonzero((indices < 0) | (indices >= rows))
    if len(outside):
        at = int(outside[0])
        raise CooccurrenceError(f"{path}: tensor 'indices'[{at}] is {indices[at]}, outside the items 0 to {rows - 1}")
    # Within a row each index is larger than the one before; a row's first entry has no predecessor.
    starts = np.zeros(len(indices), bool)
    starts[indptr[:-1][np.diff(indptr) > 0]] = True
    bad = np.flatnonzero(~starts[1:] & (np.diff(indices) <= 0))
    if len(bad):
        at = int(bad[0]) + 1
        row = int(np.searchsorted(indptr, at, side="right") - 1)
        raise CooccurrenceError(f"{path}: row {row} of the table: indices are not strictly increasing at entry {at}")
    bad = np.flatnonzero(~np.isfinite(weights))
    if len(bad):
        raise CooccurrenceError(f"{path}: tensor 'weights'[{int(bad[0])}] is {weights[bad[0]]}, not a finite number")
    return Cooccurrence(indptr, indices, weights)
