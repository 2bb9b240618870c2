"""The ranker's label window: each user's training interactions split into "early" and "late", as a production
ranker is trained on yesterday's recall stage and labelled by what the users did next.

Gowalla's split (the LightGCN paper's train.txt / test.txt) has no timestamps, so the window is drawn at random:
a user with at least `min_items` training items sends `round(late_share · n)` of them (at least one), chosen
uniformly with a seeded generator, to the late window; users with fewer items keep all of them early. A recall
model fitted on the early window only (`early_run`, the demo's LightGCN recipe) then recalls for every user, and
its candidates are labelled by the late window: the ranker learns from the recall stage's own candidates, with
labels the recall model never saw. The Gowalla test split is not used by any of it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import lightgcn
from .lightgcn import Interactions, LightGCNRun

WINDOW_RUN = "lightgcn-early-run"


@dataclass(frozen=True)
class WindowConfig:
    late_share: float = 0.2
    min_items: int = 5  # users with fewer training items keep them all in the early window
    seed: int = 20261205


def split(data: Interactions, config: WindowConfig) -> Interactions:
    """The label window of `data`'s training interactions: `train` holds the early window and `test` the late one
    (both sorted CSR over the same users and items; `data`'s own test lists are dropped)."""
    counts = np.diff(data.train_indptr)
    late_counts = np.where(
        counts >= config.min_items, np.maximum(1, np.rint(counts * config.late_share)).astype(np.int64), 0
    )
    users = data.train_users()
    keys = np.random.default_rng(config.seed).random(len(users))
    order = np.lexsort((keys, users))  # each user's interactions in a random order, users in id order
    position = np.empty(len(users), np.int64)
    position[order] = np.arange(len(users)) - data.train_indptr[users[order]]
    late = position < late_counts[users]
    early_indptr = np.concatenate([[0], np.cumsum(counts - late_counts)])
    late_indptr = np.concatenate([[0], np.cumsum(late_counts)])
    # `train_indices` is sorted within each user, and the masks keep that order.
    return Interactions(
        data.users, data.items, early_indptr, data.train_indices[~late], late_indptr, data.train_indices[late]
    )


def run_info(gowalla: Path, recipe: lightgcn.TrainConfig, window: WindowConfig) -> dict[str, Any]:
    """What identifies an early run: the data directory, the LightGCN recipe and the window."""
    return {"directory": str(gowalla.resolve()), "config": asdict(recipe), "window": asdict(window)}


def matches(directory: Path, gowalla: Path, recipe: lightgcn.TrainConfig, window: WindowConfig) -> bool:
    path = directory / lightgcn.RUN_JSON
    if not path.is_file():
        return False
    info = json.loads(path.read_text(encoding="utf-8"))
    wanted = json.loads(json.dumps(run_info(gowalla, recipe, window)))
    known = {"directory": info["data"].get("directory"), "config": info.get("config"), "window": info.get("window")}
    return known == wanted


def early_run(
    gowalla: Path, out: Path, recipe: lightgcn.TrainConfig, window: WindowConfig, evaluate_every: int = 0
) -> LightGCNRun:
    """Trains LightGCN with `recipe` on the early window of `gowalla`'s training interactions and writes the run
    directory `out` (its `test` metrics are on the late window)."""

    def progress(message: str) -> None:
        print(f"train-lightgcn-early: {message}", file=sys.stderr, flush=True)

    full = lightgcn.read_interactions(gowalla / "train.txt", gowalla / "test.txt")
    early = split(full, window)
    progress(
        f"label window: {early.train_pairs} early and {len(early.test_indices)} late interactions, "
        f"{int(early.test_users().sum())} users with late items"
    )
    info = run_info(gowalla, recipe, window)
    return lightgcn.fit_run(
        early, out, recipe, {"directory": info["directory"], "window": "early"}, progress, evaluate_every,
        {"window": info["window"]},
    )  # fmt: skip
