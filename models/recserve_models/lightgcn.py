"""LightGCN (He et al., SIGIR 2020): interaction data, propagation, BPR training, Recall@K / NDCG@K, and the
tables the server's `[recall]` section needs.

The model: layer-0 embeddings `E^(0)` (users and items, `dim` wide) are the only parameters. On the bipartite
training graph with symmetric normalisation, `e_u^(k+1) = Σ_{i ∈ N(u)} e_i^(k) / (sqrt(d_u)·sqrt(d_i))` and
`e_i^(k+1) = Σ_{u ∈ N(i)} e_u^(k) / (sqrt(d_i)·sqrt(d_u))`; the final embedding is the layer mean
`e = (1 / (K + 1)) · Σ_{k=0}^{K} e^(k)` and the score of item `i` for user `u` is `<e_u, e_i>`.

Training minimises the BPR loss `mean(softplus(<e_u, e_n> − <e_u, e_p>))` over (user, positive item, sampled
negative item) triples, plus `reg/2 · (|e_u^(0)|² + |e_p^(0)|² + |e_n^(0)|²)` averaged over the batch, as the
paper's code does, with Adam. Each epoch visits every training interaction once in a seeded random order; each
negative is drawn uniformly from the items the user has not interacted with in training. Because propagation is
linear, the gradient with respect to `E^(0)` is `(1 / (K + 1)) · Σ_k Â^k G` for the gradient `G` with respect
to the final embeddings (`Â` is symmetric), so a step costs `2K` sparse products with the normalised adjacency.

Evaluation (`evaluate`) ranks every item for every test user, with that user's training items excluded, and
averages Recall@K = |top-K ∩ test| / |test| and NDCG@K = DCG@K / IDCG@K (binary relevance, IDCG over
min(|test|, K) hits) over the users with at least one test item, as the paper's code does (`among` narrows them:
`check` evaluates users embedded from their history over the test users with at least one training item, since an
empty history cannot be embedded).

For users not in the table the server embeds a history `H` of item ids as `e_u = (1 / sqrt(|H|)) · Σ_{i ∈ H} h_i`
with `h_i = (Σ_{k=0}^{K-1} e_i^(k)) / ((K + 1)·sqrt(d_i))` (`h_i = 0` when `d_i = 0`): see `history_vectors`
and docs/model-repository.md. For a training user that is exactly `e_u − e_u^(0) / (K + 1)`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors.numpy import load_file, save_file

from . import files
from .optim import Adam, report_steps
from .progress import Progress

if TYPE_CHECKING:
    import scipy.sparse as sp  # imported where used: scipy is slow to import, and --help needs none of it

RUN_TENSORS = "lightgcn.safetensors"
FEW_STEPS = 1000  # fewer Adam steps in a run than this draws a warning (models/README.md)
RUN_JSON = "training.json"


class InteractionsError(ValueError):
    """An interaction file that breaks the `user item item ...` format; the message names file and line."""


@dataclass(frozen=True)
class Interactions:
    """Train and test interactions as CSR (`indptr` [users + 1], `indices` sorted item ids per user)."""

    users: int
    items: int
    train_indptr: np.ndarray
    train_indices: np.ndarray
    test_indptr: np.ndarray
    test_indices: np.ndarray

    @property
    def train_pairs(self) -> int:
        return len(self.train_indices)

    def train_matrix(self) -> sp.csr_matrix:
        import scipy.sparse as sp

        """The binary user × item training matrix."""
        data = np.ones(len(self.train_indices), dtype=np.float32)
        return sp.csr_matrix((data, self.train_indices, self.train_indptr), shape=(self.users, self.items))

    def train_users(self) -> np.ndarray:
        """The user of each training interaction, aligned with `train_indices`."""
        return np.repeat(np.arange(self.users, dtype=np.int64), np.diff(self.train_indptr))

    def item_degrees(self) -> np.ndarray:
        return np.bincount(self.train_indices, minlength=self.items)

    def has_history(self) -> np.ndarray:
        """Boolean [users]: the users with at least one training item, whose history can be embedded."""
        return np.diff(self.train_indptr) > 0

    def test_users(self) -> np.ndarray:
        """Boolean [users]: the users with at least one test item."""
        return np.diff(self.test_indptr) > 0


def _read_lists(path: Path) -> dict[int, np.ndarray]:
    lists: dict[int, np.ndarray] = {}
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InteractionsError(f"{path}: cannot read: {e}") from e
    for number, line in enumerate(lines, start=1):
        parts = line.split()
        if not parts:
            continue
        try:
            ids = np.array([int(p) for p in parts], dtype=np.int64)
        except ValueError as e:
            raise InteractionsError(f"{path}:{number}: expected 'user item item ...' as integers: {e}") from e
        if ids.min() < 0:
            raise InteractionsError(f"{path}:{number}: ids must be non-negative")
        user = int(ids[0])
        if user in lists:
            raise InteractionsError(
                f"{path}:{number}: user {user} has a second line (expected one line per user, 'user item item ...', "
                "the Gowalla split format: group a file of 'user item' pairs by user first)"
            )
        items = np.unique(ids[1:])
        if len(items) != len(ids) - 1:
            raise InteractionsError(f"{path}:{number}: user {user} lists an item twice")
        lists[user] = items
    if not lists:
        raise InteractionsError(f"{path}: holds no interactions")
    return lists


def _csr(lists: dict[int, np.ndarray], users: int) -> tuple[np.ndarray, np.ndarray]:
    counts = np.zeros(users, dtype=np.int64)
    for user, items in lists.items():
        counts[user] = len(items)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    indices = np.empty(int(indptr[-1]), dtype=np.int64)
    for user, items in lists.items():
        indices[indptr[user] : indptr[user + 1]] = items
    return indptr, indices


def read_interactions(train_path: Path, test_path: Path) -> Interactions:
    """Reads the LightGCN/NGCF split format: one line per user, `user_id item_id item_id ...`, 0-based ids.

    Users and items are numbered `0..max id`; a test pair that is also a training pair is an error (it would be
    excluded from the ranking and so could never be recalled).
    """
    train, test = _read_lists(train_path), _read_lists(test_path)
    users = 1 + max(max(train), max(test))
    items = 1 + max(int(v.max(initial=-1)) for v in (*train.values(), *test.values()))
    for user, items_test in test.items():
        overlap = np.intersect1d(items_test, train.get(user, np.empty(0, dtype=np.int64)))
        if len(overlap):
            raise InteractionsError(f"{test_path}: user {user} has item {overlap[0]} in both train and test")
    train_indptr, train_indices = _csr(train, users)
    test_indptr, test_indices = _csr(test, users)
    return Interactions(users, items, train_indptr, train_indices, test_indptr, test_indices)


def write_interactions(directory: Path, data: Interactions) -> None:
    """Writes `directory/train.txt` and `directory/test.txt` in the format `read_interactions` reads."""
    files.mkdir(directory, exist_ok=True)
    for name, indptr, indices in (
        ("train.txt", data.train_indptr, data.train_indices),
        ("test.txt", data.test_indptr, data.test_indices),
    ):
        lines = [" ".join(map(str, [u, *indices[indptr[u] : indptr[u + 1]]])) for u in range(data.users)]
        files.write_text(directory / name, "\n".join(lines) + "\n", encoding="ascii")


def synthetic_interactions(
    rng: np.random.Generator, users: int, items: int, per_user: int, *, clusters: int = 8, test_fraction: float = 0.2
) -> Interactions:
    """Small clustered interactions for tests: each user and item belongs to a cluster, and a user picks 90% of
    its items from its own cluster, so a model that learns anything beats chance by far."""
    user_cluster = rng.integers(0, clusters, users)
    item_cluster = rng.integers(0, clusters, items)
    by_cluster = [np.flatnonzero(item_cluster == c) for c in range(clusters)]
    train: dict[int, np.ndarray] = {}
    test: dict[int, np.ndarray] = {}
    for u in range(users):
        own = by_cluster[user_cluster[u]]
        picks = np.where(
            rng.random(per_user) < 0.9,
            own[rng.integers(0, max(len(own), 1), per_user)] if len(own) else rng.integers(0, items, per_user),
            rng.integers(0, items, per_user),
        )
        chosen = rng.permutation(np.unique(picks))
        cut = max(1, round(len(chosen) * (1 - test_fraction)))
        train[u] = np.sort(chosen[:cut])
        if cut < len(chosen):
            test[u] = np.sort(chosen[cut:])
    train_indptr, train_indices = _csr(train, users)
    test_indptr, test_indices = _csr(test, users)
    return Interactions(users, items, train_indptr, train_indices, test_indptr, test_indices)


@dataclass(frozen=True)
class Graph:
    """The normalised bipartite adjacency: `norm[u, i] = 1 / (sqrt(d_u)·sqrt(d_i))` for training pairs."""

    norm: sp.csr_matrix  # users × items, float32
    norm_t: sp.csr_matrix  # items × users
    item_degrees: np.ndarray

    @staticmethod
    def of(data: Interactions) -> Graph:
        import scipy.sparse as sp

        r = data.train_matrix()
        du = np.asarray(r.sum(axis=1)).ravel()
        di = np.asarray(r.sum(axis=0)).ravel()
        inv_u = np.where(du > 0, 1.0 / np.sqrt(np.maximum(du, 1)), 0.0).astype(np.float32)
        inv_i = np.where(di > 0, 1.0 / np.sqrt(np.maximum(di, 1)), 0.0).astype(np.float32)
        norm = sp.csr_matrix(sp.diags(inv_u) @ r @ sp.diags(inv_i), dtype=np.float32)
        norm.sort_indices()
        return Graph(norm=norm, norm_t=norm.T.tocsr(), item_degrees=di.astype(np.int64))


def propagate(graph: Graph, users0: np.ndarray, items0: np.ndarray, layers: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`[(E_u^(k), E_i^(k)) for k in 0..layers]`."""
    out = [(users0, items0)]
    for _ in range(layers):
        eu, ei = out[-1]
        out.append((np.asarray(graph.norm @ ei, dtype=np.float32), np.asarray(graph.norm_t @ eu, dtype=np.float32)))
    return out


def final_embeddings(
    graph: Graph, users0: np.ndarray, items0: np.ndarray, layers: int
) -> tuple[np.ndarray, np.ndarray]:
    """The layer-mean embeddings `(E_u, E_i)`, float32."""
    hops = propagate(graph, users0, items0, layers)
    users = sum(h[0].astype(np.float64) for h in hops) / (layers + 1)
    items = sum(h[1].astype(np.float64) for h in hops) / (layers + 1)
    return users.astype(np.float32), items.astype(np.float32)


def history_vectors(graph: Graph, items0: np.ndarray, users0: np.ndarray, layers: int) -> np.ndarray:
    """`h_i = (Σ_{k=0}^{K-1} e_i^(k)) / ((K + 1)·sqrt(d_i))`, zero for items without training interactions."""
    hops = propagate(graph, users0, items0, layers)
    partial = sum(h[1].astype(np.float64) for h in hops[:layers])
    degrees = graph.item_degrees.astype(np.float64)
    scale = np.where(degrees > 0, 1.0 / ((layers + 1) * np.sqrt(np.maximum(degrees, 1))), 0.0)
    return (partial * scale[:, None]).astype(np.float32)


def embed_history(history: np.ndarray, items: np.ndarray) -> np.ndarray:
    """The server's user vector for a history of item ids: `(1 / sqrt(|H|)) · Σ_{i ∈ H} h_i`."""
    if len(items) == 0:
        raise ValueError("a history needs at least one item")
    return (history[items].astype(np.float64).sum(axis=0) / np.sqrt(len(items))).astype(np.float32)


@dataclass(frozen=True)
class Metrics:
    recall: float
    ndcg: float
    users: int  # the test users counted: at least one test item (and selected by `among`)
    k: int


def evaluate(
    users: np.ndarray,
    items: np.ndarray,
    data: Interactions,
    k: int = 20,
    *,
    chunk: int = 1024,
    among: np.ndarray | None = None,
) -> Metrics:
    """Recall@k and NDCG@k over the test users (the users with at least one test item), or over those of them that
    the boolean mask `among` [users] selects; training items are excluded from each ranking."""
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    ideal = np.cumsum(discounts)
    test_counts = np.diff(data.test_indptr)
    selected = test_counts > 0
    if among is not None:
        selected &= among
    test_users = np.flatnonzero(selected)
    recall_sum = ndcg_sum = 0.0
    items_t = np.ascontiguousarray(items.T)
    for start in range(0, len(test_users), chunk):
        batch = test_users[start : start + chunk]
        scores = users[batch] @ items_t  # float32 [b, items]
        for row, u in enumerate(batch):
            scores[row, data.train_indices[data.train_indptr[u] : data.train_indptr[u + 1]]] = -np.inf
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
        top = np.take_along_axis(top, order, axis=1)
        for row, u in enumerate(batch):
            truth = data.test_indices[data.test_indptr[u] : data.test_indptr[u + 1]]
            hit = np.isin(top[row], truth)
            recall_sum += hit.sum() / len(truth)
            ndcg_sum += float((hit * discounts).sum()) / ideal[min(len(truth), k) - 1]
    n = len(test_users)
    if n == 0:
        raise ValueError("no test user to evaluate: every selected user has an empty test list")
    return Metrics(recall=recall_sum / n, ndcg=ndcg_sum / n, users=int(n), k=k)


@dataclass(frozen=True)
class TrainConfig:
    dim: int = 64
    layers: int = 3
    epochs: int = 20
    batch: int = 4096
    lr: float = 0.005
    reg: float = 1e-4
    init_std: float = 0.1
    seed: int = 20261130


def steps_per_epoch(data: Interactions, config: TrainConfig) -> int:
    """Adam steps in one epoch: one per batch of training interactions (the last batch may be short)."""
    return -(-data.train_pairs // config.batch)


@dataclass
class TrainResult:
    users0: np.ndarray
    items0: np.ndarray
    history: list[dict[str, float]]
    seconds: float


def _negatives(rng: np.random.Generator, users: np.ndarray, data: Interactions, keys: np.ndarray) -> np.ndarray:
    """Uniform items that the users have not interacted with in training (`keys` = sorted u·items + i)."""
    negatives = rng.integers(0, data.items, len(users))
    for _ in range(100):
        wanted = users * data.items + negatives
        clash = keys[np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)] == wanted
        if not clash.any():
            return negatives
        negatives[clash] = rng.integers(0, data.items, int(clash.sum()))
    raise RuntimeError("could not sample negatives: does some user interact with almost every item?")


def bpr_gradients(
    graph: Graph,
    users0: np.ndarray,
    items0: np.ndarray,
    u: np.ndarray,
    p: np.ndarray,
    n: np.ndarray,
    layers: int,
    reg: float,
) -> tuple[float, np.ndarray, np.ndarray]:
    """The batch loss (mean BPR + reg/2 · mean squared norm of the triples' layer-0 rows) and its gradients with
    respect to the layer-0 user and item embeddings."""
    eu, ei = final_embeddings(graph, users0, items0, layers)
    b = len(u)
    diff = ei[p] - ei[n]
    x = np.einsum("bd,bd->b", eu[u], diff).astype(np.float64)
    squares = (users0[u].astype(np.float64) ** 2).sum() + (items0[p].astype(np.float64) ** 2).sum()
    squares += (items0[n].astype(np.float64) ** 2).sum()
    loss = float(np.logaddexp(0.0, -x).mean() + reg / 2 * squares / b)
    dx = (-1.0 / (1.0 + np.exp(x)) / b).astype(np.float32)  # d mean(softplus(-x)) / dx
    grad_u = np.zeros_like(users0)
    grad_i = np.zeros_like(items0)
    np.add.at(grad_u, u, dx[:, None] * diff)
    np.add.at(grad_i, p, dx[:, None] * eu[u])
    np.add.at(grad_i, n, -dx[:, None] * eu[u])
    # Back through the layer mean: G^(0) = (1 / (K + 1)) Σ_k Â^k G, Â symmetric.
    hops = propagate(graph, grad_u, grad_i, layers)
    g_users = sum(h[0] for h in hops) / np.float32(layers + 1)
    g_items = sum(h[1] for h in hops) / np.float32(layers + 1)
    scale = np.float32(reg / b)
    np.add.at(g_users, u, scale * users0[u])
    np.add.at(g_items, p, scale * items0[p])
    np.add.at(g_items, n, scale * items0[n])
    return loss, g_users, g_items


def train(
    data: Interactions,
    config: TrainConfig,
    *,
    progress: Callable[[str], None] = lambda _: None,
    evaluate_every: int = 0,
) -> TrainResult:
    """Trains LightGCN on `data` with BPR; `evaluate_every` > 0 also reports test metrics every that many epochs."""
    rng = np.random.default_rng(config.seed)
    graph = Graph.of(data)
    users0 = rng.normal(0.0, config.init_std, (data.users, config.dim)).astype(np.float32)
    items0 = rng.normal(0.0, config.init_std, (data.items, config.dim)).astype(np.float32)
    adam = Adam(lr=config.lr)
    train_users, train_items = data.train_users(), data.train_indices
    keys = np.sort(train_users * data.items + train_items)
    history: list[dict[str, float]] = []
    started = time.perf_counter()
    steps = Progress("steps", steps_per_epoch(data, config) * config.epochs, progress, every=30.0)
    for epoch in range(1, config.epochs + 1):
        order = rng.permutation(data.train_pairs)
        loss_sum = 0.0
        for start in range(0, len(order), config.batch):
            pick = order[start : start + config.batch]
            u, p = train_users[pick], train_items[pick]
            n = _negatives(rng, u, data, keys)
            adam.next_step()
            loss, g_users, g_items = bpr_gradients(graph, users0, items0, u, p, n, config.layers, config.reg)
            loss_sum += loss * len(pick)
            adam.step("users", users0, g_users)
            adam.step("items", items0, g_items)
            steps.advance(note=f"epoch {epoch}/{config.epochs}")
        record = {"epoch": epoch, "loss": loss_sum / data.train_pairs, "seconds": time.perf_counter() - started}
        if evaluate_every and (epoch % evaluate_every == 0 or epoch == config.epochs):
            m = evaluate(*final_embeddings(graph, users0, items0, config.layers), data)
            record |= {"recall@20": m.recall, "ndcg@20": m.ndcg}
        history.append(record)
        progress(
            f"epoch {epoch}/{config.epochs}: loss {record['loss']:.4f}"
            + (
                f", Recall@20 {record['recall@20']:.4f}, NDCG@20 {record['ndcg@20']:.4f}"
                if "recall@20" in record
                else ""
            )
            + f" ({steps.line()})"
        )
    return TrainResult(users0=users0, items0=items0, history=history, seconds=time.perf_counter() - started)


@dataclass(frozen=True)
class LightGCNRun:
    """A finished training run: the tables the repository needs and what the run measured."""

    users: np.ndarray  # final (layer-mean) user embeddings
    items: np.ndarray  # final item embeddings
    history_vectors: np.ndarray  # h_i
    info: dict
    # Training interactions per item (the degree d_i), int64 [items]: the popularity order `export` writes. None
    # for runs written before it was recorded.
    item_popularity: np.ndarray | None = None

    @staticmethod
    def load(directory: Path) -> LightGCNRun:
        tensors = load_file(directory / RUN_TENSORS)
        info = json.loads((directory / RUN_JSON).read_text(encoding="utf-8"))
        if info.get("kind") != "lightgcn":
            raise ValueError(f"{directory / RUN_JSON}: not a lightgcn training run")
        return LightGCNRun(tensors["user"], tensors["item"], tensors["history"], info, tensors.get("item.popularity"))


def run_training(data_dir: Path, out: Path, config: TrainConfig, evaluate_every: int = 0) -> LightGCNRun:
    """Reads `data_dir/train.txt` and `test.txt`, trains, evaluates, and writes the run directory `out`."""

    def progress(message: str) -> None:
        print(f"train-lightgcn: {message}", file=sys.stderr, flush=True)

    data = read_interactions(data_dir / "train.txt", data_dir / "test.txt")
    return fit_run(data, out, config, {"directory": str(data_dir.resolve())}, progress, evaluate_every)


def fit_run(
    data: Interactions,
    out: Path,
    config: TrainConfig,
    data_info: dict[str, Any],
    progress: Callable[[str], None],
    evaluate_every: int = 0,
    extra_info: dict[str, Any] | None = None,
) -> LightGCNRun:
    """Trains on `data`, evaluates on its test lists, and writes the run directory `out`; `data_info` (where the
    interactions came from) opens the run's `data` record and `extra_info` joins its top level."""
    progress(f"{data.users} users, {data.items} items, {data.train_pairs} training interactions")
    report_steps(
        progress, config.batch, steps_per_epoch(data, config), config.epochs, fewest=FEW_STEPS, model="LightGCN",
        guide="models/README.md, 'Choosing the LightGCN settings'",
    )  # fmt: skip
    result = train(data, config, progress=progress, evaluate_every=evaluate_every)
    graph = Graph.of(data)
    users, items = final_embeddings(graph, result.users0, result.items0, config.layers)
    history = history_vectors(graph, result.items0, result.users0, config.layers)
    metrics = evaluate(users, items, data)
    progress(f"test Recall@20 {metrics.recall:.4f}, NDCG@20 {metrics.ndcg:.4f} ({metrics.users} users)")
    files.mkdir(out, exist_ok=True)
    popularity = data.item_degrees().astype(np.int64)
    tensors = {"user.layer0": result.users0, "item.layer0": result.items0, "user": users, "item": items}
    save_file(tensors | {"history": history, "item.popularity": popularity}, str(out / RUN_TENSORS))
    files.finish(out / RUN_TENSORS)
    info = {
        "kind": "lightgcn",
        "data": data_info
        | {
            "users": data.users,
            "items": data.items,
            "train_interactions": data.train_pairs,
            "test_interactions": len(data.test_indices),
        },
        "config": asdict(config),
        **(extra_info or {}),
        "epochs": config.epochs,
        "train_seconds": result.seconds,
        "history": result.history,
        "test": asdict(metrics),
    }
    files.write_text(out / RUN_JSON, json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return LightGCNRun(users, items, history, info, popularity)
