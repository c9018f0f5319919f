"""The EDF scheduler: one synchronous state machine per gateway (or simulation).

Per variant of each served model it keeps two EDF queues (guaranteed and best-effort), an
arrival-rate estimate and its replicas with their in-flight batches. Drivers call ``submit``, ``poll``,
``on_complete`` and the replica methods with ``now``; it never reads a clock.

Rules (each one is tested):
- Variants: a request joins the queue of the most accurate variant meeting its accuracy
  floor that is predicted to meet its deadline (:mod:`gateway.policy.selector`); under
  sustained overload the model's level skips its most accurate variants first.
- Accounting: every submitted request is answered exactly once: by a reject from ``submit``
  or ``poll``, by completing in a batch (``on_complete`` without it in ``retry``), or by
  being handed back from ``remove_replica`` (then the driver owns it). Moving between
  variants (below) answers nothing: the request stays admitted.
- Drain and removal: a drained replica (``drain_replica``) takes no new batch and counts as
  no capacity for admission, planning and expiry; its batches in flight complete as usual.
  When a variant has no replica left that is not draining (drained or removed), or none
  healthy when a batch hands requests back to retry, its queued requests move, earliest
  deadline first, to the model's other variants by the rule of :mod:`gateway.policy.migrate`. Those no variant takes stay queued after a drain (answered
  "no_replica" at the next poll) and are handed back by ``remove_replica``, as are the
  requests in flight on the removed replica. A replica added while serving takes batches
  from the next poll on.
- Admission (deadline-aware policies): a request is rejected at submit only if no healthy
  replica serves its model ("no_replica"), its rows exceed every replica's max batch, or its
  finish predicted by :func:`gateway.policy.admission.predict_finish` is past its deadline
  ("infeasible"; "shed" for best-effort). With ``admission="plan"`` the prediction counts
  the rows ahead of it in EDF order (guaranteed rows all count ahead of best-effort ones);
  with ``"alone"`` none. ``"protect"`` also refuses a guaranteed request whose admission
  would push a queued one past its deadline in that plan; ``"burst"`` does so only while the
  model's arrivals over the last ``burst_window_s`` exceed ``burst_factor`` times the
  capacity of the variant's replicas.
- Expiry: a queued request no replica can still finish alone in time is answered at the
  next poll ("expired"; "failed" after a failed batch; "shed" for best-effort). The batchers
  that are not deadline-aware expire only by queue timeouts (:mod:`gateway.policy.expiry`).
- Batches follow the EDF shape of :mod:`gateway.policy.batching`; a batch is never larger
  than the replica's max batch, and best-effort rows only fill a batch when no guaranteed
  request is left queued for the model.
- A replica executes its in-flight batches one after another: a new batch is predicted to
  start when the last one in flight is predicted to end on the replica, and a busy replica gets
  it no earlier than ``pipeline_lead_s`` before then (so it forms from the latest arrivals while
  the round trip to the replica still overlaps the running batch). Without room to pipeline
  (``max_inflight`` 1) it starts once the answers of the one in flight are back.
- Overhead: with ``learn_overhead`` each replica learns two things online from completions
  (``on_complete``'s ``now``), each by stochastic quantile tracking:
  - ``run_excess``: how much longer than its profile a batch runs on the replica itself, the median
    excess of the interval between back-to-back completions (the later batch was already sent
    when the earlier one came back, so the interval is its run time); it may be negative;
  - ``overhead``: the ``overhead_quantile`` of how late answers come back against that plan
    (transit, Triton, the gateway's own loop). It delays the answers of a batch, not the start
    of the next one that already waits at the replica, so it is not added up along a run of
    back-to-back batches.
  Batches that finish exactly as predicted (the simulator without transit) keep both at zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.policy.admission import Lane, predict_finish, pushes_late
from gateway.policy.batching import FIRST, SelectContext, get_policy, select_alike
from gateway.policy.config import SchedulerConfig
from gateway.policy.edf import EdfQueue
from gateway.policy.expiry import best_alone, next_infeasible, next_timeout, timed_out
from gateway.policy.migrate import relocate
from gateway.policy.rate import RateEstimator
from gateway.policy.replica import NeededBatch, cost_per_answer
from gateway.policy.replica import Replica as _Replica
from gateway.policy.selector import (
    Level,
    VariantInfo,
    candidate_order,
    choose,
    describe_constraints,
    fallback_spare,
    infaas_pick,
    next_level,
)
from gateway.policy.sequences import Sequences
from gateway.policy.sequencing import SequenceScheduling
from gateway.policy.types import (
    Batch,
    Decision,
    Objective,
    Priority,
    Reject,
    RejectReason,
    ReplicaInfo,
    ReplicaState,
    Request,
)

_EPS = 1e-6  # a wake-up lands this long after the instant a request turns infeasible


@dataclass
class _Group:
    """One variant of a served model: its EDF queues, its replicas and its admitted rate."""

    variant: str
    rate: RateEstimator
    accuracy: float | None = None
    guaranteed: EdfQueue = field(default_factory=EdfQueue)
    best_effort: EdfQueue = field(default_factory=EdfQueue)
    replicas: list[str] = field(default_factory=list)
    # (fleet version, replicas taking new batches, the same by batch-of-one speed): see _healthy
    taking: tuple[int, list, list] | None = None

    def queue_of(self, r: Request) -> EdfQueue:
        return self.best_effort if r.priority == Priority.BEST_EFFORT else self.guaranteed

    @property
    def queued(self) -> int:
        """Requests waiting in both queues."""
        return len(self.guaranteed) + len(self.best_effort)

    def clear(self) -> list[Request]:
        return self.guaranteed.clear() + self.best_effort.clear()


@dataclass
class _Model:
    name: str
    rate: RateEstimator
    groups: dict[str, _Group] = field(default_factory=dict)
    level: Level = field(default_factory=Level)
    objective: Objective = "accuracy"  # the order allowed variants are tried in (see selector)
    moved: int = 0  # queued requests moved to another variant that could still make their deadline
    downgrades: int = 0  # level moves to cheaper variants under load
    upgrades: int = 0  # and back


class EdfScheduler(SequenceScheduling):
    """Deadline-aware batching core implementing :class:`gateway.policy.types.SchedulerCore`."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.policy = get_policy(self.config.policy)
        self._replicas: dict[str, _Replica] = {}
        self._models: dict[str, _Model] = {}
        self._pending: dict[int, Request] = {}  # admitted and not yet answered
        self._retried: set[int] = set()
        self._sequences = Sequences()
        self._moved = False  # a poll moved a late request to another variant
        # bumped whenever a replica is added, removed, drained or changes health: the groups'
        # lists of replicas taking new batches hold until then
        self._fleet = 0
        self._needed = NeededBatch()

    # ------------------------------------------------------------------ replicas

    def add_replica(self, info: ReplicaInfo, now: float) -> None:
        if info.id in self._replicas:
            raise ValueError(f"replica {info.id!r} already added")
        if info.max_batch < 1 or info.max_inflight < 1:
            raise ValueError(
                f"replica {info.id!r}: max_batch ({info.max_batch}) and max_inflight "
                f"({info.max_inflight}) must be >= 1"
            )
        if info.max_batch > info.profile.max_batch:
            raise ValueError(
                f"replica {info.id!r}: max_batch ({info.max_batch}) exceeds profile max "
                f"({info.profile.max_batch}) for {info.profile.name}"
            )
        q = self.config.quantile
        self._replicas[info.id] = _Replica(info, [0.0] + [info.profile.latency(b, q)
                                                          for b in range(1, info.max_batch + 1)])
        model = self._model(info.model)
        model.objective = info.objective
        if info.variant not in model.groups:
            model.groups[info.variant] = _Group(info.variant, RateEstimator(self.config.rate_window_s),
                                                info.profile.accuracy)
        model.groups[info.variant].replicas.append(info.id)
        self._fleet += 1

    def drain_replica(self, replica_id: str, now: float) -> None:
        """The replica takes no new batch from now on; its batches in flight complete through
        ``on_complete``. When it was its variant's last replica not draining, the variant's
        queued requests move to the model's other variants (see the module docstring)."""
        rep = self._replicas.get(replica_id)
        if rep is None:
            raise KeyError(f"unknown replica {replica_id!r}")
        rep.draining = True
        self._fleet += 1
        model = self._models[rep.info.model]
        self._drained(model, model.groups[rep.info.variant], now)

    def remove_replica(self, replica_id: str, now: float) -> tuple[Request, ...]:
        """Forget a replica. Returns the requests the driver now owns and must answer: those
        in flight on it, and, when it was its variant's last replica, the variant's queued
        requests that no other variant of the model takes (the rest move there)."""
        rep = self._replicas.pop(replica_id, None)
        if rep is None:
            return ()
        model = self._models[rep.info.model]
        group = model.groups[rep.info.variant]
        group.replicas.remove(replica_id)
        self._fleet += 1
        out = [r for b in rep.inflight for r in b.requests]
        out += self._sequences.drop_replica(replica_id)
        if not group.replicas:
            del model.groups[rep.info.variant]
            out += self._evacuate(model, group, now)
        for r in out:
            self._forget(r)
        return tuple(out)

    def set_healthy(self, replica_id: str, healthy: bool, now: float) -> None:
        rep = self._replicas.get(replica_id)
        if rep is None:
            raise KeyError(f"unknown replica {replica_id!r}")
        rep.healthy = healthy
        self._fleet += 1

    def replicas(self) -> tuple[ReplicaState, ...]:
        return tuple(ReplicaState(r.info, r.healthy, tuple(r.inflight), r.overhead, r.run_excess,
                                  r.draining) for r in self._replicas.values())

    # ------------------------------------------------------------------ requests

    def submit(self, request: Request, now: float) -> Reject | None:
        if request.id in self._pending:
            raise ValueError(f"request id {request.id} is already pending")
        model = self._model(request.model)
        model.rate.observe(now, request.size)
        allowed = request.replicas
        live = {v: h for v, g in model.groups.items()
                if (h := self._healthy(g) if allowed is None else
                    [x for x in self._healthy(g) if x.info.id in allowed])}
        if not live:
            which = "" if allowed is None else f" (of replicas {sorted(allowed)})"
            return self._reject(request, RejectReason.NO_REPLICA, self.config.no_replica_retry_after_s,
                                f"no healthy replica serves model {request.model!r}{which}")
        if request.sequence is not None:
            return self._submit_in_sequence(model, request, live, now)
        if len(live) == 1 and request.accuracy_floor is None and request.max_cost is None and request.variant is None:
            order = list(live)
        else:
            infos = self._variant_infos(model, live)
            level = next_level(model.level, infos, model.rate.rate(now), now,
                               window=self.config.rate_window_s, dwell=self.config.variant_dwell_s)
            if level.skip != model.level.skip:
                if level.skip > model.level.skip:
                    model.downgrades += 1
                else:
                    model.upgrades += 1
            model.level = level
            order = self._order(model, infos, request)
        if not order:
            return self._reject(request, RejectReason.INFEASIBLE, self.config.no_replica_retry_after_s,
                                f"no variant of model {request.model!r} meets {describe_constraints(request)}")
        # every replica takes a batch of one row (max_batch >= 1)
        fits = order if request.size == 1 else [
            v for v in order if request.size <= max(r.info.max_batch for r in live[v])]
        if not fits:
            return self._reject(
                request, RejectReason.INFEASIBLE, self.config.min_retry_after_s,
                f"request rows ({request.size}) exceed the largest max batch of model {request.model!r}")
        best_effort = request.priority == Priority.BEST_EFFORT
        choice = fits[0]

        def alone(v: str) -> float:
            return min(r.latency(request.size) for r in live[v] if r.info.max_batch >= request.size)
        if model.objective == "infaas":  # the INFaaS baseline: no admission by prediction
            pick = infaas_pick(fits, alone, lambda v: model.groups[v].rate.rate(now),
                               lambda v: self._capacity(live[v]), request.deadline - request.arrival)
            if pick is None:
                return self._reject(request, RejectReason.INFEASIBLE, self.config.min_retry_after_s,
                                    f"no variant of model {request.model!r} is profiled to meet the SLO")
            choice = pick
        elif self.policy.deadline_aware:
            def plan(v: str) -> tuple[float, bool]:
                f = self._plan(model.groups[v], live[v], request, now)
                return f, f <= request.deadline and self._protects(model, model.groups[v], live[v], request, now)
            spare = fallback_spare(fits, alone, objective=model.objective, cheapest=best_effort)
            pick, finish = choose(fits, plan, request.deadline, spare)
            if pick is None:
                reason = RejectReason.SHED if best_effort else RejectReason.INFEASIBLE
                return self._reject(
                    request, reason, max(self.config.min_retry_after_s, finish - request.deadline),
                    f"predicted finish {(finish - now) * 1e3:.1f} ms from now is past the deadline "
                    f"{(request.deadline - now) * 1e3:.1f} ms from now")
            choice = pick
        group = model.groups[choice]
        group.rate.observe(now, request.size)
        group.queue_of(request).push(request)
        self._pending[request.id] = request
        return None

    def on_complete(self, batch: Batch, now: float, retry: tuple[Request, ...] = ()) -> None:
        """A dispatched batch finished. Requests in ``retry`` go back to their variant's queue
        (answered "failed" if no replica can still finish them in time); the rest are done."""
        rep = self._replicas.get(batch.replica)
        if rep is not None:
            if self.policy.learns and not retry:  # a batch's measured latency against its tightest SLO
                self.policy.observe(batch.replica, batch.rows, rep.ran(batch, now),
                                    min(r.deadline - r.arrival for r in batch.requests), rep.info.max_batch)
            rep.back = now
            rep.remove(batch)
            if retry:
                rep.last_done = None  # a failed batch says nothing about run times
            elif self.config.learn_overhead:
                rep.learn(batch, now, self.config)
            rep.reanchor(now)
        retry_ids = {r.id for r in retry}
        model = group = None
        for r in batch.requests:
            if r.sequence is not None:
                self._sequences.done(r)
            if r.id not in self._pending:
                continue  # already handed back by remove_replica
            if r.sequence is not None and r.id in retry_ids:
                self._sequences.retry(batch.replica, r)  # its state is on that replica alone
                self._retried.add(r.id)
                continue
            model = self._models.get(r.model)
            group = model.groups.get(batch.variant) if model else None
            if group is None and model and model.groups:
                group = next(iter(model.groups.values()))
            if r.id in retry_ids and group is not None:
                group.queue_of(r).push(r)
                self._retried.add(r.id)
            else:
                self._forget(r)
        if retry and model is not None and group is not None:
            self._drained(model, group, now)  # a draining variant's retries move on

    def cancel(self, request_id: int, now: float) -> bool:
        """The client gave up on a request: a queued one leaves its queue and is forgotten
        (True; the driver answers it). One in flight (or unknown) stays as it is (False): its
        batch runs, and the driver drops its answer."""
        r = self._pending.get(request_id)
        model = self._models.get(r.model) if r is not None else None
        if r is None or model is None:
            return False
        if r.sequence is not None:
            if self._sequences.cancel(r):
                self._forget(r)
                return True
            return False
        for group in model.groups.values():
            if group.queue_of(r).remove(r):
                self._forget(r)
                return True
        return False

    def poll(self, now: float) -> Decision:
        batches: list[Batch] = []
        rejects: list[Reject] = []
        wake = float("inf")
        if self._sequences.queued:
            self._poll_sequences(now, batches, rejects)
        for model in self._models.values():
            for group in model.groups.values():
                _, healthy, by_speed = self._taking(group)
                if not healthy:
                    for r in group.clear():
                        rejects.append(self._reject(
                            r, RejectReason.NO_REPLICA, self.config.no_replica_retry_after_s,
                            f"no healthy replica serves variant {group.variant!r} of model {r.model!r}"))
                    continue
                if not group.queued:
                    continue  # nothing to dispatch, expire or wake up for (the common case)
                rejects += self._expire(group, healthy, now, model)
                sent = len(batches)
                for rep in by_speed:
                    while rep.has_slot() and group.queued:
                        if rep.inflight:  # pipelined: form the next batch just before it can start
                            ready_at = rep.start(now) - self.config.pipeline_lead_s
                            if now < ready_at:
                                wake = min(wake, ready_at)
                                break
                        batch, w = self._select(group, rep, healthy, now)
                        if w is not None:
                            wake = min(wake, w)
                        if batch is None:
                            break
                        rep.dispatch(batch)
                        batches.append(batch)
                if group.queued:
                    if len(batches) > sent:  # NOTE: unchanged queues and replicas expire nothing new
                        rejects += self._expire(group, healthy, now, model)
                    wake = min(wake, self._next_expiry(group, healthy, now))
        if self._moved:  # a request moved to a variant this poll had passed: look again now
            self._moved = False
            wake = now
        return Decision(tuple(batches), tuple(rejects), wake if wake < float("inf") else None)

    def queued(self, model: str | None = None) -> int:
        """Requests waiting in queues (of one model, or all)."""
        ms = [self._models[model]] if model in self._models else [] if model else self._models.values()
        waiting = self._sequences.queued if model is None else sum(
            1 for rid in self._sequences.replicas_waited_on() for r in self._sequences.waiting(rid)
            if r.model == model)
        return sum(g.queued for m in ms for g in m.groups.values()) + waiting

    @property
    def pending(self) -> int:
        """Requests admitted and not yet answered (queued or in flight)."""
        return len(self._pending)

    def level(self, model: str) -> int:
        """How many of the model's most accurate variants overload currently skips first."""
        return self._models[model].level.skip if model in self._models else 0

    def variant_moves(self, model: str) -> tuple[int, int, int]:
        """(downgrades, upgrades, late requests moved to another variant) of ``model`` so far."""
        m = self._models.get(model)
        return (m.downgrades, m.upgrades, m.moved) if m else (0, 0, 0)

    # ------------------------------------------------------------------ internals

    def _model(self, name: str) -> _Model:
        if name not in self._models:
            self._models[name] = _Model(name, RateEstimator(self.config.rate_window_s))
        return self._models[name]

    def _healthy(self, group: _Group) -> list[_Replica]:
        """The group's replicas that take new batches: healthy and not draining (in the group's
        order; the list is shared until the fleet changes, so callers never modify it)."""
        return self._taking(group)[1]

    def _taking(self, group: _Group) -> tuple[int, list[_Replica], list[_Replica]]:
        """(fleet version, :meth:`_healthy`, the same fastest batch of one first, ties in the
        group's order)."""
        cached = group.taking
        if cached is None or cached[0] != self._fleet:
            healthy = [r for i in group.replicas if (r := self._replicas[i]).healthy and not r.draining]
            cached = group.taking = (self._fleet, healthy, sorted(healthy, key=lambda r: r.base[1]))
        return cached

    def _drained(self, model: _Model, group: _Group, now: float) -> None:
        """When no replica of ``group`` takes new batches (each drains, or is unhealthy after a
        failed or hedged batch), its queued requests move to other variants; those no variant
        takes stay, for the next poll to answer ("no_replica")."""
        if group.queued and not self._healthy(group):
            for r in self._evacuate(model, group, now):
                group.queue_of(r).push(r)

    def _evacuate(self, model: _Model, group: _Group, now: float) -> list[Request]:
        """Move ``group``'s queued requests (guaranteed, then best-effort, each in EDF order) to
        the model's other variants with a replica not draining (an unhealthy one plans as never
        finishing); return, out of every queue, those no variant takes."""
        staying = {v: reps for v, g in model.groups.items()
                   if g is not group and (reps := [self._replicas[i] for i in g.replicas
                                                   if not self._replicas[i].draining])}
        live = {v: [x for x in reps if x.healthy] for v, reps in staying.items()}
        return relocate(
            group.clear(), self._variant_infos(model, live), model.level,
            fits=lambda v, r: r.size <= max(x.info.max_batch for x in staying[v]) and (
                r.replicas is None or any(x.info.id in r.replicas for x in staying[v])),
            plan=(lambda v, r: self._plan(model.groups[v], live[v], r, now)) if self.policy.deadline_aware else None,
            push=lambda v, r: model.groups[v].queue_of(r).push(r), objective=model.objective)

    def _capacity(self, reps: list[_Replica]) -> float:
        total = 0.0  # NOTE: a loop, not sum() over a generator: on every admission in burst mode
        for r in reps:
            top = r.info.max_batch
            total += top / r.latency(top)
        return total

    def _variant_infos(self, model: _Model, live: dict[str, list[_Replica]]) -> list[VariantInfo]:
        return [VariantInfo(v, model.groups[v].accuracy, self._capacity(reps), cost_per_answer(reps))
                for v, reps in live.items()]

    def _order(self, model: _Model, infos: list[VariantInfo], request: Request) -> list[str]:
        return candidate_order(infos, request.accuracy_floor, model.level, objective=model.objective,
                               max_cost=request.max_cost, pin=request.variant,
                               cheapest=request.priority == Priority.BEST_EFFORT)

    def _protects(self, model: _Model, group: _Group, healthy: list[_Replica], request: Request,
                  now: float) -> bool:
        """With ``admission="protect"`` (or ``"burst"`` during a burst): admitting ``request``
        pushes no queued guaranteed request that the plan finishes in time past its deadline."""
        mode = self.config.admission
        if mode not in ("protect", "burst") or request.priority == Priority.BEST_EFFORT:
            return True
        if mode == "burst":
            recent = model.rate.recent(now, self.config.burst_window_s)
            if recent <= self.config.burst_factor * self._capacity(healthy):
                return True  # steady load: admission as by "plan"
        queue = group.guaranteed
        if not len(queue):
            return True
        return not pushes_late(self._lanes(healthy, now), queue, queue.index_after(request.deadline),
                               request.size, queue.rows == len(queue))

    def _plan(self, group: _Group, healthy: list[_Replica], request: Request, now: float) -> float:
        """Admission prediction of the request's finish if it joins ``group``."""
        ahead = group.guaranteed.rows_before(request.deadline)
        if request.priority == Priority.BEST_EFFORT:
            ahead = group.guaranteed.rows + group.best_effort.rows_before(request.deadline)
        if self.config.admission == "alone":
            ahead = 0
        return predict_finish(self._lanes(healthy, now), ahead, request.size)

    def _lanes(self, reps: list[_Replica], now: float) -> list[Lane]:
        return [Lane(r.start(now), r.latency, r.info.max_batch) for r in reps]

    def _forget(self, r: Request) -> None:
        self._pending.pop(r.id, None)
        self._retried.discard(r.id)

    def _reject(self, r: Request, reason: RejectReason, retry_after: float, message: str) -> Reject:
        self._forget(r)
        return Reject(r, reason, retry_after, message)

    def _select(self, group: _Group, rep: _Replica, healthy: list[_Replica],
                now: float) -> tuple[Batch | None, float | None]:
        rate = group.rate.rate(now)
        ctx = SelectContext(
            now=now, start=rep.start(now), latency=rep.latency, max_batch=rep.info.max_batch,
            needed_batch=self._needed(healthy, rate * (1.0 + self.config.headroom)), rate=rate, wait=self.config.wait,
            max_queue_delay=self.config.max_queue_delay_s, replica=rep.info.id,
        )
        chosen: list[Request] = []
        wake = None
        if len(group.guaranteed):
            sel = select_alike(self.policy, group.guaranteed, rep.info.id, ctx)
            wake = sel.wakeup
            chosen = group.guaranteed.remove_indices(sel.take)
            if not chosen or len(group.guaranteed):
                return self._batch(rep, chosen, now, ctx.start), wake
        # only capacity guaranteed traffic leaves: nothing guaranteed remains queued
        if len(group.best_effort):
            used = sum(r.size for r in chosen)
            room = rep.info.max_batch - used
            limit = min((r.deadline for r in chosen), default=float("inf"))
            lat = ctx.latency
            be_ctx = SelectContext(
                now=now, start=ctx.start, max_batch=room, needed_batch=max(1, ctx.needed_batch - len(chosen)),
                rate=rate, wait=self.config.wait and not chosen, max_queue_delay=ctx.max_queue_delay,
                latency=(lambda rows: lat(rows + used)), replica=rep.info.id, used=used,
            )
            if room > 0:
                sel = select_alike(self.policy, group.best_effort, rep.info.id, be_ctx,
                                    chosen[0].key if chosen else FIRST)
                extra_rows = sum(group.best_effort[i].size for i in sel.take)
                if sel.take and ctx.start + lat(used + extra_rows) <= limit:
                    chosen += group.best_effort.remove_indices(sel.take)
                elif not chosen and sel.wakeup is not None:
                    wake = sel.wakeup if wake is None else min(wake, sel.wakeup)
        return self._batch(rep, chosen, now, ctx.start), wake

    def _batch(self, rep: _Replica, chosen: list[Request], now: float, start: float) -> Batch | None:
        if not chosen:
            return None
        rows = sum(r.size for r in chosen)
        finish = start + rep.latency(rows)
        return Batch(rep.info.id, rep.info.variant, tuple(chosen), now, finish)

    def _expire(self, group: _Group, healthy: list[_Replica], now: float, model: _Model) -> list[Reject]:
        out: list[Reject] = []
        if not self.policy.deadline_aware:
            cfg = self.config
            if cfg.queue_timeout_s is not None or cfg.request_timeouts:
                for q in (group.guaranteed, group.best_effort):
                    for r in q.remove_indices(timed_out(q, now, cfg.queue_timeout_s, cfg.request_timeouts)):
                        out.append(self._reject(r, RejectReason.EXPIRED, cfg.min_retry_after_s,
                                                "queued past its timeout"))
            return out
        finish = None
        for q, be in ((group.guaranteed, False), (group.best_effort, True)):
            if not len(q):
                continue
            if finish is None:
                # NOTE: the common case (the head can still finish alone) looks no further
                size, bound = q.max_size, float("inf")  # later deadlines than bound are surely feasible
                for rep in healthy:
                    if rep.info.max_batch >= size:
                        t = rep.start(now) + rep.latency(size)
                        if t < bound:
                            bound = t
                if q[0].deadline >= bound:
                    continue
                finish = best_alone(healthy, now)
            bound = finish(q.max_size)
            if q[0].deadline >= bound:
                continue
            gone = []
            for i, r in enumerate(q):
                if r.deadline >= bound:
                    break
                if finish(r.size) > r.deadline:
                    gone.append(i)
            for r in self._move_late(model, group, q.remove_indices(gone), now):
                reason = (RejectReason.SHED if be else
                          RejectReason.FAILED if r.id in self._retried else RejectReason.EXPIRED)
                out.append(self._reject(
                    r, reason, self.config.min_retry_after_s,
                    f"no replica can finish it by its deadline ({(r.deadline - now) * 1e3:.1f} ms from now)"))
        return out

    def _move_late(self, model: _Model, group: _Group, late: list[Request], now: float) -> list[Request]:
        """Requests ``group`` can no longer finish in time move to another allowed variant
        predicted to finish them in time (the order of the model's objective); the rest are
        returned, to be refused."""
        if not late or len(model.groups) < 2 or model.objective == "infaas":  # INFaaS moves none
            return late
        live = {v: h for v, g in model.groups.items() if g is not group and (h := self._healthy(g))}
        infos = self._variant_infos(model, live)
        left = []
        for r in late:
            ok = [x for x in live if r.replicas is None or any(y.info.id in r.replicas for y in live[x])]
            order = [v for v in self._order(model, [i for i in infos if i.name in ok], r)
                     if r.size <= max(y.info.max_batch for y in live[v])]
            dest = next((v for v in order if self._plan(model.groups[v], live[v], r, now) <= r.deadline), None)
            if dest is None:
                left.append(r)
                continue
            model.groups[dest].queue_of(r).push(r)
            model.moved += 1
            self._moved = True
        return left

    def _next_expiry(self, group: _Group, healthy: list[_Replica], now: float) -> float:
        """Earliest time a queued request turns infeasible if nothing else happens."""
        if not self.policy.deadline_aware:
            return next_timeout((group.guaranteed, group.best_effort), self.config.queue_timeout_s,
                                self.config.request_timeouts, _EPS)
        return next_infeasible((group.guaranteed, group.best_effort), healthy, now, _EPS)
