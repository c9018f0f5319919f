"""Arrival-rate estimate from submit times alone (no clock reads)."""

from __future__ import annotations

from collections import deque
from itertools import repeat


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
        # ``recent`` resumes where its last call for the same window stopped: the absolute index
        # (counting times dropped off the left) of the first time inside that window. Valid while
        # times arrive in order; one out of order turns it off for good (then it scans).
        self._dropped = 0
        self._ordered = True
        self._cursor: dict[float, int] = {}

    def observe(self, now: float, rows: int = 1) -> None:
        times = self._times
        if self._first is None:
            self._first = now
        elif times and now < times[-1]:
            self._ordered = False
        n = len(times)
        if rows == 1:
            times.append(now)
        else:
            times.extend(repeat(now, rows))
        self._dropped += n + rows - len(times)  # what the deque's maxlen pushed off the left

    def rate(self, now: float) -> float:
        if self._first is None:
            return 0.0
        lo = now - self.window
        times = self._times
        while times and times[0] < lo:
            times.popleft()
            self._dropped += 1
        span = max(self.min_span, min(self.window, now - self._first))
        return len(times) / span

    def recent(self, now: float, window: float) -> float:
        """Requests per second over the last ``window`` seconds (at most its own window)."""
        lo = now - window
        times = self._times
        n = len(times)
        i = max(self._cursor.get(window, 0) - self._dropped, 0)
        if not self._ordered or i > n or (i > 0 and times[i - 1] >= lo):
            # out of order, or the window moved back: count from the newest
            count = 0
            for t in reversed(times):
                if t < lo:
                    break
                count += 1
            return count / window
        # NOTE: in order, every time before the cursor is older than the window
        while i < n and times[i] < lo:
            i += 1
        self._cursor[window] = i + self._dropped
        return (n - i) / window
