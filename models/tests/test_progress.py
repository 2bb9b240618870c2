"""Progress lines: rate, time so far and time left, at most one line per interval, always the last one."""

from __future__ import annotations

from recserve_models.progress import Progress, duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_durations_read_as_minutes_and_hours() -> None:
    assert [duration(s) for s in (0.4, 42, 451, 3720, -1)] == ["0 s", "42 s", "7 min 31 s", "1 h 02 min", "0 s"]


def test_lines_come_at_most_every_interval_and_at_the_end() -> None:
    clock, lines = Clock(), []
    steps = Progress("steps", 40, lines.append, every=10.0, clock=clock)
    for _ in range(39):
        clock.now += 1.0
        steps.advance(note="epoch 1/2")
    assert lines == [
        "10/40 steps (25%), 1 steps/s, 10 s so far, about 30 s left; epoch 1/2",
        "20/40 steps (50%), 1 steps/s, 20 s so far, about 20 s left; epoch 1/2",
        "30/40 steps (75%), 1 steps/s, 30 s so far, about 10 s left; epoch 1/2",
    ]
    clock.now += 1.0
    steps.advance()
    assert lines[-1] == "40/40 steps (100%), 1 steps/s, 40 s so far"


def test_slow_units_read_as_seconds_per_unit_and_empty_work_still_reports() -> None:
    clock, lines = Clock(), []
    batches = Progress("batches", 3, lines.append, every=0.0, clock=clock)
    clock.now += 120.0
    batches.advance()
    assert lines == ["1/3 batches (33%), 2 min 00 s each, 2 min 00 s so far, about 4 min 00 s left"]
    none = Progress("tables", 0, lines.append, clock=clock)
    none.advance(0)
    assert lines[-1] == "0/0 tables, 0 s so far"
