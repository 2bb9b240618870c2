"""Benchmark models of realistic size with random weights (what the `synth` command writes).

The demo DeepFM's tables hold 4 to 1,508 rows each and fit in cache; production CTR models do not. A preset fixes
the shapes, the table sizes and the id distribution of a realistic model; the weights are random (`deepfm.
init_params`), so a synth model's scores mean nothing, but every byte the server reads and every multiply it does
is as in a trained model of that shape.

| preset | tables | rows | table bytes | MLP |
| --- | --- | --- | --- | --- |
| `realistic` | fp32 | Kaggle cardinalities × 1/8, capped at 1M: 3.91M rows | 253.6 MiB | 429→400→400→400→1 |
| `criteo-kaggle` | int8 | the 26 Kaggle cardinalities: 33.76M rows | 0.84 GB (2.30 as fp32) | 429→400→400→400→1 |

Both: 26 categorical fields `C1..C26` (C1..C13 user side, C14..C26 item side, `item_id_field = "C21"`), 13 dense
features `I1..I13`, k = 16 factors (rows of D = 17 values: 16 factors and the first-order weight), the graph of
`onnx_export.build_graph`. `synth(preset, out)` writes two versions that share one table file (a hard link where
the file system allows it, else a copy):

- `out/<preset>-int8/1/`: the INT8 QDQ graph (`quantize.quantize_dense_graph`, calibrated on `CALIBRATION_ROWS`
  requests-shaped rows gathered from the written tables);
- `out/<preset>-fp32/1/`: the fp32 graph;

with `split`, also `out/<preset>-int8-split/1/` and `out/<preset>-fp32-split/1/`: the graph of
`split_graph.build_split_graph` (user side C1..C13 and the dense features) as `dense.onnx` and its two parts
`user.onnx` and `item.onnx`, declared in `[dense_graph.split]` (the INT8 one calibrated on the same rows);

and the requests: `out/<preset>-requests.jsonl` (`requests` `/v1` rank bodies, one per line, 1 user ×
`candidates` candidates) and `out/<preset>-cases.json` (the first `cases` of them with the toolchain's offline
scores for both versions: reference gather, then onnxruntime on the version's graph; `tests/synth_models.rs`
compares the server with them).

Ids: rank `r` of a truncated Zipf law `P(r) ∝ (r + 1)^(-ZIPF_EXPONENT)` over the table's rows (the exponent recload
uses), written as row `((r + 1) · SCATTER) mod rows`: hot rows are scattered over the table as hashed categorical
ids are, not its lowest ids. Dense values are count-like (`criteo.DENSE_SHAPE`: log-normal with a share of zeros).

`max_rows` caps every table (tests use a small cap; the shapes stay those of the preset).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import criteo, deepfm, files
from .check import open_graph, run_graph
from .export import GRAPH_FILE, TABLES_FILE
from .model_toml import DeepFMToml, DenseGraphSpec, FieldSpec, RankingSpec, TableSpec, to_toml
from .onnx_export import build_graph
from .onnx_export import save as save_onnx
from .quantize import quantize_dense_graph
from .model_toml import SplitSpec
from .rank_request import rank_inputs
from .split_graph import build_split_graph
from .split_graph import split as split_parts
from .repository import MODEL_TOML, gather, load_tables, write_deepfm_version

FACTORS = 16
HIDDEN = (400, 400, 400)
ITEM_FIELDS = tuple(f"C{i}" for i in range(14, 27))
ITEM_ID_FIELD = "C21"
ZIPF_EXPONENT = 1.05
# A prime (recload's multiplier too): `(r + 1) · SCATTER mod rows` is a bijection of the rows it does not divide.
SCATTER = 2_654_435_761
CALIBRATION_ROWS = 2000
SEED = 20261202


@dataclass(frozen=True)
class Preset:
    """A model shape: rows per field (C1..C26), table storage, MLP, candidates per request."""

    name: str
    what: str
    rows: tuple[int, ...]
    storage: str
    hidden: tuple[int, ...] = HIDDEN
    candidates: int = 100


PRESETS = {
    "realistic": Preset(
        "realistic",
        "26 fields × 16 factors, fp32 tables of up to 1M rows (the Kaggle cardinalities / 8, capped at 1M)",
        tuple(max(1, min(1_000_000, round(c * 0.125))) for c in criteo.KAGGLE_CARDINALITIES),
        "fp32",
    ),
    "criteo-kaggle": Preset(
        "criteo-kaggle",
        "the 26 Criteo Kaggle cardinalities (33.8M rows), int8 tables",
        criteo.KAGGLE_CARDINALITIES,
        "int8",
    ),
}


def _log(message: str) -> None:
    print(f"synth: {message}", file=sys.stderr, flush=True)


def scattered_zipf_ids(rng: np.random.Generator, rows: int, count: int) -> np.ndarray:
    """`count` ids in `[0, rows)`: truncated Zipf ranks scattered over the rows (see the module documentation)."""
    ranks = criteo.zipf_ranks(rng.random(count), rows, ZIPF_EXPONENT)
    if rows % SCATTER == 0:
        return ranks.astype(np.int64)
    return ((ranks.astype(np.int64) + 1) * SCATTER) % rows


def count_like_dense(rng: np.random.Generator, count: int) -> np.ndarray:
    """float32 [count, 13] count-like values: `floor(exp(N(μ, σ²)))` with a share of zeros per feature."""
    out = np.empty((count, len(criteo.DENSE_FEATURES)), dtype=np.float32)
    for n, (mu, sigma, zeros) in enumerate(criteo.DENSE_SHAPE):
        values = np.floor(np.exp(rng.normal(mu, sigma, count)))
        out[:, n] = np.where(rng.random(count) < zeros, 0.0, values)
    return out


USER_FILE, ITEM_FILE = "user.onnx", "item.onnx"


def model_of(preset: Preset, rows: tuple[int, ...], precision: str, split: bool = False) -> DeepFMToml:
    """The model.toml of one of a preset's versions (`split`: one whose graph is split, see the module docs)."""
    names = criteo.CATEGORICAL_FIELDS
    return DeepFMToml(
        tables=tuple(
            TableSpec(n, TABLES_FILE, r, FACTORS + 1, preset.storage, "default", 0)
            for n, r in zip(names, rows, strict=True)
        ),
        fields=tuple(FieldSpec(n, "item" if n in ITEM_FIELDS else "user") for n in names),
        dense_graph=DenseGraphSpec(GRAPH_FILE, precision, split=SplitSpec(USER_FILE, ITEM_FILE) if split else None),
        ranking=RankingSpec(criteo.DENSE_FEATURES, ITEM_ID_FIELD),
        description=(
            f"synth preset {preset.name}: {preset.what}, MLP {'→'.join(map(str, preset.hidden))}, {precision} graph"
            f"{' split into user and item parts' if split else ''}; "
            "RANDOM weights (a benchmark model: realistic shapes, sizes and ids, meaningless scores)"
        ),
    )


def requests(
    rng: np.random.Generator, model: DeepFMToml, count: int, candidates: int
) -> list[dict[str, Any]]:
    """`count` `/v1` rank bodies of 1 user × `candidates` candidates, ids as the module documentation says."""
    rows = {t.name: t.rows for t in model.tables}
    user = [f.name for f in model.fields_on("user")]
    item = [f.name for f in model.fields_on("item") if f.name != ITEM_ID_FIELD]
    dense = count_like_dense(rng, count)
    out = []
    for r in range(count):
        body: dict[str, Any] = {
            "user": {
                "fields": {name: int(scattered_zipf_ids(rng, rows[name], 1)[0]) for name in user},
                "dense": [float(v) for v in dense[r]],
            }
        }
        ids = {name: scattered_zipf_ids(rng, rows[name], candidates) for name in (ITEM_ID_FIELD, *item)}
        body["candidates"] = [
            {"id": int(ids[ITEM_ID_FIELD][c]), "fields": {name: int(ids[name][c]) for name in item}}
            for c in range(candidates)
        ]
        out.append(body)
    return out


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        files.write_bytes(target, source.read_bytes())


def synth(
    preset: Preset,
    out: Path,
    *,
    max_rows: int | None = None,
    count: int = 1000,
    cases: int = 8,
    candidates: int | None = None,
    seed: int = SEED,
    split: bool = False,
    progress: Callable[[str], None] = _log,
) -> dict[str, Any]:
    """Writes the preset's two versions, its requests and its cases into `out` (see the module documentation);
    returns a summary (what the `synth` command prints). Versions that exist already are an error."""
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    candidates = preset.candidates if candidates is None else candidates
    rows = tuple(r if max_rows is None else min(r, max_rows) for r in preset.rows)
    rng = np.random.default_rng(seed)
    int8_dir, fp32_dir = out / f"{preset.name}-int8" / "1", out / f"{preset.name}-fp32" / "1"
    split_dirs = [out / f"{preset.name}-{p}-split" / "1" for p in ("int8", "fp32")] if split else []
    for directory in (int8_dir, fp32_dir, *split_dirs):
        if directory.exists():
            raise FileExistsError(f"{directory} exists already: remove it or choose another --out")
    progress(f"drawing random weights for {sum(rows):,} rows × {FACTORS + 1} values")
    names = criteo.CATEGORICAL_FIELDS
    params = deepfm.init_params(
        rng,
        dict(zip(names, rows, strict=True)),
        names,
        factors=FACTORS,
        num_dense=len(criteo.DENSE_FEATURES),
        hidden=preset.hidden,
    )
    fp32_graph = build_graph(params)
    user_fields = [i for i, n in enumerate(names) if n not in ITEM_FIELDS]
    split_graph = build_split_graph(params, user_fields) if split else None
    int8_model, fp32_model = model_of(preset, rows, "int8"), model_of(preset, rows, "fp32")

    progress(f"writing {preset.storage} tables and the fp32 graph into {fp32_dir}")
    write_deepfm_version(fp32_dir, fp32_model, params.tables, fp32_graph)
    tables = params.tables
    del params  # the float32 tables go; the written ones are what the server reads
    stored = load_tables(fp32_dir, fp32_model)
    del tables

    progress(f"calibrating the INT8 graph on {CALIBRATION_ROWS} rows gathered from the written tables")
    # Every sample draws every field on its own (one user per sample), so the user fields' factors are calibrated
    # over many rows, not over one request's user.
    emb = np.stack(
        [
            gather(stored[f.table], scattered_zipf_ids(rng, stored[f.table].spec.rows, CALIBRATION_ROWS))
            for f in fp32_model.fields
        ],
        axis=1,
    )
    dense = count_like_dense(rng, CALIBRATION_ROWS)
    int8_graph = quantize_dense_graph(fp32_graph, emb, dense, progress=progress)
    files.mkdir(int8_dir)
    _link_or_copy(fp32_dir / TABLES_FILE, int8_dir / TABLES_FILE)
    save_onnx(int8_graph, int8_dir / GRAPH_FILE)
    files.write_text(int8_dir / MODEL_TOML, to_toml(int8_model), encoding="utf-8")
    versions = [(int8_dir, int8_model), (fp32_dir, fp32_model)]
    if split_graph is not None:
        progress("calibrating the split INT8 graph on the same rows; writing the split versions")
        graphs = {"int8": quantize_dense_graph(split_graph, emb, dense, progress=progress), "fp32": split_graph}
        for directory, (precision, graph) in zip(split_dirs, graphs.items(), strict=True):
            model = model_of(preset, rows, precision, split=True)
            files.mkdir(directory)
            _link_or_copy(fp32_dir / TABLES_FILE, directory / TABLES_FILE)
            save_onnx(graph, directory / GRAPH_FILE)
            user, item = split_parts(graph)
            save_onnx(user, directory / USER_FILE)
            save_onnx(item, directory / ITEM_FILE)
            files.write_text(directory / MODEL_TOML, to_toml(model), encoding="utf-8")
            versions.append((directory, model))

    progress(f"writing {count} requests of {candidates} candidates")
    bodies = requests(rng, fp32_model, count, candidates)
    lines = "".join(json.dumps(b, separators=(",", ":")) + "\n" for b in bodies)
    files.write_text(out / f"{preset.name}-requests.jsonl", lines, encoding="utf-8")

    scored = []
    sessions = {d.parent.name: (m, open_graph(d, m)) for d, m in versions}
    for body in bodies[:cases]:
        emb, dense = rank_inputs(fp32_model, stored, body)
        expected = {
            name: [float(s) for s in run_graph(session, m, emb, dense)] for name, (m, session) in sessions.items()
        }
        scored.append({"request": body, "expected_scores": expected})
    document = {
        "format_version": 1,
        "preset": preset.name,
        "models": sorted(sessions),
        "tolerance": 1e-5,
        "cases": scored,
    }
    files.write_text(out / f"{preset.name}-cases.json", json.dumps(document) + "\n", encoding="utf-8")
    table_bytes = (fp32_dir / TABLES_FILE).stat().st_size
    return {
        "preset": preset.name,
        "versions": [str(d) for d, _ in versions],
        "rows": sum(rows),
        "table_bytes": table_bytes,
        "requests": count,
        "mean_body_bytes": round(len(lines.encode()) / max(1, count)),
        "cases": len(scored),
    }

