"""The DeepFM dense graph split into a user part, run once per request, and an item part, run per candidate.

In a rank request every candidate carries the same user fields and dense features, so everything the network
computes from them alone is the same for every candidate. `build_split_graph(params, user_fields)` writes the graph
of `deepfm.forward` in a form that computes those terms first, from the user side only, into one tensor
`USER_STATE` float32 [batch, H + 2k + 1]:

- `H` values: the user side's part of the first MLP layer, `flatten(v_user) @ W_v,user + x @ W_x` (no bias, no
  activation; each product its own Gemm, as in `onnx_export`, so the quantizer gives each its own scale);
- `k` values: `Σ_{f ∈ user} v_f` and `k` values: `Σ_{f ∈ user} v_f²`, the user sums of the FM decomposition;
- 1 value: the first-order user terms, `Σ_{f ∈ user} w_f + u · x`.

The rest of the graph reads only `USER_STATE` and the item fields: it adds the item side's sums and first-layer
product to those (`Σ v = Σ_user v + Σ_item v`, likewise the squares and the first-order terms;
`h_0 = flatten(v_item) @ W_v,item + b + user part`) and finishes the FM term and the MLP.

That whole graph is the *reference unsplit graph*; `split(graph)` cuts it (fp32, or its INT8 QDQ version, so both
parts share the calibration of one graph) at `USER_STATE` into a user graph (`embeddings`, `dense` → `USER_STATE`)
and an item graph (`embeddings`, `USER_STATE` → `probability`). Both parts are node for node the nodes of the
unsplit graph, so the split computes the same operations on the same values; it equals the unsplit graph exactly
as long as ONNX Runtime's kernels give each row the same result whatever the batch size, which the tests check
(the server runs the user graph on one row per request and the item graph on the batch). The user graph reads the
user fields from a full `[batch, F, D]` embeddings input (the server's gather, unchanged), the item graph the item
fields from it.

The sums are taken in another order than in `onnx_export.build_graph` (user fields, then item fields, then one
add), so the split form's scores differ from the plain graph's by float rounding: they are another graph of the
same function, checked against `deepfm.forward` with the same tolerances.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .deepfm import DeepFMParams
from .onnx_export import BATCH, DENSE, EMBEDDINGS, IR_VERSION, OPSET, PRODUCER, PROBABILITY, _GraphBuilder

if TYPE_CHECKING:
    import onnx

USER_STATE = "user_state"


def state_width(params: DeepFMParams) -> int:
    """H + 2k + 1, the width of `USER_STATE`."""
    return int(params.layers[0].weight.shape[1]) + 2 * params.factors + 1


def build_split_graph(params: DeepFMParams, user_fields: Sequence[int]) -> onnx.ModelProto:
    """The fp32 ONNX model of `deepfm.forward` in split form (see the module documentation); `user_fields` are the
    indices (F axis) of the user-side fields, the others are item-side. The dense features are user-side."""
    import onnx  # imported here: a command's --help must not pay for onnx
    from onnx import TensorProto, helper

    fields, k, n = params.num_fields, params.factors, params.num_dense
    user = sorted(set(user_fields))
    if len(user) != len(user_fields) or any(not 0 <= f < fields for f in user):
        raise ValueError(f"user fields must be distinct indices in [0, {fields}), got {list(user_fields)}")
    item = [f for f in range(fields) if f not in user]
    if not item:
        raise ValueError("a split graph needs at least one item-side field")
    if not user:
        raise ValueError("a split graph needs at least one user-side field")

    g = _GraphBuilder()
    axis_1 = g.const("axis_1", np.array([1], dtype=np.int64))
    first = params.layers[0]
    weight_v = first.weight[: fields * k].reshape(fields, k, -1)  # [F, k, H]: row f·k + j is factor j of field f

    def gemm(output: str, x: str, weight: np.ndarray, bias: np.ndarray | None = None) -> str:
        inputs = [x, g.const(f"{output}.weight", np.ascontiguousarray(weight.T))]  # transB = 1, as onnx_export
        if bias is not None:
            inputs.append(g.const(f"{output}.bias", bias))
        return g.node("Gemm", inputs, output, transB=1)

    def side(name: str, indices: list[int], sums: bool = True) -> tuple[str, ...]:
        """The flattened factors [B, n·k] of the side's fields and (`sums`) its Σ w_f [B, 1], Σ v_f, Σ v_f² [B, k]."""
        rows = g.node("Gather", [EMBEDDINGS, g.const(f"{name}.fields", np.array(indices, dtype=np.int64))],
                      f"{name}.embeddings", axis=1)  # [B, n, D]

        def part(output: str, start: int, end: int) -> str:
            bounds = [np.array([v], dtype=np.int64) for v in (start, end, 2)]
            consts = [g.const(f"{output}.{what}", v) for what, v in zip(("starts", "ends", "axes"), bounds, strict=True)]
            return g.node("Slice", [rows, *consts], output)

        factors = part(f"{name}.factors", 0, k)
        flat = g.node("Flatten", [factors], f"mlp.input.{name}", axis=1)
        if not sums:
            return (flat,)
        linear = part(f"{name}.linear", k, k + 1)
        first_order = g.node("ReduceSum", [linear, axis_1], f"{name}.first_order", keepdims=0)
        sum_v = g.node("ReduceSum", [factors, axis_1], f"{name}.sum_v", keepdims=0)
        squares = g.node("Mul", [factors, factors], f"{name}.squares")
        sum_sq = g.node("ReduceSum", [squares, axis_1], f"{name}.sum_of_squares", keepdims=0)
        return flat, first_order, sum_v, sum_sq

    # --- the user part: everything USER_STATE holds
    # The user sums are chains of elementwise adds over the fields' rows, not a ReduceSum: an add gives each row
    # the same bits whatever the batch size, while ONNX Runtime's ReduceSum takes another path for one row.
    sum_rows = sum_squares = ""
    for f in user:
        row = g.node("Gather", [EMBEDDINGS, g.const(f"user.{f}.field", np.array(f, dtype=np.int64))],
                     f"user.{f}.row", axis=1)  # [B, D]
        square = g.node("Mul", [row, row], f"user.{f}.square")
        sum_rows = row if not sum_rows else g.node("Add", [sum_rows, row], f"user.sum.{f}")
        sum_squares = square if not sum_squares else g.node("Add", [sum_squares, square], f"user.sum_of_squares.{f}")

    def columns(output: str, source: str, start: int, end: int) -> str:
        consts = [g.const(f"{output}.{what}", np.array([v], dtype=np.int64)) for what, v in (("s", start), ("e", end))]
        return g.node("Slice", [source, *consts, axis_1], output)

    sum_v_user = columns("user.rows.sum_v", sum_rows, 0, k)
    sum_sq_user = columns("user.rows.sum_of_squares", sum_squares, 0, k)
    fo_user = columns("user.rows.first_order", sum_rows, k, k + 1)
    (flat_user,) = side("user", user, sums=False)
    user_terms = [gemm("mlp.0.user", flat_user, weight_v[user].reshape(len(user) * k, -1))]  # [B, H] each
    if n:
        relu = g.node("Max", [DENSE, g.const("zero", np.array(0.0, dtype=np.float32))], "dense.relu")
        plus_one = g.node("Add", [relu, g.const("one", np.array(1.0, dtype=np.float32))], "dense.plus_one")
        x = g.node("Log", [plus_one], "dense.log")  # [B, N]
        dense_first = g.node("MatMul", [x, g.const("first_order.dense.weight", params.dense_weights[:, None])],
                             "first_order.dense")
        fo_user = g.node("Add", [fo_user, dense_first], "user.first_order_all")
        user_terms.append(gemm("mlp.0.dense", x, first.weight[fields * k :]))
    h_user = user_terms[0]
    for i, term in enumerate(user_terms[1:], start=1):
        h_user = g.node("Add", [h_user, term], f"mlp.0.user_side.{i}")
    g.node("Concat", [h_user, sum_v_user, sum_sq_user, fo_user], USER_STATE, axis=1)

    # --- the item part: reads USER_STATE and the item fields
    hidden = int(first.weight.shape[1])
    offsets = np.cumsum([0, hidden, k, k, 1])

    def state(name: str, i: int) -> str:
        consts = [g.const(f"{name}.{what}", np.array([v], dtype=np.int64))
                  for what, v in (("starts", offsets[i]), ("ends", offsets[i + 1]))]
        return g.node("Slice", [USER_STATE, *consts, axis_1], name)

    flat_item, fo_item, sum_v_item, sum_sq_item = side("item", item)
    sum_v = g.node("Add", [state("state.sum_v", 1), sum_v_item], "fm.sum_v")
    sum_sq = g.node("Add", [state("state.sum_of_squares", 2), sum_sq_item], "fm.sum_of_squares")
    square_of_sum = g.node("Mul", [sum_v, sum_v], "fm.square_of_sum")
    fm_diff = g.node("Sub", [square_of_sum, sum_sq], "fm.diff")
    fm_sum = g.node("ReduceSum", [fm_diff, axis_1], "fm.sum", keepdims=1)
    second = g.node("Mul", [fm_sum, g.const("fm.half", np.array(0.5, dtype=np.float32))], "second_order")
    first_order = g.node("Add", [state("state.first_order", 3), fo_item], "first_order")

    h = gemm("mlp.0.item", flat_item, weight_v[item].reshape(len(item) * k, -1), first.bias)
    h = g.node("Add", [h, state("state.mlp_0", 0)], "mlp.0")
    for i, layer in enumerate(params.layers[1:], start=1):
        h = gemm(f"mlp.{i}", g.node("Relu", [h], f"mlp.{i - 1}.relu"), layer.weight, layer.bias)

    logit = g.node("Add", [first_order, g.const("bias", np.array(params.bias, dtype=np.float32))], "logit.0")
    logit = g.node("Add", [logit, second], "logit.1")
    logit = g.node("Add", [logit, h], "logit.2")
    g.node("Sigmoid", [logit], PROBABILITY)

    inputs = [helper.make_tensor_value_info(EMBEDDINGS, TensorProto.FLOAT, [BATCH, fields, params.dim])]
    if n:
        inputs.append(helper.make_tensor_value_info(DENSE, TensorProto.FLOAT, [BATCH, n]))
    outputs = [helper.make_tensor_value_info(PROBABILITY, TensorProto.FLOAT, [BATCH, 1])]
    graph = helper.make_graph(g.nodes, "deepfm_split", inputs, outputs, g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER)
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def split(model: onnx.ModelProto) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The user graph and the item graph of a graph from `build_split_graph` (fp32, or its INT8 QDQ version)."""
    import onnx
    from onnx.utils import Extractor

    names = {i.name for i in model.graph.input}
    produced = {o for node in model.graph.node for o in node.output}
    if USER_STATE not in produced:
        raise ValueError(f"the graph computes no {USER_STATE!r}: is it a graph from build_split_graph?")
    extractor = Extractor(onnx.shape_inference.infer_shapes(model))
    user = extractor.extract_model([i for i in (EMBEDDINGS, DENSE) if i in names], [USER_STATE])
    item = extractor.extract_model([EMBEDDINGS, USER_STATE], [PROBABILITY])
    for part in (user, item):
        # A user state's width is fixed; its batch dimension is the graph's symbolic one.
        for value in (*part.graph.input, *part.graph.output):
            if value.name == USER_STATE:
                value.type.tensor_type.shape.dim[0].ClearField("dim_value")
                value.type.tensor_type.shape.dim[0].dim_param = BATCH
        del part.opset_import[:]
        part.opset_import.extend(model.opset_import)
        part.ir_version = model.ir_version
        part.producer_name = PRODUCER
        onnx.checker.check_model(part, full_check=True)
    if DENSE in names and DENSE in {i.name for i in item.graph.input}:
        raise ValueError("the item part reads the dense features: they must be user-side")
    return user, item
