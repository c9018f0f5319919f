"""What an operator may do to a running gateway, wherever it runs.

:class:`GatewayHandle` is the interface the controller uses: add and drain replicas, set and
drop generative models, read the counters its autoscaler samples, hold requests for models
scaled to zero, and stop the gateway. :class:`LocalHandle` is a gateway on the caller's own
event loop (Ray's gateway actors, tests); :class:`gateway.control.RemoteHandle` is a gateway
in a process of its own, reached over its authenticated control channel, which outlives the
controller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.coldstart import ColdStart
from gateway.config import ServedModel, resolve
from profiles.gateway_config import GatewayConfig, LlmModelConfig, LlmReplicaConfig

Sample = tuple[str, dict[str, str], float]  # a counter's name, labels and value


@dataclass
class Seen:
    """A gateway as read at once (:meth:`GatewayHandle.look`): what it serves and its counters."""

    replicas: dict[str, bool] = field(default_factory=dict)  # classic replica id -> healthy
    llm: dict[str, bool] = field(default_factory=dict)  # engine replica id -> taking requests
    counters: list[Sample] = field(default_factory=list)


class GatewayHandle(Protocol):
    http_url: str
    grpc_url: str

    async def add_replica(self, cfg: GatewayConfig, model: str) -> None:
        """Serve the first replica of ``model`` in ``cfg`` (a model new to the gateway comes
        with the settings ``cfg`` gives it). Raises when the gateway refuses it."""

    async def remove_replica(self, replica_id: str, timeout: float, keep_model: bool = False) -> bool:
        """Drain a replica (classic or generative) and forget it; see :meth:`Gateway.remove_replica`."""

    async def replicas(self) -> dict[str, bool]:
        """The classic replicas served: id -> healthy."""

    async def llm_replicas(self) -> dict[str, bool]:
        """The generative engines served: replica id -> taking requests (reachable, not draining)."""

    async def set_llm_model(self, model: LlmModelConfig) -> None: ...
    async def add_llm_replica(self, model: LlmModelConfig, replica: LlmReplicaConfig) -> None: ...
    async def drop_llm_model(self, name: str) -> None: ...

    async def counters(self) -> list[Sample]:
        """Every counter sample of the gateway's metrics (``*_total``)."""

    async def look(self) -> Seen:
        """The replicas, engines and counters, read together (one call over a channel)."""

    async def hold_cold(self, waits: dict[str, float], starter: Callable[[str], None]) -> None:
        """Hold requests for the models in ``waits`` (model -> seconds) while they have no
        replica; the first such request calls ``starter(model)``."""

    async def stop(self, drain_timeout: float) -> None: ...


class LocalHandle:
    """A :class:`~gateway.app.Gateway` on this event loop."""

    def __init__(self, gateway) -> None:  # noqa: ANN001  (gateway.app.Gateway: app imports handle's users)
        self.gateway = gateway

    @property
    def http_url(self) -> str:
        return self.gateway.http_url

    @property
    def grpc_url(self) -> str:
        return self.gateway.grpc_url

    async def add_replica(self, cfg: GatewayConfig, model: str) -> None:
        served = first_replica(cfg, model)
        await self.gateway.add_replica(served, served.replicas[0])

    async def remove_replica(self, replica_id: str, timeout: float, keep_model: bool = False) -> bool:
        return await self.gateway.remove_replica(replica_id, timeout, keep_model=keep_model)

    async def replicas(self) -> dict[str, bool]:
        return {rid: r.healthy for rid, r in self.gateway.driver.replicas.items()}

    async def llm_replicas(self) -> dict[str, bool]:
        return {r.id: r.reachable and not r.draining for reps in self.gateway.llm.replicas.values() for r in reps}

    async def set_llm_model(self, model: LlmModelConfig) -> None:
        self.gateway.llm.set_model(model)

    async def add_llm_replica(self, model: LlmModelConfig, replica: LlmReplicaConfig) -> None:
        self.gateway.llm.add_replica(model, replica)

    async def drop_llm_model(self, name: str) -> None:
        self.gateway.llm.drop_model(name)

    async def counters(self) -> list[Sample]:
        return counter_samples(self.gateway.driver.metrics.registry)

    async def look(self) -> Seen:
        return Seen(await self.replicas(), await self.llm_replicas(), await self.counters())

    async def hold_cold(self, waits: dict[str, float], starter: Callable[[str], None]) -> None:
        drv = self.gateway.driver
        if drv.cold is None:
            drv.cold = ColdStart(starter)
        drv.cold.starter = starter
        drv.cold.waits = dict(waits)

    async def stop(self, drain_timeout: float) -> None:
        await self.gateway.stop(drain_timeout=drain_timeout)


def first_replica(cfg: GatewayConfig, model: str) -> ServedModel:
    """``model`` of ``cfg``, resolved, with at least one replica (the first is the one to
    serve); :class:`ValueError` says what is missing."""
    models = resolve(cfg)
    served = next((m for m in models if m.name == model), None)
    if served is None:
        raise ValueError(f"model {model!r} is not in the config (it has {[m.name for m in models]})")
    if not served.replicas:
        raise ValueError(f"model {model!r} has no replica in the config")
    return served


def counter_samples(registry) -> list[Sample]:  # noqa: ANN001  (a prometheus CollectorRegistry)
    """The counter samples (``*_total``) of ``registry``."""
    return [(s.name, dict(s.labels), float(s.value)) for metric in registry.collect() for s in metric.samples
            if s.name.endswith("_total")]
