"""What the scheduler knows of one replica: its latency (the profile plus what it learns
online of the replica's run-time excess and answer overhead), its batches in flight and when a
new batch would start on it. See :mod:`gateway.policy.scheduler` for the rules."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from gateway.policy.config import SchedulerConfig
from gateway.policy.types import Batch, ReplicaInfo

_APPLY_S = 1e-4  # plan with a learned term once it has moved this much since it was applied


def _step(est: float, above: bool, q: float, step: float) -> float:
    """One step of stochastic tracking of the ``q`` quantile of a stream of samples."""
    return est + (step * q if above else -step * (1 - q))


@dataclass
class Replica:
    info: ReplicaInfo
    base: list[float]  # profile seconds of a batch by rows (index 0 unused)
    healthy: bool = True
    draining: bool = False  # takes no new batch; its batches in flight complete
    inflight: list[Batch] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)  # predicted end on the replica of each in flight
    run_excess: float = 0.0  # learned seconds a batch runs beyond its profile on the replica
    overhead: float = 0.0  # learned seconds from a batch's end on the replica to its answers
    # the (run_excess, overhead) planning uses (:meth:`latency`); a new tuple whenever they change
    applied: tuple[float, float] = (0.0, 0.0)
    last_done: float | None = None  # when the last batch came back (learning overhead; None after a failure)
    back: float | None = None  # when the last batch came back, failed or not
    free_at: float | None = None  # when the batches in flight let a new one begin (-inf: none); None: not known

    def latency(self, rows: int) -> float:
        """Seconds from the start of a batch of ``rows`` until its answers are back: its profile
        time plus the applied run excess (how long it holds the replica; see reanchor), then its
        answers' way back (the applied overhead). Computed on each call: the learned terms move
        on about every other completion, and a replica plans with a few rows' entries between
        two moves, not with all of its max batch's."""
        if not rows:
            return 0.0
        g, o = self.applied
        return self.base[rows] + g + o

    def learn(self, batch: Batch, now: float, cfg: SchedulerConfig) -> None:
        """``batch`` came back at ``now``: move both learned terms one step."""
        step = cfg.overhead_step_s
        if self.last_done is not None and batch.dispatched < self.last_done:
            # sent before the previous batch came back: it ran back to back after it
            excess = now - self.last_done - self.base[batch.rows]
            est = _step(self.run_excess, excess > self.run_excess, 0.5, step)
            self.run_excess = min(max(est, -0.5 * self.base[1]), cfg.max_overhead_s)
        lateness = now - batch.predicted_finish
        self.overhead = min(max(_step(self.overhead, lateness > 0, cfg.overhead_quantile, step), 0.0),
                            cfg.max_overhead_s)
        self.last_done = now
        g, o = self.applied
        moved = max(abs(self.run_excess - g), abs(self.overhead - o)) >= _APPLY_S
        exact = (self.run_excess, self.overhead) == (0.0, 0.0) != (g, o)  # back to the profile itself
        if moved or exact:
            self.applied = (self.run_excess, self.overhead)

    def ran(self, batch: Batch, now: float) -> float:
        """Seconds ``batch``, answered at ``now``, took from when the replica could begin it: its
        dispatch, or the answers of the batch before it if they came back later (it was sent
        ahead to the busy replica). With one batch in flight, the round trip of the batch."""
        began = batch.dispatched if self.back is None or self.back < batch.dispatched else self.back
        return now - began

    def dispatch(self, batch: Batch) -> None:
        """``batch`` (planned with the current latency) is in flight on this replica."""
        self.inflight.append(batch)
        self.ends.append(batch.predicted_finish - self.applied[1])
        self.free_at = None

    def remove(self, batch: Batch) -> None:
        """``batch`` is no longer in flight (by identity, else by equality)."""
        for i, b in enumerate(self.inflight):
            if b is batch or b == batch:
                del self.inflight[i]
                del self.ends[i]
                self.free_at = None
                break

    def reanchor(self, now: float) -> None:
        """A batch came back at ``now``: the replica was done with it by then, so the batches
        still in flight run from there. Re-planning their ends from each completion keeps
        run-time errors from adding up along a long run of back-to-back batches."""
        t, base, excess = now, self.base, self.applied[0]
        for i, b in enumerate(self.inflight):
            t += base[b.rows] + excess  # the run time planning uses
            self.ends[i] = t
        self.free_at = None

    def start(self, now: float) -> float:
        """When a new batch would begin executing: with room to pipeline, when the replica is
        done with the batches in flight (it already holds the next one); else once their
        answers are back."""
        t = self.free_at
        if t is None:  # NOTE: kept until the batches in flight or their ends change (read on every admission)
            inflight = self.inflight
            if not inflight:
                t = float("-inf")
            elif self.info.max_inflight > 1:
                t = max(self.ends)
            elif len(inflight) == 1:
                t = inflight[0].predicted_finish
            else:
                t = max(b.predicted_finish for b in inflight)
            self.free_at = t
        return t if t > now else now

    def has_slot(self) -> bool:
        return self.healthy and len(self.inflight) < self.info.max_inflight


def cost_per_answer(reps: list[Replica]) -> float | None:
    """A variant's price of one answer: each replica's profile seconds per row at its full
    batch times its price per second, averaged over its replicas (None when none is priced)."""
    costs = [r.base[r.info.max_batch] / r.info.max_batch * r.info.price_per_hour / 3600.0
             for r in reps if r.info.price_per_hour is not None]
    return sum(costs) / len(costs) if costs else None


class NeededBatch:
    """The smallest batch (rows) at which replicas together keep up with a rate: a replica whose
    max batch is smaller runs its max batch. Per set of replicas, and the learned terms each
    plans with (its ``applied``), it keeps the most capacity at any batch up to b rows, for
    b = 1, 2, ... as far as a question has needed (the first b whose capacity reaches a rate is
    the first where that running most does), so a question is answered by a bisection or by
    extending the walk from where it stopped. The replicas and their terms are kept with their
    entry, so an id is never reused while cached; a replica still learning moves its terms
    often, and each move starts a short walk."""

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        # ids of the replicas -> (the replicas, their applied terms, running most capacity by batch size - 1)
        self._walks: dict[object, tuple[tuple[Replica, ...], tuple[tuple[float, float], ...], list[float]]] = {}

    def __call__(self, reps: list[Replica], want: float) -> int:
        if len(reps) == 1:
            one: Replica | None = reps[0]
            top = one.info.max_batch
            key: object = id(one)
            hit = self._walks.get(key)
            if hit is None or hit[1][0] is not one.applied:  # the entry holds ``one``: its id is its own
                hit = self._entry(key, (one,))
        else:
            one = None
            key = tuple(map(id, reps))
            top = max(r.info.max_batch for r in reps)
            hit = self._walks.get(key)
            if hit is None or any(a is not r.applied for a, r in zip(hit[1], reps, strict=True)):
                hit = self._entry(key, tuple(reps))
        best = hit[2]
        if best and best[-1] >= want:
            return bisect.bisect_left(best, want) + 1
        b = len(best)
        running = best[-1] if best else 0.0
        while b < top:
            b += 1
            cap = b / one.latency(b) if one is not None else _capacity(reps, b)  # one replica: inline
            if b == 1 or cap > running:
                running = cap
            best.append(running)
            if cap >= want:
                return b
        return top

    def _entry(self, key: object, reps: tuple[Replica, ...]
               ) -> tuple[tuple[Replica, ...], tuple[tuple[float, float], ...], list[float]]:
        if len(self._walks) >= self.limit:
            self._walks.clear()
        hit = self._walks[key] = (reps, tuple(r.applied for r in reps), [])
        return hit


def _capacity(reps: list[Replica], b: int) -> float:
    """Requests per second the replicas serve together at batches of ``b`` rows (each capped
    at its max batch), summed in their order."""
    cap = 0.0
    for r in reps:
        k = min(b, r.info.max_batch)
        cap += k / r.latency(k)
    return cap
