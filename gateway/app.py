"""The gateway as one object: config -> policy core + driver + HTTP app + gRPC server.

:func:`build_app` is the app factory: the aiohttp application owns the driver (replica
channels, health probes) and the gRPC server through ``cleanup_ctx``, so starting the app
starts everything and cleaning it up stops everything. :class:`Gateway` runs it on ports;
:class:`GatewayThread` runs it on a background event loop (tests, benchmarks, embedding).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future

import grpc
from aiohttp import web

from gateway.config import GatewayConfig, resolve
from gateway.driver import Driver
from gateway.grpc_server import create_server
from gateway.http import DRIVER, create_app
from gateway.metrics import GatewayMetrics
from gateway.policy.config import SchedulerConfig
from gateway.policy.scheduler import EdfScheduler
from gateway.policy.types import SchedulerCore
from gateway.stats import ServerInfo

log = logging.getLogger("headrace.gateway")

GRPC_SERVER = web.AppKey("grpc_server", grpc.aio.Server)
GRPC_PORT = web.AppKey("grpc_port", int)
CONFIG = web.AppKey("config", GatewayConfig)


def make_core(cfg: GatewayConfig) -> SchedulerCore:
    return EdfScheduler(SchedulerConfig.model_validate(cfg.scheduler))


def build_app(
    cfg: GatewayConfig,
    core: SchedulerCore | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> web.Application:
    models = resolve(cfg)
    driver = Driver(
        models, core or make_core(cfg), clock=clock, metrics=GatewayMetrics(),
        health_interval=cfg.health_interval_s, max_message_bytes=cfg.max_message_bytes,
    )
    info = ServerInfo([m.name for m in models], clock=clock)
    app = create_app(driver, info, cfg.max_message_bytes)
    app[CONFIG] = cfg

    async def driver_ctx(app: web.Application) -> AsyncIterator[None]:
        await app[DRIVER].start(cfg.startup_timeout_s)
        yield
        await app[DRIVER].stop()

    async def grpc_ctx(app: web.Application) -> AsyncIterator[None]:
        server = create_server(driver, info, cfg.max_message_bytes)
        port = server.add_insecure_port(f"{cfg.listen.host}:{cfg.listen.grpc_port}")
        if port == 0:
            raise OSError(f"cannot bind gRPC to {cfg.listen.host}:{cfg.listen.grpc_port}")
        await server.start()
        app[GRPC_SERVER] = server
        app[GRPC_PORT] = port
        yield
        await server.stop(grace=1.0)

    app.cleanup_ctx.append(driver_ctx)
    app.cleanup_ctx.append(grpc_ctx)
    return app


class Gateway:
    """The gateway bound to its ports. ``await start()``, then ``await stop()``."""

    def __init__(self, cfg: GatewayConfig, core: SchedulerCore | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.app = build_app(cfg, core, clock)
        self._runner: web.AppRunner | None = None
        self.http_port = 0

    @property
    def driver(self) -> Driver:
        return self.app[DRIVER]

    @property
    def grpc_port(self) -> int:
        return self.app[GRPC_PORT]

    @property
    def http_url(self) -> str:
        return f"{self.cfg.listen.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.cfg.listen.host}:{self.grpc_port}"

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        try:
            site = web.TCPSite(self._runner, self.cfg.listen.host, self.cfg.listen.http_port)
            await site.start()
        except BaseException:
            await self._runner.cleanup()
            raise
        self.http_port = self._runner.addresses[0][1]

    async def stop(self, drain_timeout: float = 0.0) -> None:
        """Refuse new requests, wait up to ``drain_timeout`` for admitted ones, then stop."""
        if self._runner is None:
            return
        if drain_timeout > 0 and not await self.driver.drain(drain_timeout):
            log.warning("drain timed out with requests in flight; they get UNAVAILABLE")
        runner, self._runner = self._runner, None
        await runner.cleanup()


class GatewayThread:
    """A gateway on its own event loop in a daemon thread. Context manager."""

    def __init__(self, cfg: GatewayConfig, core: SchedulerCore | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._args = (cfg, core, clock)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="headrace-gateway", daemon=True)
        self.gateway: Gateway | None = None

    def call(self, coro, timeout: float | None = 60.0):  # noqa: ANN001, ANN201  (runs coro on the loop)
        fut: Future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def __enter__(self) -> Gateway:
        self._thread.start()

        async def make() -> Gateway:
            gw = Gateway(*self._args)
            await gw.start()
            return gw

        try:
            self.gateway = self.call(make(), timeout=self._args[0].startup_timeout_s + 10)
        except BaseException:
            self._shutdown()
            raise
        return self.gateway

    def __exit__(self, *exc: object) -> None:
        try:
            if self.gateway is not None:
                self.call(self.gateway.stop(), timeout=30)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()
