"""DeepFM training on Criteo-format data (what the `train-deepfm` command runs).

The model is `deepfm.forward` (k factors and a first-order weight per table row, `log(1 + max(x, 0))` on the raw
dense features, FM + MLP). Training minimises the mean binary cross-entropy with Adam: the MLP, `w0` and the
dense weights by dense Adam steps, the embedding rows by row-wise ("lazy") Adam steps on the rows a batch
touches. Gradients are written out by hand (`loss_and_gradients`) and tested against finite differences of the
float64 reference. Each field gets its own table, with the rows of its `Vocabulary` (row 0: rare or unknown
values).

**Choosing the epoch** (models/README.md, "Choosing the DeepFM settings"): with a validation split
(`TrainConfig.validation_share` > 0: the last rows of the training data, kept out of training and out of the
vocabulary), every epoch is scored on it, the run keeps the parameters of the epoch with the lowest validation log
loss (the training objective, and the measure of the probabilities a client reads; AUC is recorded beside it), and
stops once `patience` epochs in a row have not lowered it. The held-out rows (`--test`, or the end of the file) are
never used to choose: they measure the kept epoch. Without a validation split, every epoch runs and the last one is
kept.

A run directory holds what `export` and `quantize` need and what the run measured:

| file | contents |
| --- | --- |
| `deepfm.safetensors` | float32 parameters: `table.<field>` [rows, k + 1], `bias` [1], `dense_weights` [13], |
|                      | `mlp.<i>.weight` [in, out], `mlp.<i>.bias` [out]; metadata `field_tables` |
| `vocabulary.json` | the categorical value → id mapping (`criteo.Vocabulary`) |
| `calibration.npz` | `ids` int64 [S, 26], `dense` float32 [S, 13]: rows drawn uniformly from the training data |
| `heldout.npz` | `ids`, `dense`, `labels` of the held-out rows, mapped through the vocabulary |
| `training.json` | data, configuration, per-epoch loss, validation and held-out AUC / log loss, the kept epoch |
|                 | and why (`selection`), wall time |
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from . import criteo, deepfm, files
from .deepfm import DeepFMParams, Layer
from .metrics import auc, log_loss
from .optim import Adam, report_steps
from .progress import Progress

RUN_TENSORS = "deepfm.safetensors"
RUN_JSON = "training.json"
VOCABULARY = "vocabulary.json"
CALIBRATION = "calibration.npz"
HELDOUT = "heldout.npz"
# Fewer Adam steps in a run than this draws a warning (models/README.md, "Choosing the DeepFM settings"). The demo's
# 500,000 rows in batches of 1,024 take 489 steps an epoch, and its first epoch already reaches its best held-out
# AUC; 8,000 real Criteo rows took 14 in 2 epochs, for a held-out AUC of 0.707 where 8 epochs reached 0.7375
# (issue 33).
FEW_STEPS = 300


@dataclass(frozen=True)
class TrainConfig:
    factors: int = 16
    hidden: tuple[int, ...] = (400, 400, 400)
    epochs: int = 2
    batch: int = 1024
    lr: float = 1e-3
    l2: float = 1e-6  # on the embedding rows a batch reads, per row, as weight decay
    min_count: int = 10
    seed: int = 20261130
    calibration_rows: int = 4096
    # The last share of the training rows kept out of training to choose the epoch (see the module documentation);
    # 0 trains on every row and keeps the last epoch. 0 here, so that programs that train with their own settings
    # (the demo, the Gowalla ranker) keep what they had; the `train-deepfm` command's default is 0.1.
    validation_share: float = 0.0
    patience: int = 2  # epochs in a row without a lower validation log loss before training stops


@dataclass(frozen=True)
class Dataset:
    """Rows in id space: `ids` int64 [B, F] in field order, `dense` float32 [B, N] raw, `labels` int8 [B]."""

    ids: np.ndarray
    dense: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, rows: np.ndarray | slice) -> Dataset:
        return Dataset(self.ids[rows], self.dense[rows], self.labels[rows])

    def save(self, path: Path) -> None:
        np.savez(path, ids=self.ids, dense=self.dense, labels=self.labels)
        files.finish(path)

    @staticmethod
    def load(path: Path) -> Dataset:
        with np.load(path) as f:
            return Dataset(f["ids"].astype(np.int64), f["dense"].astype(np.float32), f["labels"].astype(np.int8))


# --- the model in float32, with hand-written gradients -------------------------------------------------------


@dataclass
class Forward:
    """What the backward pass needs from a forward pass."""

    emb: np.ndarray  # [B, F, D]
    x: np.ndarray  # [B, N]
    activations: list[np.ndarray]  # MLP inputs, layer by layer
    pre_activations: list[np.ndarray]
    logit: np.ndarray  # [B]


def forward32(params: DeepFMParams, ids: np.ndarray, dense: np.ndarray) -> Forward:
    """The forward pass in float32 on ids (valid rows) instead of gathered rows."""
    k = params.factors
    emb = np.stack([params.tables[t][ids[:, f]] for f, t in enumerate(params.field_tables)], axis=1)
    x = deepfm.transform_dense(params, dense)  # log(1 + max(x, 0)) for a model without dense transforms
    v = emb[:, :, :k]
    sum_v = v.sum(axis=1)
    fm = np.float32(0.5) * (sum_v * sum_v - (v * v).sum(axis=1)).sum(axis=1)
    h = np.concatenate([v.reshape(len(ids), -1), x], axis=1)
    activations, pre = [], []
    for i, layer in enumerate(params.layers):
        activations.append(h)
        a = h @ layer.weight + layer.bias
        pre.append(a)
        h = np.maximum(a, np.float32(0)) if i < len(params.layers) - 1 else a
    logit = params.bias + emb[:, :, k].sum(axis=1) + x @ params.dense_weights + fm + h[:, 0]
    return Forward(emb, x, activations, pre, logit)


def probabilities(params: DeepFMParams, data: Dataset, batch: int = 8192) -> np.ndarray:
    """float64 click probabilities of every row."""
    out = []
    for start in range(0, len(data), batch):
        logit = forward32(params, data.ids[start : start + batch], data.dense[start : start + batch]).logit
        out.append(1.0 / (1.0 + np.exp(-logit.astype(np.float64))))
    return np.concatenate(out)


@dataclass
class Gradients:
    bias: np.float32
    dense_weights: np.ndarray
    layers: list[tuple[np.ndarray, np.ndarray]]
    rows: dict[str, tuple[np.ndarray, np.ndarray]]  # table -> (unique rows, their gradients)


def loss_and_gradients(
    params: DeepFMParams, ids: np.ndarray, dense: np.ndarray, labels: np.ndarray
) -> tuple[float, Gradients]:
    """Mean binary cross-entropy of a batch and its gradients."""
    fwd = forward32(params, ids, dense)
    b, k = len(ids), params.factors
    y = labels.astype(np.float32)
    z = fwd.logit
    loss = float(np.mean(np.logaddexp(0.0, z.astype(np.float64)) - y * z.astype(np.float64)))
    dz = ((1.0 / (1.0 + np.exp(-z))) - y) / np.float32(b)  # [B]

    layers: list[tuple[np.ndarray, np.ndarray]] = []
    upstream = dz[:, None]
    for i in range(len(params.layers) - 1, -1, -1):
        layers.append((fwd.activations[i].T @ upstream, upstream.sum(axis=0)))
        upstream = upstream @ params.layers[i].weight.T
        if i > 0:
            upstream = upstream * (fwd.pre_activations[i - 1] > 0)
    layers.reverse()
    fields = params.num_fields
    d_emb = np.empty_like(fwd.emb)
    v = fwd.emb[:, :, :k]
    d_emb[:, :, :k] = upstream[:, : fields * k].reshape(b, fields, k) + dz[:, None, None] * (
        v.sum(axis=1)[:, None, :] - v
    )
    d_emb[:, :, k] = dz[:, None]

    rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for table in dict.fromkeys(params.field_tables):
        fs = [f for f, t in enumerate(params.field_tables) if t == table]
        table_ids = ids[:, fs].ravel()
        table_grads = d_emb[:, fs, :].reshape(-1, params.dim)
        unique, inverse = np.unique(table_ids, return_inverse=True)
        summed = np.zeros((len(unique), params.dim), dtype=np.float32)
        np.add.at(summed, inverse.ravel(), table_grads)
        rows[table] = (unique, summed)
    return loss, Gradients(np.float32(dz.sum()), fwd.x.T @ dz, layers, rows)


# --- training ------------------------------------------------------------------------------------------------


def initial_params(
    rng: np.random.Generator, rows: dict[str, int], config: TrainConfig, positive_rate: float
) -> DeepFMParams:
    """Small factors (N(0, 0.01²)), zero first-order weights, He-initialised MLP, and `w0` at the logit of the
    training data's positive rate."""
    params = deepfm.init_params(
        rng,
        rows,
        list(rows),
        factors=config.factors,
        num_dense=len(criteo.DENSE_FEATURES),
        hidden=config.hidden,
        factor_std=0.01,
        linear_std=0.0,
        dense_std=0.0,
        bias_mean=0.0,
    )
    rate = min(max(positive_rate, 1e-4), 1 - 1e-4)
    return DeepFMParams(
        tables=params.tables,
        field_tables=params.field_tables,
        bias=np.float32(np.log(rate / (1 - rate))),
        dense_weights=params.dense_weights,
        layers=params.layers,
    )


def evaluate(params: DeepFMParams, data: Dataset) -> dict[str, float]:
    p = probabilities(params, data)
    return {"auc": auc(data.labels, p), "log_loss": log_loss(data.labels, p)}


def steps_per_epoch(rows: int, config: TrainConfig) -> int:
    """Adam steps in one epoch: one per batch of training rows (the last batch may be short)."""
    return -(-rows // config.batch)


def kept_epoch(history: list[dict[str, float]]) -> int:
    """The epoch whose parameters a run keeps: the first with the lowest validation log loss (a NaN counting as
    the highest), or the last epoch when there was no validation."""
    scored = [h for h in history if "validation_log_loss" in h]
    if not scored:
        return int(history[-1]["epoch"])
    best = min(scored, key=lambda h: (np.isnan(h["validation_log_loss"]), h["validation_log_loss"]))
    return int(best["epoch"])


def _copy(params: DeepFMParams) -> DeepFMParams:
    return DeepFMParams(
        {name: table.copy() for name, table in params.tables.items()},
        params.field_tables,
        np.float32(params.bias),
        params.dense_weights.copy(),
        tuple(Layer(layer.weight.copy(), layer.bias.copy()) for layer in params.layers),
    )


def train(
    params: DeepFMParams,
    data: Dataset,
    config: TrainConfig,
    *,
    heldout: Dataset | None = None,
    validation: Dataset | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[DeepFMParams, list[dict[str, float]], float]:
    """Trains in place (the tables and layers of `params` are updated); returns the parameters to keep, one record
    per epoch run, and the training seconds (evaluation excluded).

    With `validation`, every epoch is scored on it, the parameters returned are a copy of those of `kept_epoch`,
    and training stops once `config.patience` epochs in a row have not lowered the validation log loss. Without
    it, every epoch runs and the parameters returned are the last epoch's. `heldout` is only measured."""
    rng = np.random.default_rng([config.seed, 1])
    tables = {name: table for name, table in params.tables.items()}
    bias = np.array([params.bias], dtype=np.float32)
    dense_weights = params.dense_weights
    weights = [layer.weight for layer in params.layers]
    biases = [layer.bias for layer in params.layers]
    adam = Adam(lr=config.lr)
    history: list[dict[str, float]] = []
    kept: DeepFMParams | None = None
    seconds = 0.0
    per_epoch = steps_per_epoch(len(data), config)
    steps = Progress("steps", per_epoch * config.epochs, progress)
    for epoch in range(1, config.epochs + 1):
        started = time.perf_counter()
        order = rng.permutation(len(data))
        loss_sum = 0.0
        for step, start in enumerate(range(0, len(data), config.batch), start=1):
            pick = np.sort(order[start : start + config.batch])
            current = DeepFMParams(tables, params.field_tables, bias[0], dense_weights, params.layers)
            loss, grads = loss_and_gradients(current, data.ids[pick], data.dense[pick], data.labels[pick])
            loss_sum += loss * len(pick)
            adam.next_step()
            adam.step("bias", bias, np.array([grads.bias], dtype=np.float32))
            adam.step("dense_weights", dense_weights, grads.dense_weights)
            for i, (dw, db) in enumerate(grads.layers):
                adam.step(f"mlp.{i}.weight", weights[i], dw)
                adam.step(f"mlp.{i}.bias", biases[i], db)
            for name, (rows, g) in grads.rows.items():
                if config.l2:
                    g = g + np.float32(config.l2) * tables[name][rows]
                adam.step_rows(f"table.{name}", tables[name], rows, g)
            seen = min(start + config.batch, len(data))
            steps.advance(note=f"epoch {epoch}/{config.epochs}, step {step}/{per_epoch}, loss {loss_sum / seen:.4f}")
        seconds += time.perf_counter() - started
        record: dict[str, float] = {"epoch": epoch, "train_log_loss": loss_sum / len(data), "seconds": seconds}
        current = DeepFMParams(tables, params.field_tables, bias[0], dense_weights, params.layers)
        measured = []
        for name, label, rows in (("validation", "validation", validation), ("heldout", "held-out", heldout)):
            if rows is not None:
                metrics = evaluate(current, rows)
                record |= {f"{name}_auc": metrics["auc"], f"{name}_log_loss": metrics["log_loss"]}
                measured.append(f"{label} AUC {metrics['auc']:.4f}, log loss {metrics['log_loss']:.4f}")
        if measured:
            progress(f"epoch {epoch}: {'; '.join(measured)}")
        history.append(record)
        if validation is None:
            continue
        best = kept_epoch(history)
        if best == epoch:
            kept = _copy(current)
        elif epoch - best >= config.patience:
            progress(f"stopping after epoch {epoch}: {epoch - best} epochs without a lower validation log loss")
            break
    if kept is not None:
        return kept, history, seconds
    return DeepFMParams(tables, params.field_tables, bias[0], dense_weights, params.layers), history, seconds


# --- the run directory ---------------------------------------------------------------------------------------


def save_params(params: DeepFMParams, path: Path) -> None:
    tensors = {f"table.{name}": table for name, table in params.tables.items()}
    tensors |= {"bias": np.array([params.bias], dtype=np.float32), "dense_weights": params.dense_weights}
    for i, layer in enumerate(params.layers):
        tensors[f"mlp.{i}.weight"] = layer.weight
        tensors[f"mlp.{i}.bias"] = layer.bias
    save_file(tensors, str(path), metadata={"field_tables": json.dumps(list(params.field_tables))})
    files.finish(path)


def load_params(path: Path) -> DeepFMParams:
    with safe_open(str(path), framework="numpy") as f:
        field_tables = tuple(json.loads((f.metadata() or {})["field_tables"]))
    tensors = load_file(str(path))
    layers = []
    while f"mlp.{len(layers)}.weight" in tensors:
        i = len(layers)
        layers.append(Layer(tensors[f"mlp.{i}.weight"], tensors[f"mlp.{i}.bias"]))
    tables = {name[len("table.") :]: t for name, t in tensors.items() if name.startswith("table.")}
    return DeepFMParams(tables, field_tables, np.float32(tensors["bias"][0]), tensors["dense_weights"], tuple(layers))


@dataclass(frozen=True)
class DeepFMRun:
    params: DeepFMParams
    vocabulary: criteo.Vocabulary
    info: dict
    directory: Path

    @staticmethod
    def load(directory: Path) -> DeepFMRun:
        info = json.loads((directory / RUN_JSON).read_text(encoding="utf-8"))
        if info.get("kind") != "deepfm":
            raise ValueError(f"{directory / RUN_JSON}: not a deepfm training run")
        vocabulary = criteo.Vocabulary.from_json((directory / VOCABULARY).read_text(encoding="utf-8"))
        return DeepFMRun(load_params(directory / RUN_TENSORS), vocabulary, info, directory)


def _selection(history: list[dict[str, float]], config: TrainConfig, validated: bool) -> dict:
    """training.json's `selection`: which epoch the run kept, and why."""
    kept = kept_epoch(history)
    ran = len(history)
    stopped = ran < config.epochs
    if not validated:
        reason = f"kept the last epoch ({kept}): no validation split (--validation-share 0)"
    else:
        reason = (
            f"kept epoch {kept} of {ran}: the lowest validation log loss "
            f"({history[kept - 1]['validation_log_loss']:.4f}); "
            + (
                f"stopped after {ran - kept} epochs without a lower one (--patience {config.patience})"
                if stopped
                else f"all {config.epochs} epochs ran"
            )
        )
    return {
        "metric": "validation_log_loss" if validated else None,
        "kept_epoch": kept,
        "epochs_run": ran,
        "stopped_early": stopped,
        "reason": reason,
    }


def run_training(
    train_path: Path,
    out: Path,
    config: TrainConfig,
    *,
    test_path: Path | None = None,
    holdout: float = 0.1,
    max_rows: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> DeepFMRun:
    """Reads the data, builds the vocabulary on the training rows, trains, evaluates, writes the run directory.

    The rows of `train_path`, in order: those trained on, then the validation rows (the last
    `config.validation_share` of the rows before the held-out ones), then, without `test_path`, the held-out rows
    (the last `holdout` of the file)."""
    if progress is None:

        def progress(message: str) -> None:
            print(f"train-deepfm: {message}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    raw = criteo.read(train_path, max_rows)
    progress(f"read {len(raw.labels)} rows from {train_path} ({time.perf_counter() - started:.0f} s)")
    total = len(raw.labels)
    if test_path is None:
        heldout_start = total - round(total * holdout)
        if heldout_start <= 0 or heldout_start >= total:
            raise SystemExit(f"--holdout {holdout} leaves no training or no held-out rows of {total}")
        heldout_raw = None
    else:
        heldout_start = total
        heldout_raw = criteo.read(test_path)
    fit_end = heldout_start - round(heldout_start * config.validation_share)
    if fit_end <= 0 or (config.validation_share > 0 and fit_end >= heldout_start):
        raise SystemExit(
            f"--validation-share {config.validation_share} leaves no training or no validation rows of the "
            f"{heldout_start} training rows"
        )
    fit_rows = slice(0, fit_end)
    train_only = criteo.RawData(
        raw.labels[fit_rows],
        raw.dense[fit_rows],
        raw.codes[fit_rows],
        raw.values,
        [np.bincount(raw.codes[fit_rows, c], minlength=len(raw.values[c])) for c in range(raw.codes.shape[1])],
    )
    vocabulary = criteo.Vocabulary.build(train_only, config.min_count)
    ids = vocabulary.ids(raw)
    all_rows = Dataset(ids, raw.dense, raw.labels)
    data = all_rows.take(fit_rows)
    validation = all_rows.take(slice(fit_end, heldout_start)) if fit_end < heldout_start else None
    if validation is not None and len(np.unique(validation.labels)) < 2:
        raise SystemExit(
            f"the {len(validation)} validation rows hold only one label: raise --validation-share "
            f"(now {config.validation_share})"
        )
    if heldout_raw is None:
        heldout = all_rows.take(slice(heldout_start, total))
    else:
        heldout = Dataset(vocabulary.ids(heldout_raw), heldout_raw.dense, heldout_raw.labels)
    rows = {name: vocabulary.rows(name) for name in criteo.CATEGORICAL_FIELDS}
    validation_rows = 0 if validation is None else len(validation)
    progress(
        f"{len(data)} training rows, {validation_rows} validation rows, {len(heldout)} held-out rows, "
        f"{sum(rows.values())} table rows in all"
    )
    report_steps(
        progress, config.batch, steps_per_epoch(len(data), config), config.epochs, fewest=FEW_STEPS, model="DeepFM",
        guide="models/README.md, 'Choosing the DeepFM settings'",
    )  # fmt: skip

    rng = np.random.default_rng([config.seed, 0])
    params = initial_params(rng, rows, config, float(data.labels.mean()))
    params, history, seconds = train(params, data, config, heldout=heldout, validation=validation, progress=progress)
    kept = history[kept_epoch(history) - 1]
    selection = _selection(history, config, validation is not None)
    progress(selection["reason"])

    files.mkdir(out, exist_ok=True)
    save_params(params, out / RUN_TENSORS)
    files.write_text(out / VOCABULARY, vocabulary.to_json(), encoding="utf-8")
    calibration = rng.choice(len(data), min(config.calibration_rows, len(data)), replace=False)
    np.savez(out / CALIBRATION, ids=data.ids[np.sort(calibration)], dense=data.dense[np.sort(calibration)])
    files.finish(out / CALIBRATION)
    heldout.save(out / HELDOUT)
    info = {
        "kind": "deepfm",
        "data": {
            "train": str(train_path.resolve()),
            "test": str(test_path.resolve()) if test_path else f"last {holdout:.0%} of the training file",
            "train_rows": len(data),
            "heldout_rows": len(heldout),
            "validation": f"the last {config.validation_share:.0%} of the training rows" if validation_rows else "none",
            "validation_rows": validation_rows,
            "train_positive_rate": float(data.labels.mean()),
            "heldout_positive_rate": float(heldout.labels.mean()),
            "table_rows": rows,
        },
        "config": asdict(config),
        "epochs": len(history),
        "train_seconds": seconds,
        "history": history,
        "selection": selection,
        "heldout": {"auc": kept["heldout_auc"], "log_loss": kept["heldout_log_loss"]},
    }
    files.write_text(out / RUN_JSON, json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return DeepFMRun(params, vocabulary, info, out)
