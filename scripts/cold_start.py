"""Cold start of a large ranking model with `--preload on` and `off` (scripts/bench-cold-start.sh runs this).

For each round, each preload setting and each page-cache state:
  cold: the model's table files are dropped from the page cache first (posix_fadvise DONTNEED; `fincore` checks),
        so every page comes from the disk; warm: they are read into the page cache first, so a page fault is minor;
  1. start recserve on CPU 1 and time spawn → /health/ready; RSS at ready;
  2. the FIRST requests: the first --first bodies of the request file, one at a time from CPU 0, each timed;
  3. a closed-loop recload run (--concurrency in flight, --duration) on CPU 0: throughput, p99, recload's CPU,
     the server's highest RSS during it;
  4. the same first bodies again, one at a time: the latency once their rows are resident.
Writes OUT/cold-start.json and prints a markdown table.

Usage: python scripts/cold_start.py --recserve BIN --recload BIN --repository REPO --model NAME --requests FILE --out DIR
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))
import bench
from bench import free_port, rss_kib


def table_files(version: Path) -> list[Path]:
    files = set()
    for line in (version / "model.toml").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "file" and value.strip().strip('"').endswith(".safetensors"):
            files.add(version / value.strip().strip('"'))
    return sorted(files)


def resident_bytes(path: Path) -> int:
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        check=True, capture_output=True, text=True,
    )
    return int(out.stdout.split()[0])


def set_page_cache(files: list[Path], state: str) -> dict[str, int]:
    for path in files:
        with open(path, "rb") as f:
            if state == "cold":
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                while f.read(64 << 20):
                    pass
    return {str(p): resident_bytes(p) for p in files}


def sequential(port: int, model: str, bodies: list[bytes]) -> list[float]:
    """Milliseconds of each request, sent one at a time over one keep-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    out = []
    for body in bodies:
        t0 = time.perf_counter()
        conn.request("POST", f"/v1/models/{model}/rank", body, {"content-type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        out.append((time.perf_counter() - t0) * 1e3)
        if resp.status != 200:
            raise RuntimeError(f"rank answered {resp.status}: {data[:300]!r}")
    conn.close()
    return out


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(ms: list[float]) -> dict[str, float]:
    return {"first": ms[0], "p50": statistics.median(ms), "p99": pct(ms, 0.99), "max": max(ms), "mean": statistics.fmean(ms)}


def one(args, files, preload: str, cache: str, bodies: list[bytes], tag: str) -> dict:
    resident_before = set_page_cache(files, cache)
    port = free_port()
    repo = args.out / "repo"
    t0 = time.monotonic()
    server = bench.Server(
        [args.recserve, "serve", "--repository", str(repo),
         "--http-addr", f"127.0.0.1:{port}", "--grpc-addr", f"127.0.0.1:{free_port()}",
         "--executors", "1", "--intra-op-threads", "1", "--preload", preload],
        args.out / f"server-{tag}.log", cpus="1",
    )
    try:
        server.wait_ready(f"http://127.0.0.1:{port}/health/ready", timeout=600, every=0.02)
        ready_s = time.monotonic() - t0
        rss_ready = rss_kib(server.pid)
        first = sequential(port, args.model, bodies)
        rss_first = rss_kib(server.pid)

        peak = [rss_first]
        stop = threading.Event()

        def highest(kib: int) -> None:
            peak[0] = max(peak[0], kib)

        sampler = threading.Thread(target=bench.sample_rss, args=(server.pid, highest, 0.2, stop))
        sampler.start()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.monotonic()
        run_json = args.out / f"load-{tag}.json"
        subprocess.run(
            bench.pinned("0", [args.recload, "run", "--url", f"http://127.0.0.1:{port}", "--model", args.model,
                               "--repository", str(repo), "--closed", "--concurrency", str(args.concurrency),
                               "--warmup", "0s", "--duration", args.duration, "--quiet", "--json", str(run_json)]),
            check=True, stdout=subprocess.DEVNULL,
        )
        wall = time.monotonic() - w0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        stop.set()
        sampler.join()
        load = json.loads(run_json.read_text())
        again = sequential(port, args.model, bodies)
        rss_end = rss_kib(server.pid)
    finally:
        server.stop()
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / wall
    return {
        "preload": preload, "page_cache": cache, "resident_before_start_bytes": resident_before,
        "ready_s": ready_s, "rss_ready_mib": rss_ready / 1024, "rss_after_first_mib": rss_first / 1024,
        "rss_peak_under_load_mib": peak[0] / 1024, "rss_end_mib": rss_end / 1024,
        "first_ms": summary(first), "again_ms": summary(again), "first_all_ms": first,
        "load": {"achieved_rps": load["achieved_rps"], "p50_ms": load["latency_ms"]["p50_ms"],
                 "p99_ms": load["latency_ms"]["p99_ms"], "recload_cpu": cpu, "failed": load["requests"]["errors"]},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recserve", required=True)
    p.add_argument("--recload", required=True)
    p.add_argument("--repository", type=Path, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--requests", type=Path, required=True, help="JSON lines of rank bodies")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--first", type=int, default=100, help="first requests timed one at a time (100)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--duration", default="10s")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    repo = args.out / "repo"
    repo.mkdir(exist_ok=True)
    link = repo / args.model
    if not link.exists():
        link.symlink_to((args.repository / args.model).resolve())
    version = max((link).iterdir(), key=lambda d: int(d.name) if d.name.isdigit() else -1)
    files = table_files(version)
    bodies = [line.encode() for line in args.requests.read_text().splitlines()[: args.first]]
    assert len(bodies) == args.first, f"{args.requests} has fewer than {args.first} bodies"
    results = []
    for r in range(args.rounds):
        for preload in ("on", "off"):
            for cache in ("cold", "warm"):
                tag = f"{preload}-{cache}-{r}"
                res = one(args, files, preload, cache, bodies, tag)
                res["round"] = r
                results.append(res)
                print(json.dumps({k: v for k, v in res.items() if k != "first_all_ms"}), flush=True)
    (args.out / "cold-start.json").write_text(json.dumps(results, indent=1))
    print()
    print("| preload | page cache | round | ready | RSS at ready | 1st request | first {n}: p50 / p99 | same {n} again: p50 / p99 "
          "| closed loop ({c} in flight): req/s, p99 (recload CPU) | peak RSS under load |".format(n=args.first, c=args.concurrency))
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for res in results:
        f, a, ld = res["first_ms"], res["again_ms"], res["load"]
        print(f"| {res['preload']} | {res['page_cache']} | {res['round'] + 1} | {res['ready_s']:.1f} s | {res['rss_ready_mib']:,.0f} MiB "
              f"| {f['first']:.1f} ms | {f['p50']:.1f} / {f['p99']:.1f} ms | {a['p50']:.1f} / {a['p99']:.1f} ms "
              f"| {ld['achieved_rps']:,.0f}/s, {ld['p99_ms']:.1f} ms ({100 * ld['recload_cpu']:.0f}%) | {res['rss_peak_under_load_mib']:,.0f} MiB |")


if __name__ == "__main__":
    main()
