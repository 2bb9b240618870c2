"""Writing repository versions: from a training run (`export_deepfm`, `export_lightgcn`, what the `export`
command runs) and from another version with re-encoded tables or an INT8 graph (`quantize_version`, what the
`quantize` command runs). The encodings themselves (fp16, fused int8, the INT8 QDQ graph) are `quantize.py`'s.

From a `train-deepfm` or `train-lightgcn` run, one version directory:

- DeepFM: one table per Criteo field (`C1`..`C26`, named like the field, all in `tables.safetensors`, rows from
  the run's vocabulary, `oov = "default"` with `default_row = 0`, the trained rare-value row), the fp32 dense graph
  of `onnx_export.build_graph` (`dense.onnx`), dense features `I1`..`I13`, and the run's `vocabulary.json` (not
  read by the server: clients map raw values to ids with it). `item_fields` are item-side, the rest user-side;
  `item_id_field` names the field fed by a candidate's `id`.
- LightGCN: tables `user`, `item` (the final, layer-mean embeddings) and `history` (the `h_i` of
  docs/model-repository.md) in `tables.safetensors`, with `[recall]` naming them; `oov = "reject"`, because an
  unknown user or item id has no meaningful default row.

`storage` chooses the tables' storage (fp32, fp16, int8). `quantize_version(SRC, DST)` re-encodes a version's
tables (`tables_storage`) and replaces an fp32 dense graph by its INT8 QDQ version (`graph_precision="int8"`),
calibrated on `calibration` rows (a run's `calibration.npz`: `ids` [S, F] and `dense` [S, N], or a Criteo file
mapped through the version's `vocabulary.json`) gathered from the *new* tables, so that calibration sees the rows
the server will feed. `quantize_version` validates what it wrote with `check`'s rules before returning (the
`export` command validates the exported version).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from . import criteo, files, model_toml
from .check import VOCABULARY, check_version
from .lightgcn import LightGCNRun
from .model_toml import DeepFMToml, DenseGraphSpec, FieldSpec, LightGCNToml, RankingSpec, RecallSpec, TableSpec
from .quantize import quantize_dense_graph
from .repository import (
    MODEL_TOML,
    Table,
    encode_table,
    gather,
    load_tables,
    read_cooccurrence,
    read_item_features,
    read_popularity,
    values,
    write_deepfm_version,
    write_lightgcn_version,
)
from .train_deepfm import DeepFMRun

TABLES_FILE = "tables.safetensors"
GRAPH_FILE = "dense.onnx"
DEFAULT_ITEM_FIELDS = tuple(f"C{i}" for i in range(20, 27))
STORAGES = ("fp32", "fp16", "int8")
# One storage for every table ("int8": for LightGCN the user, item and history tables alike), or a storage per
# named table ({"item": "int8"}), the others keeping a default.
Storages = str | Mapping[str, str]


class StorageError(ValueError):
    """A per-table storage choice that names a table the model does not have, or a storage that does not exist."""


def storages_of(tables: Sequence[str], choice: Storages, otherwise: Callable[[str], str]) -> dict[str, str]:
    """The storage of each of `tables` under `choice`; `otherwise(name)` for a table a per-table choice leaves out."""
    if isinstance(choice, str):
        choice = dict.fromkeys(tables, choice)
    unknown = [name for name in choice if name not in tables]
    if unknown:
        raise StorageError(f"{unknown[0]!r} is not a table of the model (its tables: {', '.join(tables)})")
    wrong = [s for s in choice.values() if s not in STORAGES]
    if wrong:
        raise StorageError(f"{wrong[0]!r} is not a storage ({', '.join(STORAGES)})")
    return {name: choice.get(name) or otherwise(name) for name in tables}


def describe_storages(storages: Mapping[str, str]) -> str:
    """`int8 tables` when every table has one storage, else `tables user fp32, item int8, ...`."""
    if len(set(storages.values())) == 1:
        return f"{next(iter(storages.values()))} tables"
    return "tables " + ", ".join(f"{name} {storage}" for name, storage in storages.items())


def deepfm_toml(
    run: DeepFMRun,
    storage: Storages,
    precision: str,
    *,
    item_fields: tuple[str, ...] = DEFAULT_ITEM_FIELDS,
    item_id_field: str | None = None,
    description: str = "",
) -> DeepFMToml:
    params = run.params
    unknown = [f for f in (*item_fields, *([item_id_field] if item_id_field else [])) if f not in params.field_tables]
    if unknown:
        raise SystemExit(f"export: {unknown[0]!r} is not a field of the model ({', '.join(params.field_tables)})")
    storages = storages_of(list(params.field_tables), storage, lambda _: "fp32")
    tables = tuple(
        TableSpec(name, TABLES_FILE, len(params.tables[name]), params.dim, storages[name], "default", 0)
        for name in params.field_tables
    )
    fields = tuple(FieldSpec(name, "item" if name in item_fields else "user") for name in params.field_tables)
    return DeepFMToml(
        tables=tables,
        fields=fields,
        dense_graph=DenseGraphSpec(GRAPH_FILE, precision),
        ranking=RankingSpec(criteo.DENSE_FEATURES, item_id_field),
        description=description,
    )


def export_deepfm(run: DeepFMRun, out: Path, storage: Storages, **options: object) -> None:
    model = deepfm_toml(run, storage, "fp32", **options)  # type: ignore[arg-type]
    from .onnx_export import build_graph  # here: onnx is slow to import, and --help needs none of it

    write_deepfm_version(out, model, run.params.tables, build_graph(run.params))
    shutil.copyfile(run.directory / VOCABULARY, out / VOCABULARY)
    files.finish(out / VOCABULARY)


def lightgcn_toml(run: LightGCNRun, storage: Storages, description: str = "") -> LightGCNToml:
    users, items = run.users.shape[0], run.items.shape[0]
    dim = run.items.shape[1]
    storages = storages_of(["user", "item", "history"], storage, lambda _: "fp32")
    return LightGCNToml(
        tables=(
            TableSpec("user", TABLES_FILE, users, dim, storages["user"], "reject"),
            TableSpec("item", TABLES_FILE, items, dim, storages["item"], "reject"),
            TableSpec("history", TABLES_FILE, items, dim, storages["history"], "reject"),
        ),
        recall=RecallSpec("user", "item", "history"),
        description=description,
    )


def export_lightgcn(run: LightGCNRun, out: Path, storage: Storages, description: str = "") -> None:
    """The version of a LightGCN run; with the run's item popularity (runs record it) as `item_popularity`."""
    write_lightgcn_version(
        out,
        lightgcn_toml(run, storage, description),
        {"user": run.users, "item": run.items, "history": run.history_vectors},
        run.item_popularity,
    )


def _calibration(path: Path, source: Path, model: DeepFMToml) -> tuple[np.ndarray, np.ndarray]:
    if path.suffix == ".npz":
        with np.load(path) as f:
            ids, dense = f["ids"].astype(np.int64), f["dense"].astype(np.float32)
    else:
        vocabulary = criteo.Vocabulary.from_json((source / VOCABULARY).read_text(encoding="utf-8"))
        raw = criteo.read(path)
        columns = {name: i for i, name in enumerate(criteo.CATEGORICAL_FIELDS)}
        ids = vocabulary.ids(raw)[:, [columns[f.name] for f in model.fields]]
        dense = raw.dense
    if (
        ids.ndim != 2
        or ids.shape[1] != len(model.fields)
        or dense.shape != (len(ids), model.ranking.dense_width)
    ):
        raise SystemExit(
            f"quantize: calibration rows {path} are ids {list(ids.shape)} and dense {list(dense.shape)}, but the model "
            f"has {len(model.fields)} fields and {model.ranking.dense_width} dense inputs"
        )
    return ids, dense


def quantize_version(
    source: Path,
    out: Path,
    *,
    tables_storage: Storages | None,
    graph_precision: str | None,
    calibration: Path | None = None,
    calibration_rows: int = 4096,
    description: str | None = None,
) -> None:
    """Writes `out` from the version `source` with re-encoded tables and/or an INT8 graph. `tables_storage` is one
    storage for every table, or a storage per named table (the others keep theirs); raises `StorageError`."""
    model = model_toml.read(source / MODEL_TOML)
    stored = load_tables(source, model)
    current = {t.name: t.storage for t in model.tables}
    storages = storages_of(list(current), current if tables_storage is None else tables_storage, current.__getitem__)
    lossy = [name for name, storage in storages.items() if current[name] == "int8" and storage != "int8"]
    if lossy:
        raise SystemExit(f"quantize: table {lossy[0]!r} of {source} is already int8; re-encoding it would lose twice")
    floats = {name: values(table) for name, table in stored.items()}
    new_tables = tuple(
        TableSpec(t.name, t.file, t.rows, t.dim, storages[t.name], t.oov, t.default_row) for t in model.tables
    )
    if isinstance(model, LightGCNToml):
        if graph_precision not in (None, "fp32"):
            raise SystemExit("quantize: a lightgcn model has no dense graph to quantize")
        new = LightGCNToml(new_tables, model.recall, model.description if description is None else description)
        write_lightgcn_version(out, new, floats, read_popularity(source, model))
        check_version(out)
        return
    import onnx

    graph = onnx.load(str(source / model.dense_graph.file))
    precision = model.dense_graph.precision
    new_model = DeepFMToml(
        new_tables,
        model.fields,
        model.dense_graph,
        model.ranking,
        model.description if description is None else description,
        model.item_features,
        model.cooccurrence,
    )
    if graph_precision == "int8" and precision != "int8":
        if calibration is None:
            raise SystemExit("quantize: --graph int8 needs --calibration rows")
        ids, dense = _calibration(calibration, source, model)
        pick = np.random.default_rng(0).permutation(len(ids))[:calibration_rows]
        ids, dense = ids[np.sort(pick)], dense[np.sort(pick)]
        encoded = {t.name: Table(t, encode_table(t, floats[t.name])) for t in new_tables}
        emb = np.stack([gather(encoded[f.table], ids[:, i]) for i, f in enumerate(model.fields)], axis=1)
        graph = quantize_dense_graph(graph, emb, dense)
        precision = "int8"
    elif graph_precision == "fp32" and precision != "fp32":
        raise SystemExit("quantize: the graph is already int8; export the fp32 graph again instead")
    spec = model.dense_graph
    new_model = DeepFMToml(
        new_model.tables,
        new_model.fields,
        DenseGraphSpec(spec.file, precision, spec.embeddings_input, spec.dense_input, spec.output),
        new_model.ranking,
        new_model.description,
        new_model.item_features,
        new_model.cooccurrence,
    )
    write_deepfm_version(
        out, new_model, floats, graph, read_item_features(source, model), read_cooccurrence(source, model)
    )
    if (source / VOCABULARY).is_file():
        shutil.copyfile(source / VOCABULARY, out / VOCABULARY)
        files.finish(out / VOCABULARY)
    check_version(out)
