"""The live fleet the driver holds: which replicas serve each model and their clients, adding
and removing them while serving, their health (ready probes, and a replica suspect after a
batch of it went unanswered past its hedge time: :mod:`gateway.hedge`), the check that every variant has
its model's signature, and the versions a served model answers to (those its replicas' Triton
models report).

A removal drains the replica (no new batch goes there), waits until nothing is in flight on
it, then removes it and returns what the core handed back (a :class:`Removal`): the driver,
which holds the requests, submits them again or answers them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gateway.backends.grpc import ModelInfo, TritonReplica
from gateway.backends.http import TritonHttpReplica
from gateway.codec import Signature
from gateway.config import ServedModel, ServedReplica
from gateway.errors import BackendError, ConfigError, InvalidRequest, ModelNotFound, Unavailable
from gateway.observe.metrics import GatewayMetrics
from gateway.policy.types import ReplicaInfo, Request, SchedulerCore

log = logging.getLogger("headrace.gateway")

BACKENDS: dict[str, Callable[..., Any]] = {"http": TritonHttpReplica, "grpc": TritonReplica}
DEFAULT_VERSION = "1"  # a model's version when its backend reports none


def versions_of(info: ModelInfo) -> tuple[str, ...]:
    """The versions a backend's model metadata reports (KServe ``versions``); "1" when none."""
    return tuple(info.metadata.versions) or (DEFAULT_VERSION,)


def _version_order(v: str) -> tuple[int, str]:
    return (int(v) if v.isdigit() else -1, v)


@dataclass
class Replica:
    """One replica the driver sends batches to: its client and what is known of it."""

    id: str
    model: str
    variant: str
    client: TritonReplica
    key: tuple[str, str] = ("", "")  # (protocol, url) of its client, shared by replicas of one server
    healthy: bool = True
    verified: bool = True  # its variant's signature is known to match the model's
    refused: str = ""  # why its signature was refused (logged once)
    versions: tuple[str, ...] = ()  # its Triton model's versions; () until its metadata is checked
    removing: bool = False
    batch_done: asyncio.Event | None = None  # set when a batch of it completes (while removing)
    suspect: bool = False  # a batch of it went unanswered past its hedge time (gateway.hedge)


@dataclass
class Model:
    """A served model: its config (replicas as served now), its signature once known, and the
    versions it answers to: those of its replicas' Triton models (the union), the latest
    being the default (Triton's default version policy)."""

    served: ServedModel
    info: ModelInfo | None = None
    versions: frozenset[str] = frozenset({DEFAULT_VERSION})
    default_version: str = DEFAULT_VERSION

    def check_version(self, version: str) -> None:
        """:class:`ModelNotFound` for a version the model does not have (a set lookup)."""
        if version not in self.versions:
            raise ModelNotFound(f"model '{self.served.name}' has no version '{version}'; "
                                f"versions: {self.version_list()}")

    def version_list(self) -> list[str]:
        return sorted(self.versions, key=_version_order)

    def set_versions(self, reported: list[tuple[str, ...]]) -> None:
        """The versions the replicas whose metadata is known report (:func:`versions_of`)."""
        vs = frozenset(v for r in reported for v in r) or frozenset({DEFAULT_VERSION})
        self.versions = vs
        self.default_version = max(vs, key=_version_order)


def check_signature(model: str, existing: Signature, new: Signature, variant: str) -> None:
    """Every variant of a served model must take and give the same tensors (names, datatypes,
    dims) with the same max batch: raises :class:`ConfigError` naming the first difference."""
    where = f"model '{model}': variant '{variant}' has"
    if new.max_batch_size != existing.max_batch_size:
        raise ConfigError(f"{where} max_batch_size {new.max_batch_size}, the model's is {existing.max_batch_size}")
    for kind, have, got in (("input", existing.inputs, new.inputs), ("output", existing.outputs, new.outputs)):
        if set(have) != set(got):
            raise ConfigError(f"{where} {kind}s {sorted(got)}, the model's are {sorted(have)}")
        for name, t in have.items():
            n = got[name]
            if (n.datatype, tuple(n.dims)) != (t.datatype, tuple(t.dims)):
                raise ConfigError(f"{where} {kind} '{name}' {n.datatype} {list(n.dims)}, "
                                  f"the model's is {t.datatype} {list(t.dims)}")


def replica_info(served: ServedModel, sig: Signature, r: ServedReplica) -> ReplicaInfo:
    """What the core is told of a replica: its batches are capped by the model's signature."""
    max_batch = min(served.max_batch, sig.max_batch_size) if sig.batched else 1
    return ReplicaInfo(r.id, served.name, r.variant, r.profile, max_batch, r.max_inflight,
                       r.price_per_hour, served.objective)


@dataclass(slots=True)
class Removal:
    """A replica taken out of the fleet and what the core handed back, for the driver to answer."""

    replica: Replica
    drained: bool  # nothing was in flight on it when it went
    back: tuple[Request, ...]  # the requests the core handed back
    in_flight: frozenset[int]  # ids of those that were in flight on it
    model_gone: bool  # its model is no longer served
    at: float  # when it went (the driver's clock)


class Fleet:
    """The replicas and models a driver serves, changed while serving. Every change is told to
    the ``core``; ``poll`` is the driver's hook to look at the core again once the fleet changed
    (a replica added, drained or flipping health)."""

    def __init__(
        self,
        models: list[ServedModel],
        core: SchedulerCore,
        *,
        clock: Callable[[], float],
        metrics: GatewayMetrics,
        poll: Callable[[], None],
        health_interval: float = 0.5,
        max_message_bytes: int = 64 << 20,
        replica_factory: Callable[[str, str], Any] | None = None,
    ) -> None:
        self.core = core
        self.clock = clock
        self.metrics = metrics
        self._poll = poll
        self.health_interval = health_interval
        self.max_message_bytes = max_message_bytes  # also the most inputs one call to a replica carries
        self.models = {m.name: Model(m) for m in models}
        # (protocol, url) -> BackendTls of servers spoken to over TLS
        self._tls = {(r.protocol, r.url): r.tls for m in models for r in m.replicas if r.tls is not None}
        self._make = replica_factory or (lambda proto, url: BACKENDS[proto](
            url, max_message_bytes, tls=self._tls.get((proto, url))))
        self._clients: dict[tuple[str, str], Any] = {}  # one client per (protocol, url)
        self.replicas: dict[str, Replica] = {}
        for m in models:
            for r in m.replicas:
                key = (r.protocol, r.url)
                if key not in self._clients:
                    self._clients[key] = self._make(*key)
                self.replicas[r.id] = Replica(r.id, m.name, r.variant, self._clients[key], key)
        self.started = False

    async def start(self, startup_timeout: float = 30.0) -> None:
        """Fetch each replica's metadata: the model's signature is its first answering
        replica's, and every other must match it (:func:`check_signature`, else
        :class:`ConfigError`); a replica that does not answer is checked once it does, and
        serves only then. Register the replicas with the core; one not ready starts unhealthy."""
        deadline = self.clock() + startup_timeout
        for name, m in self.models.items():
            if not m.served.replicas:  # refused no_replica until a replica is added
                continue
            while True:
                reps = [self.replicas[r.id] for r in m.served.replicas]
                got = await asyncio.gather(*(r.client.model_info(r.variant) for r in reps), return_exceptions=True)
                errors = [g for g in got if isinstance(g, BaseException)]
                for e in errors:
                    if not isinstance(e, BackendError):
                        raise e
                if len(errors) < len(got):
                    break
                if self.clock() >= deadline:
                    raise Unavailable(f"model '{name}': no replica answered metadata: {errors[-1]}")
                await asyncio.sleep(0.2)
            for r, info in zip(reps, got, strict=True):
                if isinstance(info, BaseException):
                    r.verified = False  # checked by the health loop once it answers
                    continue
                if m.info is None:
                    m.info = info
                else:
                    check_signature(name, m.info.signature, info.signature, r.variant)
                r.versions = versions_of(info)
            self._sync_versions(name)
        now = self.clock()
        for m in self.models.values():
            for r in m.served.replicas:
                self.core.add_replica(replica_info(m.served, m.info.signature, r), now)  # type: ignore[union-attr]
                self.metrics.of(self.metrics.healthy, m.served.name, r.id).set(1)
        reps = list(self.replicas.values())  # a replica down at startup starts unhealthy
        oks = await asyncio.gather(*(r.client.ready(r.variant) for r in reps), return_exceptions=True)
        for r, ok in zip(reps, oks, strict=True):
            if ok is not True or not r.verified:
                self.set_health(r, False, self.clock())
        self.started = True

    async def close(self) -> None:
        """Close every replica client."""
        for c in list(self._clients.values()):
            await c.close()

    def model(self, name: str, version: str = "") -> Model:
        """The served model ``name`` at ``version`` ("": its default); :class:`ModelNotFound`
        naming what is served when there is no such model or version."""
        m = self.models.get(name)
        if m is None:
            raise ModelNotFound(f"unknown model '{name}'; served: {sorted(self.models)}")
        if version:
            m.check_version(version)
        return m

    def default_version(self, name: str) -> str:
        m = self.models.get(name)
        return m.default_version if m is not None else DEFAULT_VERSION

    def _sync_versions(self, name: str) -> None:
        """Recompute a model's versions from its replicas whose metadata is known."""
        m = self.models.get(name)
        if m is not None:
            m.set_versions([r.versions for r in self.replicas.values() if r.model == name and r.versions])

    def check_variant(self, name: str, variant: str) -> None:
        """:class:`InvalidRequest` when model ``name`` has no variant ``variant`` (a pin)."""
        variants = {r.variant for r in self.replicas.values() if r.model == name}
        if variant not in variants:
            raise InvalidRequest(f"model '{name}' has no variant '{variant}'; variants: {sorted(variants)}")

    def replicas_serving(self, name: str, version: str) -> frozenset[str] | None:
        """The replicas of model ``name`` whose Triton model serves ``version`` (those whose
        metadata is not known yet included); None when all of them do (no restriction)."""
        ids = [r.id for r in self.replicas.values() if r.model == name]
        ok = frozenset(r for r in ids if not self.replicas[r].versions or version in self.replicas[r].versions)
        return None if len(ok) == len(ids) else ok

    def replica_ids(self) -> dict[str, list[str]]:
        """What the gateway serves: each model's replica ids (one being removed included)."""
        out: dict[str, list[str]] = {name: [] for name in self.models}
        for r in self.replicas.values():
            out[r.model].append(r.id)
        return out

    async def add_replica(self, model: ServedModel, replica: ServedReplica) -> None:
        """Serve ``replica`` from now on as a replica of ``model``; a new model becomes
        addressable (of a model already served only the name is used). Its variant must have
        the model's signature (:func:`check_signature`); :class:`ConfigError` refuses it (and
        a repeated replica id). It starts unhealthy when its ready probe fails, and takes
        batches from the next poll on."""
        if not self.started:
            raise Unavailable("the gateway is not started")
        if replica.id in self.replicas:
            raise ConfigError(f"replica '{replica.id}' is already served")
        key = (replica.protocol, replica.url)
        if replica.tls is not None:
            self._tls[key] = replica.tls
        made = key not in self._clients
        client = self._make(*key) if made else self._clients[key]
        try:
            info = await client.model_info(replica.variant)
            try:
                ready = await client.ready(replica.variant) is True
            except Exception:  # noqa: BLE001  (a failing probe is "not ready")
                ready = False
            # from here on no await: nothing interleaves between the checks and the registration
            if replica.id in self.replicas:
                raise ConfigError(f"replica '{replica.id}' is already served")
            m = self.models.get(model.name)
            # a model served with no replica so far (shed by a partial plan) takes ``model``'s settings
            fresh = m is None or m.info is None
            if not fresh:
                check_signature(model.name, m.info.signature, info.signature, replica.variant)  # type: ignore[union-attr]
            served = model if fresh else m.served  # type: ignore[union-attr]
            now = self.clock()
            try:
                self.core.add_replica(replica_info(served, info.signature, replica), now)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        except BaseException:
            if made:
                await client.close()
            raise
        shared = self._clients.get(key)  # another add may have made one meanwhile
        if shared is None:  # ours, or a removal closed the one we asked meanwhile
            shared = self._clients[key] = client if made else self._make(*key)
        rep = self.replicas[replica.id] = Replica(replica.id, model.name, replica.variant, shared, key,
                                                  versions=versions_of(info))
        if m is None:
            self.models[model.name] = Model(replace(model, replicas=(replica,)), info)
        elif fresh:
            m.served, m.info = replace(model, replicas=(replica,)), info
        else:
            m.served = replace(m.served, replicas=(*m.served.replicas, replica))
        self._sync_versions(model.name)
        self.metrics.of(self.metrics.healthy, model.name, replica.id).set(1)
        log.info("replica %s of model '%s' (variant %s) added", replica.id, model.name, replica.variant)
        if not ready:
            self.set_health(rep, False, now)
        self._poll()
        if made and shared is not client:
            await client.close()

    async def remove_replica(self, replica_id: str, timeout: float = 30.0, keep_model: bool = False) -> Removal:
        """Drain the replica (no new batch goes there; its variant's queue moves to another
        variant when it was the last), wait up to ``timeout`` real seconds until nothing is in
        flight on it, then remove it from the core and the fleet, anyway. When the model has
        no replica left it is no longer served, unless ``keep_model``: then it stays
        addressable with no replica. KeyError for a replica not served. Its client stays open
        until :meth:`release` (the driver answers the handed-back requests first)."""
        rep = self.replicas.get(replica_id)
        if rep is None or rep.removing:
            raise KeyError(f"replica '{replica_id}' is not served (or is already being removed)")
        rep.removing = True
        self.core.drain_replica(replica_id, self.clock())
        self._poll()  # a moved queue goes out now
        drained = await self._idle(rep, timeout)
        now = self.clock()
        stuck = frozenset(r.id for st in self.core.replicas() if st.info.id == replica_id
                          for b in st.inflight for r in b.requests)
        back = self.core.remove_replica(replica_id, now)
        del self.replicas[replica_id]
        self.metrics.forget(rep.model, rep.id)
        m = self.models[rep.model]
        m.served = replace(m.served, replicas=tuple(r for r in m.served.replicas if r.id != replica_id))
        gone = not m.served.replicas and not keep_model
        if gone:
            del self.models[rep.model]
        else:
            self._sync_versions(rep.model)
        return Removal(rep, drained, back, stuck, gone, now)

    async def release(self, rep: Replica) -> None:
        """Close a removed replica's client unless another replica still uses it."""
        if not any(r.client is rep.client for r in self.replicas.values()):
            self._clients.pop(rep.key, None)
            await rep.client.close()

    async def _idle(self, rep: Replica, timeout: float) -> bool:
        """Wait until the core shows no batch in flight on ``rep``; False after ``timeout``
        real seconds (the injected clock may be virtual)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        rep.batch_done = asyncio.Event()
        while any(st.inflight for st in self.core.replicas() if st.info.id == rep.id):
            rep.batch_done.clear()
            try:
                await asyncio.wait_for(rep.batch_done.wait(), max(0.0, end - loop.time()))
            except TimeoutError:
                return not any(st.inflight for st in self.core.replicas() if st.info.id == rep.id)
        return True

    async def _verify(self, rep: Replica) -> bool:
        """A replica whose metadata was not known at startup serves once its signature is
        known to match its model's."""
        try:
            info = await rep.client.model_info(rep.variant)
            m = self.models.get(rep.model)
            if m is None or m.info is None:
                return False
            check_signature(rep.model, m.info.signature, info.signature, rep.variant)
        except BackendError:
            return False
        except ConfigError as e:
            if rep.refused != str(e):
                log.error("%s; replica %s stays out of service", e, rep.id)
            rep.refused = str(e)
            return False
        rep.verified = True
        rep.versions = versions_of(info)
        self._sync_versions(rep.model)
        return True

    # ------------------------------------------------------------------ health

    def set_health(self, rep: Replica, healthy: bool, now: float) -> None:
        """Mark ``rep`` healthy or not, and tell the core (a removed replica is left alone)."""
        if healthy:
            rep.suspect = False
        if rep.healthy == healthy or self.replicas.get(rep.id) is not rep:  # unchanged, or removed
            return
        rep.healthy = healthy
        log.info("replica %s is %s", rep.id, "healthy" if healthy else "unhealthy")
        self.metrics.of(self.metrics.healthy, rep.model, rep.id).set(int(healthy))
        self.core.set_healthy(rep.id, healthy, now)

    def suspect(self, rep: Replica, now: float) -> None:
        """A batch of ``rep`` went unanswered past its hedge time: no new batch goes to it
        (unhealthy to the core) until it answers one (:meth:`answered`) or its ready probe
        passes again."""
        self.set_health(rep, False, now)
        if self.replicas.get(rep.id) is rep:
            rep.suspect = True

    def answered(self, rep: Replica, now: float) -> None:
        """A batch of ``rep`` was answered: a suspect replica takes batches again."""
        if rep.suspect:
            self.set_health(rep, True, now)

    async def health_loop(self) -> None:
        """Probe every replica each ``health_interval``: one flipping health is told to the
        core, and one whose metadata was not known serves once its signature matches."""
        while True:
            await asyncio.sleep(self.health_interval)
            reps = list(self.replicas.values())
            oks = await asyncio.gather(
                *(r.client.ready(r.variant, timeout=min(1.0, self.health_interval * 2)) for r in reps),
                return_exceptions=True,
            )
            changed = False
            for r, ok in zip(reps, oks, strict=True):
                ok = ok is True
                if ok and not r.verified:
                    ok = await self._verify(r)
                if self.replicas.get(r.id) is not r:
                    continue  # removed meanwhile
                if ok != r.healthy:
                    self.set_health(r, ok, self.clock())
                    changed = True
            if changed:
                self._poll()
