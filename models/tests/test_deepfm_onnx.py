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


def _with_transforms(params: deepfm.DeepFMParams, transforms: tuple[deepfm.DenseTransform, ...]) -> deepfm.DeepFMParams:
    return deepfm.DeepFMParams(
        params.tables, params.field_tables, params.bias, params.dense_weights, params.layers, transforms
    )


@pytest.mark.parametrize("kinds", [("linear", "log1p", "log1p"), ("linear", "linear", "linear"), ("log1p",) * 3])
def test_dense_transforms_in_the_graph_equal_the_reference(rng: np.random.Generator, kinds: tuple[str, ...]) -> None:
    """Signed scores (linear, standardised) beside counts (log1p, standardised): the fp32 graph against the float64
    reference within 1e-5 in probability, and the float32 training forward against it too."""
    from recserve_models import train_deepfm

    base = deepfm.init_params(rng, {"a": 16, "b": 16}, ["a", "b"], factors=4, num_dense=3, hidden=[8])
    transforms = tuple(
        deepfm.DenseTransform(kind, centre, scale)
        for kind, centre, scale in zip(kinds, (1.25, 2.5, -0.5), (2.0, 0.75, 1.5), strict=True)
    )
    params = _with_transforms(base, transforms)
    ids = np.stack([rng.integers(0, 16, 256), rng.integers(0, 16, 256)], axis=1)
    emb = np.stack([params.tables["a"][ids[:, 0]], params.tables["b"][ids[:, 1]]], axis=1)
    dense = np.stack(
        [rng.normal(0.0, 5.0, 256), rng.integers(0, 500, 256), np.abs(rng.normal(0.0, 3.0, 256))], axis=1
    ).astype(np.float32)
    dense[:3] = [[-30.0, 0.0, 0.0], [30.0, 1e6, 1e3], [0.0, -1.0, -2.0]]
    expected = deepfm.forward(params, emb, dense)
    assert np.abs(run_graph(build_graph(params), emb, dense) - expected).max() <= 1e-5
    logits = train_deepfm.forward32(params, ids, dense).logit.astype(np.float64)
    assert np.abs(np.exp(-np.logaddexp(0.0, -logits)) - expected).max() <= 1e-5
    # A linear feature reaches the model signed: its negative values are not clipped to 0 as log1p's are.
    clipped = dense.copy()
    clipped[:, 0] = np.maximum(clipped[:, 0], 0.0)
    assert (deepfm.forward(params, emb, clipped) != expected).any() == (kinds[0] == "linear")


def test_without_transforms_the_graph_is_the_log1p_graph(rng: np.random.Generator) -> None:
    """No transforms: every feature read as log(1 + max(x, 0)), and the graph built exactly as before (the
    Criteo demo's graphs stay byte-identical); transforms of (log1p, 0, 1) compute the same numbers."""
    params = criteo_params(rng)
    plain = build_graph(params)
    assert not {"dense.x", "dense.chosen", "dense.centred"} & {n.name for n in plain.graph.node}
    identity = _with_transforms(params, (deepfm.DenseTransform(),) * 13)
    emb, dense = random_inputs(rng, params, 64)
    assert np.array_equal(deepfm.forward(identity, emb, dense), deepfm.forward(params, emb, dense))
    with pytest.raises(ValueError, match="2 dense transforms for 13 dense features"):
        _with_transforms(params, (deepfm.DenseTransform(),) * 2)
    with pytest.raises(ValueError, match="kind 'sqrt' is not one of log1p, linear"):
        deepfm.DenseTransform("sqrt")
    with pytest.raises(ValueError, match="scale > 0"):
        deepfm.DenseTransform("linear", 0.0, 0.0)
