"""The recall and recommend fixture: its expected answers follow from the files it wrote, by an independent
float64 brute force; the tiny LightGCN obeys the documented history identity; the files are what model.toml says."""

from __future__ import annotations

import itertools
import json
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from recserve_models import cooccurrence
from recserve_models.model_toml import DEFAULT_K
from recserve_models.quantize import dequantize_rowwise_int8
from recserve_models.testing import fixture_recall


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("fixture-recall")
    fixture_recall.build(directory, 20261130)
    return directory


@pytest.fixture(scope="module")
def cases(out: Path) -> dict:
    return json.loads((out / fixture_recall.CASES_FILE).read_text())


def tables(out: Path, model: str) -> dict[str, np.ndarray]:
    return load_file(out / "repo" / model / "1" / "tables.safetensors")


def test_recall_answers_follow_from_the_tables_in_float64(out: Path, cases: dict) -> None:
    lightgcn, int8 = tables(out, "lightgcn"), tables(out, "lightgcn-int8")
    items = {"lightgcn": lightgcn["item"].astype(np.float64), "lightgcn-int8": dequantize_rowwise_int8(int8["item"])}
    checked = 0
    for case in cases["recall_cases"]:
        request, model = case["request"], case["model"]
        if case.get("fallback") == "popularity":
            # No history item has a vector: the most popular items answer (test_the_zero_history_falls_back...).
            checked += 1
            continue
        if "user_id" in request:
            users = lightgcn["user"] if model == "lightgcn" else int8["user"].astype(np.float32)
            row = request["user_id"]
            query = users[row if 0 <= row < len(users) else 5].astype(np.float64)
        else:
            distinct = list(dict.fromkeys(request["history"]))
            query = lightgcn["history"][distinct].astype(np.float64).sum(axis=0) / np.sqrt(len(distinct))
        scores = items[model].astype(np.float64) @ query
        excluded = set(request.get("exclude", []))
        allowed = [i for i in range(len(scores)) if i not in excluded]
        expected = case["expected"]
        default_k = fixture_recall.LIGHTGCN_DEFAULT_K if model == "lightgcn" else DEFAULT_K
        assert len(expected) == min(request.get("k", default_k), len(allowed)), case["what"]
        for rank, item in enumerate(expected):
            assert item["id"] in allowed
            assert abs(item["score"] - scores[item["id"]]) <= 1e-5, case["what"]
            # Best first: nothing outside the answer beats it by more than the float32 rounding.
            if rank + 1 == len(expected):
                rest = [scores[i] for i in allowed if i not in {e["id"] for e in expected}]
                assert not rest or max(rest) <= item["score"] + 1e-5, case["what"]
        for a, b in itertools.pairwise(expected):
            assert (a["score"], -a["id"]) >= (b["score"], -b["id"]), f"{case['what']}: order and tie rule"
        checked += 1
    assert checked == len(cases["recall_cases"]) >= 12


def test_ties_and_the_zero_history_are_covered(cases: dict) -> None:
    whole = next(c for c in cases["recall_cases"] if c["request"] == {"user_id": 5, "k": 300})
    tied = [e for e in whole["expected"] if e["id"] in fixture_recall.TIED_ITEMS]
    assert [e["id"] for e in tied] == list(fixture_recall.TIED_ITEMS), "equal scores: lower id first"
    assert len({e["score"] for e in tied}) == 1
    zero = next(c for c in cases["recall_cases"] if c.get("fallback") == "popularity")
    assert zero["history_used"] == 0
    assert {e["score"] for e in zero["expected"]} == {0.0}


def test_the_zero_history_falls_back_on_the_popularity_order_the_model_names(out: Path, cases: dict) -> None:
    popularity = tables(out, "lightgcn")["item_popularity"]
    assert popularity.dtype == np.int64 and popularity.shape == (fixture_recall.ITEMS,)
    zero = next(c for c in cases["recall_cases"] if c.get("fallback") == "popularity")
    request = zero["request"]
    assert all(popularity[i] == 0 for i in request["history"]), "every history item lacks interactions"
    excluded = set(request["exclude"])
    order = sorted((i for i in range(len(popularity)) if i not in excluded), key=lambda i: (-popularity[i], i))
    assert [e["id"] for e in zero["expected"]] == order[: request["k"]]
    used = [c["history_used"] for c in cases["recall_cases"] if "history" in c["request"]]
    assert 0 in used and max(used) > 0


def test_history_of_a_full_training_history_is_the_user_vector_without_layer_zero(out: Path, cases: dict) -> None:
    t = tables(out, "lightgcn")
    for case in cases["history_identity"]:
        layers = case["layers"]
        history = fixture_recall.history_vector(t["history"], case["history"]).astype(np.float64)
        predicted = t["user"][case["user"]].astype(np.float64) - np.array(case["layer0"]) / (layers + 1)
        assert np.abs(history - predicted).max() <= 1e-6


def test_model_files_and_the_pipeline_config(out: Path, cases: dict) -> None:
    ranking = out / "repo" / fixture_recall.RANKING / "1"
    spec = tomllib.loads((ranking / "model.toml").read_text())
    assert spec["item_features"] == {"file": "item_features.safetensors", "fields": ["category", "brand"]}
    features = load_file(ranking / "item_features.safetensors")["item_features"]
    assert features.dtype == np.int64 and features.shape == (fixture_recall.ITEMS, 2)
    assert features[:, 0].min() >= 0 and features[:, 0].max() < 12, "category rejects unknown ids"
    lightgcn = tomllib.loads((out / "repo" / "lightgcn" / "1" / "model.toml").read_text())
    assert lightgcn["kind"] == "lightgcn"
    assert lightgcn["recall"] == {
        "user_table": "user",
        "item_table": "item",
        "history_table": "history",
        "popularity": "item_popularity",
        "default_k": fixture_recall.LIGHTGCN_DEFAULT_K,
    }
    config = tomllib.loads((out / fixture_recall.CONFIG_FILE).read_text())
    pipelines = [dict(fixture_recall.PIPELINE), dict(fixture_recall.FEATURED_PIPELINE)]
    assert config["pipelines"] == {p.pop("name"): p for p in pipelines}
    assert len(cases["recommend_cases"]) >= 5
    assert any(not c["expected"] for c in cases["recommend_cases"]), "a case where everything is excluded"
    featured = tomllib.loads((out / "repo" / fixture_recall.FEATURED / "1" / "model.toml").read_text())
    assert featured["ranking"]["candidate_features"] == ["recall_score", "recall_rank", "cooccurrence"]
    assert featured["cooccurrence"] == {"file": "cooccurrence.safetensors"}
    assert len(cases["featured_cases"]) >= 3


def test_featured_cases_see_the_cooccurrence_feature(out: Path, cases: dict) -> None:
    """The featured cases exercise every candidate feature: the co-occurrence sum is not 0 everywhere, and each
    returned item's features are the reference's (recall score as returned, rank within the candidates)."""
    table = cooccurrence.read(out / "repo" / fixture_recall.FEATURED / "1" / "cooccurrence.safetensors")
    assert table.items == fixture_recall.ITEMS
    seen = []
    for case in cases["featured_cases"]:
        ids = np.array([item["id"] for item in case["expected"]], np.int64)
        expected = cooccurrence.feature(table, np.array(case["request"]["history"]), ids)
        got = np.array([item["features"]["cooccurrence"] for item in case["expected"]], np.float32)
        assert np.array_equal(got, expected)
        for item in case["expected"]:
            assert item["features"]["recall_score"] == item["recall_score"]
            assert 0 <= item["features"]["recall_rank"] < fixture_recall.FEATURED_PIPELINE["candidates"]
        seen.extend(got.tolist())
    assert any(v > 0 for v in seen), "no featured case has a co-occurring candidate"


def test_check_validates_the_item_feature_table_as_the_server_does(out: Path, tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    from recserve_models import check

    source = out / "repo" / fixture_recall.RANKING / "1"
    assert check.check_version(source).model.item_features.fields == fixture_recall.ITEM_FEATURE_COLUMNS
    broken = tmp_path / "1"
    shutil.copytree(source, broken)
    features = load_file(broken / "item_features.safetensors")["item_features"]
    features[17, 0] = 12  # category rejects unknown ids: rows 0 to 11
    save_file({"item_features": features}, broken / "item_features.safetensors")
    with pytest.raises(check.CheckError, match='row 17, column "category": id 12 is outside table "category"'):
        check.check_version(broken)
