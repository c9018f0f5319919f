"""A lean keep-alive HTTP/1.1 client of one Triton server, speaking the binary tensor
extension: a batch goes out as a JSON header plus the concatenated raw input bytes, and the
outputs come back as raw bytes sliced out of one body.

It costs about half of a grpc.aio call per request (measured in
``bench/gateway_overhead.py``), which is most of what the gateway adds at low load.
Connections are pooled per server; a broken connection is dropped and reported as
UNAVAILABLE (retryable), so the driver retries the batch on another replica. As over gRPC,
an error never names the server's address (:class:`~gateway.errors.BackendError`); the
gateway's log does, once when the server stops answering and once when it answers again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from gateway.backends.grpc import ModelInfo, Reachability, signature_of
from gateway.backends.http1 import AnswerTooLarge, Connection, Headers, request_head
from gateway.backends.tls import BackendTls
from gateway.codec import Memo, Tensor, TensorLayout, json_to_raw
from gateway.contract import Forward
from gateway.errors import BackendError, hide_address, transport_text

_GRPC_OF_HTTP = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
}
_HEADER_LEN = b"inference-header-content-length"


# the JSON headers of recent batch layouts, both ways: most batches repeat a few shapes
_REQUEST_HEADS = Memo()
_RESPONSE_LAYOUTS = Memo()


_HEAD_START = b'{"parameters":{'


def _request_head(key: tuple[tuple[tuple[str, str, tuple[int, ...], int], ...], Forward | None]) -> bytes:
    """An infer request's JSON header, for inputs (name, datatype, shape, bytes) sent binary
    and what else is forwarded, without its opening ``{"parameters":{`` (:func:`_head`
    writes that and Triton's ``timeout``, which differs from batch to batch)."""
    layout, forward = key
    params: dict[str, Any] = {"binary_data_output": True}
    doc: dict[str, Any] = {"parameters": params,
                           "inputs": [{"name": name, "datatype": dt, "shape": list(shape),
                                       "parameters": {"binary_data_size": n}} for name, dt, shape, n in layout]}
    if forward is not None:
        params.update(forward.parameters)
        params["binary_data_output"] = True
        if forward.outputs:
            doc["outputs"] = [{"name": name, "parameters": {**dict(p), "binary_data": True}}
                              for name, p in forward.outputs]
    head = json.dumps(doc, separators=(",", ":")).encode()
    return head[len(_HEAD_START):]


def _head(layout: tuple[tuple[str, str, tuple[int, ...], int], ...], forward: Forward | None,
          triton_timeout_us: int) -> bytes:
    rest = _REQUEST_HEADS.get((layout, forward), _request_head)
    if not triton_timeout_us:
        return _HEAD_START + rest
    return b'%s"timeout":%d,%s' % (_HEAD_START, triton_timeout_us, rest)


def _response_layout(head: bytes) -> tuple[TensorLayout, ...]:
    """The outputs an infer answer's JSON header describes."""
    out = []
    for o in json.loads(head)["outputs"]:
        size = (o.get("parameters") or {}).get("binary_data_size")
        raw = None if size is not None else json_to_raw(o["name"], o["datatype"], o["shape"], o.get("data"))
        out.append(TensorLayout(o["name"], o["datatype"], list(o["shape"]), size, raw))
    return tuple(out)


class _Conn(Connection):
    """A connection whose request in flight is a future, resolved with (status, headers,
    body) or failed with the reason it got no answer."""

    __slots__ = ("loop", "fut")

    def __init__(self, max_body: int) -> None:
        super().__init__(max_body)
        self.loop = asyncio.get_running_loop()  # once: each lookup is a getpid() system call
        self.fut: asyncio.Future | None = None

    def answered(self, status: int, headers: Headers, body: bytes) -> None:
        fut, self.fut = self.fut, None
        if fut is not None and not fut.done():
            fut.set_result((status, headers, body))

    def failed(self, e: Exception) -> None:
        fut, self.fut = self.fut, None
        if fut is not None and not fut.done():
            fut.set_exception(e)

    def timed_out(self) -> None:
        self.refuse(TimeoutError())


class TritonHttpReplica:
    """A client of one Triton server's HTTP endpoint (shared by its variants)."""

    def __init__(self, url: str, max_message_bytes: int = 64 << 20, max_idle: int = 16,
                 tls: BackendTls | None = None) -> None:
        self.url = url  # for the gateway's log, never for a client's eyes
        self.reach = Reachability(url)
        host, _, port = url.rpartition(":")
        self._host, self._port = host, int(port)
        self._ssl = tls.ssl_context() if tls is not None else None
        self._server_name = (tls.server_name or host) if tls is not None else None
        self._idle: list[_Conn] = []
        self._busy: set[_Conn] = set()  # a request on the way: closed with the client
        self._max_idle = max_idle
        self._max_body = max_message_bytes
        self._authority = url.encode()  # the Host header

    async def close(self) -> None:
        conns = self._idle + list(self._busy)
        self._idle, self._busy = [], set()
        for c in conns:
            c.close()

    def _idle_conn(self) -> _Conn | None:
        """A pooled connection still open, or None (closed ones are dropped on the way)."""
        while self._idle:
            c = self._idle.pop()
            if not c.closed:
                return c
        return None

    def _request(self, method: bytes, path: str, headers: bytes, body: bytes | list[bytes],
                 timeout: float | None, what: str) -> Awaitable[tuple[int, Headers, bytes]]:
        """Send a request and return the wait for its answer (status, headers, body). On a
        pooled connection the request is written in this call (the hot path: no connect, no
        loop turn before it leaves); else a new connection is opened once awaited."""
        parts = body if isinstance(body, list) else [body]
        size = sum(len(p) for p in parts)
        head = request_head(method, path.encode(), self._authority, size, headers)
        conn = self._idle_conn()
        if conn is None:
            return self._connect_and_send([head, *parts], timeout, what)
        return self._answer(conn, *self._send(conn, [head, *parts], timeout), timeout, what)

    def _send(self, conn: _Conn, parts: list[bytes], timeout: float | None
              ) -> tuple[asyncio.Future, asyncio.TimerHandle | None]:
        self._busy.add(conn)
        timer = conn.loop.call_later(timeout, conn.timed_out) if timeout is not None else None
        fut = conn.fut = conn.loop.create_future()
        conn.send(parts)
        return fut, timer

    async def _connect_and_send(self, parts: list[bytes], timeout: float | None, what: str
                                ) -> tuple[int, Headers, bytes]:
        try:
            async with asyncio.timeout(timeout):  # None: no limit
                _, conn = await asyncio.get_running_loop().create_connection(
                    lambda: _Conn(self._max_body), self._host, self._port, ssl=self._ssl,
                    server_hostname=self._server_name)
        except (OSError, ValueError) as e:
            raise self._transport_error(e, timeout, what) from None
        return await self._answer(conn, *self._send(conn, parts, timeout), timeout, what)

    async def _answer(self, conn: _Conn, fut: asyncio.Future, timer: asyncio.TimerHandle | None,
                      timeout: float | None, what: str) -> tuple[int, Headers, bytes]:
        try:
            status, hdrs, data = await fut
        except AnswerTooLarge as e:  # the requests' answer, not the server, is at fault
            conn.close()
            raise BackendError(f"{what}: RESOURCE_EXHAUSTED: the answer is too large: {e}",
                               grpc.StatusCode.RESOURCE_EXHAUSTED, retryable=False) from None
        except (OSError, ValueError) as e:
            conn.close()
            raise self._transport_error(e, timeout, what) from None
        except BaseException:
            conn.close()  # cancelled mid-request: its answer must not reach a later request
            raise
        finally:
            self._busy.discard(conn)
            if timer is not None:
                timer.cancel()
        if not conn.closed and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()
        return status, hdrs, data

    def _transport_error(self, e: Exception, timeout: float | None, what: str) -> BackendError:
        if isinstance(e, TimeoutError):  # before OSError, of which it is a subclass
            return BackendError(f"{what}: DEADLINE_EXCEEDED: no answer in {timeout:.3f}s",
                                grpc.StatusCode.DEADLINE_EXCEEDED, retryable=False)
        self.reach.failed(what, f"{type(e).__name__}: {e}")
        return BackendError(f"{what}: UNAVAILABLE: {transport_text(e)}", grpc.StatusCode.UNAVAILABLE,
                            retryable=True)

    def _error(self, status: int, data: bytes, what: str) -> BackendError:
        try:
            msg = json.loads(data).get("error", "")
        except (ValueError, AttributeError):
            msg = data[:200].decode(errors="replace")
        code = _GRPC_OF_HTTP.get(status, grpc.StatusCode.INTERNAL)
        return BackendError(f"{what}: {code.name}: {hide_address(str(msg), self.url)}", code,
                            retryable=code == grpc.StatusCode.UNAVAILABLE)

    def infer(self, variant: str, inputs: list[Tensor], timeout: float | None,
              forward: Forward | None = None, triton_timeout_us: int = 0, *,
              trace_headers: tuple[tuple[str, str], ...] | None = None) -> Awaitable[list[Tensor]]:
        """Send a batch and return the wait for its outputs. With a pooled connection open the
        request is on its way when this returns, before the caller's first await. ``forward``
        is what else the client asked of Triton (its version, parameters and outputs),
        ``triton_timeout_us`` Triton's ``timeout`` (0: none), ``trace_headers`` the W3C trace
        context (``traceparent``) sent as headers."""
        layout = tuple((t.name, t.datatype, tuple(t.shape), len(t.raw)) for t in inputs)
        head = _head(layout, forward, triton_timeout_us)
        headers = b"Inference-Header-Content-Length: %d\r\n" % len(head)
        if trace_headers is not None:
            headers += "".join(f"{k}: {v}\r\n" for k, v in trace_headers).encode("latin-1")
        path = (f"/v2/models/{variant}/versions/{forward.version}/infer" if forward is not None and forward.version
                else f"/v2/models/{variant}/infer")
        answer = self._request(b"POST", path, headers, [head, *(t.raw for t in inputs)], timeout, variant)
        return self._outputs(variant, answer)

    async def _outputs(self, variant: str, answer: Awaitable[tuple[int, Headers, bytes]]
                       ) -> list[Tensor]:
        status, hdrs, data = await answer
        if status != 200:
            raise self._error(status, data, variant)
        hl = hdrs.get(_HEADER_LEN)
        try:
            n = int(hl) if hl is not None else len(data)
            head = data[:n]
            outputs = _RESPONSE_LAYOUTS.get(head, _response_layout)
            view = memoryview(data)
            outs, off = [], n
            for o in outputs:
                raw: Any = o.raw
                if o.size is not None:
                    raw, off = view[off : off + o.size], off + o.size
                outs.append(Tensor(o.name, o.datatype, o.shape, raw))
        except (ValueError, KeyError, TypeError) as e:
            raise BackendError(f"{variant}: INTERNAL: unreadable response: {hide_address(str(e), self.url)}",
                               grpc.StatusCode.INTERNAL, retryable=False) from None
        if off > len(data):
            raise BackendError(f"{variant}: INTERNAL: unreadable response: "
                               f"outputs claim {off - n} binary bytes, {len(data) - n} sent",
                               grpc.StatusCode.INTERNAL, retryable=False)
        return outs

    async def ready(self, variant: str, timeout: float = 1.0) -> bool:
        try:
            status, _, _ = await self._request(b"GET", f"/v2/models/{variant}/ready", b"", b"", timeout, variant)
        except BackendError:
            return False
        self.reach.answered()
        return status == 200

    async def _get_json(self, path: str, what: str, timeout: float) -> dict:
        status, _, data = await self._request(b"GET", path, b"", b"", timeout, what)
        if status != 200:
            raise self._error(status, data, what)
        return json.loads(data)

    async def model_info(self, variant: str, timeout: float = 5.0) -> ModelInfo:
        md_doc = await self._get_json(f"/v2/models/{variant}", variant, timeout)
        cfg_doc = await self._get_json(f"/v2/models/{variant}/config", variant, timeout)
        md = json_format.ParseDict(md_doc, pb.ModelMetadataResponse(), ignore_unknown_fields=True)
        cfg = json_format.ParseDict(cfg_doc, mc.ModelConfig(), ignore_unknown_fields=True)
        return ModelInfo(signature_of(cfg), md, cfg)
