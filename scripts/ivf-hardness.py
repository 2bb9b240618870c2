"""How hard a catalogue is for IVF: recall@100 of an exact-within-lists IVF index (Faiss `IndexIVFFlat`, no code
error) built the way recserve builds its lists (squared-L2 k-means, 10 iterations, on 64 × NLIST random items;
every item in its L2-nearest list; lists probed by the query's inner product with the centroids), by nprobe, for
the benchmark's queries (user rows `i · users / QUERIES`, as examples/ivf_bench.rs picks them) against their exact
inner-product top 100. Every IVF method on the same lists (recserve's, Faiss's SQ8 or PQ4 fast scan with a re-rank)
reaches at most this recall at a given nprobe, so it says which nprobe a catalogue needs, in minutes and without
building recserve's index. Run in scripts/ivf-bench.sh's virtualenv (faiss-cpu, numpy):

    target/venv-ann/bin/python scripts/ivf-hardness.py VERSION_DIR NLIST [QUERIES]

VERSION_DIR is a version written by scripts/ivf-synthetic.py (fp32 `item` and `user` tensors in
tables.safetensors). Prints the median number of lists a query's exact top 100 spans and a recall line per nprobe.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import faiss
import numpy as np

NPROBES = (8, 16, 32, 64, 128, 256)
K = 100


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3):
        raise SystemExit(__doc__.split("\n\n")[1])
    version, nlist = Path(argv[0]), int(argv[1])
    n_queries = int(argv[2]) if len(argv) == 3 else 1000
    spec = importlib.util.spec_from_file_location("ivf_peers", Path(__file__).parent / "ivf-peers.py")
    peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peers)
    table = peers.tensors(version / "tables.safetensors")
    x = np.ascontiguousarray(table["item"], dtype=np.float32)
    users = table["user"]
    n, dim = x.shape
    if not 1 <= nlist <= n:
        raise SystemExit(f"NLIST must be from 1 to the {n} items, not {nlist}")
    q = np.ascontiguousarray(users[[i * len(users) // n_queries for i in range(n_queries)]], dtype=np.float32)
    started = time.monotonic()
    flat = faiss.IndexFlatIP(dim)
    flat.add(x)
    truth = flat.search(q, K)[1]
    del flat
    rng = np.random.default_rng(0)
    train = x[np.sort(rng.choice(n, size=min(n, 64 * nlist), replace=False))]
    kmeans = faiss.Kmeans(dim, nlist, niter=10, seed=0)
    kmeans.train(train)
    by_l2 = faiss.IndexFlatL2(dim)
    by_l2.add(kmeans.centroids)
    by_ip = faiss.IndexFlatIP(dim)
    by_ip.add(kmeans.centroids)
    ivf = faiss.IndexIVFFlat(by_l2, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.add(x)  # assigned by the L2 quantizer, as recserve's builder assigns
    ivf.quantizer = by_ip  # probed by inner product, as recserve's search probes
    lists = by_l2.search(x[np.unique(truth)], 1)[1].ravel()
    list_of = dict(zip(np.unique(truth).tolist(), lists.tolist()))
    spans = [len({list_of[i] for i in row}) for row in truth.tolist()]
    print(f"{version}: {n:,} items, nlist {nlist}, {n_queries} queries; built in {time.monotonic() - started:.0f} s; "
          f"a query's exact top {K} spans {np.median(spans):.0f} lists (median)")
    for nprobe in NPROBES:
        if nprobe > nlist:
            break
        ivf.nprobe = nprobe
        got = ivf.search(q, K)[1]
        print(f"nprobe {nprobe}: recall@{K} {peers.recall_of(got, truth):.4f}", flush=True)
    ivf.quantizer = by_l2  # the index owns neither quantizer: keep both alive until here


if __name__ == "__main__":
    main(sys.argv[1:])
