"""The co-occurrence table (cosine ItemKNN), the `cooccurrence` candidate feature, and the file's checks."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from recserve_models import cooccurrence, lightgcn


def _brute_force(data: lightgcn.Interactions, neighbours: int) -> dict[int, dict[int, float]]:
    """Counts by a loop over users' item pairs, cosine weights, each row's `neighbours` best (ties: lower id)."""
    counts: dict[tuple[int, int], int] = {}
    for u in range(data.users):
        items = data.train_indices[data.train_indptr[u] : data.train_indptr[u + 1]].tolist()
        for h, c in itertools.permutations(items, 2):
            counts[h, c] = counts.get((h, c), 0) + 1
    degrees = data.item_degrees()
    rows: dict[int, dict[int, float]] = {h: {} for h in range(data.items)}
    for (h, c), n in counts.items():
        rows[h][c] = n / np.sqrt(float(degrees[h]) * float(degrees[c]))
    return {h: dict(sorted(row.items(), key=lambda kv: (-kv[1], kv[0]))[:neighbours]) for h, row in rows.items()}


@pytest.mark.parametrize("neighbours", [3, 1000])
def test_the_table_is_cosine_itemknn_by_brute_force(neighbours: int) -> None:
    data = lightgcn.synthetic_interactions(np.random.default_rng(0), 25, 30, 6, clusters=3)
    table = cooccurrence.build(data.train_indptr, data.train_indices, data.items, neighbours, chunk=7)
    expected = _brute_force(data, neighbours)
    assert table.items == data.items and table.indptr[0] == 0 and table.indptr[-1] == len(table.indices)
    for h in range(data.items):
        cols = table.indices[table.indptr[h] : table.indptr[h + 1]]
        assert (np.diff(cols) > 0).all() and h not in cols
        assert sorted(expected[h]) == cols.tolist()
        for c, w in zip(cols, table.weights[table.indptr[h] : table.indptr[h + 1]], strict=True):
            assert w == np.float32(expected[h][int(c)])


def _naive_feature(table: cooccurrence.Cooccurrence, history: list[int], candidate: int) -> np.float32:
    total = 0.0  # float64, rounded to float32 once
    for h in sorted(set(history)):
        if not 0 <= h < table.items:
            continue
        for j in range(table.indptr[h], table.indptr[h + 1]):
            if table.indices[j] == candidate:
                total += float(table.weights[j])
    return np.float32(total)


def test_the_feature_sums_the_weights_of_the_distinct_history_items() -> None:
    data = lightgcn.synthetic_interactions(np.random.default_rng(2), 40, 35, 8, clusters=4)
    table = cooccurrence.build(data.train_indptr, data.train_indices, data.items, 10)
    rng = np.random.default_rng(3)
    candidates = rng.integers(0, data.items, (data.users, 12))
    batched = cooccurrence.features(
        table, data.train_indptr, data.train_indices, np.arange(data.users), candidates, chunk=9
    )
    for u in range(data.users):
        history = data.train_indices[data.train_indptr[u] : data.train_indptr[u + 1]]
        expected = [_naive_feature(table, history.tolist(), int(c)) for c in candidates[u]]
        assert cooccurrence.feature(table, history, candidates[u]).tolist() == expected
        assert batched[u].tolist() == expected
    assert (batched > 0).any()
    # A repeated item counts once, and ids outside the catalogue are ignored.
    history = np.array([int(data.train_indices[0])] * 3 + [-1, data.items, 10**9])
    once = cooccurrence.feature(table, history[:1], candidates[0])
    assert np.array_equal(cooccurrence.feature(table, history, candidates[0]), once)


def _write(path: Path, indptr: list[int], indices: list[int], weights: list[float], index_dtype=np.int64) -> Path:
    from safetensors.numpy import save_file

    save_file(
        {
            "indptr": np.array(indptr, np.int64),
            "indices": np.array(indices, index_dtype),
            "weights": np.array(weights, np.float32),
        },
        str(path),
    )
    return path


def test_the_file_round_trips_and_its_checks_name_the_fault(tmp_path: Path) -> None:
    data = lightgcn.synthetic_interactions(np.random.default_rng(4), 20, 15, 5)
    table = cooccurrence.build(data.train_indptr, data.train_indices, data.items, 4)
    cooccurrence.write(tmp_path / "c.safetensors", table)
    back = cooccurrence.read(tmp_path / "c.safetensors", data.items)
    assert all(np.array_equal(a, b) for a, b in zip(
        (back.indptr, back.indices, back.weights), (table.indptr, table.indices, table.weights), strict=True
    ))  # fmt: skip
    good = ([0, 2, 2, 3], [1, 2, 0], [0.5, 0.25, 1.0])
    assert cooccurrence.read(_write(tmp_path / "ok.safetensors", *good), 3).items == 3
    for (indptr, indices, weights), items, message in [
        (good, 4, "the table has 3 rows, but the catalogue has 4 items: it needs 5"),
        (([0, 2, 2, 3], [2, 1, 0], good[2]), 3, "row 0 of the table: indices are not strictly increasing"),
        (([0, 2, 2, 3], [1, 1, 0], good[2]), 3, "row 0 of the table: indices are not strictly increasing"),
        (([0, 2, 2, 3], [1, 3, 0], good[2]), 3, r"'indices'\[1\] is 3, outside the items 0 to 2"),
        (([0, 2, 2, 3], [1, 2, -1], good[2]), 3, r"'indices'\[2\] is -1"),
        ((good[0], good[1], [0.5, float("nan"), 1.0]), 3, r"'weights'\[1\] is nan, not a finite number"),
        ((good[0], good[1], [0.5, 0.25]), 3, "'weights' has 2 values, 'indices' 3"),
        (([0, 2, 1, 3], good[1], good[2]), 3, "'indptr' must start at 0, never decrease"),
        (([0, 2, 2, 4], good[1], good[2]), 3, "'indptr' must start at 0, never decrease and end at the 3 entries"),
        (([0], [], []), None, "'indptr' has 1 values: needs items \\+ 1"),
    ]:
        path = _write(tmp_path / "bad.safetensors", indptr, indices, weights)
        with pytest.raises(cooccurrence.CooccurrenceError, match=message):
            cooccurrence.read(path, items)
    with pytest.raises(cooccurrence.CooccurrenceError, match=r"'indices' is int32 .* needs a 1-d I64 tensor"):
        cooccurrence.read(_write(tmp_path / "i32.safetensors", *good, index_dtype=np.int32))
    with pytest.raises(cooccurrence.CooccurrenceError, match="no tensor named 'indptr'"):
        from safetensors.numpy import save_file

        save_file({"weights": np.zeros(1, np.float32)}, str(tmp_path / "none.safetensors"))
        cooccurrence.read(tmp_path / "none.safetensors")
