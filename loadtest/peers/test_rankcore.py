"""The peers' scoring (rankcore) against the generated test repository's expected scores (target/test-fixture,
which scripts/test.sh generates): the numpy gather and the onnxruntime run give recserve's scores for every
fixture case of every served model, and ids outside a `reject` table are refused. Run by scripts/test.sh."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from rankcore import RankModel, RequestError

FIXTURE = Path(os.environ.get("RECSERVE_TEST_FIXTURE", Path(__file__).parents[2] / "target" / "test-fixture"))


@pytest.fixture(scope="module")
def cases() -> dict:
    path = FIXTURE / "cases.json"
    if not path.is_file():
        pytest.fail(f"no test fixture at {FIXTURE}: run scripts/test.sh, which generates it")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def models(cases: dict) -> dict[str, RankModel]:
    return {name: RankModel(FIXTURE / "repo", name) for name in cases["models"]}


def test_scores_equal_the_fixture_for_every_served_case(cases: dict, models: dict[str, RankModel]) -> None:
    checked = set()
    for case in cases["cases"]:
        model = models[case["model"]]
        if case["version"] != model.version:
            continue  # a case for a version served only when pinned
        ids, dense = model.decode_json(case["request"])
        scores = model.score(ids, dense)
        expected = np.asarray(case["expected_scores"], dtype=np.float64)
        worst = float(np.max(np.abs(scores.astype(np.float64) - expected)))
        assert worst <= case["tolerance"], f"{case['model']}: {case['what']}: |diff| {worst} > {case['tolerance']}"
        checked.add(case["model"])
    assert checked == set(cases["models"]), checked


def test_a_batch_of_requests_scores_as_each_request_alone(cases: dict, models: dict[str, RankModel]) -> None:
    model = models["deepfm-int8"]
    requests = [c["request"] for c in cases["cases"] if c["model"] == "deepfm-int8"][:4]
    decoded = [model.decode_json(r) for r in requests]
    together = model.score(np.concatenate([d[0] for d in decoded]), np.concatenate([d[1] for d in decoded]))
    alone = np.concatenate([model.score(*d) for d in decoded])
    assert np.max(np.abs(together - alone)) <= 1e-5


def test_ids_outside_a_reject_table_are_refused(cases: dict, models: dict[str, RankModel]) -> None:
    for case in cases["error_cases"]:
        field = case["input"].rsplit(".", 1)[1]
        rows = next(t["rows"] for t in cases["models"][case["model"]]["oov"]["reject"] if field in t["fields"])
        # The range is said the way every recserve message says it: the last valid id, not the row count.
        with pytest.raises(RequestError, match=rf"outside the vocabulary of table .* \(ids 0 to {rows - 1}\)"):
            models[case["model"]].decode_json(case["request"])


def test_malformed_requests_name_the_input(models: dict[str, RankModel]) -> None:
    model = models["deepfm-int8"]
    with pytest.raises(RequestError, match="^candidates: must be an array"):
        model.decode_json({"user": {}})
    with pytest.raises(RequestError, match="^user.dense: holds 0 values"):
        model.decode_json({"user": {"fields": {}}, "candidates": [{"id": 1}]})
