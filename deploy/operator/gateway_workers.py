"""The operator's gateway as N worker processes (``Gateway`` ``spec.workers``), driven as one.

Each worker is a gateway process of its own (:mod:`deploy.operator.gateway_process`) with its
own control channel, and all of them listen on the same HTTP and gRPC ports with
``SO_REUSEPORT``: the kernel spreads client connections over them, so every worker must answer
every model. A classic replica belongs to exactly one worker (a worker's batcher plans a
replica from the batches it alone sent there; docs/scaleout.md), so the planner gives each
classic model at least N replicas (:attr:`placement.plan.Demand.min_count`) and
:class:`GatewayWorkers` keeps every worker holding at least one of each while the fleet
changes:

- a replica added goes to the worker with the fewest of its model (then of its variant, then
  of all replicas; then the lowest index);
- before a worker's last replica of a model is drained, one of the model's replicas moves
  there from the worker with the most (added there first, then drained where it was), so a
  rollout's make-before-break never leaves a worker without the model;
- generative engines batch continuously and are shared: every worker relays to all of them
  (:mod:`gateway.partition`).

A worker that dies is started again by the controller (:meth:`GatewayWorkers.heal`) on the
same ports, with the replicas it held; the replicas no live worker holds (after a takeover,
those of a worker that died meanwhile) are dealt to the ones it restarts. The others serve on
meanwhile: the kernel sends new connections to them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from deploy.operator.adopt import alive
from deploy.operator.gateway_process import GatewayProcess, adopt_gateway, start_gateway
from deploy.operator.healing import port_of
from deploy.operator.state import DirStateStore
from gateway.config import with_ports
from gateway.control import ControlError
from gateway.handle import Sample, Seen
from gateway.partition import replica_id
from gateway.workers import free_reusable_port
from profiles.gateway_config import GatewayConfig, LlmModelConfig, LlmReplicaConfig
from profiles.schema import ListenAddress

StartFn = Callable[[GatewayConfig, str], Awaitable[GatewayProcess]]  # (config, name) -> a serving worker


def worker_name(i: int) -> str:
    """Worker ``i``'s name: its record's key in the state's processes and its files' stem."""
    return "gateway" if i == 0 else f"gateway-{i}"


def only(cfg: GatewayConfig, keep: set[str]) -> GatewayConfig:
    """``cfg`` with only the classic replicas in ``keep`` (every model stays, maybe with none)."""
    models = [m.model_copy(update={"replicas": [r for r in m.replicas if replica_id(r) in keep]}, deep=True)
              for m in cfg.models]
    out = cfg.model_copy(update={"models": models}, deep=True)
    out.base_dir = cfg.base_dir  # not a field copies keep
    return out


class GatewayWorkers:
    """N gateway workers behind one pair of ports: a :class:`~gateway.handle.GatewayHandle`."""

    def __init__(self, workers: Sequence[GatewayProcess | None], start: StartFn) -> None:
        self.workers: list[GatewayProcess | None] = list(workers)  # None: down, to be started by heal
        self.start = start
        self.home: dict[str, int] = {}  # classic replica id -> the worker that serves it
        self.model_of: dict[str, str] = {}  # classic replica id -> its model
        self.variant_of: dict[str, str] = {}
        self.configs: dict[str, GatewayConfig] = {}  # classic replica id -> a config that serves it
        self._lock = asyncio.Lock()
        live = next((w for w in self.workers if w is not None), None)
        self.http_url = live.http_url if live else ""
        self.grpc_url = live.grpc_url if live else ""

    @property
    def n(self) -> int:
        return len(self.workers)

    # ------------------------------------------------------------------ what runs

    @property
    def records(self) -> dict[str, dict[str, Any]]:
        """What the state keeps of each worker, by :func:`worker_name`."""
        return {worker_name(i): w.record for i, w in enumerate(self.workers) if w is not None and w.record}

    def alive(self) -> bool:
        return all(w is not None and w.alive() for w in self.workers)

    def dead(self) -> list[int]:
        return [i for i, w in enumerate(self.workers) if w is None or not w.alive()]

    def learn(self, cfg: GatewayConfig) -> None:
        """Know how to serve each classic replica of ``cfg`` (to move it to another worker)."""
        for m in cfg.models:
            for r in m.replicas:
                rid = replica_id(r)
                self.configs[rid], self.model_of[rid], self.variant_of[rid] = cfg, m.name, r.variant

    def _count(self, i: int, model: str, variant: str | None = None) -> int:
        return sum(h == i and self.model_of.get(r) == model and variant in (None, self.variant_of.get(r))
                   for r, h in self.home.items())

    def pick(self, model: str, variant: str, among: Sequence[int] | None = None) -> int:
        """The worker a new replica of ``model`` goes to (see the module's rule)."""
        total = [sum(h == i for h in self.home.values()) for i in range(self.n)]
        idx = range(self.n) if among is None else among
        return min(idx, key=lambda i: (self._count(i, model), self._count(i, model, variant), total[i], i))

    def deal(self, cfg: GatewayConfig, among: Sequence[int]) -> None:
        """Home every classic replica of ``cfg`` no worker holds on one of ``among``."""
        self.learn(cfg)
        for m in cfg.models:
            for r in m.replicas:
                if replica_id(r) not in self.home:
                    self.home[replica_id(r)] = self.pick(m.name, r.variant, among)

    def config_of(self, cfg: GatewayConfig, i: int) -> GatewayConfig:
        """Worker ``i``'s config: ``cfg`` with only its replicas, on the shared ports."""
        mine = only(cfg, {r for r, h in self.home.items() if h == i})
        m = cfg.metrics_listen
        if m is not None and m.port:
            mine.metrics_listen = ListenAddress(host=m.host, port=m.port + i)
        return mine

    # ------------------------------------------------------------------ the handle

    async def add_replica(self, cfg: GatewayConfig, model: str) -> None:
        served = next(m for m in cfg.models if m.name == model)
        r = served.replicas[0]
        rid = replica_id(r)
        async with self._lock:
            self.configs[rid], self.model_of[rid], self.variant_of[rid] = cfg, model, r.variant
            i = self.pick(model, r.variant, [k for k in range(self.n) if k not in self.dead()] or None)
            await self._worker(i).add_replica(cfg, model)
            self.home[rid] = i

    async def remove_replica(self, replica_id: str, timeout: float, keep_model: bool = False) -> bool:
        async with self._lock:
            i = self.home.get(replica_id)
            if i is None:  # a generative engine: every worker relays to it
                done = await asyncio.gather(*(self._remove_llm(w, replica_id, timeout) for w in self._live()))
                return any(done)
            model = self.model_of[replica_id]
            if self._count(i, model) == 1:
                await self._refill(i, model, timeout)
            removed = await self._worker(i).remove_replica(replica_id, timeout, keep_model=keep_model)
            del self.home[replica_id]
            self.configs.pop(replica_id, None)
            return removed

    async def _refill(self, i: int, model: str, timeout: float) -> None:
        """Before worker ``i``'s last replica of ``model`` goes: move one there from the worker
        that holds the most (two or more), added first, then drained where it was."""
        counts = {k: self._count(k, model) for k in range(self.n) if k != i and k not in self.dead()}
        donor = max(counts, key=lambda k: (counts[k], -k), default=None)
        if donor is None or counts[donor] < 2:
            return
        rid = max((r for r, h in self.home.items() if h == donor and self.model_of[r] == model and r in self.configs),
                  default=None)
        if rid is None:
            return
        await self._worker(i).add_replica(only(self.configs[rid], {rid}), model)  # its only replica: the one served
        self.home[rid] = i
        await self._worker(donor).remove_replica(rid, timeout, keep_model=True)

    @staticmethod
    async def _remove_llm(w: GatewayProcess, rid: str, timeout: float) -> bool:
        try:
            return await w.remove_replica(rid, timeout)
        except ControlError as e:
            if e.status == 404:
                return False
            raise

    async def replicas(self) -> dict[str, bool]:
        out: dict[str, bool] = {}
        for part in await asyncio.gather(*(w.replicas() for w in self._live())):
            out.update(part)
        return out

    def worker_of(self, rid: str) -> int | None:
        return self.home.get(rid)

    async def llm_replicas(self) -> dict[str, bool]:
        return _everywhere(await asyncio.gather(*(w.llm_replicas() for w in self._live())))

    async def set_llm_model(self, model: LlmModelConfig) -> None:
        await asyncio.gather(*(w.set_llm_model(model) for w in self._live()))

    async def add_llm_replica(self, model: LlmModelConfig, replica: LlmReplicaConfig) -> None:
        await asyncio.gather(*(w.add_llm_replica(model, replica) for w in self._live()))

    async def drop_llm_model(self, name: str) -> None:
        await asyncio.gather(*(w.drop_llm_model(name) for w in self._live()))

    async def counters(self) -> list[Sample]:
        """Every worker's counters, summed by name and labels."""
        return _summed(await asyncio.gather(*(w.counters() for w in self._live())))

    async def look(self) -> Seen:
        """Each live worker read once: the replicas of all, engines taking requests at every
        one, counters summed."""
        parts = await asyncio.gather(*(w.look() for w in self._live()))
        return Seen({rid: up for p in parts for rid, up in p.replicas.items()}, _everywhere([p.llm for p in parts]),
                    _summed([p.counters for p in parts]))

    async def hold_cold(self, waits: dict[str, float], starter: Callable[[str], None]) -> None:
        await asyncio.gather(*(w.hold_cold(waits, starter) for w in self._live()))

    async def stop(self, drain_timeout: float, wait: bool = True) -> None:
        await asyncio.gather(*(w.stop(drain_timeout, wait=wait) for w in self.workers if w is not None),
                             return_exceptions=True)

    async def close(self) -> None:
        for w in self.workers:
            if w is not None:
                await w.close()

    # ------------------------------------------------------------------ healing

    async def heal(self, cfg: GatewayConfig) -> list[int]:
        """Start each dead worker again on the shared ports, serving the replicas of ``cfg``
        it held and those no worker holds; returns the workers started."""
        async with self._lock:
            dead = self.dead()
            if not dead:
                return []
            for rid in [r for r, h in self.home.items() if h in dead]:
                del self.home[rid]  # dealt again below: to the same worker, unless its peer is lighter
            self.deal(cfg, dead)
            for i in dead:
                old = self.workers[i]
                if old is not None:
                    with contextlib.suppress(Exception):
                        await old.stop(0.0)  # what is left of it
                self.workers[i] = await self.start(with_ports(self.config_of(cfg, i), http_port=port_of(self.http_url),
                                                              grpc_port=port_of(self.grpc_url)), worker_name(i))
            return dead

    def _live(self) -> list[GatewayProcess]:
        return [w for w in self.workers if w is not None and w.alive()]

    def _worker(self, i: int) -> GatewayProcess:
        w = self.workers[i]
        if w is None:
            raise ControlError(f"gateway worker {i} is down")
        return w


def _everywhere(parts: Sequence[dict[str, bool]]) -> dict[str, bool]:
    """Engine id -> taking requests at every worker that relays to it."""
    out: dict[str, bool] = {}
    for part in parts:
        for rid, up in part.items():
            out[rid] = out.get(rid, True) and up
    return out


def _summed(parts: Sequence[Sequence[Sample]]) -> list[Sample]:
    total: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for part in parts:
        for name, labels, v in part:
            key = (name, tuple(sorted(labels.items())))
            total[key] = total.get(key, 0.0) + v
    return [(name, dict(labels), v) for (name, labels), v in total.items()]


async def start_workers(cfg: GatewayConfig, n: int, start: StartFn) -> GatewayWorkers:
    """``cfg`` served by ``n`` new workers on shared ports (ports 0: free ones, picked once);
    returns once all serve. If one cannot start, those started are stopped and its error raised."""
    host = cfg.listen.host
    shared = with_ports(cfg.model_copy(deep=True), http_port=cfg.listen.http_port or free_reusable_port(host),
                        grpc_port=cfg.listen.grpc_port or free_reusable_port(host))
    shared.base_dir = cfg.base_dir
    gw = GatewayWorkers([None] * n, start)
    gw.deal(shared, range(n))
    started: list[GatewayProcess] = []
    try:
        for i in range(n):
            w = await start(gw.config_of(shared, i), worker_name(i))
            started.append(w)
            gw.workers[i] = w
    except BaseException:
        for w in started:
            with contextlib.suppress(Exception):
                await w.stop(0.0)
        raise
    gw.http_url, gw.grpc_url = started[0].http_url, started[0].grpc_url
    return gw


def adopt_workers(found: Sequence[GatewayProcess | None], start: StartFn) -> GatewayWorkers:
    """The workers a previous controller started, taken over as they run (None: one that is
    gone, started again by :meth:`GatewayWorkers.heal`); each replica stays where it is served."""
    gw = GatewayWorkers(found, start)
    for i, w in enumerate(found):
        for rid, model in ((w.models or {}) if w is not None else {}).items():
            gw.home[rid], gw.model_of[rid] = i, model
    return gw


def gateway_factory(store: DirStateStore, workers: int):  # noqa: ANN201
    """How the controller starts and takes over its gateway: ``(start(cfg), adopt(processes))``.
    One process (``workers`` 1) or :class:`GatewayWorkers`.
    ``adopt`` takes the state's processes and returns None when no gateway process of them runs."""
    def worker(cfg: GatewayConfig, name: str) -> Any:
        return start_gateway(store, cfg, name=name, reuse_port=True)

    async def start(cfg: GatewayConfig) -> Any:
        if workers == 1:
            return await start_gateway(store, cfg)
        return await start_workers(cfg, workers, worker)

    async def adopt(procs: dict[str, Any]) -> Any:
        recs = [procs.get(worker_name(i)) for i in range(workers)]
        if not any(alive(r) for r in recs):
            return None
        found = [await adopt_gateway(store, r) if alive(r) else None for r in recs]  # type: ignore[arg-type]
        return found[0] if workers == 1 else adopt_workers(found, worker)

    return start, adopt
