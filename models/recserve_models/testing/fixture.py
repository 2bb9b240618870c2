"""The test fixture (the `fixture` command): a small model repository and the rank cases the server's
end-to-end tests check.

`python -m recserve_models fixture --out DIR` writes, from one seed and byte for byte the same every run:

- `DIR/repo/`: Criteo-shaped DeepFM models (13 dense features I1..I13, 26 categorical fields C1..C26,
  C1..C19 on the user side and C20..C26 on the item side, k = 8 factors so D = 9, MLP 221-32-16-1):

  | model / version | tables | graph    | item_id_field | notes                                                |
  | --------------- | ------ | -------- | ------------- | ---------------------------------------------------- |
  | `deepfm-fp32/1` | fp32   | fp32     | C20           | older weights, not served unless a config pins it    |
  | `deepfm-fp32/2` | fp32   | fp32     | C20           | the served version                                   |
  | `deepfm-fp16/1` | fp16   | fp32     | none          | user_tables.safetensors + item_tables.safetensors;   |
  |                 |        |          |               | field C26 reads table C25 (no table C26)             |
  | `deepfm-int8/1` | int8   | INT8 QDQ | C20           | graph calibrated on rows of its own int8 tables      |

  Every model has its own weights. The OOV policy of each table is in `FIELDS` below and in `cases.json`.
- `DIR/check-cases/`: small valid and broken repositories with the decision the format document intends for each
  (`check_cases.py`), which `tests/check_parity.rs` puts through `recserve check-repository` and the server's
  loader.
- `DIR/cases.json`: `{"format_version", "seed", "onnxruntime", "models", "cases", "error_cases"}`:
  `models[name]` describes each model (served version, fields by side, item_id_field, dense features, and
  its tables split by OOV policy, `oov.default` / `oov.reject`, each with rows, default_row and the fields
  reading it); each entry of `cases` is `{"model", "version", "what", "request", "expected_scores",
  "tolerance"}` with one score per candidate in request order (also when the request has `top_k`: the
  response then holds the `top_k` best of these); `version` is the version whose weights give these scores
  (cases for a version that is not the highest need a server that pins it). Each entry of `error_cases` is
  `{"model", "what", "request", "status", "input"}`: a request the server answers with `status`, naming
  `input` (e.g. `user.fields.C2`) in its message.

Expected scores: models with an fp32 graph use the numpy reference `deepfm.forward` on the rows the naive
gather returns (fp16 tables widened to float32), and the fixture checks that onnxruntime on the written graph
agrees within a tenth of the tolerance (1e-5); the INT8 model uses onnxruntime on its QDQ graph (CPU provider,
graph optimization ORT_ENABLE_ALL, the default) on the gathered, dequantized rows, with tolerance 1e-4.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import deepfm, files, model_toml
from ..deepfm import DeepFMParams
from ..model_toml import DeepFMToml, DenseGraphSpec, FieldSpec, RankingSpec, TableSpec
from ..onnx_export import DENSE, EMBEDDINGS, build_graph
from ..quantize import quantize_dense_graph
from ..rank_request import I64_MAX, I64_MIN, RequestError, rank_inputs
from ..repository import MODEL_TOML, Table, encode_table, gather, load_tables, write_deepfm_version
from . import fixture_recall
from ._weights import random_params

SEED = 20261130
DENSE_FEATURES = tuple(f"I{i}" for i in range(1, 14))
ITEM_ID_FIELD = "C20"
FACTORS = 8
HIDDEN = (32, 16)
# Expected-score tolerances. fp32 graphs: onnxruntime against the float64 reference, observed under 1e-7.
# The INT8 graph: onnxruntime's CPU run at another graph optimization level moves its scores by up to 5e-5 on
# this fixture; a wrong row, field order, default row or dequantization moves them by far more.
TOLERANCE = 1e-5
INT8_TOLERANCE = 1e-4
CALIBRATION_SAMPLES = 1024
CASES_FORMAT_VERSION = 1


@dataclass(frozen=True)
class _Field:
    rows: int
    side: str
    oov: str
    default_row: int = 0


# Criteo's 26 categorical fields, in graph order: vocabulary size, side, OOV policy of the field's table.
FIELDS = {
    "C1": _Field(1460, "user", "default"),
    "C2": _Field(583, "user", "reject"),
    "C3": _Field(2000, "user", "default", default_row=1999),
    "C4": _Field(1187, "user", "default"),
    "C5": _Field(305, "user", "reject"),
    "C6": _Field(24, "user", "default"),
    "C7": _Field(1251, "user", "default"),
    "C8": _Field(633, "user", "default"),
    "C9": _Field(20, "user", "default", default_row=7),
    "C10": _Field(948, "user", "default"),
    "C11": _Field(1580, "user", "reject"),
    "C12": _Field(1777, "user", "default"),
    "C13": _Field(1310, "user", "default"),
    "C14": _Field(27, "user", "default"),
    "C15": _Field(1492, "user", "default"),
    "C16": _Field(1954, "user", "default"),
    "C17": _Field(38, "user", "reject"),
    "C18": _Field(1164, "user", "default"),
    "C19": _Field(214, "user", "default"),
    "C20": _Field(1999, "item", "default", default_row=1),
    "C21": _Field(1811, "item", "default"),
    "C22": _Field(85, "item", "default"),
    "C23": _Field(1024, "item", "reject"),
    "C24": _Field(412, "item", "default", default_row=100),
    "C25": _Field(96, "item", "reject"),
    "C26": _Field(673, "item", "default"),
}


@dataclass(frozen=True)
class _Version:
    """One model version of the fixture: how its tables are stored and what its model.toml says."""

    model: str
    version: int
    storage: str
    precision: str
    item_id_field: str | None
    description: str
    table_files: dict[str, str] = field(
        default_factory=lambda: {"user": "tables.safetensors", "item": "tables.safetensors"}
    )
    shared_tables: dict[str, str] = field(default_factory=dict)  # field -> the other field's table it reads
    served: bool = True

    @property
    def path(self) -> str:
        return f"{self.model}/{self.version}"


VERSIONS = (
    _Version(
        "deepfm-fp32", 1, "fp32", "fp32", ITEM_ID_FIELD, "test fixture: DeepFM, fp32, older weights", served=False
    ),
    _Version("deepfm-fp32", 2, "fp32", "fp32", ITEM_ID_FIELD, "test fixture: DeepFM, fp32"),
    _Version(
        "deepfm-fp16",
        1,
        "fp16",
        "fp32",
        None,
        "test fixture: DeepFM, fp16 tables in two files, C26 shares C25's table",
        table_files={"user": "user_tables.safetensors", "item": "item_tables.safetensors"},
        shared_tables={"C26": "C25"},
    ),
    _Version("deepfm-int8", 1, "int8", "int8", ITEM_ID_FIELD, "test fixture: DeepFM, int8 tables, INT8 QDQ graph"),
)


def model_toml_of(version: _Version) -> DeepFMToml:
    """The model.toml of one fixture version."""
    fields = tuple(FieldSpec(name, f.side, version.shared_tables.get(name, name)) for name, f in FIELDS.items())
    tables = tuple(
        TableSpec(
            name=name,
            file=version.table_files[f.side],
            rows=f.rows,
            dim=FACTORS + 1,
            storage=version.storage,
            oov=f.oov,
            default_row=f.default_row,
        )
        for name, f in FIELDS.items()
        if name not in version.shared_tables
    )
    return DeepFMToml(
        tables=tables,
        fields=fields,
        dense_graph=DenseGraphSpec(file="dense.onnx", precision=version.precision),
        ranking=RankingSpec(dense_features=DENSE_FEATURES, item_id_field=version.item_id_field),
        description=version.description,
    )


def _f32(values: np.ndarray) -> list[float]:
    """JSON numbers that are exactly the given float32 values."""
    return [float(v) for v in np.asarray(values, dtype=np.float32)]


def _typical_dense(rng: np.random.Generator, count: int) -> np.ndarray:
    """Criteo-like raw dense features [count, 13]: counts with many zeros and a heavy tail, I2 sometimes -1."""
    counts = np.floor(rng.lognormal(1.5, 1.5, (count, len(DENSE_FEATURES))))
    counts[rng.random(counts.shape) < 0.25] = 0.0
    counts[:, 1] = np.where(rng.random(count) < 0.2, -1.0, counts[:, 1])
    return counts.astype(np.float32)


def _calibration_samples(
    rng: np.random.Generator, tables: dict[str, Table], model: DeepFMToml
) -> tuple[np.ndarray, np.ndarray]:
    emb = np.stack(
        [
            gather(tables[f.table], rng.integers(0, tables[f.table].spec.rows, CALIBRATION_SAMPLES))
            for f in model.fields
        ],
        axis=1,
    )
    return emb, _typical_dense(rng, CALIBRATION_SAMPLES)


class _Requests:
    """Builds v1 rank requests for one model from ids chosen per field."""

    def __init__(self, model: DeepFMToml, rng: np.random.Generator) -> None:
        self.model, self.rng = model, rng
        self.item_id_field = model.ranking.item_id_field

    def rows(self, name: str) -> int:
        return self.model.table(self.field(name).table).rows

    def field(self, name: str) -> FieldSpec:
        return next(f for f in self.model.fields if f.name == name)

    def random_ids(self, side: str) -> dict[str, int]:
        return {f.name: int(self.rng.integers(0, self.rows(f.name))) for f in self.model.fields_on(side)}

    def request(
        self,
        user: dict[str, int],
        dense: list[float],
        items: list[dict[str, int]],
        *,
        ids: bool = True,
        top_k: int | None = None,
    ) -> dict[str, Any]:
        candidates = []
        for i, item in enumerate(items):
            candidate: dict[str, Any] = {}
            if self.item_id_field is not None:
                candidate["id"] = item[self.item_id_field]
            elif ids:
                candidate["id"] = 10_000 + i  # only echoed back
            candidate["fields"] = {name: value for name, value in item.items() if name != self.item_id_field}
            candidates.append(candidate)
        request: dict[str, Any] = {"user": {"fields": user, "dense": dense}, "candidates": candidates}
        if top_k is not None:
            request["top_k"] = top_k
        return request

    def random(self, count: int, **options: Any) -> dict[str, Any]:
        dense = _f32(_typical_dense(self.rng, 1)[0])
        return self.request(self.random_ids("user"), dense, [self.random_ids("item") for _ in range(count)], **options)

    def oov_ids(self, side: str, index: int) -> dict[str, int]:
        """Out-of-vocabulary ids in every `default` table of a side (cycling through the kinds of OOV id),
        random valid ids in `reject` tables."""
        ids = self.random_ids(side)
        for j, f in enumerate(self.model.fields_on(side)):
            rows = self.rows(f.name)
            if self.model.table(f.table).oov == "default":
                ids[f.name] = (-1, I64_MIN, rows, I64_MAX, rows + 12345, -rows)[(index + j) % 6]
        return ids


def _cases(model: DeepFMToml, rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    """(description, request) pairs that cover what the server's rank path must get right."""
    r = _Requests(model, rng)
    user_fields, item_fields = model.fields_on("user"), model.fields_on("item")
    cases = [
        ("1 candidate", r.random(1)),
        ("100 candidates", r.random(100)),
        ("257 candidates", r.random(257)),
        (
            "every user id at rows - 1; candidates alternate item ids 0 and rows - 1; dense all zero",
            r.request(
                {f.name: r.rows(f.name) - 1 for f in user_fields},
                [0.0] * len(DENSE_FEATURES),
                [{f.name: 0 if i % 2 == 0 else r.rows(f.name) - 1 for f in item_fields} for i in range(6)],
            ),
        ),
        (
            "every user id 0; dense negative",
            r.request(
                {f.name: 0 for f in user_fields},
                _f32(-rng.uniform(0.1, 50.0, len(DENSE_FEATURES))),
                [r.random_ids("item") for _ in range(4)],
            ),
        ),
        (
            "out-of-vocabulary ids (-1, i64 min, rows, i64 max, ...) in every default table, user and item side",
            r.request(r.oov_ids("user", 0), _f32(_typical_dense(rng, 1)[0]), [r.oov_ids("item", i) for i in range(12)]),
        ),
        (
            "dense values: zero, -0.0, negative, fractional, large (1e6, 1e9)",
            r.request(
                r.random_ids("user"),
                _f32([0.0, -1.0, 0.5, 1e6, 1e9, 3.25, -0.0, 0.001, 2.0, 0.0, 100.0, -7.5, 15.0]),
                [r.random_ids("item") for _ in range(8)],
            ),
        ),
        (
            "dense values near the float32 limits (1e30, 3e38, -3e38, 1e-30): finite, saturated scores",
            r.request(
                r.random_ids("user"),
                _f32([1e30, 3e38, -3e38, 1e-30, 0.0, 1.0, 1e30, 0.0, 5.0, 0.0, 1.0, 2.0, 3.0]),
                [r.random_ids("item") for _ in range(3)],
            ),
        ),
        ("top_k = 5 of 20 candidates", r.random(20, top_k=5)),
    ]
    if model.ranking.item_id_field is None:
        cases.append(("candidates without id (the model has no item_id_field)", r.random(10, ids=False)))
    return cases


def _error_cases(model: DeepFMToml, rng: np.random.Generator) -> list[tuple[str, str, dict[str, Any]]]:
    """(description, input named in the error, request) for ids outside `reject` tables."""
    r = _Requests(model, rng)
    cases = []
    for side in ("user", "item"):
        rejecting = [f for f in model.fields_on(side) if model.table(f.table).oov == "reject"]
        if not rejecting:
            continue
        f = rejecting[0]
        rows = r.rows(f.name)
        if side == "user":
            user = r.random_ids("user") | {f.name: rows}
            request = r.request(user, _f32(_typical_dense(rng, 1)[0]), [r.random_ids("item")])
            cases.append((f"user id {rows} = rows in reject table {f.table!r}", f"user.fields.{f.name}", request))
        else:
            items = [r.random_ids("item") for _ in range(5)]
            items[3][f.name] = -1
            request = r.request(r.random_ids("user"), _f32(_typical_dense(rng, 1)[0]), items)
            cases.append(
                (f"candidate 3 has id -1 in reject table {f.table!r}", f"candidates[3].fields.{f.name}", request)
            )
    return cases


def _model_summary(model: DeepFMToml, served_version: int) -> dict[str, Any]:
    def readers(table: str) -> list[str]:
        return [f.name for f in model.fields if f.table == table]

    oov: dict[str, list[dict[str, Any]]] = {"default": [], "reject": []}
    for t in model.tables:
        entry: dict[str, Any] = {"table": t.name, "rows": t.rows, "fields": readers(t.name)}
        if t.oov == "default":
            entry["default_row"] = t.default_row
        oov[t.oov].append(entry)
    return {
        "served_version": served_version,
        "storage": model.tables[0].storage,
        "precision": model.dense_graph.precision,
        "user_fields": [f.name for f in model.fields_on("user")],
        "item_fields": [f.name for f in model.fields_on("item")],
        "item_id_field": model.ranking.item_id_field,
        "dense_features": list(model.ranking.dense_features),
        "oov": oov,
    }


def _scorer(
    version: _Version, params: DeepFMParams, graph_path: Path
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    import onnxruntime as ort  # imported here: a command's --help must not pay for onnxruntime

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(graph_path, options, providers=["CPUExecutionProvider"])

    def with_onnxruntime(emb: np.ndarray, dense: np.ndarray) -> np.ndarray:
        return session.run(None, {EMBEDDINGS: emb, DENSE: dense})[0][:, 0].astype(np.float64)

    if version.precision == "int8":
        return with_onnxruntime

    def with_reference(emb: np.ndarray, dense: np.ndarray) -> np.ndarray:
        expected = deepfm.forward(params, emb, dense)
        gap = float(np.abs(with_onnxruntime(emb, dense) - expected).max())
        if gap > TOLERANCE / 10:
            raise RuntimeError(f"{graph_path}: onnxruntime differs from the reference forward pass by {gap:.3g}")
        return expected

    return with_reference


def build(out: Path, seed: int = SEED) -> None:
    """Write `out/repo/`, `out/cases.json` and `out/check-cases/`."""
    streams = np.random.SeedSequence(seed).spawn(2 * len(VERSIONS))
    summaries: dict[str, dict[str, Any]] = {}
    cases: list[dict[str, Any]] = []
    error_cases: list[dict[str, Any]] = []
    for version, weights_stream, cases_stream in zip(VERSIONS, streams[::2], streams[1::2], strict=True):
        rng = np.random.default_rng(weights_stream)
        model = model_toml_of(version)
        params = random_params(rng, model, factors=FACTORS, hidden=HIDDEN)
        graph = build_graph(params)
        if version.precision == "int8":
            stored = {t.name: Table(t, encode_table(t, params.tables[t.name])) for t in model.tables}
            graph = quantize_dense_graph(graph, *_calibration_samples(rng, stored, model))
        directory = out / "repo" / version.path
        write_deepfm_version(directory, model, params.tables, graph)

        # Everything below reads the version back from disk, as the server will.
        model = model_toml.read_deepfm(directory / MODEL_TOML)
        tables = load_tables(directory, model)
        score = _scorer(version, params, directory / model.dense_graph.file)
        rng = np.random.default_rng(cases_stream)
        version_cases = _cases(model, rng)
        if version.served:
            summaries[version.model] = _model_summary(model, version.version)
        else:
            version_cases = version_cases[:2]
        for what, request in version_cases:
            emb, dense = rank_inputs(model, tables, request)
            cases.append(
                {
                    "model": version.model,
                    "version": version.version,
                    "what": what,
                    "request": request,
                    "expected_scores": [float(s) for s in score(emb, dense)],
                    "tolerance": INT8_TOLERANCE if version.precision == "int8" else TOLERANCE,
                }
            )
        if version.served:
            for what, input_path, request in _error_cases(model, rng):
                try:
                    rank_inputs(model, tables, request)
                except RequestError as e:
                    if not str(e).startswith(input_path):
                        raise RuntimeError(f"error case {what!r} fails at {e}, not at {input_path}") from e
                else:
                    raise RuntimeError(f"error case {what!r} of {version.model} is accepted")
                error_cases.append(
                    {"model": version.model, "what": what, "request": request, "status": 400, "input": input_path}
                )
    import onnxruntime as ort

    document = {
        "format_version": CASES_FORMAT_VERSION,
        "seed": seed,
        "onnxruntime": ort.__version__,
        "models": summaries,
        "cases": cases,
        "error_cases": error_cases,
    }
    files.write_text(out / "cases.json", _dump(document) + "\n", encoding="utf-8")
    from . import check_cases  # builds ONNX graphs: imported when used, so that `fixture --help` stays fast

    check_cases.write(out / "check-cases")
    fixture_recall.build(out, seed)


def _dump(value: Any, depth: int = 0) -> str:
    """JSON laid out for reading and diffing: objects holding objects or arrays are expanded, an array of
    objects has one object per line (so one case per line), everything else stays on one line."""
    inner, outer = "  " * (depth + 1), "  " * depth
    if isinstance(value, dict) and any(isinstance(v, (dict, list)) for v in value.values()):
        body = ",\n".join(f"{inner}{json.dumps(k)}: {_dump(v, depth + 1)}" for k, v in value.items())
        return f"{{\n{body}\n{outer}}}"
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        body = ",\n".join(f"{inner}{json.dumps(v)}" for v in value)
        return f"[\n{body}\n{outer}]"
    return json.dumps(value)


def outputs(out: Path) -> list[Path]:
    """What `build(out)` writes: the files and directories that `--force` replaces."""
    return [
        out / "repo",
        out / "cases.json",
        out / "check-cases",
        out / fixture_recall.CASES_FILE,
        out / fixture_recall.CONFIG_FILE,
    ]
