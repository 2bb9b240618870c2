"""Validating a model repository with the server's rules, and comparing precisions on data (what the `check`
command runs).

**Validation** applies what the server's loader applies before it serves a model, in the same order:

1. the repository layout (`src/repository/mod.rs`): hidden entries and plain files are skipped; a model
   directory name is `[A-Za-z0-9_-]{1,128}`; version directories are integers ≥ 1 written without a leading zero
   (other directory names are ignored); a model needs at least one version and the repository at least one model;
2. `model.toml` (`src/repository/spec.rs`, through `model_toml.read`);
3. every table's safetensors tensor: present, dtype and shape as its storage says (`src/embedding/file.rs`);
4. DeepFM: the dense graph (`src/executor/graph.rs`): ONNX Runtime opens it (CPU provider, all graph
   optimisations), it has exactly the declared inputs and the one declared output, float32 tensors of shape
   `[batch, F, D]`, `[batch, N]` and `[batch, 1]` or `[batch]` with a dynamic batch dimension and fixed
   dimensions equal to the counts from `model.toml`; and the server's warm-up (`src/executor/pool.rs`) runs:
   batches of 1 and `max_candidates` rows (row 0 of every field's table, zero dense features) return one score
   per row.

Unlike the server, which loads only the served version of each model, `check` validates every version (any of
them can be pinned). The parity of these rules with the server's is tested on a shared set of broken
repositories (`testing/check_cases.py`, `tests/check_parity.rs`).

**Comparison** (with `--deepfm-data` / `--lightgcn-data`): DeepFM models are evaluated on held-out rows (AUC, log
loss); models with the same fields and table shapes form a group, and the one with fp32 tables and an fp32 graph
is the group's reference: every other member is compared with it (largest and mean absolute probability
difference), and for a member that differs in both tables and graph the two mixed variants are evaluated too
(its graph on the reference's tables: "INT8 dense"; the reference's graph on its tables: "INT8 tables").
LightGCN models are evaluated by Recall@20 / NDCG@20 on the test split with training items excluded, with the
users of the user table and, when there is a history table, with the test users embedded from their training
history as the server would embed an unknown user; models with the same table shapes are grouped, and the
reference's user table is also paired with every other member's item table ("int8 item table").

Which test users a LightGCN figure counts (the rule `scripts/recall-check.py` applies too): a user-table figure
averages over every test user (a user with at least one test item); a history figure over the test users that
also have at least one training item, since an empty history cannot be embedded (the server refuses it). Each row
says how many users it counted (`test_users`) and how many test users it left out (`skipped_users`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from . import criteo, ivf, lightgcn, model_toml
from .metrics import auc, log_loss
from .model_toml import DeepFMToml, LightGCNToml, ModelToml, ModelTomlError
from .repository import (
    MODEL_TOML,
    Table,
    TableError,
    gather,
    load_tables,
    read_item_features,
    read_popularity,
    values,
)

MAX_CANDIDATES = 1000  # the server's default --max-candidates: its warm-up runs a batch of this size
VOCABULARY = "vocabulary.json"
_MODEL_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")
_U64_MAX = 2**64 - 1


class CheckError(ValueError):
    """A repository or model version the server would refuse; the message starts with the file at fault."""


@dataclass(frozen=True)
class ModelDir:
    name: str
    path: Path
    versions: tuple[int, ...]  # ascending

    @property
    def served(self) -> int:
        return self.versions[-1]


def _version_number(name: str) -> int | None:
    # The server's rule: plain decimal digits, ≥ 1, no leading zero (`+1` and `01` are not versions).
    if not re.fullmatch(r"[0-9]+", name) or name.startswith("0"):
        return None
    value = int(name)
    return value if 1 <= value <= _U64_MAX else None


def discover(root: Path) -> list[ModelDir]:
    """The models of a repository and their versions, by the server's rules."""
    try:
        entries = sorted(root.iterdir())
    except OSError as e:
        raise CheckError(f"{root}: cannot read the model repository: {e}") from e
    models = []
    for path in entries:
        if path.name.startswith(".") or not path.is_dir():
            continue
        if not _MODEL_NAME.fullmatch(path.name):
            raise CheckError(
                f"{path}: model directory names may contain only letters, digits, '_' and '-' (at most 128)"
            )
        versions = sorted(v for v in (_version_number(p.name) for p in path.iterdir() if p.is_dir()) if v is not None)
        if not versions:
            raise CheckError(
                f"{path}: has no version directory (expected <model>/<version>/model.toml with an integer version ≥ 1)"
            )
        models.append(ModelDir(path.name, path, tuple(versions)))
    if not models:
        raise CheckError(f"{root}: holds no model (expected <repository>/<model>/<version>/model.toml)")
    return models


def version_dir(model: ModelDir, version: int) -> Path:
    """The directory the server reads a version from: `<model>/<version>`."""
    return model.path / str(version)


# --- one version ------------------------------------------------------------------------------------------------


@dataclass
class Version:
    """A validated model version."""

    directory: Path
    model: ModelToml
    tables: dict[str, Table]
    session: ort.InferenceSession | None  # DeepFM only


def _tensor_dims(shape: Sequence[Any]) -> list[int]:
    """Dimensions as the server sees them: onnxruntime-Python reports a symbolic or unknown dimension as a string
    or None, the Rust binding as -1."""
    return [d if isinstance(d, int) else -1 for d in shape]


def _describe(dims: list[int]) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in dims) + "]"


def _check_outlet(path: Path, role: str, outlet: Any, expected: list[int | None]) -> None:
    name = outlet.name
    wanted = "[" + ", ".join(["batch"] + ["any" if d is None else str(d) for d in expected]) + "]"
    if not outlet.type.startswith("tensor("):
        raise CheckError(f"{path}: {role} {name!r} is not a tensor")
    if outlet.type != "tensor(float)":
        raise CheckError(f"{path}: {role} {name!r} has element type {outlet.type}, but recserve feeds float32")
    dims = _tensor_dims(outlet.shape)
    if len(dims) != len(expected) + 1:
        raise CheckError(f"{path}: {role} {name!r} has shape {_describe(dims)}, but model.toml implies {wanted}")
    if dims[0] >= 0:
        raise CheckError(
            f"{path}: {role} {name!r} has a fixed batch dimension of {dims[0]} (shape {_describe(dims)}); "
            "it must be dynamic"
        )
    for got, want in zip(dims[1:], expected, strict=True):
        if want is not None and got >= 0 and got != want:
            raise CheckError(f"{path}: {role} {name!r} has shape {_describe(dims)}, but model.toml implies {wanted}")


def _session(path: Path, what: str) -> ort.InferenceSession:
    """An ONNX Runtime CPU session of the graph at `path` (`what`: for the message when it is missing)."""
    if not path.is_file():
        raise CheckError(f"{path}: {what} file does not exist")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises several exception types for unreadable graphs
        raise CheckError(f"{path}: ONNX Runtime cannot load the graph: {e}") from e


def open_graph(directory: Path, model: DeepFMToml) -> ort.InferenceSession:
    """Opens the dense graph and checks its inputs and output against `model` (the server's `DenseGraph::open`)."""
    spec = model.dense_graph
    path = directory / spec.file
    session = _session(path, "dense graph")
    fields = len(model.fields)
    dim = model.table(model.fields[0].table).dim
    dense = len(model.ranking.dense_features)
    wanted = [spec.embeddings_input] + ([spec.dense_input] if dense else [])
    inputs = [i.name for i in session.get_inputs()]
    for name in inputs:
        if name not in wanted:
            hint = " (model.toml lists no dense_features, so it would never be fed)" if name == spec.dense_input else ""
            raise CheckError(
                f"{path}: the graph has an input {name!r} that model.toml does not declare{hint}; "
                f"inputs expected: {wanted}"
            )
    for name in wanted:
        if name not in inputs:
            raise CheckError(f"{path}: the graph has no input {name!r} (its inputs: {inputs})")
    for outlet in session.get_inputs():
        expected: list[int | None] = [fields, dim] if outlet.name == spec.embeddings_input else [dense]
        _check_outlet(path, "input", outlet, expected)
    outputs = [o.name for o in session.get_outputs()]
    if outputs != [spec.output]:
        raise CheckError(
            f"{path}: the graph's outputs are {outputs}, but model.toml declares exactly one, {spec.output!r}"
        )
    output = session.get_outputs()[0]
    _check_outlet(path, "output", output, [] if len(output.shape) == 1 else [1])
    return session


# How far a split graph's scores may lie from its unsplit graph's: the parts compute the same sums in the same order
# (INT8: the same bits), but the fp32 first layer's user product is one Gemm on one row where the unsplit graph runs
# it on the batch, which rounds differently (models/tests/test_split_graph.py).
SPLIT_TOLERANCE = 1e-5
SPLIT_SAMPLE = (1, 7, 100)  # candidates per request of the rows the split parts are compared on




def _state_width(path: Path, role: str, outlet: Any) -> int:
    _check_outlet(path, role, outlet, [None])
    width = _tensor_dims(outlet.shape)[1]
    if width <= 0:
        raise CheckError(f"{path}: {role} {outlet.name!r} must have a fixed width [batch, U]")
    return width


def open_split(
    directory: Path, model: DeepFMToml, tables: dict[str, Table], unsplit: ort.InferenceSession
) -> tuple[ort.InferenceSession, ort.InferenceSession]:
    """Opens `[dense_graph.split]`'s user and item graphs, checks their interfaces as the server's `SplitGraph::open`
    does, and checks that they score sample requests as the unsplit graph does (within `SPLIT_TOLERANCE`)."""
    spec, split = model.dense_graph, model.dense_graph.split
    assert split is not None
    fields = len(model.fields)
    dim = model.table(model.fields[0].table).dim
    dense = len(model.ranking.dense_features)
    user_path, item_path = directory / split.user_file, directory / split.item_file
    user, item = _session(user_path, "split graph"), _session(item_path, "split graph")
    wanted = [spec.embeddings_input] + ([spec.dense_input] if dense else [])
    if [i.name for i in user.get_inputs()] != wanted:
        raise CheckError(
            f"{user_path}: the user graph's inputs are {[i.name for i in user.get_inputs()]}, "
            f"but model.toml implies {wanted}"
        )
    _check_outlet(user_path, "input", user.get_inputs()[0], [fields, dim])
    if dense:
        _check_outlet(user_path, "input", user.get_inputs()[1], [dense])
    if [o.name for o in user.get_outputs()] != [split.state]:
        raise CheckError(
            f"{user_path}: the user graph's outputs are {[o.name for o in user.get_outputs()]}, "
            f"but [dense_graph.split] declares exactly one, {split.state!r}"
        )
    width = _state_width(user_path, "output", user.get_outputs()[0])
    wanted = [spec.embeddings_input, split.state]
    if [i.name for i in item.get_inputs()] != wanted:
        raise CheckError(
            f"{item_path}: the item graph's inputs are {[i.name for i in item.get_inputs()]}, "
            f"but model.toml implies {wanted}"
        )
    _check_outlet(item_path, "input", item.get_inputs()[0], [fields, dim])
    item_width = _state_width(item_path, "input", item.get_inputs()[1])
    if item_width != width:
        raise CheckError(
            f"{item_path}: the item graph takes {split.state!r} of width {item_width}, "
            f"but the user graph gives width {width}"
        )
    if [o.name for o in item.get_outputs()] != [spec.output]:
        raise CheckError(
            f"{item_path}: the item graph's outputs are {[o.name for o in item.get_outputs()]}, "
            f"but model.toml declares exactly one, {spec.output!r}"
        )
    output = item.get_outputs()[0]
    _check_outlet(item_path, "output", output, [] if len(output.shape) == 1 else [1])
    _compare_split(item_path, model, tables, unsplit, user, item)
    return user, item


def _compare_split(
    path: Path,
    model: DeepFMToml,
    tables: dict[str, Table],
    unsplit: ort.InferenceSession,
    user: ort.InferenceSession,
    item: ort.InferenceSession,
) -> None:
    """Scores requests of random rows (user fields and dense features equal within a request) both ways."""
    spec = model.dense_graph
    rng = np.random.default_rng(0)
    counts = list(SPLIT_SAMPLE)
    rows = sum(counts)
    starts = np.cumsum([0, *counts[:-1]])
    request_of = np.repeat(np.arange(len(counts)), counts)
    columns = []
    for f in model.fields:
        table = tables[f.table]
        ids = rng.integers(0, table.spec.rows, size=rows if f.side == "item" else len(counts))
        columns.append(gather(table, ids if f.side == "item" else ids[request_of]))
    emb = np.ascontiguousarray(np.stack(columns, axis=1), dtype=np.float32)
    dense = rng.standard_normal((len(counts), len(model.ranking.dense_features))).astype(np.float32)[request_of]
    expected = run_graph(unsplit, model, emb, dense)
    feeds = {spec.embeddings_input: emb[starts]}
    if model.ranking.dense_features:
        feeds[spec.dense_input] = dense[starts]
    try:
        state = user.run([spec.split.state], feeds)[0]
        out = item.run(
            [spec.output], {spec.embeddings_input: emb, spec.split.state: np.repeat(state, counts, axis=0)}
        )[0]
    except Exception as e:  # onnxruntime's run errors have several types
        raise CheckError(f"{path}: running the split graph failed: {e}") from e
    got = np.asarray(out, dtype=np.float64).reshape(rows, -1)[:, 0]
    worst = float(np.max(np.abs(got - expected)))
    if not worst <= SPLIT_TOLERANCE:
        raise CheckError(
            f"{path}: the user and item graphs of [dense_graph.split] do not compute the graph {spec.file}: "
            f"scores of {rows} sample candidates differ by up to {worst:.3g} (allowed {SPLIT_TOLERANCE:g})"
        )


def run_graph(session: ort.InferenceSession, model: DeepFMToml, emb: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """Probabilities [B] (float64) of gathered rows and raw dense features, as the server feeds the graph."""
    feeds = {model.dense_graph.embeddings_input: emb}
    if model.ranking.dense_features:
        feeds[model.dense_graph.dense_input] = dense
    out = session.run([model.dense_graph.output], feeds)[0]
    return np.asarray(out, dtype=np.float64).reshape(len(emb), -1)[:, 0]


def _warm_up(
    path: Path, session: ort.InferenceSession, model: DeepFMToml, tables: dict[str, Table], sizes: Sequence[int]
) -> None:
    row0 = np.stack([gather(tables[f.table], np.zeros(1, dtype=np.int64))[0] for f in model.fields])
    for rows in sizes:
        emb = np.ascontiguousarray(np.broadcast_to(row0, (rows, *row0.shape)), dtype=np.float32)
        dense = np.zeros((rows, len(model.ranking.dense_features)), dtype=np.float32)
        feeds = {model.dense_graph.embeddings_input: emb}
        if model.ranking.dense_features:
            feeds[model.dense_graph.dense_input] = dense
        try:
            out = session.run([model.dense_graph.output], feeds)[0]
        except Exception as e:  # onnxruntime's run errors have several types
            raise CheckError(f"{path}: warm-up run failed: {e}") from e
        if np.asarray(out).size != rows:
            raise CheckError(
                f"{path}: warm-up run failed: the graph returned {np.asarray(out).size} values for {rows} rows"
            )


def check_version(directory: Path, max_candidates: int = MAX_CANDIDATES) -> Version:
    """Validates one version directory as the server's loader does; raises `CheckError`."""
    path = directory / MODEL_TOML
    if not path.is_file():
        raise CheckError(f"{path}: cannot read: no such file")
    try:
        model = model_toml.read(path)
        tables = load_tables(directory, model)
    except (ModelTomlError, TableError) as e:
        raise CheckError(str(e)) from e
    if isinstance(model, LightGCNToml):
        try:
            read_popularity(directory, model)
        except TableError as e:
            raise CheckError(str(e)) from e
        _check_index(directory, model, tables)
        return Version(directory, model, tables, None)
    try:
        read_item_features(directory, model)
    except TableError as e:
        raise CheckError(str(e)) from e
    session = open_graph(directory, model)
    _warm_up(directory / model.dense_graph.file, session, model, tables, sorted({1, max_candidates}))
    if model.dense_graph.split is not None:
        open_split(directory, model, tables, session)
    return Version(directory, model, tables, session)


def _check_index(directory: Path, model: LightGCNToml, tables: dict[str, Table]) -> None:
    """`[recall.index]`: the file matches the item table as the server checks it at load (`ivf.verify`), and its
    `nprobe` is at most its `nlist`."""
    index = model.recall.index
    if index is None:
        return
    item = tables[model.recall.item_table]
    path = directory / index.file
    if not path.is_file():
        raise CheckError(f"{path}: recall.index.file: no such file")
    try:
        nlist = ivf.verify(path, item.spec, item.stored, values(item))
    except ivf.IndexError_ as e:
        raise CheckError(f"recall.index: {e}") from e
    if index.nprobe > nlist:
        raise CheckError(f"{path}: recall.index.nprobe = {index.nprobe} is more than the index's {nlist} lists")


@dataclass(frozen=True)
class Validation:
    """Every version of every model, validated: `versions[name][version]` is a `Version` or the error text."""

    models: list[ModelDir]
    versions: dict[str, dict[int, Version | str]]

    @property
    def errors(self) -> list[str]:
        return [v for by in self.versions.values() for v in by.values() if isinstance(v, str)]

    def served(self, name: str) -> Version | None:
        model = next(m for m in self.models if m.name == name)
        version = self.versions[name][model.served]
        return version if isinstance(version, Version) else None


def validate(root: Path, max_candidates: int = MAX_CANDIDATES) -> Validation:
    """Validates a whole repository; a layout error raises `CheckError`, a broken version is recorded."""
    models = discover(root)
    versions: dict[str, dict[int, Version | str]] = {}
    for model in models:
        versions[model.name] = {}
        for v in model.versions:
            try:
                versions[model.name][v] = check_version(version_dir(model, v), max_candidates)
            except CheckError as e:
                versions[model.name][v] = str(e)
    return Validation(models, versions)


# --- comparing precisions ------------------------------------------------------------------------------------


def _deepfm_signature(model: DeepFMToml) -> tuple:
    return (
        tuple((f.name, f.side, model.table(f.table).rows, model.table(f.table).dim) for f in model.fields),
        model.ranking.dense_features,
    )


def _deepfm_data(path: Path, version: Version) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ids [B, F] in field order, dense [B, N], labels [B] for a model: a `.npz` in id space (`ids`, `dense`,
    `labels`), or a Criteo file mapped through the version's vocabulary.json."""
    model = version.model
    assert isinstance(model, DeepFMToml)
    if path.suffix == ".npz":
        with np.load(path) as f:
            ids, dense, labels = f["ids"].astype(np.int64), f["dense"].astype(np.float32), f["labels"]
    else:
        vocabulary_path = version.directory / VOCABULARY
        if not vocabulary_path.is_file():
            raise CheckError(f"{vocabulary_path}: needed to map the Criteo values of {path} to ids")
        vocabulary = criteo.Vocabulary.from_json(vocabulary_path.read_text(encoding="utf-8"))
        raw = criteo.read(path)
        all_ids = vocabulary.ids(raw)
        columns = {name: i for i, name in enumerate(criteo.CATEGORICAL_FIELDS)}
        missing = [f.name for f in model.fields if f.name not in columns]
        if missing:
            raise CheckError(f"{version.directory}: field {missing[0]!r} is not a Criteo column C1..C26")
        ids = all_ids[:, [columns[f.name] for f in model.fields]]
        dense, labels = raw.dense, raw.labels
    if ids.shape[1] != len(model.fields) or dense.shape[1] != len(model.ranking.dense_features):
        raise CheckError(
            f"{path}: ids/dense are {list(ids.shape)}/{list(dense.shape)}, the model has {len(model.fields)} "
            f"fields and {len(model.ranking.dense_features)} dense features"
        )
    return ids, dense, labels


def deepfm_scores(
    session: ort.InferenceSession,
    model: DeepFMToml,
    tables: dict[str, Table],
    ids: np.ndarray,
    dense: np.ndarray,
    batch: int = 4096,
) -> np.ndarray:
    """Offline inference: the reference gather (OOV policy, dequantization), then the graph on onnxruntime."""
    out = []
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        emb = np.stack([gather(tables[f.table], chunk[:, i]) for i, f in enumerate(model.fields)], axis=1)
        out.append(run_graph(session, model, emb, dense[start : start + batch]))
    return np.concatenate(out)


def compare_deepfm(validation: Validation, data: Path) -> list[dict[str, Any]]:
    """One row per evaluated DeepFM variant (see the module documentation)."""
    served = {m.name: validation.served(m.name) for m in validation.models}
    deepfm = {name: v for name, v in served.items() if v is not None and isinstance(v.model, DeepFMToml)}
    groups: dict[tuple, list[str]] = {}
    for name, version in deepfm.items():
        assert isinstance(version.model, DeepFMToml)
        groups.setdefault(_deepfm_signature(version.model), []).append(name)
    rows: list[dict[str, Any]] = []
    for names in groups.values():

        def is_fp32(name: str) -> bool:
            m = deepfm[name].model
            assert isinstance(m, DeepFMToml)
            return m.dense_graph.precision == "fp32" and all(t.storage == "fp32" for t in m.tables)

        vocabularies = {n: deepfm[n].directory / VOCABULARY for n in names}
        texts = {n: p.read_bytes() if p.is_file() else None for n, p in vocabularies.items()}
        if len(set(texts.values())) > 1:
            raise CheckError(
                f"models {', '.join(sorted(names))} have the same fields and table shapes but different "
                f"{VOCABULARY} files: their ids mean different values, so they cannot be compared row by row"
            )
        reference = next((n for n in names if is_fp32(n)), None)
        ordered = ([reference] if reference else []) + [n for n in names if n != reference]
        ref_version = deepfm[reference] if reference else None
        ids, dense, labels = _deepfm_data(data, deepfm[ordered[0]])
        ref_scores = None
        for name in ordered:
            version = deepfm[name]
            model = version.model
            assert isinstance(model, DeepFMToml) and version.session is not None
            variants = [(name, model.tables[0].storage, model.dense_graph.precision, version.tables, version.session)]
            if ref_version is not None and name != reference:
                ref_model = ref_version.model
                assert isinstance(ref_model, DeepFMToml) and ref_version.session is not None
                if model.dense_graph.precision != "fp32" and any(t.storage != "fp32" for t in model.tables):
                    variants.insert(
                        0,
                        (
                            f"{reference} tables + {name} graph",
                            "fp32",
                            model.dense_graph.precision,
                            ref_version.tables,
                            version.session,
                        ),
                    )
                    variants.insert(
                        1,
                        (
                            f"{name} tables + {reference} graph",
                            model.tables[0].storage,
                            "fp32",
                            version.tables,
                            ref_version.session,
                        ),
                    )
            for label, storage, precision, tables, session in variants:
                scores = deepfm_scores(session, model, tables, ids, dense)
                row: dict[str, Any] = {
                    "variant": label,
                    "model": name,
                    "tables": storage,
                    "graph": precision,
                    "rows": len(labels),
                    "auc": auc(labels, scores),
                    "log_loss": log_loss(labels, scores),
                }
                if ref_scores is None and label == reference:
                    ref_scores = scores
                if ref_scores is not None:
                    gap = np.abs(scores - ref_scores)
                    row |= {
                        "reference": reference,
                        "max_abs_diff": float(gap.max()),
                        "mean_abs_diff": float(gap.mean()),
                    }
                rows.append(row)
    return rows


def compare_lightgcn(validation: Validation, data_dir: Path, k: int = 20) -> list[dict[str, Any]]:
    """Recall@k / NDCG@k of every LightGCN model, and of the reference's users with each other item table."""
    served = {m.name: validation.served(m.name) for m in validation.models}
    models = {name: v for name, v in served.items() if v is not None and isinstance(v.model, LightGCNToml)}
    if not models:
        return []
    data = lightgcn.read_interactions(data_dir / "train.txt", data_dir / "test.txt")
    rows: list[dict[str, Any]] = []

    def tables_of(version: Version) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        model = version.model
        assert isinstance(model, LightGCNToml)
        history = model.recall.history_table
        return (
            values(version.tables[model.recall.user_table]),
            values(version.tables[model.recall.item_table]),
            values(version.tables[history]) if history else None,
        )

    def storage(version: Version, key: str) -> str:
        model = version.model
        assert isinstance(model, LightGCNToml)
        return model.table(getattr(model.recall, key)).storage

    reference = next((n for n, v in models.items() if all(t.storage == "fp32" for t in v.model.tables)), None)
    for name, version in sorted(models.items(), key=lambda kv: kv[0] != reference):
        users, items, history = tables_of(version)
        if users.shape[0] < data.users or items.shape[0] < data.items:
            raise CheckError(
                f"{version.directory}: tables of {users.shape[0]} users and {items.shape[0]} items, but the data has "
                f"{data.users} users and {data.items} items"
            )
        variants = [(name, "user table", storage(version, "user_table"), storage(version, "item_table"), users, items)]
        if reference is not None and name != reference:
            ref_users = tables_of(models[reference])[0]
            variants.insert(
                0,
                (
                    f"{reference} users + {name} items",
                    "user table",
                    "fp32",
                    storage(version, "item_table"),
                    ref_users,
                    items,
                ),
            )
        if history is not None:
            embedded = _history_users(history, data)
            variants.append(
                (
                    f"{name}, users embedded from history",
                    "history",
                    storage(version, "history_table"),
                    storage(version, "item_table"),
                    embedded,
                    items,
                )
            )
        for label, users_from, user_storage, item_storage, u, i in variants:
            among = data.has_history() if users_from == "history" else None
            m = lightgcn.evaluate(u, i, data, k, among=among)
            rows.append(
                {
                    "variant": label,
                    "model": name,
                    "users_from": users_from,
                    "user_storage": user_storage,
                    "item_storage": item_storage,
                    f"recall@{k}": m.recall,
                    f"ndcg@{k}": m.ndcg,
                    "test_users": m.users,
                    "skipped_users": int(data.test_users().sum()) - m.users,
                }
            )
    return rows


def _history_users(history: np.ndarray, data: lightgcn.Interactions) -> np.ndarray:
    """Every user embedded from its training items, as the server embeds an unknown user's history (a user without
    training items has no history to embed: its row stays zero, and `compare_lightgcn` does not count it)."""
    if not (data.has_history() & data.test_users()).any():
        raise CheckError("no test user has a training item: users cannot be embedded from their history")
    out = np.zeros((data.users, history.shape[1]), dtype=np.float32)
    for u in range(data.users):
        items = data.train_indices[data.train_indptr[u] : data.train_indptr[u + 1]]
        if len(items):
            out[u] = lightgcn.embed_history(history, items)
    return out
