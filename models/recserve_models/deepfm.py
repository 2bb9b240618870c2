"""DeepFM: its parameters, their random initialisation, and the numpy reference forward pass.

This module defines what "the recserve DeepFM" computes; the ONNX exporter (`onnx_export`) builds a graph
of exactly this function, and the tests hold the two together.

Inputs, per candidate `b` (the server gathers the first one from the embedding tables):

- `emb[b, f, :]`, `f` in `0..F`: the table row of field `f`, `D = k + 1` values: `k` factors `v_f`
  followed by the field's first-order weight `w_f`.
- `dense[b, :]`: `N` raw dense features. The model reads feature `n` as `x_n = (g_n(dense_n) − c_n) / s_n`, its
  `DenseTransform`: `g` is `log1p` (`log(1 + max(dense, 0))`, for counts) or `linear` (the raw value, for a
  signed score), `c` a centre and `s` a scale. A model without transforms reads every feature as
  `log(1 + max(dense, 0))` (`c = 0`, `s = 1`; the Criteo models).

Output:

    logit = w0                                         global bias
          + Σ_f w_f                                    first order, categorical
          + Σ_n u_n · x_n                              first order, dense
          + Σ_{i<j} <v_i, v_j>                         FM second order, computed as
                                                         0.5 · Σ_k ((Σ_f v_fk)² − Σ_f v_fk²)
          + MLP([v_0, v_1, …, v_{F-1}, x])             deep part: input F·k + N values, ReLU between
                                                         layers, none after the last (width 1)
    probability = sigmoid(logit)

Dense features take part in the first-order and deep terms only, not in the FM interaction.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Layer:
    """One fully connected layer, `y = x @ weight + bias`."""

    weight: np.ndarray  # float32 [inputs, outputs]
    bias: np.ndarray  # float32 [outputs]


LOG1P, LINEAR = "log1p", "linear"
TRANSFORM_KINDS = (LOG1P, LINEAR)


@dataclass(frozen=True)
class DenseTransform:
    """How the model reads one raw dense feature: `x = (g(raw) − centre) / scale`, `g` as `kind` says."""

    kind: str = LOG1P
    centre: float = 0.0
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in TRANSFORM_KINDS:
            raise ValueError(f"dense transform kind {self.kind!r} is not one of {', '.join(TRANSFORM_KINDS)}")
        if not (np.isfinite(self.centre) and np.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"dense transform centre {self.centre} and scale {self.scale}: need finite, scale > 0")


@dataclass(frozen=True)
class DeepFMParams:
    """Every trained number of a DeepFM model.

    `tables` maps a table name to its float32 `[rows, k + 1]` rows (factors, then first-order weight);
    `field_tables` names the table each field reads, in the order of the `F` axis.
    """

    tables: Mapping[str, np.ndarray]
    field_tables: tuple[str, ...]
    bias: np.float32  # w0
    dense_weights: np.ndarray  # float32 [N], u
    layers: tuple[Layer, ...]  # the MLP; the last layer has width 1
    # One per dense feature, or none: every feature read as log(1 + max(x, 0)), the graph exported as before.
    dense_transforms: tuple[DenseTransform, ...] = ()

    def __post_init__(self) -> None:
        if not self.field_tables:
            raise ValueError("DeepFM needs at least one field")
        for name in self.field_tables:
            if name not in self.tables:
                raise ValueError(f"field reads table {name!r}, which is not among the tables")
        for name, table in self.tables.items():
            _check_array(f"table {name!r}", table, 2)
            if table.shape[1] != self.dim:
                raise ValueError(
                    f"table {name!r} has rows of width {table.shape[1]}, "
                    f"table {self.field_tables[0]!r} of width {self.dim}: all tables need the same width"
                )
        if self.dim < 2:
            raise ValueError(f"rows of width {self.dim} leave no factors: need k + 1 >= 2")
        _check_array("dense_weights", self.dense_weights, 1)
        if self.dense_transforms and len(self.dense_transforms) != self.num_dense:
            raise ValueError(f"{len(self.dense_transforms)} dense transforms for {self.num_dense} dense features")
        if not self.layers:
            raise ValueError("the MLP needs at least one layer")
        width = self.num_fields * self.factors + self.num_dense
        for i, layer in enumerate(self.layers):
            _check_array(f"layers[{i}].weight", layer.weight, 2)
            _check_array(f"layers[{i}].bias", layer.bias, 1)
            if layer.weight.shape[0] != width:
                raise ValueError(f"layers[{i}].weight takes {layer.weight.shape[0]} inputs, expected {width}")
            if layer.bias.shape[0] != layer.weight.shape[1]:
                raise ValueError(f"layers[{i}].bias has {layer.bias.shape[0]} values, expected {layer.weight.shape[1]}")
            width = layer.weight.shape[1]
        if width != 1:
            raise ValueError(f"the last MLP layer has {width} outputs, expected 1")

    @property
    def dim(self) -> int:
        """D, the row width: k factors and one first-order weight."""
        return int(self.tables[self.field_tables[0]].shape[1])

    @property
    def factors(self) -> int:
        """k, the number of FM factors."""
        return self.dim - 1

    @property
    def num_fields(self) -> int:
        """F, the number of categorical fields."""
        return len(self.field_tables)

    @property
    def num_dense(self) -> int:
        """N, the number of dense features."""
        return int(self.dense_weights.shape[0])


def transform_dense(params: DeepFMParams, dense: np.ndarray) -> np.ndarray:
    """`x` of raw `dense` [B, N], in the dtype of `dense` (float64 for the reference, float32 for training)."""
    logs = np.log1p(np.maximum(dense, dense.dtype.type(0)))
    if not params.dense_transforms:
        return logs
    kinds = np.array([t.kind == LOG1P for t in params.dense_transforms])
    centre = np.array([t.centre for t in params.dense_transforms], dtype=dense.dtype)
    scale = np.array([t.scale for t in params.dense_transforms], dtype=dense.dtype)
    return (np.where(kinds, logs, dense) - centre) / scale


def _check_array(what: str, array: np.ndarray, ndim: int) -> None:
    if not isinstance(array, np.ndarray) or array.dtype != np.float32 or array.ndim != ndim:
        raise ValueError(f"{what} must be a {ndim}-d float32 numpy array")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{what} holds non-finite values")


def init_params(
    rng: np.random.Generator,
    table_rows: Mapping[str, int],
    field_tables: Sequence[str],
    *,
    factors: int,
    num_dense: int,
    hidden: Sequence[int],
    factor_std: float = 0.125,
    linear_std: float = 0.1,
    dense_std: float = 0.05,
    bias_mean: float = -0.5,
) -> DeepFMParams:
    """Random parameters that give spread-out probabilities on Criteo-shaped inputs.

    Factors ~ N(0, factor_std²) so that the FM term over 26 fields has a standard deviation near 1;
    first-order weights ~ N(0, linear_std²) and N(0, dense_std²); MLP weights He-initialised
    (N(0, 2 / fan_in), the last layer N(0, 1 / fan_in)); biases zero except w0 ~ N(bias_mean, 0.2²).
    """
    dim = factors + 1
    tables = {}
    for name, rows in table_rows.items():
        table = np.empty((rows, dim), dtype=np.float32)
        table[:, :factors] = rng.normal(0.0, factor_std, (rows, factors))
        table[:, factors] = rng.normal(0.0, linear_std, rows)
        tables[name] = table
    widths = [len(field_tables) * factors + num_dense, *hidden, 1]
    layers = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        gain = 1.0 if i == len(widths) - 2 else 2.0
        weight = rng.normal(0.0, np.sqrt(gain / fan_in), (fan_in, fan_out)).astype(np.float32)
        layers.append(Layer(weight=weight, bias=np.zeros(fan_out, dtype=np.float32)))
    return DeepFMParams(
        tables=tables,
        field_tables=tuple(field_tables),
        bias=np.float32(rng.normal(bias_mean, 0.2)),
        dense_weights=rng.normal(0.0, dense_std, num_dense).astype(np.float32),
        layers=tuple(layers),
    )


def forward(params: DeepFMParams, emb: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """The click probability of each row: `emb` float32 [B, F, D], `dense` float32 [B, N] -> float64 [B].

    Computed in float64 from the float32 inputs and parameters, so it is the exact value that a float32
    implementation approximates.
    """
    batch = emb.shape[0]
    if emb.dtype != np.float32 or emb.shape[1:] != (params.num_fields, params.dim):
        raise ValueError(
            f"embeddings must be float32 [batch, {params.num_fields}, {params.dim}], got {emb.dtype} {list(emb.shape)}"
        )
    if dense.dtype != np.float32 or dense.shape != (batch, params.num_dense):
        raise ValueError(f"dense must be float32 [{batch}, {params.num_dense}], got {dense.dtype} {list(dense.shape)}")
    k = params.factors
    e = emb.astype(np.float64)
    v = e[:, :, :k]
    x = transform_dense(params, dense.astype(np.float64))

    first_order = e[:, :, k].sum(axis=1) + x @ params.dense_weights.astype(np.float64)
    sum_v = v.sum(axis=1)
    second_order = 0.5 * (sum_v * sum_v - (v * v).sum(axis=1)).sum(axis=1)

    h = np.concatenate([v.reshape(batch, -1), x], axis=1)
    for i, layer in enumerate(params.layers):
        h = h @ layer.weight.astype(np.float64) + layer.bias.astype(np.float64)
        if i < len(params.layers) - 1:
            h = np.maximum(h, 0.0)

    logit = np.float64(params.bias) + first_order + second_order + h[:, 0]
    return np.exp(-np.logaddexp(0.0, -logit))
