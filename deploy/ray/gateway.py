"""Gateway actors: more gateways beside the controller's, each a Ray actor serving its own ports
(requests reach it directly, no Serve proxy), each owning a share of the replicas.

The replicas are split with :func:`gateway.partition.partition`, so no replica gets batches from
two gateways that do not know of each other. The controller keeps share 0 in its own gateway and
hands share i to actor i. Each actor's latest config and its ports sit in the state actor: when
Ray restarts a killed gateway actor (``max_restarts=-1``) it comes back on the same ports with
the replicas it had.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import ray

from deploy.ray.resources import HEAD, PIN
from deploy.ray.state import state_actor


class GatewayActorImpl:
    """One gateway on its own event loop and ports."""

    def __init__(self, index: int, namespace: str) -> None:
        from gateway.serving import loop_factory  # noqa: PLC0415
        from profiles.triton.server import free_ports  # noqa: PLC0415

        self.index = index
        self.state = state_actor(namespace)
        ports = ray.get(self.state.get.remote(f"gateway-ports:{index}"))
        if ports is None:
            ports = free_ports(2)
            ray.get(self.state.put.remote(f"gateway-ports:{index}", ports))
        self.ports = ports
        factory = loop_factory()
        self.loop = factory() if factory else asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name=f"headrace-gateway-{index}").start()
        self.gateway = None
        self.starts = ray.get(self.state.get.remote(f"gateway-starts:{index}")) or 0
        self.starts += 1
        ray.get(self.state.put.remote(f"gateway-starts:{index}", self.starts))
        cfg = ray.get(self.state.get.remote(f"gateway-config:{index}"))
        if cfg is not None:
            self._run(self._start(cfg))

    def _run(self, coro, timeout: float = 120.0):  # noqa: ANN001, ANN202
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self, raw: dict[str, Any]) -> None:
        from gateway.app import Gateway  # noqa: PLC0415
        from gateway.config import with_ports  # noqa: PLC0415
        from profiles.gateway_config import GatewayConfig  # noqa: PLC0415

        if self.gateway is not None:
            await self.gateway.stop(drain_timeout=5.0)
            self.gateway = None
        gw = Gateway(with_ports(GatewayConfig.model_validate(raw), *self.ports))
        await gw.start()
        self.gateway = gw

    def configure(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Serve ``raw`` (a gateway config) from now on, on this actor's ports."""
        ray.get(self.state.put.remote(f"gateway-config:{self.index}", raw))
        self._run(self._start(raw))
        return self.info()

    def info(self) -> dict[str, Any]:
        gw = self.gateway
        return {"index": self.index, "http": gw.http_url if gw else None, "grpc": gw.grpc_url if gw else None,
                "starts": self.starts, "replicas": sorted(gw.driver.replicas) if gw else [],
                "healthy": sorted(r for r, rep in gw.driver.replicas.items() if rep.healthy) if gw else []}

    def stop(self) -> None:
        if self.gateway is not None:
            self._run(self.gateway.stop(drain_timeout=5.0))
            self.gateway = None


GatewayActor = ray.remote(GatewayActorImpl)


def gateway_actor(index: int, namespace: str) -> Any:
    return GatewayActor.options(name=f"headrace-gateway:{index}", namespace=namespace, num_cpus=0,
                                max_restarts=-1, max_task_retries=0, resources={HEAD: PIN}).remote(index, namespace)
