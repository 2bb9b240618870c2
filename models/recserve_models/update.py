"""Online row updates of a served version's `tier = "redis"` tables (`docs/model-repository.md`, "Online row
updates"): new values are written over the rows' keys, then announced on the version's update stream, which every
server serving the version follows and from which it drops the rows from its cache.

The order is what makes a server see each row either old or new: the rows are written first (`SET`, one whole
value per row, in a pipeline whose replies are all waited for), and only then announced (`XADD`), so a server that
reads the announcement and drops its cached copy fetches the new value. The stream `rs1:{M/V}:updates` keeps the
entries, so a server that reconnects reads on from the last entry it applied; it is trimmed to about `maxlen`
entries (`MAXLEN ~`). An entry's fields: `published_us` (the publisher's clock, microseconds since the Unix
epoch: the servers measure publish-to-visible from it) and, for each table, `rows:T` = the updated row ids in
decimal separated by commas. One entry names at most `ENTRY_ROWS` rows; a larger update is several entries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import model_toml
from .publish import SCHEME, PublishError, marker_key, row_key
from .quantize import quantize_rowwise_int8, to_fp16

# Rows one stream entry names at most (and one write pipeline carries): servers read entries in batches, and an
# entry of 4096 ids is ~30 KB.
ENTRY_ROWS = 4096
# Entries the stream keeps (about: MAXLEN ~ trims whole nodes of the stream). A server that was away for longer
# than this many entries drops its whole cache when it comes back.
DEFAULT_MAXLEN = 100_000


class UpdateError(PublishError):
    """An update that cannot be written; the message names the table or the option."""


def stream_key(model: str, version: int) -> str:
    """The key of a version's update stream (the server's `stream_key`)."""
    return f"{SCHEME}:{{{model}/{version}}}:updates"


@dataclass(frozen=True)
class Target:
    """A published version whose rows can be updated: its key layout and its Redis-tier tables."""

    model: str
    version: int
    groups: int
    tables: dict[str, model_toml.TableSpec]


def open_target(version_dir: Path, client) -> Target:
    """The version at `version_dir` (its `model.toml`), which must have been published to `client`'s cluster (its
    completion marker gives the key layout)."""
    version_dir = Path(version_dir)
    if not version_dir.name.isdigit() or int(version_dir.name) < 1:
        raise UpdateError(f"{version_dir}: a version directory is named by a positive integer")
    model, version = version_dir.parent.name, int(version_dir.name)
    spec = model_toml.read(version_dir / "model.toml")
    tables = {t.name: t for t in spec.tables if t.tier == "redis"}
    if not tables:
        raise UpdateError(f"{version_dir / 'model.toml'}: no table has tier = \"redis\"; nothing to update")
    marker = {_text(k): _text(v) for k, v in client.hgetall(marker_key(model, version)).items()}
    if not marker:
        raise UpdateError(
            f"{model} version {version} is not published ({marker_key(model, version)} is missing): "
            "python -m recserve_models publish it first"
        )
    for name, table in tables.items():
        if marker.get(f"rows:{name}") != str(table.rows):
            raise UpdateError(
                f"table {name!r}: the published version has rows = {marker.get(f'rows:{name}')}, "
                f"model.toml declares {table.rows}"
            )
    return Target(model, version, int(marker["groups"]), tables)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def encode_rows(table: model_toml.TableSpec, values: np.ndarray) -> np.ndarray:
    """Float32 `values` `[n, dim]` in the table's stored layout (as `export` encodes whole tables)."""
    values = np.asarray(values)
    if values.dtype != np.float32 or values.ndim != 2 or values.shape[1] != table.dim:
        raise UpdateError(
            f"table {table.name!r}: values must be float32 [n, {table.dim}], got {values.dtype} {list(values.shape)}"
        )
    if table.storage == "int8":
        return quantize_rowwise_int8(table.name, values)
    if table.storage == "fp16":
        return to_fp16(table.name, values).astype("<f2")
    return np.ascontiguousarray(values, dtype="<f4")


def _checked(target: Target, name: str, ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    table = target.tables.get(name)
    if table is None:
        raise UpdateError(
            f"table {name!r} is not a tier = \"redis\" table of {target.model} version {target.version} "
            f"(those are {sorted(target.tables)})"
        )
    ids = np.asarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise UpdateError(f"table {name!r}: row ids must be a 1-D integer array, got {ids.dtype} {list(ids.shape)}")
    if len(ids) and (ids.min() < 0 or ids.max() >= table.rows):
        bad = ids[(ids < 0) | (ids >= table.rows)][0]
        raise UpdateError(f"table {name!r}: row id {bad} is not in [0, {table.rows}) (the table's rows)")
    stored = encode_rows(table, values)
    if len(stored) != len(ids):
        raise UpdateError(f"table {name!r}: {len(ids)} row ids but {len(stored)} rows of values")
    return ids.astype(np.int64), stored


def update_rows(
    client,
    target: Target,
    rows: Mapping[str, tuple[np.ndarray, np.ndarray]],
    maxlen: int = DEFAULT_MAXLEN,
    clock: Callable[[], float] = time.time,
) -> list[str]:
    """Writes new float32 values for rows of `target` (`{table: (ids, values [n, dim])}`), then announces them;
    returns the stream entry IDs. Every table is checked before anything is written."""
    if maxlen < 1:
        raise UpdateError(f"--maxlen must be at least 1, got {maxlen}")
    checked = [(name, *_checked(target, name, ids, values)) for name, (ids, values) in rows.items()]
    stream = stream_key(target.model, target.version)
    entries = []
    # Rows go out in entries of ENTRY_ROWS at most, each written before it is announced.
    pending: list[tuple[str, np.ndarray, np.ndarray]] = []
    size = 0
    for name, ids, stored in checked:
        for start in range(0, len(ids), ENTRY_ROWS):
            part = (name, ids[start : start + ENTRY_ROWS], stored[start : start + ENTRY_ROWS])
            if size + len(part[1]) > ENTRY_ROWS and pending:
                entries.append(_write_and_announce(client, target, stream, pending, maxlen, clock))
                pending, size = [], 0
            pending.append(part)
            size += len(part[1])
    if pending:
        entries.append(_write_and_announce(client, target, stream, pending, maxlen, clock))
    return entries


def _write_and_announce(client, target: Target, stream: str, parts, maxlen: int, clock) -> str:
    pipe = client.pipeline(transaction=False)
    for name, ids, stored in parts:
        for row, value in zip(ids.tolist(), stored):
            pipe.set(row_key(target.model, target.version, target.groups, name, row), value.tobytes())
    pipe.execute()  # raises if any write failed: nothing is announced then
    fields = {"published_us": str(int(clock() * 1e6))}
    for name, ids, _ in parts:
        key = f"rows:{name}"
        fields[key] = ",".join(filter(None, [fields.get(key, "")] + [str(i) for i in ids.tolist()]))
    entry = client.xadd(stream, fields, maxlen=maxlen, approximate=True)
    return _text(entry)


def read_rows_file(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """An update file: a safetensors file with, for each table `T`, `T.ids` (integer row ids `[n]`) and `T`
    (float32 values `[n, dim]`)."""
    from safetensors.numpy import load_file

    try:
        tensors = load_file(path)
    except OSError as e:
        raise UpdateError(f"{path}: cannot read it: {e}") from e
    out = {}
    for name, values in tensors.items():
        if name.endswith(".ids"):
            continue
        ids = tensors.get(f"{name}.ids")
        if ids is None:
            raise UpdateError(f"{path}: tensor {name!r} has no {name + '.ids'!r} beside it")
        out[name] = (ids, values)
    for name in tensors:
        if name.endswith(".ids") and name.removesuffix(".ids") not in tensors:
            raise UpdateError(f"{path}: {name!r} has no values tensor {name.removesuffix('.ids')!r}")
    if not out:
        raise UpdateError(f"{path}: no tensors")
    return out
