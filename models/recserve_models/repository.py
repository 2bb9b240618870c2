"""A model version directory: writing one, and reading its tables back through the reference gather.

A version directory holds `model.toml`, the safetensors files its tables name, and (DeepFM) the dense graph
(docs/model-repository.md). `write_deepfm_version` and `write_lightgcn_version` store float32 tables in the
storage each `TableSpec` asks for; `load_tables` maps them back and checks each tensor's dtype and shape against
the document; `gather` is the naive reference of the server's embedding lookup: the OOV policy, then
dequantization. Files and tensors that `model.toml` does not name (such as the toolchain's `vocabulary.json`) are
ignored by the server and by `check`; a LightGCN version's popularity order is named by `[recall] popularity`.
"""

from __future__ import annotations

import json

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import safe_open, save

from . import cooccurrence as cooc
from . import files, model_toml
from .model_toml import DeepFMToml, LightGCNToml, ModelToml, TableSpec, id_range
from .quantize import INT8_TRAILER, dequantize_rowwise_int8, quantize_rowwise_int8, to_fp16

if TYPE_CHECKING:
    import onnx

MODEL_TOML = "model.toml"
# A LightGCN version's popularity order: training interactions per item, int64 [items], in the item table's file,
# named by `[recall] popularity` (the server answers a history without signal with it: docs/api.md).
POPULARITY = "item_popularity"

_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int8": np.uint8}


def stored_shape(spec: TableSpec) -> tuple[int, int]:
    """The shape of the table's tensor in its safetensors file."""
    return (spec.rows, spec.dim + INT8_TRAILER) if spec.storage == "int8" else (spec.rows, spec.dim)


def encode_table(spec: TableSpec, values: np.ndarray) -> np.ndarray:
    """The tensor that stores float32 `values` [rows, dim] as `spec.storage`."""
    if values.shape != (spec.rows, spec.dim):
        raise ValueError(
            f"table {spec.name!r} has shape {list(values.shape)}, model.toml says [{spec.rows}, {spec.dim}]"
        )
    if spec.storage == "int8":
        return quantize_rowwise_int8(spec.name, values)
    if spec.storage == "fp16":
        return to_fp16(spec.name, values)
    return np.ascontiguousarray(values, dtype=np.float32)


def write_deepfm_version(
    directory: Path,
    model: DeepFMToml,
    tables: Mapping[str, np.ndarray],
    graph: onnx.ModelProto,
    item_features: np.ndarray | None = None,
    cooccurrence: cooc.Cooccurrence | None = None,
) -> None:
    """Write a complete version directory: every table of `model` from its float32 `tables` entry, the item feature
    table (int64 [items, columns], when `model` has `[item_features]`), the co-occurrence table (when it has
    `[cooccurrence]`), the dense graph, then `model.toml`. `directory` must not exist yet."""
    missing = [spec.name for spec in model.tables if spec.name not in tables]
    if missing:
        raise ValueError(f"no values given for table {missing[0]!r}")
    features = model.item_features
    if (features is None) != (item_features is None):
        raise ValueError("item_features values are given exactly when model.toml has [item_features]")
    extra = {}
    if features is not None and item_features is not None:
        if item_features.dtype != np.int64 or item_features.ndim != 2 or item_features.shape[1] != len(features.fields):
            raise ValueError(
                f"item_features is {item_features.dtype} {list(item_features.shape)}, but [item_features] needs int64 "
                f"[items, {len(features.fields)}]"
            )
        extra[features.file] = {features.tensor: np.ascontiguousarray(item_features)}
    if (model.cooccurrence is None) != (cooccurrence is None):
        raise ValueError("a co-occurrence table is given exactly when model.toml has [cooccurrence]")
    files.mkdir(directory)
    _write_tables(directory, model, tables, extra)
    if model.cooccurrence is not None and cooccurrence is not None:
        cooc.write(directory / model.cooccurrence.file, cooccurrence)
    from .onnx_export import save as save_onnx  # here: onnx is slow to import, and reading tables needs none

    save_onnx(graph, directory / model.dense_graph.file)
    files.write_text(directory / MODEL_TOML, model_toml.to_toml(model), encoding="utf-8")


def write_lightgcn_version(
    directory: Path,
    model: LightGCNToml,
    tables: Mapping[str, np.ndarray],
    popularity: np.ndarray | None = None,
) -> None:
    """Write a complete LightGCN version directory: every table of `model`, then `model.toml`; with `popularity`
    (training interactions per item), also the tensor `POPULARITY` beside the item table, named by
    `[recall] popularity`. `directory` must not exist yet."""
    missing = [spec.name for spec in model.tables if spec.name not in tables]
    if missing:
        raise ValueError(f"no values given for table {missing[0]!r}")
    extra = {}
    if popularity is not None:
        item = model.table(model.recall.item_table)
        if popularity.shape != (item.rows,) or popularity.dtype != np.int64 or (popularity < 0).any():
            raise ValueError(
                f"popularity is {popularity.dtype} {list(popularity.shape)}, but item table {item.name!r} needs "
                f"int64 [{item.rows}] of counts ≥ 0"
            )
        extra[item.file] = {POPULARITY: popularity}
        model = replace(model, recall=replace(model.recall, popularity=POPULARITY))
    files.mkdir(directory)
    _write_tables(directory, model, tables, extra)
    files.write_text(directory / MODEL_TOML, model_toml.to_toml(model), encoding="utf-8")


def read_popularity(directory: Path, model: LightGCNToml) -> np.ndarray | None:
    """The popularity order of a LightGCN version (`[recall] popularity`, in its item table's file), checked as the
    server checks it (int64 [items], no count negative), or None when it has none. Raises `TableError`."""
    if model.recall.popularity is None:
        return None
    item = model.table(model.recall.item_table)
    path, name = directory / item.file, model.recall.popularity
    try:
        with safe_open(path, framework="numpy") as f:
            if name not in f.keys():
                raise TableError(f"{path}: no tensor named {name!r} (recall.popularity in {MODEL_TOML})")
            counts = f.get_tensor(name)
    except (OSError, SafetensorError) as e:
        raise TableError(f"{path}: cannot read recall.popularity {name!r}: {e}") from e
    if counts.dtype != np.int64 or counts.shape != (item.rows,):
        raise TableError(
            f"{path}: tensor {name!r} is {counts.dtype} {list(counts.shape)}, but recall.popularity needs int64 "
            f"[{item.rows}]: one count per item of the catalogue"
        )
    if (counts < 0).any():
        raise TableError(f"{path}: tensor {name!r} holds a negative count: counts are never negative")
    return counts


def read_item_features(directory: Path, model: DeepFMToml) -> np.ndarray | None:
    """The item feature table of a DeepFM version (`[item_features]`), checked as the server checks it (int64
    [items, columns], at least one item, every id of a `reject` table's column inside it), or None when it has
    none. Raises `TableError`."""
    features = model.item_features
    if features is None:
        return None
    path = directory / features.file
    try:
        with safe_open(path, framework="numpy") as f:
            if features.tensor not in f.keys():
                raise TableError(f"{path}: no tensor named {features.tensor!r} ([item_features] in {MODEL_TOML})")
            values = f.get_tensor(features.tensor)
    except (OSError, SafetensorError) as e:
        raise TableError(f"{path}: cannot read [item_features] {features.tensor!r}: {e}") from e
    if values.dtype != np.int64 or values.ndim != 2 or values.shape[1] != len(features.fields) or not len(values):
        raise TableError(
            f"{path}: tensor {features.tensor!r} is {values.dtype} {list(values.shape)}, but [item_features] needs "
            f"int64 [items, {len(features.fields)}] (one column per entry of item_features.fields, at least one item)"
        )
    tables = {f.name: model.table(f.table) for f in model.fields}
    for column, name in enumerate(features.fields):
        table = tables[name]
        if table.oov != "reject":
            continue
        outside = np.flatnonzero((values[:, column] < 0) | (values[:, column] >= table.rows))
        if len(outside):
            row = int(outside[0])
            raise TableError(
                f"{path}: tensor {features.tensor!r} row {row}, column {name!r}: id {values[row, column]} is outside "
                f"table {table.name!r} ({id_range(table.rows)}), which rejects unknown ids"
            )
    return values


def catalogue_items(model: DeepFMToml, item_features: np.ndarray | None) -> int | None:
    """The items a ranking model knows, where its files say: the rows of its item feature table, else those of the
    `item_id_field`'s table when it rejects unknown ids; None when neither says."""
    if item_features is not None:
        return len(item_features)
    item_id = model.ranking.item_id_field
    if item_id is not None:
        table = model.table(next(f.table for f in model.fields if f.name == item_id))
        if table.oov == "reject":
            return table.rows
    return None


def read_cooccurrence(directory: Path, model: DeepFMToml, items: int | None = None) -> cooc.Cooccurrence | None:
    """The co-occurrence table of a ranking model (`[cooccurrence]`), checked by `cooccurrence.read` (with `items`
    rows when given), or None when it has none. Raises `TableError`."""
    if model.cooccurrence is None:
        return None
    try:
        return cooc.read(directory / model.cooccurrence.file, items)
    except cooc.CooccurrenceError as e:
        raise TableError(f"{e} ([cooccurrence] in {MODEL_TOML})") from e


def _write_tables(
    directory: Path,
    model: ModelToml,
    tables: Mapping[str, np.ndarray],
    extra: Mapping[str, Mapping[str, np.ndarray]] | None = None,
) -> None:
    by_file: dict[str, dict[str, np.ndarray]] = {}
    for spec in model.tables:
        by_file.setdefault(spec.file, {})[spec.name] = encode_table(spec, tables[spec.name])
    for file, tensors in (extra or {}).items():
        by_file.setdefault(file, {}).update(tensors)
    for file, tensors in by_file.items():
        files.write_bytes(directory / file, save(tensors))


@dataclass(frozen=True)
class Table:
    """A table as stored: its spec and its tensor (dtype and shape as docs/model-repository.md says)."""

    spec: TableSpec
    stored: np.ndarray


class TableError(ValueError):
    """A table tensor that is missing or does not match its model.toml entry."""


def load_tables(directory: Path, model: ModelToml, mapped: bool = False) -> dict[str, Table]:
    """Every table of `model` from the safetensors files in `directory`, checked against its spec. With `mapped`,
    each table is a read-only `np.memmap` of its file (for catalogues too large to copy), not an array in memory."""
    tables = {}
    for spec in model.tables:
        path = directory / spec.file
        try:
            if mapped:
                stored = _map_tensor(path, spec.name)
            else:
                with safe_open(path, framework="numpy") as f:
                    names = f.keys()
                    if spec.name not in names:
                        raise TableError(
                            f"{path}: no tensor named {spec.name!r} (table {spec.name!r} in {MODEL_TOML})"
                        )
                    stored = f.get_tensor(spec.name)
        except (OSError, SafetensorError, ValueError) as e:
            if isinstance(e, TableError):
                raise
            raise TableError(f"{path}: cannot read table {spec.name!r}: {e}") from e
        expected_dtype, expected_shape = np.dtype(_DTYPES[spec.storage]), stored_shape(spec)
        if stored.dtype != expected_dtype or stored.shape != expected_shape:
            raise TableError(
                f"{path}: tensor {spec.name!r} is {stored.dtype} {list(stored.shape)} but storage {spec.storage!r} "
                f"with rows {spec.rows} and dim {spec.dim} needs {expected_dtype} {list(expected_shape)}"
            )
        tables[spec.name] = Table(spec=spec, stored=stored)
    return tables


_SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "U8": "u1", "I64": "<i8", "U32": "<u4"}


def _map_tensor(path: Path, name: str) -> np.ndarray:
    """Tensor `name` of the safetensors file `path` as a read-only memory map (the layout: an 8-byte
    little-endian header length, the JSON header with each tensor's dtype, shape and data offsets, then the data)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    if name not in header or name == "__metadata__":
        raise TableError(f"{path}: no tensor named {name!r} (table {name!r} in {MODEL_TOML})")
    entry = header[name]
    if entry["dtype"] not in _SAFETENSORS_DTYPES:
        raise TableError(f"{path}: tensor {name!r} has dtype {entry['dtype']}, which no table uses")
    start, end = entry["data_offsets"]
    dtype, shape = np.dtype(_SAFETENSORS_DTYPES[entry["dtype"]]), tuple(entry["shape"])
    if end - start != dtype.itemsize * int(np.prod(shape)):
        raise TableError(f"{path}: tensor {name!r} spans {end - start} bytes, not those of {entry['dtype']} {shape}")
    return np.memmap(path, dtype=dtype, mode="r", offset=8 + size + start, shape=shape)


class OutOfVocabulary(ValueError):
    """An id outside `[0, rows)` of a table whose policy is `oov = "reject"`."""

    def __init__(self, spec: TableSpec, id_: int) -> None:
        where = f"table {spec.name!r} ({id_range(spec.rows)})"
        super().__init__(f"id {id_} is outside the vocabulary of {where}, which rejects unknown ids")
        self.table = spec.name
        self.id = id_


def resolve_ids(spec: TableSpec, ids: np.ndarray) -> np.ndarray:
    """The rows that `ids` (int64) read under the table's OOV policy; raises `OutOfVocabulary` for `reject`."""
    outside = (ids < 0) | (ids >= spec.rows)
    if not outside.any():
        return ids
    if spec.oov == "reject":
        raise OutOfVocabulary(spec, int(ids[outside][0]))
    return np.where(outside, spec.default_row, ids)


def dequantize(spec: TableSpec, stored_rows: np.ndarray) -> np.ndarray:
    """Float32 values of stored rows, computed as the server does."""
    if spec.storage == "int8":
        return dequantize_rowwise_int8(stored_rows)
    return stored_rows.astype(np.float32)


def values(table: Table) -> np.ndarray:
    """The whole table as float32 `[rows, dim]`, dequantized as the server does."""
    return dequantize(table.spec, table.stored)


def gather(table: Table, ids: np.ndarray) -> np.ndarray:
    """The float32 rows [len(ids), dim] that `ids` read from `table`, OOV policy applied."""
    ids = np.asarray(ids, dtype=np.int64)
    return dequantize(table.spec, table.stored[resolve_ids(table.spec, ids)])
