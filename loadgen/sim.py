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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from gateway.policy.types import Batch, Priority, ReplicaInfo, Request, SchedulerCore
from loadgen.stats import OK, QUEUED_REASONS, Recorder, refusal
from profiles.profile import Quantile
from profiles.sharing import ActiveJob, SharingMode, progress_rates

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


@dataclass(frozen=True, slots=True)
class RequestRecord:
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


@dataclass(frozen=True, slots=True)
class _Arrival:
    request: Request


@dataclass(frozen=True, slots=True)
class _Wake:
    pass


@dataclass(frozen=True, slots=True)
class _Finish:
    slice_key: str
    replica: str
    version: int  # stale if the slice's schedule changed since


@dataclass(frozen=True, slots=True)
class _Deliver:  # a dispatched batch reaches its replica
    batch: Batch


@dataclass(frozen=True, slots=True)
class _Done:  # a finished batch's answer reaches the driver
    batch: Batch


@dataclass(frozen=True, slots=True)
class _Down:
    fault: Fault


@dataclass(frozen=True, slots=True)
class _Up:
    replica: str


@dataclass
class _Job:
    batch: Batch
    remaining: float  # solo seconds of work left


@dataclass
class _Slice:
    jobs: dict[str, _Job] = field(default_factory=dict)  # running job per replica
    updated: float = 0.0
    version: int = 0


Event = _Arrival | _Wake | _Finish | _Deliver | _Done | _Down | _Up


class Simulator:
    """Runs one :class:`SchedulerCore` against simulated replicas in virtual time."""

    def __init__(
        self,
        core: SchedulerCore,
        replicas: Sequence[SimReplica],
        *,
        service: Quantile = "p50",
        faults: Sequence[Fault] = (),
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
        self._slices: dict[str, _Slice] = {}
        self._backlog: dict[str, list[Batch]] = {r: [] for r in ids}  # dispatched, not started
        self._wakes: set[float] = set()
        self._records: dict[int, RequestRecord] = {}
        self._batch_rows: list[int] = []
        self._requests: dict[int, Request] = {}

    # ------------------------------------------------------------------ public

    def run(self, requests: Sequence[Request], until: float | None = None) -> SimResult:
        for info in (r.info for r in self.replicas.values()):
            self.core.add_replica(info, 0.0)
        for req in requests:
            self._requests[req.id] = req
            self._push(req.arrival, P_ARRIVAL, _Arrival(req))
        for f in self.faults:
            self._push(f.at, P_FAULT, _Down(f))
        now = 0.0
        while self._heap:
            now, _, _, ev = heapq.heappop(self._heap)
            if until is not None and now > until:
                break
            for t, prio, new in self._handle(ev, now):
                self._push(t, prio, new)
            self._apply(self.core.poll(now), now)
        span = max((r.arrival for r in requests), default=0.0) - min(
            (r.arrival for r in requests), default=0.0
        )
        duration = span if span > 0 else 1.0
        records = [self._records[r.id] for r in requests if r.id in self._records]
        return SimResult(records, duration, self._batch_rows, len(requests) - len(records))

    # ------------------------------------------------------------------ plumbing

    def _push(self, t: float, prio: int, ev: Event) -> None:
        heapq.heappush(self._heap, (t, prio, self._seq, ev))
        self._seq += 1

    def _handle(self, ev: Event, now: float) -> list[tuple[float, int, Event]]:
        if isinstance(ev, _Arrival):
            rej = self.core.submit(ev.request, now)
            if rej is not None:
                self._answer_reject(rej.request, rej.reason, now)
            return []
        if isinstance(ev, _Wake):
            self._wakes.discard(now)
            return []
        if isinstance(ev, _Finish):
            return self._finish(ev, now)
        if isinstance(ev, _Deliver):
            if ev.batch.replica in self._down_now:
                self.core.on_complete(ev.batch, now, retry=ev.batch.requests)
                return []
            self._backlog[ev.batch.replica].append(ev.batch)
            return self._reschedule(self.replicas[ev.batch.replica].slice_key, now)
        if isinstance(ev, _Done):
            self.core.on_complete(ev.batch, now)
            self._answer_batch(ev.batch, now)
            return []
        if isinstance(ev, _Down):
            return self._down(ev.fault, now)
        if isinstance(ev, _Up):
            self._down_now.discard(ev.replica)
            self.core.set_healthy(ev.replica, True, now)
            return []
        raise TypeError(f"unknown event {ev!r}")

    def _apply(self, decision, now: float) -> None:
        for rej in decision.rejects:
            self._answer_reject(rej.request, rej.reason, now)
        touched: set[str] = set()
        for batch in decision.batches:
            self._batch_rows.append(batch.rows)
            if self.transit > 0:
                self._push(now + self.transit, P_FINISH, _Deliver(batch))
                continue
            self._backlog[batch.replica].append(batch)
            touched.add(self.replicas[batch.replica].slice_key)
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
        if req.id in self._records:
            raise RuntimeError(
                f"request {req.id} answered twice (reject {reason!r} after "
                f"{self._records[req.id].outcome!r})"
            )
        outcome: Outcome = "failed" if reason == "failed" else "rejected"
        self._records[req.id] = RequestRecord(
            req.id,
            req.model,
            "",
            int(req.priority),
            req.arrival,
            req.deadline,
            now,
            outcome,
            reason,
        )

    def _answer_batch(self, batch: Batch, now: float) -> None:
        for req in batch.requests:
            if req.id in self._records:
                raise RuntimeError(f"request {req.id} answered twice")
            outcome: Outcome = "ok" if now <= req.deadline + 1e-12 else "late"
            self._records[req.id] = RequestRecord(
                req.id,
                req.model,
                batch.variant,
                int(req.priority),
                req.arrival,
                req.deadline,
                now,
                outcome,
                "",
                batch.rows,
            )

    # ------------------------------------------------------------------ execution

    def _slice(self, key: str) -> _Slice:
        if key not in self._slices:
            self._slices[key] = _Slice()
        return self._slices[key]

    def _rates(self, key: str, sl: _Slice) -> dict[str, float]:
        ids = list(sl.jobs)
        jobs = []
        for rid in ids:
            rep = self.replicas[rid]
            jobs.append(ActiveJob(key, rid, rep.mode, rep.share, rep.info.profile.mps_interference))
        return dict(zip(ids, progress_rates(jobs), strict=True))

    def _reschedule(self, key: str, now: float) -> list[tuple[float, int, Event]]:
        """Advance the slice's running jobs to ``now``, start backlog on idle replicas of the
        slice, and schedule each running job's finish at the current sharing rates."""
        sl = self._slice(key)
        rates = self._rates(key, sl)
        for rid, job in sl.jobs.items():
            job.remaining = max(0.0, job.remaining - rates[rid] * (now - sl.updated))
        sl.updated = now
        for rid, rep in self.replicas.items():
            if rep.slice_key == key and rid not in sl.jobs and self._backlog[rid]:
                b = self._backlog[rid].pop(0)
                extra = self.overhead + (self._rng.exponential(self.jitter) if self.jitter > 0 else 0.0)
                sl.jobs[rid] = _Job(b, rep.info.profile.latency(b.rows, self.service) + extra)
        sl.version += 1
        rates = self._rates(key, sl)
        return [
            (now + job.remaining / rates[rid], P_FINISH, _Finish(key, rid, sl.version))
            for rid, job in sl.jobs.items()
        ]

    def _finish(self, ev: _Finish, now: float) -> list[tuple[float, int, Event]]:
        sl = self._slice(ev.slice_key)
        if ev.version != sl.version or ev.replica not in sl.jobs:
            return []
        rates = self._rates(ev.slice_key, sl)
        for rid, job in sl.jobs.items():
            job.remaining = max(0.0, job.remaining - rates[rid] * (now - sl.updated))
        sl.updated = now
        job = sl.jobs.pop(ev.replica)
        if self.transit > 0:
            return [*self._reschedule(ev.slice_key, now), (now + self.transit, P_FINISH, _Done(job.batch))]
        self.core.on_complete(job.batch, now)
        self._answer_batch(job.batch, now)
        return self._reschedule(ev.slice_key, now)

    def _down(self, f: Fault, now: float) -> list[tuple[float, int, Event]]:
        key = self.replicas[f.replica].slice_key
        sl = self._slice(key)
        failed = list(self._backlog[f.replica])
        self._backlog[f.replica].clear()
        if f.replica in sl.jobs:
            rates = self._rates(key, sl)
            for rid, job in sl.jobs.items():
                job.remaining = max(0.0, job.remaining - rates[rid] * (now - sl.updated))
            sl.updated = now
            failed.insert(0, sl.jobs.pop(f.replica).batch)
        self.core.set_healthy(f.replica, False, now)
        self._down_now.add(f.replica)
        for b in failed:
            self.core.on_complete(b, now, retry=b.requests)
        return [*self._reschedule(key, now), (now + f.down_for, P_FAULT, _Up(f.replica))]


def to_recorder(records: Iterable[RequestRecord], window_s: float = 1.0):
    """The same :class:`loadgen.stats.Recorder` a live load test fills, from simulated records
    (latency from the arrival, as live runs measure from the scheduled send time)."""
    rec = Recorder(window_s)
    for r in records:
        # a reject reason means a 429 (expired and failed ones as the client tells them apart)
        outcome = refusal(r.reason) if r.reason else {"ok": OK, "late": OK}.get(r.outcome, r.outcome)
        rec.record(
            r.model,
            r.variant or None,
            r.arrival,
            r.end - r.arrival,
            r.deadline - r.arrival,
            outcome,
        )
    return rec
