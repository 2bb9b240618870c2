"""`check`: the server's verdicts (`recserve check-repository`) on whole repositories, LightGCN versions and their
comparison, and the broken-repository cases shared with the server's parity test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from recserve_models import check, lightgcn, model_toml
from recserve_models.commands import main
from recserve_models.export import export_lightgcn
from recserve_models.repository import MODEL_TOML
from recserve_models.testing import check_cases


def test_every_parity_case_is_decided_as_the_format_says(tmp_path: Path) -> None:
    results = check_cases.write(tmp_path)
    assert len(results) >= 40
    assert sum(r["intended"] == "refuse" for r in results) >= 30
    assert {r["kind"] for r in results} == {"deepfm", "lightgcn"}
    assert json.loads((tmp_path / "cases.json").read_text()) == results
    for case in results:
        try:
            errors = check.validate(tmp_path / case["name"]).errors
        except check.CheckError as e:
            errors = [str(e)]
        assert ("refuse" if errors else "load") == case["intended"], (case, errors)
        assert not errors or case["blame"] in errors[0], (case, errors)


def test_the_binary_is_found_through_recserve_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = check.find_recserve()
    monkeypatch.setenv(check.RECSERVE_BIN, str(found))
    assert check.find_recserve() == found
    monkeypatch.setenv(check.RECSERVE_BIN, str(tmp_path / "missing"))
    with pytest.raises(check.CheckError, match="RECSERVE_BIN=.*missing: no such file"):
        check.find_recserve()


def test_the_cli_exits_1_and_names_the_file(tmp_path: Path, capsys) -> None:
    check_cases.write(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["check", str(tmp_path / "graph-output-name")])
    assert exit_.value.code == 1
    out = capsys.readouterr()
    assert "m/1 (served) : ERROR" not in out.out and "dense.onnx" in out.out
    assert "would be refused by the server" in out.err
    main(["check", str(tmp_path / "ok-deepfm")])
    assert "every model version" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["check", str(tmp_path / "layout-empty")])
    assert "holds no model" in capsys.readouterr().err


def test_every_version_is_checked_not_only_the_served_one(tmp_path: Path) -> None:
    check_cases.write(tmp_path)
    root = tmp_path / "ok-deepfm"
    (root / "m" / "1").rename(root / "m" / "2")
    (root / "m" / "1").mkdir()
    validation = check.validate(root)
    assert validation.models[0].versions == (1, 2) and validation.models[0].served == 2
    assert isinstance(validation.versions["m"][2], check.Version)
    assert "model.toml" in str(validation.versions["m"][1])


def test_a_graph_with_non_finite_weights_is_refused_naming_the_initializer(tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    check_cases.write(tmp_path)
    root = tmp_path / "ok-deepfm"
    version = root / "m" / "1"
    graph_file = version / model_toml.read(version / MODEL_TOML).dense_graph.file
    proto = onnx.load(str(graph_file))
    floats = [i for i in proto.graph.initializer if numpy_helper.to_array(i).dtype.kind == "f"]
    assert floats, "the case's graph has float weights"
    weights = numpy_helper.to_array(floats[0]).copy()
    weights.flat[1 % weights.size] = np.nan
    floats[0].CopyFrom(numpy_helper.from_array(weights, floats[0].name))
    onnx.save(proto, str(graph_file))
    errors = check.validate(root).errors
    assert len(errors) == 1, errors
    assert f"initializer {floats[0].name!r} holds 1 value(s) that are not finite numbers" in errors[0], errors


@pytest.fixture(scope="module")
def lightgcn_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, lightgcn.LightGCNRun]:
    directory = tmp_path_factory.mktemp("lightgcn")
    data = lightgcn.synthetic_interactions(np.random.default_rng(0), 120, 150, 15)
    lightgcn.write_interactions(directory, data)
    config = lightgcn.TrainConfig(dim=8, epochs=6, batch=256, lr=0.01)
    return directory, lightgcn.run_training(directory, directory / "run", config)


def test_lightgcn_versions_round_trip_and_compare(lightgcn_run, tmp_path: Path) -> None:
    data_dir, run = lightgcn_run
    repo = tmp_path / "repo"
    export_lightgcn(run, repo / "lightgcn-fp32" / "1", "fp32")
    main(
        [
            "quantize",
            "--model",
            str(repo / "lightgcn-fp32" / "1"),
            "--out",
            str(repo / "lightgcn" / "1"),
            "--tables",
            "int8",
        ]
    )
    model = model_toml.read_lightgcn(repo / "lightgcn" / "1" / MODEL_TOML)
    assert model.recall == model_toml.RecallSpec("user", "item", "history", "item_popularity")
    assert {t.storage for t in model.tables} == {"int8"}
    text = (repo / "lightgcn" / "1" / MODEL_TOML).read_text()
    assert model_toml.read(repo / "lightgcn" / "1" / MODEL_TOML) == model
    assert '[recall]\nuser_table = "user"\nitem_table = "item"\nhistory_table = "history"' in text
    report = tmp_path / "check.json"
    main(["check", str(repo), "--lightgcn-data", str(data_dir), "--json", str(report)])
    rows = {r["variant"]: r for r in json.loads(report.read_text())["lightgcn"]}
    assert set(rows) == {
        "lightgcn-fp32",
        "lightgcn-fp32, users embedded from history",
        "lightgcn-fp32 users + lightgcn items",
        "lightgcn",
        "lightgcn, users embedded from history",
    }
    assert rows["lightgcn-fp32"]["recall@20"] == pytest.approx(run.info["test"]["recall"], abs=1e-9)
    assert abs(rows["lightgcn"]["recall@20"] - rows["lightgcn-fp32"]["recall@20"]) < 0.02
    assert rows["lightgcn-fp32, users embedded from history"]["recall@20"] > 0.2


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('history_table = "history"', 'history_table = "user"', "has 120 rows, but item_table 'item' has 150"),
        ("[recall]", "[ranking]\n\n[recall]", 'ranking does not belong to kind = "lightgcn"'),
        ('item_table = "item"', 'item_table = "itemz"', "recall.item_table 'itemz' is not a declared"),
        ('user_table = "user"\n', "", r"recall\.user_table is required"),
        ('item_table = "item"', 'item_table = "item"\nk = 20', "recall.k is not a known key"),
    ],
)
def test_broken_lightgcn_toml_is_refused(lightgcn_run, tmp_path: Path, old: str, new: str, message: str) -> None:
    _, run = lightgcn_run
    export_lightgcn(run, tmp_path / "v", "fp32")
    path = tmp_path / "v" / MODEL_TOML
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(model_toml.ModelTomlError, match=message):
        model_toml.read(path)
