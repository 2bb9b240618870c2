#!/usr/bin/env python3
"""The machine's steal time: how long the hypervisor ran something else while this VM's CPUs wanted to run.

Usage: scripts/lib/steal.py            prints {"steal_s": ..., "per_cpu_s": [...]} (seconds since boot)

`/proc/stat` has one `cpuN` line per CPU (and a `cpu` line, their sum) whose 8th value is steal, in USER_HZ
(`os.sysconf("SC_CLK_TCK")`, 100 on Linux). A benchmark step reads it before and after (scripts/lib/step.py) and
reports the difference beside its figures: p99 on these VMs follows steal (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os


def parse(text: str, user_hz: int) -> dict | None:
    """Steal in seconds, all CPUs and per CPU, from the text of /proc/stat; None when it has no steal column."""
    total = None
    per_cpu: dict[int, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or not parts[0].startswith("cpu") or len(parts) < 9:
            continue
        try:
            steal = int(parts[8]) / user_hz
        except ValueError:
            continue
        if parts[0] == "cpu":
            total = steal
        elif parts[0][3:].isdigit():
            per_cpu[int(parts[0][3:])] = steal
    if total is None:
        return None
    return {"steal_s": total, "per_cpu_s": [per_cpu[c] for c in sorted(per_cpu)]}


def read() -> dict | None:
    """The machine's steal now, or None where /proc/stat cannot be read (not Linux, a locked-down container)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            return parse(f.read(), os.sysconf("SC_CLK_TCK"))
    except OSError:
        return None


if __name__ == "__main__":
    print(json.dumps(read()))
