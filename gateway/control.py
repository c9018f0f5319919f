"""The gateway's control channel: an operator in another process changes a running gateway.

:class:`ControlServer` serves it beside the gateway, on the gateway's event loop, on a loopback
address only. Every call needs ``Authorization: Bearer <token>`` (compared in constant time,
never logged); without it, or with a wrong one, the answer is 401 and nothing changes. Bodies
are JSON, at most 8 MiB. Errors are ``{"error": "<one line>"}``: 400 for a bad body, query
value or config, 404 for a replica or route that is not there, 409 for a change the gateway
refuses (a repeated replica id, a variant whose signature differs, a replica that cannot be
reached, a generative model that still has engines).

Routes, under ``/v1/control/``:

- ``GET state``: ``{"http", "grpc", "pid", "replicas": {id: healthy}, "llm_replicas": {id:
  taking requests (reachable, not draining)}, "models": {replica id: its model}}``; with
  ``?counters=1`` also ``"counters"``, as ``GET counters`` gives them
- ``POST replicas``: ``{"config": <GatewayConfig>, "model": name, "base_dir": path | null}``:
  serve the first replica of ``model`` in ``config`` (relative profile paths are read from
  ``base_dir``); answers ``{"added": id}``
- ``DELETE replicas/{id}?timeout=S&keep_model=0|1``: drain it (up to S seconds, default 30) and
  forget it; ``{"removed": drained in time}``
- ``PUT llm/models``: a generative model's settings (``LlmModelConfig``)
- ``POST llm/replicas``: ``{"model": <LlmModelConfig>, "replica": <LlmReplicaConfig>}``;
  answers ``{"added": id}``
- ``DELETE llm/models/{name}``: stop serving a generative model with no engine left
- ``GET counters``: ``[[name, labels, value], ...]``, every ``*_total`` sample of the metrics
- ``PUT cold``: ``{"waits": {model: seconds}}``: hold the requests of those models while they
  have no replica (:class:`~gateway.coldstart.ColdStart`)
- ``GET cold?wait=S``: ``{"models": [...]}``, the held models whose requests asked for a
  replica since the last call, waiting up to S seconds (at most 60) for one; ``[]`` if none came
- ``POST stop``: ``{"drain_timeout": s}`` (default: the config's ``drain_timeout_s``): the
  gateway drains and its process exits once the answer is sent

:class:`RemoteHandle` is the operator's side: a :class:`~gateway.handle.GatewayHandle` over
this channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import math
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ValidationError
from yarl import URL

from gateway.config import parse_config
from gateway.errors import ConfigError, GatewayError
from gateway.handle import LocalHandle, Sample, Seen, first_replica
from profiles.gateway_config import GatewayConfig, LlmModelConfig, LlmReplicaConfig
from profiles.schema import format_error

if TYPE_CHECKING:
    from gateway.app import Gateway

log = logging.getLogger("headrace.gateway.control")
PREFIX = "/v1/control"
MAX_BODY = 8 << 20
MAX_COLD_WAIT_S = 60.0
MAX_TIMEOUT_S = 3600.0
M = TypeVar("M", bound=BaseModel)


class ControlError(RuntimeError):
    """A control call refused or not answered; ``status`` is its HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def check_loopback(host: str, where: str = "control channel") -> None:
    """:class:`ConfigError` unless ``host`` is a loopback address (the channel changes what the
    gateway serves: only processes on this host may reach it)."""
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(f"{where}: {host!r} is not a loopback address (use 127.0.0.1 or ::1)")


@dataclass(frozen=True)
class ControlListen:
    """Where the control channel listens (a loopback host; port 0: a free one) and its token."""

    host: str
    port: int
    token: str = field(repr=False)


def parse_listen(value: str, where: str = "--control-listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) on a loopback host; port 0 picks a free one."""
    host, colon, port = value.rpartition(":")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{where}: expected HOST:PORT with a port 0-65535, got {value!r}")
    check_loopback(host, where)
    return host.strip("[]"), int(port)


def read_token(path: str | Path | None, where: str = "--control-token-file") -> str:
    """The control token: ``path``'s content stripped, else ``HEADRACE_CONTROL_TOKEN``;
    :class:`ConfigError` when neither gives one."""
    if path is not None:
        try:
            token = Path(path).read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{where}: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
        if not token:
            raise ConfigError(f"{where}: {path} is empty")
        return token
    token = os.environ.get("HEADRACE_CONTROL_TOKEN", "").strip()
    if not token:
        raise ConfigError(f"{where} (or HEADRACE_CONTROL_TOKEN) is required with --control-listen")
    return token


def write_ready_file(path: str | Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` as JSON to ``path`` at once: a reader sees the whole file or none."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc) + "\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- server


class ColdRequests:
    """The held models whose requests asked for a replica, until the operator reads them."""

    def __init__(self) -> None:
        self._pending: dict[str, None] = {}  # in the order asked
        self._changed = asyncio.Event()
        self.closed = False

    def ask(self, model: str) -> None:
        """:class:`ColdStart`'s starter: a request for ``model`` waits for a replica."""
        self._pending[model] = None
        self._changed.set()

    async def take(self, wait: float) -> list[str]:
        """The models asked for since the last call, waiting up to ``wait`` seconds for one."""
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        while not self._pending and not self.closed:
            left = end - loop.time()
            if left <= 0:
                return []
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        out = list(self._pending)
        self._pending.clear()
        return out

    def close(self) -> None:
        """Answer every waiting call now (the channel is closing)."""
        self.closed = True
        self._changed.set()


def _samples(doc: Any) -> list[Sample]:
    return [(str(n), dict(labels), float(v)) for n, labels, v in doc]


def _one_line(msg: str) -> str:
    return "; ".join(line.strip() for line in msg.splitlines() if line.strip()) or "error"


def _error(status: int, msg: str) -> web.Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return web.json_response({"error": _one_line(msg)}, status=status, headers=headers)


def _number(request: web.Request, name: str, default: float, top: float) -> float:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise ControlError(f"{name}: a number of seconds >= 0, got {raw!r}", 400)
    return min(v, top)


def _flag(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "0")
    if raw not in ("0", "1", "true", "false"):
        raise ControlError(f"{name}: 0 or 1, got {raw!r}", 400)
    return raw in ("1", "true")


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        doc = json.loads(await request.read() or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise ControlError(f"the body is not JSON: {e}", 400) from None
    if not isinstance(doc, dict):
        raise ControlError(f"the body must be a JSON object, got {type(doc).__name__}", 400)
    return doc


def _model(kind: type[M], doc: Any, where: str) -> M:
    try:
        return kind.model_validate(doc)
    except ValidationError as e:
        raise ControlError(format_error(e, where), 400) from None


class ControlServer:
    """The control channel of ``gateway``, on its event loop. ``on_stop(drain_timeout)`` is
    called once ``POST stop`` is answered (``headrace serve`` then drains and exits)."""

    def __init__(self, gateway: Gateway, token: str, on_stop: Callable[[float], object]) -> None:
        if not token:
            raise ConfigError("control channel: the token is empty")
        self.gateway = gateway
        self.local = LocalHandle(gateway)  # what each call does, as an in-process operator would
        self._token = f"Bearer {token}".encode()
        self.on_stop = on_stop
        self.cold = ColdRequests()
        self.url = ""
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_BODY)
        routes: list[tuple[str, str, Callable[[web.Request], Awaitable[Any]]]] = [
            ("GET", "state", self._state), ("POST", "replicas", self._add_replica),
            ("DELETE", "replicas/{id:.+}", self._remove_replica), ("PUT", "llm/models", self._set_llm_model),
            ("POST", "llm/replicas", self._add_llm_replica), ("DELETE", "llm/models/{name:.+}", self._drop_llm_model),
            ("GET", "counters", self._counters), ("PUT", "cold", self._hold_cold), ("GET", "cold", self._asked_cold),
            ("POST", "stop", self._stop),
        ]
        for method, path, handler in routes:
            app.router.add_route(method, f"{PREFIX}/{path}", self._json(handler))
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (loopback only; port 0: a free one); returns the channel's URL."""
        check_loopback(host)
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            raise OSError(f"cannot bind control channel to {host}:{port}: {e.strerror or e}") from None
        self._runner = runner
        bound = runner.addresses[0][1]
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{bound}"
        return self.url

    async def close(self) -> None:
        self.cold.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # ---- the edge: authentication, and errors as one JSON line
    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                     ) -> web.StreamResponse:
        got = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(got, self._token):
            return _error(401, "missing or wrong control token (Authorization: Bearer ...)")
        try:
            return await handler(request)
        except ControlError as e:
            return _error(e.status, str(e))
        except web.HTTPException as e:  # an unknown route or method, a body over MAX_BODY
            if e.status in (404, 405):
                return _error(e.status, f"no control call {request.method} {request.path}")
            return _error(e.status, e.text or e.reason)
        except Exception as e:
            log.exception("control call %s %s failed", request.method, request.path)
            return _error(500, f"{type(e).__name__}: {e}")

    @staticmethod
    def _json(handler: Callable[[web.Request], Awaitable[Any]]) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def answer(request: web.Request) -> web.Response:
            return web.json_response(await handler(request))

        return answer

    # ---- the routes
    async def _state(self, request: web.Request) -> dict[str, Any]:
        gw = self.gateway
        out = {"http": gw.http_url, "grpc": gw.grpc_url, "pid": os.getpid(),
               "replicas": await self.local.replicas(), "llm_replicas": await self.local.llm_replicas(),
               "models": {rid: r.model for rid, r in gw.driver.replicas.items()}}
        if _flag(request, "counters"):  # what the controller reads each tick, in one call
            out["counters"] = await self.local.counters()
        return out

    async def _add_replica(self, request: web.Request) -> dict[str, Any]:
        doc = await _body(request)
        name, base_dir = doc.get("model"), doc.get("base_dir")
        if not isinstance(name, str):
            raise ControlError("model: the name of a model in config", 400)
        if base_dir is not None and not isinstance(base_dir, str):
            raise ControlError(f"base_dir: a folder path, got {base_dir!r}", 400)
        try:
            served = first_replica(parse_config(doc.get("config"), "config", Path(base_dir) if base_dir else None),
                                   name)
        except (ConfigError, ValueError) as e:
            raise ControlError(str(e), 400) from None
        replica = served.replicas[0]
        try:
            await self.gateway.add_replica(served, replica)
        except (ConfigError, GatewayError, OSError) as e:
            raise ControlError(f"replica '{replica.id}' of model '{name}' refused: {e}", 409) from None
        return {"added": replica.id}

    async def _remove_replica(self, request: web.Request) -> dict[str, Any]:
        rid = request.match_info["id"]
        timeout = _number(request, "timeout", 30.0, MAX_TIMEOUT_S)
        keep = _flag(request, "keep_model")
        try:
            removed = await self.gateway.remove_replica(rid, timeout, keep_model=keep)
        except KeyError:
            raise ControlError(f"replica {rid!r} is not served", 404) from None
        return {"removed": removed}

    async def _set_llm_model(self, request: web.Request) -> dict[str, Any]:
        model = _model(LlmModelConfig, await _body(request), "llm model")
        self.gateway.llm.set_model(model)
        return {"model": model.name}

    async def _add_llm_replica(self, request: web.Request) -> dict[str, Any]:
        doc = await _body(request)
        model = _model(LlmModelConfig, doc.get("model"), "model")
        replica = _model(LlmReplicaConfig, doc.get("replica"), "replica")
        if replica.id is not None and self.gateway.llm.find(replica.id) is not None:
            raise ControlError(f"replica '{replica.id}' is already served", 409)
        try:
            rid = self.gateway.add_llm_replica(model, replica)
        except ValueError as e:  # its profile cannot be found or leaves no KV cache
            raise ControlError(f"engine of model '{model.name}' refused: {e}", 409) from None
        return {"added": rid}

    async def _drop_llm_model(self, request: web.Request) -> dict[str, Any]:
        name = request.match_info["name"]
        try:
            self.gateway.llm.drop_model(name)
        except ValueError as e:
            raise ControlError(str(e), 409) from None
        return {"dropped": name}

    async def _counters(self, request: web.Request) -> list[Sample]:
        return await self.local.counters()

    async def _hold_cold(self, request: web.Request) -> dict[str, Any]:
        waits = (await _body(request)).get("waits")
        if not isinstance(waits, dict) or not all(
                isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
                and math.isfinite(v) and 0 <= v <= MAX_TIMEOUT_S for k, v in waits.items()):
            raise ControlError(f"waits: a mapping of model -> seconds (0-{MAX_TIMEOUT_S:g}), got {waits!r}", 400)
        await self.local.hold_cold({k: float(v) for k, v in waits.items()}, self.cold.ask)
        return {"waits": self.gateway.driver.cold.waits}

    async def _asked_cold(self, request: web.Request) -> dict[str, Any]:
        return {"models": await self.cold.take(_number(request, "wait", 0.0, MAX_COLD_WAIT_S))}

    async def _stop(self, request: web.Request) -> dict[str, Any]:
        drain = (await _body(request)).get("drain_timeout", self.gateway.cfg.drain_timeout_s)
        if not isinstance(drain, int | float) or isinstance(drain, bool) or not 0 <= drain <= 600:
            raise ControlError(f"drain_timeout: seconds (0-600), got {drain!r}", 400)
        asyncio.get_running_loop().call_soon(self.on_stop, float(drain))
        return {"stopping": True, "drain_timeout": float(drain)}


# --------------------------------------------------------------------------- client


class RemoteHandle:
    """A gateway in a process of its own, over its control channel at ``control_url``
    (``http://127.0.0.1:PORT``) with ``token``: a :class:`~gateway.handle.GatewayHandle`.
    ``http_url`` and ``grpc_url`` are where its clients connect (:meth:`connect` reads them).
    ``timeout``: seconds a call may take (a drain or a replica's start adds its own)."""

    def __init__(self, control_url: str, token: str, http_url: str = "", grpc_url: str = "",
                 timeout: float = 60.0, cold_poll_s: float = 30.0) -> None:
        self.control_url = control_url.rstrip("/")
        self.http_url = http_url
        self.grpc_url = grpc_url
        self.pid: int | None = None
        self.timeout = timeout
        self.cold_poll_s = min(cold_poll_s, MAX_COLD_WAIT_S)
        self._auth = {"Authorization": f"Bearer {token}"}
        self._session: aiohttp.ClientSession | None = None
        self._waits: dict[str, float] = {}
        self._starter: Callable[[str], None] | None = None
        self._poller: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, control_url: str, token: str, timeout: float = 60.0) -> RemoteHandle:
        """A handle whose ``http_url``, ``grpc_url`` and ``pid`` are read from the gateway."""
        handle = cls(control_url, token, timeout=timeout)
        try:
            state = await handle.state()
        except BaseException:
            await handle.close()
            raise
        handle.http_url, handle.grpc_url, handle.pid = state["http"], state["grpc"], state["pid"]
        return handle

    async def _call(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None,
                    timeout: float | None = None) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        url = URL(f"{self.control_url}{PREFIX}/{path}", encoded=True)
        what = f"{method} {PREFIX}/{path}"
        try:
            async with self._session.request(
                    method, url, json=body, params=params, headers=self._auth,
                    timeout=aiohttp.ClientTimeout(total=timeout or self.timeout)) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    try:
                        msg = json.loads(text)["error"]
                    except (ValueError, KeyError, TypeError):
                        msg = text.strip()[:200] or resp.reason
                    raise ControlError(f"{what}: {resp.status}: {msg}", resp.status)
                return json.loads(text)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ControlError(f"{what}: no answer from the gateway at {self.control_url}: "
                               f"{type(e).__name__}: {e}") from e
        except ValueError as e:
            raise ControlError(f"{what}: the gateway's answer is not JSON: {e}") from e

    async def state(self) -> dict[str, Any]:
        """The gateway's addresses, process id and replicas (``GET state``)."""
        return await self._call("GET", "state")

    async def add_replica(self, cfg: GatewayConfig, model: str) -> None:
        body = {"config": cfg.model_dump(mode="json"), "model": model,
                "base_dir": None if cfg.base_dir is None else str(cfg.base_dir)}
        await self._call("POST", "replicas", body, timeout=cfg.startup_timeout_s + self.timeout)

    async def remove_replica(self, replica_id: str, timeout: float, keep_model: bool = False) -> bool:
        out = await self._call("DELETE", f"replicas/{quote(replica_id, safe='')}",
                               params={"timeout": repr(float(timeout)), "keep_model": "1" if keep_model else "0"},
                               timeout=timeout + self.timeout)
        return bool(out["removed"])

    async def replicas(self) -> dict[str, bool]:
        return {rid: bool(h) for rid, h in (await self.state())["replicas"].items()}

    async def llm_replicas(self) -> dict[str, bool]:
        return {rid: bool(up) for rid, up in (await self.state())["llm_replicas"].items()}

    async def set_llm_model(self, model: LlmModelConfig) -> None:
        await self._call("PUT", "llm/models", model.model_dump(mode="json"))

    async def add_llm_replica(self, model: LlmModelConfig, replica: LlmReplicaConfig) -> None:
        await self._call("POST", "llm/replicas", {"model": model.model_dump(mode="json"),
                                                  "replica": replica.model_dump(mode="json")})

    async def drop_llm_model(self, name: str) -> None:
        await self._call("DELETE", f"llm/models/{quote(name, safe='')}")

    async def counters(self) -> list[Sample]:
        return _samples(await self._call("GET", "counters"))

    async def look(self) -> Seen:
        state = await self._call("GET", "state", params={"counters": "1"})
        return Seen({rid: bool(h) for rid, h in state["replicas"].items()},
                    {rid: bool(up) for rid, up in state["llm_replicas"].items()}, _samples(state["counters"]))

    async def hold_cold(self, waits: dict[str, float], starter: Callable[[str], None]) -> None:
        """Hold the models in ``waits``; ``starter(model)`` is called on this loop for each one
        whose request asked for a replica (read by one background call that waits for them)."""
        self._waits, self._starter = dict(waits), starter
        await self._call("PUT", "cold", {"waits": self._waits})
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll_cold(), name="headrace-cold-poll")

    async def _poll_cold(self) -> None:
        failing = False
        while True:
            try:
                if failing:  # the gateway may have restarted without them
                    await self._call("PUT", "cold", {"waits": self._waits})
                asked = await self._call("GET", "cold", params={"wait": repr(self.cold_poll_s)},
                                         timeout=self.cold_poll_s + self.timeout)
            except ControlError as e:
                if not failing:
                    log.warning("reading the gateway's cold starts: %s (retrying)", e)
                failing = True
                await asyncio.sleep(1.0)
                continue
            if failing:
                log.info("reading the gateway's cold starts again")
            failing = False
            for model in asked["models"]:
                try:
                    if self._starter is not None:
                        self._starter(model)
                except Exception:
                    log.exception("starting model %r from zero failed", model)

    async def stop(self, drain_timeout: float, wait: bool = True) -> None:
        """Drain and stop the gateway; ``wait``: until its control channel is gone (at most the
        drain plus this handle's ``timeout``)."""
        await self._call("POST", "stop", {"drain_timeout": drain_timeout})
        if not wait:
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + drain_timeout + self.timeout
        while loop.time() < end:
            try:
                await self._call("GET", "state", timeout=max(0.1, end - loop.time()))
            except ControlError as e:
                if e.status == 0:  # no answer: the gateway is gone
                    return
                raise
            await asyncio.sleep(0.05)
        raise ControlError(f"the gateway at {self.control_url} still answers {drain_timeout + self.timeout:g} s "
                           "after it was asked to stop")

    async def close(self) -> None:
        """Stop reading cold starts and close the connection (the gateway runs on)."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
