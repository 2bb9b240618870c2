"""DeepFM ranking in numpy and onnxruntime: what the peer servers (FastAPI, Triton's Python backend) compute.

It reads the same model version directory recserve serves (docs/model-repository.md): `model.toml`, the
safetensors tables and the ONNX dense graph. A `/v1` rank request (docs/api.md) becomes an id matrix
`[candidates, fields]` (the user's ids repeated on every row) and a dense matrix; the embedding gather is numpy
fancy indexing per field with the table's out-of-vocabulary policy, and fp16 or fused row-wise int8 rows are
dequantized as the server does it (`f32(code) * scale + bias`, a multiply then an add); then one onnxruntime run
(one intra-op thread, as recserve runs it by default) gives one probability per row.

This is the code a team without a serving system writes; it is deliberately plain numpy, not a port of
recserve's Rust gather.
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


def highest_version(model_dir: Path) -> tuple[int, Path]:
    """The version recserve serves by default: the highest integer directory."""
    versions = sorted(
        int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and not p.name.startswith("0")
    )
    if not versions:
        raise ValueError(f"{model_dir}: no version directory")
    return versions[-1], model_dir / str(versions[-1])


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
            oov = t.get("oov", "default")
            tables[t["name"]] = Table(
                name=t["name"],
                rows=int(t["rows"]),
                dim=int(t["dim"]),
                storage=t["storage"],
                rejects_unknown=oov == "reject",
                default_row=int(t.get("default_row", 0)),
                data=tensors[t["name"]],
            )
        self.fields = [Field(f["name"], f["side"], tables[f.get("table", f["name"])]) for f in spec["fields"]]
        ranking = spec.get("ranking", {})
        self.dense_features = len(ranking.get("dense_features", []))
        self.item_id_field: str | None = ranking.get("item_id_field")
        self.dim = self.fields[0].table.dim

        graph = spec["dense_graph"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(directory / graph["file"]), options, providers=["CPUExecutionProvider"]
        )
        self.embeddings_input = graph.get("embeddings_input", "embeddings")
        self.dense_input = graph.get("dense_input", "dense")
        self.output = graph.get("output", "probability")

    def decode(
        self,
        user_fields: Mapping[str, Any],
        dense: Sequence[Any],
        candidates: Sequence[tuple[Any, Mapping[str, Any]]],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ids `[C, F]` int64 and dense values `[C, N]` float32 of a request with candidates `(id, fields)`."""
        count = len(candidates)
        if count == 0:
            raise RequestError("candidates: must hold at least one candidate")
        if len(dense) != self.dense_features:
            raise RequestError(
                f"user.dense: holds {len(dense)} values, but the model takes {self.dense_features} dense features"
            )
        ids = np.empty((count, len(self.fields)), dtype=np.int64)
        try:
            for f, field in enumerate(self.fields):
                if field.side == "user":
                    path = f"user.fields.{field.name}"
                    ids[:, f] = user_fields[field.name]
                elif field.name == self.item_id_field:
                    path = "candidates[].id"
                    ids[:, f] = [c[0] for c in candidates]
                else:
                    path = f"candidates[].fields.{field.name}"
                    ids[:, f] = [c[1][field.name] for c in candidates]
        except KeyError as e:
            raise RequestError(f"{path}: is missing") from e
        except (TypeError, ValueError, OverflowError) as e:
            raise RequestError(f"{path}: must be an integer id ({e})") from e
        for f, field in enumerate(self.fields):
            table = field.table
            if table.rejects_unknown:
                column = ids[:, f]
                outside = (column < 0) | (column >= table.rows)
                if outside.any():
                    raise RequestError(
                        f"{field.name}: id {int(column[outside][0])} is outside the vocabulary of table "
                        f"{table.name!r} (ids 0 to {table.rows - 1}), which rejects unknown ids"
                    )
        try:
            values = np.asarray(dense, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise RequestError(f"user.dense: must be numbers ({e})") from e
        if not np.isfinite(values).all():
            raise RequestError("user.dense: must be finite numbers")
        return ids, np.tile(values, (count, 1))

    def decode_json(self, body: Any) -> tuple[np.ndarray, np.ndarray]:
        """`decode` of a parsed JSON body."""
        if not isinstance(body, Mapping) or not isinstance(body.get("candidates"), list):
            raise RequestError("candidates: must be an array")
        user = body.get("user") or {}
        candidates = [(c.get("id"), c.get("fields") or {}) for c in body["candidates"]]
        return self.decode(user.get("fields") or {}, user.get("dense") or [], candidates)

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """Embeddings `[C, F, D]` float32 of ids `[C, F]` (already checked against `reject` tables)."""
        count = ids.shape[0]
        out = np.empty((count, len(self.fields), self.dim), dtype=np.float32)
        dim = self.dim
        for f, field in enumerate(self.fields):
            table = field.table
            column = ids[:, f]
            outside = (column < 0) | (column >= table.rows)
            if outside.any():
                column = np.where(outside, table.default_row, column)
            rows = table.data[column]
            if table.storage == "int8":
                scale = rows[:, dim : dim + 4].copy().view("<f4")
                bias = rows[:, dim + 4 : dim + 8].copy().view("<f4")
                product = rows[:, :dim].astype(np.float32) * scale
                out[:, f, :] = product + bias
            else:
                out[:, f, :] = rows
        return out

    def score(self, ids: np.ndarray, dense: np.ndarray) -> np.ndarray:
        """One probability per row."""
        feeds = {self.embeddings_input: self.gather(ids)}
        if self.dense_features:
            feeds[self.dense_input] = dense
        return self.session.run([self.output], feeds)[0].reshape(-1)


def load_models(repository: Path, names: Iterable[str], intra_op_threads: int = 1) -> dict[str, RankModel]:
    return {name: RankModel(repository, name, intra_op_threads) for name in names}
