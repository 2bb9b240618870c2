#!/usr/bin/env python3
"""What every benchmark script does around its measurements, done once: a command pinned to CPUs, a server started
and waited for until it is ready (and stopped by PID), its resident memory read or sampled, its /metrics scraped and
read, and a generated section of a document (docs/benchmarks.md) replaced between its markers.

Python scripts import it (`sys.path` gets scripts/lib); the shell scripts reach it through
scripts/lib/server-process.sh, which calls this command line:

    bench.py wait-ready URL PID LOG [--timeout S] [--cafile CA]
                                                     poll URL until it answers 2xx (https://: trusting the CA
                                                     certificate in CA); fail if PID exits first
    bench.py scrape URL OUT [--cafile CA]            URL's body (a /metrics text) into OUT
    bench.py rss PID [--mib]                         PID's resident memory now, KiB (or MiB)
    bench.py sample-rss PID OUT [--every S]          PID's resident memory (KiB) appended to OUT every S seconds
                                                     until PID exits or this is killed; the first sample at once
    bench.py json FILE KEY                           one top-level field of a JSON file (a report's achieved_rps)
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# --- processes ----------------------------------------------------------------------------------------------------


def pinned(cpus: str | None, argv: Sequence[str]) -> list[str]:
    """`argv` run on the CPUs in `cpus` (a taskset list: "0", "1-3"); unchanged when `cpus` is empty or None."""
    return ["taskset", "-c", cpus, *argv] if cpus else list(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, exited but not reaped, counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def answers(url: str, timeout: float = 1.0, cafile: str | None = None) -> bool:
    """Whether a GET of `url` answers 2xx (an https:// URL: trusting the CA certificate(s) in `cafile`)."""
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as answer:
            return 200 <= answer.status < 300
    except (OSError, ValueError):
        return False


def tail(log: str | Path, lines: int = 20) -> str:
    try:
        return "\n".join(Path(log).read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_ready(
    url: str, pid: int, log: str | Path, timeout: float = 120.0, every: float = 0.2, cafile: str | None = None
) -> float:
    """Polls `url` until it answers 2xx (an https:// URL: trusting `cafile`); the seconds that took. Raises
    RuntimeError, with the end of `log`, when `pid` exits first or `timeout` seconds pass."""
    start = time.monotonic()
    while True:
        if not alive(pid):
            raise RuntimeError(f"{tail(log)}\nthe server exited before it was ready; log: {log}")
        if answers(url, cafile=cafile):
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"{tail(log)}\nnot ready after {timeout:.0f} s: {url}; log: {log}")
        time.sleep(every)


class Server:
    """A server process started in the background, pinned, its output in a log; stopped by its PID."""

    def __init__(self, argv: Sequence[str], log: str | Path, cpus: str | None = None, env: dict | None = None) -> None:
        self.log_path = Path(log)
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(pinned(cpus, argv), stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.pid = self.proc.pid

    def wait_ready(self, url: str, timeout: float = 120.0, every: float = 0.2) -> float:
        return wait_ready(url, self.pid, self.log_path, timeout, every)

    def stop(self, timeout: float = 120.0) -> int:
        """SIGTERM, then its exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
        code = self.proc.wait(timeout=timeout)
        self._log.close()
        return code

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


# --- resident memory --------------------------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    """`pid`'s resident memory (VmRSS) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS")


def sample_rss(pid: int, sink: Callable[[int], None], every: float = 1.0, stop: threading.Event | None = None) -> None:
    """Calls `sink` with `pid`'s resident memory (KiB): once now, then every `every` seconds until it exits or
    `stop` is set."""
    stop = stop or threading.Event()
    while True:
        try:
            kib = rss_kib(pid)
        except (OSError, RuntimeError):
            return
        sink(kib)
        if stop.wait(every) or not alive(pid):
            return


# --- /metrics -------------------------------------------------------------------------------------------------------


def scrape(url: str, timeout: float = 30.0, cafile: str | None = None) -> str:
    """The body of `url` (a server's /metrics; an https:// URL: trusting the CA certificate(s) in `cafile`)."""
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    with urllib.request.urlopen(url, timeout=timeout, context=context) as answer:
        return answer.read().decode("utf-8")


def samples(text: str) -> dict[str, float]:
    """Every sample of a /metrics text: `name{labels}` -> value (a series given twice: the sum)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = out.get(key, 0.0) + float(value)
            except ValueError:
                continue
    return out


def total(values: dict[str, float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples in `values` (samples()'s form) whose labels include `labels`."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in values.items() if k.split("{")[0] == name and all(w in k for w in want))


# --- interleaved rounds of one configuration ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rounds:
    """The recload runs of one configuration over the rounds of a benchmark: the median and the worst of each
    figure (never the best), what was sent and answered, recload's largest CPU share and the machine's largest steal
    of a run (scripts/lib/step.py writes RUN.step.json beside RUN.json)."""

    runs: int
    ok: int
    sent: int
    p50_ms: tuple[float, float]  # (median, worst)
    p99_ms: tuple[float, float]
    recload_cpu: float
    steal_s: float | None

    @staticmethod
    def of(runs: Sequence[Path]) -> Rounds:
        reports = [json.loads(r.read_text(encoding="utf-8")) for r in runs]
        steps = [json.loads(r.with_suffix(".step.json").read_text(encoding="utf-8")) for r in runs]
        p50 = [d["latency_ms"]["p50_ms"] for d in reports]
        p99 = [d["latency_ms"]["p99_ms"] for d in reports]
        steals = [s["steal_s"] for s in steps if s.get("steal_s") is not None]
        return Rounds(
            runs=len(runs),
            ok=sum(d["requests"]["ok"] for d in reports),
            sent=sum(d["requests"]["sent"] for d in reports),
            p50_ms=(statistics.median(p50), max(p50)),
            p99_ms=(statistics.median(p99), max(p99)),
            recload_cpu=max(d["cpu_s"] / d["wall_s"] for d in reports),
            steal_s=max(steals) if steals else None,
        )

    @staticmethod
    def under(directory: Path) -> Rounds:
        """The runs `round-*.json` in `directory`."""
        return Rounds.of(sorted(r for r in directory.glob("round-*.json") if not r.name.endswith(".step.json")))

    def cells(self) -> str:
        """`ok / sent | p50 median (worst) | p99 median (worst)`, for a markdown row."""
        return (
            f"{self.ok} / {self.sent} | {self.p50_ms[0]:.3f} ({self.p50_ms[1]:.3f}) | "
            f"{self.p99_ms[0]:.3f} ({self.p99_ms[1]:.3f})"
        )

    def load_cells(self) -> str:
        """`recload CPU | steal`, for a markdown row."""
        steal = "–" if self.steal_s is None else f"{self.steal_s:.2f}"
        return f"{self.recload_cpu:.2f} | {steal}"


# --- generated sections of a document ---------------------------------------------------------------------------


def markers(name: str, generator: str) -> tuple[str, str]:
    """The markers around a generated section `name` that `generator` (a command) writes."""
    return (f"<!-- BEGIN {name}: generated by {generator}, do not edit by hand -->", f"<!-- END {name} -->")


def replace_section(document: str, section: str, begin: str, end: str, append: str | None = "") -> str:
    """`document` with everything from `begin` to `end` (both included) replaced by `section`, which starts with
    `begin` and ends with `end` (and a newline or not). Where `document` has no `begin`, `section` goes at its end
    after a blank line and, when `append` is not empty, the text `append` (a heading) and another; with `append`
    None it is an error. A `begin` without its `end` after it is an error."""
    body = section.rstrip("\n")
    if not body.startswith(begin) or not body.endswith(end):
        raise ValueError(f"the section does not start with {begin!r} and end with {end!r}")
    if begin in document:
        head, rest = document.split(begin, 1)
        if end not in rest:
            raise SystemExit(f"the document has {begin!r} but no {end!r} after it: fix it by hand")
        return head + body + rest.split(end, 1)[1]
    if append is None:
        raise SystemExit(f"the document has no section {begin!r}: add\n{begin}\n{end}")
    heading = f"{append}\n\n" if append else ""
    return document.rstrip("\n") + "\n\n" + heading + body + "\n"


def write_section(path: str | Path, section: str, begin: str, end: str, append: str | None = "") -> None:
    """replace_section on the file at `path` (an absent file as a new document titled Benchmarks)."""
    path = Path(path)
    document = path.read_text(encoding="utf-8") if path.is_file() else "# Benchmarks\n"
    path.write_text(replace_section(document, section, begin, end, append), encoding="utf-8")


# --- command line -------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("wait-ready")
    w.add_argument("url")
    w.add_argument("pid", type=int)
    w.add_argument("log")
    w.add_argument("--timeout", type=float, default=120.0)
    w.add_argument("--cafile", help="the CA certificate (PEM) an https:// URL's server certificate chains to")
    s = sub.add_parser("scrape")
    s.add_argument("url")
    s.add_argument("out")
    s.add_argument("--cafile", help="the CA certificate (PEM) an https:// URL's server certificate chains to")
    r = sub.add_parser("rss")
    r.add_argument("pid", type=int)
    r.add_argument("--mib", action="store_true")
    sr = sub.add_parser("sample-rss")
    sr.add_argument("pid", type=int)
    sr.add_argument("out")
    sr.add_argument("--every", type=float, default=1.0)
    j = sub.add_parser("json")
    j.add_argument("file")
    j.add_argument("key")
    a = p.parse_args(argv)
    try:
        if a.command == "wait-ready":
            wait_ready(a.url, a.pid, a.log, a.timeout, cafile=a.cafile)
        elif a.command == "scrape":
            Path(a.out).write_text(scrape(a.url, cafile=a.cafile), encoding="utf-8")
        elif a.command == "rss":
            kib = rss_kib(a.pid)
            print(kib // 1024 if a.mib else kib)
        elif a.command == "sample-rss":
            with open(a.out, "a", encoding="ascii") as f:
                sample_rss(a.pid, lambda kib: print(kib, file=f, flush=True), a.every)
        elif a.command == "json":
            print(json.loads(Path(a.file).read_text(encoding="utf-8"))[a.key])
    except (RuntimeError, OSError, urllib.error.URLError) as e:
        print(f"bench.py {a.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
