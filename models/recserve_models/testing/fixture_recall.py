"""Recall and recommend in the test fixture: two small recall models, a ranking model with an item feature table,
a pipeline joining them, and the answers the server must give (`python -m recserve_models fixture` calls
`build` after writing the rank fixture).

Written into the fixture directory `DIR`:

- `DIR/repo/lightgcn/1/`: a tiny LightGCN (48 users, 300 items, dim 24, K = 2 layers, `default_k = 12`) trained
  on nothing: random interactions and random layer-0 vectors, propagated exactly as LightGCN does, so its `user`,
  `item` and `history` tables (fp32, `oov = "reject"`) obey the documented identity: the history embedding of a user's
  full training history is `e_u − e_u^(0) / (K + 1)`. Items 7, 123 and 200 have identical item vectors (exact
  score ties), and some items have no interactions (`h_i = 0`).
- `DIR/repo/lightgcn-int8/1/`: 40 users, 257 items, dim 16, random vectors: an int8 item table with
  `oov = "default"`, an fp16 user table with `oov = "default"` and `default_row = 5`, no history table.
- `DIR/repo/deepfm-items/1/`: a DeepFM ranking model (user fields `age` (reject) and `city`; item fields `item`
  (the `item_id_field`, one row per `lightgcn` item), `category` (reject) and `brand` (`default_row = 3`); dense
  features `hour`, `visits`) with `[item_features]`: `item_features.safetensors`, I64 `[300, 2]`, columns
  `category`, `brand` (a few brands out of vocabulary, read from the default row).
- `DIR/repo/deepfm-featured/1/`: `deepfm-items`'s fields and item feature table, plus the candidate features
  `recall_score` (read linearly, centred and scaled), `recall_rank` and `cooccurrence` (log1p) after its dense
  features, and `[cooccurrence]`: cosine item-item weights over the `lightgcn` training interactions, 8 per row.
- `DIR/recserve.toml`: `[pipelines.fixture]`: recall `lightgcn`, rank `deepfm-items`, 20 candidates, k = 5; and
  `[pipelines.featured]`: recall `lightgcn`, rank `deepfm-featured`, 20 candidates, k = 5.
  Use it with `--repository DIR/repo --config DIR/recserve.toml`.
- `DIR/recall-cases.json`: `{"format_version", "seed", "models", "recall_cases", "history_identity",
  "pipeline", "recommend_cases", "featured_pipeline", "featured_cases"}`. Each recall case is `{"model", "what", "request", "expected"}` with the
  expected items (`id`, `score`) best first (a `history` case also gives `history_used`, the distinct items with
  a history vector, and, when none has one, `fallback: "popularity"`: the most popular items, score 0); each recommend case `{"what", "request", "expected", "tolerance"}`
  with items (`id`, `score`, `recall_score`), and `featured_cases` the same through `featured` (a `user_id` request
  sends the user's items in `history` too, which `cooccurrence` reads; each item also gives its item
  `fields` and candidate `features`, what a rank request to the ranker alone sends); `history_identity` gives users, their full training history and
  their layer-0 vector.

Expected recall answers are exact: numpy evaluates the documented f32 formula in the documented order
(`s = 0; s += q[j] * x[j]` for j ascending, element-wise float32 operations, which never fuse; int8 items:
`(Σ q[j]·c[j])·scale + bias·Σ q[j]`) and the history vector in float64 (`Σ h_i` over distinct ids in request
order, divided by `sqrt(|H|)`, then rounded to float32), so the server must return the same ids in the same order
with the same float32 scores, ties by lower id. Recommend scores come from `deepfm.forward` (float64) on the
rows the reference gather returns, checked against onnxruntime within 1e-6; the cases are chosen so that
consecutive expected scores differ by more than 1e-4 (the order is then the same in float32).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save

from .. import cooccurrence, deepfm, files
from ..model_toml import (
    DEFAULT_K,
    CooccurrenceSpec,
    DeepFMToml,
    DenseGraphSpec,
    FieldSpec,
    ItemFeaturesSpec,
    RankingSpec,
    TableSpec,
)
from ..onnx_export import DENSE, EMBEDDINGS, build_graph
from ..rank_request import rank_inputs
from ..repository import MODEL_TOML, POPULARITY, Table, encode_table, load_tables, write_deepfm_version
from ._weights import random_params

CASES_FILE = "recall-cases.json"
CONFIG_FILE = "recserve.toml"
CASES_FORMAT_VERSION = 1
STREAM = 4  # this module's random stream: SeedSequence([seed, STREAM])

LIGHTGCN = "lightgcn"
LIGHTGCN_INT8 = "lightgcn-int8"
RANKING = "deepfm-items"
PIPELINE = {"name": "fixture", "recall_model": LIGHTGCN, "ranking_model": RANKING, "candidates": 20, "k": 5}
FEATURED = "deepfm-featured"
FEATURED_PIPELINE = {"name": "featured", "recall_model": LIGHTGCN, "ranking_model": FEATURED, "candidates": 20, "k": 5}
FEATURED_NEIGHBOURS = 8
USERS, ITEMS, DIM, LAYERS = 48, 300, 24, 2
LIGHTGCN_DEFAULT_K = 12  # `[recall] default_k` of `lightgcn`; `lightgcn-int8` has none, so DEFAULT_K applies
TIED_ITEMS = (7, 123, 200)
INT8_USERS, INT8_ITEMS, INT8_DIM, INT8_DEFAULT_USER = 40, 257, 16, 5
RANK_TOLERANCE = 1e-5
NEAR_TIE = 1e-4


def _toml_value(value: object) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)


def _lightgcn_toml(description: str, tables: list[TableSpec], recall: dict[str, str]) -> str:
    """model.toml of a `kind = "lightgcn"` version (docs/model-repository.md)."""
    lines = ["format_version = 1", 'kind = "lightgcn"', f"description = {_toml_value(description)}", "", "[recall]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in recall.items()]
    for t in tables:
        lines += ["", "[[tables]]"]
        keys = ["name", "file", "rows", "dim", "storage", "oov"] + (["default_row"] if t.oov == "default" else [])
        lines += [f"{key} = {_toml_value(getattr(t, key))}" for key in keys]
    return "\n".join(lines) + "\n"


def _write_tables(
    directory: Path,
    specs: list[TableSpec],
    values: dict[str, np.ndarray],
    extra: dict[str, dict[str, np.ndarray]] | None = None,
) -> None:
    by_file: dict[str, dict[str, np.ndarray]] = {}
    for spec in specs:
        by_file.setdefault(spec.file, {})[spec.name] = encode_table(spec, values[spec.name])
    for file, tensors in (extra or {}).items():
        by_file[file] |= tensors
    for file, tensors in by_file.items():
        files.write_bytes(directory / file, save(tensors))


def _f32(values: np.ndarray) -> list[float]:
    return [float(v) for v in np.asarray(values, dtype=np.float32)]


# --- the documented scores, evaluated exactly as the server does ------------------------------------------


def f32_scores(query: np.ndarray, items: np.ndarray) -> np.ndarray:
    """`s = 0; for j: s = s + q[j] * x[j]` in float32 for every row of `items` [n, dim] float32."""
    scores = np.zeros(items.shape[0], dtype=np.float32)
    for j in range(items.shape[1]):
        scores = scores + query[j] * items[:, j]
    return scores


def int8_scores(query: np.ndarray, fused: np.ndarray) -> np.ndarray:
    """`(Σ q[j]·c[j])·scale + bias·Σ q[j]` in float32, sums in index order, for fused int8 rows [n, dim + 8]."""
    dim = fused.shape[1] - 8
    codes = fused[:, :dim].astype(np.float32)
    scale = fused[:, dim : dim + 4].copy().view("<f4")[:, 0].astype(np.float32)
    bias = fused[:, dim + 4 :].copy().view("<f4")[:, 0].astype(np.float32)
    dot = f32_scores(query, codes)
    qsum = np.float32(0)
    for q in query:
        qsum = np.float32(qsum + q)
    return dot * scale + bias * qsum


def history_vector(history: np.ndarray, ids: list[int]) -> np.ndarray:
    """`(Σ_{i ∈ H} h_i) / sqrt(|H|)` over the distinct ids in request order, in float64, rounded to float32."""
    distinct = list(dict.fromkeys(ids))
    acc = np.zeros(history.shape[1], dtype=np.float64)
    for i in distinct:
        acc = acc + history[i].astype(np.float64)
    return (acc / np.sqrt(np.float64(len(distinct)))).astype(np.float32)


def top_k(scores: np.ndarray, k: int, exclude: list[int]) -> list[dict[str, Any]]:
    """The best `k` items, higher score first, equal scores by lower id, `exclude` skipped."""
    ids = np.arange(len(scores))
    keep = ~np.isin(ids, np.array(exclude, dtype=np.int64))
    ids, kept = ids[keep], scores[keep]
    order = np.lexsort((ids, -kept))[:k]
    return [{"id": int(ids[i]), "score": float(kept[i])} for i in order]


# --- the models --------------------------------------------------------------------------------------------


def _lightgcn(rng: np.random.Generator) -> dict[str, Any]:
    """Random interactions and layer-0 vectors, propagated: final user/item vectors, history vectors `h_i`."""
    interactions = np.zeros((USERS, ITEMS))
    for u in range(USERS):
        interactions[u, rng.choice(ITEMS, size=int(rng.integers(3, 13)), replace=False)] = 1.0
    du, di = interactions.sum(axis=1), interactions.sum(axis=0)
    inv_u = np.where(du > 0, 1.0 / np.sqrt(np.maximum(du, 1)), 0.0)
    inv_i = np.where(di > 0, 1.0 / np.sqrt(np.maximum(di, 1)), 0.0)
    norm = inv_u[:, None] * interactions * inv_i[None, :]
    users0 = rng.normal(0.0, 0.3, (USERS, DIM)).astype(np.float32)
    items0 = rng.normal(0.0, 0.3, (ITEMS, DIM)).astype(np.float32)
    eu, ei = [users0.astype(np.float64)], [items0.astype(np.float64)]
    for _ in range(LAYERS):
        eu, ei = [*eu, norm @ ei[-1]], [*ei, norm.T @ eu[-1]]
    users = sum(eu) / (LAYERS + 1)
    items = sum(ei) / (LAYERS + 1)
    history = sum(ei[:LAYERS]) * np.where(di > 0, inv_i / (LAYERS + 1), 0.0)[:, None]
    for i in TIED_ITEMS[1:]:
        items[i] = items[TIED_ITEMS[0]]
    return {
        "user": users.astype(np.float32),
        "item": items.astype(np.float32),
        "history": history.astype(np.float32),
        "users0": users0,
        "train": [np.flatnonzero(interactions[u]).tolist() for u in range(USERS)],
        "degree": di,
    }


def _write_lightgcn(repo: Path, rng: np.random.Generator) -> dict[str, Any]:
    model = _lightgcn(rng)
    specs = [
        TableSpec(name, "tables.safetensors", rows, DIM, "fp32", "reject")
        for name, rows in (("user", USERS), ("item", ITEMS), ("history", ITEMS))
    ]
    directory = repo / LIGHTGCN / "1"
    files.mkdir(directory)
    _write_tables(directory, specs, model, {"tables.safetensors": {POPULARITY: model["degree"].astype(np.int64)}})
    text = _lightgcn_toml(
        "test fixture: tiny LightGCN (random interactions, K = 2), fp32 tables with history vectors",
        specs,
        {
            "user_table": "user",
            "item_table": "item",
            "history_table": "history",
            "popularity": POPULARITY,
            "default_k": LIGHTGCN_DEFAULT_K,
        },
    )
    files.write_text(directory / MODEL_TOML, text, encoding="utf-8")
    return model


def _write_lightgcn_int8(repo: Path, rng: np.random.Generator) -> dict[str, Any]:
    users = rng.normal(0.0, 0.5, (INT8_USERS, INT8_DIM)).astype(np.float32)
    items = rng.normal(0.0, 0.5, (INT8_ITEMS, INT8_DIM)).astype(np.float32)
    specs = [
        TableSpec("user", "tables.safetensors", INT8_USERS, INT8_DIM, "fp16", "default", INT8_DEFAULT_USER),
        TableSpec("item", "tables.safetensors", INT8_ITEMS, INT8_DIM, "int8", "default", 0),
    ]
    directory = repo / LIGHTGCN_INT8 / "1"
    files.mkdir(directory)
    _write_tables(directory, specs, {"user": users, "item": items})
    text = _lightgcn_toml(
        "test fixture: random two-tower vectors, int8 item table, fp16 user table, no history table",
        specs,
        {"user_table": "user", "item_table": "item"},
    )
    files.write_text(directory / MODEL_TOML, text, encoding="utf-8")
    stored = {s.name: encode_table(s, v) for s, v in zip(specs, (users, items), strict=True)}
    return {"user": stored["user"].astype(np.float32), "item_fused": stored["item"]}


_RANK_FIELDS = {  # name: (rows, side, oov, default_row)
    "age": (8, "user", "reject", 0),
    "city": (20, "user", "default", 0),
    "item": (ITEMS, "item", "default", 0),
    "category": (12, "item", "reject", 0),
    "brand": (40, "item", "default", 3),
}
_DENSE = ("hour", "visits")
ITEM_FEATURE_COLUMNS = ("category", "brand")


def _rank_model(factors: int, ranking: RankingSpec, description: str, **sections: Any) -> DeepFMToml:
    """A DeepFM over `_RANK_FIELDS`, each field its own fp32 table."""
    return DeepFMToml(
        tables=tuple(
            TableSpec(name, "tables.safetensors", rows, factors + 1, "fp32", oov, default_row)
            for name, (rows, _, oov, default_row) in _RANK_FIELDS.items()
        ),
        fields=tuple(FieldSpec(name, side) for name, (_, side, _, _) in _RANK_FIELDS.items()),
        dense_graph=DenseGraphSpec(file="dense.onnx", precision="fp32"),
        ranking=ranking,
        description=description,
        **sections,
    )


def _write_ranking(repo: Path, rng: np.random.Generator) -> tuple[DeepFMToml, deepfm.DeepFMParams, np.ndarray]:
    factors = 4
    model = _rank_model(
        factors,
        RankingSpec(dense_features=_DENSE, item_id_field="item"),
        "test fixture: DeepFM with an item feature table, ranks the lightgcn catalogue",
    )
    params = random_params(rng, model, factors=factors, hidden=(16, 8), factor_std=0.5, linear_std=0.3)
    directory = repo / RANKING / "1"
    write_deepfm_version(directory, model, params.tables, build_graph(params))
    features = np.stack([rng.integers(0, 12, ITEMS), rng.integers(0, 40, ITEMS)], axis=1).astype(np.int64)
    features[[11, 57, 250], 1] = [-1, 40, 1000]  # brands out of vocabulary: the default row (3)
    files.write_bytes(directory / "item_features.safetensors", save({"item_features": features}))
    section = '\n[item_features]\nfile = "item_features.safetensors"\nfields = ["category", "brand"]\n'
    with (directory / MODEL_TOML).open("a", encoding="utf-8") as f:
        f.write(section)
    return model, params, features


_CANDIDATE_FEATURES = ("recall_score", "recall_rank", "cooccurrence")


def _write_featured(
    repo: Path, rng: np.random.Generator, lgcn: dict[str, Any], features: np.ndarray
) -> tuple[DeepFMToml, deepfm.DeepFMParams, cooccurrence.Cooccurrence]:
    """`deepfm-items`' fields and item features, with the three candidate features and the co-occurrence table."""
    factors = 4
    model = _rank_model(
        factors,
        RankingSpec(dense_features=_DENSE, item_id_field="item", candidate_features=_CANDIDATE_FEATURES),
        "test fixture: DeepFM with candidate features (recall score, rank, co-occurrence)",
        item_features=ItemFeaturesSpec("item_features.safetensors", ITEM_FEATURE_COLUMNS),
        cooccurrence=CooccurrenceSpec("cooccurrence.safetensors"),
    )
    params = deepfm.init_params(
        rng,
        {t.name: t.rows for t in model.tables},
        [f.table for f in model.fields],
        factors=factors,
        num_dense=len(_DENSE) + len(_CANDIDATE_FEATURES),
        hidden=(16, 8),
        factor_std=0.5,
        linear_std=0.3,
        dense_std=0.5,
    )
    log1p = deepfm.DenseTransform()
    transforms = (log1p, log1p, deepfm.DenseTransform(deepfm.LINEAR, centre=0.2, scale=0.5), log1p, log1p)
    params = dataclasses.replace(params, dense_transforms=transforms)
    train = lgcn["train"]
    indptr = np.concatenate([[0], np.cumsum([len(items) for items in train])]).astype(np.int64)
    indices = np.concatenate([np.asarray(items, np.int64) for items in train])
    table = cooccurrence.build(indptr, indices, ITEMS, FEATURED_NEIGHBOURS)
    write_deepfm_version(repo / FEATURED / "1", model, params.tables, build_graph(params), features, table)
    return model, params, table


# --- the cases ---------------------------------------------------------------------------------------------


def _recall_cases(lgcn: dict[str, Any], int8: dict[str, Any]) -> list[dict[str, Any]]:
    zero_degree = [int(i) for i in np.flatnonzero(lgcn["degree"] == 0)]
    active = [int(i) for i in np.flatnonzero(lgcn["degree"] > 0)]
    cases: list[tuple[str, str, dict[str, Any], np.ndarray]] = []

    def by_user(u: int) -> np.ndarray:
        return f32_scores(lgcn["user"][u], lgcn["item"])

    def by_history(ids: list[int]) -> np.ndarray:
        return f32_scores(history_vector(lgcn["history"], ids), lgcn["item"])

    add = cases.append
    add((LIGHTGCN, "user 0, k = 10", {"user_id": 0, "k": 10}, by_user(0)))
    add((LIGHTGCN, f"user 2, no k: the model's default_k ({LIGHTGCN_DEFAULT_K})", {"user_id": 2}, by_user(2)))
    add((LIGHTGCN, f"last user ({USERS - 1}), k = 1", {"user_id": USERS - 1, "k": 1}, by_user(USERS - 1)))
    add((LIGHTGCN, "user 5, k = the whole catalogue (items 7, 123, 200 tie)", {"user_id": 5, "k": ITEMS}, by_user(5)))
    add(
        (
            LIGHTGCN,
            "user 9, k = 20, training items excluded",
            {"user_id": 9, "k": 20, "exclude": lgcn["train"][9]},
            by_user(9),
        )
    )
    keep = [3, 150, 299]
    add(
        (
            LIGHTGCN,
            "user 3, k = 10, all but 3 items excluded: 3 items",
            {"user_id": 3, "k": 10, "exclude": [i for i in range(ITEMS) if i not in keep]},
            by_user(3),
        )
    )
    add(
        (
            LIGHTGCN,
            "user 4, every item excluded: no items",
            {"user_id": 4, "k": 5, "exclude": list(range(ITEMS))},
            by_user(4),
        )
    )
    add(
        (
            LIGHTGCN,
            "user 6, k = whole catalogue, tied item 123 excluded",
            {"user_id": 6, "k": ITEMS, "exclude": [123, 123]},
            by_user(6),
        )
    )
    history = active[:6]
    add((LIGHTGCN, "history of 6 items, k = 15", {"history": history, "k": 15}, by_history(history)))
    history = [active[10], zero_degree[0], active[10], active[3]]
    add(
        (
            LIGHTGCN,
            "history with a repeated id and an item without interactions, k = 5",
            {"history": history, "k": 5},
            by_history(history),
        )
    )
    history = zero_degree[:3]
    add(
        (
            LIGHTGCN,
            "history of items without interactions: no signal, the popularity order answers",
            {"history": history, "k": 6, "exclude": [0, 2]},
            by_history(history),
        )
    )
    add(
        (
            LIGHTGCN,
            "user 11's full training history, k = 20",
            {"history": lgcn["train"][11], "k": 20},
            by_history(lgcn["train"][11]),
        )
    )

    def int8_user(row: int) -> np.ndarray:
        return int8_scores(int8["user"][row], int8["item_fused"])

    add((LIGHTGCN_INT8, "user 0, k = 10", {"user_id": 0, "k": 10}, int8_user(0)))
    add(
        (
            LIGHTGCN_INT8,
            "user -1 (out of vocabulary: default row 5), k = 7",
            {"user_id": -1, "k": 7},
            int8_user(INT8_DEFAULT_USER),
        )
    )
    add(
        (
            LIGHTGCN_INT8,
            "user 12, whole catalogue, unknown excluded ids are ignored",
            {"user_id": 12, "k": INT8_ITEMS, "exclude": [-4, 3, INT8_ITEMS, 2**40]},
            int8_user(12),
        )
    )
    add((LIGHTGCN_INT8, "user 39, k = 1", {"user_id": 39, "k": 1}, int8_user(39)))
    add((LIGHTGCN_INT8, f"user 8, no k and no default_k: {DEFAULT_K}", {"user_id": 8}, int8_user(8)))
    default_k = {LIGHTGCN: LIGHTGCN_DEFAULT_K, LIGHTGCN_INT8: DEFAULT_K}

    out = []
    for model, what, request, scores in cases:
        exclude = [i for i in request.get("exclude", []) if 0 <= i < len(scores)]
        k = request.get("k", default_k[model])
        case = {"model": model, "what": what, "request": request, "expected": top_k(scores, k, exclude)}
        if "history" in request:
            # The items with a history vector (training interactions); none: the popularity order, every score 0.
            case["history_used"] = sum(1 for i in set(request["history"]) if lgcn["degree"][i] > 0)
            if case["history_used"] == 0:
                case["expected"] = top_k(lgcn["degree"].astype(np.float64), k, exclude)
                for item in case["expected"]:
                    item["score"] = 0.0
                case["fallback"] = "popularity"
        out.append(case)
    return out


def _recommend_requests(lgcn: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The requests of `recommend_cases` (through `fixture`)."""
    return [
        ("user 3, the pipeline's k", {"user_id": 3, "user": {"fields": {"age": 2, "city": 7}, "dense": [13.0, 2.0]}}),
        (
            "user 17, k = 8, training items excluded, timings asked (not compared)",
            {
                "user_id": 17,
                "user": {"fields": {"age": 0, "city": 19}, "dense": [0.0, 40.0]},
                "exclude": lgcn["train"][17],
                "k": 8,
                "timings": True,
            },
        ),
        (
            "history of user 21's first 4 training items, unknown city (default row)",
            {"history": lgcn["train"][21][:4], "user": {"fields": {"age": 7, "city": -3}, "dense": [23.0, 0.5]}},
        ),
        (
            "user 30, all but 3 items excluded: 3 ranked",
            {
                "user_id": 30,
                "user": {"fields": {"age": 4, "city": 1}, "dense": [8.0, 1.0]},
                "exclude": [i for i in range(ITEMS) if i not in (11, 57, 250)],
            },
        ),
        (
            "user 2, every item excluded: nothing to rank",
            {
                "user_id": 2,
                "user": {"fields": {"age": 1, "city": 2}, "dense": [1.0, 1.0]},
                "exclude": list(range(ITEMS)),
            },
        ),
    ]


def _featured_requests(lgcn: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The requests of `featured_cases` (through `featured`): a `user_id` request sends the user's items in
    `history` too, for `cooccurrence`."""
    train = lgcn["train"]
    return [
        (
            "user 3 with its training items as history and excluded",
            {
                "user_id": 3,
                "history": train[3],
                "exclude": train[3],
                "user": {"fields": {"age": 2, "city": 7}, "dense": [13.0, 2.0]},
            },
        ),
        (
            "user 17, k = 8: a history of 3 items, one repeated, and an id outside the catalogue (read as nothing)",
            {
                "user_id": 17,
                "history": [*train[17][:3], train[17][0], -5],
                "user": {"fields": {"age": 0, "city": 19}, "dense": [0.0, 40.0]},
                "k": 8,
            },
        ),
        (
            "history of user 21's training items, unknown city (default row)",
            {"history": train[21], "user": {"fields": {"age": 7, "city": -3}, "dense": [23.0, 0.5]}},
        ),
    ]


def _recommend_cases(
    lgcn: dict[str, Any],
    pipeline: dict[str, Any],
    requests: list[tuple[str, dict[str, Any]]],
    model: DeepFMToml,
    params: deepfm.DeepFMParams,
    tables: dict[str, Table],
    features: np.ndarray,
    graph: Path,
    table: cooccurrence.Cooccurrence | None = None,
) -> list[dict[str, Any]]:
    """The expected answers of `requests` through `pipeline`, whose ranking model is `model` (with candidate
    features computed as the server does: the recall score, the recall position, the co-occurrence sum)."""
    import onnxruntime as ort  # imported here: a command's --help must not pay for onnxruntime

    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    out = []
    for what, request in requests:
        if "user_id" in request:
            query = lgcn["user"][request["user_id"]]
        else:
            query = history_vector(lgcn["history"], request["history"])
        recalled = top_k(f32_scores(query, lgcn["item"]), pipeline["candidates"], request.get("exclude", []))
        expected: list[dict[str, Any]] = []
        if recalled:
            rank_request = {
                "user": request["user"],
                "candidates": [
                    {"id": r["id"], "fields": dict(zip(ITEM_FEATURE_COLUMNS, map(int, features[r["id"]]), strict=True))}
                    for r in recalled
                ],
            }
            emb, dense = rank_inputs(model, tables, rank_request)
            ids = np.array([r["id"] for r in recalled], np.int64)
            per_candidate = {
                "recall_score": np.array([r["score"] for r in recalled], np.float32),
                "recall_rank": np.arange(len(recalled), dtype=np.float32),
            }
            if table is not None:
                per_candidate["cooccurrence"] = cooccurrence.feature(table, np.array(request["history"]), ids)
            columns = [per_candidate[name] for name in model.ranking.candidate_features]
            dense = np.concatenate([dense, *(c[:, None] for c in columns)], axis=1).astype(np.float32)
            scores = deepfm.forward(params, emb, dense)
            gap = float(np.abs(session.run(None, {EMBEDDINGS: emb, DENSE: dense})[0][:, 0] - scores).max())
            if gap > 1e-6:
                raise RuntimeError(f"recommend case {what!r}: onnxruntime differs from the reference by {gap:.3g}")
            order = sorted(range(len(recalled)), key=lambda i: (-scores[i], i))
            k = request.get("k", pipeline["k"])
            ranked = [scores[i] for i in order]
            close = [a - b for a, b in itertools.pairwise(ranked)][:k]
            if close and min(close) <= NEAR_TIE:
                raise RuntimeError(f"recommend case {what!r}: ranking scores closer than {NEAR_TIE}; pick another")
            expected = [
                {"id": recalled[i]["id"], "score": float(scores[i]), "recall_score": recalled[i]["score"]}
                for i in order[:k]
            ]
            if columns:  # what a rank request to the ranker alone would send for each returned item
                for item, i in zip(expected, order[:k], strict=False):
                    names = model.ranking.candidate_features
                    item["features"] = {name: float(c[i]) for name, c in zip(names, columns, strict=True)}
                    item["fields"] = rank_request["candidates"][i]["fields"]
        out.append({"what": what, "request": request, "expected": expected, "tolerance": RANK_TOLERANCE})
    return out


def build(out: Path, seed: int) -> None:
    """Writes the recall and ranking models into `out/repo`, `out/recserve.toml` and `out/recall-cases.json`."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, STREAM]))
    repo = out / "repo"
    lgcn = _write_lightgcn(repo, rng)
    int8 = _write_lightgcn_int8(repo, rng)
    model, params, features = _write_ranking(repo, rng)
    ranking_dir = repo / RANKING / "1"
    tables = load_tables(ranking_dir, model)
    featured_rng = np.random.default_rng(np.random.SeedSequence([seed, STREAM, 1]))
    featured, featured_params, table = _write_featured(repo, featured_rng, lgcn, features)
    featured_dir = repo / FEATURED / "1"
    pipeline = PIPELINE
    config = "\n".join(
        f"[pipelines.{p['name']}]\n"
        + "".join(f"{key} = {_toml_value(value)}\n" for key, value in p.items() if key != "name")
        for p in (pipeline, FEATURED_PIPELINE)
    )
    files.write_text(
        out / CONFIG_FILE,
        "# The test fixture's pipeline: recserve serve --repository repo --config recserve.toml\n" + config,
    )
    identity_users = [11, 20, 33]
    document = {
        "format_version": CASES_FORMAT_VERSION,
        "seed": seed,
        "models": {
            LIGHTGCN: {
                "users": USERS,
                "items": ITEMS,
                "dim": DIM,
                "layers": LAYERS,
                "storage": "fp32",
                "history": True,
                "tied_items": list(TIED_ITEMS),
            },
            LIGHTGCN_INT8: {
                "users": INT8_USERS,
                "items": INT8_ITEMS,
                "dim": INT8_DIM,
                "storage": "int8",
                "history": False,
                "default_user_row": INT8_DEFAULT_USER,
            },
        },
        "recall_cases": _recall_cases(lgcn, int8),
        "history_identity": [
            {
                "model": LIGHTGCN,
                "user": u,
                "history": lgcn["train"][u],
                "layer0": _f32(lgcn["users0"][u]),
                "layers": LAYERS,
            }
            for u in identity_users
        ],
        "pipeline": pipeline,
        "recommend_cases": _recommend_cases(
            lgcn, pipeline, _recommend_requests(lgcn), model, params, tables, features, ranking_dir / "dense.onnx"
        ),
        "featured_pipeline": FEATURED_PIPELINE,
        "featured_cases": _recommend_cases(
            lgcn,
            FEATURED_PIPELINE,
            _featured_requests(lgcn),
            featured,
            featured_params,
            load_tables(featured_dir, featured),
            features,
            featured_dir / "dense.onnx",
            table,
        ),
    }
    files.write_text(out / CASES_FILE, _dump(document) + "\n", encoding="utf-8")


def _dump(document: dict[str, Any]) -> str:
    """One case per line, like cases.json."""
    lines = ["{"]
    items = list(document.items())
    for n, (key, value) in enumerate(items):
        comma = "," if n + 1 < len(items) else ""
        if isinstance(value, list) and value and isinstance(value[0], dict):
            body = ",\n".join(f"    {json.dumps(v)}" for v in value)
            lines.append(f"  {json.dumps(key)}: [\n{body}\n  ]{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{comma}")
    return "\n".join([*lines, "}"])
