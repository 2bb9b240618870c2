"""`synth`: benchmark models of realistic size (small here: `--max-rows` caps the tables, the shapes stay the
preset's), their requests, and their offline scores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from recserve_models import check, deepfm, model_toml, synth
from recserve_models.commands import main
from recserve_models.rank_request import rank_inputs
from recserve_models.repository import MODEL_TOML, load_tables

MAX_ROWS = 3000


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    main(
        ["synth", "--preset", "realistic", "--out", str(out), "--max-rows", str(MAX_ROWS), "--requests", "20"]
        + ["--cases", "3"]
    )
    return out


def test_the_presets_have_the_issue_s_shapes_and_sizes() -> None:
    realistic, kaggle = synth.PRESETS["realistic"], synth.PRESETS["criteo-kaggle"]
    dim = synth.FACTORS + 1
    assert len(realistic.rows) == 26 and max(realistic.rows) == 1_000_000
    assert sum(realistic.rows) * dim * 4 / 2**20 == pytest.approx(253, abs=1)  # MiB of fp32 tables
    assert sum(kaggle.rows) == 33_762_577  # the 26 Kaggle cardinalities
    assert sum(kaggle.rows) * (dim + 8) / 1e9 == pytest.approx(0.85, abs=0.01)  # GB of fused int8 rows
    assert (realistic.storage, kaggle.storage) == ("fp32", "int8")
    assert 26 * synth.FACTORS + 13 == 429 and realistic.hidden == kaggle.hidden == (400, 400, 400)


def test_synth_writes_two_versions_that_pass_check_and_share_their_tables(written: Path) -> None:
    validation = check.validate(written)
    assert not validation.errors, validation.errors
    versions = {m.name for m in validation.models}
    assert versions == {"realistic-int8", "realistic-fp32"}
    int8, fp32 = written / "realistic-int8" / "1", written / "realistic-fp32" / "1"
    assert (int8 / "tables.safetensors").read_bytes() == (fp32 / "tables.safetensors").read_bytes()
    for directory, precision in ((int8, "int8"), (fp32, "fp32")):
        model = model_toml.read_deepfm(directory / MODEL_TOML)
        assert model.dense_graph.precision == precision
        assert "RANDOM weights" in model.description
        assert [t.rows for t in model.tables] == [min(r, MAX_ROWS) for r in synth.PRESETS["realistic"].rows]
        assert {t.storage for t in model.tables} == {"fp32"} and {t.dim for t in model.tables} == {17}
        assert [f.name for f in model.fields_on("item")] == [f"C{i}" for i in range(14, 27)]
        assert model.ranking.item_id_field == "C21" and len(model.ranking.dense_features) == 13


def test_requests_are_valid_rank_bodies_of_the_preset_s_size(written: Path) -> None:
    lines = (written / "realistic-requests.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 20
    model = model_toml.read_deepfm(written / "realistic-fp32" / "1" / MODEL_TOML)
    tables = load_tables(written / "realistic-fp32" / "1", model)
    for line in lines:
        body = json.loads(line)
        emb, dense = rank_inputs(model, tables, body)  # raises RequestError for a body the server would refuse
        assert emb.shape == (100, 26, 17) and dense.shape == (100, 13)
        for candidate in body["candidates"]:
            assert set(candidate["fields"]) == {f"C{i}" for i in range(14, 27)} - {"C21"}
    # ~140 bytes per candidate at full size (14.0 KB a request); the capped ids here are shorter.
    assert 10_000 < np.mean([len(line) for line in lines]) < 15_000


def test_offline_scores_are_the_numpy_reference_for_the_fp32_graph(written: Path) -> None:
    cases = json.loads((written / "realistic-cases.json").read_text(encoding="utf-8"))
    assert cases["models"] == ["realistic-fp32", "realistic-int8"] and len(cases["cases"]) == 3
    directory = written / "realistic-fp32" / "1"
    model = model_toml.read_deepfm(directory / MODEL_TOML)
    tables = load_tables(directory, model)
    for case in cases["cases"]:
        emb, dense = rank_inputs(model, tables, case["request"])
        fp32 = np.array(case["expected_scores"]["realistic-fp32"])
        int8 = np.array(case["expected_scores"]["realistic-int8"])
        assert fp32.shape == int8.shape == (100,)
        assert np.all((fp32 > 0) & (fp32 < 1)) and np.std(fp32) > 1e-3, "random weights still spread the scores"
        # The INT8 graph is calibrated on rows like these: its scores stay near the fp32 ones.
        assert np.max(np.abs(int8 - fp32)) < 0.1
        reference = _forward(directory, model, emb, dense)
        assert np.max(np.abs(fp32 - reference)) < 1e-5


def _forward(directory: Path, model: model_toml.DeepFMToml, emb: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """float64 numpy scores of the fp32 graph's own weights (read back from the ONNX initializers)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(directory / model.dense_graph.file).graph
    w = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    k = synth.FACTORS
    first = np.concatenate([w["mlp.0.factors.weight"].T, w["mlp.0.dense.weight"].T])
    layers = [deepfm.Layer(first, w["mlp.0.factors.bias"])]
    i = 1
    while f"mlp.{i}.weight" in w:
        layers.append(deepfm.Layer(w[f"mlp.{i}.weight"].T.copy(), w[f"mlp.{i}.bias"]))
        i += 1
    tables = {f"t{f}": emb[:, f, :].copy() for f in range(emb.shape[1])}  # only shapes matter to the params' checks
    params = deepfm.DeepFMParams(
        tables=tables,
        field_tables=tuple(tables),
        bias=np.float32(w["bias"]),
        dense_weights=w["first_order.dense.weight"][:, 0].copy(),
        layers=tuple(layers),
    )
    assert params.factors == k
    return deepfm.forward(params, emb, dense)


def test_ids_follow_a_zipf_law_with_hot_rows_scattered() -> None:
    rng = np.random.default_rng(3)
    rows = 1_000_000
    ids = synth.scattered_zipf_ids(rng, rows, 200_000)
    assert ids.min() >= 0 and ids.max() < rows
    values, counts = np.unique(ids, return_counts=True)
    hottest = values[np.argsort(-counts)[:10]]
    assert counts.max() > 100 * np.median(counts), "a few ids are hot"
    assert np.all(hottest > 1000), f"the hot rows are not the lowest ids: {hottest}"
    assert len(values) > 20_000, "and there is a long tail"


def test_bad_options_are_refused_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--max-rows must be at least 1"):
        main(["synth", "--preset", "realistic", "--out", str(tmp_path), "--max-rows", "0"])
    with pytest.raises(SystemExit, match="--cases .* cannot exceed --requests"):
        main(["synth", "--preset", "realistic", "--out", str(tmp_path), "--requests", "2", "--cases", "3"])


def test_an_existing_version_is_not_overwritten(written: Path) -> None:
    with pytest.raises(SystemExit, match="exists already"):
        main(["synth", "--preset", "realistic", "--out", str(written)] + ["--max-rows", "10", "--requests", "1", "--cases", "1"])
