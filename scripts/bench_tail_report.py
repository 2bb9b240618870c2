#!/usr/bin/env python3
"""The report of scripts/bench-tail.sh: per variant and load, the client's p50 / p99 as the median / worst of the
rounds against the one-core bound of scripts/tail-model.py, where the slowest 1% spent their time inside the
server, and the server's threads' CPU and run-queue wait per request. Reads the results directory the script
filled and its environment (VARIANTS, COMMAND_LINE, SATURATION, SHARES, ROUNDS, MODEL, SECTION, DURATION); writes
RESULTS/report.md and, with --doc FILE, the same text between the section's markers in FILE.

Usage: (run by scripts/bench-tail.sh) scripts/bench_tail_report.py --results DIR [--doc docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
import bench

# The stages of a request in the server (docs/metrics.md, "Where a request spent its time"), in order.
STAGES = ["read", "decode", "admit", "queue", "dispatch", "gather", "inference", "answer", "encode", "write"]


def prom(path: Path) -> dict[str, float]:
    """Every sample of a /metrics text: `name{labels}` -> value."""
    return bench.samples(path.read_text(encoding="utf-8"))


def delta(prefix: Path) -> dict[str, float]:
    before, after = prom(Path(f"{prefix}.before.prom")), prom(Path(f"{prefix}.after.prom"))
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


total = bench.total


def answered(d: dict[str, float], model: str) -> float:
    return total(d, "recserve_requests_total", model=model, code="200")


def server_figures(prefix: Path, model: str) -> dict:
    """What the server says about one run: stage means (all, and the slowest 1%), CPU and run-queue wait per
    request of its I/O and executor threads, the mean batch and why batches closed."""
    d = delta(prefix)
    n = answered(d, model)
    per_request = lambda name, role: 1e3 * total(d, name, role=role) / n if n else None  # noqa: E731
    batches = {k.split('reason="')[1].split('"')[0]: v for k, v in d.items()
               if k.startswith(f'recserve_batches_total{{model="{model}"')}
    rows = total(d, "recserve_batch_rows_sum", model=model)
    count = total(d, "recserve_batch_rows_count", model=model)
    request_rows = total(d, "recserve_request_rows_sum", model=model) / max(1.0, total(d, "recserve_request_rows_count", model=model))
    # A recall model records no request rows: each of its requests (of one user or several) is one batch entry.
    per_batch = (rows / count / request_rows if request_rows else n / count) if count else None
    out = {
        "requests": n,
        "io_cpu_ms": per_request("recserve_thread_cpu_seconds_total", "io"),
        "exec_cpu_ms": per_request("recserve_thread_cpu_seconds_total", "executor"),
        "io_wait_ms": per_request("recserve_thread_run_queue_wait_seconds_total", "io"),
        "exec_wait_ms": per_request("recserve_thread_run_queue_wait_seconds_total", "executor"),
        "batch_requests": per_batch,
        "batches": batches,
    }
    slow = Path(f"{prefix}.slow.json")
    sums = {s: total(d, "recserve_request_stage_seconds_sum", model=model, stage=s) for s in STAGES}
    counts = {s: total(d, "recserve_request_stage_seconds_count", model=model, stage=s) for s in STAGES}
    out["all"] = {s: 1e3 * sums[s] / counts[s] for s in STAGES if sums[s] is not None and counts[s]}
    if slow.exists():
        records = [r for r in json.loads(slow.read_text())["requests"] if r["model"] == model and r["status"] == 200]
        want = max(1, -(-int(n) // 100))
        top = records[:want]
        if top:
            out["slowest"] = {
                "count": len(top),
                "complete": len(top) == want,
                "total_ms": sum(r["total_ms"] for r in top) / len(top),
                "stages": {s: sum(next((x["ms"] for x in r["stages"] if x["stage"] == s), 0.0) for r in top) / len(top)
                           for s in STAGES},
            }
    return out


def bound(results: Path, model: str, rates: list[int]) -> dict:
    """The one-core bound at each rate, from the saturation runs' costs per request (their medians)."""
    runs = [server_figures(results / f"closed-{i}", model) for i in (1, 2, 3)]
    exec_ms = statistics.median(r["exec_cpu_ms"] for r in runs)
    io_ms = statistics.median(r["io_cpu_ms"] for r in runs)
    # The I/O threads' CPU before the queue (read, decode, admit) and after it (encode, write), in the proportion
    # of those stages' times.
    before = statistics.median(sum(r["all"].get(s, 0.0) for s in ("read", "decode", "admit")) for r in runs)
    after = statistics.median(sum(r["all"].get(s, 0.0) for s in ("encode", "write")) for r in runs)
    decode_ms = io_ms * before / (before + after) if before + after else io_ms
    encode_ms = io_ms - decode_ms
    model_cmd = [sys.executable, str(Path(__file__).resolve().parent / "tail-model.py"), "--exec-ms", f"{exec_ms:.3f}", "--decode-ms",
                 f"{decode_ms:.3f}", "--encode-ms", f"{encode_ms:.3f}", "--rate", ",".join(map(str, rates))]
    text = subprocess.run(model_cmd, capture_output=True, text=True, check=True).stdout
    p99 = {}
    for line in text.splitlines():
        m = re.match(r"\s*(\d+)/s .*p50 ([\d.]+) ms, p99 ([\d.]+) ms", line)
        if m:
            p99[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    saturation = re.search(r"saturation (\d+)/s", text)
    return {"exec_ms": exec_ms, "decode_ms": decode_ms, "encode_ms": encode_ms, "p": p99,
            "model_saturation": int(saturation.group(1)) if saturation else None,
            "command": "scripts/tail-model.py " + " ".join(model_cmd[2:])}


def mw(values: list[float | None], high_is_worse: bool = True) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    return statistics.median(vals), (max(vals) if high_is_worse else min(vals))


def f(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def machine() -> str:
    info = {}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                info[k.strip()] = v.strip()
    except OSError:
        pass
    flags = set(info.get("Flags", "").split())
    simd = [x for x in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if x in flags]
    return (f"{info.get('Model name', platform.processor())}, {info.get('CPU(s)', '?')} vCPUs, "
            f"{', '.join(simd) or 'no AVX2'}; {platform.system()} {platform.release()}")


def workload(results: Path) -> str:
    """What each request asked, from the first saturation run's recload report."""
    w = json.loads((results / "closed-1.json").read_text()).get("workload", {})
    if w.get("kind") == "recall":
        users = w.get("users_per_request") or 1
        return f"recall of {users} user{'s' if users > 1 else ''} a call, top {w.get('k')}"
    return f"{w.get('candidates', 100)} candidates a request"


def closed_failures(results: Path) -> str:
    """The saturation runs' failed requests, when there were any: the saturation counts answers only."""
    runs = [json.loads((results / f"closed-{i}.json").read_text()) for i in (1, 2, 3)]
    failed = sum(r.get("requests", {}).get("errors", 0) for r in runs)
    sent = sum(r.get("requests", {}).get("sent", 0) for r in runs)
    return f" ({failed:,} of {sent:,} requests of those runs failed: not the server's saturation)" if failed else ""


def render(results: Path) -> str:
    env = os.environ
    model, shares, rounds = env["MODEL"], env["SHARES"].split(), int(env["ROUNDS"])
    saturation = float(env["SATURATION"])
    variants = [line.split("|") for line in env["VARIANTS"].strip().splitlines()]
    rates = [round(saturation * float(s)) for s in shares]
    b = bound(results, model, rates)
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    lines = [
        f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {machine()}; recserve {git}; "
        f"{model}, {workload(results)}; recserve on CPU 1 (`--executors 1 --intra-op-threads 1`), recload on "
        f"CPU 0; {rounds} rounds, the variants alternating within each; every open-loop run {env['DURATION']} after "
        "2 s of warm-up, Poisson arrivals on 256 connections.",
        "",
        f"`{env['COMMAND_LINE']}`",
        "",
        f"Closed-loop saturation of the first variant ({env.get('CLOSED_CONCURRENCY', '64')} in flight, the median of 3 runs): **{saturation:,.0f}/s**"
        f"{closed_failures(results)}. "
        f"Its costs per request, from the server's own thread accounts at saturation: executor {b['exec_ms']:.3f} ms, "
        f"I/O threads {b['decode_ms'] + b['encode_ms']:.3f} ms ({b['decode_ms']:.3f} before the queue, "
        f"{b['encode_ms']:.3f} after it, split as those stages' times). The one-core bound (`{b['command']}`: "
        f"saturation {b['model_saturation'] or '?'}/s) is the p99 of a server with exactly these costs and no other "
        "overhead.",
        "",
        "| variant | server flags | load | p50, median / worst | p99, median / worst | one-core bound p99 | p99 ÷ bound, median / worst | steal per run | recload CPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    per = {}
    for name, binary, server_flags, recload_flags in variants:
        for share, rate in zip(shares, rates, strict=True):
            reports, steps, servers = [], [], []
            for r in range(1, rounds + 1):
                prefix = results / f"{name}-{share}-{r}"
                if not Path(f"{prefix}.json").exists():
                    continue
                reports.append(json.loads(Path(f"{prefix}.json").read_text()))
                steps.append(json.loads(Path(f"{prefix}.step.json").read_text()))
                servers.append(server_figures(prefix, model))
            per[(name, share)] = servers
            p50 = mw([x["latency_ms"]["p50_ms"] for x in reports])
            p99 = mw([x["latency_ms"]["p99_ms"] for x in reports])
            bound_p50, bound_p99 = b["p"].get(rate, (None, None))
            ratio = (p99[0] / bound_p99 if bound_p99 else None, p99[1] / bound_p99 if bound_p99 else None)
            failed = sum(x["requests"]["errors"] for x in reports)
            cpu = [100 * x["cpu_s"] / x["wall_s"] for x in reports]
            flags = " ".join(x for x in (server_flags, "" if recload_flags == "--body columnar" else f"(recload {recload_flags})") if x)
            lines.append(
                f"| {name} | {('`' + flags + '`') if flags else 'defaults'} | {rate}/s ({float(share):.0%}) | "
                f"{f(p50[0])} / {f(p50[1])} ms | **{f(p99[0])}** / {f(p99[1])} ms{f' ({failed} failed)' if failed else ''} | "
                f"{f(bound_p99)} ms | {f(ratio[0])} / {f(ratio[1])} | "
                f"{', '.join(f(s['steal_s']) for s in steps)} s | {f(min(cpu), 0)}–{f(max(cpu), 0)}% |"
            )
    lines += [
        "",
        "Where the slowest 1% of each run spent their time inside the server (`/debug/slow-requests`: the mean of "
        "each stage over the run's slowest 1% by their time in the server; the median of the rounds; ms). Their "
        "time in the server is less than the client's p99: the client also counts the time before the server reads "
        "the first byte and after the response leaves it.",
        "",
        "| variant | load | in the server | read + decode + admit | queue | dispatch | gather | inference | answer | encode + write |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, *_ in variants:
        for share, rate in zip(shares, rates, strict=True):
            slow = [s["slowest"] for s in per[(name, share)] if "slowest" in s]
            if not slow:
                continue
            med = lambda key: statistics.median(x["stages"][key] for x in slow)  # noqa: E731
            incomplete = "" if all(x["complete"] for x in slow) else " (record short of 1%)"
            lines.append(
                f"| {name} | {rate}/s | {f(statistics.median(x['total_ms'] for x in slow))}{incomplete} | "
                f"{f(med('read') + med('decode') + med('admit'), 3)} | {f(med('queue'))} | {f(med('dispatch'), 3)} | "
                f"{f(med('gather'), 3)} | {f(med('inference'))} | {f(med('answer'), 3)} | "
                f"{f(med('encode') + med('write'), 3)} |"
            )
    lines += [
        "",
        "The server's threads per answered request (the median of the rounds, ms): CPU and run-queue wait "
        "(`recserve_thread_*`), the mean batch in requests, and why batches closed (all rounds).",
        "",
        "| variant | load | I/O CPU | executor CPU | I/O waited for a core | executor waited for a core | mean batch | batches closed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, *_ in variants:
        for share, rate in zip(shares, rates, strict=True):
            runs = per[(name, share)]
            if not runs:
                continue
            med = lambda key: statistics.median(r[key] for r in runs if r[key] is not None) if any(r[key] is not None for r in runs) else None  # noqa: E731
            reasons: dict[str, float] = {}
            for r in runs:
                for k, v in r["batches"].items():
                    reasons[k] = reasons.get(k, 0.0) + v
            all_batches = sum(reasons.values())
            closed = ", ".join(f"{k} {100 * v / all_batches:.0f}%" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]) if v) if all_batches else "–"
            lines.append(
                f"| {name} | {rate}/s | {f(med('io_cpu_ms'), 3)} | {f(med('exec_cpu_ms'), 3)} | {f(med('io_wait_ms'), 3)} | "
                f"{f(med('exec_wait_ms'), 3)} | {f(med('batch_requests'))} | {closed} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", required=True)
    p.add_argument("--doc")
    a = p.parse_args()
    results = Path(a.results)
    text = render(results)
    (results / "report.md").write_text(text, encoding="utf-8")
    print(text)
    if a.doc:
        begin, end = bench.markers(f"bench-tail ({os.environ['SECTION']})", "scripts/bench-tail.sh --doc")
        # The section's markers must be there already: a new section is placed by hand.
        bench.write_section(a.doc, f"{begin}\n{text}{end}", begin, end, append=None)


if __name__ == "__main__":
    main()
