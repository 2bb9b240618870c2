"""Summary of scripts/ivf-codes.sh: per code format, QPS (single queries, one core) at recall@100 0.90 / 0.95 /
0.99 as the median and worst over the rounds (in each round, the QPS of the smallest swept nprobe whose recall
reaches the target), that nprobe, candidates re-ranked, the index file's bytes, and the build's wall time and peak
RSS (from `/usr/bin/time -v`).

Usage: python3 scripts/ivf-codes-summary.py OUT_DIR ROUNDS INT8_BUILD_LOG PQ4_BUILD_LOG
"""

import json
import re
import statistics
import sys
from pathlib import Path

out, rounds = Path(sys.argv[1]), int(sys.argv[2])
logs = {"int8": Path(sys.argv[3]), "pq4": Path(sys.argv[4])}
targets = (0.90, 0.95, 0.99)
print("| codes | recall@100 | QPS median | QPS worst | nprobe (per round) | re-ranked per query (median) |")
print("| --- | ---: | ---: | ---: | --- | ---: |")
sizes = {}
for codes in ("int8", "pq4"):
    runs = [json.loads((out / f"{codes}-{r}.json").read_text()) for r in range(1, rounds + 1)]
    sizes[codes] = runs[0]["bytes"]["index_file"]
    for target in targets:
        qps, nprobes, reranked = [], [], []
        for run in runs:
            row = next((r for r in run["ivf"] if r["recall"] >= target), None)
            if row is not None:
                qps.append(row["qps"])
                nprobes.append(str(row["nprobe"]))
                reranked.append(row["reranked_per_query"])
        if len(qps) < rounds:
            print(f"| {codes} | {target:.2f} | not reached in {rounds - len(qps)} of {rounds} rounds | | | |")
            continue
        print(
            f"| {codes} | {target:.2f} | {statistics.median(qps):.0f} | {min(qps):.0f} | {', '.join(nprobes)} | "
            f"{statistics.median(reranked):.0f} |"
        )
print()
for codes, log in logs.items():
    text = log.read_text() if log.exists() else ""
    wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", text)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    print(
        f"{codes}: index file {sizes[codes] / 1e6:.1f} MB; build wall {wall.group(1) if wall else '?'}, "
        f"peak RSS {int(rss.group(1)) / 1e6 if rss else 0:.2f} GB"
    )
