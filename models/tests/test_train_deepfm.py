"""DeepFM training: hand-written gradients against finite differences of the float64 reference, a quick run
that learns, the export of trained weights equal to the reference forward pass, the warning on few steps, and
the epoch chosen on the validation split."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import run_graph

from recserve_models import criteo, deepfm, train_deepfm
from recserve_models.commands import main
from recserve_models.deepfm import DeepFMParams, Layer
from recserve_models.onnx_export import build_graph
from recserve_models.train_deepfm import Dataset, TrainConfig, kept_epoch, loss_and_gradients

TINY = criteo.GeneratorConfig(seed=5, vocab_scale=0.002, max_vocab=300)


def small_params(rng: np.random.Generator) -> DeepFMParams:
    rows = {"a": 7, "b": 5, "c": 9}
    params = deepfm.init_params(rng, rows, ["a", "b", "c", "a"], factors=3, num_dense=2, hidden=[6, 4])
    return params


def reference_loss(params: DeepFMParams, ids: np.ndarray, dense: np.ndarray, labels: np.ndarray) -> float:
    emb = np.stack([params.tables[t][ids[:, f]] for f, t in enumerate(params.field_tables)], axis=1)
    p = np.clip(deepfm.forward(params, emb, dense), 1e-12, 1 - 1e-12)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log1p(-p)))


def test_gradients_match_finite_differences() -> None:
    rng = np.random.default_rng(0)
    params = small_params(rng)
    ids = np.stack([rng.integers(0, len(params.tables[t]), 32) for t in params.field_tables], axis=1)
    dense = np.floor(rng.lognormal(1.0, 1.0, (32, 2))).astype(np.float32)
    labels = rng.integers(0, 2, 32).astype(np.int8)
    loss, grads = loss_and_gradients(params, ids, dense, labels)
    assert loss == pytest.approx(reference_loss(params, ids, dense, labels), rel=1e-5)

    def directional(perturb) -> float:
        eps = 1e-3
        return (
            reference_loss(perturb(eps), ids, dense, labels) - reference_loss(perturb(-eps), ids, dense, labels)
        ) / (2 * eps)

    def with_layer(i: int, weight: np.ndarray | None = None, bias: np.ndarray | None = None) -> DeepFMParams:
        layers = list(params.layers)
        layers[i] = Layer(layers[i].weight if weight is None else weight, layers[i].bias if bias is None else bias)
        return DeepFMParams(params.tables, params.field_tables, params.bias, params.dense_weights, tuple(layers))

    for i, (dw, db) in enumerate(grads.layers):
        d = rng.normal(size=dw.shape).astype(np.float32)
        numeric = directional(lambda e, i=i, d=d: with_layer(i, weight=params.layers[i].weight + np.float32(e) * d))
        assert float((dw * d).sum()) == pytest.approx(numeric, rel=2e-3, abs=1e-6)
        d = rng.normal(size=db.shape).astype(np.float32)
        numeric = directional(lambda e, i=i, d=d: with_layer(i, bias=params.layers[i].bias + np.float32(e) * d))
        assert float((db * d).sum()) == pytest.approx(numeric, rel=2e-3, abs=1e-6)
    d = rng.normal(size=2).astype(np.float32)
    numeric = directional(
        lambda e: DeepFMParams(
            params.tables, params.field_tables, params.bias, params.dense_weights + np.float32(e) * d, params.layers
        )
    )
    assert float((grads.dense_weights * d).sum()) == pytest.approx(numeric, rel=2e-3, abs=1e-6)
    numeric = directional(
        lambda e: DeepFMParams(
            params.tables, params.field_tables, params.bias + np.float32(e), params.dense_weights, params.layers
        )
    )
    assert float(grads.bias) == pytest.approx(numeric, rel=2e-3, abs=1e-6)
    # Table "a" is read by two fields: its row gradients add both up. A few coordinates at a time, so that the
    # step does not cross a ReLU kink.
    for table in ("a", "b", "c"):
        rows, g = grads.rows[table]
        d = np.zeros_like(g)
        d.flat[rng.choice(g.size, 3, replace=False)] = rng.normal(size=3)

        def moved(e: float, table: str = table, rows: np.ndarray = rows, d: np.ndarray = d) -> DeepFMParams:
            tables = dict(params.tables)
            tables[table] = tables[table].copy()
            tables[table][rows] += np.float32(e) * d
            return DeepFMParams(tables, params.field_tables, params.bias, params.dense_weights, params.layers)

        assert float((g * d).sum()) == pytest.approx(directional(moved), rel=2e-3, abs=1e-6)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few seconds of training on 6,000 generated rows, through the command line, on every row of --train
    (no validation split: the export and check tests compare AUCs across runtimes on a run they know)."""
    directory = tmp_path_factory.mktemp("deepfm")
    criteo.write(criteo.Generator(TINY), "train", 5000, directory / "train.tsv")
    criteo.write(criteo.Generator(TINY), "test", 1000, directory / "test.tsv")
    main(
        ["train-deepfm", "--train", str(directory / "train.tsv"), "--test", str(directory / "test.tsv"),
         "--out", str(directory / "run"), "--factors", "4", "--hidden", "16,8", "--epochs", "3", "--batch", "256",
         "--lr", "0.003", "--min-count", "3", "--validation-share", "0"]
    )  # fmt: skip
    return directory / "run"


def test_quick_training_learns(quick_run: Path) -> None:
    run = train_deepfm.DeepFMRun.load(quick_run)
    history = run.info["history"]
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert history[-1]["train_log_loss"] < history[0]["train_log_loss"]
    assert run.info["heldout"]["auc"] > 0.70  # the teacher's ceiling on this data is about 0.85
    heldout = Dataset.load(quick_run / train_deepfm.HELDOUT)
    assert run.info["heldout"]["auc"] == pytest.approx(train_deepfm.evaluate(run.params, heldout)["auc"], abs=1e-9)
    assert run.params.dim == 5 and [layer.weight.shape[1] for layer in run.params.layers] == [16, 8, 1]
    assert run.info["data"]["table_rows"]["C1"] == run.vocabulary.rows("C1") == len(run.params.tables["C1"])
    assert (run.info["data"]["train_rows"], run.info["data"]["validation_rows"]) == (5000, 0)
    assert run.info["selection"]["kept_epoch"] == 3 and run.info["heldout"]["auc"] == history[-1]["heldout_auc"]


def test_exported_graph_equals_the_reference_on_trained_weights(quick_run: Path) -> None:
    run = train_deepfm.DeepFMRun.load(quick_run)
    heldout = Dataset.load(quick_run / train_deepfm.HELDOUT)
    emb = np.stack([run.params.tables[t][heldout.ids[:, f]] for f, t in enumerate(run.params.field_tables)], axis=1)
    expected = deepfm.forward(run.params, emb, heldout.dense)
    graph = build_graph(run.params)
    onnx.checker.check_model(graph)
    assert np.abs(run_graph(graph, emb, heldout.dense) - expected).max() < 1e-5
    assert np.abs(train_deepfm.probabilities(run.params, heldout) - expected).max() < 1e-5


def test_parameters_round_trip(tmp_path: Path) -> None:
    params = small_params(np.random.default_rng(1))
    train_deepfm.save_params(params, tmp_path / "p.safetensors")
    back = train_deepfm.load_params(tmp_path / "p.safetensors")
    assert back.field_tables == params.field_tables and back.bias == params.bias
    assert all(np.array_equal(back.tables[t], params.tables[t]) for t in params.tables)
    assert all(np.array_equal(a.weight, b.weight) for a, b in zip(back.layers, params.layers, strict=True))


def test_bad_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--epochs must be at least 1"):
        main(["train-deepfm", "--train", "x", "--out", str(tmp_path), "--epochs", "0"])
    with pytest.raises(SystemExit):
        main(["train-deepfm", "--train", "x", "--out", str(tmp_path), "--hidden", "4,x"])
    with pytest.raises(SystemExit, match="--patience must be at least 1"):
        main(["train-deepfm", "--train", "x", "--out", str(tmp_path), "--patience", "0"])
    with pytest.raises(SystemExit, match="--validation-share must be at least 0 and below 1"):
        main(["train-deepfm", "--train", "x", "--out", str(tmp_path), "--validation-share", "1"])
    with pytest.raises(SystemExit, match=r"train-deepfm: .*absent\.tsv: cannot read"):
        main(["train-deepfm", "--train", str(tmp_path / "absent.tsv"), "--out", str(tmp_path / "run")])


def noise(rng: np.random.Generator, rows: int) -> Dataset:
    """Rows for `small_params` with labels independent of the features."""
    return Dataset(
        np.stack(
            [rng.integers(0, 7, rows), rng.integers(0, 5, rows), rng.integers(0, 9, rows), rng.integers(0, 7, rows)], 1
        ),
        np.floor(rng.lognormal(1.0, 1.0, (rows, 2))).astype(np.float32),
        rng.integers(0, 2, rows).astype(np.int8),
    )


def test_training_is_reproducible() -> None:
    data = noise(np.random.default_rng(2), 300)
    config = TrainConfig(factors=3, hidden=(6, 4), epochs=1, batch=64)
    a, _, _ = train_deepfm.train(small_params(np.random.default_rng(3)), data, config)
    b, _, _ = train_deepfm.train(small_params(np.random.default_rng(3)), data, config)
    assert all(np.array_equal(a.tables[t], b.tables[t]) for t in a.tables)
    assert all(np.array_equal(x.weight, y.weight) for x, y in zip(a.layers, b.layers, strict=True))


def test_export_quantize_and_check_compare_precisions(quick_run: Path, tmp_path: Path, capsys) -> None:
    repo = tmp_path / "repo"
    main(["export", "--run", str(quick_run), "--out", str(repo / "fp32" / "1"), "--item-id-field", "C21"])
    main(
        ["quantize", "--model", str(repo / "fp32" / "1"), "--out", str(repo / "int8" / "1"), "--tables", "int8",
         "--graph", "int8", "--calibration", str(quick_run / train_deepfm.CALIBRATION)]
    )  # fmt: skip
    assert (repo / "int8" / "1" / "vocabulary.json").read_bytes() == (quick_run / "vocabulary.json").read_bytes()
    test_file = quick_run.parent / "test.tsv"
    report = tmp_path / "check.json"
    main(["check", str(repo), "--deepfm-data", str(test_file), "--json", str(report)])
    rows = {r["variant"]: r for r in __import__("json").loads(report.read_text())["deepfm"]}
    assert set(rows) == {"fp32", "fp32 tables + int8 graph", "int8 tables + fp32 graph", "int8"}
    assert rows["fp32"]["max_abs_diff"] == 0.0
    run = train_deepfm.DeepFMRun.load(quick_run)
    # Criteo rows mapped through vocabulary.json give the run's own held-out AUC.
    assert rows["fp32"]["auc"] == pytest.approx(run.info["heldout"]["auc"], abs=1e-6)
    for name in ("int8", "fp32 tables + int8 graph", "int8 tables + fp32 graph"):
        assert 0 < rows[name]["max_abs_diff"] < 0.1
        assert abs(rows[name]["auc"] - rows["fp32"]["auc"]) < 0.01
    with pytest.raises(SystemExit, match="already exists"):
        main(["export", "--run", str(quick_run), "--out", str(repo / "fp32" / "1")])
    with pytest.raises(SystemExit, match="already int8"):
        main(["quantize", "--model", str(repo / "int8" / "1"), "--out", str(tmp_path / "x"), "--tables", "fp16"])
    with pytest.raises(SystemExit, match="needs --calibration"):
        main(["quantize", "--model", str(repo / "fp32" / "1"), "--out", str(tmp_path / "y"), "--graph", "int8"])
    capsys.readouterr()


def test_few_steps_draw_a_warning(tmp_path: Path, capsys) -> None:
    """Issue 33, item 3: 8,000 real Criteo rows in the default batches of 1,024 took 14 Adam steps, silently."""
    criteo.write(criteo.Generator(TINY), "train", 1000, tmp_path / "train.tsv")
    small = ["--train", str(tmp_path / "train.tsv"), "--factors", "2", "--hidden", "4", "--min-count", "3"]
    main(["train-deepfm", *small, "--out", str(tmp_path / "few")])
    err = capsys.readouterr().err
    # The last 100 rows are held out, the 90 before them validate: 810 rows in one batch of 1,024.
    assert "810 training rows, 90 validation rows, 100 held-out rows" in err
    assert f"batch {TrainConfig().batch}: 1 step per epoch, {TrainConfig().epochs} in all" in err
    assert "warning: 2 Adam steps in all (1 per epoch), DeepFM usually needs at least 300" in err
    epochs = -(-train_deepfm.FEW_STEPS // train_deepfm.steps_per_epoch(810, TrainConfig(batch=16)))
    main(["train-deepfm", *small, "--out", str(tmp_path / "many"), "--batch", "16", "--epochs", str(epochs)])
    assert "warning:" not in capsys.readouterr().err


def test_the_best_epoch_is_kept_not_the_last() -> None:
    """A high learning rate on labels that are noise: the model fits the training rows and the validation log loss
    rises again. The parameters returned are bit for bit those of a run stopped at the kept epoch."""
    rng = np.random.default_rng(4)
    data, validation = noise(rng, 400), noise(rng, 200)
    config = TrainConfig(factors=3, hidden=(6, 4), epochs=4, batch=32, lr=0.05, patience=4)
    kept, history, _ = train_deepfm.train(small_params(np.random.default_rng(5)), data, config, validation=validation)
    best = kept_epoch(history)
    assert len(history) == 4 and best < 4, "the validation log loss rises after its lowest epoch"
    assert history[best - 1]["validation_log_loss"] == min(h["validation_log_loss"] for h in history)
    again, _, _ = train_deepfm.train(small_params(np.random.default_rng(5)), data, replace(config, epochs=best))
    assert kept.bias == again.bias and np.array_equal(kept.dense_weights, again.dense_weights)
    assert all(np.array_equal(kept.tables[t], again.tables[t]) for t in kept.tables)
    assert all(
        np.array_equal(a.weight, b.weight) and np.array_equal(a.bias, b.bias)
        for a, b in zip(kept.layers, again.layers, strict=True)
    )


def test_patience_stops_training_and_the_run_exports_the_kept_epoch(tmp_path: Path) -> None:
    """Issue 33, item 3: 8 epochs on 8,000 real Criteo rows peaked in epoch 4 (held-out AUC 0.7375) and exported
    epoch 8's parameters (0.700)."""
    criteo.write(criteo.Generator(TINY), "train", 2000, tmp_path / "train.tsv")
    criteo.write(criteo.Generator(TINY), "test", 500, tmp_path / "test.tsv")
    main(
        ["train-deepfm", "--train", str(tmp_path / "train.tsv"), "--test", str(tmp_path / "test.tsv"),
         "--out", str(tmp_path / "run"), "--factors", "4", "--hidden", "16,8", "--epochs", "8", "--batch", "64",
         "--lr", "0.05", "--min-count", "1", "--patience", "2"]
    )  # fmt: skip
    info = json.loads((tmp_path / "run" / train_deepfm.RUN_JSON).read_text())
    # The validation rows are the last 10% of --train: the --test rows only measure the kept epoch.
    assert [info["data"][k] for k in ("train_rows", "validation_rows", "heldout_rows")] == [1800, 200, 500]
    history, selection = info["history"], info["selection"]
    best = selection["kept_epoch"]
    kept = history[best - 1]
    assert selection["metric"] == "validation_log_loss" and selection["stopped_early"]
    assert info["epochs"] == selection["epochs_run"] == len(history) == best + 2 < 8
    assert all(h["validation_log_loss"] >= kept["validation_log_loss"] for h in history)
    assert f"kept epoch {best} of {best + 2}" in selection["reason"]
    assert info["heldout"] == {"auc": kept["heldout_auc"], "log_loss": kept["heldout_log_loss"]}
    assert history[-1]["heldout_auc"] != kept["heldout_auc"]
    run = train_deepfm.DeepFMRun.load(tmp_path / "run")
    heldout = Dataset.load(tmp_path / "run" / train_deepfm.HELDOUT)
    assert train_deepfm.evaluate(run.params, heldout) == info["heldout"]


def test_without_a_validation_split_every_epoch_runs_and_the_last_is_kept(tmp_path: Path) -> None:
    """`TrainConfig`'s default, which the demo trains with: every row before the held-out ones is trained on."""
    criteo.write(criteo.Generator(TINY), "train", 1000, tmp_path / "train.tsv")
    config = TrainConfig(factors=2, hidden=(4,), epochs=3, batch=128, min_count=3, patience=1)
    run = train_deepfm.run_training(tmp_path / "train.tsv", tmp_path / "run", config, progress=lambda _: None)
    assert (run.info["data"]["train_rows"], run.info["data"]["validation_rows"]) == (900, 0)
    assert run.info["selection"] | {"reason": ""} == {
        "metric": None, "kept_epoch": 3, "epochs_run": 3, "stopped_early": False, "reason": ""
    }  # fmt: skip
    assert "validation_auc" not in run.info["history"][-1]
