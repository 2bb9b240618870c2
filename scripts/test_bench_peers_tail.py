"""The peer benchmark's reporter (scripts/bench_peers_tail_report.py) on a small results directory written here:
every figure is the median and the worst of the rounds (the lowest max rate, the highest latency), the ratio is
recserve's median over the best peer's, recserve's stage figures come from its /metrics scrapes, each step shows its
steal and generator CPU, and the section is spliced between its markers; and the steal reader
(scripts/lib/steal.py) on sample /proc/stat contents. Run by scripts/test.sh."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent / "lib")]
import bench_peers_tail_report as report  # noqa: E402
import steal  # noqa: E402


def run(p99: float, p50: float = 1.0, errors: int = 0, rps: float = 100.0) -> dict:
    return {
        "latency_ms": {"p50_ms": p50, "p99_ms": p99},
        "requests": {"scheduled": 1000, "errors": errors},
        "achieved_rps": rps,
    }


def sweep(five: float | None, twenty: float | None, bound: bool = False) -> dict:
    return {
        "sla": [
            {"p99_ms": 5.0, "max_rps": five, "first_failing_rps": None if bound else 1e4},
            {"p99_ms": 20.0, "max_rps": twenty, "first_failing_rps": None if bound else 1e4},
        ]
    }


def oha(p99_s: float) -> dict:
    return {
        "summary": {"requestsPerSec": 100.0},
        "latencyPercentiles": {"p50": 0.001, "p99": p99_s},
        "statusCodeDistribution": {"200": 1000},
        "errorDistribution": {},
    }


def write(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value if isinstance(value, str) else json.dumps(value))


METRICS = """# HELP x
recserve_queue_duration_seconds_sum{{model="m-int8"}} {queue}
recserve_queue_duration_seconds_count{{model="m-int8"}} {n}
recserve_batch_rows_sum{{model="m-int8"}} {rows}
recserve_batch_rows_count{{model="m-int8"}} {batches}
recserve_request_rows_sum{{model="m-int8"}} {rows}
recserve_request_rows_count{{model="m-int8"}} {n}
recserve_inference_duration_seconds_sum{{model="m-int8"}} {inference}
recserve_inference_duration_seconds_count{{model="m-int8"}} {batches}
recserve_batches_total{{model="m-int8",reason="idle"}} {batches}
recserve_thread_cpu_seconds_total{{role="executor",model="m-int8"}} {cpu}
recserve_thread_run_queue_wait_seconds_total{{role="executor",model="m-int8"}} {wait}
recserve_queue_duration_seconds_sum{{model="other"}} 99
"""


@pytest.fixture()
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    settings = {
        "ROUNDS": "3",
        "SHARES": "0.5 0.7",
        "LOW_RATE": "100",
        "RATES": "100:20000:x1.5",
        "CLOSED_CONCURRENCY": "64",
        "TUNE_SHARES": "0.5 0.8",
        "TUNE_REPEATS": "1",
        "QUICK": "0",
    }
    systems = {
        s: {"name": n, "how": "…"}
        for s, n in [
            ("recserve", "recserve"),
            ("triton", "Triton"),
            ("fastapi", "FastAPI"),
            ("recserve-split", "recserve split"),
        ]
    }
    write(
        root / "meta.json",
        {
            "date": "today",
            "command": "scripts/bench-peers-tail.sh",
            "note": None,
            "machine": ["cpu"],
            "pinning": "p",
            "versions": {"oha": "1.16.0"},
            "settings": settings,
            "load": "open loop",
            "precisions": [
                {
                    "name": "int8",
                    "model": "m-int8",
                    "split_model": "m-int8-split",
                    "saturation_rps": 1000.0,
                    "triton_setting": [16, 200],
                }
            ],
            "systems": systems,
        },
    )
    p = root / "int8"
    for i, rps in enumerate([990.0, 1000.0, 1010.0], 1):
        write(p / "saturation" / f"closed-{i}.json", {"achieved_rps": rps})
        write(p / "saturation" / f"closed-{i}.step.json", {"steal_s": 0.0})
    # Max rates at 5 ms per round: recserve 600, 300, 500 (median 500, worst 300); Triton 200, 250, 100;
    # FastAPI never (not even the lowest rate) in two rounds, 150 in one.
    rates = {
        "recserve": [(600, 900), (300, 800), (500, 1000)],
        "triton": [(200, 400), (250, 500), (100, 450)],
        "fastapi": [(0, 300), (0, 350), (150, 300)],
        "recserve-split": [(700, 1100)] * 3,
    }
    p99s = {
        "recserve": [4.0, 9.0, 5.0],
        "triton": [6.0, 7.0, 30.0],
        "fastapi": [3.0, 3.5, 4.0],
        "recserve-split": [4.0] * 3,
    }
    for r in range(1, 4):
        for system in report.SYSTEMS:
            d = p / f"round-{r}" / system
            five, twenty = rates[system][r - 1]
            write(d / "sweep.json", sweep(five or None, twenty))
            write(d / "fixed-low.json", run(p99s[system][r - 1], p50=1.0 + r))
            write(d / "fixed-0.5.json", run(p99s[system][r - 1], errors=5 if system == "fastapi" and r == 2 else 0))
            write(d / "fixed-0.7.json", run(2 * p99s[system][r - 1]))
            write(d / "oha-0.5.json", oha(0.002 * r))
            write(d / "oha-0.7.json", oha(0.004 * r))
            for step in ("fixed-low", "fixed-0.5", "fixed-0.7", "oha-0.5", "oha-0.7", "sweep"):
                write(d / f"{step}.step.json", {"steal_s": 0.01 * r, "generator_cpu_s": 1.5, "wall_s": 10.0})
            if system == "recserve":
                for step in ("fixed-0.5", "fixed-0.7"):
                    write(
                        d / f"{step}.before.prom",
                        METRICS.format(queue=0, n=0, rows=0, batches=0, inference=0, cpu=1.0, wait=0.0),
                    )
                    # 100 requests of 100 rows in 50 batches: 200 rows (2 requests) a batch, 1 ms queue wait each,
                    # inference 4 ms a batch (2 ms per 100 rows); the executor used 2 s of CPU and waited 0.5 s.
                    write(
                        d / f"{step}.after.prom",
                        METRICS.format(queue=0.1, n=100, rows=10000, batches=50, inference=0.2, cpu=3.0, wait=0.5),
                    )
    write(p / "check-triton.json", {"samples": 32, "scores": 3200, "worst_abs_diff": 0.0})
    tuning = p / "triton-tuning"
    write(tuning / "closed.json", {"achieved_rps": 600.0})
    for key, p99 in {
        "mb16-d200-0.5-1": 3.0,
        "mb16-d200-0.8-1": 8.0,
        "mb64-d0-0.5-1": 2.0,
        "mb64-d0-0.8-1": 50.0,
    }.items():
        write(tuning / f"{key}.json", run(p99, errors=10 if p99 == 50.0 else 0))
        write(tuning / f"{key}.step.json", {"steal_s": 0.0})
    return root


def row(text: str, first_cell: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {first_cell} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_every_figure_is_the_median_and_the_worst_of_the_rounds(results: Path) -> None:
    text = report.render(report.Results(results), "t")
    recserve = row(text, "recserve")
    assert recserve[1] == "500/s / 300/s"  # max rate at 5 ms: median, then the lowest
    assert recserve[2] == "900/s / 800/s"
    assert recserve[3] == "3.00 ms / 4.00 ms"  # p50 at 100/s: 2, 3, 4
    assert recserve[4] == "5.00 ms / 9.00 ms"  # p99 at 100/s: the median, then the highest
    assert recserve[7] == "10.0 ms / 18.0 ms"  # p99 at 70%
    assert recserve[6] == "4.00 ms / 6.00 ms"  # oha: 2, 4, 6 ms
    fastapi = row(text, "FastAPI")
    assert fastapi[1] == "< 100/s / < 100/s"  # met in one round of three: the median is "not met"
    assert fastapi[5].endswith("\\*"), fastapi  # a round with failed requests is marked
    assert "50% = 500/s, 70% = 700/s" in text
    assert "990/s, 1,000/s, 1,010/s" in text


def test_the_ratio_is_recserve_s_median_over_the_best_peer_s(results: Path) -> None:
    text = report.render(report.Results(results), "t")
    # 5 ms: Triton's median 200 beats FastAPI's; 500 / 200. 20 ms: Triton 450; 900 / 450.
    assert "p99 ≤ 5 ms: **2.50×** (Triton)" in text
    assert "p99 ≤ 20 ms: **2.00×** (Triton)" in text


def test_a_bound_no_one_met_is_said_in_words_not_as_a_ratio(results: Path) -> None:
    for r in range(1, 4):
        for system in report.SYSTEMS:
            path = results / "int8" / f"round-{r}" / system / "sweep.json"
            met = json.loads(path.read_text())
            met["sla"][0]["max_rps"] = None if system != "fastapi" else 100.0
            path.write_text(json.dumps(met))
    text = report.render(report.Results(results), "t")
    assert "p99 ≤ 5 ms: recserve did not meet it at the lowest rate tried, FastAPI did" in text
    for r in range(1, 4):
        path = results / "int8" / f"round-{r}" / "fastapi" / "sweep.json"
        met = json.loads(path.read_text())
        met["sla"][0]["max_rps"] = None
        path.write_text(json.dumps(met))
    text = report.render(report.Results(results), "t")
    assert "p99 ≤ 5 ms: neither peer met it at the lowest rate tried" in text


def test_recserve_s_stages_steal_and_generator_cpu_and_the_tuning_are_shown(results: Path) -> None:
    text = report.render(report.Results(results), "t")
    line = next(line for line in text.splitlines() if line.startswith("| recserve | 50% |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2] == "1.00 ms"  # mean queue wait
    assert cells[3] == "200 (2.00 requests)"
    assert cells[4] == "2.00 ms"  # inference per 100 rows
    assert cells[5] == "idle 50"
    assert cells[6] == "executor 2.00 s (waited 0.50 s)"
    noise = next(line for line in text.splitlines() if line.startswith("| 2 | Triton |"))
    assert "0.02 s · 15%" in noise  # without recload's own cpu_s, the step's (getrusage)
    # With it, recload's own figure; for a sweep its busiest rate.
    d = results / "int8" / "round-2" / "triton"
    write(d / "fixed-low.json", {**run(1.0), "cpu_s": 2.0, "wall_s": 5.0})
    write(
        d / "sweep.json", {**sweep(100, 200), "steps": [{"cpu_s": 1.0, "wall_s": 10.0}, {"cpu_s": 3.0, "wall_s": 10.0}]}
    )
    text = report.render(report.Results(results), "t")
    noise = [
        c.strip() for c in next(line for line in text.splitlines() if line.startswith("| 2 | Triton |")).split("|")
    ]
    assert noise[3] == "0.02 s · 40%"
    assert noise[-2] == "0.02 s · max 30%"
    assert "| **16** | **200** | **3.00 ms** | **8.00 ms** | **5.50 ms** |" in text
    assert "| 64 | 0 | 2.00 ms | ∞ | ∞ |" in text
    assert "| int8 | Triton | 32 | 3200 | 0.0e+00 |" in text


def test_the_section_replaces_its_markers_content_or_is_appended(results: Path) -> None:
    text = report.render(report.Results(results), "t")
    doc = f"# B\n\nbefore\n\n{report.begin('t')}\nOLD CONTENT\n{report.end('t')}\n\nafter\n"
    spliced = report.splice(doc, text, "t")
    assert spliced.startswith("# B\n\nbefore\n\n" + report.begin("t"))
    assert "OLD CONTENT" not in spliced and spliced.endswith(report.end("t") + "\n\nafter\n")
    assert report.splice(spliced, text, "t") == spliced
    appended = report.splice("# B\n", text, "t")
    assert appended == "# B\n\n" + text


def test_oha_counts_error_statuses_and_transport_errors_as_failed() -> None:
    lat = report.oha_latency(
        {
            "summary": {"requestsPerSec": 50.0},
            "latencyPercentiles": {"p50": 0.002, "p99": 0.012},
            "statusCodeDistribution": {"200": 990, "503": 5},
            "errorDistribution": {"timeout": 5},
        }
    )
    assert (lat.p50_ms, lat.p99_ms) == (2.0, 12.0)
    assert lat.failed_ratio == pytest.approx(10 / 1000)


def test_steal_is_the_eighth_value_of_each_cpu_line_in_user_hz() -> None:
    stat = (
        "cpu  100 0 50 1000 0 0 0 118 0 0\ncpu0 50 0 25 500 0 0 0 100 0 0\ncpu1 50 0 25 500 0 0 0 18 0 0\nintr 12345\n"
    )
    assert steal.parse(stat, 100) == {"steal_s": 1.18, "per_cpu_s": [1.0, 0.18]}
    # A kernel without the column, or text that is not /proc/stat: nothing, no error.
    assert steal.parse("cpu  100 0 50 1000 0 0 0\n", 100) is None
    assert steal.parse("garbage\ncpu x y z a b c d e f\n", 100) is None
