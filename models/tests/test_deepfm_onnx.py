"""The numpy reference forward pass, and the exported fp32 graph against it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import criteo_params, random_inputs, run_graph
from onnx import TensorProto

from recserve_models import deepfm
from recserve_models.onnx_export import OPSET, build_graph


def test_fp32_graph_equals_reference_forward(rng: np.random.Generator) -> None:
    params = criteo_params(rng)
    emb, dense = random_inputs(rng, params, 512)
    dense[:4] = [[1e9] * 13, [-1e9] * 13, [0.0] * 13, [1e-3] * 13]
    expected = deepfm.forward(params, emb, dense)
    assert np.abs(run_graph(build_graph(params), emb, dense) - expected).max() <= 1e-5
    assert expected.std() > 0.05, "the random model's probabilities should be spread out"


def test_graph_without_dense_features_has_no_dense_input(rng: np.random.Generator) -> None:
    params = criteo_params(rng, num_dense=0)
    model = build_graph(params)
    assert [i.name for i in model.graph.input] == ["embeddings"]
    emb, dense = random_inputs(rng, params, 64)
    assert np.abs(run_graph(model, emb, dense) - deepfm.forward(params, emb, dense)).max() <= 1e-5


def test_graph_interface_is_the_documented_one(rng: np.random.Generator) -> None:
    model = build_graph(criteo_params(rng))

    def signature(value_info):
        tensor = value_info.type.tensor_type
        dims = [d.dim_param or d.dim_value for d in tensor.shape.dim]
        return value_info.name, tensor.elem_type, dims

    assert [signature(i) for i in model.graph.input] == [
        ("embeddings", TensorProto.FLOAT, ["batch", 26, 9]),
        ("dense", TensorProto.FLOAT, ["batch", 13]),
    ]
    assert [signature(o) for o in model.graph.output] == [("probability", TensorProto.FLOAT, ["batch", 1])]
    assert [(o.domain, o.version) for o in model.opset_import] == [("", OPSET)]
    assert [n.op_type for n in model.graph.node][:3] == ["Max", "Add", "Log"]


def test_forward_is_the_documented_sum_of_terms(rng: np.random.Generator) -> None:
    """Against an explicit pairwise FM sum and a hand-written MLP, one candidate at a time."""
    params = deepfm.init_params(rng, {"a": 5, "b": 7, "c": 3}, ["a", "b", "c", "a"], factors=3, num_dense=2, hidden=[4])
    emb = np.stack([params.tables[t][[1, 2]] for t in params.field_tables], 1)
    dense = np.array([[3.0, -1.0], [0.0, 10.0]], dtype=np.float32)
    for b in range(2):
        v, w = emb[b, :, :3].astype(np.float64), emb[b, :, 3].astype(np.float64)
        x = np.log(1.0 + np.maximum(dense[b].astype(np.float64), 0.0))
        pairs = sum(v[i] @ v[j] for i in range(4) for j in range(i + 1, 4))
        hidden = np.maximum(np.concatenate([v.ravel(), x]) @ params.layers[0].weight + params.layers[0].bias, 0)
        deep = hidden @ params.layers[1].weight[:, 0] + params.layers[1].bias[0]
        logit = params.bias + w.sum() + x @ params.dense_weights + pairs + deep
        assert deepfm.forward(params, emb[b : b + 1], dense[b : b + 1])[0] == pytest.approx(1 / (1 + np.exp(-logit)))


def test_params_are_validated(rng: np.random.Generator) -> None:
    params = criteo_params(rng)
    with pytest.raises(ValueError, match=r"layers\[0\]\.weight takes 220 inputs, expected 221"):
        deepfm.DeepFMParams(
            params.tables,
            params.field_tables,
            params.bias,
            params.dense_weights,
            (deepfm.Layer(params.layers[0].weight[1:], params.layers[0].bias), *params.layers[1:]),
        )
    with pytest.raises(ValueError, match="field reads table 'nope'"):
        deepfm.DeepFMParams(params.tables, ("nope",), params.bias, params.dense_weights, params.layers)
    emb, dense = random_inputs(rng, params, 2)
    with pytest.raises(ValueError, match=r"embeddings must be float32 \[batch, 26, 9\]"):
        deepfm.forward(params, emb[:, :25], dense)
