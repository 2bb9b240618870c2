"""`update`: the stream key (the server's), the encoding of new values, the checks before anything is written,
the order of writes (rows before their announcement, entries of at most ENTRY_ROWS rows), and, against the real
Redis Cluster that scripts/test.sh starts (RECSERVE_TEST_REDIS), rows that read back as written with an entry on
the version's stream in the documented format."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from recserve_models import model_toml
from recserve_models.commands import main
from recserve_models.publish import cluster_nodes, marker_key, publish, row_key
from recserve_models.quantize import dequantize_rowwise_int8
from recserve_models.update import (
    ENTRY_ROWS,
    Target,
    UpdateError,
    encode_rows,
    open_target,
    read_rows_file,
    stream_key,
    update_rows,
)

DEMO = Path(__file__).resolve().parents[1] / "demo"


def table(storage: str, rows: int = 50, dim: int = 4) -> model_toml.TableSpec:
    return model_toml.TableSpec(name="T", file="t.safetensors", rows=rows, dim=dim, storage=storage, tier="redis")


def test_the_stream_key_is_the_servers() -> None:
    assert stream_key("deepfm", 3) == "rs1:{deepfm/3}:updates"


def test_values_are_encoded_as_the_table_stores_them() -> None:
    values = np.array([[0.5, -1.0, 2.0, 0.25], [1.0, 1.0, 1.0, 1.0]], dtype=np.float32)
    assert encode_rows(table("fp32"), values).tobytes() == values.astype("<f4").tobytes()
    assert encode_rows(table("fp16"), values).tobytes() == values.astype("<f2").tobytes()
    fused = encode_rows(table("int8"), values)
    assert fused.shape == (2, 4 + 8)
    # Row-wise int8 keeps each value within half a step (range / 255 / 2) of the original.
    np.testing.assert_allclose(dequantize_rowwise_int8(fused), values, atol=3.0 / 255 / 2 + 1e-6)
    with pytest.raises(UpdateError, match=r"table 'T': values must be float32 \[n, 4\], got float64 \[2, 4\]"):
        encode_rows(table("fp32"), values.astype(np.float64))


class Recorder:
    """Records what update_rows sends, in order (the unit tests' stand-in; the cluster test below is the real one)."""

    def __init__(self) -> None:
        self.log: list[tuple] = []

    def pipeline(self, transaction: bool):
        recorder = self

        class Pipe:
            def __init__(self) -> None:
                self.sets: list[tuple[str, bytes]] = []

            def set(self, key: str, value: bytes) -> None:
                self.sets.append((key, value))

            def execute(self) -> None:
                recorder.log.append(("sets", self.sets))

        return Pipe()

    def xadd(self, key, fields, maxlen, approximate):
        self.log.append(("xadd", key, dict(fields), maxlen, approximate))
        return f"{len(self.log)}-0".encode()


def test_rows_are_written_before_they_are_announced_in_entries_of_bounded_size() -> None:
    target = Target("m", 2, 8, {"T": table("fp32", rows=10_000), "U": table("fp32", rows=10)})
    ids = np.arange(ENTRY_ROWS + 10)
    values = np.ones((len(ids), 4), dtype=np.float32)
    client = Recorder()
    entries = update_rows(
        client, target, {"T": (ids, values), "U": (np.array([3]), values[:1])}, maxlen=500, clock=lambda: 12.5
    )
    assert entries == ["2-0", "4-0"]
    kinds = [entry[0] for entry in client.log]
    assert kinds == ["sets", "xadd", "sets", "xadd"]
    first, second = client.log[1], client.log[3]
    assert first[1] == "rs1:{m/2}:updates" and first[3:] == (500, True)
    assert first[2]["published_us"] == "12500000"
    assert first[2]["rows:T"] == ",".join(str(i) for i in range(ENTRY_ROWS))
    assert second[2]["rows:T"] == ",".join(str(i) for i in range(ENTRY_ROWS, ENTRY_ROWS + 10))
    assert second[2]["rows:U"] == "3"
    assert [k for k, _ in client.log[2][1]][-1] == row_key("m", 2, 8, "U", 3)
    assert len(client.log[0][1]) == ENTRY_ROWS


def test_bad_updates_are_refused_before_anything_is_written() -> None:
    target = Target("m", 1, 8, {"T": table("fp32")})
    client = Recorder()
    ones = np.ones((1, 4), dtype=np.float32)
    with pytest.raises(UpdateError, match=r"table 'X' is not a tier = \"redis\" table of m version 1"):
        update_rows(client, target, {"T": (np.array([1]), ones), "X": (np.array([1]), ones)})
    with pytest.raises(UpdateError, match=r"table 'T': row id 50 is not in \[0, 50\)"):
        update_rows(client, target, {"T": (np.array([50]), ones)})
    with pytest.raises(UpdateError, match=r"table 'T': 2 row ids but 1 rows of values"):
        update_rows(client, target, {"T": (np.array([1, 2]), ones)})
    with pytest.raises(UpdateError, match="--maxlen must be at least 1"):
        update_rows(client, target, {"T": (np.array([1]), ones)}, maxlen=0)
    assert client.log == []


def test_an_update_file_pairs_values_with_ids(tmp_path: Path) -> None:
    path = tmp_path / "rows.safetensors"
    save_file({"C1": np.zeros((2, 3), dtype=np.float32), "C1.ids": np.array([4, 5], dtype=np.int64)}, path)
    rows = read_rows_file(path)
    assert list(rows) == ["C1"] and rows["C1"][0].tolist() == [4, 5]
    save_file({"C1": np.zeros((2, 3), dtype=np.float32)}, path)
    with pytest.raises(UpdateError, match=r"tensor 'C1' has no 'C1.ids' beside it"):
        read_rows_file(path)


@pytest.mark.skipif("RECSERVE_TEST_REDIS" not in os.environ, reason="needs the cluster scripts/test.sh starts")
def test_updated_rows_read_back_and_are_announced(tmp_path: Path, capsys) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    url = os.environ["RECSERVE_TEST_REDIS"]
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster_nodes(url)])
    version = tmp_path / "pytest-update" / "1"
    shutil.copytree(DEMO / "deepfm" / "1", version)
    toml = version / "model.toml"
    toml.write_text(toml.read_text().replace("default_row = 0\n", 'default_row = 0\ntier = "redis"\n'))
    client.delete(marker_key("pytest-update", 1))  # from an earlier run on the same cluster
    with pytest.raises(UpdateError, match=r"pytest-update version 1 is not published"):
        open_target(version, client)
    publish(version, client, lambda _: None, groups=16)
    client.delete(stream_key("pytest-update", 1))
    target = open_target(version, client)
    assert target.groups == 16 and target.tables["C1"].storage == "int8"
    values = np.linspace(-1, 1, 3 * 17, dtype=np.float32).reshape(3, 17)
    ids = np.array([0, 7, 1393])
    rows = tmp_path / "rows.safetensors"
    save_file({"C1": values, "C1.ids": ids}, rows)
    main(["update", str(version), "--redis", url, "--rows", str(rows)])
    assert "updated pytest-update version 1: C1 (3 rows); announced in 1 entries" in capsys.readouterr().out
    stored = encode_rows(target.tables["C1"], values)
    for i, row in enumerate(ids):
        assert client.get(row_key("pytest-update", 1, 16, "C1", int(row))) == stored[i].tobytes()
    entries = client.xrange(stream_key("pytest-update", 1))
    assert len(entries) == 1
    fields = {k.decode(): v.decode() for k, v in entries[0][1].items()}
    assert fields["rows:C1"] == "0,7,1393" and int(fields["published_us"]) > 1.7e15
    client.close()
