"""Clairvoyant bound: the most requests any single-replica batch scheduler can finish in time.

Given every arrival in advance (which no online scheduler has), a deterministic batch latency
``latency[b]`` and one relative deadline for all requests, find the schedule that finishes the
most requests within their deadlines. A schedule drops some requests and serves the rest in
batches of at most ``max_batch``; a batch starts when the replica is free and its last member
has arrived (so the replica may idle to wait for a request), and its members meet the
deadline of its earliest one.

With one relative deadline, earliest deadline is arrival order, and any schedule can be
reordered so its batches are consecutive runs of the kept requests in arrival order without
finishing any request later (swap an earlier-arriving request of a later batch with a
later-arriving one of an earlier batch: both stay on time). So a dynamic programme over
"requests decided so far" is exact: for each prefix it keeps, per count of requests finished
in time, the earliest moment the replica is free again. A state is dropped only when another
provably does at least as well: it has as many finished requests and frees the replica no
later, or its lead in finished requests is at least what the head start of the first could win
back (the rows of the batches that fit in that head start). A replica free before the next
arrival counts as free at it. Pruning never drops a better schedule, so the count is exact.

The bound says how much of a policy's loss is the price of not knowing the future.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from profiles.profile import Profile

INF = float("inf")


def served_latency(profile: Profile, max_batch: int) -> list[float]:
    """``latency[b]`` as :func:`clairvoyant_ok` takes it (index 0 unused): the profile's p50,
    the latency the simulated replicas serve."""
    return [0.0] + [profile.latency(b, "p50") for b in range(1, max_batch + 1)]


def clairvoyant_ok(arrivals: Sequence[float], latency: Sequence[float], slo: float,
                   max_batch: int, *, idle: bool = True) -> int:
    """Most of ``arrivals`` (sorted, seconds) that can finish within ``slo`` of arriving.

    ``latency[b]`` is the seconds a batch of ``b`` rows runs (index 0 unused, non-decreasing,
    positive). ``idle=False`` forbids waiting for a request that has not arrived: a batch
    starts when the replica is free (or, if it was idle, when the batch's first member
    arrives) and holds only requests there by then, as an online scheduler that never waits
    does."""
    n = len(arrivals)
    if n == 0:
        return 0
    a = list(arrivals)
    if any(a[k] > a[k + 1] for k in range(n - 1)):
        raise ValueError("arrivals must be sorted")
    top = min(max_batch, len(latency) - 1)
    lat = list(latency)
    head_start = _HeadStart(lat, top)
    # front[i]: finished count -> earliest free time, over schedules deciding requests < i
    front: list[dict[int, float] | None] = [None] * (n + 1)
    front[0] = {0: 0.0}
    for i in range(n):
        states = _undominated(front[i], a[i], head_start)
        front[i] = None  # decided: free the memory
        deadline = a[i] + slo
        drop = front[i + 1] if front[i + 1] is not None else {}
        front[i + 1] = drop
        for count, free in states:
            if drop.get(count, INF) > free:
                drop[count] = free  # request i missed
            begin = free if free > a[i] else a[i]
            for b in range(1, min(top, n - i) + 1):
                last = a[i + b - 1]
                if last > begin:
                    if not idle:
                        break  # would wait for a request not yet there
                    start = last
                else:
                    start = begin
                finish = start + lat[b]
                if finish > deadline:
                    break  # a larger batch finishes later still
                nxt = front[i + b]
                if nxt is None:
                    nxt = front[i + b] = {}
                if nxt.get(count + b, INF) > finish:
                    nxt[count + b] = finish
    return max(front[n])  # type: ignore[arg-type]


class _HeadStart:
    """``gain(d)``: the most rows a replica free ``d`` seconds earlier can finish beyond one
    free later, from the same requests: the rows of back-to-back batches that all start within
    ``d`` (the later replica skips those batches and runs the rest of the same schedule, which
    starts no earlier than it is free). ``d`` is counted in whole grid cells, rounded up, and
    a batch's latency in cells rounded down, which can only raise the gain."""

    def __init__(self, lat: list[float], top: int) -> None:
        self.grid = min(1e-4, lat[1] / 4)  # a batch spans at least 4 cells
        self.cells = [int(lat[b] / self.grid) for b in range(1, top + 1)]
        self.table = [0]  # table[k]: the gain of a head start of k cells

    def gain(self, d: float) -> int:
        k = math.ceil(d / self.grid)
        table = self.table
        while len(table) <= k:  # a batch starts at 0, the next ones once it is done
            j = len(table)
            table.append(max(b + table[max(0, j - c)] for b, c in enumerate(self.cells, 1)))
        return table[k] if k > 0 else 0


def _undominated(states: dict[int, float] | None, now: float,
                 head_start: _HeadStart) -> list[tuple[int, float]]:
    """The states no other can do at least as well as, best count first. A replica free
    before ``now`` (the next request's arrival) is as good as one free at ``now``. State
    (c, f) -- c requests finished, replica free at f -- is beaten by (c2, f2) if c2 >= c and
    f2 <= f, or if c2 - c >= head_start.gain(f2 - f): even the head start of (c, f) cannot
    win back the gap."""
    if not states:
        return []
    out: list[tuple[int, float]] = []
    best_free = INF
    for count in sorted(states, reverse=True):
        free = max(states[count], now)
        if free >= best_free:
            continue
        if any(c2 - count >= head_start.gain(f2 - free) for c2, f2 in out):
            continue
        out.append((count, free))
        best_free = free
    return out
