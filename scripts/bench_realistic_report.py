"""Writes the "Realistic model" section of docs/benchmarks.md from the reports of scripts/bench-realistic.sh.

Every figure comes from a recload report (`recload.run/v1`, `recload.ceiling/v1`) or the server's /metrics under
--results; recload's CPU use is its user + system time over its wall time (`/usr/bin/time`), in % of one core.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
import bench

BEGIN, END = bench.markers("realistic benchmark", "scripts/bench-realistic.sh")


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _cpu(prefix: Path) -> str:
    user, system, wall = (float(v) for v in Path(f"{prefix}.time").read_text().split()[-3:])
    return f"{100 * (user + system) / wall:.0f}%"


def _ceiling(path: Path, rows: int) -> float:
    return next(b["requests_per_s"] for b in _json(path)["batches"] if b["rows"] == rows)


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _saturation_row(results: Path, name: str, label: str) -> tuple[str, float]:
    d = results / name
    closed, opened = _json(d / "closed.json"), _json(d / "open.json")
    rows = float((d / "batch-rows.txt").read_text())
    ceiling = _json(d / "ceiling.json")
    at_rows = max(100, round(rows / 100) * 100)
    c_rows, c_one = _ceiling(d / "ceiling.json", at_rows), _ceiling(d / "ceiling.json", 100)
    bucket = next(b["bucket"] for b in ceiling["batches"] if b["rows"] == at_rows)
    sat = opened["achieved_rps"]
    failed = ", ".join(f"{k} {v}" for k, v in sorted(opened["errors"].items())) or "none"
    line = (
        f"| {label} | {closed['achieved_rps']:.0f}/s ({_cpu(d / 'closed')}) | {opened['offered_rps']:.0f}/s | "
        f"**{sat:.0f}/s** ({_cpu(d / 'open')}) | {failed} | {rows:.0f} | {c_rows:.0f}/s ({at_rows} → {bucket}) | "
        f"**{sat / c_rows:.2f}** | {c_one:.0f}/s |"
    )
    return line, sat / c_rows


def render(results: Path, repository: Path, rounds: int, overload: float, connections: int, note: str) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
    code = f"recserve {commit}{' + uncommitted changes' if dirty else ''}"
    lines = [
        BEGIN,
        "## Realistic model: serving efficiency, and the user side gathered once",
        "",
        f"Produced by `scripts/bench-realistic.sh` on {when} ({code}): "
        f"{_cpu_name()}, 2 CPUs; recload on CPU 0, recserve (or the in-process ceiling) on CPU 1, "
        "`--executors 1 --intra-op-threads 1`. Model: `synth --preset realistic` in "
        f"`{repository}` (26 fields × 16 factors, fp32 tables of up to 1M rows, 254 MiB, MLP 429→400→400→400→1, "
        "**random weights**; [models/README.md](../models/README.md#benchmark-models-of-realistic-size)), its INT8 QDQ "
        "and fp32 graphs; recload's rank requests, 1 user × 100 candidates (Zipf ids, hot rows scattered).",
        "",
    ]
    if note:
        lines += [note, ""]
    lines += [
        "### Serving efficiency",
        "",
        f"Open-loop saturation: recload offers {overload} × the closed-loop saturation (Poisson arrivals, {connections} "
        "connections, 2 s timeout) and the rate of successful answers is the server's saturation throughput (the rest "
        "are refused with 429 at admission: the connections outnumber the server's queue of 256 requests, so the "
        "excess is refused by the server instead of waiting in recload's connection pool, where its send delay would "
        "count against the 2 s timeout and cap the rate recload sees below what the server answers). The ceiling is `recload ceiling`, recserve's own gather + ONNX Runtime "
        "code without a server, on the server's core, at the mean batch the server executed in that open-loop run "
        "(from its `/metrics`, rounded to whole requests, run at that size as the server runs a batch on the CPU, "
        "a split graph as its two parts). Efficiency = open-loop saturation ÷ that ceiling. In brackets beside each "
        "rate: recload's own CPU use, in % of its core. The split graphs (`synth --split`, "
        "[below](#the-split-graph-the-user-side-computed-once-per-request)) run their user part once per request; "
        "the demo DeepFM is `models/demo/deepfm` (INT8 graph and int8 tables of 4 to 1,508 rows, MLP 400×3, "
        "19 user and 7 item-side fields).",
        "",
        "| graph | closed-loop saturation (recload CPU) | offered | open-loop saturation (recload CPU) | failed in the "
        "open-loop window | mean batch rows | ceiling at that batch (rows → rows run) | efficiency | ceiling at 1 request "
        "per batch |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, label in (
        ("realistic-int8", "INT8"),
        ("realistic-fp32", "FP32"),
        ("realistic-int8-split", "INT8, split"),
        ("realistic-fp32-split", "FP32, split"),
        ("deepfm", "demo DeepFM (INT8)"),
    ):
        lines.append(_saturation_row(results, name, label)[0])
    lines += [
        "",
        "### The user side gathered once (`--gather-user-once`)",
        "",
        "Every candidate of a `/v1` rank request carries the request's user and context ids; with "
        "`--gather-user-once on` (the default) the executor gathers each request's user-side rows once and copies "
        "them to its candidates, with `off` once per candidate (the scores are the same bits: "
        "`tests/synth_models.rs`, `embedding::shared`'s tests). The INT8 graph, 13 user-side fields of 26. "
        f"In-process ceiling at 1000-row batches, on and off alternated, {rounds} rounds:",
        "",
        "| candidates per request | on (requests/s, each round) | off (requests/s, each round) | on ÷ off (means) |",
        "| ---: | --- | --- | ---: |",
    ]
    for c in (100, 1000):
        on = [_ceiling(results / f"user-on-c{c}-r{r}.json", 1000) for r in range(1, rounds + 1)]
        off = [_ceiling(results / f"user-off-c{c}-r{r}.json", 1000) for r in range(1, rounds + 1)]
        fmt = ", ".join
        lines.append(
            f"| {c} | {fmt(f'{v:.1f}' for v in on)} | {fmt(f'{v:.1f}' for v in off)} | "
            f"{(sum(on) / len(on)) / (sum(off) / len(off)):.3f} |"
        )
    lines += [
        "",
        "The server's open-loop saturation with each (measured as above):",
        "",
        "| candidates per request | on (recload CPU) | off (recload CPU) | on ÷ off |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for c in (100, 1000):
        on, off = results / f"server-user-on-c{c}", results / f"server-user-off-c{c}"
        r_on, r_off = _json(on / "open.json")["achieved_rps"], _json(off / "open.json")["achieved_rps"]
        lines.append(
            f"| {c} | {r_on:.1f}/s ({_cpu(on / 'open')}) | {r_off:.1f}/s ({_cpu(off / 'open')}) | {r_on / r_off:.3f} |"
        )
    lines += ["", END]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--overload", type=float, required=True)
    parser.add_argument("--connections", type=int, required=True)
    parser.add_argument("--doc", type=Path, required=True)
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    section = render(args.results, args.repository, args.rounds, args.overload, args.connections, args.note)
    bench.write_section(args.doc, section, BEGIN, END)


if __name__ == "__main__":
    main()
