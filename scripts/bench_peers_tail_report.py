#!/usr/bin/env python3
"""The report of scripts/bench-peers-tail.sh: the peer benchmark's section of docs/benchmarks.md, from its results
directory. Every figure is the median and the worst of the rounds (never the best): the worst is the lowest max
rate, the highest latency. Beside them, for each round and step, the machine's steal time and the load
generator's CPU, and recserve's own stage figures from its /metrics before and after each step.

    bench_peers_tail_report.py describe                          the run's meta.json, from the driver's environment
    bench_peers_tail_report.py report --results DIR --section NAME --doc FILE
                                                                 RESULTS/report.md, and the section spliced into FILE

The results directory (written by the driver):

    meta.json                                      date, command, machine, versions, settings, systems
    <precision>/saturation/closed-<i>.json         recserve's closed-loop runs (their median sets the load points)
    <precision>/triton-tuning/closed.json          Triton's closed-loop run (max batch 64, no delay)
    <precision>/triton-tuning/mb<M>-d<D>-<share>-<i>.json    a tuning run
    <precision>/scores.json, check-<system>.json   recserve's scores, and each other system's agreement with them
    <precision>/round-<r>/<system>/fixed-<point>.json        recload at LOW_RATE (`low`) or a share of saturation
    <precision>/round-<r>/<system>/oha-<share>.json          oha at that share (its JSON output)
    <precision>/round-<r>/<system>/sweep.json                recload sweep (p99 ≤ 5 ms and ≤ 20 ms)
    …/<step>.step.json                             steal and generator CPU over the step (scripts/lib/step.py)
    …/<step>.before.prom, <step>.after.prom        recserve's /metrics around the step
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
import bench

SYSTEMS = ["recserve", "triton", "fastapi", "recserve-split"]
PEERS = ["triton", "fastapi"]
FAILED_RATIO = 0.001  # more failed requests than this and a step's p99 is of the answered ones only


# --- reading --------------------------------------------------------------------------------------------------


def load(path: Path):
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


@dataclass
class Latency:
    """One step's latency, from recload or oha."""

    p50_ms: float | None
    p99_ms: float | None
    failed_ratio: float
    achieved_rps: float


def recload_latency(report: dict | None) -> Latency | None:
    if report is None:
        return None
    lat = report.get("latency_ms") or {}
    requests = report["requests"]
    return Latency(
        lat.get("p50_ms"),
        lat.get("p99_ms"),
        requests["errors"] / max(1, requests["scheduled"]),
        report["achieved_rps"],
    )


def oha_latency(report: dict | None) -> Latency | None:
    if report is None:
        return None
    statuses = {int(k): v for k, v in report.get("statusCodeDistribution", {}).items()}
    errors = sum(report.get("errorDistribution", {}).values()) + sum(
        v for k, v in statuses.items() if not 200 <= k < 300
    )
    total = sum(statuses.values()) + sum(report.get("errorDistribution", {}).values())
    p = report.get("latencyPercentiles", {})
    to_ms = lambda s: None if s is None else 1e3 * s  # noqa: E731
    return Latency(
        to_ms(p.get("p50")), to_ms(p.get("p99")), errors / max(1, total), report["summary"]["requestsPerSec"]
    )


def prom(path: Path, model: str) -> dict[str, float]:
    """The sums of a /metrics scrape's series of `model` (and of the server as a whole), by name and labels that
    matter here: histograms' `_sum` and `_count`, batches by reason, threads by role."""
    values: dict[str, float] = {}
    if not path.is_file():
        return values
    for key, value in bench.samples(path.read_text(encoding="utf-8")).items():
        name, _, labels = key.partition("{")
        if f'model="{model}"' not in labels and not name.startswith(("recserve_thread_", "recserve_machine_")):
            continue
        if name == "recserve_batches_total":
            reason = re.search(r'reason="(\w+)"', labels)
            name = f"closed:{reason.group(1) if reason else '?'}"
        elif name.startswith("recserve_thread_"):
            role = re.search(r'role="(\w+)"', labels)
            name = f"{name}:{role.group(1) if role else '?'}"
        elif not name.endswith(("_sum", "_count")):
            continue
        values[name] = values.get(name, 0.0) + value
    return values


def stages(prefix: Path, model: str) -> dict | None:
    """recserve's own figures over one step, from its /metrics before and after."""
    before, after = prom(Path(f"{prefix}.before.prom"), model), prom(Path(f"{prefix}.after.prom"), model)
    if not after:
        return None
    d = {k: v - before.get(k, 0.0) for k, v in after.items()}

    def mean(name: str) -> float | None:
        count = d.get(f"{name}_count", 0.0)
        return d.get(f"{name}_sum", 0.0) / count if count else None

    rows = mean("recserve_batch_rows")
    per_request = mean("recserve_request_rows")
    inference = mean("recserve_inference_duration_seconds")
    threads = {}
    for key, value in d.items():
        if key.startswith("recserve_thread_cpu_seconds_total:"):
            role = key.split(":", 1)[1]
            wait = d.get(f"recserve_thread_run_queue_wait_seconds_total:{role}")
            threads[role] = (value, wait)
    return {
        "queue_wait_ms": None
        if mean("recserve_queue_duration_seconds") is None
        else 1e3 * mean("recserve_queue_duration_seconds"),
        "batch_rows": rows,
        "batch_requests": rows / per_request if rows and per_request else None,
        "inference_per_100_rows_ms": 1e5 * inference / rows if inference is not None and rows else None,
        "closed": {k.split(":", 1)[1]: v for k, v in d.items() if k.startswith("closed:") and v},
        "threads": threads,
    }


# --- figures --------------------------------------------------------------------------------------------------


def median_and_worst(values: list, worst_is_high: bool):
    """The median and the worst of `values` (None values are skipped), or (None, None)."""
    present = [v for v in values if v is not None]
    if not present:
        return None, None
    return statistics.median(present), (max(present) if worst_is_high else min(present))


def ms(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.0f} ms" if v >= 100 else f"{v:.1f} ms" if v >= 10 else f"{v:.2f} ms"


def rate(v: float | None) -> str:
    return "–" if v is None else f"{v:,.0f}/s"


def latency_cell(runs: list[Latency | None], which: str) -> str:
    values = [getattr(r, which) if r else None for r in runs]
    med, worst = median_and_worst(values, worst_is_high=True)
    if med is None:
        return "–"
    mark = "\\*" if any(r and r.failed_ratio > FAILED_RATIO for r in runs) else ""
    return f"{ms(med)} / {ms(worst)}{mark}"


def sla_rates(sweep: dict | None, sla_ms: float) -> tuple[float | None, bool]:
    """The highest rate at p99 ≤ `sla_ms` (0 when not even the lowest rate met it; None without a sweep), and
    whether it is a lower bound (no rate failed)."""
    if sweep is None:
        return None, False
    for s in sweep["sla"]:
        if s["p99_ms"] == sla_ms:
            return (s["max_rps"] or 0.0), s["first_failing_rps"] is None
    return None, False


def rate_cell(found: list[tuple[float | None, bool]], lowest: float) -> str:
    values = sorted((v, bound) for v, bound in found if v is not None)
    if not values:
        return "–"
    med = values[len(values) // 2] if len(values) % 2 else None
    if med is None:  # an even number of rounds: the mean of the middle two
        a, b = values[len(values) // 2 - 1], values[len(values) // 2]
        med = ((a[0] + b[0]) / 2, a[1] and b[1])
    worst = values[0]

    def one(v: tuple[float, bool]) -> str:
        if v[0] == 0:
            return f"< {lowest:,.0f}/s"
        return ("≥ " if v[1] else "") + rate(v[0])

    return f"{one(med)} / {one(worst)}"


def cpu_share(step: dict | None, report: dict | None) -> str:
    """The generator's share of one core over a step: recload's own `cpu_s` over its run (for a sweep, its busiest
    rate, marked `max`), else (oha) the step's CPU from getrusage over its wall time."""
    runs = [] if report is None else report.get("steps") or [report]  # a sweep's runs, or the run itself
    shares = [r["cpu_s"] / r["wall_s"] for r in runs if r.get("cpu_s") is not None and r.get("wall_s")]
    if shares:
        return f"{'max ' if len(shares) > 1 else ''}{100 * max(shares):.0f}%"
    if not step or not step.get("wall_s"):
        return "?"
    return f"{100 * step['generator_cpu_s'] / step['wall_s']:.0f}%"


def steal(step: dict | None) -> str:
    if not step or step.get("steal_s") is None:
        return "?"
    return f"{step['steal_s']:.2f} s"


# --- the section ----------------------------------------------------------------------------------------------


class Results:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.meta = load(root / "meta.json")
        if self.meta is None:
            sys.exit(
                f"bench_peers_tail_report.py: {root}/meta.json is missing: not a bench-peers-tail results directory"
            )
        self.rounds = int(self.meta["settings"]["ROUNDS"])

    def dir(self, precision: str, round_: int, system: str) -> Path:
        return self.root / precision / f"round-{round_}" / system

    def runs(self, precision: str, system: str, name: str, reader=recload_latency) -> list:
        return [reader(load(self.dir(precision, r, system) / f"{name}.json")) for r in range(1, self.rounds + 1)]


def precision_section(res: Results, p: dict) -> list[str]:
    meta, name = res.meta, p["name"]
    shares = meta["settings"]["SHARES"].split()
    low = float(meta["settings"]["LOW_RATE"])
    saturation = float(p["saturation_rps"])
    rates_at = {s: max(1, round(saturation * float(s))) for s in shares}
    closed = [
        load(f) for f in sorted((res.root / name / "saturation").iterdir()) if re.fullmatch(r"closed-\d+\.json", f.name)
    ]
    closed_rates = ", ".join(rate(c["achieved_rps"]) for c in closed)
    out = [
        f"### {name.upper()}: {p['model']} (plain graph), split row {p['split_model']}",
        "",
        f"recserve's closed-loop saturation: **{rate(saturation)}** (the median of {len(closed)} run(s): "
        f"{closed_rates}; {meta['settings']['CLOSED_CONCURRENCY']} in flight); the load points: "
        + ", ".join(f"{float(s):.0%} = {rate(rates_at[s])}" for s in shares)
        + ".",
        "",
    ]
    header = ["system", "max rate, p99 ≤ 5 ms", "max rate, p99 ≤ 20 ms", f"p50 at {low:.0f}/s", f"p99 at {low:.0f}/s"]
    for s in shares:
        header += [f"p99 at {float(s):.0%} ({rate(rates_at[s])})", f"oha p99 at {float(s):.0%}"]
    out += ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    lowest = float(meta["settings"]["RATES"].split(":")[0].split(",")[0])
    medians: dict[str, dict[float, float]] = {}
    for system in SYSTEMS:
        sweeps = [load(res.dir(name, r, system) / "sweep.json") for r in range(1, res.rounds + 1)]
        if not any(sweeps):
            continue
        cells = []
        for sla in (5.0, 20.0):
            found = [sla_rates(s, sla) for s in sweeps]
            cells.append(rate_cell(found, lowest))
            present = [v for v, _ in found if v is not None]
            medians.setdefault(system, {})[sla] = statistics.median(present) if present else 0.0
        fixed_low = res.runs(name, system, "fixed-low")
        cells += [latency_cell(fixed_low, "p50_ms"), latency_cell(fixed_low, "p99_ms")]
        for s in shares:
            cells += [
                latency_cell(res.runs(name, system, f"fixed-{s}"), "p99_ms"),
                latency_cell(res.runs(name, system, f"oha-{s}", oha_latency), "p99_ms"),
            ]
        out.append(f"| {meta['systems'][system]['name']} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Each cell: median / worst of the rounds (the worst max rate is the lowest; the worst latency the highest). "
        f"*< {lowest:,.0f}/s*: not met at the lowest rate tried; *≥*: no rate tried failed it. \\*: in at least one "
        f"round more than {FAILED_RATIO:.1%} of the step's requests failed (timed out or were refused), so its p99 "
        "is of the answered ones.",
        "",
    ]
    ratios = []
    for sla in (5.0, 20.0):
        best = max(PEERS, key=lambda s: medians.get(s, {}).get(sla, 0.0))
        mine, theirs = medians.get("recserve", {}).get(sla), medians.get(best, {}).get(sla, 0.0)
        if mine is None:
            continue
        if not theirs:
            ratio = "neither peer met it at the lowest rate tried"
        elif not mine:
            ratio = f"recserve did not meet it at the lowest rate tried, {meta['systems'][best]['name']} did"
        else:
            ratio = f"**{mine / theirs:.2f}×** ({meta['systems'][best]['name']})"
        ratios.append(f"p99 ≤ {sla:.0f} ms: {ratio}")
    out += ["recserve ÷ the best peer, max rate by median: " + "; ".join(ratios) + ".", ""]
    out += stage_table(res, name, p, shares)
    out += noise_table(res, name, shares)
    out += tuning_table(res, name, p)
    return out


def stage_table(res: Results, name: str, p: dict, shares: list[str]) -> list[str]:
    rows = []
    for system, model in (("recserve", p["model"]), ("recserve-split", p["split_model"])):
        for s in shares:
            found = [stages(res.dir(name, r, system) / f"fixed-{s}", model) for r in range(1, res.rounds + 1)]
            found = [f for f in found if f]
            if not found:
                continue

            def med(key: str, found: list[dict] = found) -> float | None:
                return median_and_worst([f[key] for f in found], True)[0]

            closed: dict[str, list[float]] = {}
            for f in found:
                for reason, count in f["closed"].items():
                    closed.setdefault(reason, []).append(count)
            closed_text = ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in sorted(closed.items())) or "–"
            roles: dict[str, list[tuple[float, float | None]]] = {}
            for f in found:
                for role, figures in f["threads"].items():
                    roles.setdefault(role, []).append(figures)
            threads = "; ".join(
                f"{role} {statistics.median(c for c, _ in v):.2f} s"
                + (
                    f" (waited {statistics.median(w for _, w in v if w is not None):.2f} s)"
                    if any(w is not None for _, w in v)
                    else ""
                )
                for role, v in sorted(roles.items())
            )
            batch_rows, batch_requests = med("batch_rows"), med("batch_requests")
            rows.append(
                [
                    res.meta["systems"][system]["name"],
                    f"{float(s):.0%}",
                    ms(med("queue_wait_ms")),
                    "–" if batch_rows is None else f"{batch_rows:.0f} ({batch_requests or 0:.2f} requests)",
                    ms(med("inference_per_100_rows_ms")),
                    closed_text,
                ]
                + ([threads] if threads else [])
            )
    if not rows:
        return []
    header = [
        "system",
        "load",
        "mean queue wait",
        "mean batch: rows (requests)",
        "inference per 100 rows",
        "batches closed by (median count)",
    ]
    if any(len(r) > len(header) for r in rows):
        header.append("thread CPU by role (run-queue wait)")
    out = [
        "recserve's own figures over the fixed-rate steps (`/metrics` before and after, the step's warm-up "
        "included; median of the rounds):",
        "",
        "| " + " | ".join(header) + " |",
        "| --- | --- |" + " ---: |" * 3 + " --- |" + (" --- |" if len(header) > 6 else ""),
    ]
    out += ["| " + " | ".join(r + [""] * (len(header) - len(r))) + " |" for r in rows]
    return [*out, ""]


def noise_table(res: Results, name: str, shares: list[str]) -> list[str]:
    steps = ["fixed-low"] + [x for s in shares for x in (f"fixed-{s}", f"oha-{s}")] + ["sweep"]
    low = float(res.meta["settings"]["LOW_RATE"])
    titles = [f"{low:.0f}/s"] + [x for s in shares for x in (f"{float(s):.0%}", f"oha {float(s):.0%}")] + ["sweep"]
    out = [
        "The machine's steal time over each step and the load generator's CPU (its share of one core: recload's own "
        "`cpu_s`, for a sweep at its busiest rate; oha's from getrusage), per round: compare systems within rounds "
        "of similar steal.",
        "",
        "| round | system | " + " | ".join(titles) + " |",
        "| ---: | --- |" + " ---: |" * len(titles),
    ]
    for r in range(1, res.rounds + 1):
        for system in SYSTEMS:
            d = res.dir(name, r, system)
            if not d.is_dir():
                continue
            cells = [
                f"{steal(load(d / f'{s}.step.json'))} · "
                f"{cpu_share(load(d / f'{s}.step.json'), None if s.startswith('oha') else load(d / f'{s}.json'))}"
                for s in steps
            ]
            out.append(f"| {r} | {res.meta['systems'][system]['name']} | " + " | ".join(cells) + " |")
    return [*out, "", "Each cell: steal · generator CPU.", ""]


def tuning_table(res: Results, name: str, p: dict) -> list[str]:
    tuning = res.root / name / "triton-tuning"
    closed = load(tuning / "closed.json")
    if closed is None:
        return []
    shares = res.meta["settings"]["TUNE_SHARES"].split()
    runs: dict[tuple[int, int], dict[str, list[float]]] = {}
    for f in sorted(tuning.glob("mb*-d*-*.json")):
        m = re.fullmatch(r"mb(\d+)-d(\d+)-([0-9.]+)-(\d+)\.json", f.name)
        if not m:
            continue
        lat = recload_latency(load(f))
        p99 = math.inf if lat.failed_ratio > FAILED_RATIO or lat.p99_ms is None else lat.p99_ms
        runs.setdefault((int(m[1]), int(m[2])), {}).setdefault(m[3], []).append(p99)
    chosen = tuple(p["triton_setting"])
    sat = closed["achieved_rps"]
    out = [
        f"Triton's tuning step: its closed-loop saturation with max batch 64 and no delay, {rate(sat)}; each setting "
        "at "
        + " and ".join(f"{float(s):.0%} of it ({rate(max(1, round(sat * float(s))))})" for s in shares)
        + f", {res.meta['settings']['TUNE_REPEATS']} run(s) each; the setting with the lowest median p99 is "
        "benchmarked (bold). ∞: more than 0.1% of requests failed.",
        "",
        "| max_batch_size | max_queue_delay_microseconds | "
        + " | ".join(f"p99 at {float(s):.0%}" for s in shares)
        + " | median |",
        "| ---: | ---: |" + " ---: |" * (len(shares) + 1),
    ]
    fmt = lambda v: "∞" if v == math.inf else ms(v)  # noqa: E731
    for key in sorted(runs):
        every = [v for s in shares for v in runs[key].get(s, [])]
        cells = [", ".join(fmt(v) for v in runs[key].get(s, [])) for s in shares] + [fmt(statistics.median(every))]
        row = [str(key[0]), str(key[1]), *cells]
        if key == chosen:
            row = [f"**{c}**" for c in row]
        out.append("| " + " | ".join(row) + " |")
    return [*out, ""]


def checks(res: Results) -> list[str]:
    out = [
        "### Same answers",
        "",
        "Before measuring (first round), every system scored recserve's sample requests; its scores were compared "
        "with recserve's on the plain graph, within an absolute tolerance: 1e-5 for the peers, "
        f"{res.meta['settings'].get('SPLIT_TOLERANCE') or '?'} for recserve's split row (its INT8 graph is "
        "quantized on its own, so its scores differ from the plain graph's by up to ~0.01; scores spread over 0 to "
        "1, so the check still tells the same model from another).",
        "",
        "| precision | system | samples | scores | largest difference |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for p in res.meta["precisions"]:
        for system in SYSTEMS[1:]:
            c = load(res.root / p["name"] / f"check-{system}.json")
            if c:
                out.append(
                    f"| {p['name']} | {res.meta['systems'][system]['name']} | {c['samples']} | {c['scores']} | "
                    f"{c['worst_abs_diff']:.1e} |"
                )
    return [*out, ""]


def render(res: Results, section: str) -> str:
    meta = res.meta
    out = [
        begin(section),
        f"## Peer benchmark ({section}): recserve, Triton and FastAPI at their strongest, in interleaved rounds",
        "",
        f"Produced by `{meta['command']}` on {meta['date']}: {res.rounds} round(s), measured as the section "
        '"Peer benchmark" above describes.',
        "",
    ]
    if meta.get("note"):
        out += [f"> **{meta['note']}**", ""]
    if meta["settings"].get("QUICK") == "1":
        out += [
            "> **`--quick`: short steps, one round — a check that the benchmark runs, not figures to publish.**",
            "",
        ]
    out += [
        f"Machine: {'; '.join(meta['machine'])}. Pinning: {meta['pinning']}.",
        "",
        "Systems: " + " ".join(f"**{s['name']}**: {s['how']}" for s in meta["systems"].values()),
        "",
        f"Load: {meta['load']}",
        "",
    ]
    for p in meta["precisions"]:
        out += precision_section(res, p)
    out += checks(res)
    out += [
        "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(meta["versions"].items())) + ".",
        "",
        end(section),
    ]
    return "\n".join(out) + "\n"


def begin(section: str) -> str:
    return bench.markers(f"bench-peers-tail ({section})", "scripts/bench-peers-tail.sh")[0]


def end(section: str) -> str:
    return bench.markers(f"bench-peers-tail ({section})", "scripts/bench-peers-tail.sh")[1]


def splice(document: str, text: str, section: str) -> str:
    """`document` with the section between its markers replaced by `text` (appended when it has none)."""
    return bench.replace_section(document, text, begin(section), end(section))


# --- describe ---------------------------------------------------------------------------------------------------


def describe() -> dict:
    """meta.json, from the driver's environment and this machine."""
    env = os.environ

    def sh(*cmd: str) -> str:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()

    lscpu = dict(
        (k.strip(), v.strip()) for k, v in (line.split(":", 1) for line in sh("lscpu").splitlines() if ":" in line)
    )
    flags = set(lscpu.get("Flags", "").split())
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    machine = [
        f"{lscpu.get('Model name', platform.processor())}, {lscpu.get('CPU(s)', '?')} logical CPUs, SIMD: "
        f"{', '.join(simd) or 'none of avx2/fma/avx512'}",
        f"L2 {lscpu.get('L2 cache', '?')}, L3 {lscpu.get('L3 cache', '?')}, "
        f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB, "
        f"{platform.system()} {platform.release()}",
    ]
    pkgs = json.loads(
        sh(
            env["VENV_PYTHON"],
            "-c",
            "import json, importlib.metadata as m; print(json.dumps({p: m.version(p) for p in "
            "('nvidia-pytriton', 'fastapi', 'uvicorn', 'uvloop', 'httptools', 'orjson', 'onnxruntime', 'numpy')}))",
        )
    )
    root = env["ROOT"]
    rev = sh("git", "-C", root, "rev-parse", "--short", "HEAD")
    dirty = " + uncommitted changes" if sh("git", "-C", root, "status", "--porcelain", "--untracked-files=no") else ""
    ort = re.search(r"libonnxruntime\.so\.([\d.]+)", env.get("ORT_DYLIB_PATH", ""))
    versions = {
        "recserve": f"{rev}{dirty}",
        "onnxruntime (recserve)": ort.group(1) if ort else "?",
        "rustc": [*sh("rustc", "--version").split(" "), "?", "?"][1],
        "oha": env.get("OHA_VERSION", "?").removeprefix("oha "),
    }
    versions.update({f"{k} (peers)" if k in ("onnxruntime", "numpy") else k: v for k, v in pkgs.items()})
    saturations = dict(line.split("=", 1) for line in env["SATURATIONS"].split())
    triton = dict(line.split("=", 1) for line in env["TRITON_SETTINGS"].splitlines() if line)
    cores = int(env["SERVER_CORES"])
    preset = env["PRESET"]
    flags_note = f" `{env['RECSERVE_FLAGS']}`" if env.get("RECSERVE_FLAGS") else ""
    settings = {
        k: env.get(k, "")
        for k in [
            "ROUNDS",
            "SHARES",
            "LOW_RATE",
            "CONNECTIONS",
            "TIMEOUT",
            "WARMUP",
            "DURATION",
            "SWEEP_DURATION",
            "RATES",
            "MIN_REQUESTS",
            "REFINE",
            "OHA_DURATION",
            "TUNE_SHARES",
            "TUNE_REPEATS",
            "TUNE_DURATION",
            "SATURATION_RUNS",
            "CLOSED_CONCURRENCY",
            "CANDIDATES",
            "RECSERVE_BODY",
            "SPLIT_TOLERANCE",
            "QUICK",
        ]
    }
    s = settings
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": env["COMMAND_LINE"],
        "note": env.get("BENCH_NOTE") or None,
        "machine": machine,
        "pinning": env["PINNING"],
        "versions": versions,
        "settings": settings,
        "load": (
            f"recload, open loop, Poisson arrivals, {s['CONNECTIONS']} connections, {s['TIMEOUT']} timeout, "
            f"{s['CANDIDATES']} candidates per request (the same requests for every system: seed 1, a pool of 1000, "
            f"Zipf ids); each fixed-rate step {s['WARMUP']} of warm-up then {s['DURATION']} measured, latency from "
            f"each request's scheduled send time. Sweeps: rates {s['RATES']}, {s['REFINE']} bisection step(s) per "
            f"SLA, each step at least {s['SWEEP_DURATION']} and {s['MIN_REQUESTS']} requests, one run per rate. oha "
            f"{versions['oha']}: `-q RATE --latency-correction -c {s['CONNECTIONS']} -z {s['OHA_DURATION']} -w -t "
            f"{s['TIMEOUT']}`, the same bodies (JSON: the pool, a line each; Triton's binary tensors: the first "
            "body, every time), no warm-up."
        ),
        "precisions": [
            {
                "name": p,
                "model": f"{preset}-{p}",
                "split_model": f"{preset}-{p}-split",
                "saturation_rps": float(saturations[p]),
                "triton_setting": [int(x) for x in triton[p].split()],
            }
            for p in ("int8", "fp32")
        ],
        "systems": {
            "recserve": {
                "name": "recserve",
                "how": f"`recserve serve --executors {cores} --intra-op-threads 1`{flags_note}, the "
                f"{s['RECSERVE_BODY']} `/v1` body;",
            },
            "triton": {
                "name": "Triton 2.51 (Python backend)",
                "how": f"tritonserver from the PyPI `nvidia-pytriton` wheel, `instance_group {{ count: {cores} }}`: "
                "`loadtest/peers/triton_model.py` reads the user's ids and dense values and the candidates' id "
                "matrix as KServe v2 binary tensors, gathers a whole dynamic batch in numpy and scores it in one "
                "onnxruntime run; `max_batch_size` and `max_queue_delay_microseconds` from the tuning step;",
            },
            "fastapi": {
                "name": "FastAPI + uvicorn",
                "how": f"`loadtest/peers/fastapi_server.py` under `uvicorn --workers {cores} --loop uvloop --http "
                "httptools --no-access-log`: an `async def` handler, the raw columnar body parsed with orjson, one "
                "numpy take per table, onnxruntime in the event loop, an orjson answer;",
            },
            "recserve-split": {
                "name": "recserve, split graph (extra row)",
                "how": "recserve as above on the model's split version: the user part of the graph once per "
                "request (the peers have no such graph). Every onnxruntime session has one intra-op thread.",
            },
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("describe", help="print meta.json from the driver's environment")
    r = sub.add_parser("report", help="write RESULTS/report.md and the section into --doc")
    r.add_argument("--results", type=Path, required=True)
    r.add_argument("--section", required=True)
    r.add_argument("--doc", type=Path, required=True)
    a = p.parse_args()
    if a.command == "describe":
        print(json.dumps(describe(), indent=2))
        return
    text = render(Results(a.results), a.section)
    (a.results / "report.md").write_text(text, encoding="utf-8")
    bench.write_section(a.doc, text, begin(a.section), end(a.section))


if __name__ == "__main__":
    main()
