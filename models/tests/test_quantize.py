"""Table quantization (fused row-wise int8, fp16) and the INT8 QDQ dense graph."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from conftest import criteo_params, random_inputs, run_graph

from recserve_models import deepfm
from recserve_models.onnx_export import build_graph
from recserve_models.quantize import dequantize_rowwise_int8, quantize_dense_graph, quantize_rowwise_int8, to_fp16


def table(rng: np.random.Generator) -> np.ndarray:
    values = rng.normal(0.0, 0.3, (500, 17)).astype(np.float32)
    values[7] = 0.25  # a constant row
    values[8] *= 1e4  # a wide one
    return values


def test_int8_rows_round_trip_within_half_a_step(rng: np.random.Generator) -> None:
    values = table(rng)
    fused = quantize_rowwise_int8("t", values)
    assert fused.dtype == np.uint8 and fused.shape == (500, 17 + 8)
    scale = fused[:, 17:21].copy().view("<f4")
    error = np.abs(dequantize_rowwise_int8(fused) - values)
    # Half a quantization step, plus the float32 rounding of the scale, product and sum.
    assert np.all(error <= scale / 2 * (1 + 1e-5) + np.abs(values) * 2e-7)


def test_int8_row_layout_is_codes_then_scale_then_bias() -> None:
    row = np.array([[0.5, 1.5, 2.5, 3.05]], dtype=np.float32)
    fused = quantize_rowwise_int8("t", row)
    scale, bias = struct.unpack("<ff", fused[0, 4:].tobytes())
    assert scale == np.float32(2.55) / np.float32(255) and bias == 0.5
    assert fused[0, :4].tolist() == [0, 100, 200, 255]


def test_int8_constant_row_has_scale_one_and_is_exact() -> None:
    fused = quantize_rowwise_int8("t", np.full((1, 5), -3.5, dtype=np.float32))
    assert struct.unpack("<ff", fused[0, 5:].tobytes()) == (1.0, -3.5)
    assert fused[0, :5].tolist() == [0] * 5
    assert np.array_equal(dequantize_rowwise_int8(fused), np.full((1, 5), -3.5, dtype=np.float32))


def test_int8_dequantization_multiplies_then_adds_in_float32(rng: np.random.Generator) -> None:
    fused = quantize_rowwise_int8("t", table(rng))
    got = dequantize_rowwise_int8(fused)
    for r in (0, 8, 321):
        scale, bias = struct.unpack("<ff", fused[r, 17:].tobytes())
        for j in range(17):
            product = np.float32(fused[r, j]) * np.float32(scale)
            assert got[r, j] == product + np.float32(bias)


def test_fp16_round_trip_within_half_an_ulp(rng: np.random.Generator) -> None:
    values = table(rng)
    half = to_fp16("t", values)
    assert half.dtype == np.float16 and half.shape == values.shape
    error = np.abs(half.astype(np.float32) - values)
    # fp16 has an 11-bit significand: relative error at most 2^-11 in the normal range, 2^-25 absolute below it.
    assert np.all(error <= np.maximum(np.abs(values) * 2.0**-11, 2.0**-25))


def test_tables_that_cannot_be_stored_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"table 'C7': value 70000.0 at \[0, 1\] is out of the float16 range"):
        to_fp16("C7", np.array([[1.0, 7e4]], dtype=np.float32))
    with pytest.raises(ValueError, match="table 'C8': row 1 holds a non-finite value"):
        quantize_rowwise_int8("C8", np.array([[1.0], [np.nan]], dtype=np.float32))


def test_int8_graph_is_close_to_fp32(rng: np.random.Generator) -> None:
    params = criteo_params(rng)
    model = build_graph(params)
    quantized = quantize_dense_graph(model, *random_inputs(rng, params, 1024))
    assert sum(n.op_type == "QuantizeLinear" for n in quantized.graph.node) >= 4
    emb, dense = random_inputs(rng, params, 4096)
    gap = np.abs(run_graph(quantized, emb, dense) - deepfm.forward(params, emb, dense))
    # Observed on this model: mean 0.0015, max 0.02 (samples beyond the calibrated range are clipped).
    assert gap.mean() < 0.005 and gap.max() < 0.05
