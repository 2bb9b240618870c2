"""The `publish` command: upload a version's `tier = "redis"` tables to a Redis Cluster with a progress line and
a completion marker (`recserve_models.publish`); exit 1 when the version cannot be published."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..model_toml import ModelTomlError
from ..progress import to_stderr
from ..publish import DEFAULT_GROUPS, PublishError, cluster_nodes, publish


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `publish` command's options."""
    parser.add_argument("version_dir", type=Path, help="a version directory: <repository>/<model>/<version>")
    parser.add_argument(
        "--redis", required=True, help="Redis Cluster nodes, redis://HOST:PORT[,HOST:PORT...] (one is enough)"
    )
    parser.add_argument(
        "--groups", type=int, default=DEFAULT_GROUPS, help="hash-tag groups of the version's keys (slots it spreads over)"
    )


def run(args: argparse.Namespace) -> None:
    from redis.cluster import ClusterNode, RedisCluster
    from redis.exceptions import RedisError

    try:
        nodes = [ClusterNode(host, port) for host, port in cluster_nodes(args.redis)]
        client = RedisCluster(startup_nodes=nodes, socket_timeout=10)
        try:
            done = publish(args.version_dir, client, to_stderr("publish"), groups=args.groups)
        finally:
            client.close()
    except (PublishError, ModelTomlError) as e:
        print(f"publish: {e}", file=sys.stderr)
        sys.exit(1)
    except RedisError as e:
        print(f"publish: Redis Cluster at {args.redis}: {e}", file=sys.stderr)
        sys.exit(1)
    tables = ", ".join(f"{name} ({rows} rows)" for name, rows in done.rows.items())
    print(f"published {done.model} version {done.version} to {args.redis}: {tables}; marker written")
