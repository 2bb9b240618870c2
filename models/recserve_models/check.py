"""Validating a model repository by asking the server, and comparing precisions on data (what the `check`
command runs).

**Validation** is the server's own: `recserve check-repository --json` (docs/model-repository.md, "Checking a
repository") applies the repository layout, `model.toml`, the tables, item features, popularity and IVF index
files, and opens and warms up every dense graph and split graph with the loader the server starts with, on every
version of every model (any of them can be pinned), and reports one verdict per version. The toolchain does not
re-implement those rules. It finds the binary through `RECSERVE_BIN`, else the newest of
`$CARGO_TARGET_DIR/{release,debug}/recserve` and `target/{release,debug}/recserve` of this checkout, else
`recserve` on `PATH` (`find_recserve`).

What only the toolchain checks, on the versions the server accepts: that `[dense_graph.split]`'s user and item
graphs score sample requests as the unsplit graph does (the server opens and warms up both parts but does not
compare their numbers with the whole graph's); that every `err` of a `[recall.index]` file bounds its row's
quantization error (`ivf.verify`; the server checks the file's structure and metadata only); and that its own
reader (`model_toml`, `repository.load_tables`, and `cooccurrence.read` for a `[cooccurrence]` table: the CSR
format, and one row per item of the catalogue where the version's item feature table or rejecting item id table
says how many items it has) reads the version, which the comparisons below need.

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

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

import numpy as np

from . import criteo, files, ivf, lightgcn, model_toml
from .metrics import auc, log_loss
from .model_toml import DeepFMToml, LightGCNToml, ModelToml, ModelTomlError
from .cooccurrence import Cooccurrence
from .repository import (
    MODEL_TOML,
    Table,
    TableError,
    catalogue_items,
    gather,
    load_tables,
    read_cooccurrence,
    read_item_features,
    values,
)

if TYPE_CHECKING:
    import onnxruntime as ort  # imported where used: --help needs none of it

MAX_CANDIDATES = 1000  # the server's default --max-candidates: its warm-up runs a batch of this size
VOCABULARY = "vocabulary.json"
RECSERVE_BIN = "RECSERVE_BIN"  # environment variable: the recserve binary `check` runs
SERVER_REPORT_VERSION = 1  # `format_version` of `recserve check-repository --json`
_CHECKOUT = Path(__file__).resolve().parents[2]  # models/recserve_models/check.py → the repository's root


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


def version_dir(model: ModelDir, version: int) -> Path:
    """The directory the server reads a version from: `<model>/<version>`."""
    return model.path / str(version)


def find_recserve() -> Path:
    """The `recserve` binary: `$RECSERVE_BIN`, else the most recently built of `$CARGO_TARGET_DIR` and this
    checkout's `target/` (release or debug), else `recserve` on `PATH`."""
    given = os.environ.get(RECSERVE_BIN)
    if given:
        if not Path(given).is_file():
            raise CheckError(f"{RECSERVE_BIN}={given}: no such file")
        return Path(given)
    targets = [Path(os.environ["CARGO_TARGET_DIR"])] if os.environ.get("CARGO_TARGET_DIR") else []
    targets.append(_CHECKOUT / "target")
    candidates = [t / profile / "recserve" for t in targets for profile in ("release", "debug")]
    built = [p for p in candidates if p.is_file()]
    if built:
        return max(built, key=lambda p: p.stat().st_mtime)
    on_path = shutil.which("recserve")
    if on_path:
        return Path(on_path)
    looked = ", ".join(str(p) for p in candidates)
    raise CheckError(
        "cannot find the recserve binary, whose `check-repository` judges the repository: build it (`cargo build`), "
        f"or set {RECSERVE_BIN} to it, or put it on PATH (looked at {looked})"
    )


def server_check(root: Path, max_candidates: int = MAX_CANDIDATES) -> dict[str, Any]:
    """`recserve check-repository --json` on `root`: `{"error", "models": {name: {"served_version",
    "versions": {"1": {"kind", "error"}}}}}`, `error` being `None` where the server accepts."""
    binary = find_recserve()
    command = [str(binary), "check-repository", "--json", "--max-candidates", str(max_candidates), str(root)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as e:
        raise CheckError(f"{binary}: cannot run: {e}") from e
    if done.returncode not in (0, 1):
        raise CheckError(
            f"{binary} check-repository {root} failed (exit status {done.returncode}): {done.stderr.strip()}"
        )
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError as e:
        raise CheckError(f"{binary} check-repository {root} did not print JSON ({e}): {done.stderr.strip()}") from e
    if report.get("format_version") != SERVER_REPORT_VERSION:
        raise CheckError(
            f"{binary} check-repository writes format_version {report.get('format_version')!r}, this toolchain "
            f"reads {SERVER_REPORT_VERSION}: rebuild the binary from this checkout, or set {RECSERVE_BIN}"
        )
    return report


# --- one version ------------------------------------------------------------------------------------------------


@dataclass
class Version:
    """A validated model version."""

    directory: Path
    model: ModelToml
    tables: dict[str, Table]
    session: ort.InferenceSession | None  # DeepFM only
    cooccurrence: Cooccurrence | None = None  # a ranking model's `[cooccurrence]` table, checked


def _session(path: Path, what: str) -> ort.InferenceSession:
    """An ONNX Runtime CPU session of the graph at `path` (`what`: for the message when it is missing)."""
    if not path.is_file():
        raise CheckError(f"{path}: {what} file does not exist")
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises several exception types for unreadable graphs
        raise CheckError(f"{path}: ONNX Runtime cannot load the graph: {e}") from e


def check_initializers(path: Path) -> None:
    """Refuses a graph whose weights (its float initializers) hold NaN or an infinity, naming the initializer and
    the position: every score would be too. The server cannot read a graph's initializers through ONNX Runtime, so
    this check is the toolchain's."""
    import onnx  # only here: importing onnx is slow, and most commands never need it
    from onnx import numpy_helper

    graph = onnx.load(str(path), load_external_data=True).graph
    for initializer in graph.initializer:
        weights = numpy_helper.to_array(initializer)
        if weights.dtype.kind != "f":
            continue
        bad = np.flatnonzero(~np.isfinite(weights))
        if bad.size:
            at = np.unravel_index(bad[0], weights.shape)
            raise CheckError(
                f"{path}: initializer {initializer.name!r} holds {bad.size} value(s) that are not finite numbers "
                f"(the first at {list(map(int, at))}: {weights.flat[bad[0]]}): every score the graph computes would "
                "be too; export the model again"
            )


def open_graph(directory: Path, model: DeepFMToml) -> ort.InferenceSession:
    """A CPU session of the version's dense graph, for offline scoring (`run_graph`); its interface is the server's
    to check (`server_check`)."""
    return _session(directory / model.dense_graph.file, "dense graph")


# How far a split graph's scores may lie from its unsplit graph's: the parts compute the same sums in the same order
# (INT8: the same bits), but the fp32 first layer's user product is one Gemm on one row where the unsplit graph runs
# it on the batch, which rounds differently (models/tests/test_split_graph.py).
SPLIT_TOLERANCE = 1e-5
SPLIT_SAMPLE = (1, 7, 100)  # candidates per request of the rows the split parts are compared on


def check_split(directory: Path, model: DeepFMToml, tables: dict[str, Table], unsplit: ort.InferenceSession) -> None:
    """Checks that `[dense_graph.split]`'s user and item graphs score sample requests as the unsplit graph does
    (within `SPLIT_TOLERANCE`); the server has checked their interfaces."""
    split = model.dense_graph.split
    assert split is not None
    user = _session(directory / split.user_file, "split graph")
    item = _session(directory / split.item_file, "split graph")
    _compare_split(directory / split.item_file, model, tables, unsplit, user, item)


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
    dense = rng.standard_normal((len(counts), model.ranking.dense_width)).astype(np.float32)[request_of]
    expected = run_graph(unsplit, model, emb, dense)
    feeds = {spec.embeddings_input: emb[starts]}
    if model.ranking.dense_width:
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
    """Probabilities [B] (float64) of gathered rows and raw dense inputs (the dense features, then the candidate
    features), as the server feeds the graph."""
    feeds = {model.dense_graph.embeddings_input: emb}
    if model.ranking.dense_width:
        feeds[model.dense_graph.dense_input] = dense
    out = session.run([model.dense_graph.output], feeds)[0]
    return np.asarray(out, dtype=np.float64).reshape(len(emb), -1)[:, 0]


def _open_version(directory: Path) -> Version:
    """Reads a version the server accepts with the toolchain's reader, for the comparisons, and runs the
    toolchain-only checks on it."""
    try:
        model = model_toml.read(directory / MODEL_TOML)
        tables = load_tables(directory, model)
        cooccurrence = None
        if isinstance(model, DeepFMToml):
            items = catalogue_items(model, read_item_features(directory, model))
            cooccurrence = read_cooccurrence(directory, model, items)
    except (ModelTomlError, TableError) as e:
        raise CheckError(str(e)) from e
    if isinstance(model, LightGCNToml):
        _check_index(directory, model, tables)
        return Version(directory, model, tables, None)
    check_initializers(directory / model.dense_graph.file)
    session = open_graph(directory, model)
    if model.dense_graph.split is not None:
        check_split(directory, model, tables, session)
    return Version(directory, model, tables, session, cooccurrence)


def _check_index(directory: Path, model: LightGCNToml, tables: dict[str, Table]) -> None:
    """`[recall.index]`: every `err` of the file bounds its row's quantization error (`ivf.verify`, which also
    repeats the server's structural checks on the way)."""
    index = model.recall.index
    if index is None:
        return
    item = tables[model.recall.item_table]
    try:
        ivf.verify(directory / index.file, item.spec, item.stored, values(item))
    except ivf.IndexError_ as e:
        raise CheckError(f"recall.index: {e}") from e


def check_version(directory: Path, max_candidates: int = MAX_CANDIDATES) -> Version:
    """Validates one version directory: the server judges it (as version 1 of a model of a scratch repository
    that links to it), then `_open_version`. Raises `CheckError` naming the files under `directory`."""
    directory = directory.resolve()
    with tempfile.TemporaryDirectory(prefix="recserve-check-") as scratch:
        linked = Path(scratch) / "model" / "1"
        linked.parent.mkdir()
        linked.symlink_to(directory, target_is_directory=True)
        report = server_check(Path(scratch), max_candidates)
        error = report["error"] or report["models"]["model"]["versions"]["1"]["error"]
        if error:
            raise CheckError(error.replace(str(linked), str(directory)))
    return _open_version(directory)


@dataclass(frozen=True)
class Validation:
    """Every version of every model, validated: `versions[name][version]` is a `Version` or the error text.
    `warnings`: files and directories of the repository that a user other than their owner could not read
    (`files.unreadable_by_others`); the server running as the owner loads them, the container image's user does
    not, so they do not make a version an error."""

    models: list[ModelDir]
    versions: dict[str, dict[int, Version | str]]
    warnings: list[str]

    @property
    def errors(self) -> list[str]:
        return [v for by in self.versions.values() for v in by.values() if isinstance(v, str)]

    def served(self, name: str) -> Version | None:
        model = next(m for m in self.models if m.name == name)
        version = self.versions[name][model.served]
        return version if isinstance(version, Version) else None


def validate(root: Path, max_candidates: int = MAX_CANDIDATES) -> Validation:
    """Validates a whole repository (`server_check`, then `_open_version` on what the server accepts); a layout
    error raises `CheckError`, a refused version is recorded with the server's message."""
    report = server_check(root, max_candidates)
    if report["error"]:
        raise CheckError(report["error"])
    models: list[ModelDir] = []
    versions: dict[str, dict[int, Version | str]] = {}
    for name, found in report["models"].items():
        numbers = tuple(sorted(int(v) for v in found["versions"]))
        model = ModelDir(name, root / name, numbers)
        models.append(model)
        versions[name] = {}
        for v in numbers:
            error = found["versions"][str(v)]["error"]
            if error is None:
                try:
                    versions[name][v] = _open_version(version_dir(model, v))
                    continue
                except CheckError as e:
                    error = str(e)
            versions[name][v] = error
    return Validation(models, versions, files.unreadable_by_others(root))


# --- comparing precisions ------------------------------------------------------------------------------------


def _deepfm_signature(model: DeepFMToml) -> tuple:
    return (
        tuple((f.name, f.side, model.table(f.table).rows, model.table(f.table).dim) for f in model.fields),
        model.ranking.dense_features,
        model.ranking.candidate_features,
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
    if ids.shape[1] != len(model.fields) or dense.shape[1] != model.ranking.dense_width:
        raise CheckError(
            f"{path}: ids/dense are {list(ids.shape)}/{list(dense.shape)}, the model has {len(model.fields)} "
            f"fields and {model.ranking.dense_width} dense inputs (dense and candidate features)"
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
