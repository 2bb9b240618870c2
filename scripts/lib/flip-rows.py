"""Online row updates for scripts/bench-redis-tier.sh (b): flips rows of the item table C21 that a run's requests
read between two whole versions, as published (A) and negated (B), at RATE rows per second for SECONDS, in batches of
200 distinct rows written and announced with `recserve_models.update.update_rows`. The rows are the candidates' ids
of the requests saved in SCORES (`recload check --save`). With TORN = 1 it writes rows that are not whole: the first
half of each row from the version it was, the rest from the version it becomes (a check must catch them). Prints
what it wrote as JSON.

Usage: python scripts/lib/flip-rows.py VERSION_DIR NODES RATE SECONDS SCORES TORN
"""

import json
import sys
import time

import numpy as np
from redis.cluster import ClusterNode, RedisCluster
from safetensors.numpy import load_file

from recserve_models.publish import cluster_nodes
from recserve_models.update import open_target, update_rows


def main(version, url, rate, seconds, scores, torn):
    rate, seconds, torn = float(rate), float(seconds), torn == "1"
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster_nodes(url)])
    target = open_target(version, client)
    published = load_file(f"{version}/tables.safetensors")["C21"]
    # C21 is the item id field: its rows are the candidates' ids.
    samples = json.load(open(scores))["samples"]
    ids = np.array(sorted({c["id"] for s in samples for c in s["request"]["candidates"]}))
    flipped = np.zeros(published.shape[0], dtype=bool)
    rng = np.random.default_rng(18)
    batch = min(200, len(ids))
    start = time.monotonic()
    cpu = time.process_time()
    sent = 0
    while time.monotonic() - start < seconds:
        if (late := start + sent / rate - time.monotonic()) > 0:
            time.sleep(late)
        rows = rng.choice(ids, size=batch, replace=False)
        flipped[rows] = ~flipped[rows]
        values = np.where(flipped[rows][:, None], -published[rows], published[rows])
        if torn:
            half = values.shape[1] // 2
            values[:, :half] = -values[:, :half]
        update_rows(client, target, {"C21": (rows, values)})
        sent += len(rows)
    wall = time.monotonic() - start
    print(json.dumps({"rows": sent, "distinct_rows": int(len(ids)), "seconds": wall, "rows_per_s": sent / wall,
                      "cpu": (time.process_time() - cpu) / wall, "torn": torn}))


if __name__ == "__main__":
    if len(sys.argv) != 7:
        sys.exit(__doc__)
    main(*sys.argv[1:])
