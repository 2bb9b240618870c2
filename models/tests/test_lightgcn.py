"""LightGCN: propagation against a dense reference, BPR gradients against finite differences, the history
formula of docs/model-repository.md, Recall/NDCG against a brute-force count, and a quick run that learns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recserve_models import lightgcn
from recserve_models.commands import main
from recserve_models.lightgcn import Graph, Interactions, TrainConfig


def small_data(seed: int = 0, users: int = 60, items: int = 80, per_user: int = 12) -> Interactions:
    return lightgcn.synthetic_interactions(np.random.default_rng(seed), users, items, per_user)


def dense_adjacency(data: Interactions) -> np.ndarray:
    """The (users + items)² normalised adjacency, written out the slow way."""
    n = data.users + data.items
    a = np.zeros((n, n))
    for u in range(data.users):
        for i in data.train_indices[data.train_indptr[u] : data.train_indptr[u + 1]]:
            a[u, data.users + i] = a[data.users + i, u] = 1.0
    degrees = a.sum(axis=1)
    inv = np.where(degrees > 0, 1.0 / np.sqrt(np.maximum(degrees, 1)), 0.0)
    return inv[:, None] * a * inv[None, :]


def test_propagation_equals_the_dense_layer_mean() -> None:
    data = small_data()
    rng = np.random.default_rng(1)
    users0 = rng.normal(size=(data.users, 5)).astype(np.float32)
    items0 = rng.normal(size=(data.items, 5)).astype(np.float32)
    a = dense_adjacency(data)
    e0 = np.concatenate([users0, items0]).astype(np.float64)
    layers, e, total = 3, e0, e0.copy()
    for _ in range(layers):
        e = a @ e
        total += e
    users, items = lightgcn.final_embeddings(Graph.of(data), users0, items0, layers)
    assert np.abs(users - total[: data.users] / 4).max() < 1e-5
    assert np.abs(items - total[data.users :] / 4).max() < 1e-5


def test_history_vectors_rebuild_a_training_user() -> None:
    """(1/sqrt|H|) Σ_{i∈H} h_i = e_u − e_u^(0)/(K+1) for a user with training history H."""
    data = small_data(2)
    graph = Graph.of(data)
    rng = np.random.default_rng(3)
    users0 = rng.normal(size=(data.users, 4)).astype(np.float32)
    items0 = rng.normal(size=(data.items, 4)).astype(np.float32)
    users, _ = lightgcn.final_embeddings(graph, users0, items0, 3)
    history = lightgcn.history_vectors(graph, items0, users0, 3)
    for u in range(data.users):
        h = data.train_indices[data.train_indptr[u] : data.train_indptr[u + 1]]
        assert np.abs(lightgcn.embed_history(history, h) - (users[u] - users0[u] / 4)).max() < 1e-5
    unseen = np.setdiff1d(np.arange(data.items), data.train_indices)
    assert np.all(history[unseen] == 0)
    with pytest.raises(ValueError, match="at least one item"):
        lightgcn.embed_history(history, np.array([], dtype=np.int64))


def test_bpr_gradients_match_finite_differences() -> None:
    data = small_data(4, users=20, items=30, per_user=6)
    graph = Graph.of(data)
    rng = np.random.default_rng(5)
    users0 = rng.normal(0, 0.3, (data.users, 3)).astype(np.float32)
    items0 = rng.normal(0, 0.3, (data.items, 3)).astype(np.float32)
    u = rng.integers(0, data.users, 16)
    p = rng.integers(0, data.items, 16)
    n = rng.integers(0, data.items, 16)
    reg = 0.05
    _, g_users, g_items = lightgcn.bpr_gradients(graph, users0, items0, u, p, n, 3, reg)
    for which, grad in (("users", g_users), ("items", g_items)):
        d = rng.normal(size=grad.shape).astype(np.float32)

        def loss(e: float, which: str = which, d: np.ndarray = d) -> float:
            eu, ei = users0.astype(np.float64), items0.astype(np.float64)
            if which == "users":
                eu = eu + e * d
            else:
                ei = ei + e * d
            fu, fi = lightgcn.final_embeddings(graph, eu.astype(np.float32), ei.astype(np.float32), 3)
            x = np.einsum("bd,bd->b", fu[u].astype(np.float64), (fi[p] - fi[n]).astype(np.float64))
            squares = (eu[u] ** 2).sum() + (ei[p] ** 2).sum() + (ei[n] ** 2).sum()
            return float(np.logaddexp(0.0, -x).mean() + reg / 2 * squares / len(u))

        eps = 1e-2
        numeric = (loss(eps) - loss(-eps)) / (2 * eps)
        assert float((grad * d).sum()) == pytest.approx(numeric, rel=1e-3)


def test_evaluate_counts_like_brute_force() -> None:
    data = small_data(6)
    rng = np.random.default_rng(7)
    users = rng.normal(size=(data.users, 4)).astype(np.float32)
    items = rng.normal(size=(data.items, 4)).astype(np.float32)
    metrics = lightgcn.evaluate(users, items, data, k=5, chunk=7)
    recalls, ndcgs = [], []
    for u in range(data.users):
        truth = set(data.test_indices[data.test_indptr[u] : data.test_indptr[u + 1]].tolist())
        if not truth:
            continue
        seen = set(data.train_indices[data.train_indptr[u] : data.train_indptr[u + 1]].tolist())
        scores = users[u] @ items.T
        ranked = [i for i in np.argsort(-scores, kind="stable") if i not in seen][:5]
        hits = [1.0 if i in truth else 0.0 for i in ranked]
        recalls.append(sum(hits) / len(truth))
        dcg = sum(h / np.log2(r + 2) for r, h in enumerate(hits))
        ndcgs.append(dcg / sum(1 / np.log2(r + 2) for r in range(min(len(truth), 5))))
    assert metrics.users == len(recalls)
    assert metrics.recall == pytest.approx(np.mean(recalls), abs=1e-12)
    assert metrics.ndcg == pytest.approx(np.mean(ndcgs), abs=1e-12)


def test_quick_training_learns_and_reads_back(tmp_path: Path) -> None:
    data = small_data(8, users=300, items=400, per_user=20)
    lightgcn.write_interactions(tmp_path, data)
    main(
        ["train-lightgcn", "--data", str(tmp_path), "--out", str(tmp_path / "run"), "--dim", "16", "--epochs", "15",
         "--batch", "512", "--lr", "0.01", "--eval-every", "5"]
    )  # fmt: skip
    run = lightgcn.LightGCNRun.load(tmp_path / "run")
    assert run.users.shape == (300, 16) and run.items.shape == run.history_vectors.shape == (400, 16)
    history = run.info["history"]
    assert [h["epoch"] for h in history if "recall@20" in h] == [5, 10, 15]
    assert history[-1]["loss"] < history[0]["loss"]
    chance = 20 / 400
    assert run.info["test"]["recall"] > 4 * chance  # items cluster: a model that learns finds them


def test_training_is_reproducible() -> None:
    data = small_data(9)
    config = TrainConfig(dim=4, epochs=2, batch=128, seed=3)
    a, b = lightgcn.train(data, config), lightgcn.train(data, config)
    assert np.array_equal(a.users0, b.users0) and np.array_equal(a.items0, b.items0)


@pytest.mark.parametrize(
    ("train", "test", "message"),
    [
        ("0 1 2\n1 x\n", "0 3\n", r"train\.txt:2: expected 'user item item \.\.\.' as integers"),
        (
            "0 1 2\n0 3\n",
            "0 4\n",
            r"train\.txt:2: user 0 has a second line \(expected one line per user, 'user item item \.\.\.', the "
            r"Gowalla split format: group a file of 'user item' pairs by user first\)",
        ),
        ("0 1 1\n", "0 4\n", "user 0 lists an item twice"),
        ("0 1 -2\n", "0 4\n", "ids must be non-negative"),
        ("0 1 2\n", "0 2\n", "user 0 has item 2 in both train and test"),
        ("", "0 2\n", "holds no interactions"),
    ],
)
def test_broken_interaction_files_are_refused(tmp_path: Path, train: str, test: str, message: str) -> None:
    (tmp_path / "train.txt").write_text(train)
    (tmp_path / "test.txt").write_text(test)
    with pytest.raises(lightgcn.InteractionsError, match=message):
        lightgcn.read_interactions(tmp_path / "train.txt", tmp_path / "test.txt")


def test_training_says_how_many_steps_it_takes_and_warns_when_they_are_few(tmp_path: Path, capsys) -> None:
    """Issue 23, item 3: the demo's batch of 16,384 gave a LastFM-sized split 3 steps per epoch, silently."""
    data = lightgcn.synthetic_interactions(np.random.default_rng(2), 60, 80, 10)
    lightgcn.write_interactions(tmp_path / "data", data)
    main(["train-lightgcn", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "few"), "--dim", "4"])
    steps = -(-data.train_pairs // TrainConfig().batch)
    err = capsys.readouterr().err
    assert steps == 1, "a batch larger than the data: one step per epoch"
    assert f"batch {TrainConfig().batch}: 1 step per epoch, {TrainConfig().epochs} in all" in err
    assert "warning: 20 Adam steps in all (1 per epoch), LightGCN usually needs at least 1,000" in err
    epochs = -(-lightgcn.FEW_STEPS // lightgcn.steps_per_epoch(data, TrainConfig(batch=16)))
    many = ["--dim", "4", "--layers", "1", "--batch", "16", "--epochs", str(epochs)]
    main(["train-lightgcn", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "many"), *many])
    assert "warning" not in capsys.readouterr().err


def test_a_run_records_the_item_popularity_that_export_writes(tmp_path: Path) -> None:
    """Training interactions per item, for a server fallback when a history carries no signal (issue 23, item 6)."""
    data = lightgcn.synthetic_interactions(np.random.default_rng(4), 40, 70, 8)
    lightgcn.write_interactions(tmp_path / "data", data)
    run = lightgcn.run_training(tmp_path / "data", tmp_path / "run", TrainConfig(dim=4, epochs=1, batch=64))
    degrees = np.bincount(data.train_indices, minlength=data.items)
    assert (degrees == 0).any(), "the data should have items without training interactions"
    for loaded in (run, lightgcn.LightGCNRun.load(tmp_path / "run")):
        assert loaded.item_popularity is not None and loaded.item_popularity.dtype == np.int64
        np.testing.assert_array_equal(loaded.item_popularity, degrees)
