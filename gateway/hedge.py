"""Batches in flight that their replica does not answer in time: each member is answered by its
own deadline, and a batch late past its prediction is hedged to another replica.

The driver keeps each batch it sent as a :class:`Flight` with at most one timer, armed at the
earlier of its hedge time and its earliest member's deadline. In the common case the answer
comes first and the timer is cancelled: one ``call_later`` and one ``cancel`` per batch.

- **Each member waits on its own deadline**: the end of its whole budget (its SLO, Triton
  ``timeout`` or gRPC deadline, the planning margin included) plus :data:`LATE_S`. An answer
  until then is still delivered (late: a miss, but the client's result; a starved CPU makes
  answers some tens of milliseconds late, which is not a hung replica). A member still
  unanswered then is answered at once with 504 / DEADLINE_EXCEEDED (counted as a failure), not
  when the batch's latest member gives up (a 3600 s budget no longer holds its batch mates);
  once every member is answered the call to Triton is cancelled.
- **Hedge time**: ``sent + hedge_delay(predicted)``, with ``predicted`` what the core planned
  for the batch (``Batch.predicted_finish - sent``: the profile's latency at the scheduler's
  quantile, p99 by default, plus the learned overhead and any wait behind the replica's batches
  in flight). :func:`hedge_delay` is ``max(3 * predicted, predicted + 50 ms)``: past its p99
  plan a healthy replica answers within a small fraction of that again, so three times the
  plan is reached when something stalls the replica (a stopped or hung server, a stuck GPU),
  not through ordinary variance, and no duplicate work is sent in the common case; the 50 ms
  floor keeps a batch of a few milliseconds from being hedged over the event loop's or the
  network's jitter. This follows gRPC's hedging policy (grpc/proposal A6-client-retries.md:
  ``hedgingPolicy`` sends the next copy after ``hedgingDelay``, ".5s" in its example; the first
  OK answer wins and the outstanding copies are cancelled; ``maxAttempts`` is capped at 5;
  only for calls safe to run twice) with one copy at most per batch, its delay scaled to the
  batch's own prediction instead of fixed.
- **A hedge** goes through the core, the one place that decides where requests run: the
  replica is marked suspect (:meth:`gateway.fleet.Fleet.suspect`: unhealthy to the core, so no
  new batch goes there), and the batch is completed in the core with its unanswered members to
  retry (``on_complete(retry=...)``). They return to their variant's queue, or move to another
  variant the requests accept when theirs has no healthy replica left, and the core sends them
  to another replica, or refuses those no replica can still finish by their deadline: those
  stay where they are, waiting on the first replica (or their deadline). There is no hedge
  when no other healthy replica serves the model: the members wait on their deadlines.
- **First answer wins**: a member answered by one replica (or at its deadline) leaves the
  other's way: still queued for its hedge, it leaves the core's queue; a flight whose members
  are all answered is cancelled, and its call to Triton with it.
- **Suspect until it answers**: a suspect replica takes batches again when any batch of it is
  answered, or when its ready probe passes again (the fleet's health loop).
- **Sequences are never hedged**: Triton's sequence batcher keeps a sequence's state on the one
  instance its requests go to, so a step run on two replicas would advance two states (and the
  core binds the sequence to its replica). A batch holding a sequence request waits on its
  deadline alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from gateway.errors import BackendError, GatewayError
from gateway.fleet import Fleet, Replica
from gateway.policy.types import Batch, SchedulerCore

log = logging.getLogger("headrace.gateway")

LATE_S = 2.0  # a member still waits this long past its deadline for its batch's answer
HEDGE_FACTOR = 3.0  # a batch is hedged once it is this many times its predicted time late ...
HEDGE_FLOOR_S = 0.05  # ... and at least this much past its prediction


_FACTOR_FROM = HEDGE_FLOOR_S / (HEDGE_FACTOR - 1.0)  # predictions past this: the factor decides


def hedge_delay(predicted: float) -> float:
    """Seconds after a batch predicted to answer in ``predicted`` seconds was sent at which it
    is hedged: ``max(HEDGE_FACTOR * predicted, predicted + HEDGE_FLOOR_S)``."""
    return HEDGE_FACTOR * predicted if predicted > _FACTOR_FROM else predicted + HEDGE_FLOOR_S


_NEVER = float("inf")


@dataclass(slots=True, eq=False)
class Flight:
    """One batch the driver sent: its members (the driver's pending records, in batch order)
    and what the watch over it knows."""

    replica: Replica
    batch: Batch
    live: list[Any]  # the driver's _Pending records of its members
    sent: float
    keep: float = 1.0  # the share of a request's budget the core plans with (1 - margin)
    hedge_at: float = _NEVER  # when it is late enough to hedge (never: a sequence, or hedged)
    task: asyncio.Task | None = None  # the wait for its answer
    timer: asyncio.TimerHandle | None = None
    open: bool = True  # its call has not ended (answered, failed or cancelled)
    settled: bool = False  # the core was told it is done (at its end, or when it was hedged)


class Hedging:
    """The watch over the driver's batches in flight, mixed into :class:`gateway.driver.Driver`
    (which provides the attributes below)."""

    fleet: Fleet
    core: SchedulerCore
    clock: Callable[[], float]
    _loop: asyncio.AbstractEventLoop | None
    _pending: dict[int, Any]
    hedges: int  # batches hedged so far

    def _fail(self, p: Any, err: GatewayError) -> None: ...
    def _poll(self) -> None: ...

    def _watch(self, f: Flight, now: float) -> None:
        """Arm ``f``'s timer at its hedge time or its earliest member's deadline (plus
        :data:`LATE_S`)."""
        keep, at, alone = f.keep, _NEVER, False
        for p in f.live:  # NOTE: a loop, not min() over a generator: once per batch sent
            r = p.request
            end = r.arrival + (r.deadline - r.arrival) / keep + LATE_S
            if end < at:
                at = end
            if r.sequence is not None:
                alone = True
        if not alone:
            predicted = f.batch.predicted_finish - f.sent
            hedge = f.sent + (HEDGE_FACTOR * predicted if predicted > _FACTOR_FROM else predicted + HEDGE_FLOOR_S)
            f.hedge_at = hedge
            if hedge < at:
                at = hedge
        f.timer = self._loop.call_later(at - now, self._on_watch, f)  # type: ignore[union-attr]

    def _closed(self, f: Flight) -> None:
        """``f``'s call ended: its watch ends too."""
        f.open = False
        if f.timer is not None:
            f.timer.cancel()
            f.timer = None

    def _on_watch(self, f: Flight) -> None:
        f.timer = None
        if not f.open:
            return
        now = self.clock()
        keep = f.keep
        for p in f.live:
            r = p.request
            if not p.future.done() and (end := r.arrival + (r.deadline - r.arrival) / keep + LATE_S) <= now:
                self._late(f, p, end, now)
        if f.hedge_at <= now:
            f.hedge_at = _NEVER
            self._hedge(f, now)
        if not f.open:
            return
        at = f.hedge_at
        for p in f.live:
            r = p.request
            if not p.future.done() and (end := r.arrival + (r.deadline - r.arrival) / keep + LATE_S) < at:
                at = end
        if at == _NEVER:  # every member is answered: nobody waits for this call any more
            self._release(f)
        else:
            f.timer = self._loop.call_later(max(0.0, at - now), self._on_watch, f)  # type: ignore[union-attr]

    def _late(self, f: Flight, p: Any, end: float, now: float) -> None:
        """``p``'s deadline passed :data:`LATE_S` ago with its batch unanswered: it is answered
        now, a miss."""
        ms = (end - LATE_S - p.request.arrival) * 1e3
        self._fail(p, BackendError(
            f"replica {f.replica.id}: DEADLINE_EXCEEDED: no answer {LATE_S:g} s past the request's "
            f"deadline ({ms:.0f} ms)", grpc.StatusCode.DEADLINE_EXCEEDED, retryable=False))
        self._answered(p, now)

    def _hedge(self, f: Flight, now: float) -> None:
        """``f`` is late past its hedge time: its replica becomes suspect and its unanswered
        members go back to the core, which sends them to another replica while one can still
        make their deadline (those it refuses keep waiting on ``f``)."""
        rep, b = f.replica, f.batch
        members = [p for p in f.live if not p.future.done()]
        if not members or f.settled:
            return
        model = b.requests[0].model
        if not any(r is not rep and r.model == model and r.healthy and not r.removing
                   for r in self.fleet.replicas.values()):
            return  # nobody else serves the model: the members wait on their deadlines
        log.warning("batch of %d rows on %s not answered %.0f ms after it was sent (predicted %.0f ms): "
                    "%s is suspect, %d requests hedged", b.rows, rep.id, (now - f.sent) * 1e3,
                    (b.predicted_finish - f.sent) * 1e3, rep.id, len(members))
        self.hedges += 1
        self.fleet.suspect(rep, now)
        f.settled = True
        for p in members:
            p.hedged_from, p.requeued = f, True
        try:
            self.core.on_complete(b, now, retry=tuple(p.request for p in members))
        except Exception:
            log.exception("policy core failed in on_complete")
            for p in members:
                p.requeued = False  # nothing was queued again: they wait on ``f``
        if rep.batch_done is not None:  # a removal waits until the core shows nothing in flight
            rep.batch_done.set()
        self._poll()

    def _answered(self, p: Any, now: float) -> None:
        """A hedged member ``p`` was just answered: it leaves the other replica's way."""
        first = p.hedged_from
        if first is None:
            return
        if p.requeued:  # still queued for its hedge: it leaves the queue (in flight: no change)
            p.requeued = False
            self.core.cancel(p.request.id, now)
        self._release(first)
        if p.flight is not first:
            self._release(p.flight)

    def _release(self, f: Flight | None) -> None:
        """Cancel ``f``'s call once every member of it is answered. The cancel comes one loop
        turn later, after the task's first step, so the task always sees it and tells the core."""
        if f is None or not f.open or f.task is None:
            return
        for q in f.live:
            if not q.future.done():
                return
        self._loop.call_soon(f.task.cancel)  # type: ignore[union-attr]
