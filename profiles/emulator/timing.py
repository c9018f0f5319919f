"""Precise waits: sleep most of the way, then spin the last fraction of a millisecond.

Plain ``time.sleep`` overshoots by 50 µs to a few ms on a busy host; emulated batches must end
within 0.5 ms of the profile, so the tail of every wait is a short busy loop.
"""

from __future__ import annotations

import time

SPIN_S = 0.0004  # busy-wait this long at the end of a wait (sleep overshoots ~0.1-0.25 ms idle)


def wait_until(deadline: float, spin: float = SPIN_S) -> float:
    """Block until ``time.monotonic() >= deadline``; returns the time it was reached."""
    now = time.monotonic()
    if deadline - now > spin:
        time.sleep(deadline - now - spin)
    while (now := time.monotonic()) < deadline:
        pass
    return now
