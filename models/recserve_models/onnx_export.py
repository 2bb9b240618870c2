"""The DeepFM dense network as an ONNX graph, in the form docs/model-repository.md requires.

Inputs `embeddings` float32 [batch, F, D] and `dense` float32 [batch, N] (absent when N = 0), output `probability`
float32 [batch, 1]; `batch` is symbolic, F, D and N are fixed. The graph computes `deepfm.forward`, the dense
features' transforms included (the server feeds them raw). Its first layer is written as two products,
`flatten(factors) @ W_v + x @ W_x + b`, which is the concatenated-input layer of `deepfm` split by rows: the
quantizer then gives the small FM factors and the much larger log-dense values their own activation scales instead
of one shared scale. All MLP layers are Gemm nodes named `mlp.*`; `quantize.quantize_dense_graph` quantizes those
and leaves the FM and first-order terms in float32.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import files
from .deepfm import LOG1P, DeepFMParams

if TYPE_CHECKING:  # imported where used: onnx is slow to import, and modules reading the names below need none
    import onnx

OPSET = 17
# IR version 8 is what opset 17 was released with; older runtimes than the one we pin can still load it.
IR_VERSION = 8
PRODUCER = "recserve_models"

EMBEDDINGS = "embeddings"
DENSE = "dense"
PROBABILITY = "probability"
BATCH = "batch"


class _GraphBuilder:
    """Collects nodes and initializers; each node is named after its output."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def node(self, op: str, inputs: list[str], output: str, **attributes: object) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, [output], name=output, **attributes))
        return output


def _dense_input(g: _GraphBuilder, params: DeepFMParams) -> str:
    """`deepfm.transform_dense` of the `dense` input: `log(1 + max(dense, 0))`, then, for a model with transforms,
    the raw value where a feature is `linear` (Where) and `(· − centre) / scale`."""
    transforms = params.dense_transforms
    logs = None
    if not transforms or any(t.kind == LOG1P for t in transforms):
        relu = g.node("Max", [DENSE, g.const("zero", np.array(0.0, dtype=np.float32))], "dense.relu")
        plus_one = g.node("Add", [relu, g.const("one", np.array(1.0, dtype=np.float32))], "dense.plus_one")
        logs = g.node("Log", [plus_one], "dense.log")
    if not transforms:
        assert logs is not None
        return logs
    if logs is None:
        chosen = DENSE
    elif all(t.kind == LOG1P for t in transforms):
        chosen = logs
    else:
        mask = g.const("dense.is_log1p", np.array([t.kind == LOG1P for t in transforms]))
        chosen = g.node("Where", [mask, logs, DENSE], "dense.chosen")
    centre = g.const("dense.centre", np.array([t.centre for t in transforms], dtype=np.float32))
    scale = g.const("dense.scale", np.array([t.scale for t in transforms], dtype=np.float32))
    return g.node("Div", [g.node("Sub", [chosen, centre], "dense.centred"), scale], "dense.x")


def build_graph(params: DeepFMParams) -> onnx.ModelProto:
    """The fp32 ONNX model of `deepfm.forward` for these parameters."""
    import onnx
    from onnx import TensorProto, helper

    g = _GraphBuilder()
    k, fields, n = params.factors, params.num_fields, params.num_dense
    axis_1 = g.const("axis_1", np.array([1], dtype=np.int64))

    def slice_last_axis(output: str, start: int, end: int) -> str:
        return g.node(
            "Slice",
            [
                EMBEDDINGS,
                g.const(f"{output}.starts", np.array([start], dtype=np.int64)),
                g.const(f"{output}.ends", np.array([end], dtype=np.int64)),
                g.const(f"{output}.axes", np.array([2], dtype=np.int64)),
            ],
            output,
        )

    if n:  # the dense features come in raw; this is the first thing the graph does with them
        x = _dense_input(g, params)  # [B, N]

    factors = slice_last_axis("factors", 0, k)  # [B, F, k]
    linear = slice_last_axis("linear", k, k + 1)  # [B, F, 1]

    terms = [g.node("ReduceSum", [linear, axis_1], "first_order.fields", keepdims=0)]  # [B, 1]
    if n:
        dense_weight = g.const("first_order.dense.weight", params.dense_weights[:, None])
        terms.append(g.node("MatMul", [x, dense_weight], "first_order.dense"))  # [B, 1]

    sum_v = g.node("ReduceSum", [factors, axis_1], "fm.sum_v", keepdims=0)  # [B, k]
    square_of_sum = g.node("Mul", [sum_v, sum_v], "fm.square_of_sum")
    squares = g.node("Mul", [factors, factors], "fm.squares")
    sum_of_squares = g.node("ReduceSum", [squares, axis_1], "fm.sum_of_squares", keepdims=0)
    fm_diff = g.node("Sub", [square_of_sum, sum_of_squares], "fm.diff")
    fm_sum = g.node("ReduceSum", [fm_diff, axis_1], "fm.sum", keepdims=1)  # [B, 1]
    terms.append(g.node("Mul", [fm_sum, g.const("fm.half", np.array(0.5, dtype=np.float32))], "second_order"))

    def gemm(output: str, x: str, weight: np.ndarray, bias: np.ndarray | None) -> str:
        # transB = 1 stores the weight [outputs, inputs]: per-channel quantization then runs along axis 0.
        inputs = [x, g.const(f"{output}.weight", np.ascontiguousarray(weight.T))]
        if bias is not None:
            inputs.append(g.const(f"{output}.bias", bias))
        return g.node("Gemm", inputs, output, transB=1)

    first = params.layers[0]
    flat = g.node("Flatten", [factors], "mlp.input.factors", axis=1)  # [B, F * k]
    h = gemm("mlp.0.factors", flat, first.weight[: fields * k], first.bias)
    if n:
        h = g.node("Add", [h, gemm("mlp.0.dense", x, first.weight[fields * k :], None)], "mlp.0")
    for i, layer in enumerate(params.layers[1:], start=1):
        h = gemm(f"mlp.{i}", g.node("Relu", [h], f"mlp.{i - 1}.relu"), layer.weight, layer.bias)
    terms.append(h)

    logit = g.node("Add", [terms[0], g.const("bias", np.array(params.bias, dtype=np.float32))], "logit.0")
    for i, term in enumerate(terms[1:], start=1):
        logit = g.node("Add", [logit, term], f"logit.{i}")
    g.node("Sigmoid", [logit], PROBABILITY)

    inputs = [helper.make_tensor_value_info(EMBEDDINGS, TensorProto.FLOAT, [BATCH, fields, params.dim])]
    if n:
        inputs.append(helper.make_tensor_value_info(DENSE, TensorProto.FLOAT, [BATCH, n]))
    outputs = [helper.make_tensor_value_info(PROBABILITY, TensorProto.FLOAT, [BATCH, 1])]
    graph = helper.make_graph(g.nodes, "deepfm", inputs, outputs, g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER)
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def save(model: onnx.ModelProto, path: Path) -> None:
    """Write `model` to `path` as one self-contained file (no external data)."""
    files.write_bytes(path, model.SerializeToString(deterministic=True))
