#!/usr/bin/env python3
"""The report of scripts/bench-features.sh: per model and configuration, the max rate at p99 <= each SLA bound (recload
sweep) and the p99 at the fixed rate (recload run), median and worst of the interleaved rounds (the worst max rate is
the lowest, the worst latency the highest; never the best), each configuration's cost against `plain` by median, the
generator's CPU and the machine's steal, the load average before each server start, the TLS connection set-up, and
what the OTLP receiver got. Printed as markdown and, with --doc, written into that document between the section's
markers.

Usage: scripts/bench_features_report.py RESULTS [--configs "plain tracing ..."] [--rounds N] [--sla 5ms,20ms]
           [--rates LIST] [--refine N] [--trace-ratio R] [--access-log-ratio R] [--doc docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
import bench

BEGIN, END = bench.markers("bench-features", "scripts/bench-features.sh")
HEADING = "## What tracing, the access log, TLS and tokens cost: `scripts/bench-features.sh`"
# Issue 34's goal: tracing at 1% sampling and TLS cost at most this share of the max rate.
GOAL = 0.05


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Config:
    """One configuration's rounds."""

    name: str
    max_rps: list[list[float | None]]  # per SLA bound, per round; None: the bound was met at no rate
    sweep_cpu_at_max: list[float]  # recload's CPU share at the step of the max rate (first bound)
    p99_ms: list[float]
    p50_ms: list[float]
    ok: int
    sent: int
    run_cpu: list[float]
    steal_s: list[float]
    load_1m: list[float]
    connect_p50_ms: list[float]  # set-up of the fixed-rate run's connections, before the clock
    reopened: int  # connections opened again during the fixed-rate runs
    spans: int | None  # received by the OTLP receiver over every round
    traces: int | None
    # The server's CPU per rank request over each fixed-rate run (its /metrics before and after), in µs: every
    # thread, the I/O threads, the executor; empty where the run has no scrapes.
    cpu_us: list[float]
    io_us: list[float]
    exec_us: list[float]

    @staticmethod
    def read(directory: Path, rounds: int) -> Config:
        sweeps = [read(directory / f"sweep-{r}.json") for r in range(1, rounds + 1)]
        runs = [read(directory / f"round-{r}.json") for r in range(1, rounds + 1)]
        steps = [read(directory / f"{kind}-{r}.step.json") for r in range(1, rounds + 1) for kind in ("sweep", "round")]
        max_rps = [[s["sla"][i]["max_rps"] for s in sweeps] for i in range(len(sweeps[0]["sla"]))]
        at_max = []
        for sweep, rate in zip(sweeps, max_rps[0], strict=True):
            step = next((s for s in sweep["steps"] if rate is not None and abs(s["mode"]["rate"] - rate) < 1e-6), None)
            if step is not None and step.get("cpu_s") is not None:
                at_max.append(step["cpu_s"] / step["wall_s"])
        connections = [r.get("connections") or {} for r in runs]
        received = [directory / f"received-{r}.json" for r in range(1, rounds + 1)]
        got = [read(p) for p in received if p.is_file()]
        cpu: dict[str, list[float]] = {"all": [], "io": [], "executor": []}
        for r in range(1, rounds + 1):
            before, after = directory / f"round-{r}.before.prom", directory / f"round-{r}.after.prom"
            if not (before.is_file() and after.is_file()):
                continue
            b, a = (bench.samples(p.read_text(encoding="utf-8")) for p in (before, after))
            name = "recserve_requests_total"
            served = bench.total(a, name, endpoint="rank") - bench.total(b, name, endpoint="rank")
            if served <= 0:
                continue
            name = "recserve_thread_cpu_seconds_total"
            for key, labels in (("all", {}), ("io", {"role": "io"}), ("executor", {"role": "executor"})):
                cpu[key].append(1e6 * (bench.total(a, name, **labels) - bench.total(b, name, **labels)) / served)
        loads = []
        load_file = directory / "load.txt"
        if load_file.is_file():
            loads = [float(line.split()[1]) for line in load_file.read_text(encoding="utf-8").splitlines() if line]
        return Config(
            name=directory.name,
            max_rps=max_rps,
            sweep_cpu_at_max=at_max,
            p99_ms=[r["latency_ms"]["p99_ms"] for r in runs],
            p50_ms=[r["latency_ms"]["p50_ms"] for r in runs],
            ok=sum(r["requests"]["ok"] for r in runs),
            sent=sum(r["requests"]["sent"] for r in runs),
            run_cpu=[r["cpu_s"] / r["wall_s"] for r in runs],
            steal_s=[s["steal_s"] for s in steps if s.get("steal_s") is not None],
            load_1m=loads,
            connect_p50_ms=[c["before_run"]["p50_ms"] for c in connections if c.get("before_run")],
            reopened=sum(c["during_run"]["count"] for c in connections if c.get("during_run")),
            spans=sum(g["spans"] for g in got) if got else None,
            traces=sum(g["traces"] for g in got) if got else None,
            cpu_us=cpu["all"],
            io_us=cpu["io"],
            exec_us=cpu["executor"],
        )

    def rate(self, sla: int = 0) -> tuple[float | None, float | None]:
        """Max rate at the `sla`th bound: (median, worst = lowest) of the rounds; a round that met the bound at no
        rate counts as 0."""
        rates = [r or 0.0 for r in self.max_rps[sla]]
        return (statistics.median(rates), min(rates)) if rates else (None, None)


def fmt_rate(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def median_worst(values: list[float], digits: int = 2) -> str:
    if not values:
        return "–"
    return f"{statistics.median(values):.{digits}f} ({max(values):.{digits}f})"


def cost(config: Config, plain: Config, sla: int = 0) -> float | None:
    """The share of plain's max rate (by median) at the `sla`th bound that `config` loses; negative when it did
    better."""
    mine, base = config.rate(sla)[0], plain.rate(sla)[0]
    if not base or mine is None:
        return None
    return 1.0 - mine / base


def noise(plain: Config, sla: int = 0) -> float | None:
    """How far plain's own max rates spread over the rounds, as a share of their median (`None`: median 0)."""
    median, worst = plain.rate(sla)
    rates = [r or 0.0 for r in plain.max_rps[sla]]
    if not median:
        return None
    return (max(rates) - min(rates)) / median


def model_section(directory: Path, names: list[str], rounds: int, slas: list[str]) -> list[str]:
    configs = {name: Config.read(directory / name, rounds) for name in names}
    fixed = (directory / "fixed-rate.txt").read_text(encoding="utf-8").strip()
    plain = configs.get("plain")
    rate_heads = " | ".join(f"max rate, p99 ≤ {sla} | cost" for sla in slas)
    out = [
        f"### {directory.name}",
        "",
        f"| configuration | {rate_heads} | p50 at {fixed}/s ms | p99 at {fixed}/s ms | ok / sent "
        f"| server CPU µs/request: all (io / executor) | recload CPU at max rate | recload CPU at {fixed}/s "
        "| steal s | load (1 min) |",
        "| --- " * (2 * len(slas) + 9) + "|",
    ]
    for name, c in configs.items():
        cells = []
        for i in range(len(slas)):
            median, worst = c.rate(i)
            loss = cost(c, plain, i) if plain and name != "plain" else None
            cells.append(f"{fmt_rate(median)} ({fmt_rate(worst)}) | {'–' if loss is None else f'{100 * loss:+.1f}%'}")
        load = f"{min(c.load_1m):.2f}–{max(c.load_1m):.2f}" if c.load_1m else "–"
        cpu_max = f"{max(c.sweep_cpu_at_max):.2f}" if c.sweep_cpu_at_max else "–"
        steal = f"{max(c.steal_s):.2f}" if c.steal_s else "–"
        server_cpu = (
            f"{statistics.median(c.cpu_us):.0f} ({statistics.median(c.io_us):.0f} / "
            f"{statistics.median(c.exec_us):.0f})"
            if c.cpu_us
            else "–"
        )
        out.append(
            f"| {name} | {' | '.join(cells)} | {median_worst(c.p50_ms, 3)} | {median_worst(c.p99_ms, 3)} | "
            f"{c.ok} / {c.sent} | {server_cpu} | {cpu_max} | {max(c.run_cpu):.2f} | {steal} | {load} |"
        )
    out.append("")
    for i, sla in enumerate(slas):
        per_round = "; ".join(f"{name} {' / '.join(fmt_rate(r) for r in c.max_rps[i])}" for name, c in configs.items())
        out.append(f"Max rate at p99 ≤ {sla} of each round, in order: {per_round}.")
    for name, c in configs.items():
        if c.connect_p50_ms:
            out.append(
                f"{name}: connection set-up before the clock (TCP{' and TLS handshake' if 'tls' in name else ''}) "
                f"p50 {statistics.median(c.connect_p50_ms):.2f} ms (median of the runs' p50), "
                f"{c.reopened} connection(s) reopened during the fixed-rate runs."
            )
        if c.spans is not None:
            out.append(f"{name}: the OTLP receiver got {c.spans} spans of {c.traces} traces over the {rounds} rounds.")
    if plain:
        for i, sla in enumerate(slas):
            verdicts = []
            for name, c in configs.items():
                loss = cost(c, plain, i)
                if name == "plain" or loss is None:
                    continue
                within = "within" if round(loss, 6) <= GOAL else "over"
                verdicts.append(f"{name} {100 * loss:.1f}% ({within} the 5% goal)")
            spread = noise(plain, i)
            if spread is None:
                judged = "; plain met this bound in no round: these rates cannot decide the goal"
            elif spread > GOAL:
                judged = (
                    f"; but plain's own rounds spread {100 * spread:.0f}% of its median, more than the 5% to be "
                    "told apart: these rates cannot decide the goal"
                )
            else:
                judged = ""
            costs = "; ".join(verdicts) or "–"
            out.append(f"Cost against plain, max rate at p99 ≤ {sla} by median: {costs}{judged}.")
    out.append("")
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def report(
    results: Path,
    names: list[str],
    rounds: int,
    slas: list[str],
    trace_ratio: str,
    access_ratio: str,
    rates: str = "200:40000:x1.25",
    refine: int = 3,
) -> str:
    models = sorted(p for p in results.iterdir() if p.is_dir() and (p / "fixed-rate.txt").is_file())
    end_file = results / "load-end.txt"
    end_load = end_file.read_text(encoding="utf-8").split()[1:] if end_file.is_file() else []
    out = [
        BEGIN,
        "",
        f"Rank requests of 100 candidates (`/v1` JSON over HTTP/1.1, 64 connections, open loop), one model per "
        f"table, each configuration on a freshly started server, {rounds} interleaved rounds (every configuration "
        f"once per round in the order of the table). recload (and the OTLP receiver) on CPU 0, the server alone "
        f"on CPU 1 (`--executors 1 --intra-op-threads 1`). Configurations: *plain*; *tracing*, "
        f"`--trace-sample-ratio {trace_ratio}` exporting to a real OTLP/gRPC receiver "
        f"(`examples/otlp_receiver.rs`); *access-log*, `--access-log-sample-ratio {access_ratio} --log-format "
        f"json`; *tls*, `--tls-cert/--tls-key` (ECDSA P-256), recload over `https://` with its handshakes made "
        f"before the clock; *tls-token*, the same and `--inference-tokens-file`, recload sending the token. Max "
        f"rate: `recload sweep --rates {rates} --refine {refine}`. p50/p99: `recload run` at half of plain's "
        f"round-1 max rate at the first bound it met. Each cell: median (worst) of the rounds, the worst max rate "
        f"being the lowest; server "
        f"CPU per rank request over the fixed-rate run (`recserve_thread_cpu_seconds_total` over "
        f"`recserve_requests_total` from /metrics before and after; all threads, then the I/O threads and the "
        f"executor), median of the rounds; recload CPU (share of one core) and steal (seconds, whole machine, per "
        f"sweep or run) the largest of any round; load: the 1-minute load average before each of the "
        f"configuration's server starts (the machine is shared: other engineers' builds run beside "
        f"it{'; ' + ' / '.join(end_load) + ' at the end' if end_load else ''}). CPU: {cpu_model()}.",
        "",
    ]
    for model in models:
        out += model_section(model, names, rounds, slas)
    out.append(END)
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("--configs", default="plain tracing access-log tls tls-token")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sla", default="5ms,20ms")
    p.add_argument("--trace-ratio", default="0.01")
    p.add_argument("--access-log-ratio", default="0.01")
    p.add_argument("--rates", default="200:40000:x1.25")
    p.add_argument("--refine", type=int, default=3)
    p.add_argument("--doc", help="the document whose section (between its markers) gets the report")
    a = p.parse_args()
    slas = [sla.strip().replace("ms", " ms") for sla in a.sla.split(",")]
    text = report(a.results, a.configs.split(), a.rounds, slas, a.trace_ratio, a.access_log_ratio, a.rates, a.refine)
    print(text, end="")
    if a.doc:
        bench.write_section(a.doc, text, BEGIN, END, append=HEADING)


if __name__ == "__main__":
    main()
