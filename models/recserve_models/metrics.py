"""Quality metrics of click models: ROC AUC and log loss, in float64 and exact (ties count one half)."""

from __future__ import annotations

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve: the probability that a random positive scores above a random negative, ties
    counting one half (the Mann-Whitney statistic over average ranks)."""
    y = np.asarray(labels).astype(bool)
    positives, negatives = int(y.sum()), int((~y).sum())
    if positives == 0 or negatives == 0:
        raise ValueError("AUC needs at least one positive and one negative label")
    from scipy.stats import rankdata  # here: importing scipy.stats takes most of a second

    ranks = rankdata(np.asarray(scores, dtype=np.float64))
    return float((ranks[y].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def log_loss(labels: np.ndarray, probabilities: np.ndarray, eps: float = 1e-7) -> float:
    """Mean negative log-likelihood of the labels, probabilities clipped to [eps, 1 - eps]."""
    y = np.asarray(labels, dtype=np.float64)
    p = np.clip(np.asarray(probabilities, dtype=np.float64), eps, 1.0 - eps)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))
