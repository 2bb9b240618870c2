"""The peers' scoring (rankcore) against the generated test repository's expected scores (target/test-fixture,
which scripts/test.sh generates): the numpy gather and the onnxruntime run give recserve's scores for every
fixture case of every served model, in the row and the columnar form of the request; a batch scores as its
requests alone; ids outside a `reject` table and malformed requests are refused, naming the input. Run by
scripts/test.sh."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import numpy as np
import pytest
from rankcore import RankModel, RequestError

FIXTURE = Path(os.environ.get("RECSERVE_TEST_FIXTURE", Path(__file__).parents[2] / "target" / "test-fixture"))


def columnar(request: dict) -> dict:
    """The columnar form of a row-form request (docs/api.md): the item fields named once, an id matrix."""
    rows = request["candidates"]
    names = sorted(rows[0].get("fields", {}))
    columns = {"fields": names, "ids": [[r["fields"][n] for n in names] for r in rows]}
    if "id" in rows[0]:
        columns["id"] = [r["id"] for r in rows]
    return {**request, "candidates": columns}


@pytest.fixture(scope="module")
def cases() -> dict:
    path = FIXTURE / "cases.json"
    if not path.is_file():
        pytest.fail(f"no test fixture at {FIXTURE}: run scripts/test.sh, which generates it")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def models(cases: dict) -> dict[str, RankModel]:
    return {name: RankModel(FIXTURE / "repo", name) for name in cases["models"]}


def served(cases: dict, models: dict[str, RankModel]):
    """The fixture's cases of the versions the models serve."""
    return [c for c in cases["cases"] if c["version"] == models[c["model"]].version]


def test_scores_equal_the_fixture_for_every_served_case_in_both_forms(cases: dict, models: dict) -> None:
    checked = set()
    for case in served(cases, models):
        model = models[case["model"]]
        expected = np.asarray(case["expected_scores"], dtype=np.float64)
        rows = model.decode_json(case["request"])
        packed = model.decode_json(columnar(case["request"]))
        np.testing.assert_array_equal(rows.items, packed.items)
        np.testing.assert_array_equal(rows.user, packed.user)
        assert rows.ids == packed.ids
        for request in (rows, packed):
            scores = model.score([request])
            worst = float(np.max(np.abs(scores.astype(np.float64) - expected)))
            assert worst <= case["tolerance"], f"{case['model']}: {case['what']}: |diff| {worst} > {case['tolerance']}"
        checked.add(case["model"])
    assert checked == set(cases["models"]), checked


def test_a_batch_of_requests_scores_as_each_request_alone(cases: dict, models: dict) -> None:
    model = models["deepfm-int8"]
    requests = [model.decode_json(c["request"]) for c in served(cases, models) if c["model"] == "deepfm-int8"][:4]
    assert len({r.items.shape[0] for r in requests}) > 1, "requests of different sizes"
    together = model.score(requests)
    alone = np.concatenate([model.score([r]) for r in requests])
    assert together.shape == alone.shape
    assert np.max(np.abs(together - alone)) <= 1e-5


def test_ids_outside_a_reject_table_are_refused_in_both_forms(cases: dict, models: dict) -> None:
    for case in cases["error_cases"]:
        field = case["input"].rsplit(".", 1)[1]
        rows = next(t["rows"] for t in cases["models"][case["model"]]["oov"]["reject"] if field in t["fields"])
        # The range is said the way every recserve message says it: the last valid id, not the row count.
        pattern = rf"(\({field}\)|\.{field}): id -?\d+ is outside the vocabulary of table .* \(ids 0 to {rows - 1}\)"
        model = models[case["model"]]
        for request in (case["request"], columnar(case["request"])):
            with pytest.raises(RequestError, match=pattern):
                model.decode_json(request)


def test_malformed_requests_name_the_input(cases: dict, models: dict) -> None:
    model = models["deepfm-int8"]
    good = next(c["request"] for c in served(cases, models) if c["model"] == "deepfm-int8")
    item_fields = sorted(good["candidates"][0]["fields"])

    def refused(request: dict, message: str) -> None:
        with pytest.raises(RequestError, match=message):
            model.decode_json(request)

    refused({"user": good["user"]}, "^candidates: must be an array")
    refused({**good, "user": {**good["user"], "dense": [1.0]}}, "^user.dense: holds 1 values")
    user = copy.deepcopy(good["user"])
    del user["fields"]["C1"]
    refused({**good, "user": user}, r"^user.fields.C1: is missing")
    rows = copy.deepcopy(good)
    rows["candidates"][0]["fields"][item_fields[0]] = 1.5
    refused(rows, rf"^candidates\[0\].fields.{item_fields[0]}: must be an integer id")

    packed = columnar(good)
    c = packed["candidates"]
    refused(
        {**packed, "candidates": {**c, "fields": c["fields"] + [c["fields"][0]]}}, r"candidates.fields\[\d+\]: .* twice"
    )
    refused(
        {**packed, "candidates": {**c, "fields": ["nope", *c["fields"][1:]]}}, r"candidates.fields\[0\]: 'nope' is not"
    )
    refused(
        {**packed, "candidates": {**c, "fields": c["fields"][1:], "ids": [r[1:] for r in c["ids"]]}},
        "misses item field",
    )
    refused(
        {**packed, "candidates": {**c, "ids": [r[1:] for r in c["ids"]]}},
        rf"candidates.ids: must be an array of rows of {len(item_fields)}",
    )
    refused({**packed, "candidates": {**c, "ids": []}}, "candidates.ids: must be an array of at least one row")
    refused(
        {**packed, "candidates": {**c, "ids": [[0.5] * len(item_fields)]}}, "candidates.ids: must be an array of rows"
    )
    no_ids = {k: v for k, v in c.items() if k != "id"}
    refused({**packed, "candidates": no_ids}, "candidates.id: is missing")
    refused({**packed, "candidates": {**c, "id": c["id"] + [1]}}, "candidates.id: must be an array of")
