"""Writes the "Dynamic batching" section of docs/benchmarks.md from scripts/bench-batching.sh's recload reports.

Run by that script; reads target/bench-batching/{c<N>-<on|off>/{saturation,open-<load>}.json, overload/...}.
"""

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
import bench

BEGIN, END = bench.markers("batching benchmark", "scripts/bench-batching.sh")


def load(path):
    return json.loads(Path(path).read_text())


def ms(v):
    if v is None:
        return "—"
    return f"{v:.2f} ms" if v < 10 else f"{v:.1f} ms" if v < 100 else f"{v:.0f} ms"


def lat(report):
    """p50 / p99 of the successful requests, or why there are none."""
    latency = report["latency_ms"]
    if latency is None:
        return "no answer"
    return f"{ms(latency['p50_ms'])} / {ms(latency['p99_ms'])}"


def failed(report):
    r = report["requests"]
    if r["errors"] == 0:
        return "0"
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(report["errors"].items()))
    return f"{100 * r['errors'] / max(r['scheduled'], 1):.1f}% ({kinds})"


def metric_sum(text, name, **labels):
    """Sum of the samples of metric `name` in a /metrics text whose labels include `labels` (none: every sample)."""
    return bench.total(bench.samples(text), name, **labels)


def mean_batch(before, after):
    """Mean rows per executed batch between two /metrics scrapes."""
    a, b = Path(before).read_text(), Path(after).read_text()
    rows = metric_sum(b, "recserve_batch_rows_sum") - metric_sum(a, "recserve_batch_rows_sum")
    count = metric_sum(b, "recserve_batch_rows_count") - metric_sum(a, "recserve_batch_rows_count")
    return rows / count if count else None


def quantiles(r):
    """p50 / p90 / p99 / max of one latency summary of a recload report."""
    return " / ".join(ms(r[k]) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms"))


def main():
    ap = argparse.ArgumentParser()
    for name in ("results", "doc", "candidates", "loads", "overload-candidates", "deadline-ms", "overload-s",
                 "alive", "pinning", "concurrency", "note"):
        ap.add_argument(f"--{name}", required=name != "note", default="")
    args = ap.parse_args()
    results = Path(args.results)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")
    any_run = load(next(results.glob("c*-on/saturation.json")))
    # When the measurements began (the first recload run), not when this report was written.
    started = min(load(p)["started_at"] for p in results.glob("*/*.json"))
    now = datetime.datetime.fromisoformat(started.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M UTC")
    out = [BEGIN, "## Dynamic batching", ""]
    if args.note:
        out += [f"> **{args.note}**", ""]
    out += [
        f"Produced by `scripts/bench-batching.sh` on {now}: {cpu}, {__import__('os').cpu_count()} CPUs; "
        f"{args.pinning}. Model `{any_run['workload']['path'].split('/')[3]}` of `models/demo` (INT8 DeepFM), "
        "rank requests of one user and N candidates with Zipf-distributed ids (recload's rank workload). "
        "Batching on uses the defaults (a batch closes at 1024 rows or when its oldest request has waited 500 µs); "
        "off executes each request alone, with the same queue, admission and deadlines.",
        "",
        f"Saturation: closed loop, {args.concurrency} requests in flight, latency from the send. Offered loads: open "
        "loop, Poisson arrivals on 256 connections, latency from each request's scheduled send time, the same "
        "rates for both modes (fractions of batching on's saturation throughput); failed requests are refused "
        "(429), expired (504) or timed out (2 s) and are not in the latencies. A large recload send delay means the "
        "generator itself (one core) could not keep up with the offered rate: such rows measure recload, not recserve.",
        "",
    ]
    ratios = []
    for c in args.candidates.split():
        sat = {m: load(results / f"c{c}-{m}" / "saturation.json") for m in ("off", "on")}
        batch = {m: mean_batch(results / f"c{c}-{m}" / "metrics-before.txt",
                               results / f"c{c}-{m}" / "metrics-saturation.txt") for m in ("off", "on")}
        ratio = sat["on"]["achieved_rps"] / sat["off"]["achieved_rps"]
        ratios.append((c, ratio, sat))
        out += [
            f"### {c} candidates per request",
            "",
            "| | batching off | batching on | on ÷ off |",
            "| --- | ---: | ---: | ---: |",
            f"| saturation throughput (requests/s) | {sat['off']['achieved_rps']:.0f} | {sat['on']['achieved_rps']:.0f} "
            f"| {ratio:.2f}× |",
            f"| p50 / p99 at saturation | {lat(sat['off'])} | {lat(sat['on'])} | |",
            f"| mean rows per executed batch | {batch['off']:.0f} | {batch['on']:.0f} | |",
            "",
            "| offered | batching off: achieved | p50 / p99 | failed | batching on: achieved | p50 / p99 | failed "
            "| recload send delay p99 (off / on) |",
            "| ---: | ---: | --- | --- | ---: | --- | --- | --- |",
        ]
        for f in args.loads.split():
            runs = {m: load(results / f"c{c}-{m}" / f"open-{f}.json") for m in ("off", "on")}
            out.append(
                f"| {runs['on']['offered_rps']:.0f}/s | {runs['off']['achieved_rps']:.0f}/s | {lat(runs['off'])} "
                f"| {failed(runs['off'])} | {runs['on']['achieved_rps']:.0f}/s | {lat(runs['on'])} "
                f"| {failed(runs['on'])} | {ms(runs['off']['send_delay_ms']['p99_ms'])} / "
                f"{ms(runs['on']['send_delay_ms']['p99_ms'])} |"
            )
        out.append("")

    run = load(results / "overload" / "run.json")
    rss = [int(x) for x in (results / "overload" / "rss-kib.txt").read_text().split()]
    third = max(1, len(rss) // 3)
    refused = run["error_response_ms"].get("http_429")
    control = load(results / "control" / "run.json")
    control_refused = control["error_response_ms"].get("http_429")
    scrape = (results / "overload" / "metrics.txt").read_text()
    margin = (ms(1000 * metric_sum(scrape, "recserve_admission_margin_seconds"))
              if "recserve_admission_margin_seconds" in scrape else "not exported")
    fast = int(metric_sum(scrape, "recserve_request_duration_seconds_bucket", endpoint="rank", le="0.001"))
    refusals = int(metric_sum(scrape, "recserve_requests_total", endpoint="rank", code="429"))
    accepted = run["latency_ms"]
    total = run["requests"]["scheduled"]
    out += [
        "### Twice the sustainable load",
        "",
        f"Batching on, {args.overload_candidates} candidates per request, offered {run['offered_rps']:.0f}/s "
        f"(2 × batching on's saturation) for {args.overload_s} s, open loop on 512 connections, server default "
        f"deadline {args.deadline_ms} ms (`--default-deadline-ms`), no warm-up excluded.",
        "",
        "| | |",
        "| --- | --- |",
        f"| answered 200 | {run['requests']['ok']} of {total} ({100 * run['requests']['ok'] / total:.1f}%), "
        f"{run['achieved_rps']:.0f}/s |",
        f"| accepted requests: p50 / p99 / max (from the scheduled send) | "
        f"{ms(accepted['p50_ms'])} / {ms(accepted['p99_ms'])} / {ms(accepted['max_ms'])} "
        f"(deadline {args.deadline_ms} ms) |" if accepted else "| accepted requests | none |",
        f"| failed | {failed(run)} |",
        f"| 429 answered: p50 / p90 / p99 / max (from the send) | {quantiles(refused)} |" if refused
        else "| 429 answered | none refused |",
        f"| server side, from the handler's start: answers within 1 ms / 429s in all | {fast} / {refusals} (200s and "
        f"504s wait for a batch, so the fast answers are refusals) |",
        f"| control, the same rate with every request refused and nothing executed: 429 p50 / p90 / p99 / max | "
        f"{quantiles(control_refused)} |" if control_refused else "| control | no 429 recorded |",
        f"| recload send delay p99 (overload / control) | {ms(run['send_delay_ms']['p99_ms'])} / "
        f"{ms(control['send_delay_ms']['p99_ms'])} |",
        f"| admission's lateness margin at the end (`recserve_admission_margin_seconds`) | {margin} |",
        f"| server resident memory (VmRSS, every second) | ready {rss[0] / 1024:.0f} MiB; first third of the run "
        f"max {max(rss[1:1 + third]) / 1024:.0f} MiB, last third max {max(rss[-third:]) / 1024:.0f} MiB, "
        f"overall max {max(rss) / 1024:.0f} MiB, median {statistics.median(rss) / 1024:.0f} MiB |",
        f"| server after the run | {'alive and ready' if args.alive == 'true' else 'NOT READY (see its log)'} |",
        "",
    ]
    out += [END, ""]
    bench.write_section(args.doc, "\n".join(out), BEGIN, END)
    for c, ratio, sat in ratios:
        print(f"{c} candidates: saturation off {sat['off']['achieved_rps']:.0f}/s, on {sat['on']['achieved_rps']:.0f}/s,"
              f" on ÷ off {ratio:.2f}×")


if __name__ == "__main__":
    main()
