"""The v1 rank request (docs/api.md) turned into the dense graph's inputs, as the server does it.

This is the reference mapping the fixture computes expected scores with: `user.fields` fills the user-side
fields (the same row for every candidate), `candidates[i].fields` the item-side ones, `candidates[i].id` the
`item_id_field` when the model has one, and `user.dense` the `dense` input, repeated per candidate (`top_k`
only selects from the scores, so it plays no part here). Requests
that break the API's rules raise `RequestError` naming the offending input, worded like the server's 400s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .model_toml import DeepFMToml
from .repository import OutOfVocabulary, Table, gather

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
F32_MAX = float(np.finfo(np.float32).max)


class RequestError(ValueError):
    """A request the server answers with 400; the message starts with the input's path."""


def _id(path: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not I64_MIN <= value <= I64_MAX:
        raise RequestError(f"{path}: must be a signed 64-bit integer, not {value!r}")
    return value


def _field_ids(path: str, fields: Any, expected: list[str]) -> dict[str, int]:
    if not isinstance(fields, Mapping):
        raise RequestError(f"{path}: must be an object of field name to id")
    for name in fields:
        if name not in expected:
            raise RequestError(f"{path}.{name}: is not one of the fields expected here ({', '.join(expected)})")
    for name in expected:
        if name not in fields:
            raise RequestError(f"{path}.{name}: is missing")
    return {name: _id(f"{path}.{name}", fields[name]) for name in expected}


def rank_inputs(
    model: DeepFMToml, tables: Mapping[str, Table], request: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """`embeddings` float32 [C, F, D] and `dense` float32 [C, N] for a rank request with C candidates."""
    user = request.get("user")
    if not isinstance(user, Mapping):
        raise RequestError("user: must be an object")
    user_names = [f.name for f in model.fields_on("user")]
    user_ids = _field_ids("user.fields", user.get("fields", {}), user_names)

    features = model.ranking.dense_features
    dense_values = user.get("dense", [])
    if not isinstance(dense_values, list) or len(dense_values) != len(features):
        raise RequestError(f"user.dense: must be an array of {len(features)} numbers ({', '.join(features)})")
    for i, value in enumerate(dense_values):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RequestError(f"user.dense[{i}]: must be a number, not {value!r}")
        # The graph takes float32: a value beyond its range would reach it as infinity.
        if not (math.isfinite(value) and abs(value) <= F32_MAX):
            raise RequestError(f"user.dense[{i}]: {value!r} is not a finite float32 number")

    candidates = request.get("candidates")
    if not isinstance(candidates, list) or not candidates:
        raise RequestError("candidates: must be a non-empty array")
    item_id_field = model.ranking.item_id_field
    item_names = [f.name for f in model.fields_on("item") if f.name != item_id_field]
    item_ids: dict[str, list[int]] = {name: [] for name in item_names}
    if item_id_field is not None:
        item_ids[item_id_field] = []
    for i, candidate in enumerate(candidates):
        if not isinstance(candidate, Mapping):
            raise RequestError(f"candidates[{i}]: must be an object")
        for name, value in _field_ids(f"candidates[{i}].fields", candidate.get("fields", {}), item_names).items():
            item_ids[name].append(value)
        if item_id_field is not None:
            if "id" not in candidate:
                raise RequestError(f"candidates[{i}].id: is required, it is the value of field {item_id_field!r}")
            item_ids[item_id_field].append(_id(f"candidates[{i}].id", candidate["id"]))
        elif "id" in candidate:
            _id(f"candidates[{i}].id", candidate["id"])

    count = len(candidates)
    emb = np.empty((count, len(model.fields), model.table(model.fields[0].table).dim), dtype=np.float32)
    for f, field in enumerate(model.fields):
        if field.side == "user":
            ids, path = np.full(count, user_ids[field.name], dtype=np.int64), f"user.fields.{field.name}"
        else:
            ids = np.array(item_ids[field.name], dtype=np.int64)
            path = "candidates[{}].id" if field.name == item_id_field else f"candidates[{{}}].fields.{field.name}"
        try:
            emb[:, f, :] = gather(tables[field.table], ids)
        except OutOfVocabulary as e:
            where = path if field.side == "user" else path.format(int(np.flatnonzero(ids == e.id)[0]))
            raise RequestError(f"{where}: {e}") from e
    dense = np.tile(np.array(dense_values, dtype=np.float32), (count, 1))
    return emb, dense
