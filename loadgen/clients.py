"""KServe v2 transports for the drivers: each sends one pre-built request for a model and
returns ``(outcome, variant)``, where outcome is ``stats.OK``, ``stats.REJECTED`` (HTTP 429 /
gRPC RESOURCE_EXHAUSTED, or 503 / UNAVAILABLE carrying headrace's reject-reason, as while no
replica is up), ``stats.EXPIRED`` (a 429 whose reject-reason says the request expired in the
queue) or an error kind (``http_503``, ``grpc_unavailable``, ``timeout``, ``connection``).

- :class:`RawHttpClient`: a keep-alive pool of asyncio protocols writing pre-built HTTP/1.1
  requests; the cheapest per request, so one process keeps the tightest schedule.
- :class:`AiohttpClient`: the same over aiohttp's client.
- :class:`GrpcClient`: grpc.aio with pre-serialized ``ModelInferRequest`` bytes.
Also the probes run before a test: reachability and model metadata.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
from collections.abc import Callable
from typing import Any, Protocol

from gateway.errors import REASON_HEADER
from loadgen.payload import HttpBody, variant_from_grpc, variant_from_http
from loadgen.stats import OK, refusal

GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"
GRPC_MAX_MESSAGE = 256 * 1024 * 1024


class LoadError(RuntimeError):
    """The test cannot run (unreachable target, unknown model, bad input); one-line message."""


class Client(Protocol):
    async def infer(self, model_idx: int) -> tuple[str, str | None]: ...
    async def close(self) -> None: ...


def http_outcome(status: int, reason: str | None = None) -> str:
    """429 is a refusal; so is a 503 that says why (headrace's answer while no replica is up,
    ``no_replica``): the server answered, on purpose. A bare 503 is an error."""
    if status == 200:
        return OK
    if status == 429 or (status == 503 and reason is not None):
        return refusal(reason)
    return f"http_{status}"


# ---- raw HTTP/1.1 keep-alive pool -------------------------------------------------------------

Done = Callable[[str, "str | None"], None]  # (outcome, variant)


class _Conn(asyncio.Protocol):
    """One keep-alive connection; at most one request in flight (no pipelining)."""

    __slots__ = ("pool", "transport", "buf", "done", "started", "closed")

    def __init__(self, pool: RawHttpClient) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.done: Done | None = None
        self.started = 0.0
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._lost(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.done is None:
            return
        buf = self.buf
        hend = buf.find(b"\r\n\r\n")
        if hend < 0:
            return
        head = bytes(buf[:hend]).lower()
        clen = _header_int(head, b"\r\ncontent-length:")
        if clen is not None:
            end = hend + 4 + clen
            if len(buf) < end:
                return
            body = bytes(buf[hend + 4 : end])
        elif b"\r\ntransfer-encoding: chunked" in head:
            parsed = _dechunk(buf, hend + 4)
            if parsed is None:
                return
            body, end = parsed
        else:  # close-delimited answers are not supported
            self._fail("http_protocol")
            return
        status = int(head[9:12])
        if status == 200:
            hlen = _header_int(head, b"\r\ninference-header-content-length:")
            variant = variant_from_http(body, hlen)
            outcome = OK
        else:
            variant, outcome = None, http_outcome(status, _reason_of(head) if status in (429, 503) else None)
        del buf[:end]
        if b"\r\nconnection: close" in head:
            self.closed = True
        done, self.done = self.done, None
        self.pool._release(self)
        done(outcome, variant)

    def _fail(self, outcome: str) -> None:
        """Answer the request in flight with ``outcome`` and drop the connection."""
        done, self.done = self.done, None
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        if done is not None:
            done(outcome, None)


def _dechunk(buf: bytearray, start: int) -> tuple[bytes, int] | None:
    """A complete chunked body at ``buf[start:]`` -> (body, end offset), or None if partial."""
    parts, pos = [], start
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
        if size == 0:
            end = buf.find(b"\r\n\r\n", eol)  # no trailers expected: usually eol itself
            return (b"".join(parts), end + 4) if end >= 0 else None
        if len(buf) < eol + 2 + size + 2:
            return None
        parts.append(bytes(buf[eol + 2 : eol + 2 + size]))
        pos = eol + 2 + size + 2


def _header(head: bytes, name: bytes) -> bytes | None:
    """The value of header ``name`` (given as ``b"\\r\\nname:"``) in a lower-cased HTTP head."""
    i = head.find(name)
    if i < 0:
        return None
    j = head.find(b"\r\n", i + len(name))
    return head[i + len(name) : j if j >= 0 else len(head)].strip()


def _header_int(head: bytes, name: bytes) -> int | None:
    v = _header(head, name)
    return None if v is None else int(v)


_REASON = f"\r\n{REASON_HEADER}:".encode()


def _reason_of(head: bytes) -> str | None:
    """The reject-reason header's value, if present."""
    v = _header(head, _REASON)
    return None if v is None else v.decode()


class RawHttpClient:
    """Pre-built HTTP/1.1 requests over a pool of keep-alive connections, callback-driven:
    ``send(model_idx, done)`` writes at once when a connection is idle, else queues FIFO
    (the wait counts in the latency, as it should). No task or future per request."""

    def __init__(
        self, host: str, port: int, bodies: list[HttpBody], connections: int, timeout_s: float
    ) -> None:
        self.host, self.port, self.limit, self.timeout_s = host, port, connections, timeout_s
        self.requests = [_raw_request(host, port, b) for b in bodies]
        self.idle: collections.deque[_Conn] = collections.deque()
        self.pending: collections.deque[tuple[int, Done]] = collections.deque()
        self.conns: set[_Conn] = set()
        self.opening = 0
        self.sweeper: asyncio.Task | None = None
        self.clock: Callable[[], float] | None = None  # the running loop's time()

    def send(self, model_idx: int, done: Done) -> None:
        idle = self.idle
        while idle:
            c = idle.pop()
            if not c.closed:
                self._write(c, model_idx, done)
                return
        self.pending.append((model_idx, done))
        if len(self.conns) + self.opening < self.limit:
            self._open_one()

    async def infer(self, model_idx: int) -> tuple[str, str | None]:
        fut = asyncio.get_running_loop().create_future()
        self.send(model_idx, lambda o, v: fut.done() or fut.set_result((o, v)))
        return await fut

    def _write(self, c: _Conn, model_idx: int, done: Done) -> None:
        c.done = done
        if self.clock is None:
            self.clock = asyncio.get_running_loop().time
        c.started = self.clock()
        c.transport.write(self.requests[model_idx])  # type: ignore[union-attr]

    def _open_one(self) -> None:
        loop = asyncio.get_running_loop()
        self.opening += 1
        if self.sweeper is None:
            self.sweeper = loop.create_task(self._sweep())
        loop.create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, c = await loop.create_connection(lambda: _Conn(self), self.host, self.port)
        except OSError:
            self.opening -= 1
            if self.pending:  # fail one waiter per failed attempt, so errors are counted
                _, done = self.pending.popleft()
                done("connection", None)
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
        if self.pending:
            mi, done = self.pending.popleft()
            self._write(c, mi, done)
        else:
            self.idle.append(c)

    def _lost(self, c: _Conn) -> None:
        if c in self.conns:
            self.conns.discard(c)
            if c.done is not None:
                c._fail("connection")
            if self.pending and len(self.conns) + self.opening < self.limit:
                self._open_one()

    async def _sweep(self) -> None:
        """Time out requests in flight longer than ``timeout_s`` (one timer, not one per
        request); queued requests time out too."""
        loop = asyncio.get_running_loop()
        period = min(0.1, self.timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            limit = loop.time() - self.timeout_s
            for c in list(self.conns):
                if c.done is not None and c.started < limit:
                    c._fail("timeout")

    async def close(self) -> None:
        if self.sweeper is not None:
            self.sweeper.cancel()
        for c in list(self.conns):
            if c.transport is not None:
                c.transport.close()
        while self.pending:
            _, done = self.pending.popleft()
            done("connection", None)
        self.idle.clear()


def _raw_request(host: str, port: int, b: HttpBody) -> bytes:
    lines = [f"POST {b.path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(b.body)}"]
    lines += [f"{k}: {v}" for k, v in b.headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + b.body


# ---- aiohttp ----------------------------------------------------------------------------------


class AiohttpClient:
    def __init__(
        self, host: str, port: int, bodies: list[HttpBody], connections: int, timeout_s: float
    ) -> None:
        import aiohttp

        self.base = f"http://{host}:{port}"
        self.bodies = [(self.base + b.path, b.body, dict(b.headers)) for b in bodies]
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        )

    async def infer(self, model_idx: int) -> tuple[str, str | None]:
        import aiohttp

        url, body, headers = self.bodies[model_idx]
        try:
            async with self.session.post(url, data=body, headers=headers) as resp:
                data = await resp.read()
                if resp.status != 200:
                    return http_outcome(resp.status, resp.headers.get(REASON_HEADER)), None
                h = resp.headers.get("Inference-Header-Content-Length")
                return OK, variant_from_http(data, int(h) if h else None)
        except TimeoutError:
            return "timeout", None
        except (aiohttp.ClientError, OSError):
            return "connection", None

    async def close(self) -> None:
        await self.session.close()


# ---- gRPC -------------------------------------------------------------------------------------


class GrpcClient:
    def __init__(self, host: str, port: int, requests: list[bytes], timeout_s: float) -> None:
        import grpc

        self.grpc = grpc
        self.channel = grpc.aio.insecure_channel(
            f"{host}:{port}",
            options=[
                ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
                ("grpc.max_send_message_length", GRPC_MAX_MESSAGE),
            ],
        )
        # NOTE: requests are serialized once; the identity (de)serializers pass bytes through
        self.call = self.channel.unary_unary(GRPC_METHOD)
        self.requests = requests
        self.timeout_s = timeout_s

    async def infer(self, model_idx: int) -> tuple[str, str | None]:
        grpc = self.grpc
        try:
            raw = await self.call(self.requests[model_idx], timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            code = e.code()
            reason = dict(e.trailing_metadata() or ()).get(REASON_HEADER)
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED or (code == grpc.StatusCode.UNAVAILABLE and reason):
                return refusal(reason), None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return "timeout", None
            return f"grpc_{code.name.lower()}", None
        return OK, variant_from_grpc(raw)

    async def close(self) -> None:
        await self.channel.close()


# ---- probes -----------------------------------------------------------------------------------


async def probe_http(host: str, port: int, models: tuple[str, ...], timeout_s: float = 5.0) -> dict:
    """Check the server is ready and return ``{model: metadata}``; raise LoadError if not."""
    import aiohttp

    base = f"http://{host}:{port}"
    out: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
            async with s.get(base + "/v2/health/ready") as r:
                if r.status != 200:
                    raise LoadError(
                        f"target {base} is not ready (GET /v2/health/ready: {r.status})"
                    )
            for m in models:
                async with s.get(f"{base}/v2/models/{m}") as r:
                    text = await r.text()
                    if r.status != 200:
                        raise LoadError(
                            f"model {m!r} unavailable at {base} ({r.status}: {_err(text)})"
                        )
                    out[m] = json.loads(text) if text else {}
    except (aiohttp.ClientConnectionError, OSError) as e:
        raise LoadError(f"cannot reach {base}: {_reason(e)}") from None
    except TimeoutError:
        raise LoadError(f"cannot reach {base}: no answer within {timeout_s:g} s") from None
    return out


async def probe_grpc(host: str, port: int, models: tuple[str, ...], timeout_s: float = 5.0) -> dict:
    import grpc
    from google.protobuf import json_format
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg

    target = f"grpc://{host}:{port}"
    out: dict[str, Any] = {}
    async with grpc.aio.insecure_channel(f"{host}:{port}") as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        try:
            r = await stub.ServerReady(pb.ServerReadyRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            why = (e.details() or "").split(";")[0]
            raise LoadError(f"cannot reach {target}: {e.code().name} ({why})") from None
        if not r.ready:
            raise LoadError(f"target {target} is not ready")
        for m in models:
            try:
                md = await stub.ModelMetadata(pb.ModelMetadataRequest(name=m), timeout=timeout_s)
            except grpc.aio.AioRpcError as e:
                raise LoadError(f"model {m!r} unavailable at {target} ({e.details()})") from None
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
