"""Versions swapped under load, measured (scripts/swap-under-load.sh runs this; see its header for the knobs).

A repository with the demo DeepFM in two versions (1: the fp32 model, 2: the int8 one; the same contract), each
with its largest table grown with random rows until its tables hold `--table-bytes` (so that a version that is
never released shows in the resident memory), beside the demo LightGCN. The server runs with `--model-control
explicit` and an admin token. recload drives rank (DeepFM) and recall (LightGCN) open loop at `--load` of the
server's saturation together (each at half of that share of its own closed-loop saturation), first without swaps
(the baseline), then while version 2 and version 1 are swapped in `--swaps` times through the repository API.
Meanwhile a checker sends the demo rank request and compares every answer with the answer of the version that
gave it (the response names it), recorded while each version served alone. The server's resident memory is
sampled throughout. Writes a report (JSON, and a markdown section between markers of docs/benchmarks.md when
`--doc` is given) and exits non-zero when a request failed or an answer differed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
import bench

MARK_BEGIN, MARK_END = bench.markers("swap-under-load", "scripts/swap-under-load.sh")


def log(message: str) -> None:
    print(f"swap-under-load: {message}", file=sys.stderr, flush=True)


def grow_version(source: Path, out: Path, table_bytes: int, seed: int) -> int:
    """Copies the version `source` to `out` with its largest table grown by random rows until every table
    together holds `table_bytes`; returns the tables' bytes."""
    out.mkdir(parents=True)
    for f in source.iterdir():
        if f.name != "tables.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    spec = tomllib.loads((source / "model.toml").read_text())
    tensors = load_file(str(source / "tables.safetensors"))
    have = sum(t.nbytes for t in tensors.values())
    largest = max(spec["tables"], key=lambda t: t["rows"])
    name = largest["name"]
    row_bytes = tensors[name].shape[1] * tensors[name].itemsize
    extra = max(0, (table_bytes - have) // row_bytes)
    rng = np.random.default_rng(seed)
    table = tensors[name]
    if table.dtype == np.uint8:
        # Fused int8 rows: codes, then a float32 scale and bias that keep every value near zero.
        codes = rng.integers(0, 256, size=(extra, table.shape[1] - 8), dtype=np.uint8)
        trailer = np.tile(np.array([1e-4, -1e-2], dtype=np.float32), (extra, 1)).view(np.uint8)
        grown = np.concatenate([table, np.concatenate([codes, trailer], axis=1)])
    else:
        grown = np.concatenate([table, rng.normal(0.0, 0.01, size=(extra, table.shape[1])).astype(table.dtype)])
    tensors[name] = grown
    save_file(tensors, str(out / "tables.safetensors"))
    text = (out / "model.toml").read_text()
    before = f'name = "{name}"\nfile = "tables.safetensors"\nrows = {largest["rows"]}\n'
    assert before in text, f"{source}/model.toml: cannot find the rows of table {name}"
    (out / "model.toml").write_text(
        text.replace(before, f'name = "{name}"\nfile = "tables.safetensors"\nrows = {grown.shape[0]}\n')
    )
    return sum(t.nbytes for t in tensors.values())


class Server:
    """The recserve process, its URL and token."""

    def __init__(self, url: str, pid: int, token: str) -> None:
        self.url, self.pid, self.token = url, pid, token

    def call(self, method: str, path: str, body: Any = None, admin: bool = False) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("content-type", "application/json")
        if admin:
            request.add_header("authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=120) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def rss_kib(self) -> int:
        return bench.rss_kib(self.pid)

    def metric(self, prefix: str) -> float:
        scraped = bench.samples(bench.scrape(self.url + "/metrics"))
        return next((v for k, v in scraped.items() if k.startswith(prefix)), 0.0)

    def wait_drained(self) -> None:
        deadline = time.monotonic() + 120
        while self.metric('recserve_model_versions_draining{model="deepfm"}') > 0:
            if time.monotonic() > deadline:
                raise RuntimeError("a replaced version was never released")
            time.sleep(0.1)


def recload(binary: str, cpu: list[str], server: Server, args: list[str], out: Path) -> dict[str, Any]:
    """One recload run; its report, with the generator's own CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([*cpu, binary, "run", "--url", server.url, "--quiet", "--json", str(out), *args], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = json.loads(out.read_text())
    report["generator_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return report


class Checker(threading.Thread):
    """Sends the rank request in a loop and checks each answer against its version's."""

    def __init__(self, server: Server, request: Any, answers: dict[int, list[float]]) -> None:
        super().__init__(daemon=True)
        self.server, self.request, self.answers = server, request, answers
        self.stop = threading.Event()
        self.by_version: dict[int, int] = {}
        self.refused = 0
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            status, body = self.server.call("POST", "/v1/models/deepfm/rank", self.request)
            if status == 429:
                self.refused += 1
                continue
            if status != 200:
                self.failures.append(f"status {status}: {body}")
                continue
            version = body["version"]
            got = [s["score"] for s in body["scores"]]
            want = self.answers.get(version)
            if want is None or len(got) != len(want) or max(abs(a - b) for a, b in zip(got, want)) > 1e-5:
                self.failures.append(f"version {version} answered {got[:3]}…, its answer is {(want or [])[:3]}…")
            self.by_version[version] = self.by_version.get(version, 0) + 1


def p99(report: dict[str, Any]) -> float:
    return report["latency_ms"]["p99_ms"] if report.get("latency_ms") else float("nan")


def refused(report: dict[str, Any]) -> int:
    """Requests refused with 429 (admission under load: compared with the baseline, not a failure)."""
    return report["errors"].get("http_429", 0)


def failed(report: dict[str, Any]) -> int:
    """Requests that failed otherwise: 5xx, other 4xx, connection errors, timeouts, never sent."""
    unsent = report["requests"]["scheduled"] - report["requests"]["sent"]
    return report["requests"]["errors"] - refused(report) + unsent


def refused_share(phase: dict[str, Any]) -> float:
    sent = sum(p["sent"] for p in phase.values() if isinstance(p, dict) and "sent" in p)
    return sum(p["refused"] for p in phase.values() if isinstance(p, dict) and "refused" in p) / max(1, sent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recserve", required=True)
    parser.add_argument("--recload", required=True)
    parser.add_argument("--demo", type=Path, default=Path("models/demo"))
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--table-bytes", type=int, default=1 << 30)
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--load", type=float, default=0.7)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of the baseline run")
    parser.add_argument("--saturation-s", type=float, default=8.0)
    parser.add_argument("--pin", action="store_true", help="recload on CPU 0, recserve on CPU 1")
    parser.add_argument("--default-deadline-ms", type=int, default=1000, help="the server's default deadline")
    parser.add_argument("--doc", type=Path)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()

    work = args.work
    repo = work / "repo"
    log(f"writing the repository under {repo} (each DeepFM version with {args.table_bytes / 2**30:.2f} GiB of tables)")
    bytes_v1 = grow_version(args.demo / "deepfm-fp32" / "1", repo / "deepfm" / "1", args.table_bytes, 1)
    aside = repo / "deepfm" / ".2-aside"
    bytes_v2 = grow_version(args.demo / "deepfm" / "1", aside, args.table_bytes, 2)
    (repo / "lightgcn").mkdir()
    (repo / "lightgcn" / "1").symlink_to((args.demo / "lightgcn" / "1").resolve())
    token = "swap-under-load-token"
    (work / "token").write_text(token)

    port = bench.free_port()
    client_cpu = bench.pinned("0" if args.pin else None, [])
    proc = bench.Server(
        [args.recserve, "serve", "--repository", str(repo), "--http-addr", f"127.0.0.1:{port}",
         "--grpc-addr", f"127.0.0.1:{bench.free_port()}", "--executors", "1", "--intra-op-threads", "1",
         "--model-control", "explicit", "--admin-token-file", str(work / "token"),
         "--default-deadline-ms", str(args.default_deadline_ms)],
        work / "recserve.log", cpus="1" if args.pin else None,
    )
    server = Server(f"http://127.0.0.1:{port}", proc.pid, token)
    try:
        try:
            proc.wait_ready(f"{server.url}/health/ready", timeout=300)
        except RuntimeError as e:
            raise SystemExit(f"recserve: {e}") from None
        result = run(args, server, repo, aside, client_cpu, work, bytes_v1, bytes_v2)
    finally:
        proc.stop()
    args.json.write_text(json.dumps(result, indent=2))
    if args.doc:
        write_doc(args.doc, result)
    more_refused = refused_share(result["swap"]) > refused_share(result["baseline"]) + 0.001
    ok = result["swap"]["failed_requests"] == 0 and not result["checker"]["failures"] and not more_refused
    log("done: " + ("no request failed, no more 429s than without swaps, every answer was its version's" if ok
                    else "FAILED, see the report"))
    sys.exit(0 if ok else 1)


def run(args: argparse.Namespace, server: Server, repo: Path, aside: Path, client_cpu: list[str], work: Path,
        bytes_v1: int, bytes_v2: int) -> dict[str, Any]:
    rank_request = json.loads((args.demo / "rank-request.json").read_text())
    rss_first_v1 = server.rss_kib()
    status, body = server.call("POST", "/v1/models/deepfm/rank", rank_request)
    assert status == 200 and body["version"] == 1, body
    answers = {1: [s["score"] for s in body["scores"]]}

    def swap_to(version: int) -> float:
        if version == 2:
            aside.rename(repo / "deepfm" / "2")
        else:
            (repo / "deepfm" / "2").rename(aside)
        started = time.monotonic()
        status, body = server.call("POST", "/v2/repository/models/deepfm/load", {}, admin=True)
        if status != 200:
            raise SystemExit(f"swap to version {version} failed: {status} {body}")
        return time.monotonic() - started

    swap_to(2)
    status, body = server.call("POST", "/v1/models/deepfm/rank", rank_request)
    assert status == 200 and body["version"] == 2, body
    answers[2] = [s["score"] for s in body["scores"]]
    server.wait_drained()
    rss_v2 = server.rss_kib()
    swap_to(1)
    server.wait_drained()

    rank = ["--workload", "rank", "--model", "deepfm", "--repository", str(repo), "--candidates", "100"]
    users = next(t["rows"] for t in tomllib.loads((repo / "lightgcn" / "1" / "model.toml").read_text())["tables"]
                 if t["name"] == "user")
    recall = ["--workload", "recall", "--model", "lightgcn", "--repository", str(repo), "--k", "100",
              "--users", str(users)]
    log("closed-loop saturation of rank and of recall, one at a time")
    sat = {}
    for name, workload in (("rank", rank), ("recall", recall)):
        report = recload(args.recload, client_cpu, server, [*workload, "--closed", "--concurrency", "32",
                         "--warmup", "1s", "--duration", f"{args.saturation_s}s"], work / f"saturation-{name}.json")
        sat[name] = report["achieved_rps"]
    # Both at once: each at half of the load's share of its own saturation, so the server runs at `load`.
    rates = {name: max(1, round(sat[name] * args.load / 2)) for name in sat}
    log(f"saturation: rank {sat['rank']:.0f}/s, recall {sat['recall']:.0f}/s; driving {rates} together")

    def drive(label: str, seconds: float) -> dict[str, Any]:
        threads, reports = [], {}
        for name, workload in (("rank", rank), ("recall", recall)):
            def go(name: str = name, workload: list[str] = workload) -> None:
                reports[name] = recload(args.recload, client_cpu, server, [*workload, "--rate", str(rates[name]),
                                        "--connections", "64", "--timeout", "5s", "--warmup", "1s", "--duration",
                                        f"{seconds:.0f}s"], work / f"{label}-{name}.json")
            threads.append(threading.Thread(target=go))
        for t in threads:
            t.start()
        return {"threads": threads, "reports": reports}

    log(f"baseline: {args.duration:.0f} s without swaps")
    base = drive("baseline", args.duration)
    for t in base["threads"]:
        t.join()
    rss_after_baseline = server.rss_kib()

    # The swap phase runs the same loads for as long as the swaps take (estimated from the two done above, with
    # room), with the checker beside them and the resident memory sampled.
    log(f"{args.swaps} swaps under the same load")
    checker = Checker(server, rank_request, answers)
    samples: list[int] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            samples.append(server.rss_kib())
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    swap_phase = drive("swaps", max(args.duration, args.swaps * 4.0))
    time.sleep(2.0)
    checker.start()
    sampler.start()
    swap_seconds = []
    for i in range(args.swaps):
        swap_seconds.append(swap_to(2 if i % 2 == 0 else 1))
        time.sleep(0.5)
    checker.stop.set()
    checker.join()
    for t in swap_phase["threads"]:
        t.join()
    sampling.set()
    sampler.join()
    server.wait_drained()
    rss_after = server.rss_kib()
    status, body = server.call("POST", "/v2/repository/models/deepfm/unload", {}, admin=True)
    assert status == 200, body
    server.wait_drained()
    rss_none = server.rss_kib()

    reports_base, reports_swap = base["reports"], swap_phase["reports"]
    return {
        "table_bytes": {"version_1": bytes_v1, "version_2": bytes_v2},
        "saturation_rps": sat,
        "rates_rps": rates,
        "load": args.load,
        "baseline": {
            name: {"achieved_rps": r["achieved_rps"], "p99_ms": p99(r), "failed": failed(r), "refused": refused(r),
                   "sent": r["requests"]["sent"],
                   "errors": r["errors"], "generator_cpu_s": r["generator_cpu_s"], "duration_s": r["duration_s"]}
            for name, r in reports_base.items()
        },
        "swap": {
            "swaps": args.swaps,
            "swap_seconds": swap_seconds,
            "failed_requests": sum(failed(r) for r in reports_swap.values()),
            **{name: {"achieved_rps": r["achieved_rps"], "p99_ms": p99(r), "failed": failed(r), "refused": refused(r),
                   "sent": r["requests"]["sent"],
                      "errors": r["errors"], "generator_cpu_s": r["generator_cpu_s"], "duration_s": r["duration_s"]}
               for name, r in reports_swap.items()},
        },
        "checker": {"answers_by_version": checker.by_version, "refused": checker.refused,
                    "failures": checker.failures[:20]},
        "rss_kib": {
            "first_load_v1": rss_first_v1,
            "v1_after_baseline": rss_after_baseline,
            "after_swaps_v1": rss_after,
            "serving_v2": rss_v2,
            "no_deepfm": rss_none,
            "peak_during_swaps": max(samples, default=0),
            "old_plus_new_bound": rss_first_v1 + rss_v2 - rss_none,
        },
    }


def write_doc(doc: Path, r: dict[str, Any]) -> None:
    mib = lambda kib: f"{kib / 1024:,.0f} MiB"  # noqa: E731
    rss = r["rss_kib"]
    b, s = r["baseline"], r["swap"]
    cpu = os.popen("lscpu | sed -n 's/^Model name: *//p'").read().strip() or "unknown CPU"
    lines = [
        MARK_BEGIN,
        f"Produced by `scripts/swap-under-load.sh` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {cpu}, "
        f"{os.cpu_count()} CPUs; recload on CPU 0, recserve on CPU 1 (`--executors 1 --intra-op-threads 1 "
        f"--model-control explicit`). The demo DeepFM in two versions (1: fp32, 2: int8), each with its "
        f"largest table grown to {r['table_bytes']['version_1'] / 2**30:.2f} / "
        f"{r['table_bytes']['version_2'] / 2**30:.2f} GiB of tables, beside the demo LightGCN. Rank (100 "
        f"candidates) and recall (k = 100) open loop together at {r['load']:.0%} of the server: "
        f"{r['rates_rps']['rank']}/s and {r['rates_rps']['recall']}/s (saturation alone: "
        f"{r['saturation_rps']['rank']:.0f}/s and {r['saturation_rps']['recall']:.0f}/s). "
        f"{s['swaps']} swaps through `POST /v2/repository/models/deepfm/load`, alternating the versions.",
        "",
        "| | rank: achieved, p99, failed, 429 | recall: achieved, p99, failed, 429 | recload CPU (rank + recall) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, phase in (("without swaps", b), (f"during {s['swaps']} swaps", s)):
        lines.append(
            f"| {label} | {phase['rank']['achieved_rps']:.0f}/s, {phase['rank']['p99_ms']:.2f} ms, "
            f"{phase['rank']['failed']}, {phase['rank']['refused']} | {phase['recall']['achieved_rps']:.0f}/s, "
            f"{phase['recall']['p99_ms']:.2f} ms, {phase['recall']['failed']}, {phase['recall']['refused']} | {phase['rank']['generator_cpu_s'] + phase['recall']['generator_cpu_s']:.1f} s "
            f"of {phase['rank']['duration_s']:.0f} s |"
        )
    ratio = lambda k: s[k]["p99_ms"] / b[k]["p99_ms"]  # noqa: E731
    checked = r["checker"]["answers_by_version"]
    lines += [
        "",
        f"- p99 during swaps ÷ without: rank {ratio('rank'):.2f}, recall {ratio('recall'):.2f}. "
        f"A swap (load, warm-up, switch) took {min(s['swap_seconds']):.2f}–{max(s['swap_seconds']):.2f} s.",
        f"- Answers checked against the version that gave them: {sum(checked.values())} "
        f"({', '.join(f'version {v}: {n}' for v, n in sorted(checked.items()))}), "
        f"{len(r['checker']['failures'])} differed.",
        f"- Resident memory: {mib(rss['first_load_v1'])} after the first load of version 1 (before any request), "
        f"{mib(rss['v1_after_baseline'])} serving it after the baseline run, {mib(rss['after_swaps_v1'])} serving "
        f"it again after {s['swaps']} swaps ({(rss['after_swaps_v1'] / rss['first_load_v1'] - 1):+.1%} against the "
        f"first, {(rss['after_swaps_v1'] / rss['v1_after_baseline'] - 1):+.1%} against the baseline); peak during the swaps "
        f"{mib(rss['peak_during_swaps'])} against old + new = {mib(rss['old_plus_new_bound'])} (version 1 "
        f"alone + version 2 alone − neither, {mib(rss['no_deepfm'])}).",
        MARK_END,
    ]
    bench.write_section(doc, "\n".join(lines), MARK_BEGIN, MARK_END, append="## Swapping versions under load")


if __name__ == "__main__":
    main()
