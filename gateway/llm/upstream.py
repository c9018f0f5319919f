"""Connections to an OpenAI-compatible engine: HTTP/1.1 on the project's own framing
(:mod:`gateway.backends.http1`), kept alive and pooled per engine, with an answer's body read
as it arrives.

An engine's stream is one request on one connection: the gateway reads the answer's head,
then each piece of its body as the engine writes it, with no buffering beyond what has
arrived. Closing the connection is how a request is aborted at the engine (vLLM and
``headrace engine`` abort a request whose connection closes).
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque

from gateway.backends.http1 import Connection, Headers, request_head

_JSON = b"Content-Type: application/json\r\n"


class EngineConnection(Connection):
    """One kept-alive connection to an engine carrying one request at a time. After
    :meth:`start`, ``await head`` gives the answer's status; :meth:`read` gives the body as it
    arrives (None at its end). A connection lost or a malformed answer raises from either."""

    __slots__ = ("upstream", "head", "chunks", "waiter", "done", "error")

    def __init__(self, upstream: Upstream) -> None:
        super().__init__(max_body=1 << 62)  # a stream's length is the engine's to bound
        self.upstream = upstream
        self.head: asyncio.Future[int] | None = None
        self.chunks: deque[bytes] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.done = False
        self.error: Exception | None = None

    def start(self, path: bytes, body: bytes | None) -> asyncio.Future[int]:
        """Send ``POST path`` with the JSON ``body`` (None: ``GET path``); the future is the
        answer's status."""
        self.head = asyncio.get_running_loop().create_future()
        self.chunks.clear()
        self.done, self.error = False, None
        if body is None:
            self.send((request_head(b"GET", path, self.upstream.host_header, 0),))
        else:
            self.send((request_head(b"POST", path, self.upstream.host_header, len(body), _JSON), body))
        return self.head

    async def whole(self) -> bytes:
        """The rest of the answer's body."""
        parts = []
        while (data := await self.read()) is not None:
            parts.append(data)
        return b"".join(parts)

    async def read(self) -> bytes | None:
        """What arrived of the body since the last read (waiting for some), None at its end."""
        while True:
            if self.chunks:
                chunks = self.chunks
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                return data
            if self.error is not None:
                raise self.error
            if self.done:
                return None
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None

    def release(self) -> None:
        """Back to its engine's pool when its answer was read whole; closed otherwise."""
        if self.done and not self.closed and self.error is None:
            self.upstream.idle.append(self)
        else:
            self.close()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    # http1.Connection's hooks and httptools' callbacks
    def on_headers_complete(self) -> None:
        h = self.head
        if h is not None and not h.done():
            h.set_result(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self._wake()

    def on_message_complete(self) -> None:
        if not self.busy:
            return
        self.busy = False
        if not self.parser.should_keep_alive():
            self.close()
        self.done = True
        self._wake()

    def answered(self, status: int, headers: Headers, body: bytes) -> None:  # read by the hooks above instead
        raise AssertionError("EngineConnection reads its answers as they arrive")

    def failed(self, e: Exception) -> None:
        self.error = e
        h = self.head
        if h is not None and not h.done():
            h.set_exception(e)
        self._wake()


class Upstream:
    """The kept-alive connections to one engine (``http://host:port``)."""

    __slots__ = ("host", "port", "host_header", "idle")

    def __init__(self, url: str) -> None:
        hostport = url.removeprefix("http://")
        self.host, _, port = hostport.rpartition(":")
        self.host = self.host.strip("[]")
        self.port = int(port)
        self.host_header = hostport.encode()
        self.idle: list[EngineConnection] = []

    def reuse(self) -> EngineConnection | None:
        """A kept-alive connection free now, if there is one."""
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        return None

    async def connect(self, fresh: bool = False) -> tuple[EngineConnection, bool]:
        """A connection to the engine, and whether it was reused (``fresh``: a new one)."""
        conn = None if fresh else self.reuse()
        if conn is not None:
            return conn, True
        _, conn = await asyncio.get_running_loop().create_connection(lambda: EngineConnection(self), self.host,
                                                                     self.port)
        sock = conn.transport.get_extra_info("socket")  # type: ignore[union-attr]
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, False

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
