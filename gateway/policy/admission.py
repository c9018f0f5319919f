"""Admission: when would a new request finish, given the work queued ahead of it?

The plan is deliberately optimistic so that a reject means "hopeless": the rows ahead of the
request (earlier deadlines, served first under EDF) go out in full batches on whichever
replica can start first; the request joins the last of those batches if it fits, else it
goes in the next batch on the replica that finishes it first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import NamedTuple

from gateway.policy.types import Request


class Lane(NamedTuple):
    """One replica as the planner sees it (a tuple: one is built per replica per admission)."""

    start: float  # when it can begin a new batch
    latency: Callable[[int], float]  # predicted seconds of a batch of n rows
    max_batch: int


def predict_finish(lanes: Sequence[Lane], rows_ahead: int, size: int) -> float:
    """Predicted finish of a request of ``size`` rows behind ``rows_ahead`` rows."""
    usable = [i for i, ln in enumerate(lanes) if ln.max_batch >= size]
    if not usable:
        return float("inf")
    if len(usable) == 1:  # one replica: the same steps without the heap
        lane = lanes[usable[0]]
        s, rem = lane.start, rows_ahead
        while rem + size > lane.max_batch:
            chunk = min(lane.max_batch, rem)
            rem -= chunk
            s = s + lane.latency(chunk)
        return s + lane.latency(rem + size)
    heap = [(lanes[i].start, i) for i in usable]
    heapq.heapify(heap)
    rem = rows_ahead
    while True:
        s, i = heap[0]  # the lane that starts first (entries are unique: i breaks ties)
        lane = lanes[i]
        if rem + size <= lane.max_batch:
            best = s + lane.latency(rem + size)
            for s2, j in heap[1:]:  # or another replica takes the request alone, in parallel
                t = s2 + lanes[j].latency(size)
                if t < best:
                    best = t
            return best
        chunk = min(lane.max_batch, rem)
        rem -= chunk
        heapq.heapreplace(heap, (s + lane.latency(chunk), i))


def pushes_late(lanes: Sequence[Lane], queue: Sequence[Request], idx: int, size: int, unit: bool) -> bool:
    """Whether a request of ``size`` rows joining the EDF-ordered ``queue`` at ``idx`` pushes a
    queued request that the whole plan (:func:`finishes_from`) finishes in time past its
    deadline. ``unit``: every queued request is one row.

    The plans with and without it form the same batches up to the first that would reach
    ``idx``; only the rest is planned, twice."""
    if not lanes:
        return False
    heap = [(ln.start, i) for i, ln in enumerate(lanes)]
    heapq.heapify(heap)
    n, k = len(queue), 0
    sizes = None if unit else [r.size for r in queue]
    while k < n:  # the shared batches, without recording finishes
        s, i = heap[0]
        lane = lanes[i]
        if unit:
            rows = min(lane.max_batch, n - k)
            end = k + rows
        else:
            rows, end = 0, k
            while end < n and rows + sizes[end] <= lane.max_batch:
                rows += sizes[end]
                end += 1
            if rows == 0:  # too large for this replica: the whole plan skips it there
                end = k + 1
        if end >= idx:
            break
        heapq.heapreplace(heap, (s + lane.latency(rows) if rows else s, i))
        k = end
    tail = [1] * (n - k) if unit else sizes[k:]
    before = finishes_from(lanes, list(heap), tail)
    after = finishes_from(lanes, heap, [*tail[:idx - k], size, *tail[idx - k:]])
    for j in range(k, n):
        a = after[j - k] if j < idx else after[j - k + 1]
        if before[j - k] <= queue[j].deadline < a:
            return True
    return False


def finishes_from(lanes: Sequence[Lane], heap: list[tuple[float, int]], sizes: Sequence[int]) -> list[float]:
    """Predicted finish of each request of an EDF-ordered queue (``sizes`` in rows) when the
    queue goes out in order, as many rows per batch as fit, on whichever lane is free first;
    ``heap`` holds each lane's (free at, index), and is used up."""
    out = [float("inf")] * len(sizes)
    k = 0
    while k < len(sizes):
        s, i = heapq.heappop(heap)
        lane = lanes[i]
        rows, first = 0, k
        while k < len(sizes) and rows + sizes[k] <= lane.max_batch:
            rows += sizes[k]
            k += 1
        if rows == 0:  # too large for this replica; no other does better in this plan
            k += 1
        else:
            finish = s + lane.latency(rows)
            for j in range(first, k):
                out[j] = finish
            s = finish
        heapq.heappush(heap, (s, i))
    return out
