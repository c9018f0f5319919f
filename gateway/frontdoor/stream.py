"""Streamed answers of the front door's HTTP server (:mod:`gateway.frontdoor.httpserver`).

A handler answers with a :class:`StreamResponse` (server-sent events): its head with the
first chunk its iterator yields (one write: the client has nothing to read before it), then
each chunk as it is yielded, ``Transfer-Encoding: chunked`` on a keep-alive connection,
else a body ended by closing the connection. A :class:`StreamWriter` writes it and tells the
stream why it ended early: ``disconnect`` (its client went away), ``write_timeout`` (its
client read nothing for the write timeout, its buffers full) or ``shutdown``; either way the
iterator is closed, so what feeds it (an engine's stream) is closed at once.

A streamed answer's connection holds at most :data:`STREAM_BUFFER` bytes its client has not
read, in the socket and in the transport: the kernel would otherwise let the socket's buffer
grow to megabytes (tens of thousands of tokens) before a client that stopped reading is
noticed. A token stream needs far less than this a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol

STREAM_BUFFER = 16 << 10


@dataclass(slots=True)
class StreamResponse:
    """A streamed answer: the head, then every chunk ``chunks`` yields, written as it comes.
    ``aborted(reason)`` is called when it cannot finish (see the module doc); ``chunks`` is
    closed then."""

    status: int
    chunks: AsyncIterator[bytes]
    content_type: str = "text/event-stream"
    headers: tuple[tuple[str, str], ...] = ()
    aborted: Callable[[str], None] | None = None

    def head(self, chunked: bool) -> bytes:
        head = [f"HTTP/1.1 {self.status} {HTTPStatus(self.status).phrase}\r\n"
                f"Content-Type: {self.content_type}\r\nCache-Control: no-cache\r\n"]
        for k, v in self.headers:
            head.append(f"{k}: {v}\r\n")
        head.append("Transfer-Encoding: chunked\r\n\r\n" if chunked else "Connection: close\r\n\r\n")
        return "".join(head).encode("latin-1")


class _Writable(Protocol):
    def write(self, data: bytes) -> None: ...
    def is_closing(self) -> bool: ...


class StreamWriter:
    """Writes one :class:`StreamResponse` on a connection: ``await run()``. The connection
    forwards its transport's ``pause``/``resume`` of writing and ``abort("disconnect")`` when
    it is lost. ``transport``: where the bytes go (TLS or the socket's); ``raw``: the socket's
    transport, aborted when the client stops reading; ``paused_at``: when writing was paused
    (0: it is not)."""

    __slots__ = ("resp", "transport", "raw", "chunked", "write_timeout", "paused_at", "_drained", "_told")

    def __init__(self, resp: StreamResponse, transport: _Writable, raw: asyncio.Transport, chunked: bool,
                 write_timeout: float, paused_at: float = 0.0) -> None:
        self.resp, self.transport, self.raw, self.chunked = resp, transport, raw, chunked
        self.write_timeout = write_timeout
        self.paused_at = paused_at
        self._drained: asyncio.Future | None = None
        self._told = False
        sock = raw.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_BUFFER)
        raw.set_write_buffer_limits(high=STREAM_BUFFER)

    def pause(self, at: float) -> None:
        self.paused_at = at

    def resume(self) -> None:
        self.paused_at = 0.0
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def abort(self, reason: str) -> None:
        """Tell the stream why it ends early (once: the first reason stands)."""
        if not self._told:
            self._told = True
            if self.resp.aborted is not None:
                self.resp.aborted(reason)

    async def run(self) -> None:
        chunks, t = self.resp.chunks, self.transport
        try:
            if t.is_closing():  # the client left before its answer began
                self.abort("disconnect")
                return
            head = self.resp.head(self.chunked)
            async for data in chunks:
                if not data:
                    continue
                data = b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data
                if head:
                    data, head = head + data, b""
                t.write(data)
                if self.paused_at and not await self._writable():
                    self.abort("write_timeout")
                    self.raw.abort()  # what it holds will never be read
                    return
            if self.chunked or head:
                t.write(head + b"0\r\n\r\n" if self.chunked else head)
        except asyncio.CancelledError:
            self.abort("shutdown")  # (a lost connection has told it already)
            raise
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _writable(self) -> bool:
        """Wait until the transport takes writes again: False when the client has read nothing
        for ``write_timeout`` seconds since writing paused."""
        self._drained = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout_at(self.paused_at + self.write_timeout):
                await self._drained
        except TimeoutError:
            return False
        finally:
            self._drained = None
        return True
