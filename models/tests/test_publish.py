"""`publish`: the key scheme (the same strings as the server's `row_key` test), the node list, the checks before
anything is written, and, against the real Redis Cluster that scripts/test.sh starts (RECSERVE_TEST_REDIS), an
upload whose every row reads back byte for byte, with its marker, and a re-run that writes the same again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from recserve_models.publish import PublishError, cluster_nodes, marker_key, publish, row_key

DEMO = Path(__file__).resolve().parents[1] / "demo"


def test_keys_are_the_servers() -> None:
    assert row_key("deepfm", 3, 64, "C1", 4113) == "rs1:{deepfm/3/17}:C1:4113"
    assert row_key("deepfm", 3, 64, "C2", 17) == "rs1:{deepfm/3/17}:C2:17"
    assert marker_key("deepfm", 3) == "rs1:{deepfm/3}:published"


def test_node_lists_are_read_and_bad_ones_named() -> None:
    assert cluster_nodes("redis://127.0.0.1:7000,127.0.0.1:7001") == [("127.0.0.1", 7000), ("127.0.0.1", 7001)]
    with pytest.raises(PublishError, match="'localhost' is not HOST:PORT"):
        cluster_nodes("redis://localhost")


def redis_version(tmp_path: Path, name: str) -> Path:
    """The demo DeepFM as model `name`, its tables moved to the Redis tier."""
    version = tmp_path / name / "1"
    shutil.copytree(DEMO / "deepfm" / "1", version)
    toml = version / "model.toml"
    toml.write_text(toml.read_text().replace("default_row = 0\n", 'default_row = 0\ntier = "redis"\n'))
    return version


def test_a_version_without_redis_tables_is_refused_before_writing(tmp_path: Path) -> None:
    version = tmp_path / "m" / "1"
    shutil.copytree(DEMO / "deepfm" / "1", version)

    class NoClient:
        def __getattr__(self, name: str):
            raise AssertionError(f"nothing may be written ({name})")

    with pytest.raises(PublishError, match='no table has tier = "redis"'):
        publish(version, NoClient(), lambda _: None)


@pytest.mark.skipif("RECSERVE_TEST_REDIS" not in os.environ, reason="needs the cluster scripts/test.sh starts")
def test_every_row_reads_back_and_a_rerun_is_the_same(tmp_path: Path) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    nodes = [ClusterNode(h, p) for h, p in cluster_nodes(os.environ["RECSERVE_TEST_REDIS"])]
    client = RedisCluster(startup_nodes=nodes)
    version = redis_version(tmp_path, "pytest-publish")
    lines: list[str] = []
    for _ in range(2):
        done = publish(version, client, lines.append, groups=16)
        assert done.rows["C1"] == 1394 and len(done.rows) == 26
        marker = {k.decode(): v.decode() for k, v in client.hgetall(marker_key("pytest-publish", 1)).items()}
        assert marker["groups"] == "16" and marker["rows:C6"] == "26" and len(marker) == 27
        tables = load_file(version / "tables.safetensors")
        for name in ("C1", "C6", "C26"):
            rows = tables[name]
            keys = [row_key("pytest-publish", 1, 16, name, r) for r in range(len(rows))]
            got = [client.get(k) for k in keys]
            assert all(g == rows[r].tobytes() for r, g in enumerate(got)), name
            assert np.frombuffer(got[3], dtype=np.uint8).shape == (17 + 8,)
    assert lines and lines[-1].startswith(f"{sum(done.rows.values())}/{sum(done.rows.values())} rows (100%)")
    client.close()
