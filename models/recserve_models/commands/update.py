"""The `update` command: write new values for rows of a published version's `tier = "redis"` tables and announce
them on the version's update stream (`recserve_models.update`); exit 1 when the update cannot be written."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..model_toml import ModelTomlError
from ..publish import PublishError, cluster_nodes
from ..update import DEFAULT_MAXLEN, open_target, read_rows_file, stream_key, update_rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `update` command's options."""
    parser.add_argument("version_dir", type=Path, help="the published version: <repository>/<model>/<version>")
    parser.add_argument(
        "--redis", required=True, help="Redis Cluster nodes, redis://HOST:PORT[,HOST:PORT...] (one is enough)"
    )
    parser.add_argument(
        "--rows",
        type=Path,
        required=True,
        help="a safetensors file with, for each table T, `T.ids` (row ids [n]) and `T` (float32 values [n, dim])",
    )
    parser.add_argument(
        "--maxlen", type=int, default=DEFAULT_MAXLEN, help="entries the update stream keeps (about: MAXLEN ~)"
    )


def run(args: argparse.Namespace) -> None:
    from redis.cluster import ClusterNode, RedisCluster
    from redis.exceptions import RedisError

    try:
        rows = read_rows_file(args.rows)
        nodes = [ClusterNode(host, port) for host, port in cluster_nodes(args.redis)]
        client = RedisCluster(startup_nodes=nodes, socket_timeout=10)
        try:
            target = open_target(args.version_dir, client)
            entries = update_rows(client, target, rows, maxlen=args.maxlen)
        finally:
            client.close()
    except (PublishError, ModelTomlError) as e:
        print(f"update: {e}", file=sys.stderr)
        sys.exit(1)
    except RedisError as e:
        print(f"update: Redis Cluster at {args.redis}: {e}", file=sys.stderr)
        sys.exit(1)
    tables = ", ".join(f"{name} ({len(ids)} rows)" for name, (ids, _) in rows.items())
    print(
        f"updated {target.model} version {target.version}: {tables}; announced in {len(entries)} entries on "
        f"{stream_key(target.model, target.version)} (last {entries[-1]})"
    )
