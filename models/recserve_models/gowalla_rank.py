"""The demo's ranking model on Gowalla, for its recall → rank pipeline: a DeepFM trained on the interactions the
demo LightGCN was trained on, its item feature table, and the pipeline's offline quality.

**Fields** (all from the training interactions; `model.toml` order, which is the graph's):

| field | side | table rows | value |
| --- | --- | --- | --- |
| `user` | user | users + 1 | the user id; row `users` (`UNKNOWN`, the table's `default_row`) is the user the table does not hold, which a recommend request by `history` sends (any id outside the table, such as -1, reads it) |
| `activity` | user | `BUCKETS` | `bucket(n)` of the user's training interactions `n` (for a `history` request: of its length) |
| `item` | item | items | the item id: the `item_id_field`, so a pipeline feeds it the recalled id |
| `popularity` | item | `BUCKETS` | `bucket(d)` of the item's training interactions `d`: the item feature table's one column |

with `bucket(n) = min(floor(log2(1 + n)), BUCKETS − 1)`. No dense features.

**LightGCN-derived start**: the `user` and `item` rows start as the LightGCN run's final embeddings (k = its
dim) times `sqrt(score_scale)`, so the FM term `<v_user, v_item>` starts as LightGCN's score times `score_scale`
(unscaled, the best candidates' probabilities would round to 1.0 and tie), and with the other factors near 0,
zero first-order weights and a zero last MLP layer the ranker starts ranking as LightGCN does; the `UNKNOWN` row
starts as the mean user. **Training** (`train_deepfm.train`: binary cross-entropy, Adam): every training
interaction is a positive, each with `RankConfig.negatives` items drawn uniformly among those the user has not
interacted with; in a share `unknown_share` of the rows the user id is replaced by `UNKNOWN`, which trains the row
that history requests read. What it can add to LightGCN is what BCE against uniform negatives learns: per-item
and per-bucket first-order weights (popularity), the activity × popularity interactions, and a fine-tuning of the
factors.

**Pipeline quality** (`pipeline_quality`): for every test user, by `user_id` (the LightGCN user table) and by
`history` (the user's training items embedded with the history table, the ranker's user `UNKNOWN`), the top `N`
items of the served LightGCN with the user's training items excluded (what a recommend request with `exclude`
recalls), ranked by the served ranker through its own ONNX graph on the rows its tables give, best 20: Recall@20
and NDCG@20 as `lightgcn.evaluate` computes them, beside LightGCN alone (its first 20 of the same list).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import files, lightgcn, train_deepfm
from .check import Version, _history_users
from .deepfm import DeepFMParams, Layer
from .lightgcn import Interactions, LightGCNRun
from .model_toml import DeepFMToml, DenseGraphSpec, FieldSpec, ItemFeaturesSpec, RankingSpec, TableSpec
from .onnx_export import EMBEDDINGS, PROBABILITY, build_graph
from .progress import Progress
from .repository import gather, values, write_deepfm_version

BUCKETS = 16
TABLES_FILE = "tables.safetensors"
FEATURES_FILE = "item_features.safetensors"
USER, ACTIVITY, ITEM, POPULARITY = "user", "activity", "item", "popularity"
FIELDS = ((USER, "user"), (ACTIVITY, "user"), (ITEM, "item"), (POPULARITY, "item"))
RUN_TENSORS, RUN_JSON = "deepfm.safetensors", "training.json"


@dataclass(frozen=True)
class RankConfig:
    epochs: int = 1
    batch: int = 4096
    lr: float = 1e-3
    hidden: tuple[int, ...] = (64,)
    negatives: int = 1
    unknown_share: float = 0.1
    factor_std: float = 0.01  # the activity and popularity factors' start
    # The FM term starts as this multiple of LightGCN's score: its best items score 15 to 25, and a logit above about
    # 17 gives a float32 probability of exactly 1.0, so unscaled the best candidates would all tie (and keep the
    # recall order); a quarter keeps them below 7.
    score_scale: float = 0.25
    seed: int = 20261130


def bucket(counts: np.ndarray) -> np.ndarray:
    """`min(floor(log2(1 + n)), BUCKETS − 1)`, int64."""
    return np.minimum(np.floor(np.log2(1.0 + np.asarray(counts, dtype=np.float64))), BUCKETS - 1).astype(np.int64)


def activity(data: Interactions) -> np.ndarray:
    """Each user's activity bucket, int64 [users]."""
    return bucket(np.diff(data.train_indptr))


def popularity(data: Interactions) -> np.ndarray:
    """Each item's popularity bucket, int64 [items]: the item feature table's column."""
    return bucket(data.item_degrees())


def user_fields(data: Interactions, user: int | None, history_length: int | None = None) -> dict[str, int]:
    """The `user.fields` of a recommend request: by `user_id` (`user`), or by a history of `history_length` items
    (`user` None: -1, outside the table, reads the `UNKNOWN` row)."""
    if user is None:
        return {USER: -1, ACTIVITY: int(bucket(np.array([history_length]))[0])}
    return {USER: int(user), ACTIVITY: int(activity(data)[user])}


# --- training ------------------------------------------------------------------------------------------------


def training_rows(data: Interactions, config: RankConfig) -> train_deepfm.Dataset:
    """Positives (every training interaction) and uniform negatives, in field order; some users replaced by
    `UNKNOWN`."""
    rng = np.random.default_rng([config.seed, 2])
    users, items = data.train_users(), data.train_indices
    keys = np.sort(users * data.items + items)
    all_users = np.concatenate([users] * (1 + config.negatives))
    negatives = [lightgcn._negatives(rng, users, data, keys) for _ in range(config.negatives)]
    all_items = np.concatenate([items, *negatives])
    labels = np.concatenate([np.ones(len(users), np.int8), np.zeros(len(users) * config.negatives, np.int8)])
    user_ids = np.where(rng.random(len(all_users)) < config.unknown_share, data.users, all_users)
    ids = np.stack(
        [user_ids, activity(data)[all_users], all_items, popularity(data)[all_items]], axis=1
    ).astype(np.int64)
    return train_deepfm.Dataset(ids, np.zeros((len(ids), 0), np.float32), labels)


def initial_params(run: LightGCNRun, config: RankConfig) -> DeepFMParams:
    rng = np.random.default_rng([config.seed, 3])
    k = run.users.shape[1]
    root = np.float32(np.sqrt(config.score_scale))
    user = np.zeros((len(run.users) + 1, k + 1), np.float32)
    user[:-1, :k] = run.users * root
    user[-1, :k] = run.users.mean(axis=0) * root
    item = np.zeros((len(run.items), k + 1), np.float32)
    item[:, :k] = run.items * root
    small = {name: np.zeros((BUCKETS, k + 1), np.float32) for name in (ACTIVITY, POPULARITY)}
    for table in small.values():
        table[:, :k] = rng.normal(0.0, config.factor_std, (BUCKETS, k))
    widths = [len(FIELDS) * k, *config.hidden, 1]
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(widths, widths[1:], strict=False)):
        last = i == len(widths) - 2
        # The last layer starts at zero: the deep part adds nothing to LightGCN's ranking until it has learnt.
        weight = np.zeros((fan_in, fan_out)) if last else rng.normal(0, np.sqrt(2 / fan_in), (fan_in, fan_out))
        layers.append(Layer(weight.astype(np.float32), np.zeros(fan_out, np.float32)))
    return DeepFMParams(
        tables={USER: user, ACTIVITY: small[ACTIVITY], ITEM: item, POPULARITY: small[POPULARITY]},
        field_tables=tuple(name for name, _ in FIELDS),
        bias=np.float32(0.0),
        dense_weights=np.zeros(0, np.float32),
        layers=tuple(layers),
    )


@dataclass(frozen=True)
class RankRun:
    params: DeepFMParams
    info: dict[str, Any]
    directory: Path

    @staticmethod
    def load(directory: Path) -> RankRun:
        info = json.loads((directory / RUN_JSON).read_text(encoding="utf-8"))
        return RankRun(train_deepfm.load_params(directory / RUN_TENSORS), info, directory)


def run_training(
    run: LightGCNRun, data: Interactions, out: Path, config: RankConfig, progress: Callable[[str], None]
) -> RankRun:
    """Trains the ranker from `run` on `data` and writes its run directory `out` (parameters, training.json)."""
    rows = training_rows(data, config)
    progress(f"{len(rows)} training rows ({data.train_pairs} positives), {config.epochs} epochs of batch {config.batch}")
    params = initial_params(run, config)
    trainer = train_deepfm.TrainConfig(
        factors=params.factors, hidden=config.hidden, epochs=config.epochs, batch=config.batch, lr=config.lr,
        seed=config.seed,
    )  # fmt: skip
    params, history, seconds = train_deepfm.train(params, rows, trainer, progress=progress)
    files.mkdir(out, exist_ok=True)
    train_deepfm.save_params(params, out / RUN_TENSORS)
    info = {
        "kind": "deepfm-gowalla",
        "data": {"users": data.users, "items": data.items, "train_interactions": data.train_pairs},
        "lightgcn": run.info["config"],
        "config": asdict(config),
        "training_rows": len(rows),
        "train_seconds": seconds,
        "history": history,
    }
    files.write_text(out / RUN_JSON, json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return RankRun(params, info, out)


# --- the repository version ----------------------------------------------------------------------------------


def ranker_toml(params: DeepFMParams, storage: str, description: str) -> DeepFMToml:
    rows = {name: len(table) for name, table in params.tables.items()}
    tables = tuple(
        TableSpec(USER, TABLES_FILE, rows[USER], params.dim, storage, "default", rows[USER] - 1)
        if name == USER
        else TableSpec(name, TABLES_FILE, rows[name], params.dim, storage, "reject")
        for name, _ in FIELDS
    )
    return DeepFMToml(
        tables=tables,
        fields=tuple(FieldSpec(name, side) for name, side in FIELDS),
        dense_graph=DenseGraphSpec("dense.onnx", "fp32"),
        ranking=RankingSpec((), ITEM),
        description=description,
        item_features=ItemFeaturesSpec(FEATURES_FILE, (POPULARITY,)),
    )


def export(run: RankRun, data: Interactions, out: Path, storage: str, description: str) -> None:
    """The version of a ranker run: its tables in `storage`, the fp32 graph, the item feature table."""
    model = ranker_toml(run.params, storage, description)
    write_deepfm_version(out, model, run.params.tables, build_graph(run.params), popularity(data)[:, None])


# --- the pipeline's quality ----------------------------------------------------------------------------------


def _top(queries: np.ndarray, items_t: np.ndarray, data: Interactions, users: np.ndarray, n: int) -> np.ndarray:
    """Each user's `n` best items by `queries[row] · items`, training items excluded, best first (ties: lower id)."""
    scores = queries @ items_t
    for row, u in enumerate(users):
        scores[row, data.train_indices[data.train_indptr[u] : data.train_indptr[u + 1]]] = -np.inf
    top = np.argpartition(-scores, n - 1, axis=1)[:, :n]
    picked = np.take_along_axis(scores, top, axis=1)
    order = np.lexsort((top, -picked), axis=1)
    return np.take_along_axis(top, order, axis=1)


def _score(ranker: Version, ids: np.ndarray) -> np.ndarray:
    """The served ranker's probabilities of rows `ids` [B, fields]: its tables' rows, through its ONNX graph."""
    model = ranker.model
    assert isinstance(model, DeepFMToml) and ranker.session is not None
    emb = np.stack([gather(ranker.tables[f.table], ids[:, i]) for i, f in enumerate(model.fields)], axis=1)
    return ranker.session.run([PROBABILITY], {EMBEDDINGS: emb})[0].reshape(-1)


def pipeline_quality(
    recall: Version,
    ranker: Version,
    data: Interactions,
    candidates: tuple[int, ...],
    report: Callable[[str], None],
    k: int = 20,
    chunk: int = 256,
) -> list[dict[str, Any]]:
    """Recall@k / NDCG@k of LightGCN alone and of recall N → rank → top k, for every N of `candidates`, by user id
    and by history: one row each."""
    model = recall.model
    tables = {name: values(table) for name, table in recall.tables.items()}
    items_t = np.ascontiguousarray(tables[model.recall.item_table].T)
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    ideal = np.cumsum(discounts)
    users = np.flatnonzero(np.diff(data.test_indptr) > 0)
    acts, pops = activity(data), popularity(data)
    rows = []
    for users_from in ("user table", "history"):
        if users_from == "history":
            queries_all = _history_users(tables[model.recall.history_table], data)
            among = users[data.has_history()[users]]
        else:
            queries_all, among = tables[model.recall.user_table], users
        sums = {n: np.zeros(2) for n in (0, *candidates)}  # 0: LightGCN alone
        progress = Progress("test users", len(among), lambda line: report(f"by {users_from}: {line}"), every=30.0)
        for start in range(0, len(among), chunk):
            batch = among[start : start + chunk]
            top = _top(queries_all[batch], items_t, data, batch, max(candidates))
            lists = {0: top[:, :k]}
            for n in candidates:
                cand = top[:, :n]
                by_user = users_from == "user table"
                user_ids = batch if by_user else np.full(len(batch), -1)
                user_acts = acts[batch] if by_user else bucket(np.diff(data.train_indptr)[batch])
                fields = np.stack(
                    [
                        np.broadcast_to(user_ids[:, None], cand.shape),
                        np.broadcast_to(user_acts[:, None], cand.shape),
                        cand,
                        pops[cand],
                    ],
                    axis=2,
                ).reshape(-1, len(FIELDS))
                p = _score(ranker, fields).reshape(cand.shape)
                order = np.argsort(-p, axis=1, kind="stable")[:, :k]  # equal scores keep the recall order
                lists[n] = np.take_along_axis(cand, order, axis=1)
            for row, u in enumerate(batch):
                truth = data.test_indices[data.test_indptr[u] : data.test_indptr[u + 1]]
                for n, top_k in lists.items():
                    hit = np.isin(top_k[row], truth)
                    ndcg = float((hit * discounts[: len(hit)]).sum()) / ideal[min(len(truth), k) - 1]
                    sums[n] += (hit.sum() / len(truth), ndcg)
            progress.advance(len(batch))
        for n, (recall_sum, ndcg_sum) in sums.items():
            rows.append(
                {
                    "users_from": users_from,
                    "pipeline": "LightGCN alone" if n == 0 else f"recall {n} → rank → top {k}",
                    "candidates": n or None,
                    f"recall@{k}": recall_sum / len(among),
                    f"ndcg@{k}": ndcg_sum / len(among),
                    "test_users": len(among),
                }
            )
    return rows

