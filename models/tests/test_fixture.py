"""The fixture repository: reproducible, readable back, and its cases consistent with the files it wrote."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from recserve_models import model_toml
from recserve_models.commands import main
from recserve_models.onnx_export import DENSE, EMBEDDINGS
from recserve_models.rank_request import RequestError, rank_inputs
from recserve_models.repository import MODEL_TOML, load_tables
from recserve_models.testing import fixture


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("fixture")
    main(["fixture", "--out", str(directory)])
    return directory


@pytest.fixture(scope="module")
def cases(out: Path) -> dict:
    return json.loads((out / "cases.json").read_text())


def files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_two_runs_write_identical_bytes(out: Path, tmp_path: Path) -> None:
    fixture.build(tmp_path)
    assert files(tmp_path) == files(out)


def test_layout(out: Path) -> None:
    assert "check-cases/cases.json" in files(out)
    assert sorted(f for f in files(out) if not f.startswith("check-cases/")) == [
        "cases.json",
        "recall-cases.json",
        "recserve.toml",
        "repo/deepfm-featured/1/cooccurrence.safetensors",
        "repo/deepfm-featured/1/dense.onnx",
        "repo/deepfm-featured/1/item_features.safetensors",
        "repo/deepfm-featured/1/model.toml",
        "repo/deepfm-featured/1/tables.safetensors",
        "repo/deepfm-fp16/1/dense.onnx",
        "repo/deepfm-fp16/1/item_tables.safetensors",
        "repo/deepfm-fp16/1/model.toml",
        "repo/deepfm-fp16/1/user_tables.safetensors",
        "repo/deepfm-fp32/1/dense.onnx",
        "repo/deepfm-fp32/1/model.toml",
        "repo/deepfm-fp32/1/tables.safetensors",
        "repo/deepfm-fp32/2/dense.onnx",
        "repo/deepfm-fp32/2/model.toml",
        "repo/deepfm-fp32/2/tables.safetensors",
        "repo/deepfm-int8/1/dense.onnx",
        "repo/deepfm-int8/1/model.toml",
        "repo/deepfm-int8/1/tables.safetensors",
        "repo/deepfm-items/1/dense.onnx",
        "repo/deepfm-items/1/item_features.safetensors",
        "repo/deepfm-items/1/model.toml",
        "repo/deepfm-items/1/tables.safetensors",
        "repo/lightgcn-int8/1/model.toml",
        "repo/lightgcn-int8/1/tables.safetensors",
        "repo/lightgcn/1/model.toml",
        "repo/lightgcn/1/tables.safetensors",
    ]


def test_existing_output_is_kept_unless_forced(out: Path) -> None:
    with pytest.raises(SystemExit, match="already exists"):
        main(["fixture", "--out", str(out)])


def test_expected_scores_follow_from_the_written_files(out: Path, cases: dict) -> None:
    """Recomputed from disk alone: model.toml, the tables through the naive gather, onnxruntime on the graph."""
    for case in cases["cases"]:
        directory = out / "repo" / case["model"] / str(case["version"])
        model = model_toml.read(directory / MODEL_TOML)
        emb, dense = rank_inputs(model, load_tables(directory, model), case["request"])
        session = ort.InferenceSession(directory / model.dense_graph.file, providers=["CPUExecutionProvider"])
        scores = session.run(None, {EMBEDDINGS: emb, DENSE: dense})[0][:, 0]
        assert len(case["expected_scores"]) == len(case["request"]["candidates"])
        assert np.abs(scores - np.array(case["expected_scores"])).max() <= case["tolerance"], case["what"]


def test_cases_cover_what_the_server_must_get_right(cases: dict) -> None:
    for name, summary in cases["models"].items():
        served = [c for c in cases["cases"] if c["model"] == name and c["version"] == summary["served_version"]]
        assert {1, 100, 257} <= {len(c["request"]["candidates"]) for c in served}, name
        assert any(c["request"].get("top_k") for c in served), name
        ids: dict[str, set[int]] = {}
        for c in served:
            for field, value in c["request"]["user"]["fields"].items():
                ids.setdefault(field, set()).add(value)
            for candidate in c["request"]["candidates"]:
                for field, value in candidate["fields"].items():
                    ids.setdefault(field, set()).add(value)
                if summary["item_id_field"] is not None:
                    ids.setdefault(summary["item_id_field"], set()).add(candidate["id"])
        assert summary["oov"]["reject"] and summary["oov"]["default"]
        for policy, tables in summary["oov"].items():
            for table in tables:
                for field in table["fields"]:
                    assert {0, table["rows"] - 1} <= ids[field], (name, field)
                    outside = {i for i in ids[field] if not 0 <= i < table["rows"]}
                    assert bool(outside) == (policy == "default"), (name, field)
        every_id = set().union(*ids.values())
        assert {-1, -(2**63), 2**63 - 1} <= every_id, name
    assert cases["models"]["deepfm-fp32"]["served_version"] == 2
    assert [c["version"] for c in cases["cases"] if c["model"] == "deepfm-fp32"].count(1) == 2


def test_requests_follow_the_api_mapping(cases: dict) -> None:
    for case in cases["cases"]:
        summary = cases["models"][case["model"]]
        request = case["request"]
        assert sorted(request["user"]["fields"]) == sorted(summary["user_fields"])
        assert len(request["user"]["dense"]) == len(summary["dense_features"])
        item_fields = [f for f in summary["item_fields"] if f != summary["item_id_field"]]
        for candidate in request["candidates"]:
            assert sorted(candidate["fields"]) == sorted(item_fields)
            assert summary["item_id_field"] is None or "id" in candidate


def test_error_cases_are_refused_at_the_named_input(out: Path, cases: dict) -> None:
    assert {c["model"] for c in cases["error_cases"]} == set(cases["models"])
    for case in cases["error_cases"]:
        directory = out / "repo" / case["model"] / str(cases["models"][case["model"]]["served_version"])
        model = model_toml.read(directory / MODEL_TOML)
        with pytest.raises(RequestError, match=rf"^{re.escape(case['input'])}: id .* which rejects unknown ids"):
            rank_inputs(model, load_tables(directory, model), case["request"])
