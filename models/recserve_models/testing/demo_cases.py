"""Held-out rank requests with the toolchain's offline scores for the committed demo models (the `demo-cases`
command; test support: `tests/demo_models.rs` sends each request to a server on models/demo and compares).

`demo_cases(repository, sizes)` regenerates the first held-out rows of the demo's Criteo test file from the
parameters in `quality.json`, builds one rank request per size (`demo.heldout_requests`: the user side and dense
features of one row, the item side of the next `size` rows) for `deepfm-fp32` and `deepfm`, and scores them as the
server does: the reference gather, then onnxruntime (CPU provider, ORT_ENABLE_ALL) on the version's graph.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnxruntime as ort

from .. import criteo, model_toml
from ..check import VOCABULARY
from ..demo import heldout_requests, heldout_rows
from ..rank_request import rank_inputs
from ..repository import MODEL_TOML, load_tables

SIZES = (1, 2, 10, 50, 100, 250)  # candidates per request


def demo_cases(repository: Path, sizes: tuple[int, ...]) -> dict[str, Any]:
    """For each committed DeepFM model: held-out rank requests and the toolchain's offline scores on the same
    repository (reference gather, then onnxruntime on the version's graph)."""
    quality = json.loads((repository / "quality.json").read_text(encoding="utf-8"))
    raw = heldout_rows(quality, sum(sizes) + 1)
    cases = []
    for name in ("deepfm-fp32", "deepfm"):
        directory = repository / name / "1"
        model = model_toml.read_deepfm(directory / MODEL_TOML)
        tables = load_tables(directory, model)
        vocabulary = criteo.Vocabulary.from_json((directory / VOCABULARY).read_text(encoding="utf-8"))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(
            str(directory / model.dense_graph.file), options, providers=["CPUExecutionProvider"]
        )
        for what, request in heldout_requests(model, vocabulary.ids(raw), raw.dense, sizes):
            emb, dense = rank_inputs(model, tables, request)
            feeds = {model.dense_graph.embeddings_input: emb, model.dense_graph.dense_input: dense}
            scores = session.run([model.dense_graph.output], feeds)[0].reshape(len(emb), -1)[:, 0]
            cases.append(
                {
                    "model": name,
                    "version": 1,
                    "what": what,
                    "request": request,
                    "expected_scores": [float(s) for s in scores],
                    "tolerance": 1e-5,
                }
            )
    return {"format_version": 1, "repository": str(repository), "onnxruntime": ort.__version__, "cases": cases}
