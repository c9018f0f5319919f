"""The asyncio driver around the sans-IO policy core: admits requests, sends the core's batches
to replicas, answers its rejects; the replicas it serves, their clients and health are its
:class:`gateway.fleet.Fleet`.

On every event (a request arrives, a batch completes, a probe flips a replica, the armed
timer fires) the driver calls ``core.poll(now)`` and acts on the :class:`Decision`: it sends
each batch to its replica, answers each reject at once and arms a single timer at
``Decision.wakeup``. Time comes from the injected ``clock`` (default ``time.monotonic``).

Invariant: every admitted request's future is resolved exactly once: with its outputs, with
a reject from the core, or with a definite error (failed batch, its deadline passed with its
batch unanswered, replica removed with its batch in flight, model no longer served, shutdown).

Each batch sent is watched (:mod:`gateway.hedge`): each member is answered by its own deadline,
and a batch its replica leaves unanswered well past its prediction is hedged to another replica
(the first answer wins, the replica is suspect until it answers).

What it holds is bounded (:mod:`gateway.queue_bounds`): a request is charged to its client
when admitted and released when it leaves ``_pending`` (:meth:`Driver._drop`), whichever way
it leaves: answered, failed, rejected, cancelled, or removed with its replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from gateway.batchcall import send_batch
from gateway.codec import InferInput, Tensor, validate
from gateway.coldstart import ColdStart
from gateway.config import ServedModel, ServedReplica
from gateway.contract import (  # noqa: F401  (SLO_HEADER: the front doors read it from here)
    SLO_HEADER,
    Forward,
    choice_of,
    deadline_of,
    forward_of,
    priority_of,
    sequence_of,
)
from gateway.errors import (
    BackendError,
    GatewayError,
    InvalidRequest,
    Rejected,
    Unavailable,
    rejection,
)
from gateway.fleet import Fleet, Model, Removal, Replica
from gateway.frontdoor.stats import Statistics
from gateway.hedge import Flight, Hedging
from gateway.observe.metrics import GatewayMetrics
from gateway.policy.types import Batch, Priority, Request, SchedulerCore
from gateway.queue_bounds import QueueBounds
from profiles.schema import LimitsSpec

log = logging.getLogger("headrace.gateway")

VARIANT_PARAM = "headrace_variant"  # response parameters: who served the request
REPLICA_PARAM = "headrace_replica"  # only with expose_replicas: the id of the replica that served


@dataclass(slots=True)
class InferResult:
    outputs: list[Tensor]
    variant: str
    replica: str
    met_deadline: bool
    expose_replica: bool = False  # the driver's expose_replicas setting
    queue_s: float = 0.0  # seconds from arrival until its batch was sent
    compute_s: float = 0.0  # seconds its batch took at the replica (sent to answered)

    def parameters(self) -> dict[str, str]:
        """Response parameters telling the client which variant served it, and which replica
        (it names a backend's address) only with ``expose_replica``."""
        if self.expose_replica:
            return {VARIANT_PARAM: self.variant, REPLICA_PARAM: self.replica}
        return {VARIANT_PARAM: self.variant}


@dataclass(slots=True)
class _Pending:
    request: Request
    input: InferInput
    future: asyncio.Future
    forward: Forward | None = None  # what goes to Triton besides the tensors (its batch key)
    flight: Flight | None = None  # once sent: its (latest) batch in flight
    hedged_from: Flight | None = None  # once hedged: the batch it was sent in first, also waited on
    requeued: bool = False  # hedged, and the core may still hold it queued for another replica
    trace: Any = None  # its spans (gateway.observe.tracing.RequestTrace) when tracing is on
    client: str | None = None  # whom its queue bounds charge (tenant or address; None: only the totals)
    nbytes: int = 0  # its input bytes, as charged


class Driver(Hedging):
    """Feeds requests to the core, sends its batches, answers its rejects; its ``fleet`` (the
    replicas it serves) may change while serving."""

    def __init__(
        self,
        models: list[ServedModel],
        core: SchedulerCore,
        *,
        clock: Callable[[], float] = time.monotonic,
        metrics: GatewayMetrics | None = None,
        health_interval: float = 0.5,
        max_message_bytes: int = 64 << 20,
        replica_factory: Callable[[str, str], Any] | None = None,
        expose_replicas: bool = False,
        limits: LimitsSpec | None = None,
    ) -> None:
        self.core = core
        self.bounds = QueueBounds.of(limits)  # requests admitted and not yet answered, by client
        self.expose_replicas = expose_replicas  # answers name their replica (headrace_replica)
        self._queued = core.queued  # bound once: read on every arrival and completion
        self.clock = clock
        self.metrics = metrics or GatewayMetrics()
        self.stats = Statistics()  # Triton-shaped statistics (the front doors' ServerInfo reads them)
        self.fleet = Fleet(models, core, clock=clock, metrics=self.metrics, poll=self._poll,
                           health_interval=health_interval, max_message_bytes=max_message_bytes,
                           replica_factory=replica_factory)
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._poll_scheduled = False
        self._tasks: set[asyncio.Task] = set()
        self._health_task: asyncio.Task | None = None
        self._lag_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.draining = False
        self.hedges = 0  # batches hedged to another replica (gateway.hedge)
        self.tracing: Any = None  # gateway.observe.tracing.Tracing when tracing is on: batch spans
        self.cold: ColdStart | None = None  # set by an operator that scales models to zero

    # ------------------------------------------------------------------ lifecycle

    async def start(self, startup_timeout: float = 30.0) -> None:
        """Start the fleet (:meth:`Fleet.start`: each replica's metadata and signature, its
        registration with the core), then probe the replicas' health from now on."""
        self._loop = asyncio.get_running_loop()
        await self.fleet.start(startup_timeout)
        self._health_task = asyncio.create_task(self.fleet.health_loop())
        self._lag_task = asyncio.create_task(self._lag_loop())

    @property
    def replicas(self) -> dict[str, Replica]:
        """The replicas served now, by id (the fleet's)."""
        return self.fleet.replicas

    def model(self, name: str, version: str = "") -> Model:
        """The served model ``name`` at ``version`` (:meth:`Fleet.model`)."""
        return self.fleet.model(name, version)

    async def add_replica(self, model: ServedModel, replica: ServedReplica) -> None:
        """Serve ``replica`` of ``model`` from now on (:meth:`Fleet.add_replica`)."""
        await self.fleet.add_replica(model, replica)
        if self.cold is not None:
            self.cold.ready(model.name)

    async def remove_replica(self, replica_id: str, timeout: float = 30.0, keep_model: bool = False) -> bool:
        """Drain the replica, wait up to ``timeout`` real seconds until nothing is in flight on
        it, then remove it (:meth:`Fleet.remove_replica`). True when it drained in time;
        otherwise it is removed anyway and its requests in flight fail (Unavailable). Requests
        the core hands back are submitted again; when the model has no replica left it is no
        longer served and they are answered Unavailable, unless ``keep_model``: then the model
        stays addressable with no replica (its requests are refused ``no_replica`` until one
        is added, as while every replica is down). KeyError for a replica not served."""
        out = await self.fleet.remove_replica(replica_id, timeout, keep_model)
        self._answer_handed_back(out)
        rep = out.replica
        log.info("replica %s of model '%s' removed (%s)", replica_id, rep.model,
                 "drained" if out.drained else f"not drained within {timeout:g} s")
        self._poll()
        await self.fleet.release(rep)
        return out.drained

    def _answer_handed_back(self, out: Removal) -> None:
        """Submit again what the core handed back, or answer it: in flight on the removed
        replica, or of a model no longer served (then nothing of it may stay pending)."""
        model, now = out.replica.model, out.at
        for r in out.back:
            p = self._pending.get(r.id)
            if p is None:
                continue
            if (f := p.hedged_from) is not None and f.open and f.replica is not out.replica:
                p.requeued = False  # its first replica may still answer it
                continue
            if r.id in out.in_flight:
                self._fail(p, Unavailable(f"replica {out.replica.id} was removed with the request in flight"))
            elif out.model_gone:
                self._fail(p, Unavailable(f"model '{model}' is no longer served"))
            elif (rj := self.core.submit(r, now)) is not None:
                self._drop(r.id)
                self.metrics.of(self.metrics.rejections, r.model, rj.reason).inc()
                if not p.future.done():
                    p.future.set_exception(rejection(rj.message, rj.reason, rj.retry_after))
        if out.model_gone:  # nothing should be left; never strand a future
            for p in [p for p in self._pending.values() if p.request.model == model]:
                self._fail(p, Unavailable(f"model '{model}' is no longer served"))

    async def drain(self, timeout: float) -> bool:
        """Refuse new requests and wait for admitted ones; True when none is left."""
        self.draining = True
        loop = asyncio.get_running_loop()  # real time: the injected clock may be virtual
        end = loop.time() + timeout
        while self._pending and loop.time() < end:
            await asyncio.sleep(0.01)
        return not self._pending

    async def stop(self) -> None:
        self.draining = True
        for task in (self._health_task, self._lag_task):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._timer:
            self._timer.cancel()
        for p in list(self._pending.values()):
            if not p.future.done():
                p.future.set_exception(Unavailable("gateway is shutting down"))
            self._drop(p.request.id)
        for t in list(self._tasks):
            t.cancel()
        await self.fleet.close()

    def _drop(self, request_id: int) -> _Pending | None:
        """``request_id`` leaves ``_pending`` (if there): what it held is free again."""
        p = self._pending.pop(request_id, None)
        if p is not None:
            self.bounds.release(p.client, p.nbytes)
        return p

    def _fail(self, p: _Pending, err: GatewayError) -> None:
        self._drop(p.request.id)
        self.metrics.of(self.metrics.failures, p.request.model).inc()
        self.stats.answered(p.request.model, _version([p]), "", False, self.clock() - p.request.arrival)
        if not p.future.done():
            p.future.set_exception(err)

    # ------------------------------------------------------------------ requests

    def render_metrics(self) -> bytes:
        """The Prometheus text; each replica's batches in flight and what the scheduler has
        learned of it are read from the core now (off the request path)."""
        m = self.metrics
        for st in self.core.replicas():
            m.of(m.inflight, st.info.model, st.info.id).set(len(st.inflight))
            m.of(m.overhead, st.info.model, st.info.id).set(st.overhead)
            m.of(m.run_excess, st.info.model, st.info.id).set(st.run_excess)
        for name in self.fleet.models:
            m.of(m.level, name).set(self.core.level(name))
            for kind, n in zip(("down", "up", "late"), self.core.variant_moves(name), strict=True):
                m.of(m.variant_moves, name, kind).set(n)
        return m.render()

    def ready(self) -> bool:
        return self.fleet.started and not self.draining and any(r.healthy for r in self.fleet.replicas.values())

    def model_ready(self, name: str) -> bool:
        return self.fleet.started and not self.draining and any(
            r.healthy for r in self.fleet.replicas.values() if r.model == name
        )

    async def _lag_loop(self, period: float = 0.05) -> None:
        """How late the event loop wakes a sleeper (the loop-lag histogram)."""
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(period)
            self.metrics.loop_lag.observe(max(0.0, loop.time() - t - period))

    async def infer(self, name: str, inp: InferInput, slo_header: str | None = None,
                    received: float | None = None, *, version: str = "", deadline: float | None = None,
                    priority: Priority | None = None, trace: Any = None,
                    hints: dict[str, str] | None = None, client: str | None = None) -> InferResult:
        """Admit, queue and run one request; raises a :class:`GatewayError` when it cannot."""
        return await self.submit(name, inp, slo_header, received, version=version, deadline=deadline,
                                 priority=priority, trace=trace, hints=hints, client=client)

    def submit(self, name: str, inp: InferInput, slo_header: str | None = None,
               received: float | None = None, *, version: str = "", deadline: float | None = None,
               priority: Priority | None = None, trace: Any = None,
               hints: dict[str, str] | None = None, client: str | None = None) -> asyncio.Future[InferResult]:
        """Admit and queue one request, without awaiting: a refusal raises here and now
        (:class:`GatewayError`), else the future answers it. ``received`` is when the front
        door read it (default: now); its deadline counts from then, so time spent waiting to
        be parsed is not given away.

        ``version``: the model version the client named ("" = the model's default; unknown:
        :class:`ModelNotFound`). ``deadline``: seconds the client itself still waits (a gRPC
        call's deadline), which caps the request's budget. ``priority``: the class the
        caller's tenant imposes, overriding the request's own ``priority`` parameter. ``trace``:
        its spans (:class:`gateway.observe.tracing.RequestTrace`), ended by its batch's spans. ``hints``:
        variant constraints from headers (:func:`gateway.contract.choice_headers`); request
        parameters win over them. ``client``: whom the queue bounds charge it to (its tenant,
        else its address; None: the totals only); past a bound, :class:`Rejected` (``queue_full``)."""
        fleet = self.fleet
        m = fleet.model(name, version)
        if self.draining:
            raise Unavailable("gateway is draining")
        if self.cold is not None and not m.served.replicas and self.cold.holds(name):  # scaled to zero
            return self._loop.create_task(self._after_cold(  # type: ignore[union-attr]
                name, inp, slo_header, version=version, deadline=deadline, priority=priority, trace=trace,
                hints=hints, client=client))
        if m.info is None and m.served.replicas:
            raise Unavailable(f"model '{name}' is not ready")
        fwd = seq = choice = None
        try:
            # no signature: a model no replica has served yet, which the core refuses (no_replica)
            if m.info is None:
                rows = 1
            elif inp.checked is m.info.signature:  # checked as it was decoded (the front doors)
                rows = inp.rows
            else:
                rows = validate(m.info.signature, name, inp)
            if m.info is not None and (inp.parameters or inp.outputs or version):
                fwd = forward_of(inp, version, m.info.signature)
                seq = sequence_of(inp)
            if inp.parameters or hints:
                choice = choice_of(inp.parameters, hints)
                if choice is not None and choice.variant is not None:
                    fleet.check_variant(name, choice.variant)
        except InvalidRequest:
            self.stats.answered(name, version, "", False, 0.0)
            raise
        now = self.clock()
        arrival = now if received is None else min(received, now)
        served = m.served
        req = Request(
            next(self._ids), name, arrival,
            deadline_of(inp, slo_header, served.slo, arrival, served.margin, client_deadline=deadline),
            priority if priority is not None else priority_of(inp, served.priority), rows,
            key=fwd, replicas=fleet.replicas_serving(name, version) if version else None,
        )
        if choice is not None:
            req = replace(req, accuracy_floor=choice.accuracy_floor, max_cost=choice.max_cost,
                          variant=choice.variant)
        if seq is not None:
            req = replace(req, sequence=seq.id, sequence_start=seq.start, sequence_end=seq.end)
        nbytes = 0
        for t in inp.inputs:
            nbytes += len(t.raw)
        try:
            self.bounds.admit(client, nbytes)
            reject = self.core.submit(req, now)
            if reject is not None:
                self.bounds.release(client, nbytes)
                raise rejection(reject.message, reject.reason, reject.retry_after)
        except Rejected as e:
            self.metrics.of(self.metrics.rejections, name, e.reason).inc()
            self.stats.answered(name, version, "", False, now - arrival)
            self.metrics.of(self.metrics.refusal_wait, name).observe(now - arrival)
            raise
        fut = self._loop.create_future()  # type: ignore[union-attr]
        self._pending[req.id] = _Pending(req, inp, fut, fwd, trace=trace, client=client, nbytes=nbytes)
        if trace is not None:
            trace.admitted()  # its queue span starts before a poll can send it
        fut.add_done_callback(partial(self._gone, req.id))
        if not self._poll_scheduled and self._queued() == 1:
            self._poll()  # a lone arrival: dispatch it now rather than one loop turn later
        else:
            self._poll_soon()
        return fut

    async def _after_cold(self, name: str, inp: InferInput, slo_header: str | None, *,
                          deadline: float | None, **kw: Any) -> InferResult:
        """A request for a model with no replica: admitted once the first one serves
        (:class:`gateway.coldstart.ColdStart`), its SLO counted from then; a client deadline
        still counts the wait."""
        assert self.cold is not None
        waited = await self.cold.wait(name)
        left = None if deadline is None else deadline - waited
        return await self.submit(name, inp, slo_header, None, deadline=left, **kw)

    def _gone(self, request_id: int, fut: asyncio.Future) -> None:
        """A future cancelled by its waiter (a gRPC call the client cancelled, an HTTP client
        gone): a queued request leaves the core and is never sent; one in flight runs on and
        its answer is dropped."""
        if not fut.cancelled():
            return
        if self.core.cancel(request_id, self.clock()):
            p = self._drop(request_id)
            if p is not None:
                self.metrics.of(self.metrics.cancelled, p.request.model).inc()
                self._release(p.hedged_from)
            return
        p = self._pending.get(request_id)
        if p is not None:  # nobody waits for its batch any more: the call to Triton is cancelled
            self._release(p.flight)
            self._release(p.hedged_from)

    # ------------------------------------------------------------------ the loop

    def _poll_soon(self) -> None:
        """One poll per loop iteration for all the arrivals it brings: under load the core is
        polled less often per request instead of the loop falling behind."""
        if not self._poll_scheduled:
            self._poll_scheduled = True
            self._loop.call_soon(self._scheduled_poll)  # type: ignore[union-attr]

    def _scheduled_poll(self) -> None:
        self._poll_scheduled = False
        self._poll()

    def _poll(self) -> None:
        now = self.clock()
        try:
            d = self.core.poll(now)
        except Exception:  # the core must never strand requests: fail them all loudly
            log.exception("policy core failed in poll")
            self._fail_all(Unavailable("gateway scheduler error"))
            return
        for rj in d.rejects:
            p = self._pending.get(rj.request.id)
            if p is None:
                continue
            if (f := p.hedged_from) is not None and f.open:
                p.requeued = False  # no other replica can make its deadline: it stays where it is
                continue
            self._drop(rj.request.id)
            self.metrics.of(self.metrics.rejections, rj.request.model, rj.reason).inc()
            self.stats.answered(rj.request.model, _version([p]), "", False, now - rj.request.arrival)
            if not p.future.done():
                p.future.set_exception(rejection(rj.message, rj.reason, rj.retry_after))
        for b in d.batches:
            self._dispatch(b)
        self._arm(d.wakeup, now)

    def _arm(self, wakeup: float | None, now: float) -> None:
        if wakeup == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = wakeup
        if wakeup is not None:
            self._timer = self._loop.call_later(max(0.0, wakeup - now), self._on_timer)  # type: ignore[union-attr]

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._poll()

    def _fail_all(self, err: GatewayError) -> None:
        for p in list(self._pending.values()):
            if not p.future.done():
                p.future.set_exception(err)
            self._drop(p.request.id)

    def _dispatch(self, b: Batch) -> None:
        """Send ``b`` now and leave the wait for its answer to a task: a replica client whose
        ``infer`` writes at call time (HTTP on a pooled connection) has the batch on its way
        before the task's first loop turn. Its watch (:meth:`_watch`) is armed."""
        rep = self.fleet.replicas[b.replica]
        live = [p for r in b.requests if (p := self._pending.get(r.id)) is not None]
        sent = self.clock()
        bt = None if self.tracing is None or not live else self.tracing.batch(
            b.requests[0].model, b.variant, b.replica, b.rows, [p.trace for p in live])
        served = self.fleet.models.get(b.requests[0].model)
        f = Flight(rep, b, live, sent, 1.0 - served.served.margin if served is not None else 1.0)
        answer = send_batch(rep, b, live, sent, served, bt, max_bytes=self.fleet.max_message_bytes)
        t = self._loop.create_task(self._run(f, answer if bt is None else bt.ended(answer)))  # type: ignore[union-attr]
        f.task = t
        self._tasks.add(t)
        t.add_done_callback(partial(self._ended, f))
        for p in live:
            p.flight = f
        if live:
            self._watch(f, sent)

    def _ended(self, f: Flight, t: asyncio.Task) -> None:
        self._tasks.discard(t)
        if f.open:  # cancelled before its first step: the core is told all the same
            self._abandoned(f)
        # its members refer to it (``flight``, ``hedged_from``): the cycle would keep their
        # tensors (and the task's, through its frame) until a full collection, which a gateway
        # that allocates few objects per request reaches rarely
        f.live = []
        f.task = None

    async def _run(self, f: Flight, answer: Awaitable[list[list[Tensor]]]) -> None:
        rep, b, live, sent = f.replica, f.batch, f.live, f.sent
        try:
            results = await answer
        except asyncio.CancelledError:  # every waiter gone (or shutdown): the replica is free again
            self._abandoned(f)
            raise
        except Exception as e:  # noqa: BLE001  (every failure is answered below)
            self._closed(f)
            self._record_dispatch(b, live, sent)
            self._on_failure(f, e)
            if rep.batch_done is not None:
                rep.batch_done.set()
            return
        now = self.clock()
        self._closed(f)
        if not f.settled:  # hedged: the core was told then
            f.settled = True
            try:
                self.core.on_complete(b, now)
            except Exception:
                log.exception("policy core failed in on_complete")
        if rep.suspect:
            self.fleet.answered(rep, now)
        if rep.batch_done is not None:  # a removal waits for it
            rep.batch_done.set()
        # deadline met or missed against the request's whole SLO budget, not the planned part
        keep = f.keep
        met = []
        answered = []
        for p, outs in zip(live, results, strict=True):
            if self._drop(p.request.id) is None:
                continue  # answered already: by the other replica of its hedge, or at its deadline
            r = p.request
            answered.append(p)
            met.append(ok := now <= r.arrival + (r.deadline - r.arrival) / keep)
            if not p.future.done():
                p.future.set_result(InferResult(outs, b.variant, b.replica, ok, self.expose_replicas,
                                                sent - r.arrival, now - sent))
            if p.hedged_from is not None:
                self._answered(p, now)
        # with nothing queued a poll cannot dispatch or reject anything: skip it (hot path)
        if self._queued():
            self._poll()
        await asyncio.sleep(0)  # the answers go out first; the bookkeeping below is off their path
        self._record(rep, b, answered, met, sent, now)

    def _abandoned(self, f: Flight) -> None:
        """A batch whose waiters all gave up (or all were answered otherwise) was cancelled in
        flight: it is done for the core, and its requests still pending count as cancelled."""
        self._closed(f)
        if not f.settled:
            f.settled = True
            try:
                self.core.on_complete(f.batch, self.clock())
            except Exception:
                log.exception("policy core failed in on_complete")
        for p in f.live:
            if not p.future.done():  # never stranded (its waiters are gone whenever it is cancelled)
                self._fail(p, Unavailable(f"batch on {f.replica.id} was abandoned"))
            elif self._drop(p.request.id) is not None:
                self.metrics.of(self.metrics.cancelled, p.request.model).inc()
        if f.replica.batch_done is not None:
            f.replica.batch_done.set()
        if not self.draining:
            self._poll()

    def _record(self, rep: Replica, b: Batch, live: list[_Pending], met: list[bool], sent: float,
                now: float) -> None:
        """A finished batch's metrics."""
        self._record_dispatch(b, live, sent)
        model = b.requests[0].model
        m = self.metrics
        m.of(m.batch_duration, model, b.variant).observe(now - sent)
        planned = b.predicted_finish - b.dispatched
        if now - sent > 2 * planned + 0.05:
            log.warning("slow batch on %s: %d rows took %.1f ms (planned %.1f ms)",
                        rep.id, b.rows, (now - sent) * 1e3, planned * 1e3)
        m.of(m.batch_late, model, b.variant).observe(max(0.0, now - b.predicted_finish))
        latency = m.of(m.latency, model)
        for p in live:
            latency.observe(now - p.request.arrival)
        n_met = sum(met)
        if n_met:
            m.of(m.goodput, model).inc(n_met)
        if len(live) > n_met:
            m.of(m.missed, model).inc(len(live) - n_met)
        m.of(m.by_variant, model, b.variant).inc(len(live))
        version = _version(live)
        self.stats.batch(model, version, b.variant, b.rows, [sent - p.request.arrival for p in live], now - sent, True)
        for p in live:
            self.stats.answered(model, version, b.variant, True, now - p.request.arrival)

    def _record_dispatch(self, b: Batch, live: list[_Pending], sent: float) -> None:
        model = b.requests[0].model
        queue = self.metrics.of(self.metrics.queue, model)
        for p in live:
            queue.observe(sent - p.request.arrival)
        self.metrics.of(self.metrics.batch_size, model, b.variant).observe(b.rows)

    def _on_failure(self, f: Flight, e: Exception) -> None:
        """``f`` failed: a retryable error marks its replica unhealthy and its unanswered members
        go back to the core (unless it was hedged: then those the core holds again are left to
        it); the rest are answered with the error, except members still waiting on the first
        replica of their hedge."""
        rep, b, live, sent = f.replica, f.batch, f.live, f.sent
        now = self.clock()
        retryable = isinstance(e, BackendError) and e.retryable
        model = b.requests[0].model
        if retryable:
            log.warning("batch on %s failed, retrying elsewhere: %s", rep.id, e)
            self.fleet.set_health(rep, False, now)
        retry: tuple = ()
        if not f.settled:
            f.settled = True
            if retryable:
                retry = tuple(p.request for p in live if not p.future.done())
            try:
                self.core.on_complete(b, now, retry=retry)
            except Exception:
                log.exception("policy core failed in on_complete")
                retry = ()
        retried = {r.id for r in retry}
        self.stats.batch(model, _version(live), b.variant, b.rows, [sent - p.request.arrival for p in live],
                         now - sent, False)
        err = (e.at(rep.id) if isinstance(e, BackendError) else e if isinstance(e, GatewayError)
               else Unavailable(f"batch failed on {rep.id}: {e}"))
        for p in live:
            if p.request.id in retried:
                continue
            first = p.hedged_from
            if first is f and p.requeued:
                continue  # hedged: the core sends it elsewhere
            if first is not None and first is not f and first.open:
                p.requeued = False  # the hedge failed: it waits on its first replica
                continue
            if self._drop(p.request.id) is None:
                continue  # answered already
            self.metrics.of(self.metrics.failures, model).inc()
            self.stats.answered(model, _version([p]), b.variant, False, now - p.request.arrival)
            if not p.future.done():
                p.future.set_exception(err)
            if first is not None:
                self._answered(p, now)
        self._poll()


def _version(members: list[_Pending]) -> str:
    """The version a batch's members named ("" = the model's default): they share it."""
    f = members[0].forward if members else None
    return f.version if f is not None else ""
