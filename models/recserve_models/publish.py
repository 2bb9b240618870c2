"""Publishing a version's `tier = "redis"` tables to a Redis Cluster, the way the server reads them
(`docs/model-repository.md`, "The Redis tier"): every row under its own key, in the table's own byte layout,
then a completion marker that the server checks before it serves the version.

Keys (scheme `rs1`): row `id` of table `T` of model `M` version `V` is `rs1:{M/V/g}:T:id` with `g = id mod groups`;
the hash tag `{M/V/g}` puts a version's rows into `groups` slots whatever their table, so the server fetches a
batch's rows with at most `groups` MGETs. The marker `rs1:{M/V}:published` is a hash: `groups`, and `rows:T` for
every published table. Publishing is idempotent: it drops the marker first, writes every row (the same bytes
again on a re-run), and writes the marker last, so a version whose publishing stopped half-way has no marker
and is refused by the server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from . import model_toml
from .progress import Progress

SCHEME = "rs1"
DEFAULT_GROUPS = 64
# Rows sent per pipeline round: large enough to amortise the round trips, small enough to bound memory.
CHUNK_ROWS = 8192


class PublishError(Exception):
    """A version that cannot be published; the message names the file or table."""


def row_key(model: str, version: int, groups: int, table: str, row: int) -> str:
    """The key of row `row` of `table` (the server's `row_key`)."""
    return f"{SCHEME}:{{{model}/{version}/{row % groups}}}:{table}:{row}"


def marker_key(model: str, version: int) -> str:
    """The key of a version's completion marker."""
    return f"{SCHEME}:{{{model}/{version}}}:published"


@dataclass(frozen=True)
class Published:
    model: str
    version: int
    rows: dict[str, int]
    groups: int


def cluster_nodes(url: str) -> list[tuple[str, int]]:
    """`redis://h:p[,h:p...]` (or bare `h:p` items) → [(host, port)]."""
    nodes = []
    for item in url.split(","):
        item = item.strip().removeprefix("redis://").rstrip("/")
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise PublishError(f"--redis {url!r}: {item!r} is not HOST:PORT")
        nodes.append((host, int(port)))
    return nodes


def table_rows(version_dir: Path, table: model_toml.TableSpec) -> np.ndarray:
    """The table's tensor as stored (`[rows, row width]`), checked against `model.toml`."""
    path = version_dir / table.file
    try:
        tensor = load_file(path)[table.name]
    except (OSError, KeyError) as e:
        raise PublishError(f"{path}: cannot read tensor {table.name!r}: {e}") from e
    width = table.dim + 8 if table.storage == "int8" else table.dim
    dtype = {"fp32": np.float32, "fp16": np.float16, "int8": np.uint8}[table.storage]
    if tensor.dtype != dtype or tensor.shape != (table.rows, width):
        raise PublishError(
            f"{path}: tensor {table.name!r} is {tensor.dtype} {list(tensor.shape)}, but model.toml declares "
            f"{table.storage} rows = {table.rows}, dim = {table.dim}"
        )
    return np.ascontiguousarray(tensor.astype(tensor.dtype.newbyteorder("<"), copy=False))


def publish(
    version_dir: Path,
    client,
    report: Callable[[str], None],
    groups: int = DEFAULT_GROUPS,
) -> Published:
    """Uploads the `tier = "redis"` tables of `version_dir` through `client` (a `redis.cluster.RedisCluster`) and
    writes the completion marker; reports progress lines through `report`."""
    version_dir = Path(version_dir)
    if not version_dir.name.isdigit() or int(version_dir.name) < 1:
        raise PublishError(f"{version_dir}: a version directory is named by a positive integer")
    model, version = version_dir.parent.name, int(version_dir.name)
    spec = model_toml.read(version_dir / "model.toml")
    tables = [t for t in spec.tables if t.tier == "redis"]
    if not tables:
        raise PublishError(f"{version_dir / 'model.toml'}: no table has tier = \"redis\"; nothing to publish")
    if groups < 1:
        raise PublishError(f"--groups must be at least 1, got {groups}")
    marker = marker_key(model, version)
    client.delete(marker)
    total = sum(t.rows for t in tables)
    progress = Progress("rows", total, report, every=2.0)
    for table in tables:
        rows = table_rows(version_dir, table)
        for start in range(0, table.rows, CHUNK_ROWS):
            end = min(start + CHUNK_ROWS, table.rows)
            pipe = client.pipeline(transaction=False)
            # One MSET per hash-tag group (its keys share a slot): one command of many rows costs the client far
            # less than a SET a row (about 5x the rows a second; redis-py refuses `mset` in a cluster pipeline,
            # not the command itself).
            for group in range(groups):
                args: list[object] = []
                for row in range(start + (group - start) % groups, end, groups):
                    args += [row_key(model, version, groups, table.name, row), rows[row].tobytes()]
                if args:
                    pipe.execute_command("MSET", *args)
            pipe.execute()
            progress.advance(end - start, note=f"table {table.name}")
    fields = {"groups": str(groups)} | {f"rows:{t.name}": str(t.rows) for t in tables}
    client.hset(marker, mapping=fields)
    return Published(model, version, {t.name: t.rows for t in tables}, groups)
