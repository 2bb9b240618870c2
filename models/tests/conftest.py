"""Shared helpers of the recserve_models tests: small random DeepFM models and their inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from recserve_models import deepfm
from recserve_models.onnx_export import DENSE, EMBEDDINGS

CRITEO_ROWS = {f"C{i}": rows for i, rows in enumerate([50, 300, 20, 1000, 77] * 5 + [64], start=1)}


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def criteo_params(rng: np.random.Generator, num_dense: int = 13) -> deepfm.DeepFMParams:
    """A Criteo-shaped model: 26 fields, k = 8, MLP 32-16."""
    return deepfm.init_params(rng, CRITEO_ROWS, list(CRITEO_ROWS), factors=8, num_dense=num_dense, hidden=[32, 16])


def random_inputs(rng: np.random.Generator, params: deepfm.DeepFMParams, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Gathered rows of valid ids, and raw dense features: zeros, negatives, counts with a heavy tail."""
    emb = np.stack([params.tables[t][rng.integers(0, len(params.tables[t]), batch)] for t in params.field_tables], 1)
    dense = np.floor(rng.lognormal(1.5, 1.5, (batch, params.num_dense)))
    dense[rng.random(dense.shape) < 0.25] = 0.0
    dense[rng.random(dense.shape) < 0.05] = -2.0
    return emb, dense.astype(np.float32)


def run_graph(model: onnx.ModelProto, emb: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """The graph's probabilities [batch] on onnxruntime's CPU provider."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {EMBEDDINGS: emb, DENSE: dense} if dense.shape[1] else {EMBEDDINGS: emb}
    return session.run(None, feeds)[0][:, 0]
