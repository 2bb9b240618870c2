"""Random DeepFM weights for a fixture model: `deepfm.init_params` with the tables, fields and dense features of
its `model.toml` (test support)."""

from __future__ import annotations

import numpy as np

from .. import deepfm
from ..model_toml import DeepFMToml


def random_params(
    rng: np.random.Generator, model: DeepFMToml, *, factors: int, hidden: tuple[int, ...], **scales: float
) -> deepfm.DeepFMParams:
    """Weights for every table and field of `model`, `factors` wide, MLP `hidden`; `scales` are
    `deepfm.init_params`'s standard deviations."""
    return deepfm.init_params(
        rng,
        {t.name: t.rows for t in model.tables},
        [f.table for f in model.fields],
        factors=factors,
        num_dense=len(model.ranking.dense_features),
        hidden=hidden,
        **scales,
    )
