"""Adam, for the numpy training loops of `train_deepfm` and `lightgcn`.

Two forms share one set of hyper-parameters: `Adam.step` updates a whole array (MLP weights, LightGCN's layer-0
embeddings, whose gradient is dense after propagation), and `Adam.step_rows` updates only the given rows of an
embedding table ("lazy" Adam, as TensorFlow's LazyAdam and PyTorch's SparseAdam do): rows that a batch does not
touch keep their moments and their values, so a step costs O(batch), not O(table). Bias correction uses the
global step count in both forms.

What trains a model is its number of Adam steps, `epochs × ceil(rows / batch)`, not its number of epochs: a batch
that suits a large file leaves a small one with a handful of steps. `report_steps` says how many a run will take,
and warns when they are fewer than the trainer's threshold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


def report_steps(
    progress: Callable[[str], None], batch: int, per_epoch: int, epochs: int, *, fewest: int, model: str, guide: str
) -> None:
    """Reports `batch 1024: 8 steps per epoch, 16 in all`, and a warning when the steps in all are fewer than
    `fewest` (`model` names the trainer, `guide` the documentation that says how to choose the settings)."""
    steps = per_epoch * epochs
    progress(f"batch {batch}: {per_epoch} step{'s' if per_epoch != 1 else ''} per epoch, {steps} in all")
    if steps < fewest:
        progress(
            f"warning: {steps} Adam steps in all ({per_epoch} per epoch), {model} usually needs at least {fewest:,}: "
            f"lower --batch or raise --epochs ({guide})"
        )


@dataclass
class Adam:
    """Adam (Kingma & Ba, 2015) over named float32 arrays; moments are created on first use."""

    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    steps: int = 0
    _m: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _v: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def next_step(self) -> None:
        """Starts a new optimisation step (call once per batch, before the updates of that batch)."""
        self.steps += 1

    def _moments(self, name: str, param: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if name not in self._m:
            self._m[name] = np.zeros_like(param, dtype=np.float32)
            self._v[name] = np.zeros_like(param, dtype=np.float32)
        return self._m[name], self._v[name]

    def _rate(self) -> float:
        if self.steps < 1:
            raise RuntimeError("Adam.next_step() must be called before the first update")
        return self.lr * np.sqrt(1.0 - self.beta2**self.steps) / (1.0 - self.beta1**self.steps)

    def step(self, name: str, param: np.ndarray, grad: np.ndarray) -> None:
        """Updates all of `param` in place."""
        m, v = self._moments(name, param)
        m *= self.beta1
        m += (1.0 - self.beta1) * grad
        v *= self.beta2
        v += (1.0 - self.beta2) * grad * grad
        param -= (self._rate() * m / (np.sqrt(v) + self.eps)).astype(np.float32)

    def step_rows(self, name: str, param: np.ndarray, rows: np.ndarray, grad: np.ndarray) -> None:
        """Updates rows `rows` (unique) of `param` in place with their gradients `grad` [len(rows), ...]."""
        m, v = self._moments(name, param)
        m_rows = self.beta1 * m[rows] + (1.0 - self.beta1) * grad
        v_rows = self.beta2 * v[rows] + (1.0 - self.beta2) * grad * grad
        m[rows], v[rows] = m_rows, v_rows
        param[rows] -= (self._rate() * m_rows / (np.sqrt(v_rows) + self.eps)).astype(np.float32)
