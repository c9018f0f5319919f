"""KServe v2 transports for the drivers: each sends one pre-built request for a model and
returns ``(outcome, variant, pool_wait_s)``, where outcome is ``stats.OK``, ``stats.REJECTED`` (HTTP 429 /
gRPC RESOURCE_EXHAUSTED, or 503 / UNAVAILABLE carrying headrace's reject-reason, as while no
replica is up), ``stats.EXPIRED`` (a 429 whose reject-reason says the request expired in the
queue) or an error kind (``http_503``, ``grpc_unavailable``, ``timeout``, ``connection``,
``http_protocol``), and ``pool_wait_s`` is how long the request waited for a free connection
of the client's own pool before it was written (None where the transport cannot tell: gRPC
multiplexes one channel).

Every request carries a *deadline* on the loop clock (the driver's scheduled send plus the
request timeout): a request still queued for a connection, or still in flight, at its deadline
is answered ``timeout``. The client's queue never keeps a request longer than the timeout.

- :class:`RawHttpClient`: a keep-alive pool of HTTP/1.1 connections (``gateway.backends.http1``,
  the framing the gateway's Triton client uses) writing pre-built requests; the cheapest per
  request, so one process keeps the tightest schedule.
- :class:`AiohttpClient`: the same over aiohttp's client.
- :class:`GrpcClient`: grpc.aio with pre-serialized ``ModelInferRequest`` bytes.
Also the probes run before a test: reachability and model metadata.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import os
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from gateway.backends.http1 import Connection, Headers, request_head
from gateway.errors import REASON_HEADER
from loadgen.payload import HttpBody, variant_from_grpc, variant_from_http
from loadgen.stats import OK, refusal

T = TypeVar("T")
GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"
GRPC_MAX_MESSAGE = 256 * 1024 * 1024


class LoadError(RuntimeError):
    """The test cannot run (unreachable target, unknown model, bad input); one-line message."""


Answer = tuple[str, "str | None", "float | None"]  # (outcome, variant, pool wait s)


class Client(Protocol):
    async def infer(self, model_idx: int, deadline: float = math.inf) -> Answer:
        """Send one request for ``model_idx``; give up at ``deadline`` (loop clock)."""
        ...

    async def close(self) -> None: ...


class Turns(Generic[T]):
    """Per model, the payloads sent in turn (a single one is sent every time)."""

    __slots__ = ("items", "next")

    def __init__(self, items: list[list[T]]) -> None:
        if any(not xs for xs in items):
            raise ValueError("every model needs at least one payload")
        self.items = items
        self.next = [0] * len(items)

    def take(self, model_idx: int) -> T:
        xs = self.items[model_idx]
        k = self.next[model_idx]
        self.next[model_idx] = k + 1
        return xs[k % len(xs)]


def http_outcome(status: int, reason: str | None = None) -> str:
    """429 is a refusal; so is a 503 that says why (headrace's answer while no replica is up,
    ``no_replica``): the server answered, on purpose. A bare 503 is an error."""
    if status == 200:
        return OK
    if status == 429 or (status == 503 and reason is not None):
        return refusal(reason)
    return f"http_{status}"


# ---- raw HTTP/1.1 keep-alive pool -------------------------------------------------------------

Done = Callable[[str, "str | None", "float | None"], None]  # (outcome, variant, pool wait s)


_REASON = REASON_HEADER.encode()
_HEADER_LEN = b"inference-header-content-length"


class _Conn(Connection):
    """One connection of a :class:`RawHttpClient`; its request in flight is answered
    through ``done``."""

    __slots__ = ("pool", "done", "deadline", "waited")

    def __init__(self, pool: RawHttpClient) -> None:
        super().__init__(GRPC_MAX_MESSAGE)
        self.pool = pool
        self.done: Done | None = None
        self.deadline = math.inf  # of the request in flight (loop clock)
        self.waited = 0.0  # how long the request in flight waited for this connection

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.pool._lost(self)

    def answered(self, status: int, headers: Headers, body: bytes) -> None:
        if status == 200:
            hlen = headers.get(_HEADER_LEN)
            variant = variant_from_http(body, int(hlen) if hlen is not None and hlen.isdigit() else None)
            outcome = OK
        else:
            reason = headers.get(_REASON) if status in (429, 503) else None
            variant, outcome = None, http_outcome(status, None if reason is None else reason.decode())
        if self.pool._now() > self.deadline:  # answered after the client gave up
            variant, outcome = None, "timeout"
        done, self.done = self.done, None
        self.pool._release(self)
        if done is not None:
            done(outcome, variant, self.waited)

    def failed(self, e: Exception) -> None:
        if isinstance(e, TimeoutError):
            outcome = "timeout"  # its deadline passed in flight
        elif isinstance(e, ValueError):
            outcome = "http_protocol"  # an answer it cannot read
        else:
            outcome = "connection"
        done, self.done = self.done, None
        if done is not None:
            done(outcome, None, self.waited)


class RawHttpClient:
    """Pre-built HTTP/1.1 requests over a pool of keep-alive connections, callback-driven:
    ``send(model_idx, done, deadline)`` writes at once when a connection is idle, else queues
    FIFO. The time queued is the request's *pool wait*, reported with its answer (and, in the
    open loop, counted in its latency from the scheduled send, as it should be). No task or
    future per request: one sweeper times out queued and in-flight requests at their
    deadlines, within ``sweep_period`` (a quarter of the timeout, at most 0.1 s)."""

    def __init__(
        self,
        host: str,
        port: int,
        bodies: list[list[HttpBody]],
        connections: int,
        timeout_s: float,
        ssl: Any = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.host, self.port, self.limit, self.timeout_s = host, port, connections, timeout_s
        self.ssl = ssl  # an ssl.SSLContext for https, else None
        self.requests = Turns([[_raw_request(host, port, b) for b in bs] for bs in bodies])
        self.idle: collections.deque[_Conn] = collections.deque()
        # (model_idx, done, deadline, queued at)
        self.pending: collections.deque[tuple[int, Done, float, float]] = collections.deque()
        self.conns: set[_Conn] = set()
        self.opening = 0
        self.sweeper: asyncio.Task | None = None
        self.sweep_period = min(0.1, timeout_s / 4)
        self.clock = clock  # default: the running loop's time()

    def _now(self) -> float:
        if self.clock is None:
            self.clock = asyncio.get_running_loop().time
        return self.clock()

    def send(self, model_idx: int, done: Done, deadline: float = math.inf) -> None:
        if self.sweeper is None:
            self.sweeper = asyncio.get_running_loop().create_task(self._sweep())
        idle = self.idle
        while idle:
            c = idle.pop()
            if not c.closed:
                self._write(c, model_idx, done, deadline, 0.0)
                return
        self.pending.append((model_idx, done, deadline, self._now()))
        if len(self.conns) + self.opening < self.limit:
            self._open_one()

    async def infer(self, model_idx: int, deadline: float = math.inf) -> Answer:
        fut = asyncio.get_running_loop().create_future()
        self.send(model_idx, lambda o, v, w: fut.done() or fut.set_result((o, v, w)), deadline)
        return await fut

    def _write(self, c: _Conn, model_idx: int, done: Done, deadline: float, waited: float) -> None:
        c.done, c.deadline, c.waited = done, deadline, waited
        c.send((self.requests.take(model_idx),))

    def _open_one(self) -> None:
        self.opening += 1
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, c = await loop.create_connection(
                lambda: _Conn(self), self.host, self.port, ssl=self.ssl
            )
        except OSError:  # ssl.SSLError is one too
            self.opening -= 1
            if self.pending:  # fail one waiter per failed attempt, so errors are counted
                _, done, _, queued = self.pending.popleft()
                done("connection", None, self._now() - queued)
            if self.pending and len(self.conns) + self.opening < self.limit:
                self._open_one()
            return
        self.opening -= 1
        self.conns.add(c)
        self._release(c)

    def _release(self, c: _Conn) -> None:
        if c.closed:
            self._lost(c)
            return
        pending = self.pending
        if pending:
            now = self._now()
            while pending and pending[0][2] <= now:  # never write a request already given up
                _, done, _, queued = pending.popleft()
                done("timeout", None, now - queued)
        if pending:
            mi, done, deadline, queued = pending.popleft()
            self._write(c, mi, done, deadline, now - queued)
        else:
            self.idle.append(c)

    def _lost(self, c: _Conn) -> None:
        if c in self.conns:
            self.conns.discard(c)
            if self.pending and len(self.conns) + self.opening < self.limit:
                self._open_one()

    def expire(self, now: float) -> int:
        """Answer ``timeout`` to every request whose deadline is ``now`` or earlier, queued or
        in flight (an in-flight one's connection is dropped: HTTP/1.1 cannot cancel a request
        on a kept-alive connection). Returns how many timed out."""
        n = 0
        pending = self.pending
        # NOTE: deadlines are non-decreasing along the FIFO queue (each is the send's due time
        # plus the same timeout, and requests are queued in due order), so the expired ones
        # are all at its head
        while pending and pending[0][2] <= now:
            _, done, _, queued = pending.popleft()
            done("timeout", None, now - queued)
            n += 1
        for c in list(self.conns):
            if c.done is not None and c.deadline <= now:
                c.refuse(TimeoutError())
                n += 1
        return n

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_period)
            self.expire(self._now())

    async def close(self) -> None:
        if self.sweeper is not None:
            self.sweeper.cancel()
        for c in list(self.conns):
            if c.transport is not None:
                c.transport.close()
        while self.pending:
            _, done, _, queued = self.pending.popleft()
            done("connection", None, self._now() - queued)
        self.idle.clear()


def _raw_request(host: str, port: int, b: HttpBody) -> bytes:
    headers = "".join(f"{k}: {v}\r\n" for k, v in b.headers).encode()
    return request_head(b"POST", b.path.encode(), f"{host}:{port}".encode(), len(b.body), headers) + b.body


# ---- aiohttp ----------------------------------------------------------------------------------


class AiohttpClient:
    """aiohttp with at most ``connections`` requests in flight; a request waits for a slot
    (its pool wait) and is cancelled at its deadline, queued or not."""

    def __init__(
        self,
        host: str,
        port: int,
        bodies: list[list[HttpBody]],
        connections: int,
        timeout_s: float,
        ssl: Any = None,
    ) -> None:
        import aiohttp

        self.base = f"{'https' if ssl is not None else 'http'}://{host}:{port}"
        self.bodies = Turns([[(self.base + b.path, b.body, dict(b.headers)) for b in bs]
                             for bs in bodies])  # fmt: skip
        self.slots = asyncio.Semaphore(connections)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, ssl=ssl if ssl is not None else True),
            timeout=aiohttp.ClientTimeout(total=timeout_s),  # a backstop: deadlines come first
        )

    async def infer(self, model_idx: int, deadline: float = math.inf) -> Answer:
        import aiohttp

        loop = asyncio.get_running_loop()
        url, body, headers = self.bodies.take(model_idx)
        queued = loop.time()
        waited: float | None = None
        try:
            async with asyncio.timeout_at(deadline if math.isfinite(deadline) else None):
                async with self.slots:
                    waited = loop.time() - queued
                    async with self.session.post(url, data=body, headers=headers) as resp:
                        data = await resp.read()
                        if resp.status != 200:
                            reason = resp.headers.get(REASON_HEADER)
                            return http_outcome(resp.status, reason), None, waited
                        h = resp.headers.get("Inference-Header-Content-Length")
                        return OK, variant_from_http(data, int(h) if h else None), waited
        except TimeoutError:
            return "timeout", None, waited if waited is not None else loop.time() - queued
        except (aiohttp.ClientError, OSError):
            return "connection", None, waited

    async def close(self) -> None:
        await self.session.close()


# ---- gRPC -------------------------------------------------------------------------------------


class GrpcClient:
    """grpc.aio over one channel (HTTP/2 streams: no pool of its own to wait for); each call's
    timeout is what is left of its deadline, and a request already past it is not sent."""

    def __init__(
        self,
        host: str,
        port: int,
        requests: list[list[bytes]],
        timeout_s: float,
        credentials: Any = None,
        metadata: list[tuple[tuple[str, str], ...]] | None = None,
    ) -> None:
        import grpc

        self.grpc = grpc
        target = f"{host}:{port}"
        options = [
            ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
            ("grpc.max_send_message_length", GRPC_MAX_MESSAGE),
        ]
        self.channel = (
            grpc.aio.secure_channel(target, credentials, options=options)
            if credentials is not None
            else grpc.aio.insecure_channel(target, options=options)
        )
        # NOTE: requests are serialized once; the identity (de)serializers pass bytes through
        self.call = self.channel.unary_unary(GRPC_METHOD)
        self.requests = Turns(requests)
        self.metadata = metadata or [() for _ in requests]  # per model: (key, value) pairs
        self.timeout_s = timeout_s

    async def infer(self, model_idx: int, deadline: float = math.inf) -> Answer:
        grpc = self.grpc
        timeout = self.timeout_s
        if math.isfinite(deadline):
            timeout = deadline - asyncio.get_running_loop().time()
            if timeout <= 0:
                return "timeout", None, None
        try:
            raw = await self.call(
                self.requests.take(model_idx), timeout=timeout, metadata=self.metadata[model_idx] or None
            )
        except grpc.aio.AioRpcError as e:
            code = e.code()
            reason = dict(e.trailing_metadata() or ()).get(REASON_HEADER)
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED or (
                code == grpc.StatusCode.UNAVAILABLE and reason
            ):
                return refusal(reason), None, None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return "timeout", None, None
            return f"grpc_{code.name.lower()}", None, None
        return OK, variant_from_grpc(raw), None

    async def close(self) -> None:
        await self.channel.close()


# ---- probes -----------------------------------------------------------------------------------


Keys = dict[str, tuple[tuple[str, str], ...]]  # model -> its auth header / metadata pairs


async def probe_http(
    host: str,
    port: int,
    models: tuple[str, ...],
    timeout_s: float = 5.0,
    ssl: Any = None,
    keys: Keys | None = None,
) -> dict:
    """Check the server is ready and return ``{model: metadata}``; raise LoadError if not."""
    import aiohttp

    base = f"{'https' if ssl is not None else 'http'}://{host}:{port}"
    out: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            connector=aiohttp.TCPConnector(ssl=ssl if ssl is not None else True),
        ) as s:
            async with s.get(base + "/v2/health/ready") as r:
                if r.status != 200:
                    text = await r.text()
                    why = f": {_err(text)}" if text else ""
                    raise LoadError(
                        f"target {base} is not ready (GET /v2/health/ready: {r.status}{why})"
                    )
            for m in models:
                headers = dict((keys or {}).get(m, ()))
                async with s.get(f"{base}/v2/models/{m}", headers=headers) as r:
                    text = await r.text()
                    if r.status != 200:
                        raise LoadError(f"model {m!r} unavailable at {base} ({r.status}: "
                                        f"{_err(text)}){_hint(r.status, headers)}")  # fmt: skip
                    out[m] = json.loads(text) if text else {}
    except aiohttp.ClientSSLError as e:
        raise LoadError(f"TLS with {base} failed: {_tls_reason(e)}") from None
    except aiohttp.ServerDisconnectedError:
        why = " (a TLS server closes plain connections: --ssl?)" if ssl is None else ""
        raise LoadError(f"cannot reach {base}: the server hung up{why}") from None
    except (aiohttp.ClientConnectionError, OSError) as e:
        raise LoadError(f"cannot reach {base}: {_reason(e)}") from None
    except TimeoutError:
        raise LoadError(f"cannot reach {base}: no answer within {timeout_s:g} s") from None
    return out


def _hint(status: int, headers: dict[str, str]) -> str:
    if status != 401:
        return ""
    return "; the key was refused" if headers else "; the target wants an API key: --api-key"


def _tls_reason(e: BaseException) -> str:
    cause = getattr(e, "os_error", None) or getattr(e, "__cause__", None) or e
    return getattr(cause, "verify_message", None) or getattr(cause, "reason", None) or str(cause)


async def probe_grpc(
    host: str,
    port: int,
    models: tuple[str, ...],
    timeout_s: float = 5.0,
    credentials: Any = None,
    keys: Keys | None = None,
) -> dict:
    import grpc
    from google.protobuf import json_format
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg

    target = f"grpc://{host}:{port}"
    out: dict[str, Any] = {}
    channel = (
        grpc.aio.secure_channel(f"{host}:{port}", credentials)
        if credentials is not None
        else grpc.aio.insecure_channel(f"{host}:{port}")
    )
    async with channel as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        try:
            r = await stub.ServerReady(pb.ServerReadyRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            why = (e.details() or "").split(";")[0]
            raise LoadError(f"cannot reach {target}: {e.code().name} ({why})") from None
        if not r.ready:
            raise LoadError(f"target {target} is not ready")
        for m in models:
            metadata = (keys or {}).get(m, ())
            try:
                md = await stub.ModelMetadata(pb.ModelMetadataRequest(name=m), timeout=timeout_s,
                                              metadata=metadata or None)  # fmt: skip
            except grpc.aio.AioRpcError as e:
                hint = _hint(401, dict(metadata)) if e.code() == grpc.StatusCode.UNAUTHENTICATED else ""
                raise LoadError(f"model {m!r} unavailable at {target} ({e.details()}){hint}") from None
            d = json_format.MessageToDict(md, preserving_proto_field_name=True)
            for t in d.get("inputs", []):
                t["shape"] = [int(x) for x in t.get("shape", [])]
            out[m] = d
    return out


def _err(text: str) -> str:
    try:
        return str(json.loads(text).get("error", text))[:200]
    except (ValueError, AttributeError):
        return text[:200]


def _reason(e: BaseException) -> str:
    cause = getattr(e, "os_error", None) or e
    errno = getattr(cause, "errno", None)
    if errno:
        return os.strerror(errno).lower()
    return str(cause) or type(e).__name__
