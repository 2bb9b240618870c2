"""The Gowalla ranker on small data: its training rows, its version (item feature and co-occurrence tables, the
transforms in the graph), the toolchain's check of that version, and the pipeline's candidate features."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from recserve_models import check, cooccurrence, deepfm, gowalla_rank, label_window, lightgcn, model_toml

RECIPE = lightgcn.TrainConfig(dim=8, epochs=3, batch=256, lr=0.01)
CONFIG = gowalla_rank.RankConfig(candidates=15, neighbours=6, max_epochs=2, batch=256, hidden=(8,))


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[lightgcn.Interactions, gowalla_rank.RankRun, lightgcn.LightGCNRun]:
    work = tmp_path_factory.mktemp("ranker")
    data = lightgcn.synthetic_interactions(np.random.default_rng(0), 120, 90, 14)
    window = label_window.split(data, label_window.WindowConfig())
    early = lightgcn.fit_run(window, work / "early", RECIPE, {"directory": "synthetic"}, lambda _: None)
    run = gowalla_rank.run_training(early, window, label_window.WindowConfig(), work / "run", CONFIG, lambda _: None)
    full = lightgcn.fit_run(data, work / "full", RECIPE, {"directory": "synthetic"}, lambda _: None)
    return data, run, full


def test_the_run_keeps_its_best_epoch_and_reloads(trained) -> None:
    _, run, _ = trained
    assert 1 <= run.info["best_epoch"] <= len(run.info["history"]) <= CONFIG.max_epochs
    assert run.info["data"]["rows"] == run.info["data"]["users"] * CONFIG.candidates
    kinds = [t.kind for t in run.params.dense_transforms]
    assert kinds == [deepfm.LINEAR, deepfm.LOG1P, deepfm.LOG1P]  # score, rank, co-occurrence
    again = gowalla_rank.RankRun.load(run.directory)
    assert again.params.dense_transforms == run.params.dense_transforms
    assert np.array_equal(again.params.layers[0].weight, run.params.layers[0].weight)


def test_the_version_passes_the_toolchains_checks_and_its_graph_is_the_model(trained, tmp_path: Path) -> None:
    data, run, full = trained
    version = tmp_path / "1"
    served = gowalla_rank.export(run, full, data, version, "fp32", "test ranker")
    # The served transforms: the training ones' kinds, centred and scaled on the serving-time features.
    assert [t.kind for t in served] == [t.kind for t in run.params.dense_transforms]
    users = np.flatnonzero(data.has_history())[::4]
    lists = gowalla_rank.recall(full.users, full.items, data, users, CONFIG.candidates)
    table = cooccurrence.build(data.train_indptr, data.train_indices, data.items, CONFIG.neighbours)
    features = gowalla_rank.candidate_features(lists, table, data, model_toml.CANDIDATE_FEATURES)
    score = features[:, :, 0].astype(np.float64)
    assert served[0].centre == pytest.approx(score.mean(), rel=1e-6)
    assert served[0].scale == pytest.approx(score.std(), rel=1e-6)
    params = replace(run.params, dense_transforms=served)
    model = model_toml.read_deepfm(version / "model.toml")
    assert model.ranking.candidate_features == ("recall_score", "recall_rank", "cooccurrence")
    assert model.cooccurrence == model_toml.CooccurrenceSpec("cooccurrence.safetensors")
    opened = check._open_version(version)  # what `check` runs on a version the server accepts
    assert opened.cooccurrence is not None and opened.cooccurrence.items == data.items
    # The exported table is the one of all training interactions.
    expected = cooccurrence.build(data.train_indptr, data.train_indices, data.items, CONFIG.neighbours)
    assert np.array_equal(opened.cooccurrence.weights, expected.weights)
    rng = np.random.default_rng(5)
    ids = np.stack([rng.integers(0, len(params.tables[f.table]), 64) for f in model.fields], axis=1)
    emb = np.stack([params.tables[f.table][ids[:, i]] for i, f in enumerate(model.fields)], axis=1)
    dense = np.stack([rng.normal(0, 3, 64), rng.integers(0, 100, 64), rng.exponential(1.0, 64)], axis=1)
    dense = dense.astype(np.float32)
    scores = check.run_graph(opened.session, model, emb, dense)
    assert np.abs(scores - deepfm.forward(params, emb, dense)).max() <= 1e-5
    # A table of another catalogue is refused, naming the file.
    table = cooccurrence.read(version / "cooccurrence.safetensors")
    save_file(
        {"indptr": table.indptr[:-1].copy(), "indices": table.indices[: table.indptr[-2]].copy(),
         "weights": table.weights[: table.indptr[-2]].copy()},
        str(version / "cooccurrence.safetensors"),
    )  # fmt: skip
    with pytest.raises(check.CheckError, match=f"cooccurrence.safetensors: .* the catalogue has {data.items} items"):
        check._open_version(version)


def test_the_candidate_features_are_the_servers(trained) -> None:
    """The features `pipeline_quality` feeds, against a naive computation of one request at a time."""
    data, _, _ = trained
    rng = np.random.default_rng(6)
    queries = rng.normal(size=(data.users, 4)).astype(np.float32)
    items = rng.normal(size=(data.items, 4)).astype(np.float32)
    users = np.array([0, 3, 7, 11])
    table = cooccurrence.build(data.train_indptr, data.train_indices, data.items, 5)
    lists = gowalla_rank.recall(queries, items, data, users, 10)
    names = ("cooccurrence", "recall_rank", "recall_score")
    features = gowalla_rank.candidate_features(lists, table, data, names)
    for row, u in enumerate(users):
        history = data.train_indices[data.train_indptr[u] : data.train_indptr[u + 1]]
        scores = items @ queries[u]
        scores[history] = -np.inf
        order = sorted(range(data.items), key=lambda i: (-scores[i], i))[:10]
        assert lists.items[row].tolist() == order
        assert np.allclose(features[row, :, 2], scores[order], rtol=1e-6)
        assert features[row, :, 1].tolist() == list(range(10))
        assert np.array_equal(features[row, :, 0], cooccurrence.feature(table, history, np.array(order)))
