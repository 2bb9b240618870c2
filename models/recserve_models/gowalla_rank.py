"""The demo's ranking model on Gowalla, for its recall → rank pipeline: a DeepFM that reranks the recall stage's
own candidates, trained on a label window, its version (item feature and co-occurrence tables), and the
pipeline's offline quality.

**Training data** (`training_data`), the way a production ranker is trained: each user's training interactions
are split into an early and a late window (`label_window`); LightGCN-A, fitted on the early window only with the
demo's recipe, recalls each user's top `candidates` items (early items excluded), and a candidate is a positive
when it is one of the user's late items (hard negatives: the other candidates). Every feature comes from the
early window: the candidate features the pipeline computes (`model_toml.CANDIDATE_FEATURES`: LightGCN-A's score,
the 0-based position in its list, the co-occurrence sum over the user's early items of a table built on the
early interactions) and the fields below. The users are split into training and validation users
(`validation_share`) for early stopping.

**Fields** (`model.toml` order, the graph's):

| field | side | table rows | value |
| --- | --- | --- | --- |
| `activity` | user | `BUCKETS` | `bucket(n)` of the length `n` of the request's history (the user's training items) |
| `popularity` | item | `BUCKETS` | `bucket(d)` of the item's training interactions `d` (the item feature table) |
| `item` (with `item_ids`) | item | items | the item id, the `item_id_field` |

with `bucket(n) = min(floor(log2(1 + n)), BUCKETS − 1)`. No per-request dense features; the dense input is the
three candidate features, read through `deepfm.DenseTransform`s fitted on the training rows (the score
standardised, the rank and the co-occurrence sum as `log1p` and standardised) and exported inside the graph.

**Training** (`fit`): binary cross-entropy, Adam, `train_deepfm.loss_and_gradients`; after every epoch the
validation users' candidates are reranked, and the epoch with the best validation Recall@20 (labels: the late
items) is kept; training stops `patience` epochs after the best one.

**Serving** (`export`): the served pipeline is the demo's LightGCN trained on all training interactions with this
ranker, whose features come from all training interactions: its co-occurrence table (`[cooccurrence]`, the same
weighting) and popularity. Yesterday's window trains the ranker of today's recall stage, as in production. As
the serving-time features come from more data than the early window (longer histories, a denser table), the
transforms' centres and scales are refitted on them (`serving_transforms`, no labels involved) before the graph
is built.

**Pipeline quality** (`pipeline_quality`): for every test user, by `user_id` (the LightGCN user table) and by
`history` (the user's training items embedded with the history table), the top `N` items of the served LightGCN
with the user's training items excluded (what a recommend request with `exclude` recalls), the candidate features
as the server computes them (the served tables' scores, the positions, the served co-occurrence table over the
user's training items, which a request by `user_id` sends as its `history` too), ranked by the served ranker
through its own ONNX graph, best 20: Recall@20 and NDCG@20 as `lightgcn.evaluate` computes them, beside LightGCN
alone (its first 20 of the same list); and the AUC within the top 100 candidates (test items against the other
candidates) of the ranker, of LightGCN's score and of the item's log popularity.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from . import cooccurrence, files, train_deepfm
from .check import Version, _history_users, run_graph
from .deepfm import LINEAR, LOG1P, DeepFMParams, DenseTransform, Layer
from .label_window import WindowConfig
from .lightgcn import Interactions, LightGCNRun
from .metrics import auc, log_loss
from .model_toml import (
    CANDIDATE_FEATURES,
    COOCCURRENCE,
    RECALL_RANK,
    RECALL_SCORE,
    CooccurrenceSpec,
    DeepFMToml,
    DenseGraphSpec,
    FieldSpec,
    ItemFeaturesSpec,
    LightGCNToml,
    RankingSpec,
    TableSpec,
)
from .onnx_export import build_graph
from .optim import Adam
from .progress import Progress
from .repository import gather, read_item_features, values, write_deepfm_version

BUCKETS = 16
TABLES_FILE = "tables.safetensors"
FEATURES_FILE = "item_features.safetensors"
COOCCURRENCE_FILE = "cooccurrence.safetensors"
ACTIVITY, POPULARITY, ITEM = "activity", "popularity", "item"
TRANSFORM_KINDS = {RECALL_SCORE: LINEAR, RECALL_RANK: LOG1P, COOCCURRENCE: LOG1P}
RUN_TENSORS, RUN_JSON = "deepfm.safetensors", "training.json"
K = 20  # the list length of the metrics (Recall@K, NDCG@K)


@dataclass(frozen=True)
class RankConfig:
    candidates: int = 100  # recalled per user for the training rows (the pipeline's `candidates`)
    neighbours: int = 20  # co-occurrence neighbours kept per item
    item_ids: bool = True  # an `item` id field (the `item_id_field`) beside popularity
    validation_share: float = 0.1
    factors: int = 8
    hidden: tuple[int, ...] = (32, 16)
    max_epochs: int = 12
    patience: int = 2
    batch: int = 2048
    lr: float = 1e-3
    l2: float = 1e-6
    seed: int = 20261205


def fields(config: RankConfig) -> tuple[tuple[str, str], ...]:
    return ((ACTIVITY, "user"), (POPULARITY, "item")) + (((ITEM, "item"),) if config.item_ids else ())


def bucket(counts: np.ndarray) -> np.ndarray:
    """`min(floor(log2(1 + n)), BUCKETS − 1)`, int64."""
    return np.minimum(np.floor(np.log2(1.0 + np.asarray(counts, dtype=np.float64))), BUCKETS - 1).astype(np.int64)


def popularity(data: Interactions) -> np.ndarray:
    """Each item's popularity bucket, int64 [items]: the item feature table's column."""
    return bucket(data.item_degrees())


# --- candidates and their features -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CandidateLists:
    """Each user's recalled items, best first, and their recall scores."""

    users: np.ndarray  # int64 [U]
    items: np.ndarray  # int64 [U, N]
    scores: np.ndarray  # float32 [U, N]


def recall(queries: np.ndarray, items: np.ndarray, data: Interactions, users: np.ndarray, n: int) -> CandidateLists:
    """The `n` best items of each user by `queries[u] · items`, the user's training items excluded, best first
    (ties: lower id): `queries` [users, dim] or [len(users), dim] rows aligned with `users`."""
    items_t = np.ascontiguousarray(items.T)
    out_items, out_scores = [], []
    rows = queries if len(queries) == len(users) else queries[users]
    for start in range(0, len(users), 512):
        batch = users[start : start + 512]
        scores = rows[start : start + 512] @ items_t
        for row, u in enumerate(batch):
            scores[row, data.train_indices[data.train_indptr[u] : data.train_indptr[u + 1]]] = -np.inf
        top = np.argpartition(-scores, n - 1, axis=1)[:, :n]
        picked = np.take_along_axis(scores, top, axis=1)
        order = np.lexsort((top, -picked), axis=1)
        out_items.append(np.take_along_axis(top, order, axis=1))
        out_scores.append(np.take_along_axis(picked, order, axis=1))
    return CandidateLists(users, np.concatenate(out_items), np.concatenate(out_scores))


def candidate_features(
    lists: CandidateLists, table: cooccurrence.Cooccurrence, history: Interactions, names: tuple[str, ...]
) -> np.ndarray:
    """The candidate features `names` of every candidate, float32 [U, N, len(names)], as the pipeline computes them:
    the recall score, the 0-based position, and the co-occurrence sum over the user's training items of `history`."""
    columns = {
        RECALL_SCORE: lambda: lists.scores.astype(np.float32),
        RECALL_RANK: lambda: np.broadcast_to(np.arange(lists.items.shape[1], dtype=np.float32), lists.items.shape),
        COOCCURRENCE: lambda: cooccurrence.features(
            table, history.train_indptr, history.train_indices, lists.users, lists.items
        ),
    }
    return np.stack([columns[name]() for name in names], axis=2)


def _in_lists(users: np.ndarray, items: np.ndarray, indptr: np.ndarray, indices: np.ndarray, n: int) -> np.ndarray:
    """Boolean like `items` [U, N]: is `items[r, j]` in row `users[r]` of the CSR (`indptr`, `indices`, `n` items)."""
    keys = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr)) * n + indices
    wanted = users[:, None] * n + items
    at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    return keys[at] == wanted


# --- the training data ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankData:
    """Rows of whole candidate lists, `candidates` per user and in list order: `rows` in field order with the raw
    candidate features as `dense`, and each user's late items (the metrics' denominators)."""

    rows: train_deepfm.Dataset
    candidates: int
    late_counts: np.ndarray  # int64 [users of the rows]

    def users(self, pick: np.ndarray) -> RankData:
        rows = (pick[:, None] * self.candidates + np.arange(self.candidates)).ravel()
        return RankData(self.rows.take(rows), self.candidates, self.late_counts[pick])


def training_data(
    early_run: LightGCNRun, window: Interactions, config: RankConfig, progress: Callable[[str], None]
) -> tuple[RankData, RankData, dict[str, Any]]:
    """Training and validation rows from LightGCN-A (`early_run`) and the label `window` (train: early, test:
    late), and what they hold."""
    users = np.flatnonzero(window.test_users())
    lists = recall(early_run.users, early_run.items, window, users, config.candidates)
    progress(f"recalled {config.candidates} candidates for {len(users)} users; building the early co-occurrence table")
    table = cooccurrence.build(window.train_indptr, window.train_indices, window.items, config.neighbours)
    dense = candidate_features(lists, table, window, CANDIDATE_FEATURES).reshape(-1, len(CANDIDATE_FEATURES))
    labels = _in_lists(users, lists.items, window.test_indptr, window.test_indices, window.items)
    activity = bucket(np.diff(window.train_indptr))[users]
    columns = {
        ACTIVITY: np.repeat(activity, config.candidates),
        POPULARITY: popularity(window)[lists.items].ravel(),
        ITEM: lists.items.ravel(),
    }
    ids = np.stack([columns[name] for name, _ in fields(config)], axis=1).astype(np.int64)
    late = np.diff(window.test_indptr)[users]
    everything = RankData(train_deepfm.Dataset(ids, dense, labels.ravel().astype(np.int8)), config.candidates, late)
    order = np.random.default_rng([config.seed, 1]).permutation(len(users))
    cut = round(len(users) * config.validation_share)
    validation, train = np.sort(order[:cut]), np.sort(order[cut:])
    info = {
        "users": len(users),
        "train_users": len(train),
        "validation_users": len(validation),
        "rows": len(labels.ravel()),
        "positives": int(labels.sum()),
        "late_items_recalled": float(labels.sum() / late.sum()),
        "cooccurrence_entries": len(table.indices),
    }
    return everything.users(train), everything.users(validation), info


def fit_transforms(dense: np.ndarray) -> tuple[DenseTransform, ...]:
    """Each candidate feature's transform: its kind (`TRANSFORM_KINDS`), centred and scaled to the mean and standard
    deviation of `dense`'s rows (float32 values, so the graph and the numpy forward read the same numbers)."""
    out = []
    for j, name in enumerate(CANDIDATE_FEATURES):
        raw = dense[:, j].astype(np.float64)
        x = np.log1p(np.maximum(raw, 0.0)) if TRANSFORM_KINDS[name] == LOG1P else raw
        scale = float(np.float32(x.std())) or 1.0
        out.append(DenseTransform(TRANSFORM_KINDS[name], float(np.float32(x.mean())), scale))
    return tuple(out)


def initial_params(train: RankData, config: RankConfig, rows: dict[str, int]) -> DeepFMParams:
    """Small factors, zero first-order weights, He-initialised MLP with a small last layer, `w0` at the logit of
    the training rows' positive rate."""
    rng = np.random.default_rng([config.seed, 2])
    k = config.factors
    tables = {}
    for name, _ in fields(config):
        table = np.zeros((rows[name], k + 1), np.float32)
        table[:, :k] = rng.normal(0.0, 0.01, (rows[name], k))
        tables[name] = table
    n = len(CANDIDATE_FEATURES)
    widths = [len(tables) * k + n, *config.hidden, 1]
    layers = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        std = np.sqrt(2 / fan_in) if i < len(widths) - 2 else 0.01
        layers.append(Layer(rng.normal(0, std, (fan_in, fan_out)).astype(np.float32), np.zeros(fan_out, np.float32)))
    rate = float(np.clip(train.rows.labels.mean(), 1e-4, 1 - 1e-4))
    return DeepFMParams(
        tables=tables,
        field_tables=tuple(name for name, _ in fields(config)),
        bias=np.float32(np.log(rate / (1 - rate))),
        dense_weights=np.zeros(n, np.float32),
        layers=tuple(layers),
        dense_transforms=fit_transforms(train.rows.dense),
    )


# --- training ------------------------------------------------------------------------------------------------


def list_metrics(scores: np.ndarray, labels: np.ndarray, relevant: np.ndarray, k: int = K) -> tuple[float, float]:
    """Recall@k and NDCG@k of reranking each row of candidates [U, N] by `scores` (ties: list order), `labels`
    marking the relevant candidates and `relevant` [U] counting each user's relevant items (recalled or not)."""
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    hits = np.take_along_axis(labels, order, axis=1).astype(np.float64)
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    ideal = np.cumsum(discounts)[np.minimum(relevant, k) - 1]
    dcg = hits @ discounts[: hits.shape[1]]  # a list shorter than k has fewer places
    return float((hits.sum(axis=1) / relevant).mean()), float((dcg / ideal).mean())


def evaluate(params: DeepFMParams, data: RankData) -> dict[str, float]:
    p = train_deepfm.probabilities(params, data.rows).reshape(-1, data.candidates)
    labels = data.rows.labels.reshape(-1, data.candidates)
    recall_at, ndcg_at = list_metrics(p, labels, data.late_counts)
    flat = data.rows.labels
    return {
        "auc": auc(flat, p.ravel()),
        "log_loss": log_loss(flat, p.ravel()),
        "recall@20": recall_at,
        "ndcg@20": ndcg_at,
    }


def _copy(params: DeepFMParams) -> DeepFMParams:
    return replace(
        params,
        tables={name: t.copy() for name, t in params.tables.items()},
        dense_weights=params.dense_weights.copy(),
        layers=tuple(Layer(layer.weight.copy(), layer.bias.copy()) for layer in params.layers),
    )


def fit(
    params: DeepFMParams, train: RankData, validation: RankData, config: RankConfig, progress: Callable[[str], None]
) -> tuple[DeepFMParams, list[dict[str, float]], int, float]:
    """Adam on the mean BCE of `train`, one validation after each epoch, early stopping on the validation
    Recall@20; returns the best epoch's parameters, one record per epoch, the best epoch and the training seconds."""
    import time

    rng = np.random.default_rng([config.seed, 3])
    params = _copy(params)
    bias = np.array([params.bias], np.float32)
    adam = Adam(lr=config.lr)
    rows = train.rows
    steps = Progress("steps", -(-len(rows) // config.batch) * config.max_epochs, progress, every=30.0)
    history: list[dict[str, float]] = []
    best, best_epoch, seconds = params, 0, 0.0
    for epoch in range(1, config.max_epochs + 1):
        started = time.perf_counter()
        order = rng.permutation(len(rows))
        loss_sum = 0.0
        for start in range(0, len(rows), config.batch):
            pick = np.sort(order[start : start + config.batch])
            current = replace(params, bias=bias[0])
            loss, grads = train_deepfm.loss_and_gradients(current, rows.ids[pick], rows.dense[pick], rows.labels[pick])
            loss_sum += loss * len(pick)
            adam.next_step()
            adam.step("bias", bias, np.array([grads.bias], np.float32))
            adam.step("dense_weights", params.dense_weights, grads.dense_weights)
            for i, (dw, db) in enumerate(grads.layers):
                adam.step(f"mlp.{i}.weight", params.layers[i].weight, dw)
                adam.step(f"mlp.{i}.bias", params.layers[i].bias, db)
            for name, (ids, g) in grads.rows.items():
                table = params.tables[name]
                adam.step_rows(f"table.{name}", table, ids, g + np.float32(config.l2) * table[ids])
            steps.advance(note=f"epoch {epoch}")
        seconds += time.perf_counter() - started
        params = replace(params, bias=bias[0])
        record = {"epoch": epoch, "train_log_loss": loss_sum / len(rows), "seconds": seconds}
        record |= {f"validation_{key}": value for key, value in evaluate(params, validation).items()}
        history.append(record)
        progress(
            f"epoch {epoch}: train log loss {record['train_log_loss']:.4f}, "
            f"validation AUC {record['validation_auc']:.4f}, "
            f"Recall@20 {record['validation_recall@20']:.4f}, NDCG@20 {record['validation_ndcg@20']:.4f}"
        )
        if best_epoch == 0 or record["validation_recall@20"] > history[best_epoch - 1]["validation_recall@20"]:
            best, best_epoch = _copy(params), epoch
        elif epoch - best_epoch >= config.patience:
            break
    return best, history, best_epoch, seconds


@dataclass(frozen=True)
class RankRun:
    params: DeepFMParams
    info: dict[str, Any]
    directory: Path

    @staticmethod
    def load(directory: Path) -> RankRun:
        info = json.loads((directory / RUN_JSON).read_text(encoding="utf-8"))
        params = train_deepfm.load_params(directory / RUN_TENSORS)
        transforms = tuple(DenseTransform(**t) for t in info["dense_transforms"])
        return RankRun(replace(params, dense_transforms=transforms), info, directory)


def run_training(
    early_run: LightGCNRun,
    window: Interactions,
    window_config: WindowConfig,
    out: Path,
    config: RankConfig,
    progress: Callable[[str], None],
) -> RankRun:
    """Trains the ranker on LightGCN-A's candidates and the label window; writes the run directory `out` (the
    best epoch's parameters, training.json with the transforms, the curve and the baseline)."""
    train, validation, data_info = training_data(early_run, window, config, progress)
    progress(
        f"{len(train.rows)} training rows, {len(validation.rows)} validation rows, "
        f"{data_info['positives']} positives ({data_info['late_items_recalled']:.1%} of the late items recalled)"
    )
    scores = validation.rows.dense[:, CANDIDATE_FEATURES.index(RECALL_SCORE)].reshape(-1, validation.candidates)
    labels = validation.rows.labels.reshape(-1, validation.candidates)
    base_recall, base_ndcg = list_metrics(scores, labels, validation.late_counts)
    progress(f"LightGCN-A alone on the validation users: Recall@20 {base_recall:.4f}, NDCG@20 {base_ndcg:.4f}")
    rows = {ACTIVITY: BUCKETS, POPULARITY: BUCKETS, ITEM: window.items}
    params = initial_params(train, config, rows)
    best, history, best_epoch, seconds = fit(params, train, validation, config, progress)
    files.mkdir(out, exist_ok=True)
    train_deepfm.save_params(best, out / RUN_TENSORS)
    info = {
        "kind": "deepfm-gowalla",
        "lightgcn": early_run.info["config"],
        "window": asdict(window_config),
        "early_lightgcn_late_window": early_run.info["test"],
        "config": asdict(config),
        "data": data_info,
        "dense_transforms": [asdict(t) for t in best.dense_transforms],
        "validation_baseline": {"recall@20": base_recall, "ndcg@20": base_ndcg},
        "best_epoch": best_epoch,
        "train_seconds": seconds,
        "history": history,
    }
    files.write_text(out / RUN_JSON, json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return RankRun(best, info, out)


# --- the repository version ----------------------------------------------------------------------------------


def ranker_toml(params: DeepFMParams, config: RankConfig, storage: str, description: str) -> DeepFMToml:
    named = fields(config)
    return DeepFMToml(
        tables=tuple(
            TableSpec(name, TABLES_FILE, len(params.tables[name]), params.dim, storage, "reject") for name, _ in named
        ),
        fields=tuple(FieldSpec(name, side) for name, side in named),
        dense_graph=DenseGraphSpec("dense.onnx", "fp32"),
        ranking=RankingSpec((), ITEM if config.item_ids else None, CANDIDATE_FEATURES),
        description=description,
        item_features=ItemFeaturesSpec(FEATURES_FILE, (POPULARITY,)),
        cooccurrence=CooccurrenceSpec(COOCCURRENCE_FILE),
    )


def serving_transforms(
    params: DeepFMParams, recall_run: LightGCNRun, data: Interactions, table: cooccurrence.Cooccurrence,
    candidates: int, every: int = 4,
) -> tuple[DenseTransform, ...]:  # fmt: skip
    """The transforms refitted on the serving-time candidate features: the served recall model's top `candidates`
    for every `every`-th user with training items, their features from all training interactions (`table`). The
    ranker was trained on features of the early window, where histories are shorter and the co-occurrence table
    sparser (the sums come out about 45% larger at serving on Gowalla); standardising each feature on the data it
    is computed from, without labels, gives the model inputs distributed as in training."""
    users = np.flatnonzero(data.has_history())[::every]
    lists = recall(recall_run.users, recall_run.items, data, users, candidates)
    dense = candidate_features(lists, table, data, CANDIDATE_FEATURES).reshape(-1, len(CANDIDATE_FEATURES))
    refitted = fit_transforms(dense)
    assert [t.kind for t in refitted] == [t.kind for t in params.dense_transforms]
    return refitted


def export(
    run: RankRun, recall_run: LightGCNRun, data: Interactions, out: Path, storage: str, description: str
) -> tuple[DenseTransform, ...]:
    """The version of a ranker run: its tables in `storage`, the fp32 graph with the transforms refitted on the
    serving-time features of `recall_run` (`serving_transforms`), and the item feature and co-occurrence tables of
    `data`'s training interactions (all of them: the served features). Returns the served transforms."""
    config = RankConfig(**{**run.info["config"], "hidden": tuple(run.info["config"]["hidden"])})
    model = ranker_toml(run.params, config, storage, description)
    table = cooccurrence.build(data.train_indptr, data.train_indices, data.items, config.neighbours)
    served = replace(
        run.params, dense_transforms=serving_transforms(run.params, recall_run, data, table, config.candidates)
    )
    write_deepfm_version(out, model, served.tables, build_graph(served), popularity(data)[:, None], table)
    return served.dense_transforms


# --- the pipeline's quality ----------------------------------------------------------------------------------


def _served_rows(
    ranker: Version, lists: CandidateLists, features: np.ndarray, history_lengths: np.ndarray
) -> np.ndarray:
    """The served ranker's probabilities [U, N] of the candidates: the fields from the request (activity) and the
    item feature table, the candidate features in the model's order, through its ONNX graph."""
    model = ranker.model
    assert isinstance(model, DeepFMToml) and ranker.session is not None
    item_features = read_item_features(ranker.directory, model)
    assert item_features is not None and model.item_features is not None
    shape = lists.items.shape
    columns = []
    for f in model.fields:
        if f.name == model.ranking.item_id_field:
            ids = lists.items
        elif f.side == "item":
            ids = item_features[lists.items, model.item_features.fields.index(f.name)]
        else:
            assert f.name == ACTIVITY, f"the pipeline's quality knows user field {ACTIVITY!r} only, not {f.name!r}"
            ids = np.broadcast_to(bucket(history_lengths)[:, None], shape)
        columns.append(gather(ranker.tables[f.table], ids.ravel()))
    emb = np.ascontiguousarray(np.stack(columns, axis=1), dtype=np.float32)
    dense = features.reshape(-1, features.shape[2])
    return run_graph(ranker.session, model, emb, dense).reshape(shape)


def _user_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The mean over users (rows with both labels) of the AUC within a user's candidates."""
    from scipy.stats import rankdata

    positives = labels.sum(axis=1)
    keep = (positives > 0) & (positives < labels.shape[1])
    ranks = rankdata(scores[keep], axis=1)
    p, n = positives[keep], labels.shape[1] - positives[keep]
    return float((((ranks * labels[keep]).sum(axis=1) - p * (p + 1) / 2) / (p * n)).mean())


def pipeline_quality(
    recall_model: Version,
    ranker: Version,
    data: Interactions,
    candidates: tuple[int, ...],
    report: Callable[[str], None],
    k: int = K,
    auc_candidates: int = 100,
    chunk: int = 512,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Recall@k / NDCG@k of LightGCN alone and of recall N → rank → top k, for every N of `candidates`, by user id
    and by history (one row each); and the AUC rows within the first `auc_candidates` candidates."""
    model = recall_model.model
    ranker_model = ranker.model
    assert isinstance(model, LightGCNToml) and isinstance(ranker_model, DeepFMToml)
    assert ranker.cooccurrence is not None and auc_candidates in candidates
    tables = {name: values(table) for name, table in recall_model.tables.items()}
    items_table = tables[model.recall.item_table]
    if ranker.cooccurrence.items != len(items_table):
        raise ValueError(
            f"the ranker's co-occurrence table has {ranker.cooccurrence.items} rows, the recall model "
            f"{len(items_table)} items"
        )
    names = ranker_model.ranking.candidate_features
    degrees = np.log1p(data.item_degrees())
    users = np.flatnonzero(np.diff(data.test_indptr) > 0)
    quality, aucs = [], []
    for users_from in ("user table", "history"):
        if users_from == "history":
            queries_all = _history_users(tables[model.recall.history_table], data)
            among = users[data.has_history()[users]]
        else:
            queries_all, among = tables[model.recall.user_table], users
        sums = {n: np.zeros(2) for n in (0, *candidates)}  # 0: LightGCN alone
        collected: dict[str, list[np.ndarray]] = {"labels": [], "ranker": [], "score": [], "popularity": []}
        progress = Progress(
            "test users", len(among), lambda line, by=users_from: report(f"by {by}: {line}"), every=30.0
        )
        for start in range(0, len(among), chunk):
            batch = among[start : start + chunk]
            lists = recall(queries_all[batch], items_table, data, batch, max(candidates))
            features = candidate_features(lists, ranker.cooccurrence, data, names)
            relevant = _in_lists(batch, lists.items, data.test_indptr, data.test_indices, data.items)
            truth_counts = np.diff(data.test_indptr)[batch]
            history_lengths = np.diff(data.train_indptr)[batch]
            recall_order = np.broadcast_to(-np.arange(lists.items.shape[1], dtype=np.float64), lists.items.shape)
            sums[0] += np.array(list_metrics(recall_order, relevant, truth_counts, k)) * len(batch)
            for n in candidates:
                head = CandidateLists(batch, lists.items[:, :n], lists.scores[:, :n])
                p = _served_rows(ranker, head, features[:, :n], history_lengths)
                sums[n] += np.array(list_metrics(p, relevant[:, :n], truth_counts, k)) * len(batch)
                if n == auc_candidates:
                    collected["ranker"].append(p)
            collected["labels"].append(relevant[:, :auc_candidates])
            collected["score"].append(lists.scores[:, :auc_candidates])
            collected["popularity"].append(degrees[lists.items[:, :auc_candidates]])
            progress.advance(len(batch))
        for n, (recall_sum, ndcg_sum) in sums.items():
            quality.append(
                {
                    "users_from": users_from,
                    "pipeline": "LightGCN alone" if n == 0 else f"recall {n} → rank → top {k}",
                    "candidates": n or None,
                    f"recall@{k}": recall_sum / len(among),
                    f"ndcg@{k}": ndcg_sum / len(among),
                    "test_users": len(among),
                }
            )
        labels = np.concatenate(collected["labels"])
        for scorer, what in (("ranker", "the ranker"), ("score", "LightGCN's score"), ("popularity", "log popularity")):
            scores = np.concatenate(collected[scorer])
            aucs.append(
                {
                    "users_from": users_from,
                    "scorer": what,
                    "candidates": auc_candidates,
                    "auc": auc(labels.ravel(), scores.ravel()),
                    "user_auc": _user_auc(labels, scores),
                    "positives": int(labels.sum()),
                    "rows": int(labels.size),
                }
            )
    return quality, aucs
