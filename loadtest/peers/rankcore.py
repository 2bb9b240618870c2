"""DeepFM ranking in numpy and onnxruntime: what the peer servers (FastAPI, Triton's Python backend) compute.

It reads the same model version directory recserve serves (docs/model-repository.md): `model.toml`, the
safetensors tables and the ONNX dense graph. A request is one user and its candidates ([`Request`]): the user's
ids once (`[user fields]`, the model's field order), its dense values once, and the candidates' item ids as a
matrix (`[candidates, item fields]`, the model's order, the item id field among them). It comes from a `/v1`
rank body in either form (docs/api.md: `candidates` an array of rows, or columnar: the item fields named once and
an id matrix) or, in the Triton peer, from tensors of that shape.

Scoring takes several requests at once (a batch): per table, one numpy `take` over the id matrix of every
candidate of the batch (fields that share a table share the take), the user side gathered once per request and
broadcast to its rows; out-of-vocabulary ids read the table's default row, fp16 and fused row-wise int8 rows are
dequantized as the server does it (`f32(code) * scale + bias`, a multiply then an add); then one onnxruntime run
(one intra-op thread, as recserve runs it by default) gives one probability per candidate. This is the code a team
that cares writes without a serving system: vectorised numpy, not a port of recserve's Rust gather.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from safetensors.numpy import load_file

INT8_TRAILER = 8  # bytes after the codes of a fused int8 row: scale, then bias, float32 little-endian


class RequestError(ValueError):
    """A request the server answers with 400; the message starts with the input's path."""


@dataclass(frozen=True)
class Table:
    name: str
    rows: int
    dim: int
    storage: str  # fp32 | fp16 | int8
    rejects_unknown: bool
    default_row: int
    data: np.ndarray  # as stored: float32 / float16 [rows, dim], or uint8 [rows, dim + 8]


@dataclass(frozen=True)
class Field:
    name: str
    side: str  # user | item
    table: Table


@dataclass(frozen=True)
class Request:
    """One user and its candidates, validated."""

    user: np.ndarray  # int64 [user fields]
    dense: np.ndarray  # float32 [dense features]
    items: np.ndarray  # int64 [candidates, item fields]
    ids: list[Any] | None  # the candidates' `id`s as sent, echoed in the answer


@dataclass(frozen=True)
class _Group:
    """The fields of one side that read one table: their columns in that side's id matrix, their positions in the
    graph's `[rows, fields, dim]` input."""

    table: Table
    columns: list[int]
    positions: list[int]


def highest_version(model_dir: Path) -> tuple[int, Path]:
    """The version recserve serves by default: the highest integer directory."""
    versions = sorted(
        int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and not p.name.startswith("0")
    )
    if not versions:
        raise ValueError(f"{model_dir}: no version directory")
    return versions[-1], model_dir / str(versions[-1])


def _groups(fields: Sequence[Field], positions: Sequence[int]) -> list[_Group]:
    by_table: dict[str, _Group] = {}
    for column, position in enumerate(positions):
        table = fields[position].table
        group = by_table.setdefault(table.name, _Group(table, [], []))
        group.columns.append(column)
        group.positions.append(position)
    return list(by_table.values())


def _integer(value: Any, path: str) -> int:
    """`value` as an id, or a RequestError naming `path`."""
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise RequestError(f"{path}: must be an integer id")
    return value


def _integers(values: Any, path: str, shape: tuple[int, ...]) -> np.ndarray:
    """`values` as an int64 array of `shape` (-1: any length), or a RequestError naming `path`."""
    what = f"an array of {shape[0]} integer ids" if len(shape) == 1 else f"an array of rows of {shape[1]} integer ids"
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as e:  # ragged rows
        raise RequestError(f"{path}: must be {what}") from e
    if (
        array.dtype.kind not in "iu"
        or array.ndim != len(shape)
        or any(want not in (-1, got) for want, got in zip(shape, array.shape, strict=True))
    ):
        raise RequestError(f"{path}: must be {what}")
    return array.astype(np.int64, copy=False)


class RankModel:
    """One DeepFM model version, loaded for scoring."""

    def __init__(self, repository: Path, name: str, intra_op_threads: int = 1) -> None:
        self.name = name
        self.version, directory = highest_version(Path(repository) / name)
        spec = tomllib.loads((directory / "model.toml").read_text(encoding="utf-8"))
        if spec.get("kind") != "deepfm":
            raise ValueError(f"{directory}/model.toml: kind is {spec.get('kind')!r}, not 'deepfm'")
        files: dict[str, dict[str, np.ndarray]] = {}
        tables: dict[str, Table] = {}
        for t in spec["tables"]:
            tensors = files.setdefault(t["file"], load_file(str(directory / t["file"])))
            tables[t["name"]] = Table(
                name=t["name"],
                rows=int(t["rows"]),
                dim=int(t["dim"]),
                storage=t["storage"],
                rejects_unknown=t.get("oov", "default") == "reject",
                default_row=int(t.get("default_row", 0)),
                data=tensors[t["name"]],
            )
        self.fields = [Field(f["name"], f["side"], tables[f.get("table", f["name"])]) for f in spec["fields"]]
        ranking = spec.get("ranking", {})
        self.dense_features = len(ranking.get("dense_features", []))
        self.item_id_field: str | None = ranking.get("item_id_field")
        self.dim = self.fields[0].table.dim

        user_positions = [p for p, f in enumerate(self.fields) if f.side == "user"]
        item_positions = [p for p, f in enumerate(self.fields) if f.side == "item"]
        self.user_fields = [self.fields[p].name for p in user_positions]
        self.item_fields = [self.fields[p].name for p in item_positions]
        self._user_groups = _groups(self.fields, user_positions)
        self._item_groups = _groups(self.fields, item_positions)
        self._user_positions = user_positions
        # The item id field's column, and the columns the body names (every other item field).
        self._id_column = self.item_fields.index(self.item_id_field) if self.item_id_field else None
        self.named_item_fields = [f for f in self.item_fields if f != self.item_id_field]
        self._named_columns = [c for c, f in enumerate(self.item_fields) if f != self.item_id_field]
        self._column_orders: dict[tuple[str, ...], np.ndarray] = {}

        graph = spec["dense_graph"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(directory / graph["file"]), options, providers=["CPUExecutionProvider"])
        self.embeddings_input = graph.get("embeddings_input", "embeddings")
        self.dense_input = graph.get("dense_input", "dense")
        self.output = graph.get("output", "probability")

    # --- requests ---------------------------------------------------------------------------------------------

    def decode_json(self, body: Any) -> Request:
        """A parsed `/v1` rank body, in either form."""
        if not isinstance(body, Mapping):
            raise RequestError("the body must be a JSON object")
        user = body.get("user") or {}
        if not isinstance(user, Mapping):
            raise RequestError("user: must be an object")
        fields = user.get("fields") or {}
        if not isinstance(fields, Mapping):
            raise RequestError("user.fields: must be an object")
        user_ids = np.empty(len(self.user_fields), dtype=np.int64)
        for c, name in enumerate(self.user_fields):
            if name not in fields:
                raise RequestError(f"user.fields.{name}: is missing")
            user_ids[c] = _integer(fields[name], f"user.fields.{name}")
        dense = self._dense(user.get("dense"))
        candidates = body.get("candidates")
        if isinstance(candidates, Mapping):
            items, ids = self._columnar(candidates)
            path = "candidates.ids[{row}] ({field})"
        elif isinstance(candidates, list):
            items, ids = self._rows(candidates)
            path = "candidates[{row}] ({field})"
        else:
            raise RequestError("candidates: must be an array of candidates or an object of columns")
        return self.request(user_ids, dense, items, ids, path)

    def request(
        self, user: np.ndarray, dense: np.ndarray, items: np.ndarray, ids: list[Any] | None, item_path: str
    ) -> Request:
        """A request of ids already in the model's order, checked against the tables that reject unknown ids;
        `item_path` names a candidate's id in messages (`{row}`, `{field}`)."""
        if items.shape[0] == 0:
            raise RequestError("candidates: must hold at least one candidate")
        for group in self._user_groups:
            if group.table.rejects_unknown:
                for c in group.columns:
                    self._check(int(user[c]), group.table, f"user.fields.{self.user_fields[c]}")
        for group in self._item_groups:
            if not group.table.rejects_unknown:
                continue
            block = items[:, group.columns]
            outside = (block < 0) | (block >= group.table.rows)
            if outside.any():
                row, k = (int(x) for x in np.argwhere(outside)[0])
                column = group.columns[k]
                where = item_path.format(row=row, field=self.item_fields[column])
                self._check(int(block[row, k]), group.table, where)
        return Request(user, dense, items, ids)

    @staticmethod
    def _check(value: int, table: Table, path: str) -> None:
        if not 0 <= value < table.rows:
            raise RequestError(
                f"{path}: id {value} is outside the vocabulary of table {table.name!r} (ids 0 to {table.rows - 1}), "
                "which rejects unknown ids"
            )

    def _dense(self, dense: Any) -> np.ndarray:
        dense = [] if dense is None else dense
        if not isinstance(dense, list) or len(dense) != self.dense_features:
            count = len(dense) if isinstance(dense, list) else "no array of"
            raise RequestError(
                f"user.dense: holds {count} values, but the model takes {self.dense_features} dense features"
            )
        try:
            values = np.asarray(dense, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise RequestError(f"user.dense: must be numbers ({e})") from e
        if not np.isfinite(values).all():
            raise RequestError("user.dense: must be finite numbers")
        return values

    def _columnar(self, columns: Mapping[str, Any]) -> tuple[np.ndarray, list[Any] | None]:
        names = columns.get("fields")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise RequestError("candidates.fields: must be an array of item field names")
        order = self._column_orders.get(tuple(names))
        if order is None:
            order = self._column_order(names)
            self._column_orders[tuple(names)] = order
        rows = columns.get("ids")
        if not isinstance(rows, list) or not rows:
            raise RequestError("candidates.ids: must be an array of at least one row of ids")
        matrix = _integers(rows, "candidates.ids", (-1, len(names)))
        items = np.empty((matrix.shape[0], len(self.item_fields)), dtype=np.int64)
        items[:, self._named_columns] = matrix[:, order]
        ids = columns.get("id")
        if self._id_column is not None:
            if ids is None:
                raise RequestError(f"candidates.id: is missing (it carries the item id field {self.item_id_field})")
            items[:, self._id_column] = _integers(ids, "candidates.id", (matrix.shape[0],))
        elif ids is not None and (not isinstance(ids, list) or len(ids) != matrix.shape[0]):
            raise RequestError(f"candidates.id: must hold {matrix.shape[0]} ids, one per row of candidates.ids")
        return items, ids

    def _column_order(self, names: list[str]) -> np.ndarray:
        """For each named item field (the model's order), its column in a body whose `candidates.fields` is
        `names`."""
        at: dict[str, int] = {}
        for j, name in enumerate(names):
            if name in at:
                raise RequestError(f"candidates.fields[{j}]: {name!r} appears twice")
            if name not in self.named_item_fields:
                raise RequestError(
                    f"candidates.fields[{j}]: {name!r} is not an item field of model {self.name} "
                    f"(item fields: {', '.join(self.named_item_fields)})"
                )
            at[name] = j
        missing = [n for n in self.named_item_fields if n not in at]
        if missing:
            raise RequestError(f"candidates.fields: misses item field(s) {', '.join(missing)}")
        return np.array([at[n] for n in self.named_item_fields], dtype=np.intp)

    def _rows(self, candidates: list[Any]) -> tuple[np.ndarray, list[Any] | None]:
        items = np.empty((len(candidates), len(self.item_fields)), dtype=np.int64)
        ids = []
        for i, candidate in enumerate(candidates):
            if not isinstance(candidate, Mapping):
                raise RequestError(f"candidates[{i}]: must be an object")
            own = candidate.get("fields") or {}
            if not isinstance(own, Mapping):
                raise RequestError(f"candidates[{i}].fields: must be an object")
            ids.append(candidate.get("id"))
            for c, name in enumerate(self.item_fields):
                value, path = (
                    (ids[-1], f"candidates[{i}].id")
                    if c == self._id_column
                    else (own.get(name), f"candidates[{i}].fields.{name}")
                )
                if value is None:
                    raise RequestError(f"{path}: is missing")
                items[i, c] = _integer(value, path)
        return items, (ids if any(i is not None for i in ids) else None)

    # --- scoring ----------------------------------------------------------------------------------------------

    def _lookup(self, groups: Iterable[_Group], ids: np.ndarray, out: np.ndarray, positions: bool) -> None:
        """Writes the rows of `ids` (`[n, columns]`) into `out` (`[n, fields or columns, dim]`): at the fields'
        graph positions when `positions`, else at their columns."""
        dim = self.dim
        for group in groups:
            table = group.table
            block = ids[:, group.columns]
            outside = (block < 0) | (block >= table.rows)
            if outside.any():
                block = np.where(outside, table.default_row, block)
            rows = table.data.take(block, axis=0)
            if table.storage == "int8":
                scale = np.ascontiguousarray(rows[..., dim : dim + 4]).view("<f4")
                bias = np.ascontiguousarray(rows[..., dim + 4 : dim + 8]).view("<f4")
                values = rows[..., :dim].astype(np.float32) * scale + bias
            else:
                values = rows
            out[:, group.positions if positions else group.columns, :] = values

    def score(self, requests: Sequence[Request]) -> np.ndarray:
        """One probability per candidate of every request, in order."""
        counts = [r.items.shape[0] for r in requests]
        items = requests[0].items if len(requests) == 1 else np.concatenate([r.items for r in requests])
        users = np.stack([r.user for r in requests])
        embeddings = np.empty((items.shape[0], len(self.fields), self.dim), dtype=np.float32)
        self._lookup(self._item_groups, items, embeddings, positions=True)
        user_rows = np.empty((len(requests), len(self.user_fields), self.dim), dtype=np.float32)
        self._lookup(self._user_groups, users, user_rows, positions=False)
        if len(requests) == 1:
            embeddings[:, self._user_positions, :] = user_rows[0]
        else:
            embeddings[:, self._user_positions, :] = np.repeat(user_rows, counts, axis=0)
        feeds = {self.embeddings_input: embeddings}
        if self.dense_features:
            feeds[self.dense_input] = np.repeat(np.stack([r.dense for r in requests]), counts, axis=0)
        return self.session.run([self.output], feeds)[0].reshape(-1)


def load_models(repository: Path, names: Iterable[str], intra_op_threads: int = 1) -> dict[str, RankModel]:
    return {name: RankModel(repository, name, intra_op_threads) for name in names}
