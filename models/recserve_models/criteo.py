"""Criteo Display Advertising data: the reader, the vocabulary, and a synthetic generator of the same format.

**Format** (the Kaggle and Terabyte releases): one example per line, 40 tab-separated columns: the label
(0 or 1), 13 integer features I1..I13, 26 categorical features C1..C26 (hashed values, 8 hex digits in the
real data; any string without tabs is accepted here). An empty column is a missing value. `.gz` files are read
transparently.

**Reading** (`read`): integer features become float32 with missing read as 0 (the dense input of the served
model is raw: the graph applies `log(1 + max(x, 0))`, so a client sends 0 for a missing count, and negative
values such as I2's -1 are clipped there). Categorical values become per-field ids through a `Vocabulary`:
`id 0` is the shared "rare or unknown" row, values seen at least `min_count` times in the training data get ids
1, 2, ... in order of decreasing count (ties by value), and a missing value is a value like any other (the
empty string), since being missing is itself informative in Criteo. The served tables use `oov = "default"`
with `default_row = 0`, so an id the table does not know reads the trained rare-value row, as in training.

**Generating** (`generate`): rows with the same columns, drawn from a seeded process that is a pure function of
(`seed`, split, row index):

- Categorical field `f` draws a latent rank `r` in `[0, V_f)` from a truncated Zipf law `P(r) ∝ (r + 1)^(-s)`
  (continuous inverse-CDF sampling), and writes it as 8 hex digits of a 32-bit hash of (`seed`, `f`, `r`), so
  the file looks like Criteo (popular values are not small numbers, and hash collisions happen as in the real
  data). `V_f` is the Kaggle release's cardinality of field `f` times `vocab_scale`, capped at `max_vocab`.
  A field is missing with its own probability (`CATEGORICAL_MISSING`, modelled on the Kaggle data).
- Integer feature `n` is `floor(exp(N(μ_n, σ_n²)))` with a share of exact zeros, I2 is sometimes -1, -2 or -3,
  and each is missing with its own probability (`DENSE_MISSING`).
- The label is drawn from a hidden teacher: `P(click) = sigmoid(b + Σ_f w_f(r_f) + Σ_{f<g} <t_f(r_f), t_g(r_g)>
  + Σ_n β_n x_n + MLP_teacher(x, first-order sums))` with `x_n = log(1 + max(I_n, 0))` (a missing value is 0),
  `w_f`, `t_f` (`teacher_factors` wide) hashed per (`seed`, `f`, `r`) so that no table of size `V_f` is ever
  stored, a missing categorical value contributing nothing, and `b` chosen so that about `positive_rate` of the
  labels are 1. The teacher's own probabilities give the best AUC any model can reach on the data
  (`teacher_auc` reports it), which is what makes a trained model's AUC meaningful.
"""

from __future__ import annotations

import gzip
import io
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import files
from .metrics import auc, log_loss

DENSE_FEATURES = tuple(f"I{i}" for i in range(1, 14))
CATEGORICAL_FIELDS = tuple(f"C{i}" for i in range(1, 27))
COLUMNS = 1 + len(DENSE_FEATURES) + len(CATEGORICAL_FIELDS)

# Distinct values per categorical field in the Criteo Kaggle release (as used by DLRM's Kaggle configuration).
KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
# Share of missing values per field, rounded, modelled on the Kaggle training data.
DENSE_MISSING = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22)
CATEGORICAL_MISSING = (
    0.0, 0.0, 0.03, 0.03, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.03, 0.0,
    0.0, 0.0, 0.03, 0.0, 0.0, 0.44, 0.44, 0.0, 0.0, 0.0, 0.03, 0.44, 0.44,
)  # fmt: skip
# log-normal parameters (mu, sigma) and share of exact zeros of each integer feature
DENSE_SHAPE = (
    (0.5, 1.2, 0.3), (2.0, 2.0, 0.1), (1.5, 1.5, 0.1), (1.5, 1.0, 0.05), (7.0, 2.0, 0.05), (4.0, 1.5, 0.1),
    (1.5, 1.5, 0.2), (2.5, 1.2, 0.05), (4.0, 1.5, 0.05), (0.3, 0.8, 0.4), (1.0, 1.0, 0.2), (0.5, 1.0, 0.6),
    (1.5, 1.2, 0.1),
)  # fmt: skip

CHUNK_ROWS = 65_536  # the generator's unit of seeding: any chunk can be produced on its own
_SPLITS = {"train": 1, "test": 2, "calibration": 3}


class CriteoError(ValueError):
    """A file that breaks the Criteo format; the message names the file and the line."""


@dataclass(frozen=True)
class GeneratorConfig:
    """Parameters of the synthetic Criteo generator (see the module documentation)."""

    seed: int = 20261130
    vocab_scale: float = 1.0  # multiplies the Kaggle cardinalities
    max_vocab: int = 1_000_000  # caps every field's latent vocabulary
    zipf: float = 1.2  # exponent s of P(r) ∝ (r + 1)^(-s)
    teacher_factors: int = 4
    first_order_std: float = 0.2  # of w_f, before the per-field importance
    factor_std: float = 0.15  # of t_f, before the per-field importance
    dense_std: float = 0.15  # of β_n
    teacher_hidden: int = 16
    positive_rate: float = 0.25

    def vocab_sizes(self) -> tuple[int, ...]:
        return tuple(max(1, min(self.max_vocab, round(c * self.vocab_scale))) for c in KAGGLE_CARDINALITIES)


# --- hashing: reproducible pseudo-random values as a pure function of integer keys --------------------------


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64 arrays (wrapping arithmetic)."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _key(seed: int, *parts: int | np.ndarray) -> np.ndarray:
    key = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    for part in parts:
        key = _mix(key ^ np.asarray(part, dtype=np.int64).astype(np.uint64))
    return key


def _uniform(seed: int, *parts: int | np.ndarray) -> np.ndarray:
    """Uniform in (0, 1), one per element of the broadcast parts."""
    return ((_key(seed, *parts) >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def _normal(seed: int, *parts: int | np.ndarray) -> np.ndarray:
    u1, u2 = _uniform(seed, *parts, 0), _uniform(seed, *parts, 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


# --- the hidden teacher --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Teacher:
    config: GeneratorConfig
    field_weight: np.ndarray  # [26] importance of each field's first-order term
    field_factor: np.ndarray  # [26] importance of each field's factors
    dense_weight: np.ndarray  # [13] β
    mlp_in: np.ndarray  # [13 + 4, H]
    mlp_bias: np.ndarray  # [H]
    mlp_out: np.ndarray  # [H]
    bias: float

    def first_order(self, f: int, ranks: np.ndarray) -> np.ndarray:
        """w_f of each rank (0 for a missing value, rank -1)."""
        unique, inverse = np.unique(ranks, return_inverse=True)
        w = _normal(self.config.seed, 101, f, unique) * self.config.first_order_std * self.field_weight[f]
        return np.where(unique >= 0, w, 0.0)[inverse.ravel()]

    def factors(self, f: int, ranks: np.ndarray) -> np.ndarray:
        """t_f of each rank, [len(ranks), teacher_factors] (zeros for a missing value)."""
        unique, inverse = np.unique(ranks, return_inverse=True)
        t = np.stack([_normal(self.config.seed, 202, f, unique, j) for j in range(self.config.teacher_factors)], 1)
        t *= self.config.factor_std * self.field_factor[f]
        return np.where((unique >= 0)[:, None], t, 0.0)[inverse.ravel()]

    def logit(self, ranks: np.ndarray, dense: np.ndarray, bias: float | None = None) -> np.ndarray:
        """`ranks` int64 [B, 26] (-1: missing), `dense` float [B, 13] with missing as 0."""
        x = np.log1p(np.maximum(dense.astype(np.float64), 0.0))
        first = np.stack([self.first_order(f, ranks[:, f]) for f in range(ranks.shape[1])], 1)  # [B, 26]
        t = np.stack([self.factors(f, ranks[:, f]) for f in range(ranks.shape[1])], 1)  # [B, 26, T]
        pairwise = 0.5 * ((t.sum(1) ** 2) - (t**2).sum(1)).sum(1)
        # The teacher's MLP sees the dense features and four sums of first-order terms (fields C1-C7,
        # C8-C13, C14-C20, C21-C26): a non-linear signal that the FM part alone cannot express.
        summaries = np.stack([first[:, a:b].sum(1) for a, b in ((0, 7), (7, 13), (13, 20), (20, 26))], 1)
        hidden = np.maximum(np.concatenate([x / 4.0, summaries], 1) @ self.mlp_in + self.mlp_bias, 0.0)
        b = self.bias if bias is None else bias
        return b + first.sum(1) + pairwise + x @ self.dense_weight + hidden @ self.mlp_out


def _teacher(config: GeneratorConfig) -> _Teacher:
    rng = np.random.default_rng([config.seed, 7])
    fields, dense = len(CATEGORICAL_FIELDS), len(DENSE_FEATURES)
    h = config.teacher_hidden
    teacher = _Teacher(
        config=config,
        field_weight=rng.uniform(0.2, 1.5, fields),
        field_factor=rng.uniform(0.2, 1.2, fields),
        dense_weight=rng.normal(0.0, config.dense_std, dense),
        mlp_in=rng.normal(0.0, 1.0, (dense + 4, h)) / np.sqrt(dense + 4) * 2.0,
        mlp_bias=rng.normal(0.0, 0.5, h),
        mlp_out=rng.normal(0.0, 1.0, h) / np.sqrt(h) * 1.5,
        bias=0.0,
    )
    # Choose b so that the mean click probability is `positive_rate` on a sample of the data.
    ranks, values = _draw(config, "calibration", 0, 20_000)
    base = teacher.logit(ranks, np.where(np.isnan(values), 0.0, values), bias=0.0)
    low, high = -20.0, 20.0
    for _ in range(60):
        mid = (low + high) / 2
        if np.mean(1.0 / (1.0 + np.exp(-(base + mid)))) < config.positive_rate:
            low = mid
        else:
            high = mid
    return _Teacher(**{**teacher.__dict__, "bias": (low + high) / 2})


# --- generation ------------------------------------------------------------------------------------------------


def zipf_ranks(u: np.ndarray, vocab: int, s: float) -> np.ndarray:
    """Inverse CDF of the continuous law with density ∝ (x + 1)^(-s) on [0, vocab), floored."""
    top = (vocab + 1.0) ** (1.0 - s) - 1.0
    x = (1.0 + u * top) ** (1.0 / (1.0 - s)) - 1.0
    return np.clip(np.floor(x), 0, vocab - 1).astype(np.int64)


def _draw(config: GeneratorConfig, split: str, chunk: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Latent ranks [rows, 26] (-1: missing) and integer features [rows, 13] (NaN: missing) of one chunk."""
    rng = np.random.default_rng([config.seed, _SPLITS[split], chunk])
    ranks = np.empty((rows, len(CATEGORICAL_FIELDS)), dtype=np.int64)
    for f, vocab in enumerate(config.vocab_sizes()):
        r = zipf_ranks(rng.random(rows), vocab, config.zipf)
        ranks[:, f] = np.where(rng.random(rows) < CATEGORICAL_MISSING[f], -1, r)
    dense = np.empty((rows, len(DENSE_FEATURES)), dtype=np.float64)
    for n, (mu, sigma, zeros) in enumerate(DENSE_SHAPE):
        values = np.floor(np.exp(rng.normal(mu, sigma, rows)))
        values[rng.random(rows) < zeros] = 0.0
        if DENSE_FEATURES[n] == "I2":
            values = np.where(rng.random(rows) < 0.1, -rng.integers(1, 4, rows), values)
        values[rng.random(rows) < DENSE_MISSING[n]] = np.nan
        dense[:, n] = values
    return ranks, dense


def hashed_values(config: GeneratorConfig, f: int, ranks: np.ndarray) -> np.ndarray:
    """The 32-bit hash that stands for latent rank `ranks` of field `f` (as uint32)."""
    unique, inverse = np.unique(ranks, return_inverse=True)
    return (_key(config.seed, 303, f, unique) >> np.uint64(32)).astype(np.uint32)[inverse.ravel()]


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _hex8(values: np.ndarray) -> np.ndarray:
    """uint32 values as 8 lower-case hex digits (a numpy str array)."""
    nibbles = (values.astype(np.uint32)[:, None] >> np.arange(28, -1, -4, dtype=np.uint32)) & np.uint32(15)
    return np.ascontiguousarray(_HEX[nibbles]).view("S8").ravel().astype("U8")


@dataclass(frozen=True)
class Chunk:
    """Generated rows: labels, raw columns as written to the file, and the teacher's click probabilities."""

    labels: np.ndarray  # int8 [B]
    dense: np.ndarray  # float64 [B, 13], NaN = missing
    hashes: np.ndarray  # uint32 [B, 26]
    missing: np.ndarray  # bool [B, 26]
    teacher_probability: np.ndarray  # float64 [B]


class Generator:
    """The synthetic Criteo process for one `GeneratorConfig`."""

    def __init__(self, config: GeneratorConfig) -> None:
        self.config = config
        self.teacher = _teacher(config)

    def chunk(self, split: str, index: int, rows: int = CHUNK_ROWS) -> Chunk:
        ranks, dense = _draw(self.config, split, index, rows)
        logit = self.teacher.logit(ranks, np.where(np.isnan(dense), 0.0, dense))
        probability = 1.0 / (1.0 + np.exp(-logit))
        rng = np.random.default_rng([self.config.seed, _SPLITS[split], index, 99])
        labels = (rng.random(rows) < probability).astype(np.int8)
        hashes = np.stack([hashed_values(self.config, f, ranks[:, f]) for f in range(ranks.shape[1])], 1)
        return Chunk(labels, dense, hashes, ranks < 0, probability)

    def rows(self, split: str, count: int) -> Iterator[Chunk]:
        """The first `count` rows of a split, chunk by chunk: full chunks of `CHUNK_ROWS`, then a shorter one (whose
        rows depend on its length, so only prefixes made of whole chunks are shared between counts)."""
        for index, start in enumerate(range(0, count, CHUNK_ROWS)):
            yield self.chunk(split, index, min(CHUNK_ROWS, count - start))


def format_chunk(chunk: Chunk) -> str:
    """The chunk's rows as Criteo TSV lines (with a final newline)."""
    columns: list[list[str]] = [chunk.labels.astype(str).tolist()]
    for n in range(chunk.dense.shape[1]):
        v = chunk.dense[:, n]
        text = np.where(np.isnan(v), 0, v).astype(np.int64).astype(str)
        columns.append(np.where(np.isnan(v), "", text).tolist())
    for f in range(chunk.hashes.shape[1]):
        columns.append(np.where(chunk.missing[:, f], "", _hex8(chunk.hashes[:, f])).tolist())
    return "".join("\t".join(row) + "\n" for row in zip(*columns, strict=True))


def write(generator: Generator, split: str, rows: int, path: Path) -> dict[str, float]:
    """Writes `rows` rows of `split` to `path` (gzip when it ends in .gz); returns their label statistics and the
    teacher's AUC on them."""
    labels, probabilities = [], []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="ascii", newline="") as out:
        for chunk in generator.rows(split, rows):
            out.write(format_chunk(chunk))
            labels.append(chunk.labels)
            probabilities.append(chunk.teacher_probability)
    files.finish(path)
    y, p = np.concatenate(labels), np.concatenate(probabilities)
    return {
        "rows": rows,
        "positive_rate": float(y.mean()),
        "teacher_auc": auc(y, p),
        "teacher_log_loss": log_loss(y, p),
    }


# --- reading -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawData:
    """Rows read from a Criteo file, before the vocabulary: categorical values as indices into `values[f]`."""

    labels: np.ndarray  # int8 [B]
    dense: np.ndarray  # float32 [B, 13], missing = 0
    codes: np.ndarray  # int64 [B, 26], index into values[f]
    values: list[list[str]]  # per field, distinct strings in order of first appearance
    counts: list[np.ndarray]  # per field, occurrences of each value


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="\n")
    return open(path, encoding="utf-8", newline="\n")


def read(path: Path, max_rows: int | None = None, *, chunk_rows: int = 200_000) -> RawData:
    """Reads a Criteo TSV file (see the module documentation); errors name the line."""
    labels, dense, codes = [], [], []
    values: list[list[str]] = [[] for _ in CATEGORICAL_FIELDS]
    index: list[dict[str, int]] = [{} for _ in CATEGORICAL_FIELDS]
    counts: list[Counter[int]] = [Counter() for _ in CATEGORICAL_FIELDS]
    line_number = 0
    try:
        with _open_text(path) as f:
            while max_rows is None or line_number < max_rows:
                want = chunk_rows if max_rows is None else min(chunk_rows, max_rows - line_number)
                lines = [line for _, line in zip(range(want), f, strict=False)]
                if not lines:
                    break
                rows = []
                for offset, line in enumerate(lines):
                    parts = line.rstrip("\r\n").split("\t")
                    if len(parts) != COLUMNS:
                        raise CriteoError(
                            f"{path}:{line_number + offset + 1}: has {len(parts)} tab-separated columns, "
                            f"expected {COLUMNS} (label, I1..I13, C1..C26)"
                        )
                    rows.append(parts)
                table = np.array(rows, dtype=str)
                label_text = table[:, 0]
                bad = ~np.isin(label_text, ("0", "1"))
                if bad.any():
                    at = line_number + int(np.flatnonzero(bad)[0]) + 1
                    raise CriteoError(f"{path}:{at}: the label must be 0 or 1, not {str(label_text[bad][0])!r}")
                labels.append((label_text == "1").astype(np.int8))
                ints = table[:, 1 : 1 + len(DENSE_FEATURES)]
                try:
                    dense.append(np.where(ints == "", "0", ints).astype(np.float64).astype(np.float32))
                except ValueError as e:
                    for r, row in enumerate(ints):
                        for c, text in enumerate(row):
                            try:
                                float(text or "0")
                            except ValueError:
                                raise CriteoError(
                                    f"{path}:{line_number + r + 1}: {DENSE_FEATURES[c]} = {str(text)!r} is not a number"
                                ) from e
                    raise
                chunk_codes = np.empty((len(table), len(CATEGORICAL_FIELDS)), dtype=np.int64)
                for c in range(len(CATEGORICAL_FIELDS)):
                    uniques, inverse, occurrences = np.unique(
                        table[:, 1 + len(DENSE_FEATURES) + c], return_inverse=True, return_counts=True
                    )
                    mapping = np.empty(len(uniques), dtype=np.int64)
                    for j, value in enumerate(uniques.tolist()):
                        code = index[c].get(value)
                        if code is None:
                            code = index[c][value] = len(values[c])
                            values[c].append(value)
                        mapping[j] = code
                        counts[c][code] += int(occurrences[j])
                    chunk_codes[:, c] = mapping[inverse.ravel()]
                codes.append(chunk_codes)
                line_number += len(lines)
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as e:
        raise CriteoError(f"{path}: cannot read: {e}") from e
    if line_number == 0:
        raise CriteoError(f"{path}: holds no rows")
    return RawData(
        labels=np.concatenate(labels),
        dense=np.concatenate(dense),
        codes=np.concatenate(codes),
        values=values,
        counts=[np.array([c[i] for i in range(len(v))], dtype=np.int64) for c, v in zip(counts, values, strict=True)],
    )


@dataclass(frozen=True)
class Vocabulary:
    """Per field, the values that have their own row: `values[f][j]` is id `j + 1`; everything else is id 0."""

    min_count: int
    values: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @staticmethod
    def build(raw: RawData, min_count: int) -> Vocabulary:
        values = {}
        for c, name in enumerate(CATEGORICAL_FIELDS):
            order = sorted(
                (i for i, n in enumerate(raw.counts[c]) if n >= min_count),
                key=lambda i, c=c: (-raw.counts[c][i], raw.values[c][i]),
            )
            values[name] = tuple(raw.values[c][i] for i in order)
        return Vocabulary(min_count=min_count, values=values)

    def rows(self, name: str) -> int:
        """Table rows of a field: its values plus the rare/unknown row 0."""
        return len(self.values[name]) + 1

    def ids(self, raw: RawData) -> np.ndarray:
        """int64 [B, 26] ids of raw rows (read with any vocabulary) under this vocabulary."""
        out = np.empty_like(raw.codes)
        for c, name in enumerate(CATEGORICAL_FIELDS):
            lookup = {value: i + 1 for i, value in enumerate(self.values[name])}
            mapping = np.array([lookup.get(v, 0) for v in raw.values[c]], dtype=np.int64)
            out[:, c] = mapping[raw.codes[:, c]]
        return out

    def to_json(self) -> str:
        return json.dumps({"format_version": 1, "min_count": self.min_count, "fields": self.values}) + "\n"

    @staticmethod
    def from_json(text: str) -> Vocabulary:
        doc = json.loads(text)
        return Vocabulary(min_count=doc["min_count"], values={k: tuple(v) for k, v in doc["fields"].items()})


def generator_info(config: GeneratorConfig) -> dict[str, object]:
    return asdict(config) | {"vocab_sizes": list(config.vocab_sizes())}


# --- writing a file of generated rows ---------------------------------------------------------------


def sidecar(path: Path) -> Path:
    """Where `generate` describes a file it wrote: `<file>.json`."""
    return path.with_name(path.name + ".json")


def generate(config: GeneratorConfig, split: str, rows: int, out: Path) -> dict[str, object]:
    """Writes the rows and their description (`sidecar(out)`: generator parameters, split, label statistics and
    the teacher's AUC); returns the description."""
    files.mkdir(out.parent, exist_ok=True)
    stats = write(Generator(config), split, rows, out)
    description = {"generator": generator_info(config), "split": split} | stats
    files.write_text(sidecar(out), json.dumps(description, indent=2) + "\n", encoding="utf-8")
    return description
