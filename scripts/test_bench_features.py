"""The feature-cost benchmark's reporter (scripts/bench_features_report.py) on a small results directory written
here: the max rate is the median and the lowest of the rounds (a round that met the SLA at no rate counts as 0), the
cost is against plain's median, recload's CPU is the one of the sweep's step at the max rate, the TLS set-up and the
receiver's spans are summed over the rounds, and the section is spliced between its markers. Run by
scripts/test.sh."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import bench_features_report as report  # noqa: E402


def run_report(rate: float, p50: float, p99: float, cpu_s: float, connect_ms: float | None, reopened: int) -> dict:
    return {
        "mode": {"kind": "open", "rate": rate, "arrivals": "poisson", "connections": 64},
        "offered_rps": rate,
        "requests": {"scheduled": 100, "sent": 100, "ok": 99, "errors": 1},
        "latency_ms": {"p50_ms": p50, "p99_ms": p99},
        "cpu_s": cpu_s,
        "wall_s": 10.0,
        "connections": {
            "before_run": None if connect_ms is None else {"count": 64, "p50_ms": connect_ms},
            "during_run": {"count": reopened} if reopened else None,
        },
    }


def write(directory: Path, name: str, data: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps(data), encoding="utf-8")


def results(tmp_path: Path) -> Path:
    model = tmp_path / "m"
    model.mkdir()
    (model / "fixed-rate.txt").write_text("500\n", encoding="utf-8")
    # Max rates per round: plain 1000, 1100, 900; tls 950, 1000, None (met at no rate).
    rates = {"plain": [1000.0, 1100.0, 900.0], "tls": [950.0, 1000.0, None]}
    for config, per_round in rates.items():
        d = model / config
        for r, max_rps in enumerate(per_round, start=1):
            rates_tried = (800.0, 900.0, 950.0, 1000.0, 1100.0)
            steps = [run_report(rate, 1.0, 3.0, rate / 1000.0, None, 0) for rate in rates_tried]
            sla = [{"max_rps": max_rps}, {"max_rps": 2000.0 if config == "plain" else 1000.0 + r}]
            write(d, f"sweep-{r}.json", {"sla": sla, "steps": steps})
            write(d, f"sweep-{r}.step.json", {"steal_s": 0.1 * r})
            connect_ms = 0.3 * r if config == "tls" else 0.1
            write(d, f"round-{r}.json", run_report(500.0, 0.5 * r, 2.0 + r, 4.0, connect_ms, r - 1))
            write(d, f"round-{r}.step.json", {"steal_s": 0.05})
            if config == "tls":
                # 1000 rank requests (and a health check) took 0.5 s of CPU, 0.2 s of it on the I/O threads.
                for when, requests, io, executor in (("before", 7, 1.0, 2.0), ("after", 1007, 1.2 + 0.01 * r, 2.3)):
                    (d / f"round-{r}.{when}.prom").write_text(
                        f'recserve_requests_total{{code="200",endpoint="rank",model="m",protocol="v1"}} {requests}\n'
                        f'recserve_requests_total{{code="200",endpoint="health",model="",protocol="v1"}} 3\n'
                        f'recserve_thread_cpu_seconds_total{{model="",role="io"}} {io}\n'
                        f'recserve_thread_cpu_seconds_total{{model="m",role="executor"}} {executor}\n',
                        encoding="utf-8",
                    )
        (d / "load.txt").write_text("1 0.50 0.4 0.3\n2 2.25 1 1\n3 1.00 1 1\n", encoding="utf-8")
    write(model / "plain", "received-1.json", {"spans": 10, "traces": 2, "services": ["recserve"]})
    write(model / "plain", "received-2.json", {"spans": 5, "traces": 1, "services": ["recserve"]})
    return tmp_path


def test_rates_latencies_and_costs_are_medians_and_worsts_of_the_rounds(tmp_path: Path) -> None:
    root = results(tmp_path)
    plain = report.Config.read(root / "m" / "plain", 3)
    tls = report.Config.read(root / "m" / "tls", 3)
    assert plain.rate() == (1000.0, 900.0)
    assert tls.rate() == (950.0, 0.0)
    assert abs(report.cost(tls, plain) - 0.05) < 1e-9
    assert tls.rate(1) == (1002.0, 1001.0)
    assert abs(report.cost(tls, plain, 1) - (1 - 1002 / 2000)) < 1e-9
    # recload's CPU at each round's max-rate step: 1.0, 1.1 and 0.9 s over 10 s.
    assert plain.sweep_cpu_at_max == pytest.approx([0.1, 0.11, 0.09])
    assert tls.sweep_cpu_at_max == pytest.approx([0.095, 0.1])
    assert tls.reopened == 0 + 1 + 2
    assert tls.connect_p50_ms == pytest.approx([0.3, 0.6, 0.9])
    assert plain.spans == 15 and plain.traces == 3
    assert tls.spans is None
    assert plain.load_1m == [0.5, 2.25, 1.0]
    assert plain.cpu_us == []
    assert tls.io_us == pytest.approx([210.0, 220.0, 230.0])
    assert tls.exec_us == pytest.approx([300.0, 300.0, 300.0])
    assert tls.cpu_us == pytest.approx([510.0, 520.0, 530.0])

    text = report.report(root, ["plain", "tls"], 3, ["5 ms", "20 ms"], "0.01", "0.01")
    assert text.startswith(report.BEGIN) and text.rstrip().endswith(report.END)
    lines = text.splitlines()
    plain_row = next(line for line in lines if line.startswith("| plain |"))
    assert (
        "| 1,000 (900) | – | 2,000 (2,000) | – | 1.000 (1.500) | 4.000 (5.000) | 297 / 300 | – | 0.11 | 0.40 "
        "| 0.30 | "
        "0.50–2.25 |" in plain_row
    ), plain_row
    tls_row = next(line for line in lines if line.startswith("| tls |"))
    assert "| 950 (0) | +5.0% | 1,002 (1,001) | +49.9% |" in tls_row, tls_row
    assert "| 520 (220 / 300) |" in tls_row, tls_row
    assert "| 297 / 300 | – |" in plain_row, plain_row
    assert "tls: connection set-up before the clock (TCP and TLS handshake) p50 0.60 ms" in text
    assert "3 connection(s) reopened" in text
    assert "the OTLP receiver got 15 spans of 3 traces" in text
    # Plain's rounds (900 to 1,100) spread 20% of their median: no verdict stands on them.
    assert "at p99 ≤ 5 ms by median: tls 5.0% (within the 5% goal); but plain's own rounds spread 20%" in text
    assert "cannot decide the goal" in text
    assert "at p99 ≤ 20 ms by median: tls 49.9% (over the 5% goal)." in text
    # A bound plain met in no round decides nothing either.
    plain_none = report.Config(**{**plain.__dict__, "max_rps": [[None, None, None], plain.max_rps[1]]})
    assert report.noise(plain_none, 0) is None
    assert "Max rate at p99 ≤ 5 ms of each round, in order: plain 1,000 / 1,100 / 900; tls 950 / 1,000 / –." in text


def test_the_section_goes_between_its_markers(tmp_path: Path) -> None:
    root = results(tmp_path)
    doc = tmp_path / "benchmarks.md"
    old = f"# Benchmarks\n\nbefore\n\n{report.BEGIN}\nthe previous figures\n{report.END}\n\nafter\n"
    doc.write_text(old, encoding="utf-8")
    text = report.report(root, ["plain", "tls"], 3, ["5 ms"], "0.01", "0.01")
    report.bench.write_section(doc, text, report.BEGIN, report.END, append=report.HEADING)
    written = doc.read_text(encoding="utf-8")
    assert "the previous figures" not in written and "before" in written and written.rstrip().endswith("after")
    assert written.count(report.BEGIN) == 1
