"""The gateway as one object: config -> policy core + driver + HTTP front door + gRPC server.

:class:`Gateway` owns them all: ``start()`` starts the driver (replica channels, health
probes), then the gRPC and HTTP listeners (over TLS when ``tls:`` is set; ``/metrics`` on its
own listener when ``metrics_listen:`` is); ``stop()`` drains and stops them in reverse, then
writes what the access log holds and exports the last spans. Its certificates and tenants'
keys are read when it is made, so a bad one is a :class:`~gateway.errors.ConfigError` before
any port is opened; so is tracing turned on without OpenTelemetry installed, and an access
log file that cannot be opened is an :class:`OSError` naming ``access_log.path``.
:class:`GatewayThread` runs a gateway on a background event loop (tests, benchmarks, embedding).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc

from gateway.config import ServedModel, ServedReplica, resolve, scheduler_config
from gateway.driver import Driver
from gateway.frontdoor.decode import Decoder
from gateway.frontdoor.grpc import create_server
from gateway.frontdoor.http import HttpFrontDoor, metrics_door, openai_refusal
from gateway.frontdoor.httpserver import HttpServer
from gateway.frontdoor.limits import Limits, ensure_fd_room
from gateway.frontdoor.security import load_security
from gateway.frontdoor.stats import ServerInfo
from gateway.llm.relay import LlmService
from gateway.observe.accesslog import AccessLog
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.request import Observer
from gateway.observe.tracing import Tracing, make_tracing
from gateway.policy.scheduler import EdfScheduler
from gateway.policy.types import SchedulerCore
from profiles.gateway_config import GatewayConfig, LlmModelConfig, LlmReplicaConfig
from profiles.schema import LimitsSpec

log = logging.getLogger("headrace.gateway")
_METRICS_MAX_BODY = 64 << 10  # the metrics listener reads no bodies
# the metrics listener serves a few scrapers (one keep-alive connection each) and probes: room
# for 256 of them, 16 from one address, each closed after 15 s idle (a scraper connects again)
_METRICS_LIMITS = LimitsSpec(max_connections=256, probe_connections=16, max_address_connections=16,
                             header_timeout_s=5.0, body_timeout_s=5.0, idle_timeout_s=15.0,
                             max_buffered_bytes=1 << 20, max_client_buffered_bytes=1 << 20)
_METRICS_BOUNDED = ("max_connections", "probe_connections", "max_address_connections", "max_header_bytes",
                    "max_headers", "max_url_bytes", "header_timeout_s", "body_timeout_s", "idle_timeout_s")


def metrics_limits(limits: LimitsSpec) -> LimitsSpec:
    """The metrics listener's limits: :data:`_METRICS_LIMITS`, or the gateway's own ``limits``
    where they are tighter (a connection cap, a timeout, the connections of one address)."""
    return _METRICS_LIMITS.model_copy(update={k: min(getattr(limits, k), getattr(_METRICS_LIMITS, k))
                                              for k in _METRICS_BOUNDED})


def make_core(cfg: GatewayConfig) -> SchedulerCore:
    """The policy core of ``cfg``; :class:`ConfigError` names a bad ``scheduler.<key>``."""
    return EdfScheduler(scheduler_config(cfg.scheduler))


def access_log(cfg: GatewayConfig) -> AccessLog | None:
    """The access log ``cfg`` asks for (None: off), a relative path read from its YAML's folder."""
    spec = cfg.access_log
    if spec.path is not None and cfg.base_dir is not None and not Path(spec.path).is_absolute():
        spec = spec.model_copy(update={"path": str(cfg.base_dir / spec.path)})
    return AccessLog.from_settings(spec)


def check_bindable(what: str, host: str, port: int, reuse_port: bool = False) -> None:
    """Bind ``host:port`` once and let it go: :class:`OSError` naming them when the address is
    not this host's or the port is taken (``reuse_port``: taken by a listener that does not
    share it). Asked before the listeners (and before waiting for the replicas), so a bad
    address is one clear line at once rather than grpc's own logging."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, addr = infos[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listeners do
            if reuse_port:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(addr)
    except OSError as e:
        raise bind_error(what, host, port, e) from None


def bind_error(what: str, host: str, port: int, e: BaseException) -> OSError:
    reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    return OSError(f"cannot bind {what} to {host}:{port}: {reason}")


class Gateway:
    """The gateway bound to its ports. ``await start()``, then ``await stop()``.
    ``replica_factory``: how replica clients are made (tests pass fakes; see :class:`Driver`).
    ``reuse_port``: the HTTP and gRPC ports are shared with other gateway processes on this
    host (SO_REUSEPORT; :mod:`gateway.workers`); the metrics listener never is."""

    def __init__(self, cfg: GatewayConfig, core: SchedulerCore | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 replica_factory: Callable[[str, str], Any] | None = None, reuse_port: bool = False) -> None:
        self.cfg = cfg
        self.reuse_port = reuse_port
        models = resolve(cfg)
        self.security = load_security(cfg, base_dir=cfg.base_dir, clock=clock)
        self.driver = Driver(
            models, core or make_core(cfg), clock=clock, metrics=GatewayMetrics(),
            health_interval=cfg.health_interval_s, max_message_bytes=cfg.max_message_bytes,
            expose_replicas=cfg.expose_replicas, replica_factory=replica_factory, limits=cfg.limits,
        )
        self.tracing: Tracing | None = make_tracing(cfg.tracing)
        self.driver.tracing = self.tracing
        self.llm = LlmService(cfg.llm_models, self.driver.metrics, clock, routing=cfg.llm_routing,
                              base_dir=cfg.base_dir, flow=cfg.flow_control)
        # None when the access log and tracing are both off: the front doors then see nothing
        self.observer = Observer.of(access_log(cfg), self.tracing, clock)
        self.info = ServerInfo([m.name for m in models], default_version=self.driver.fleet.default_version,
                               stats=self.driver.stats)
        tls = self.security.tls
        self.decoder = Decoder()  # both doors' large infer requests, decoded off the loop
        door = HttpFrontDoor(self.driver, self.info, cfg.max_message_bytes, cfg.limits.max_json_depth,
                             self.security.tenants, serve_metrics=cfg.metrics_listen is None,
                             observer=self.observer, llm=self.llm, decoder=self.decoder)
        self._http = HttpServer(door, cfg.max_message_bytes, clock, limits=cfg.limits,
                                ssl_context=None if tls is None else tls.ssl_context(),
                                stream_write_timeout_s=cfg.write_timeout_s)
        if self.security.tenants is not None:
            self._http.identify = door.body_client  # keys checked before bodies are read
        if self.observer is not None:
            self._http.on_refusal = self.observer.http_refused
        if cfg.llm_models:
            self._http.refusal_shape = openai_refusal
        self._metrics = None if cfg.metrics_listen is None else HttpServer(
            metrics_door(self.driver, self.llm), _METRICS_MAX_BODY, clock, limits=metrics_limits(cfg.limits))
        self._grpc: grpc.aio.Server | None = None
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = 0

    @property
    def http_url(self) -> str:
        return f"{self.cfg.listen.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.cfg.listen.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str | None:
        """host:port of the metrics listener (None: /metrics is on the HTTP port)."""
        m = self.cfg.metrics_listen
        return None if m is None else f"{m.host}:{self.metrics_port}"

    async def start(self) -> None:
        """Start the driver, then the listeners; an address that cannot be bound is an
        :class:`OSError` naming it (before the replicas are waited for)."""
        host, listen, mlisten = self.cfg.listen.host, self.cfg.listen, self.cfg.metrics_listen
        check_bindable("gRPC", host, listen.grpc_port, self.reuse_port)
        check_bindable("HTTP", host, listen.http_port, self.reuse_port)
        if mlisten is not None:
            check_bindable("metrics", mlisten.host, mlisten.port)
        await self.driver.start(self.cfg.startup_timeout_s)
        try:
            ensure_fd_room(Limits.of(self.cfg.limits, self.cfg.max_message_bytes), others=self._other_connections())
            await self.llm.start()
            self._grpc = create_server(self.driver, self.info, self.cfg.max_message_bytes, self.security.tenants,
                                       self.observer, self.reuse_port, self.llm, self.cfg.limits, self.decoder,
                                       write_timeout_s=self.cfg.write_timeout_s)
            addr, tls = f"{host}:{listen.grpc_port}", self.security.tls
            try:
                self.grpc_port = (self._grpc.add_insecure_port(addr) if tls is None
                                  else self._grpc.add_secure_port(addr, tls.grpc_credentials()))
            except RuntimeError as e:  # grpc's "Failed to bind to address"
                raise bind_error("gRPC", host, listen.grpc_port, e) from None
            if self.grpc_port == 0:
                raise OSError(f"cannot bind gRPC to {host}:{listen.grpc_port}")
            await self._grpc.start()
            try:
                self.http_port = await self._http.start(host, listen.http_port, self.reuse_port)
            except (OSError, OverflowError) as e:
                raise bind_error("HTTP", host, listen.http_port, e) from None
            if self._metrics is not None and mlisten is not None:
                try:
                    self.metrics_port = await self._metrics.start(mlisten.host, mlisten.port)
                except (OSError, OverflowError) as e:
                    raise bind_error("metrics", mlisten.host, mlisten.port, e) from None
        except BaseException:
            await self._shutdown()
            raise

    def _other_connections(self) -> int:
        """Connections the gRPC and metrics listeners may hold at once besides the HTTP port's."""
        m = self.cfg.limits.grpc_max_connections
        if self.cfg.metrics_listen is not None:
            mlim = metrics_limits(self.cfg.limits)
            m += mlim.max_connections + mlim.probe_connections
        return m

    def replica_ids(self) -> dict[str, list[str]]:
        """What the gateway serves: each model's replica ids (generative models' included)."""
        return {**self.driver.fleet.replica_ids(), **self.llm.replica_ids()}

    async def add_replica(self, model: ServedModel, replica: ServedReplica) -> None:
        """Serve ``replica`` of ``model`` from now on (see :meth:`Driver.add_replica`); a new
        model shows in the repository index and statistics."""
        await self.driver.add_replica(model, replica)
        self._sync_models()

    def add_llm_replica(self, model: LlmModelConfig, replica: LlmReplicaConfig) -> str:
        """Serve generative ``model`` on engine ``replica`` from now on (a new model is
        addressable at once); its replica id."""
        return self.llm.add_replica(model, replica).id

    async def remove_replica(self, replica_id: str, timeout: float = 30.0, keep_model: bool = False) -> bool:
        """Drain and remove a replica (see :meth:`Driver.remove_replica`); a model left
        without replicas is no longer served unless ``keep_model``. A generative model's
        replica takes no new request and its open streams go on to their end, up to
        ``timeout`` (those still open then are aborted at the engine)."""
        if self.llm.find(replica_id) is not None:
            return await self.llm.remove_replica(replica_id, timeout)
        try:
            return await self.driver.remove_replica(replica_id, timeout, keep_model)
        finally:
            self._sync_models()

    def _sync_models(self) -> None:
        served = self.driver.fleet.models
        self.info.models = [n for n in self.info.models if n in served] + [
            n for n in served if n not in self.info.models]

    async def stop(self, drain_timeout: float = 0.0) -> None:
        """Refuse new requests, wait up to ``drain_timeout`` for admitted ones, then stop."""
        if drain_timeout > 0:
            start = time.monotonic()
            if not await self.driver.drain(drain_timeout):
                log.warning("drain timed out with requests in flight; they get UNAVAILABLE")
            if not await self.llm.drain(max(0.0, drain_timeout - (time.monotonic() - start))):
                log.warning("drain timed out with generative streams open; they are aborted at their engines")
        await self._shutdown()

    async def _shutdown(self) -> None:
        # the driver answers whatever is still pending (UNAVAILABLE) before the listeners go,
        # so every handler has its answer to write
        self.driver.draining = True
        self._http.close()
        await self.driver.stop()
        await self._http.stop(timeout=1.0)
        await self.llm.stop()
        if self._metrics is not None:
            await self._metrics.stop(timeout=1.0)
        if self._grpc is not None:
            grpc_server, self._grpc = self._grpc, None
            await grpc_server.stop(grace=1.0)
        await self.decoder.close()
        if self.observer is not None:  # every answer is given: its line and spans go out
            self.observer.close()


class GatewayThread:
    """A gateway on its own event loop in a daemon thread. Context manager."""

    def __init__(self, cfg: GatewayConfig, core: SchedulerCore | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 replica_factory: Callable[[str, str], Any] | None = None) -> None:
        self._args = (cfg, core, clock, replica_factory)
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
