"""Arrival-rate estimate from submit times alone (no clock reads)."""

from __future__ import annotations

from collections import deque


class RateEstimator:
    """Requests per second over the last ``window`` seconds of submits.

    Before a full window has passed since the first submit, the rate is taken over the time
    observed so far (at least ``min_span`` seconds, so two early arrivals do not read as a flood).
    """

    def __init__(self, window: float = 1.0, min_span: float = 0.05, max_kept: int = 100_000) -> None:
        self.window = window
        self.min_span = min_span
        self._times: deque[float] = deque(maxlen=max_kept)
        self._first: float | None = None

    def observe(self, now: float, rows: int = 1) -> None:
        if self._first is None:
            self._first = now
        if rows == 1:
            self._times.append(now)
            return
        for _ in range(rows):
            self._times.append(now)

    def rate(self, now: float) -> float:
        if self._first is None:
            return 0.0
        lo = now - self.window
        while self._times and self._times[0] < lo:
            self._times.popleft()
        span = max(self.min_span, min(self.window, now - self._first))
        return len(self._times) / span

    def recent(self, now: float, window: float) -> float:
        """Requests per second over the last ``window`` seconds (at most its own window)."""
        lo = now - window
        n = 0
        for t in reversed(self._times):
            if t < lo:
                break
            n += 1
        return n / window
