"""The ranker's label window: each user's training items split into an early and a late window."""

from __future__ import annotations

import numpy as np

from recserve_models import label_window, lightgcn


def _rows(indptr: np.ndarray, indices: np.ndarray, u: int) -> np.ndarray:
    return indices[indptr[u] : indptr[u + 1]]


def test_the_windows_split_each_users_items_disjointly_and_seeded() -> None:
    data = lightgcn.synthetic_interactions(np.random.default_rng(0), 60, 80, 15)
    config = label_window.WindowConfig(late_share=0.25, min_items=6, seed=7)
    window = label_window.split(data, config)
    assert (window.users, window.items) == (data.users, data.items)
    assert window.train_pairs + len(window.test_indices) == data.train_pairs
    for u in range(data.users):
        items = _rows(data.train_indptr, data.train_indices, u)
        early = _rows(window.train_indptr, window.train_indices, u)
        late = _rows(window.test_indptr, window.test_indices, u)
        assert not np.intersect1d(early, late).size
        assert np.array_equal(np.union1d(early, late), items)
        assert (np.diff(early) > 0).all() and (np.diff(late) > 0).all()  # sorted, as Interactions requires
        expected = max(1, round(0.25 * len(items))) if len(items) >= 6 else 0
        assert len(late) == expected
    # The same seed draws the same window; another seed another one.
    again = label_window.split(data, config)
    assert np.array_equal(again.test_indices, window.test_indices)
    other = label_window.split(data, label_window.WindowConfig(late_share=0.25, min_items=6, seed=8))
    assert np.array_equal(other.test_indptr, window.test_indptr)
    assert not np.array_equal(other.test_indices, window.test_indices)


def test_users_with_few_items_keep_them_all_early() -> None:
    data = lightgcn.synthetic_interactions(np.random.default_rng(1), 30, 40, 6)
    window = label_window.split(data, label_window.WindowConfig(min_items=1000))
    assert np.array_equal(window.train_indices, data.train_indices) and len(window.test_indices) == 0
