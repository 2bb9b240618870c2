#!/usr/bin/env python3
"""Runs one benchmark step (a load generator's command) and records what happened around it.

Usage: scripts/lib/step.py --out STEP.json [--metrics URL --prom PREFIX [--cafile CA]] -- COMMAND [ARG...]

Writes STEP.json: `{"command", "exit_code", "wall_s", "generator_cpu_s", "steal_s", "steal_per_cpu_s"}`, where
`generator_cpu_s` is the CPU time (user + system) of COMMAND and its children (getrusage), which for oha is its
only measure of its own CPU (recload reports its own as `cpu_s` too), and `steal_s` the machine's steal time over
the step (scripts/lib/steal.py; `null` where /proc/stat cannot be read). With `--metrics URL`, the server's
/metrics before and after the step go to PREFIX.before.prom and PREFIX.after.prom (the benchmark reads the
server's own stage figures from their difference); an https:// URL is trusted through the CA certificate in
`--cafile`. COMMAND's output passes through; its exit status is this
script's.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench
import steal


def scrape(url: str, path: str, cafile: str | None) -> None:
    try:
        Path(path).write_text(bench.scrape(url, timeout=10, cafile=cafile), encoding="utf-8")
    except OSError as e:
        sys.exit(f"step.py: cannot read {url}: {e}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--metrics", help="the server's /metrics URL, scraped before and after")
    p.add_argument("--prom", help="where the scrapes go: PREFIX.before.prom, PREFIX.after.prom")
    p.add_argument("--cafile", help="the CA certificate (PEM) of an https:// --metrics URL")
    p.add_argument("command", nargs="+")
    a = p.parse_args()
    if a.metrics and not a.prom:
        p.error("--metrics needs --prom PREFIX")
    if a.metrics:
        scrape(a.metrics, f"{a.prom}.before.prom", a.cafile)
    before = steal.read()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    code = subprocess.call(a.command)
    wall = time.monotonic() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    after = steal.read()
    if a.metrics:
        scrape(a.metrics, f"{a.prom}.after.prom", a.cafile)
    step = {
        "command": a.command,
        "exit_code": code,
        "wall_s": wall,
        "generator_cpu_s": (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime),
        "steal_s": after["steal_s"] - before["steal_s"] if before and after else None,
        "steal_per_cpu_s": (
            [y - x for x, y in zip(before["per_cpu_s"], after["per_cpu_s"], strict=False)] if before and after else None
        ),
    }
    Path(a.out).write_text(json.dumps(step, indent=2) + "\n", encoding="utf-8")
    sys.exit(code)


if __name__ == "__main__":
    main()
