"""The tail benchmark's reporter (scripts/bench_tail_report.py) on a small results directory written here: the
server's costs per request come from its thread accounts over the requests it answered, the one-core bound is
tail-model.py's at those costs, every figure is the median and the worst of the rounds, the slowest 1% are read from
the slow-request record, and the section is spliced between its markers. Run by scripts/test.sh."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import bench_tail_report as report  # noqa: E402

MODEL = "m"


def prom(requests: float, io_s: float, exec_s: float, stages_s: dict[str, float], batches: dict[str, float]) -> str:
    lines = [
        f'recserve_requests_total{{code="200",endpoint="rank",model="{MODEL}",pipeline="",protocol="v1"}} {requests}',
        f'recserve_thread_cpu_seconds_total{{model="",role="io"}} {io_s}',
        f'recserve_thread_cpu_seconds_total{{model="{MODEL}",role="executor"}} {exec_s}',
        f'recserve_thread_run_queue_wait_seconds_total{{model="",role="io"}} {io_s / 10}',
        f'recserve_thread_run_queue_wait_seconds_total{{model="{MODEL}",role="executor"}} {exec_s / 10}',
        f'recserve_batch_rows_sum{{model="{MODEL}"}} {requests * 100}',
        f'recserve_batch_rows_count{{model="{MODEL}"}} {requests / 2}',
        f'recserve_request_rows_sum{{model="{MODEL}"}} {requests * 100}',
        f'recserve_request_rows_count{{model="{MODEL}"}} {requests}',
    ]
    for stage, seconds in stages_s.items():
        lines.append(f'recserve_request_stage_seconds_sum{{model="{MODEL}",pipeline="",stage="{stage}"}} {seconds}')
        lines.append(f'recserve_request_stage_seconds_count{{model="{MODEL}",pipeline="",stage="{stage}"}} {requests}')
    for reason, n in batches.items():
        lines.append(f'recserve_batches_total{{model="{MODEL}",reason="{reason}"}} {n}')
    return "\n".join(lines) + "\n"


def write_step(prefix: Path, before: str, after: str, steal_s: float = 0.0) -> None:
    Path(f"{prefix}.before.prom").write_text(before)
    Path(f"{prefix}.after.prom").write_text(after)
    Path(f"{prefix}.step.json").write_text(json.dumps({"steal_s": steal_s}))


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    empty = prom(0, 0, 0, {}, {})
    # Saturation: 1000 requests costing 0.5 ms of executor and 0.2 ms of I/O CPU each; the I/O stages before the
    # queue take three times those after it.
    stages = {"read": 0.05, "decode": 0.1, "admit": 0.0, "encode": 0.04, "write": 0.01}
    for i in (1, 2, 3):
        write_step(tmp_path / f"closed-{i}", empty, prom(1000, 0.2, 0.5, stages, {"full": 100}))
        (tmp_path / f"closed-{i}.json").write_text(json.dumps({"achieved_rps": 1400.0}))
    for r, (p99, steal) in enumerate([(4.0, 0.1), (9.0, 2.5), (5.0, 0.0)], start=1):
        prefix = tmp_path / f"now-0.5-{r}"
        write_step(prefix, empty, prom(700, 0.14, 0.35, stages, {"executor_free": 650, "full": 50}), steal)
        (tmp_path / f"now-0.5-{r}.json").write_text(json.dumps({
            "offered_rps": 700.0, "latency_ms": {"p50_ms": 1.0 * r, "p99_ms": p99},
            "requests": {"errors": 0}, "cpu_s": 3.0, "wall_s": 17.0,
        }))
        # The record: the slowest 1% of 700 is 7 requests; it holds 8, slowest first.
        record = [{"model": MODEL, "status": 200, "total_ms": 10.0 - i,
                   "stages": [{"stage": "queue", "ms": 6.0 - i}, {"stage": "inference", "ms": 4.0}]}
                  for i in range(8)]
        (tmp_path / f"now-0.5-{r}.slow.json").write_text(json.dumps({"requests": record}))
    for key, value in {"MODEL": MODEL, "SHARES": "0.5", "ROUNDS": "3", "SATURATION": "1400", "DURATION": "15s",
                       "VARIANTS": "now|/bin/recserve||--body columnar\n", "COMMAND_LINE": "scripts/bench-tail.sh now",
                       "SECTION": MODEL}.items():
        monkeypatch.setenv(key, value)
    return tmp_path


def test_costs_per_request_come_from_the_thread_accounts_over_answered_requests(results: Path) -> None:
    figures = report.server_figures(results / "closed-1", MODEL)
    assert figures["requests"] == 1000
    assert figures["exec_cpu_ms"] == pytest.approx(0.5)
    assert figures["io_cpu_ms"] == pytest.approx(0.2)
    assert figures["exec_wait_ms"] == pytest.approx(0.05)
    assert figures["batch_requests"] == pytest.approx(2.0)
    b = report.bound(results, MODEL, [700])
    assert b["exec_ms"] == pytest.approx(0.5)
    # 0.2 ms of I/O split as 0.15 ms of stages before the queue and 0.05 ms after it.
    assert b["decode_ms"] == pytest.approx(0.15)
    assert b["encode_ms"] == pytest.approx(0.05)
    p50, p99 = b["p"][700]
    assert 0 < p50 <= p99


def test_a_recall_model_counts_requests_per_batch_without_request_rows(tmp_path: Path) -> None:
    # A recall model records no recserve_request_rows: 1000 requests of 32 users each in 250 batches of 128 rows
    # are 4 requests a batch.
    recall = "\n".join(line for line in prom(1000, 0.2, 0.5, {}, {}).splitlines()
                       if "request_rows" not in line and "batch_rows" not in line)
    recall += f'\nrecserve_batch_rows_sum{{model="{MODEL}"}} 32000\nrecserve_batch_rows_count{{model="{MODEL}"}} 250\n'
    write_step(tmp_path / "run", prom(0, 0, 0, {}, {}), recall)
    assert report.server_figures(tmp_path / "run", MODEL)["batch_requests"] == pytest.approx(4.0)


def test_the_report_gives_median_and_worst_and_the_slowest_one_percent(results: Path) -> None:
    text = report.render(results)
    row = next(line for line in text.splitlines() if line.startswith("| now | defaults | 700/s"))
    # p99 of the rounds 4, 9, 5: median 5, worst 9; p50 1, 2, 3.
    assert "| 2.00 / 3.00 ms | **5.00** / 9.00 ms |" in row
    assert "0.10, 2.50, 0.00 s" in row, "every run's steal"
    slow = next(line for line in text.splitlines() if line.startswith("| now | 700/s | "))
    # The 7 slowest: totals 10..4 (mean 7), queue 6..0 (mean 3), inference 4.
    assert slow.startswith("| now | 700/s | 7.00 | 0.000 | 3.00 |"), slow
    assert "executor_free 93%, full 7%" in text


def test_the_section_is_spliced_between_its_markers(results: Path, tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    begin = f"<!-- BEGIN bench-tail ({MODEL}): generated by scripts/bench-tail.sh --doc, do not edit by hand -->"
    end = f"<!-- END bench-tail ({MODEL}) -->"
    doc.write_text(f"before\n{begin}\nold\n{end}\nafter\n")
    sys.argv = ["bench_tail_report.py", "--results", str(results), "--doc", str(doc)]
    report.main()
    text = doc.read_text()
    assert text.startswith(f"before\n{begin}\n") and text.endswith(f"{end}\nafter\n")
    assert "old" not in text and "one-core bound" in text
    assert os.path.exists(results / "report.md")
