"""The controller on Ray: :class:`RayController` plans onto the pool nodes the cluster offers and
re-plans when one leaves or joins; :class:`ControllerActor` runs it (with its gateway and admin
API) as a detached named actor, so it outlives the driver that started it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import ray

from deploy.operator.controller import ApplyError, Controller
from deploy.operator.desired import Desired, base_profiles, prepare
from deploy.ray.resources import HEAD, PIN, node_of, present_nodes
from deploy.ray.runtime import NAMESPACE, RayRuntime
from deploy.ray.state import RayStateStore
from placement.spec import single_pool

log = logging.getLogger("headrace.ray")
CONTROLLER_ACTOR = "headrace-controller"


def cluster_nodes() -> dict[str, dict[str, float]]:
    return present_nodes(ray.nodes())


def on_nodes(want: Desired, present: set[str]) -> Desired:
    """``want`` with its pool cut down to the nodes the cluster offers."""
    pool = single_pool(want.docs, ["ray"])
    keep = [n for n in pool.spec.nodes if n.name in present]
    if len(keep) == len(pool.spec.nodes):
        return want
    if not keep:
        names = [n.name for n in pool.spec.nodes]
        raise ApplyError(f"none of pool {pool.metadata.name!r}'s nodes {names} is in the Ray cluster "
                         f"(nodes offering headrace-node:<name>: {sorted(present)})")
    cut = pool.model_copy(update={"spec": pool.spec.model_copy(update={"nodes": keep})})
    return replace(want, docs=replace(want.docs, pools=[cut]))


@dataclass
class RayController(Controller):
    """A controller whose inventory is the pool's nodes present in the Ray cluster."""

    nodes_now: Callable[[], dict[str, dict[str, float]]] = cluster_nodes
    nodes: set[str] = field(default_factory=set)
    unfit: str | None = None  # what the present nodes cannot serve (None: everything fits)
    gateways: int = 0  # gateway actors beside this controller's own gateway (deploy.ray.gateway)
    namespace: str = NAMESPACE
    gateway_actors: list[Any] = field(default_factory=list)
    gateway_infos: list[dict[str, Any]] = field(default_factory=list)  # as last seen by the loop
    _syncs: int = 0  # gateway syncs begun: a refresh that overlapped one keeps the sync's infos

    async def _sync_gateways(self) -> None:
        """Deal the replicas over this gateway and the gateway actors (gateway.partition): share 0
        stays here, share i goes to actor i."""
        if not self.gateways or self.plan is None or self.gateway is None or self.desired is None:
            return
        self._syncs += 1
        from deploy.ray.gateway import gateway_actor  # noqa: PLC0415
        from gateway.partition import partition, replica_id  # noqa: PLC0415

        eps = self.runtime.endpoints()  # type: ignore[union-attr]
        full = self._render(self.plan, self.desired, eps.values())
        n = min(self.gateways + 1, sum(len(m.replicas) for m in full.models))
        part = partition(full, n)
        mine = {replica_id(r) for m in part.configs[0].models for r in m.replicas}
        for rid in sorted(mine - set(await self.gateway.replicas())):
            await self._add_to_gateway(self.plan, self.desired, eps[rid])
        for rid in sorted(set(await self.gateway.replicas()) - mine):
            await self.gateway.remove_replica(rid, self.drain_timeout, keep_model=True)
        while len(self.gateway_actors) < self.gateways:
            self.gateway_actors.append(gateway_actor(len(self.gateway_actors) + 1, self.namespace))
        infos = []
        for i, actor in enumerate(self.gateway_actors, 1):
            if i < n:
                raw = part.configs[i].model_dump(mode="json")
                infos.append(await asyncio.to_thread(ray.get, actor.configure.remote(raw), timeout=120))
        self.gateway_infos = infos

    async def _gateway_infos(self) -> None:
        # NOTE: Ray may run an actor's info() before an earlier configure() whose argument is
        # still being resolved, so a refresh that overlapped a sync could report the actor as it
        # was before it; the sync's own infos are newer
        began = self._syncs
        infos = []
        for actor in self.gateway_actors:
            try:
                infos.append(await asyncio.to_thread(ray.get, actor.info.remote(), timeout=2.0))
            except Exception as e:  # noqa: BLE001  (dead or restarting: status says so)
                infos.append({"error": type(e).__name__})
        if began == self._syncs:
            self.gateway_infos = infos

    def serving(self) -> dict[str, tuple[int, bool]]:
        """This controller's gateway's replicas and those the gateway actors last reported."""
        out = super().serving()
        for i, info in enumerate(self.gateway_infos, 1):
            healthy = set(info.get("healthy", ()))
            out.update({rid: (i, rid in healthy) for rid in info.get("replicas", ())})
        return out

    async def down(self) -> None:
        for actor in self.gateway_actors:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(ray.get, actor.stop.remote(), timeout=30)
            ray.kill(actor, no_restart=True)
        self.gateway_actors = []
        await super().down()

    def _solve_diff(self, want: Desired):  # noqa: ANN202
        return super()._solve_diff(on_nodes(want, self.nodes))

    async def up(self, want: Desired) -> None:
        self.nodes = set(await asyncio.to_thread(self.nodes_now))
        self.runtime.set_profiles(want.profiles, want.sources)  # type: ignore[union-attr]
        await super().up(want)
        await self._sync_gateways()

    async def _execute(self, d, want: Desired, new, llm_new=None) -> None:  # noqa: ANN001
        self.runtime.set_profiles(want.profiles, want.sources)  # type: ignore[union-attr]
        await super()._execute(d, want, new, llm_new)

    async def _tick(self, now: float) -> None:
        await super()._tick(now)
        await self._gateway_infos()
        if self.desired is None or self.applying is not None or self._lock.locked():
            return
        present = set(await asyncio.to_thread(self.nodes_now))
        if present == self.nodes:
            return
        left, joined = sorted(self.nodes - present), sorted(present - self.nodes)
        self.nodes = present
        why = ", ".join([*(f"{n} left" for n in left), *(f"{n} joined" for n in joined)])
        self._event("", "NodesChanged", f"{why}; re-planning on {sorted(present)}")
        await self._forget(set(left))
        try:
            # the capacity of the nodes that left is gone already: the re-plan may not wait for room
            await self.apply(self.desired.text, reason=f"nodes: {why}", allow_disruption=True)
        except Exception:  # noqa: BLE001  (status says what no longer fits)
            self._event("", "Unschedulable", self.unfit or "")

    async def _forget(self, gone: set[str]) -> None:
        """Drop the replicas of nodes that left: out of the gateway, their actors ended, and out
        of the plan (the re-plan starts from what still runs)."""
        if not gone or self.plan is None:
            return
        for rid, ep in list(self.runtime.endpoints().items()) if self.runtime else []:
            if node_of(ep.gpu) in gone:
                if self.gateway is not None and rid in await self.gateway.replicas():
                    stays = True  # the model keeps its name while the re-plan finds it a new home
                    await self.gateway.remove_replica(rid, 1.0, keep_model=stays)
                await asyncio.to_thread(self.runtime.forget, rid)  # type: ignore[union-attr]
        self.plan = replace(self.plan, gpus=tuple(g for g in self.plan.gpus if node_of(g.id) not in gone))

    async def apply(self, text: str, dry_run: bool = False, reason: str = "apply", **how: Any) -> dict[str, Any]:
        try:
            out = await super().apply(text, dry_run, reason, **how)
            if not dry_run:
                await self._sync_gateways()
        except Exception as e:
            if not dry_run and reason != "autoscale":
                self.unfit = f"{str(e).splitlines()[0]} (on Ray nodes {sorted(self.nodes)})"
            raise
        if not dry_run:
            self.unfit = None
        return out

    def status(self) -> dict[str, Any]:
        out = super().status()
        pool = single_pool(self.desired.docs, ["ray"]) if self.desired else None
        names = [n.name for n in pool.spec.nodes] if pool else []
        out["ray"] = {"nodes": sorted(self.nodes), "missing": [n for n in names if n not in self.nodes],
                      "unfit": self.unfit, "processes": self.runtime.processes() if self.runtime else {},
                      "gateways": self.gateway_infos}
        return out


class ControllerActorImpl:
    """The controller, its gateway and its admin API on their own event loop in this actor (on
    the head node: it stays when worker nodes come and go)."""

    def __init__(self, namespace: str = NAMESPACE) -> None:
        from gateway.serving import loop_factory  # noqa: PLC0415

        factory = loop_factory()
        self.loop = factory() if factory else asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="headrace-controller").start()
        self.namespace = namespace
        self.ctl: RayController | None = None
        self.runner = None

    def _call(self, coro, timeout: float | None = None):  # noqa: ANN001, ANN202
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def up(self, text: str, token: str, method: str = "greedy", tick: float = 1.0, gateways: int = 0,
           ready_timeout: float = 60.0) -> dict[str, Any]:
        """Plan, start the replicas and the gateway, serve the admin API; returns the status."""
        from deploy.operator.admin import serve_admin  # noqa: PLC0415

        store = RayStateStore(self.namespace)
        ray.get(store.actor.token.remote(token))
        base = base_profiles()
        runtime = RayRuntime(base, store.run_dir / "replicas", ready_timeout=ready_timeout)
        self.ctl = RayController(store, base, method=method, tick=tick, runtime=runtime, gateways=gateways,
                                 namespace=self.namespace)

        async def start() -> None:
            await self.ctl.up(prepare(text, base, "up"))  # type: ignore[union-attr]
            s = self.ctl.desired.settings  # type: ignore[union-attr]
            self.runner, self.ctl.admin_url = await serve_admin(self.ctl, token, s.admin.host, s.admin.port)  # type: ignore[union-attr]
            self.ctl.save()  # type: ignore[union-attr]
            asyncio.ensure_future(self._exit_when_stopped())

        try:
            self._call(start())
        except BaseException:
            with contextlib.suppress(Exception):
                self._call(self.ctl.down(), 120)
            raise
        return self.ctl.status()

    async def _exit_when_stopped(self) -> None:
        await self.ctl.stopped.wait()  # type: ignore[union-attr]
        if self.runner is not None:
            await self.runner.cleanup()
        log.info("headrace down: the controller actor exits")
        os._exit(0)

    def status(self) -> dict[str, Any]:
        async def now() -> dict[str, Any]:
            return self.ctl.status()  # type: ignore[union-attr]

        return self._call(now(), 30) if self.ctl else {}

    def down(self) -> None:
        if self.ctl is not None:
            self._call(self.ctl.down(), 120)


ControllerActor = ray.remote(num_cpus=0, max_restarts=0)(ControllerActorImpl)


def controller_actor(namespace: str = NAMESPACE) -> Any:
    """A new detached controller actor (ValueError: one is running already)."""
    return ControllerActor.options(name=CONTROLLER_ACTOR, namespace=namespace, lifetime="detached",
                                   resources={HEAD: PIN}).remote(namespace)
