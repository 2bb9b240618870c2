"""The v1 rank request mapped onto the graph inputs, and the requests the server must refuse."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from recserve_models.model_toml import DeepFMToml, DenseGraphSpec, FieldSpec, RankingSpec, TableSpec
from recserve_models.rank_request import RequestError, rank_inputs
from recserve_models.repository import Table, encode_table

SPECS = (
    TableSpec("u", "t.safetensors", 4, 3, "fp32"),
    TableSpec("item", "t.safetensors", 6, 3, "fp32", oov="default", default_row=5),
    TableSpec("shop", "t.safetensors", 2, 3, "fp32", oov="reject"),
)
FIELDS = (FieldSpec("u", "user"), FieldSpec("item", "item"), FieldSpec("shop", "item"))
# Row r of every table is [r, 10 * table index, 0], so a gathered row says which row of which table it is.
TABLES = {
    s.name: Table(s, encode_table(s, np.array([[r, 10 * i, 0] for r in range(s.rows)], dtype=np.float32)))
    for i, s in enumerate(SPECS)
}


def model(item_id_field: str | None = "item", dense: tuple[str, ...] = ("d0", "d1")) -> DeepFMToml:
    return DeepFMToml(SPECS, FIELDS, DenseGraphSpec("g.onnx", "fp32"), RankingSpec(dense, item_id_field))


def request(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "user": {"fields": {"u": 3}, "dense": [-1.5, 2.0]},
        "candidates": [{"id": 1, "fields": {"shop": 0}}, {"id": 99, "fields": {"shop": 1}}],
    }
    return base | changes


def test_user_rows_repeat_item_rows_vary_and_ids_fill_the_item_id_field() -> None:
    emb, dense = rank_inputs(model(), TABLES, request())
    assert emb.shape == (2, 3, 3) and dense.shape == (2, 2)
    assert emb[:, 0].tolist() == [[3, 0, 0], [3, 0, 0]]
    assert emb[:, 1].tolist() == [[1, 10, 0], [5, 10, 0]]  # id 99 is out of vocabulary: default row 5
    assert emb[:, 2].tolist() == [[0, 20, 0], [1, 20, 0]]
    assert dense.tolist() == [[-1.5, 2.0], [-1.5, 2.0]]
    emb, _ = rank_inputs(model(), TABLES, request(user={"fields": {"u": -4}, "dense": [0, 0]}))
    assert emb[:, 0].tolist() == [[0, 0, 0], [0, 0, 0]]  # out of vocabulary: default row 0


def test_without_item_id_field_the_id_is_optional_and_fields_carry_every_item_field() -> None:
    candidates = [{"fields": {"item": 2, "shop": 1}}, {"id": 7, "fields": {"item": 0, "shop": 0}}]
    emb, _ = rank_inputs(model(item_id_field=None), TABLES, request(candidates=candidates))
    assert emb[:, 1, 0].tolist() == [2, 0]


def test_a_model_without_dense_features_takes_an_empty_dense_input() -> None:
    _, dense = rank_inputs(model(dense=()), TABLES, request(user={"fields": {"u": 0}}))
    assert dense.shape == (2, 0)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"user": {"fields": {}, "dense": [0, 0]}}, "user.fields.u: is missing"),
        ({"user": {"fields": {"u": 1, "x": 2}, "dense": [0, 0]}}, "user.fields.x: is not one of the fields"),
        ({"user": {"fields": {"u": True}, "dense": [0, 0]}}, "user.fields.u: must be a signed 64-bit integer"),
        ({"user": {"fields": {"u": 2**63}, "dense": [0, 0]}}, "user.fields.u: must be a signed 64-bit integer"),
        ({"user": {"fields": {"u": 0}, "dense": [0]}}, r"user.dense: must be an array of 2 numbers \(d0, d1\)"),
        ({"user": {"fields": {"u": 0}, "dense": [0, float("nan")]}}, r"user.dense\[1\]: nan is not a finite"),
        ({"user": {"fields": {"u": 0}, "dense": [1e39, 0]}}, r"user.dense\[0\]: 1e\+39 is not a finite float32"),
        ({"candidates": []}, "candidates: must be a non-empty array"),
        ({"candidates": [{"fields": {"shop": 0}}]}, r"candidates\[0\].id: is required, it is the value of field"),
        ({"candidates": [{"id": 1, "fields": {"shop": 0, "item": 1}}]}, r"candidates\[0\].fields.item: is not one"),
        (
            {"candidates": [{"id": 1, "fields": {"shop": 0}}, {"id": 1, "fields": {"shop": 2}}]},
            r"candidates\[1\].fields.shop: id 2 is outside the vocabulary of table 'shop' \(ids 0 to 1\)",
        ),
    ],
)
def test_requests_that_break_the_api_are_refused_naming_the_input(changes: dict, message: str) -> None:
    with pytest.raises(RequestError, match=f"^{message}"):
        rank_inputs(model(), TABLES, request(**changes))
