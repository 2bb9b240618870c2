"""Progress lines for the toolchain's long steps (training, quantization, evaluation): how much of a known amount
of work is done, at what rate, how long it has taken and about how long is left.

    steps = Progress("steps", total=2000, report=to_stderr("train-lightgcn"))
    for step in ...:
        steps.advance(note=f"epoch {epoch}/{epochs}")

reports at most one line every `every` seconds (and always the last one), such as

    train-lightgcn: 150/2000 steps (8%), 4.1 steps/s, 37 s so far, about 7 min 31 s left; epoch 3/40

The time left is the remaining work at the average rate so far. A line per step would flood a log; a bar would be
unreadable in CI logs and files, so the lines are plain text.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


def duration(seconds: float) -> str:
    """`42 s`, `7 min 31 s`, `1 h 02 min`."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def to_stderr(prefix: str) -> Callable[[str], None]:
    """A report function that prints `prefix: message` to stderr."""

    def report(message: str) -> None:
        print(f"{prefix}: {message}", file=sys.stderr, flush=True)

    return report


class Progress:
    """Counts `unit`s of work out of `total` and reports a line through `report` at most every `every` seconds,
    and when the work is done. `clock` is injectable for tests."""

    def __init__(
        self,
        unit: str,
        total: int,
        report: Callable[[str], None],
        *,
        every: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.unit, self.total = unit, max(int(total), 0)
        self.report, self.every, self.clock = report, every, clock
        self.done = 0
        self.started = clock()
        self.reported_at: float | None = None

    def line(self, note: str = "") -> str:
        """The progress line now."""
        elapsed = self.clock() - self.started
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        parts = [f"{self.done}/{self.total} {self.unit}{share}"]
        if elapsed > 0 and self.done:
            rate = self.done / elapsed
            if rate >= 100:
                parts.append(f"{rate:,.0f} {self.unit}/s")
            else:
                parts.append(f"{rate:.3g} {self.unit}/s" if rate >= 1 else f"{duration(elapsed / self.done)} each")
        parts.append(f"{duration(elapsed)} so far")
        if self.done < self.total:
            parts.append(f"about {duration(elapsed / self.done * (self.total - self.done))} left" if self.done else "")
        text = ", ".join(p for p in parts if p)
        return f"{text}; {note}" if note else text

    def advance(self, count: int = 1, note: str = "") -> None:
        """`count` more units are done; reports if `every` seconds have passed since the last line (or the start),
        or if the work is complete."""
        self.done += count
        now = self.clock()
        due = now - (self.reported_at if self.reported_at is not None else self.started) >= self.every
        if due or self.done >= self.total:
            self.reported_at = now
            self.report(self.line(note))
