"""Virtual-time simulator: drives the gateway's own policy core with a heap of events.

The simulator owns no policy. It feeds arrivals to a :class:`SchedulerCore` (``submit``),
asks it what to do after every event (``poll``), runs the batches it dispatches on simulated
replicas and reports completions (``on_complete``). Service time comes from each replica's
:class:`Profile` (p50 by default, or p99 for "deterministic p99" runs); replicas co-located
on one slice share it through :func:`profiles.sharing.progress_rates`.

Heap entries are ``(time, priority, seq, event)`` with the seq counter per simulator; each
handler returns the new events it causes.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

import numpy as np

from gateway.policy.types import Batch, Decision, Priority, ReplicaInfo, Request, SchedulerCore
from loadgen.stats import QUEUED_REASONS
from profiles.profile import Quantile
from profiles.sharing import ActiveJob, SharingMode, mps_terms, progress_rates

Outcome = Literal["ok", "late", "rejected", "failed"]

# event priorities at equal times: completions free replicas before arrivals are admitted
P_FINISH, P_FAULT, P_ARRIVAL, P_WAKE = 0, 1, 2, 3


@dataclass(frozen=True)
class SimReplica:
    """A simulated replica: its policy-side description plus where it runs."""

    info: ReplicaInfo
    slice_id: str = ""  # replicas with the same non-empty slice_id share one slice
    mode: SharingMode = "timeslice"
    share: float = 1.0  # MPS active-thread fraction

    @property
    def slice_key(self) -> str:
        return self.slice_id or f"own:{self.info.id}"


@dataclass(frozen=True)
class Fault:
    """Replica ``replica`` dies at ``at``: its in-flight batches fail (their requests are
    handed back for retry) and it is unhealthy for ``down_for`` seconds."""

    replica: str
    at: float
    down_for: float


@dataclass(frozen=True)
class Slow:
    """Replica ``replica`` runs every batch it starts from ``at`` ``factor`` times as long as
    its profile says, until ``until`` (None: to the end)."""

    replica: str
    at: float
    factor: float
    until: float | None = None


class RequestRecord(NamedTuple):
    id: int
    model: str
    variant: str  # "" when never dispatched
    priority: int
    arrival: float
    deadline: float
    end: float  # finish time, or the time the reject was answered
    outcome: Outcome
    reason: str = ""  # reject reason
    batch_rows: int = 0


@dataclass
class SimResult:
    records: list[RequestRecord]
    duration: float  # seconds of offered load (arrivals span)
    batch_rows: list[int] = field(default_factory=list)
    unanswered: int = 0  # requests neither completed nor rejected at the end (must be 0)

    def summary(self) -> dict:
        return summarize(self.records, self.duration, self.batch_rows, self.unanswered)


def summarize(
    records: Sequence[RequestRecord],
    duration: float,
    batch_rows: Sequence[int] = (),
    unanswered: int = 0,
) -> dict:
    """Attainment (ok within SLO / offered), goodput, latency of answered requests, rejects.

    Two readings of "admitted requests on time": ``answered_attainment`` counts the answers
    that carried a result; ``admitted_attainment`` counts every request not refused at arrival,
    so one admitted and later refused from the queue (expired, failed) is a miss."""
    n = len(records)
    ok = sum(1 for r in records if r.outcome == "ok")
    late = sum(1 for r in records if r.outcome == "late")
    rejected = [r for r in records if r.outcome in ("rejected", "failed")]
    lat = np.array([r.end - r.arrival for r in records if r.outcome in ("ok", "late")])
    rej_lat = np.array([r.end - r.arrival for r in rejected])
    admitted = n - sum(1 for r in rejected if r.reason not in QUEUED_REASONS)
    reasons: dict[str, int] = {}
    for r in rejected:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1

    def pct(a: np.ndarray, q: float) -> float | None:
        return float(np.percentile(a, q) * 1e3) if len(a) else None

    return {
        "offered": n,
        "ok": ok,
        "late": late,
        "rejected": len(rejected),
        "reasons": dict(sorted(reasons.items())),
        "attainment": ok / n if n else None,
        "answered_attainment": ok / (ok + late) if ok + late else None,
        "admitted_attainment": ok / admitted if admitted else None,
        "goodput_rps": ok / duration if duration > 0 else 0.0,
        "p50_ms": pct(lat, 50),
        "p99_ms": pct(lat, 99),
        "reject_p99_ms": pct(rej_lat, 99),
        "mean_batch": float(np.mean(batch_rows)) if len(batch_rows) else None,
        "unanswered": unanswered,
    }


def make_requests(
    times: Iterable[float],
    model: str,
    slo: float,
    *,
    start_id: int = 0,
    priority: Priority = Priority.GUARANTEED,
    size: int = 1,
    accuracy_floor: float | None = None,
) -> list[Request]:
    """One request per arrival time, deadline = arrival + slo."""
    return [
        Request(start_id + i, model, float(t), float(t) + slo, priority, size, accuracy_floor)
        for i, t in enumerate(times)
    ]


# ------------------------------------------------------------------------------ events


@dataclass(slots=True)
class _Wake:
    pass


@dataclass(slots=True)
class _Finish:
    slice_key: str
    replica: str
    version: int  # stale if the slice's schedule changed since


@dataclass(slots=True)
class _Deliver:  # a dispatched batch reaches its replica
    batch: Batch


@dataclass(slots=True)
class _Done:  # a finished batch's answer reaches the driver
    batch: Batch


@dataclass(frozen=True, slots=True)
class _Down:
    fault: Fault


@dataclass(frozen=True, slots=True)
class _Up:
    replica: str


@dataclass(frozen=True, slots=True)
class _Pace:  # a replica's batches start taking ``factor`` times their service time
    replica: str
    factor: float


class _Job:
    __slots__ = ("batch", "remaining")

    def __init__(self, batch: Batch, remaining: float) -> None:
        self.batch = batch
        self.remaining = remaining  # solo seconds of work left


@dataclass
class _Slice:
    members: tuple[str, ...]  # replica ids on the slice, in fleet order
    solo_rate: float | None  # the one member's progress rate (None: shared by several)
    jobs: dict[str, _Job] = field(default_factory=dict)  # running job per replica
    updated: float = 0.0
    version: int = 0


Event = _Wake | _Finish | _Deliver | _Done | _Down | _Up | _Pace
# one answer: (request, variant or "", end, outcome, reject reason or "", batch rows)
Sink = Callable[[Request, str, float, str, str, int], None]


class Simulator:
    """Runs one :class:`SchedulerCore` against simulated replicas in virtual time.

    Arrivals are read lazily from a time-ordered feed and merged with the event heap in the
    heap's own order (an arrival goes after finishes and faults at its instant, before
    wake-ups), so a run holds only the requests in flight, whatever its length."""

    def __init__(
        self,
        core: SchedulerCore,
        replicas: Sequence[SimReplica],
        *,
        service: Quantile = "p50",
        faults: Sequence[Fault | Slow] = (),
        overhead: float = 0.0,
        jitter: float = 0.0,
        transit: float = 0.0,
        seed: int = 0,
    ) -> None:
        ids = [r.info.id for r in replicas]
        if len(set(ids)) != len(ids):
            raise ValueError(f"replica ids must be unique, got {ids}")
        self.core = core
        self.service = service
        # what a live batch costs beyond its profile: ``overhead`` seconds on the replica plus
        # an exponential jitter of mean ``jitter``, and ``transit`` seconds each way between
        # the driver and the replica (a batch sent ahead to a busy replica hides its transit)
        self.overhead, self.jitter, self.transit = overhead, jitter, transit
        self._down_now: set[str] = set()
        self._rng = np.random.default_rng(seed)
        self.replicas = {r.info.id: r for r in replicas}
        self.faults = tuple(faults)
        for f in self.faults:
            if f.replica not in self.replicas:
                raise ValueError(
                    f"fault names unknown replica {f.replica!r}; known: {', '.join(ids)}"
                )
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = 0
        members: dict[str, list[str]] = {}
        for r in replicas:
            members.setdefault(r.slice_key, []).append(r.info.id)
        self._slices = {key: _Slice(tuple(m), self._solo_rate(key, m)) for key, m in members.items()}
        self._slice_of = {rid: self._slices[r.slice_key] for rid, r in self.replicas.items()}
        self._backlog: dict[str, deque[Batch]] = {r: deque() for r in ids}  # dispatched, not started
        self._pace = dict.fromkeys(ids, 1.0)  # service-time factor per replica (slow faults)
        self._service_s: dict[str, list[float]] = {}  # profile seconds by rows, per replica
        self._terms: dict[tuple[str, int], tuple[float, float, float]] = {}  # MPS shape by (replica, rows)
        self._wakes: set[float] = set()
        self._batch_rows: list[int] = []
        self._open: dict[int, int] = {}  # request id -> its index in the run, until answered
        self._sink: Sink = lambda *a: None
        self._handlers: dict[type, Callable[[Any, float], list[tuple[float, int, Event]]]] = {
            _Wake: self._wake, _Finish: self._finish, _Deliver: self._deliver, _Done: self._done,
            _Down: self._down, _Up: self._up, _Pace: self._paced,
        }

    # ------------------------------------------------------------------ public

    @property
    def batch_rows(self) -> list[int]:
        """Rows of every batch dispatched so far, in dispatch order."""
        return self._batch_rows

    def run(self, requests: Sequence[Request], until: float | None = None) -> SimResult:
        """Simulate ``requests`` (any order; ties in arrival keep their order) and return a
        record per request, in the order given."""
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
        records: list[RequestRecord | None] = [None] * len(requests)

        def keep(req: Request, variant: str, end: float, outcome: str, reason: str, rows: int) -> None:
            records[self._open.pop(req.id)] = RequestRecord(
                req.id, req.model, variant, int(req.priority), req.arrival, req.deadline, end,
                outcome, reason, rows)  # type: ignore[arg-type]

        self.feed(((i, requests[i]) for i in order), keep, until)
        arrivals = [r.arrival for r in requests]
        span = max(arrivals, default=0.0) - min(arrivals, default=0.0)
        done = [r for r in records if r is not None]
        return SimResult(done, span if span > 0 else 1.0, self._batch_rows, len(requests) - len(done))

    def feed(self, arrivals: Iterable[tuple[int, Request]], sink: Sink, until: float | None = None) -> int:
        """Simulate ``arrivals`` ((index, request) pairs in arrival order) and hand every
        answer to ``sink`` as it happens, after which the request is forgotten (``sink`` may
        use ``open_index`` to find its index). Returns how many requests were left unanswered."""
        self._sink = sink
        heap, push, pop, core = self._heap, self._push, heapq.heappop, self.core
        handlers, open_, apply = self._handlers, self._open, self._apply
        for info in (r.info for r in self.replicas.values()):
            core.add_replica(info, 0.0)
        for f in self.faults:
            if isinstance(f, Slow):
                push(f.at, P_FAULT, _Pace(f.replica, f.factor))
                if f.until is not None:
                    push(f.until, P_FAULT, _Pace(f.replica, 1.0))
            else:
                push(f.at, P_FAULT, _Down(f))
        it = iter(arrivals)
        nxt = next(it, None)
        while True:
            if nxt is not None and (not heap or nxt[1].arrival < heap[0][0]
                                    or (nxt[1].arrival == heap[0][0] and heap[0][1] > P_ARRIVAL)):
                now = nxt[1].arrival
                if until is not None and now > until:
                    break
                idx, req = nxt
                nxt = next(it, None)
                open_[req.id] = idx
                rej = core.submit(req, now)
                if rej is not None:
                    self._answer_reject(rej.request, rej.reason, now)
            elif heap:
                now, _, _, ev = pop(heap)
                if until is not None and now > until:
                    break
                for t, prio, new in handlers[type(ev)](ev, now):
                    push(t, prio, new)
            else:
                break
            d = core.poll(now)
            if d.batches or d.rejects or d.wakeup is not None:
                apply(d, now)
        return len(open_)

    # ------------------------------------------------------------------ plumbing

    def _push(self, t: float, prio: int, ev: Event) -> None:
        heapq.heappush(self._heap, (t, prio, self._seq, ev))
        self._seq += 1

    def _wake(self, ev: _Wake, now: float) -> list[tuple[float, int, Event]]:
        self._wakes.discard(now)
        return []

    def _deliver(self, ev: _Deliver, now: float) -> list[tuple[float, int, Event]]:
        if ev.batch.replica in self._down_now:
            self.core.on_complete(ev.batch, now, retry=ev.batch.requests)
            return []
        self._backlog[ev.batch.replica].append(ev.batch)
        return self._reschedule(self.replicas[ev.batch.replica].slice_key, now)

    def _done(self, ev: _Done, now: float) -> list[tuple[float, int, Event]]:
        self.core.on_complete(ev.batch, now)
        self._answer_batch(ev.batch, now)
        return []

    def _up(self, ev: _Up, now: float) -> list[tuple[float, int, Event]]:
        self._down_now.discard(ev.replica)
        self.core.set_healthy(ev.replica, True, now)
        return []

    def _paced(self, ev: _Pace, now: float) -> list[tuple[float, int, Event]]:
        self._pace[ev.replica] = ev.factor
        return []

    def _apply(self, decision: Decision, now: float) -> None:
        for rej in decision.rejects:
            self._answer_reject(rej.request, rej.reason, now)
        touched: dict[str, None] = {}  # slice keys in dispatch order (a set's order varies by run)
        for batch in decision.batches:
            self._batch_rows.append(batch.rows)
            if self.transit > 0:
                self._push(now + self.transit, P_FINISH, _Deliver(batch))
                continue
            self._backlog[batch.replica].append(batch)
            touched[self.replicas[batch.replica].slice_key] = None
        for key in touched:
            for t, prio, ev in self._reschedule(key, now):
                self._push(t, prio, ev)
        if (
            decision.wakeup is not None
            and decision.wakeup > now
            and decision.wakeup not in self._wakes
        ):
            self._wakes.add(decision.wakeup)
            self._push(decision.wakeup, P_WAKE, _Wake())

    def _answer_reject(self, req: Request, reason: str, now: float) -> None:
        if req.id not in self._open:
            raise RuntimeError(f"request {req.id} answered twice (reject {reason!r} after an answer)")
        self._sink(req, "", now, "failed" if reason == "failed" else "rejected", reason, 0)
        self._open.pop(req.id, None)

    def _answer_batch(self, batch: Batch, now: float) -> None:
        rows = batch.rows
        open_, sink = self._open, self._sink
        for req in batch.requests:
            if req.id not in open_:
                raise RuntimeError(f"request {req.id} answered twice")
            sink(req, batch.variant, now, "ok" if now <= req.deadline + 1e-12 else "late", "", rows)
            open_.pop(req.id, None)

    # ------------------------------------------------------------------ execution

    def _solo_rate(self, key: str, members: list[str]) -> float | None:
        if len(members) != 1:
            return None
        rep = self.replicas[members[0]]
        if rep.mode == "mps" and rep.share < 1.0:
            return None  # its speed depends on the batch it runs (profiles.sharing.mps_terms)
        return self._rates(key, members)[members[0]]

    def _rates(self, key: str, ids: Iterable[str], running: dict[str, _Job] | None = None) -> dict[str, float]:
        ids = list(ids)
        jobs = []
        for rid in ids:
            rep = self.replicas[rid]
            job = ActiveJob(key, rid, rep.mode, rep.share, rep.info.profile.mps_interference)
            if running is not None and rep.mode == "mps" and rep.share < 1.0:
                rows = running[rid].batch.rows
                terms = self._terms.get((rid, rows))
                if terms is None:
                    terms = self._terms[(rid, rows)] = mps_terms(rep.info.profile, rows, self.service)
                job = replace(job, terms=terms)
            jobs.append(job)
        return dict(zip(ids, progress_rates(jobs), strict=True))

    def _service(self, rid: str, rows: int) -> float:
        """Seconds a batch of ``rows`` takes alone on replica ``rid`` (profile, pace, overhead,
        jitter)."""
        table = self._service_s.get(rid)
        if table is None:
            info = self.replicas[rid].info
            table = self._service_s[rid] = [0.0] + [info.profile.latency(b, self.service)
                                                     for b in range(1, info.profile.max_batch + 1)]
        base = table[rows] if rows < len(table) else self.replicas[rid].info.profile.latency(rows, self.service)
        pace = self._pace[rid]
        if pace != 1.0:
            base *= pace
        return base + (self.overhead + (self._rng.exponential(self.jitter) if self.jitter > 0 else 0.0))

    def _advance(self, key: str, sl: _Slice, now: float) -> dict[str, float] | None:
        """Run the slice's jobs up to ``now`` at their current rates (returned; None: solo)."""
        if sl.solo_rate is not None:
            rate = sl.solo_rate
            for job in sl.jobs.values():
                job.remaining = max(0.0, job.remaining - rate * (now - sl.updated))
            sl.updated = now
            return None
        rates = self._rates(key, sl.jobs, sl.jobs)
        for rid, job in sl.jobs.items():
            job.remaining = max(0.0, job.remaining - rates[rid] * (now - sl.updated))
        sl.updated = now
        return rates

    def _reschedule(self, key: str, now: float) -> list[tuple[float, int, Event]]:
        """Advance the slice's running jobs to ``now``, start backlog on idle replicas of the
        slice, and schedule each running job's finish at the current sharing rates."""
        sl = self._slices[key]
        rate = sl.solo_rate
        if rate is not None:  # one replica alone on its slice (the common case), step by step
            rid = sl.members[0]
            backlog = self._backlog[rid]
            if rid in sl.jobs or not backlog:
                return []  # running alone at a fixed rate (its scheduled finish stands), or idle
            sl.updated = now
            b = backlog.popleft()
            job = sl.jobs[rid] = _Job(b, self._service(rid, b.rows))
            sl.version += 1
            return [(now + job.remaining / rate, P_FINISH, _Finish(key, rid, sl.version))]
        self._advance(key, sl, now)
        for rid in sl.members:
            if rid not in sl.jobs and self._backlog[rid]:
                b = self._backlog[rid].popleft()
                sl.jobs[rid] = _Job(b, self._service(rid, b.rows))
        sl.version += 1
        rates = self._rates(key, sl.jobs, sl.jobs)
        return [
            (now + job.remaining / rates[rid], P_FINISH, _Finish(key, rid, sl.version))
            for rid, job in sl.jobs.items()
        ]

    def _finish(self, ev: _Finish, now: float) -> list[tuple[float, int, Event]]:
        sl = self._slices[ev.slice_key]
        if ev.version != sl.version or ev.replica not in sl.jobs:
            return []
        self._advance(ev.slice_key, sl, now)
        job = sl.jobs.pop(ev.replica)
        if self.transit > 0:
            return [*self._reschedule(ev.slice_key, now), (now + self.transit, P_FINISH, _Done(job.batch))]
        self.core.on_complete(job.batch, now)
        self._answer_batch(job.batch, now)
        return self._reschedule(ev.slice_key, now)

    def _down(self, ev: _Down, now: float) -> list[tuple[float, int, Event]]:
        f = ev.fault
        key = self.replicas[f.replica].slice_key
        sl = self._slices[key]
        failed = list(self._backlog[f.replica])
        self._backlog[f.replica].clear()
        if f.replica in sl.jobs:
            self._advance(key, sl, now)
            failed.insert(0, sl.jobs.pop(f.replica).batch)
        self.core.set_healthy(f.replica, False, now)
        self._down_now.add(f.replica)
        for b in failed:
            self.core.on_complete(b, now, retry=b.requests)
        return [*self._reschedule(key, now), (now + f.down_for, P_FAULT, _Up(f.replica))]
