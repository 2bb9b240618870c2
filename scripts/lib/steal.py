"""The machine's steal time (the hypervisor running something else while this VM's CPUs wanted to run), from
/proc/stat's 8th `cpu` column in USER_HZ, as seconds: all CPUs summed, and each CPU's. Take it before and after
each benchmark step, and print the step's steal with --since; recserve exports the same total as
recserve_machine_steal_seconds_total (docs/metrics.md).

Usage: python scripts/lib/steal.py [--since BEFORE.json] [--stat FILE]   (prints one JSON line:
       {"steal_seconds": 1.93, "per_cpu": {"cpu0": 0.95, "cpu1": 0.98}}, since boot, or since BEFORE.json's reading)
   or: from steal import read_steal   (with scripts/lib on sys.path)
"""

import argparse
import json
import os
import sys

# user nice system idle iowait irq softirq steal: the 8th value after the label.
STEAL_COLUMN = 7


def read_steal(stat_path="/proc/stat"):
    """Steal since boot, in seconds: {"steal_seconds": total, "per_cpu": {"cpuN": seconds}}. Raises ValueError
    when the file has no `cpu` line with a steal column."""
    hz = os.sysconf("SC_CLK_TCK")
    total, per_cpu = None, {}
    with open(stat_path) as f:
        for line in f:
            fields = line.split()
            if not fields or not fields[0].startswith("cpu"):
                continue
            try:
                seconds = int(fields[1 + STEAL_COLUMN]) / hz
            except (IndexError, ValueError):
                continue  # a line cut short or not numbers: left out, as the server does
            if fields[0] == "cpu":
                total = seconds
            elif fields[0][3:].isdigit():
                per_cpu[fields[0]] = seconds
    if total is None:
        raise ValueError(f"{stat_path}: no `cpu` line with a steal column")
    return {"steal_seconds": total, "per_cpu": per_cpu}


def since(now, before):
    """The steal between two readings (CPUs missing from either are left out)."""
    return {
        "steal_seconds": round(now["steal_seconds"] - before["steal_seconds"], 6),
        "per_cpu": {
            cpu: round(s - before["per_cpu"][cpu], 6) for cpu, s in now["per_cpu"].items() if cpu in before["per_cpu"]
        },
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--since", metavar="BEFORE.json", help="print the steal since this earlier output")
    parser.add_argument("--stat", default="/proc/stat", help="the file to read (default /proc/stat)")
    args = parser.parse_args()
    try:
        reading = read_steal(args.stat)
        if args.since:
            with open(args.since) as f:
                reading = since(reading, json.load(f))
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"steal.py: {e}")
    print(json.dumps(reading))


if __name__ == "__main__":
    main()
