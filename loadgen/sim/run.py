"""One ``headrace sim`` run: the arrivals of a :class:`~loadgen.spec.LoadSpec` (every process
``headrace load`` has: constant, Poisson, Gamma, trace replay, timestamps, model mixes) sent
through a :class:`~loadgen.sim.fleet.SimFleet` in virtual time, recorded in the same
:class:`~loadgen.stats.Recorder` a live load test fills and summarized in the same shape as
``headrace load``'s report and JSON (plus a ``sim`` section).

As the gateway does, a request's deadline is its arrival plus its SLO less the model's
deadline margin; it counts as good when answered within the whole SLO (the load test's
``slo_ms``, else the model's). Requests arriving in the warm-up are simulated, not recorded.

Models that share no replica or slice (:meth:`SimFleet.groups`) can run in separate worker
processes, each group with its own core (as separate gateways would be); a worker simulates its
share of the groups one after another into one recorder, and the workers' recorders merge
exactly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

import numpy as np

from gateway.policy import EdfScheduler
from gateway.policy.types import Priority, Request
from loadgen.arrivals import Schedule
from loadgen.describe import arrival_name
from loadgen.record import run_record
from loadgen.sim.fleet import SimFleet
from loadgen.sim.simulator import Fault, Simulator, Slow
from loadgen.spec import LoadSpec
from loadgen.stats import OK, Recorder, refusal
from profiles.profile import Quantile


@dataclass(frozen=True)
class SimOptions:
    """How the simulated replicas behave beyond their profiles."""

    service: Quantile = "p50"  # the profile latency the replicas take
    faults: tuple[Fault | Slow, ...] = ()
    overhead: float = 0.0  # seconds every batch takes beyond its profile
    jitter: float = 0.0  # mean of an exponential extra per batch (seconds)
    transit: float = 0.0  # seconds each way between the gateway and a replica
    processes: int = 1  # worker processes for independent model groups


@dataclass
class _Tally:
    """What the simulator knows beyond the recorder: refusal reasons, late answers, batches."""

    reasons: dict[str, int] = field(default_factory=dict)
    late: int = 0
    warmup: int = 0
    unanswered: int = 0
    batches: int = 0
    batch_rows: int = 0

    def add(self, other: _Tally) -> None:
        for k, v in other.reasons.items():
            self.reasons[k] = self.reasons.get(k, 0) + v
        self.late += other.late
        self.warmup += other.warmup
        self.unanswered += other.unanswered
        self.batches += other.batches
        self.batch_rows += other.batch_rows


def requests_of(sched: Schedule, fleet: SimFleet, spec: LoadSpec) -> Iterator[tuple[int, Request]]:
    """(index, request) per arrival of ``sched``, its deadline and class as the gateway sets
    them: the load test's SLO (``slo_ms``, sent as Triton's timeout) else the model's, less the
    model's margin; ``priority`` 2 and above is best-effort, else the model's class."""
    budget: list[float] = []
    prio: list[Priority] = []
    for name in sched.models:
        m = fleet.models.get(name)
        if m is None:  # not in this part of the fleet: its arrivals were cut out
            budget.append(0.0)
            prio.append(Priority.GUARANTEED)
            continue
        slo = spec.slo_ms / 1e3 if spec.slo_ms else m.slo
        budget.append(slo * (1.0 - m.margin))
        if spec.priority is None or spec.priority == 0:
            prio.append(m.priority)
        else:
            prio.append(Priority.BEST_EFFORT if spec.priority >= 2 else Priority.GUARANTEED)
    models = sched.models
    for i, (t, mi) in enumerate(zip(sched.times.tolist(), sched.model_idx.tolist(), strict=True)):
        yield i, Request(i, models[mi], t, t + budget[mi], prio[mi])


def client_slo(fleet: SimFleet, spec: LoadSpec) -> dict[str, float]:
    return {m: spec.slo_ms / 1e3 if spec.slo_ms else v.slo for m, v in fleet.models.items()}


def simulate(fleet: SimFleet, spec: LoadSpec, sched: Schedule, opts: SimOptions,
             into: tuple[Recorder, _Tally] | None = None) -> tuple[Recorder, _Tally]:
    """One core over ``fleet`` fed ``sched``; the recorder and the tally (``into``: add to these)."""
    rec, tally = into if into is not None else (Recorder(spec.window_s), _Tally())
    slo = client_slo(fleet, spec)
    warm = spec.warmup_s
    record, reasons = rec.record, tally.reasons

    def sink(req: Request, variant: str, end: float, outcome: str, reason: str, rows: int) -> None:
        if req.arrival < warm:
            tally.warmup += 1
            return
        if reason:
            reasons[reason] = reasons.get(reason, 0) + 1
            record(req.model, None, req.arrival - warm, end - req.arrival, slo[req.model], refusal(reason))
            return
        if outcome == "late":
            tally.late += 1
        record(req.model, variant, req.arrival - warm, end - req.arrival, slo[req.model], OK)

    faults = tuple(f for f in opts.faults if f.replica in {r.info.id for r in fleet.replicas})
    sim = Simulator(EdfScheduler(fleet.scheduler), fleet.replicas, service=opts.service, faults=faults,
                    overhead=opts.overhead, jitter=opts.jitter, transit=opts.transit, seed=spec.seed)
    tally.unanswered += sim.feed(requests_of(sched, fleet, spec), sink)
    tally.batches += len(sim.batch_rows)
    tally.batch_rows += int(np.sum(sim.batch_rows, dtype=np.int64)) if sim.batch_rows else 0
    return rec, tally


def split(sched: Schedule, groups: Sequence[Sequence[str]]) -> list[Schedule]:
    """Each group's arrivals, in time order (one sort of the whole schedule by model)."""
    key = sched.model_idx
    if len(sched.models) <= np.iinfo(np.int16).max:
        # NOTE: numpy sorts 16-bit keys stably by radix: 72M arrivals in 2.5 s, against 10.8 s as int32
        key = key.astype(np.int16)
    order = np.argsort(key, kind="stable")  # by model, in time order within each
    bounds = np.searchsorted(key[order], np.arange(len(sched.models) + 1))
    index = {m: i for i, m in enumerate(sched.models)}
    out = []
    for g in groups:
        parts = [order[bounds[index[m]]:bounds[index[m] + 1]] for m in g if m in index]
        if len(parts) == 1:
            idx = parts[0]  # one model's arrivals: in time order already
        elif parts:
            idx = np.sort(np.concatenate(parts))
        else:
            idx = np.zeros(0, dtype=np.int64)
        out.append(Schedule(sched.times[idx], sched.model_idx[idx], sched.models))
    return out


def shares(sizes: Sequence[int], bins: int) -> list[list[int]]:
    """Indices of ``sizes`` dealt into ``bins`` lists of about equal total, largest first
    (each list in ascending index order)."""
    totals, out = [0] * bins, [[] for _ in range(bins)]
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        b = min(range(bins), key=totals.__getitem__)
        totals[b] += sizes[i]
        out[b].append(i)
    return [sorted(b) for b in out if b]


def simulate_groups(fleets: Sequence[SimFleet], spec: LoadSpec, scheds: Sequence[Schedule], opts: SimOptions
                    ) -> tuple[Recorder, _Tally]:
    """Several groups, each with its own core, one after another into one recorder."""
    into = (Recorder(spec.window_s), _Tally())
    for fleet, sched in zip(fleets, scheds, strict=True):
        simulate(fleet, spec, sched, opts, into)
    return into


def _group_job(args: tuple[list[SimFleet], str, list[Schedule], SimOptions]) -> tuple[dict[str, Any], _Tally]:
    """:func:`simulate_groups` in a worker process: the spec as JSON in, the recorder encoded out."""
    fleets, spec_json, scheds, opts = args
    rec, tally = simulate_groups(fleets, LoadSpec.model_validate_json(spec_json), scheds, opts)
    return rec.encode(), tally


def run_sim(fleet: SimFleet, spec: LoadSpec, opts: SimOptions, extra: dict[str, Any] | None = None
            ) -> tuple[dict[str, Any], Recorder]:
    """Simulate ``spec``'s arrivals on ``fleet``: ``headrace load``'s summary (with a ``sim``
    section) and the recorder. Raises ValueError naming models the fleet does not serve."""
    started = time.perf_counter()
    sched, duration = spec.measured(spec.schedule())
    unknown = sorted(set(sched.models) - set(fleet.models))
    if unknown:
        raise ValueError(f"the arrivals name models the fleet does not serve: {unknown}; "
                         f"served: {sorted(fleet.models)}")
    groups = [g for g in fleet.groups() if any(m in sched.models for m in g)]
    workers = min(opts.processes, len(groups))
    if len(groups) <= 1:
        rec, tally = simulate(fleet, spec, sched, opts)
    elif workers <= 1:  # one core over groups that share nothing: each with its own simulator
        rec, tally = simulate_groups([fleet.subset(g) for g in groups], spec, split(sched, groups), opts)
    else:
        parts = split(sched, groups)
        # a few jobs per worker, of about equal arrivals, so the workers finish together
        deal = shares([len(p) for p in parts], workers * 4)
        spec_json = spec.model_dump_json()
        jobs = [([fleet.subset(groups[i]) for i in d], spec_json, [parts[i] for i in d], opts) for d in deal]
        rec, tally = Recorder(spec.window_s), _Tally()
        with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
            for encoded, t in pool.map(_group_job, jobs):
                rec.merge(encoded)
                tally.add(t)
    wall = time.perf_counter() - started
    slos = sorted(set(client_slo(fleet, spec).values()))
    summary = rec.summary(duration, slos[0] if slos else None)
    admitted = summary["offered"] - summary["rejected"]
    warnings = []
    if tally.unanswered:
        warnings.append(f"{tally.unanswered} requests were never answered (a simulator fault)")
    if summary["offered"] == 0:
        warnings.append("no request was measured (is the duration shorter than one arrival gap?)")
    if len(slos) > 1:
        warnings.append("models have different SLOs (" + ", ".join(
            f"{m} {v * 1e3:g} ms" for m, v in client_slo(fleet, spec).items()) + "): each request is "
            "judged by its own; the header shows the smallest")
    summary.update({
        "target": f"sim: {fleet.source}",
        "mode": "open",
        "arrival": arrival_name(spec),
        "rate": spec.rate if spec.arrival != "trace" else None,
        "concurrency": None,
        "processes": max(workers, 1),
        "duration_s": duration,
        "window_s": spec.window_s,
        "elapsed_s": wall,
        "fell_behind": False,
        "pool_saturated": False,
        "warnings": warnings,
        "warmup_offered": tally.warmup,
        "sim": {
            "service": opts.service,
            "scheduler": fleet.scheduler.model_dump(mode="json"),
            "late": tally.late,
            "reasons": dict(sorted(tally.reasons.items())),
            "admitted_attainment": summary["good"] / admitted if admitted else None,
            "answered_attainment": summary["good"] / summary["ok"] if summary["ok"] else None,
            "reject_p99_ms": summary["reject_latency_p99_ms"],
            "batches": tally.batches,
            "mean_batch": tally.batch_rows / tally.batches if tally.batches else None,
            "unanswered": tally.unanswered,
            "groups": len(groups),
            "requests_per_wall_minute": (summary["offered"] + tally.warmup) / wall * 60 if wall > 0 else None,
        },
        "run": run_record(spec, {"sim": {"fleet": fleet.source, "files": list(fleet.files),
                                         "plan": fleet.plan, "faults": [repr(f) for f in opts.faults],
                                         "service": opts.service, "overhead_s": opts.overhead,
                                         "jitter_s": opts.jitter, "transit_s": opts.transit,
                                         **(extra or {})}}),
    })
    return summary, rec
