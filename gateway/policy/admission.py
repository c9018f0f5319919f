"""Admission: when would a new request finish, given the work queued ahead of it?

The plan is deliberately optimistic so that a reject means "hopeless": the rows ahead of the
request (earlier deadlines, served first under EDF) go out in full batches on whichever
replica can start first; the request joins the last of those batches if it fits, else it
goes in the next batch on the replica that finishes it first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Lane:
    """One replica as the planner sees it."""

    start: float  # when it can begin a new batch
    latency: Callable[[int], float]  # predicted seconds of a batch of n rows
    max_batch: int


def predict_finish(lanes: Sequence[Lane], rows_ahead: int, size: int) -> float:
    """Predicted finish of a request of ``size`` rows behind ``rows_ahead`` rows."""
    usable = [i for i, ln in enumerate(lanes) if ln.max_batch >= size]
    if not usable:
        return float("inf")
    heap = [(lanes[i].start, i) for i in usable]
    heapq.heapify(heap)
    rem = rows_ahead
    while True:
        s, i = heapq.heappop(heap)
        lane = lanes[i]
        if rem + size <= lane.max_batch:
            best = s + lane.latency(rem + size)
            for s2, j in heap:  # or another replica takes the request alone, in parallel
                best = min(best, s2 + lanes[j].latency(size))
            return best
        chunk = min(lane.max_batch, rem)
        rem -= chunk
        heapq.heappush(heap, (s + lane.latency(chunk), i))
