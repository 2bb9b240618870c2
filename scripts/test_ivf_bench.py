"""The IVF benchmark's Python parts: the synthetic catalogues (scripts/ivf-synthetic.py) are deterministic from
their seed, the easy one is the formula its docs give, the hard one has the structure its docs describe; the peers'
script (scripts/ivf-peers.py) lifts inner product to L2 exactly, measures recall as the overlap with the exact
answers, and summarises rounds as median and worst of the fastest point at or above each recall level."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
REPO = HERE.parent


def load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


synthetic = load("ivf_synthetic", "ivf-synthetic.py")
peers = load("ivf_peers", "ivf-peers.py")


def trained(n: int = 500, dim: int = 8, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def test_the_easy_catalogue_is_a_trained_item_plus_scaled_noise() -> None:
    items = trained()
    got = np.concatenate(list(synthetic.easy_blocks(items, 1000, 0.3, seed=5, block=300)))
    rng = np.random.default_rng(5)  # the reference: the same draws in the same order, one block at a time
    sd = items.std(axis=0)
    want = []
    for a in range(0, 1000, 300):
        base = items[rng.integers(0, len(items), min(1000, a + 300) - a)]
        want.append(base + 0.3 * sd * rng.standard_normal(base.shape, dtype=np.float32))
    np.testing.assert_array_equal(got, np.concatenate(want))


@pytest.mark.parametrize("catalogue", synthetic.CATALOGUES)
def test_a_catalogue_is_the_same_from_the_same_seed_and_differs_from_another(catalogue: str) -> None:
    items = trained()
    one = np.concatenate(list(synthetic.blocks(catalogue, items, 2000, 0.5, 7)))
    two = np.concatenate(list(synthetic.blocks(catalogue, items, 2000, 0.5, 7)))
    other = np.concatenate(list(synthetic.blocks(catalogue, items, 2000, 0.5, 8)))
    assert one.shape == (2000, 8) and one.dtype == np.float32
    np.testing.assert_array_equal(one, two)
    assert not np.array_equal(one, other)


def test_the_hard_catalogue_is_its_documented_mixture() -> None:
    items = trained(n=50, dim=16)
    got = np.concatenate(list(synthetic.hard_blocks(items, 700, 0.5, seed=1, block=300, clusters=40)))
    # The reference, one row at a time, drawing in the order the module docs give.
    rng = np.random.default_rng(1)
    sd = float(items.std(axis=0).mean())
    a, b = rng.integers(0, 50, 40), rng.integers(0, 50, 40)
    w = rng.uniform(0.0, 0.5, 40)
    rotations = [np.linalg.qr(rng.standard_normal((16, 16)))[0] for _ in range(synthetic.ROTATIONS)]
    rotation_of = rng.integers(0, synthetic.ROTATIONS, 40)
    scales = 0.5 * sd * np.exp(synthetic.AXIS_SIGMA * rng.standard_normal((40, 16)))
    want = []
    for start in range(0, 700, 300):
        rows = min(700, start + 300) - start
        c = rng.integers(0, 40, rows)
        g = rng.standard_normal((rows, 16), dtype=np.float32)
        f = np.exp(synthetic.NORM_SIGMA * rng.standard_normal(rows))
        for i in range(rows):
            j = c[i]
            centre = items[a[j]] + w[j] * (items[b[j]] - items[a[j]])
            want.append((centre + rotations[rotation_of[j]] @ (scales[j] * g[i])) * f[i])
    np.testing.assert_allclose(got, np.array(want), rtol=1e-4, atol=1e-5)
    norms = np.linalg.norm(got, axis=1)
    assert np.percentile(norms, 99) / np.median(norms) > 1.3  # heavy-tailed norms


def test_a_hard_cluster_spreads_unequally_along_its_axes() -> None:
    items = np.zeros((2, 32), np.float32)
    items[1, 0] = 2.0  # the trained items differ on axis 0 only: the one cluster's centre lies on it
    x = np.concatenate(list(synthetic.hard_blocks(items, 20000, 1.0, seed=2, clusters=1)))
    # Off axis 0 an item is its norm factor times its noise: the noise's covariance, scaled.
    eig = np.linalg.eigvalsh(np.cov(x[:, 1:].T))
    assert eig[-1] / eig[0] > 4, f"covariance is not anisotropic: eigenvalues {eig}"


def test_the_generator_refuses_a_bad_count_or_spread(tmp_path: Path) -> None:
    src = REPO / "models/demo/lightgcn/1"
    with pytest.raises(SystemExit, match="ITEMS must be a positive count"):
        synthetic.main([str(src), str(tmp_path / "a"), "0", "0.3"])
    with pytest.raises(SystemExit, match="SPREAD must not be negative"):
        synthetic.main([str(src), str(tmp_path / "b"), "10", "-1"])
    with pytest.raises(SystemExit):
        synthetic.main([str(src), str(tmp_path / "c"), "10", "0.3", "--catalogue", "medium"])


def test_the_generator_writes_a_version_whose_items_are_its_blocks(tmp_path: Path) -> None:
    out = tmp_path / "v"
    synthetic.main([str(REPO / "models/demo/lightgcn/1"), str(out), "3000", "0.35", "--catalogue", "hard",
                    "--seed", "4"])
    table = peers.tensors(out / "tables.safetensors")
    assert table["item"].shape == (3000, 64)
    assert 'description = "synthetic (hard, seed 4)' in (out / "model.toml").read_text()
    again = tmp_path / "w"
    synthetic.main([str(REPO / "models/demo/lightgcn/1"), str(again), "3000", "0.35", "--catalogue", "hard",
                    "--seed", "4"])
    assert (out / "tables.safetensors").read_bytes() == (again / "tables.safetensors").read_bytes()


def test_the_mips_lift_makes_the_l2_nearest_the_largest_inner_product() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((400, 8)) * np.exp(rng.standard_normal((400, 1)))).astype(np.float32)
    q = rng.standard_normal((50, 8)).astype(np.float32)
    m = float(np.linalg.norm(x, axis=1).max())
    lx = peers.lift(x, m)
    lq = np.hstack([q, np.zeros((50, 1), np.float32)])
    assert lx.shape == (400, 9)
    np.testing.assert_allclose(np.linalg.norm(lx.astype(np.float64), axis=1), m, rtol=1e-5)
    d = ((lq[:, None, :].astype(np.float64) - lx[None].astype(np.float64)) ** 2).sum(-1)
    np.testing.assert_array_equal(np.argsort(d, axis=1)[:, :10], np.argsort(-(q @ x.T), axis=1)[:, :10])


def test_recall_is_the_overlap_with_the_exact_answers_and_ignores_missing_ids() -> None:
    truth = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    got = np.array([[4, 3, 9, -1], [5, 6, 7, 8]])
    assert peers.recall_of(got, truth) == pytest.approx((2 / 4 + 1) / 2)


def test_rounds_are_summarised_as_median_and_worst_of_the_fastest_point_reaching_each_level() -> None:
    def point(recall: float, qps: float, nprobe: int) -> dict:
        return {"nprobe": nprobe, "recall": recall, "qps": qps, "batch_qps": 2 * qps}

    rounds = {
        "x": [
            [point(0.91, 900, 4), point(0.96, 500, 8), point(0.995, 100, 32)],
            [point(0.91, 700, 4), point(0.96, 600, 8), point(0.995, 120, 32)],
            [point(0.91, 800, 4), point(0.96, 300, 8), point(0.995, 90, 32)],
        ]
    }
    s = peers.summarise(rounds)["x"]
    assert s["qps"]["0.9"] == {"reached": True, "rounds": 3, "median": 800, "worst": 700, "settings": ["nprobe 4"]}
    assert (s["qps"]["0.95"]["median"], s["qps"]["0.95"]["worst"]) == (500, 300)
    assert (s["qps"]["0.99"]["median"], s["qps"]["0.99"]["worst"]) == (100, 90)
    assert s["batch_qps"]["0.99"]["median"] == 200
    rounds["x"][1] = [point(0.91, 700, 4)]
    assert peers.summarise(rounds)["x"]["qps"]["0.95"]["reached"] is False


def test_an_unknown_peer_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PEERS", "faiss-sq8,annoy")
    with pytest.raises(SystemExit, match="unknown peer.*annoy"):
        peers.peers()
    monkeypatch.setenv("PEERS", "")
    assert peers.peers() == list(peers.DEFAULT_PEERS)


def test_recserve_points_take_batch_qps_from_the_mean_batch_latency() -> None:
    bench = {"batch": 32, "ivf": [{"nprobe": 8, "recall": 0.9, "qps": 1000.0,
                                   "single_ms": {"p50": 0.9, "p99": 2.0, "mean": 1.0},
                                   "batch_ms": {"p50": 15.0, "p99": 20.0, "mean": 16.0}}]}
    (p,) = peers.recserve_points(bench)
    assert p["batch_qps"] == pytest.approx(2000.0)
    assert json.loads(json.dumps(p)) == p  # plain JSON, as the report writes it


def test_the_build_figures_are_read_from_time_v() -> None:
    log = """index: wrote target/x/ivf.safetensors
\tCommand being timed: "python -m recserve_models index target/x --nlist 2048"
\tUser time (seconds): 30.50
\tSystem time (seconds): 4.25
\tElapsed (wall clock) time (h:mm:ss or m:ss): 2:36.12
\tMaximum resident set size (kbytes): 1048576
\tExit status: 0
"""
    assert peers.time_v(log) == {"seconds": 156.12, "cpu_seconds": 34.75, "peak_rss_bytes": 1 << 30}
    assert peers.time_v(log.replace("2:36.12", "1:02:36.5"))["seconds"] == pytest.approx(3756.5)
