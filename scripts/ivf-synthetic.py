"""A synthetic catalogue of N items drawn around the trained Gowalla item vectors, for the IVF benchmark
(scripts/ivf-bench.sh); users are the trained user table (fp32), so the benchmark's queries are real user vectors.

Usage: python scripts/ivf-synthetic.py SOURCE_VERSION OUT_VERSION ITEMS SPREAD [--catalogue easy|hard] [--seed N]
       (e.g. models/demo/lightgcn/1 target/ivf-1000000 1000000 0.3)

Two catalogues, each deterministic from `--seed` (default 11; the same seed, N and SPREAD give the same bytes):

- `easy` (the default): item = a random trained item + Gaussian noise of SPREAD × that dimension's standard
  deviation. At 10M this is ≈ 244 tight copies of each of the 40,981 trained items: a query's top 100 are copies of
  one or two trained items, which sit in one or two lists, so every IVF method reaches recall@100 0.997 at
  nprobe 16.
- `hard`: neighbourhoods that overlap, as real embeddings' do. A mixture of ITEMS / 8 clusters (1.25M at 10M items,
  150× the benchmark's 8,192 lists; 125k at 1M, 61× its 2,048: one cluster per 8 items at every size, so a query's
  neighbourhood has the same make-up at every size and only the index's lists change), whose centres are points
  between two random trained items (`a + w (b − a)`, w uniform in [0, 0.5)); each cluster has its own anisotropic covariance
  (one of 16 random rotations times per-axis scales `SPREAD · sd · exp(0.75 z)`, sd the trained items' mean
  per-dimension standard deviation, z standard normal per cluster and axis), and each item's vector is scaled by
  a log-normal norm factor `exp(0.25 z)` (heavy-tailed norms, which inner-product search ranks first across
  many clusters). Clusters are picked uniformly. scripts/ivf-bench.sh passes SPREAD 0.45: an exact-within-lists
  IVF index on lists built as recserve builds them (scripts/ivf-hardness.py: the most any IVF method probing those
  lists can reach) then
  has recall@100 0.926 / 0.972 at nprobe 32 / 64 on 100k items with 512 lists and 0.910 / 0.958 on 1M with 2,048
  (a query's top 100 spans 18 and 17 lists at the median): recall at a given nprobe falls slowly as items grow 10× and
  lists 4×, so at 10M with 8,192 lists recall@100 0.95 needs nprobe 64 or more (docs/benchmarks.md, "Recall through
  the IVF index").

The item table is generated and written in blocks of 2^20 rows straight into the safetensors file (its layout:
an 8-byte little-endian header length, the JSON header, the tensors' bytes), so 10M × 64 items (2.56 GB) take
one block of memory, not two copies of the table.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

BLOCK = 1 << 20
ITEMS_PER_CLUSTER = 8
ROTATIONS = 16
AXIS_SIGMA = 0.75  # log-normal spread of a cluster's per-axis scales
NORM_SIGMA = 0.25  # log-normal spread of an item's norm factor
CATALOGUES = ("easy", "hard")


def easy_blocks(items: np.ndarray, n: int, spread: float, seed: int, block: int = BLOCK) -> Iterator[np.ndarray]:
    """The easy catalogue's rows, `block` at a time: a random trained item plus isotropic Gaussian noise."""
    rng = np.random.default_rng(seed)
    sd = items.std(axis=0)
    for a in range(0, n, block):
        b = min(n, a + block)
        base = items[rng.integers(0, len(items), b - a)]
        yield (base + spread * sd * rng.standard_normal(base.shape, dtype=np.float32)).astype(np.float32)


def hard_blocks(
    items: np.ndarray, n: int, spread: float, seed: int, block: int = BLOCK, clusters: int | None = None
) -> Iterator[np.ndarray]:
    """The hard catalogue's rows, `block` at a time (see the module docs): overlapping anisotropic clusters
    between trained items, with heavy-tailed norms; `clusters` defaults to one per ITEMS_PER_CLUSTER items."""
    if spread <= 0:
        raise SystemExit(f"SPREAD must be positive, not {spread}")
    clusters = clusters or max(1, n // ITEMS_PER_CLUSTER)
    rng = np.random.default_rng(seed)
    items = items.astype(np.float32)
    dim = items.shape[1]
    sd = float(items.std(axis=0).mean())
    a, b = rng.integers(0, len(items), clusters), rng.integers(0, len(items), clusters)
    w = rng.uniform(0.0, 0.5, clusters).astype(np.float32)[:, None]
    centres = items[a] + w * (items[b] - items[a])
    rotations = np.stack([np.linalg.qr(rng.standard_normal((dim, dim)))[0] for _ in range(ROTATIONS)]).astype(
        np.float32
    )
    rotation_of = rng.integers(0, ROTATIONS, clusters)
    scales = (spread * sd * np.exp(AXIS_SIGMA * rng.standard_normal((clusters, dim)))).astype(np.float32)
    for start in range(0, n, block):
        rows = min(n, start + block) - start
        c = rng.integers(0, clusters, rows)
        noise = scales[c] * rng.standard_normal((rows, dim), dtype=np.float32)
        out = np.empty((rows, dim), np.float32)
        r = rotation_of[c]
        for k in range(ROTATIONS):
            at = np.flatnonzero(r == k)
            out[at] = noise[at] @ rotations[k].T
        out += centres[c]
        out *= np.exp(NORM_SIGMA * rng.standard_normal(rows)).astype(np.float32)[:, None]
        yield out


def blocks(catalogue: str, items: np.ndarray, n: int, spread: float, seed: int) -> Iterator[np.ndarray]:
    if catalogue == "easy":
        return easy_blocks(items, n, spread, seed)
    if catalogue == "hard":
        return hard_blocks(items, n, spread, seed)
    raise SystemExit(f"--catalogue must be one of {', '.join(CATALOGUES)}, not {catalogue!r}")


def main(argv: list[str] | None = None) -> None:
    from recserve_models import model_toml
    from recserve_models.model_toml import LightGCNToml, RecallSpec, TableSpec
    from recserve_models.repository import load_tables, values

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="the trained LightGCN version (models/demo/lightgcn/1)")
    p.add_argument("out", type=Path, help="the version directory to write (must not exist)")
    p.add_argument("items", type=int, help="items in the catalogue")
    p.add_argument("spread", type=float, help="noise scale, in units of the trained items' standard deviation")
    p.add_argument("--catalogue", default="easy", choices=CATALOGUES)
    p.add_argument("--seed", type=int, default=11)
    o = p.parse_args(argv)
    if o.items < 1:
        raise SystemExit(f"ITEMS must be a positive count, not {o.items}")
    if o.spread < 0:
        raise SystemExit(f"SPREAD must not be negative, not {o.spread}")
    model = model_toml.read(o.source / "model.toml")
    t = load_tables(o.source, model)
    items = values(t[model.recall.item_table])
    users = np.ascontiguousarray(values(t[model.recall.user_table]), "<f4")
    n, dim = o.items, items.shape[1]
    header = {
        "user": {"dtype": "F32", "shape": list(users.shape), "data_offsets": [0, users.nbytes]},
        "item": {"dtype": "F32", "shape": [n, dim], "data_offsets": [users.nbytes, users.nbytes + n * dim * 4]},
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)  # tensors start 8-byte aligned
    o.out.mkdir(parents=True)
    with open(o.out / "tables.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(users.tobytes())
        done = 0
        for block in blocks(o.catalogue, items, n, o.spread, o.seed):
            f.write(np.ascontiguousarray(block, "<f4").tobytes())
            done += len(block)
            print(f"items {done}/{n}", file=sys.stderr, flush=True)
    m = LightGCNToml(
        tables=(
            TableSpec("user", "tables.safetensors", len(users), dim, "fp32", "reject"),
            TableSpec("item", "tables.safetensors", n, dim, "fp32", "reject"),
        ),
        recall=RecallSpec("user", "item"),
        description=f"synthetic ({o.catalogue}, seed {o.seed}): {n} items around Gowalla's, spread {o.spread}",
    )
    (o.out / "model.toml").write_text(model_toml.to_toml(m), encoding="utf-8")
    print("wrote", o.out)


if __name__ == "__main__":
    main()
