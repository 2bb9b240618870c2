#!/usr/bin/env python3
"""Where a run's requests spent their time inside recserve, from what the server exports: the mean of each stage
over all answered requests of MODEL (recserve_request_stage_seconds, /metrics before and after the run), and the
mean of each stage over the slowest SHARE of them (GET /debug/slow-requests after the run, which must keep at least
that many: start the server with --slow-requests N).

Usage: scripts/lib/stages.py --model M --metrics-before F --metrics-after F --slow F [--share 0.01] [--json OUT]

Prints one line per view; --json writes {"requests", "all": {stage: ms}, "slowest": {"count", "total_ms",
"stages": {stage: ms}}}. The slow-request record counts requests by when their response was handed over and may
hold some from before the run's start (its warm-up, at the same rate): they are few, and of the same load.
"""

from __future__ import annotations

import argparse
import json
import math
import re

STAGES = ["read", "decode", "admit", "queue", "dispatch", "gather", "inference", "answer", "encode", "write"]


def stage_sums(path: str, model: str) -> dict[str, tuple[float, float]]:
    """stage -> (sum seconds, count) of recserve_request_stage_seconds for `model` in a /metrics text."""
    out: dict[str, list[float]] = {}
    pattern = re.compile(r'^recserve_request_stage_seconds_(sum|count)\{(.*)\} (\S+)$')
    for line in open(path, encoding="utf-8"):
        m = pattern.match(line.strip())
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.get("model") != model:
            continue
        entry = out.setdefault(labels["stage"], [0.0, 0.0])
        entry[0 if m.group(1) == "sum" else 1] = float(m.group(3))
    return {k: (v[0], v[1]) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--metrics-before", required=True)
    p.add_argument("--metrics-after", required=True)
    p.add_argument("--slow", required=True, help="GET /debug/slow-requests, saved after the run")
    p.add_argument("--share", type=float, default=0.01, help="the slowest share to break down [0.01]")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args()

    before, after = stage_sums(a.metrics_before, a.model), stage_sums(a.metrics_after, a.model)
    means = {}
    requests = 0.0
    for stage in STAGES:
        s1, c1 = after.get(stage, (0.0, 0.0))
        s0, c0 = before.get(stage, (0.0, 0.0))
        if c1 - c0 > 0:
            means[stage] = 1e3 * (s1 - s0) / (c1 - c0)
            requests = max(requests, c1 - c0)
    slow = [r for r in json.load(open(a.slow, encoding="utf-8"))["requests"]
            if r["model"] == a.model and r["status"] == 200]
    want = max(1, math.ceil(a.share * requests))
    if len(slow) < want:
        raise SystemExit(f"stages.py: the record holds {len(slow)} answered requests of {a.model}, fewer than the "
                         f"slowest {a.share:.1%} of {requests:.0f} ({want}): start the server with a larger "
                         "--slow-requests")
    slowest = slow[:want]
    slow_means = {stage: sum(next((s["ms"] for s in r["stages"] if s["stage"] == stage), 0.0) for r in slowest)
                  / len(slowest) for stage in STAGES}
    total = sum(r["total_ms"] for r in slowest) / len(slowest)

    def line(values: dict[str, float]) -> str:
        return ", ".join(f"{s} {values[s]:.3f}" for s in STAGES if s in values)

    print(f"all {requests:.0f} answered requests, mean ms: {line(means)}")
    print(f"slowest {a.share:.1%} ({want}, mean {total:.2f} ms in the server), mean ms: {line(slow_means)}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"requests": requests, "all": means,
                       "slowest": {"count": want, "total_ms": total, "stages": slow_means}}, f, indent=2)


if __name__ == "__main__":
    main()
