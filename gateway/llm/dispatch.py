"""The asyncio driver of one generative model's router (:mod:`gateway.policy.llm`): the router
decides, this carries its decisions out.

A request is submitted when it arrives; :meth:`ModelRouter.decide` returns its decision, at once,
or, when the router holds it, once a later poll routes or refuses it. The router is polled at its
``wake`` (one timer per model, moved whenever ``wake`` moves) and after every change it cannot
see coming: a first token, a finish, a replica added or drained, a load read. A client that goes
away while its request is held withdraws it (the router's ``on_finish`` forgets a held request as
it forgets a routed one). Refusals are counted by reason, and the held requests are a gauge.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence

from gateway.observe.metrics import GatewayMetrics
from gateway.policy.llm.types import (
    Decision,
    EngineLoad,
    Refuse,
    ReplicaSpec,
    Route,
    RouterBase,
    TokenRequest,
)
from profiles.llm.kv import KvEvent


class ModelRouter:
    """One model's router, driven on the running loop with ``clock`` (seconds)."""

    def __init__(self, model: str, router: RouterBase, clock: Callable[[], float], metrics: GatewayMetrics) -> None:
        self.model = model
        self.router = router
        self.clock = clock
        self.metrics = metrics
        self.waiting: dict[str, asyncio.Future[Decision]] = {}  # by request id, until decided
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None  # the wake it is set for
        self._ids = itertools.count()

    def next_id(self) -> str:
        return f"{self.model}-{next(self._ids)}"

    # ---- the fleet
    def add_replica(self, spec: ReplicaSpec) -> None:
        self.router.add_replica(spec)
        self.poll()

    def drain_replica(self, replica_id: str) -> None:
        if replica_id in self.router.replicas:
            self.router.drain_replica(replica_id)
            self.poll()

    def remove_replica(self, replica_id: str) -> None:
        if replica_id in self.router.replicas:
            self.router.remove_replica(replica_id)
            self.poll()

    def set_available(self, replica_id: str, available: bool) -> None:
        """Take a replica out of routing while its engine cannot be reached, and back."""
        view = self.router.replicas.get(replica_id)
        if view is None or view.reachable == available:
            return
        self.router.set_reachable(replica_id, available)
        if available:
            self.poll()

    # ---- requests
    async def decide(self, request: TokenRequest) -> Decision:
        """The router's decision on ``request``; waits while the router holds it. Cancelled
        (the client went away): the request is withdrawn, routed or not."""
        fut: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self.waiting[request.id] = fut
        try:
            self._carry_out(self.router.submit(request, self.clock()))
            return fut.result() if fut.done() else await fut
        except asyncio.CancelledError:
            self.finish(request.id)
            raise
        finally:
            self.waiting.pop(request.id, None)

    def first_token(self, request_id: str) -> None:
        self.router.on_first_token(request_id, self.clock())
        self.poll()

    def finish(self, request_id: str) -> None:
        """The request finished, failed, was aborted or withdrawn."""
        self.router.on_finish(request_id, self.clock())
        self.poll()

    def kv_events(self, replica_id: str, events: Sequence[KvEvent]) -> None:
        self.router.on_kv_events(replica_id, events, self.clock())

    def load(self, replica_id: str, load: EngineLoad) -> None:
        self.router.on_load(replica_id, load, self.clock())
        self.poll()

    def poll(self) -> None:
        self._carry_out(self.router.poll(self.clock()))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_at = None

    def _carry_out(self, decisions: list[Decision]) -> None:
        m = self.metrics
        for d in decisions:
            fut = self.waiting.get(d.request.id)
            if fut is None or fut.done():  # its client left meanwhile: nothing will finish it
                if isinstance(d, Route):
                    self.router.on_finish(d.request.id, self.clock())
                continue
            if isinstance(d, Refuse):
                m.of(m.llm_refused, self.model, d.reason).inc()
            fut.set_result(d)
        m.of(m.llm_queued, self.model).set(self.router.queued)
        self._arm()

    def _arm(self) -> None:
        """One timer, at the router's ``wake`` (on ``clock``, however the loop keeps time)."""
        wake = self.router.wake
        if wake == self._timer_at:
            return
        self.close()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a stream settled as its loop went away: nothing is served any more
            return
        if wake is not None:
            self._timer = loop.call_later(max(0.0, wake - self.clock()), self._woken)
            self._timer_at = wake

    def _woken(self) -> None:
        self._timer = self._timer_at = None
        self.poll()
