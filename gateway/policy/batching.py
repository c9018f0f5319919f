"""Batch-selection policies, in a registry keyed by name.

A policy looks at one queue in EDF order and one replica about to start a batch, and picks
which requests go into that batch (or says to wait). Every candidate batch the deadline-aware
policies consider has the same shape, which is the EDF rule of this core:

    a batch's members all meet its predicted finish, and every queued request left out
    with an earlier deadline than some member (a skipped head) could not have joined: adding
    it would overflow the max batch or finish the batch past that request's own deadline.

Skipped heads stay queued; the scheduler answers them at once if no replica can still
finish them in time. Policies:

- ``take-all``: Triton's dynamic batcher: everything queued up to max batch, in arrival
  order, no deadline checks (optionally waits ``max_queue_delay_s`` for a full batch).
- ``largest-prefix``: the largest EDF prefix whose predicted finish meets the head's
  deadline. Small batches near capacity starve throughput; kept as a baseline.
- ``skip-heads``: the batch with the most requests that finish in time, skipping heads.
- ``adaptive``: among batches at least as large as the observed arrival rate needs
  (or the largest possible if none is), the one that skips fewest heads, then the largest.
- ``aimd``: Clipper's adaptive batching (NSDI'17 §4.3): queue order up to a per-replica batch
  cap that grows by one after a batch whose *measured* latency (fed back by :meth:`observe`
  when it completes) is within the SLO and shrinks by 10% after one that is not; no deadline
  checks, no waiting. A baseline (see :class:`Aimd`).

The batchers that are not deadline-aware may also reject what has queued too long
(:mod:`gateway.policy.expiry`: Triton's queue policy).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.policy.edf import EdfQueue
from gateway.policy.types import Request


@dataclass(slots=True)  # built per batch formed: not frozen (see gateway.policy.types)
class Candidate:
    """A batch: queue indices ``take`` (ascending); ``skip`` queued heads before its last
    member are left out (each could not join without missing its own deadline or overflowing)."""

    take: tuple[int, ...]
    rows: int
    finish: float
    skip: int

    @property
    def count(self) -> int:
        return len(self.take)


@dataclass(slots=True)  # built per batch formed: not frozen (see gateway.policy.types)
class SelectContext:
    now: float
    start: float  # when the replica can begin executing this batch
    latency: Callable[[int], float]  # predicted seconds of a batch of n rows on this replica
    max_batch: int  # rows
    needed_batch: int  # rows per batch the fleet needs to keep up with the observed rate
    rate: float  # observed arrivals per second for this queue
    wait: bool  # may the policy wait for a larger batch
    max_queue_delay: float = 0.0  # take-all only
    replica: str = ""  # the replica the batch is for (policies with per-replica state)
    used: int = 0  # rows already chosen for this batch (the best-effort lane fills after them)


@dataclass(slots=True)  # built per batch formed: not frozen (see gateway.policy.types)
class Selection:
    take: tuple[int, ...] = ()  # queue indices, ascending
    wakeup: float | None = None  # when nothing is taken: when to look again


def candidates(queue: Sequence[Request], ctx: SelectContext) -> list[Candidate]:
    """Every distinct batch of the EDF shape whose members all meet the predicted finish.

    For each target size b: take the EDF run of requests whose deadlines allow a b-row batch,
    then add back, latest first, any skipped head that still fits and makes the finish.
    """
    queue = list(queue)
    deadlines = [r.deadline for r in queue]
    prefix = [0]  # prefix[k] = rows of queue[:k]
    for r in queue:
        prefix.append(prefix[-1] + r.size)
    out: list[Candidate] = []
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    n = len(queue)
    for b in range(1, ctx.max_batch + 1):
        i0 = bisect.bisect_left(deadlines, ctx.start + ctx.latency(b))
        if i0 >= n:
            break
        end = bisect.bisect_right(prefix, prefix[i0] + b) - 1  # EDF run from i0 within b rows
        if end <= i0:
            continue
        rows = prefix[end] - prefix[i0]
        heads: list[int] = []
        for j in range(i0 - 1, -1, -1):
            if rows >= ctx.max_batch or deadlines[j] < ctx.start + ctx.latency(rows + 1):
                break  # earlier heads have earlier deadlines: none of them can join either
            size = queue[j].size
            if rows + size <= ctx.max_batch and ctx.start + ctx.latency(rows + size) <= deadlines[j]:
                rows += size
                heads.append(j)
        key = (i0, end, tuple(heads))
        if key in seen:
            continue
        seen.add(key)
        take = (*reversed(heads), *range(i0, end))
        out.append(Candidate(take, rows, ctx.start + ctx.latency(rows), take[-1] + 1 - len(take)))
        if end == n and rows < b:
            break  # larger b only skips more
    return out


def whole_queue(queue: Sequence[Request], ctx: SelectContext) -> Candidate | None:
    """The whole queue as one batch, if it fits and meets every deadline (the earliest, at
    index 0, is the binding one). Then it is every deadline-aware policy's choice: it skips
    nothing and is the largest and longest prefix, so they take it without enumerating."""
    rows = sum(r.size for r in queue)
    if not queue or rows > ctx.max_batch:
        return None
    finish = ctx.start + ctx.latency(rows)
    if finish > queue[0].deadline:
        return None
    return Candidate(tuple(range(len(queue))), rows, finish, 0)


def _maybe_wait(queue: Sequence[Request], c: Candidate, ctx: SelectContext) -> Selection:
    """Dispatch ``c`` now, or wait for the rows the arrival rate says will come, if the
    earliest deadline in the batch still allows a batch of the needed size after the wait."""
    short = ctx.needed_batch - c.rows
    if not ctx.wait or short <= 0 or ctx.rate <= 0 or ctx.start > ctx.now:
        return Selection(c.take)
    if c.take[-1] + 1 < len(queue):
        return Selection(c.take)  # more is queued than fits in time: waiting adds nothing
    t_fill = ctx.now + short / ctx.rate
    latest = queue[c.take[0]].deadline - ctx.latency(min(ctx.max_batch, ctx.needed_batch))
    if t_fill <= latest:
        return Selection((), wakeup=t_fill)
    return Selection(c.take)


class BatchPolicy:
    name = "base"
    deadline_aware = True  # admission, expiry and skipping apply
    learns = False  # wants :meth:`observe` called when each batch completes

    def select(self, queue: Sequence[Request], ctx: SelectContext) -> Selection:
        raise NotImplementedError

    def observe(self, replica: str, rows: int, seconds: float, slo: float, max_batch: int) -> None:
        """A batch of ``rows`` on ``replica`` came back ``seconds`` after the replica could begin
        it (measured: :meth:`gateway.policy.replica.Replica.ran`); ``slo`` is the tightest SLO of
        its requests. Called by the scheduler's ``on_complete`` (live and simulated alike), only
        for policies that set ``learns``, never for a failed batch."""


class TakeAll(BatchPolicy):
    name = "take-all"
    deadline_aware = False

    def select(self, queue: Sequence[Request], ctx: SelectContext) -> Selection:
        rows = count = 0
        while count < len(queue) and rows + queue[count].size <= ctx.max_batch:
            rows += queue[count].size
            count += 1
        if count == 0:
            return Selection()
        if rows < ctx.max_batch and ctx.max_queue_delay > 0:
            oldest = min(r.arrival for r in queue)
            if ctx.now < oldest + ctx.max_queue_delay:
                return Selection((), wakeup=oldest + ctx.max_queue_delay)
        return Selection(tuple(range(count)))


class _DeadlineAware(BatchPolicy):
    """The whole queue when it fits in time (every deadline-aware policy's choice then, taken
    without enumerating), else the policy's :meth:`pick` among the EDF-shaped candidates."""

    def select(self, queue: Sequence[Request], ctx: SelectContext) -> Selection:
        best = whole_queue(queue, ctx) or self.pick(candidates(queue, ctx), ctx)
        return Selection() if best is None else _maybe_wait(queue, best, ctx)

    def pick(self, cands: list[Candidate], ctx: SelectContext) -> Candidate | None:
        raise NotImplementedError


class LargestPrefix(_DeadlineAware):
    name = "largest-prefix"

    def pick(self, cands: list[Candidate], ctx: SelectContext) -> Candidate | None:
        return max((c for c in cands if c.skip == 0), key=lambda c: c.count, default=None)


class SkipHeads(_DeadlineAware):
    name = "skip-heads"

    def pick(self, cands: list[Candidate], ctx: SelectContext) -> Candidate | None:
        return max(cands, key=lambda c: (c.count, -c.skip), default=None)


class Adaptive(_DeadlineAware):
    name = "adaptive"

    def pick(self, cands: list[Candidate], ctx: SelectContext) -> Candidate | None:
        if not cands:
            return None
        enough = min(ctx.needed_batch, max(c.rows for c in cands))
        return min((c for c in cands if c.rows >= enough), key=lambda c: (c.skip, -c.count))


class Aimd(BatchPolicy):
    """Clipper's adaptive batching: a batch-size cap per replica, moved by additive increase
    and multiplicative decrease on the *measured* latency of the batches it formed.

    Crankshaw et al., "Clipper: A Low-Latency Online Prediction Serving System", NSDI 2017,
    §4.3 (Adaptive Batching): the batch size grows by a fixed amount until the latency to
    process a batch exceeds the latency objective, then backs off by 10% (a smaller back-off
    than TCP's, as the best batch size moves little). Here:

    - the latency judged is the batch's measured one, from when the replica could begin it
      until its answers came back (Clipper's task executor times a batch from its send to the
      container until the reply), fed back by :meth:`observe` when it completes; the objective
      is the tightest SLO among its requests (Clipper's is the application's latency SLO);
    - ``step`` = 1 row: the paper does not give its fixed amount; Clipper's released code grows
      a container's batch size by 1 while it is below ``ADDITIVE_EXPANSION_THRESHOLD``
      (``ModelContainer::explore`` in ucbrise/clipper ``src/libclipper/src/containers.cpp``);
    - ``backoff`` = 0.9: the paper's 10%; the cap never goes below one row;
    - the cap starts at 1 (that code's ``max_batch_size_(1)``) and never exceeds the replica's
      max batch. Every completed batch moves it, however many rows it held.

    A batch takes the queue (EDF order: Clipper's model queue is ordered by deadline) up to the
    cap, at once: the paper's delayed batching (a batch wait timeout, §4.3) is not modelled, as
    Clipper's released code (``ModelQueue::get_batch``) dispatches as soon as a container asks.
    Past-deadline requests are dropped only with the scheduler's ``request_timeouts``, as
    Clipper's model queue drops them. Clipper's released C++ code never had AIMD (a fixed
    batch size, then from April 2017 measured throughput times the time left to the earliest
    deadline, from 2018 exploration plus a regression on measured latencies): this follows the
    paper.
    """

    name = "aimd"
    deadline_aware = False
    learns = True
    step = 1
    backoff = 0.9

    def __init__(self) -> None:
        self.caps: dict[str, int] = {}

    def select(self, queue: Sequence[Request], ctx: SelectContext) -> Selection:
        if not queue:
            return Selection()
        cap = min(self.caps.get(ctx.replica, 1) - ctx.used, ctx.max_batch)
        rows = count = 0
        while count < len(queue) and rows + queue[count].size <= cap:
            rows += queue[count].size
            count += 1
        if count == 0:
            if ctx.used:
                return Selection()  # the cap is full: the best-effort lane adds nothing
            count = 1  # a request larger than the cap goes alone
        return Selection(tuple(range(count)))

    def observe(self, replica: str, rows: int, seconds: float, slo: float, max_batch: int) -> None:
        cap = min(self.caps.get(replica, 1), max_batch)
        self.caps[replica] = min(cap + self.step, max_batch) if seconds <= slo else max(1, int(cap * self.backoff))


POLICIES: dict[str, type[BatchPolicy]] = {
    p.name: p for p in (TakeAll, LargestPrefix, SkipHeads, Adaptive, Aimd)
}


def get_policy(name: str) -> BatchPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise KeyError(f"unknown batch policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None


FIRST = object()  # _select_alike: the key of the first request the replica may take


def select_alike(policy: BatchPolicy, queue: EdfQueue, replica: str, ctx: SelectContext,
                  key: object = FIRST) -> Selection:
    """The policy's choice, as indices of ``queue``, among the queued requests ``replica`` may
    take whose batch key is ``key`` (Triton gets a batch as one request, so its members must
    agree on what is forwarded)."""
    if not queue.keyed and key in (None, FIRST):
        return policy.select(queue, ctx)  # the common case: nothing keyed or restricted
    index = [i for i, r in enumerate(queue) if r.replicas is None or replica in r.replicas]
    if not index:
        return Selection()
    if key is FIRST:
        key = queue[index[0]].key
    index = [i for i in index if queue[i].key == key]
    sel = policy.select([queue[i] for i in index], ctx)
    return Selection(tuple(index[i] for i in sel.take), sel.wakeup)
