"""Quantization: embedding tables to fp16 or fused row-wise int8, the dense graph to INT8 QDQ.

Tables follow docs/model-repository.md ("Tensor layout in safetensors"). The int8 layout is FBGEMM's fused
row-wise one: row `r` is `dim` uint8 codes, then `scale_r` and `bias_r` as little-endian float32, with
`bias_r = min(row)`, `scale_r = (max(row) - min(row)) / 255` (1.0 for a constant row) and
`q = round((x - bias_r) / scale_r)` clamped to [0, 255] (numpy rounds halves to even). Dequantization is
`f32(q) * scale + bias` in float32, a multiply then an add.

The dense graph goes through onnxruntime's static quantizer: QDQ format, the MLP Gemm nodes only (the FM and
first-order terms stay float32, they are cheap and precision-sensitive), uint8 activations calibrated by min/max
on the given samples, int8 per-channel weights with `reduce_range` (7-bit), which keeps u8×s8 products clear of
the int16 saturation of CPUs without VNNI, so the quantized graph computes the same integers on every x86 CPU.
Gemm outputs stay float32 (ONNX Runtime fuses each layer into a QGemm with float output): quantizing them as
well raised the worst-case probability error on a Criteo-shaped test model from 0.02 to 0.08.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

from .onnx_export import DENSE, EMBEDDINGS
from .progress import Progress, to_stderr

if TYPE_CHECKING:  # imported where used: onnx and onnxruntime are slow to import; the table codecs need neither
    import onnx

INT8_TRAILER = 8  # bytes after the codes of a fused int8 row: scale f32 LE, bias f32 LE


def quantize_rowwise_int8(name: str, table: np.ndarray) -> np.ndarray:
    """Fused row-wise int8 `[rows, dim + 8]` uint8 of a float32 `[rows, dim]` table named `name`."""
    _check_table(name, table)
    rows, dim = table.shape
    low = table.min(axis=1)
    scale = (table.max(axis=1) - low) / np.float32(255)
    # A constant row has scale 1.0. So does a row whose range is too small to give a non-zero float32 scale:
    # all its values are then within a few denormals of `low`, and code 0 represents them.
    scale[scale == 0] = np.float32(1.0)
    codes = np.clip(np.round((table - low[:, None]) / scale[:, None]), 0, 255).astype(np.uint8)
    fused = np.empty((rows, dim + INT8_TRAILER), dtype=np.uint8)
    fused[:, :dim] = codes
    fused[:, dim : dim + 4] = scale.astype("<f4").view(np.uint8).reshape(rows, 4)
    fused[:, dim + 4 :] = low.astype("<f4").view(np.uint8).reshape(rows, 4)
    return fused


def dequantize_rowwise_int8(fused: np.ndarray) -> np.ndarray:
    """The float32 `[rows, dim]` rows of fused int8 rows `[rows, dim + 8]`, as the server computes them."""
    if fused.dtype != np.uint8 or fused.ndim != 2 or fused.shape[1] <= INT8_TRAILER:
        raise ValueError(f"fused int8 rows must be uint8 [rows, dim + 8], got {fused.dtype} {list(fused.shape)}")
    dim = fused.shape[1] - INT8_TRAILER
    trailer = np.ascontiguousarray(fused[:, dim:])
    scale = trailer[:, :4].copy().view("<f4").astype(np.float32)  # [rows, 1]
    bias = trailer[:, 4:].copy().view("<f4").astype(np.float32)
    product = fused[:, :dim].astype(np.float32) * scale  # float32 multiply, rounded ...
    return product + bias  # ... then a float32 add: no fused multiply-add


def to_fp16(name: str, table: np.ndarray) -> np.ndarray:
    """The float16 `[rows, dim]` table of a float32 table named `name` (round to nearest even)."""
    _check_table(name, table)
    with np.errstate(over="ignore"):  # reported below, with the value and where it is
        half = table.astype(np.float16)
    overflow = np.isinf(half)
    if overflow.any():
        row, col = np.argwhere(overflow)[0]
        raise ValueError(f"table {name!r}: value {table[row, col]} at [{row}, {col}] is out of the float16 range")
    return half


def _check_table(name: str, table: np.ndarray) -> None:
    if table.dtype != np.float32 or table.ndim != 2 or 0 in table.shape:
        shape = list(table.shape)
        raise ValueError(f"table {name!r} must be a non-empty float32 [rows, dim] array, got {table.dtype} {shape}")
    if not np.all(np.isfinite(table)):
        row = int(np.argwhere(~np.isfinite(table))[0, 0])
        raise ValueError(f"table {name!r}: row {row} holds a non-finite value")


def _calibration_reader(embeddings: np.ndarray, dense: np.ndarray, batch: int, progress: Progress) -> object:
    """Feeds the calibration samples to the quantizer in batches (a class defined here, since its base lives in
    onnxruntime, which is imported only when a graph is quantized)."""
    from onnxruntime.quantization import CalibrationDataReader

    class Samples(CalibrationDataReader):
        def __init__(self) -> None:
            feeds = []
            for start in range(0, len(embeddings), batch):
                feed = {EMBEDDINGS: embeddings[start : start + batch]}
                if dense.shape[1]:  # a graph without dense features has no `dense` input
                    feed[DENSE] = dense[start : start + batch]
                feeds.append(feed)
            self._feeds: Iterator[dict[str, np.ndarray]] = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            feed = next(self._feeds, None)
            if feed is not None:
                progress.advance(len(feed[EMBEDDINGS]), note="calibrating the INT8 graph")
            return feed

    return Samples()


def quantize_dense_graph(
    model: onnx.ModelProto,
    embeddings: np.ndarray,
    dense: np.ndarray,
    *,
    batch: int = 256,
    progress: Callable[[str], None] = to_stderr("quantize"),
) -> onnx.ModelProto:
    """The INT8 QDQ version of the fp32 DeepFM `model`.

    `embeddings` float32 [S, F, D] and `dense` float32 [S, N] are the calibration samples: gathered rows and
    raw dense features as the server would send them.
    """
    if len(embeddings) == 0 or len(embeddings) != len(dense):
        raise ValueError(
            "calibration needs as many dense rows as embedding rows, and at least one: "
            f"got {len(embeddings)} and {len(dense)}"
        )
    gemms = [node.name for node in model.graph.node if node.op_type == "Gemm"]
    if not gemms:
        raise ValueError("the graph has no Gemm node to quantize: is it a graph from onnx_export?")
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    with tempfile.TemporaryDirectory(prefix="recserve-quantize-") as scratch:
        # The quantizer reads a file and keeps its augmented calibration model beside it.
        source = Path(scratch, "fp32.onnx")
        source.write_bytes(model.SerializeToString(deterministic=True))
        with _without_preprocessing_advice():
            quantize_static(
                source,
                Path(scratch, "int8.onnx"),
                _calibration_reader(embeddings, dense, batch, Progress("calibration rows", len(embeddings), progress)),
                quant_format=QuantFormat.QDQ,
                nodes_to_quantize=gemms,
                per_channel=True,
                reduce_range=True,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                extra_options={"OpTypesToExcludeOutputQuantization": ["Gemm"]},
            )
        quantized = onnx.load(Path(scratch, "int8.onnx"))
    onnx.checker.check_model(quantized, full_check=True)
    return quantized


class _PreprocessingAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing" not in record.getMessage()


@contextlib.contextmanager
def _without_preprocessing_advice() -> Iterator[None]:
    """Silence the quantizer's advice to run its pre-processing (shape inference and graph optimization).

    The exporter's graphs are already in the form that pre-processing would produce: every node is a plain
    ONNX operator with inferable shapes, and the quantizer runs shape inference itself.
    """
    advice = _PreprocessingAdvice()
    root = logging.getLogger()
    root.addFilter(advice)
    try:
        yield
    finally:
        root.removeFilter(advice)
