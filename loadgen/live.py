"""The live view of a long run: per window of completions, the answer rate, the share in SLO
and the p99 of OK answers, for the progress line. Fed with what the drivers'
:class:`~loadgen.drivers.Progress` gathered (from one process or several); time is an
argument."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class LiveWindow:
    end_s: float  # seconds since the run started
    width_s: float
    answered_rps: float
    attainment: float | None  # None without an SLO, or with no answer in the window
    p99_ms: float | None

    def line(self) -> str:
        att = "n/a" if self.attainment is None else f"{self.attainment:.1%}"
        p99 = "-" if self.p99_ms is None else f"{self.p99_ms:.1f} ms"
        return f"last {self.width_s:g} s: {self.answered_rps:.1f}/s answered, in SLO {att}, p99 {p99}"


@dataclass
class LiveMeter:
    """Accumulates answers and closes a window every ``window_s`` of run time."""

    window_s: float
    has_slo: bool
    start: float = 0.0
    answered: int = 0
    good: int = 0
    latencies: list[float] = field(default_factory=list)
    last: LiveWindow | None = None

    def add(self, answered: int, good: int, latencies: list[float]) -> None:
        self.answered += answered
        self.good += good
        self.latencies.extend(latencies)

    def roll(self, now: float) -> LiveWindow | None:
        """Close the window if ``window_s`` has passed since it opened; the latest closed
        window (None before the first)."""
        width = now - self.start
        if width >= self.window_s:
            att = self.good / self.answered if self.answered and self.has_slo else None
            p99 = float(np.percentile(self.latencies, 99)) * 1e3 if self.latencies else None
            self.last = LiveWindow(now, round(width, 3), self.answered / width, att, p99)
            self.start, self.answered, self.good, self.latencies = now, 0, 0, []
        return self.last
