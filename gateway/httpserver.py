"""A lean HTTP/1.1 server for the gateway's front door: asyncio protocols and httptools.

The gateway answers every request from one routing function (:mod:`gateway.http`), so it
needs none of a web framework's machinery: no request/response objects with lazy
properties, no router tree, no middleware chain. This server parses with httptools (the
C parser uvicorn uses), hands each complete request to that function and writes the answer
in one ``write``. At concurrency 1 that is about half the CPU per request of an aiohttp app
(``bench/gateway_overhead.py``).

HTTP behaviour a Triton client relies on: keep-alive (HTTP/1.1 default, ``Connection:
close`` and HTTP/1.0 honoured), chunked request bodies, ``Expect: 100-continue``, answers in
request order on a connection (pipelining), 400 on a malformed request and 413 on a body
past ``max_body`` (read to its end first, so the client sees the answer, then the
connection closes). Bodies are given to the handler as received: Content-Encoding is the
handler's business (it knows its own size limit).

Each request carries ``received``: when the loop turn that read its first bytes began
reading. A burst of requests read in one turn all keep that time, so a request that waited
in its socket while the ones before it were parsed does not lose that wait from its
deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httptools

log = logging.getLogger("headrace.gateway")

_REASONS = {
    100: "Continue", 200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
    413: "Payload Too Large", 429: "Too Many Requests", 500: "Internal Server Error",
    501: "Not Implemented", 503: "Service Unavailable", 504: "Gateway Timeout",
}
_MAX_PIPELINED = 64  # requests queued on one connection before it stops reading


class TurnClock:
    """``clock()`` read once per event-loop turn: the first call of a turn stamps it and every
    later call in that turn returns the same time. Called first thing on each socket read, it
    gives everything read in one turn the time the turn began reading, so work done on earlier
    reads of the turn is not charged to later ones."""

    __slots__ = ("clock", "_at", "_loop")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # found once: each lookup is a getpid()

    def __call__(self) -> float:
        if self._at is None:
            self._at = self.clock()
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._turn_ended)
        return self._at

    def _turn_ended(self) -> None:
        self._at = None


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str  # without the query string, not yet percent-decoded
    headers: dict[str, str]  # names lower-cased
    body: bytes
    received: float | None = None  # server clock when its first bytes were read (see the module doc)


@dataclass(slots=True)
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def encode(self, keep_alive: bool) -> bytes:
        head = [f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Unknown')}\r\n"
                f"Content-Length: {len(self.body)}\r\n"]
        if self.content_type:
            head.append(f"Content-Type: {self.content_type}\r\n")
        for k, v in self.headers:
            head.append(f"{k}: {v}\r\n")
        if not keep_alive:
            head.append("Connection: close\r\n")
        head.append("\r\n")
        return "".join(head).encode("latin-1") + self.body


def error_response(status: int, msg: str, headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    """The KServe v2 error shape: ``{"error": msg}``."""
    return HttpResponse(status, json.dumps({"error": msg}).encode(), "application/json", headers)


@dataclass(slots=True)
class Later:
    """An answer to come: once ``future`` is done, ``make(future)`` gives the response (in the
    future's own done callback: no task, no extra loop turn). A ``make`` that raises is a 500."""

    future: asyncio.Future
    make: Callable[[asyncio.Future], HttpResponse]


# A handler answers at once (an HttpResponse), or later: a Later, an asyncio Future of a
# response (followed by a callback, no task) or a coroutine (run as a task).
Handler = Callable[[HttpRequest], "HttpResponse | Later | Awaitable[HttpResponse]"]


@dataclass(slots=True)
class _Pending:
    request: HttpRequest | None  # None: answer ``early`` without calling the handler
    keep_alive: bool
    early: HttpResponse | None = None


@dataclass
class _Message:
    url: bytearray = field(default_factory=bytearray)
    headers: dict[str, str] = field(default_factory=dict)
    body: list[bytes] = field(default_factory=list)
    size: int = 0
    too_large: bool = False
    received: float = 0.0


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.msg = _Message()
        self.queue: deque[_Pending] = deque()
        self.busy = False
        self.closing = False
        self.paused = False
        self.broken = False  # the parser failed: nothing after that point is a request
        self.read_at = 0.0  # server.read_time() of the latest read

    # ---- transport events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server._conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server._conns.discard(self)

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return
        self.read_at = self.server.read_time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._answer_and_close(error_response(400, "protocol upgrades are not supported"))
        except httptools.HttpParserError as e:
            self._answer_and_close(error_response(400, f"malformed HTTP request: {e}"))

    # ---- parser callbacks
    def on_message_begin(self) -> None:
        self.msg = _Message(received=self.read_at)

    def on_url(self, url: bytes) -> None:
        self.msg.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.msg.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        m = self.msg
        length = m.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.server.max_body:
            m.too_large = True
        if m.headers.get("expect", "").lower() == "100-continue" and not m.too_large:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        m = self.msg
        if m.too_large:
            return
        m.size += len(body)
        if m.size > self.server.max_body:
            m.too_large, m.body = True, []
            return
        m.body.append(body)

    def on_message_complete(self) -> None:
        m, p = self.msg, self.parser
        keep_alive = p.should_keep_alive()
        if m.too_large:
            self._enqueue(_Pending(None, False, error_response(
                413, f"request body exceeds {self.server.max_body} bytes")))
            return
        path = bytes(m.url).split(b"?", 1)[0].decode("latin-1")
        body = m.body[0] if len(m.body) == 1 else b"".join(m.body)
        self._enqueue(_Pending(HttpRequest(p.get_method().decode("latin-1"), path, m.headers, body,
                                           m.received), keep_alive))

    # ---- answering, in request order
    def _enqueue(self, pending: _Pending) -> None:
        self.queue.append(pending)
        if len(self.queue) >= _MAX_PIPELINED and not self.paused:
            self.paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        if not self.busy:
            self._next()

    def _next(self) -> None:
        while self.queue and not self.closing:
            pending = self.queue.popleft()
            if pending.request is None:
                self._write(pending.early, pending.keep_alive)  # type: ignore[arg-type]
                continue
            try:
                answer = self.server.handler(pending.request)
            except Exception as e:  # noqa: BLE001  (a bug answers 500; the server goes on)
                log.error("HTTP handler failed", exc_info=e)
                answer = error_response(500, f"internal error: {type(e).__name__}: {e}")
            if isinstance(answer, HttpResponse):
                self._write(answer, pending.keep_alive)
                continue
            self.busy = True
            if isinstance(answer, Later):
                later, make = answer.future, answer.make
            else:  # a future stays itself, a coroutine becomes a task
                later, make = asyncio.ensure_future(answer), asyncio.Future.result
            self.server._tasks.add(later)
            later.add_done_callback(lambda t, ka=pending.keep_alive, mk=make: self._done(t, ka, mk))
            return
        self.busy = False
        if self.paused and not self.closing:
            self.paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]

    def _done(self, task: asyncio.Future, keep_alive: bool,
              make: Callable[[asyncio.Future], HttpResponse]) -> None:
        self.server._tasks.discard(task)
        if task.cancelled():
            resp = error_response(503, "gateway is shutting down")
        else:
            try:
                resp = make(task)
            except Exception as e:  # noqa: BLE001  (a bug answers 500; the server goes on)
                log.error("HTTP handler failed", exc_info=e)
                resp = error_response(500, f"internal error: {type(e).__name__}: {e}")
        self._write(resp, keep_alive)
        self._next()

    def _write(self, resp: HttpResponse, keep_alive: bool) -> None:
        if self.closing:
            return
        keep_alive = keep_alive and not self.server.stopping
        self.transport.write(resp.encode(keep_alive))  # type: ignore[union-attr]
        if not keep_alive:
            self._close()

    def _answer_and_close(self, resp: HttpResponse) -> None:
        """A request the parser cannot make sense of: answer after those ahead of it, then
        close (the byte stream cannot be resynchronised)."""
        self.broken = True
        self.queue.append(_Pending(None, False, resp))
        self.transport.pause_reading()  # type: ignore[union-attr]
        if not self.busy:
            self._next()

    def _close(self) -> None:
        self.closing = True
        self.queue.clear()
        if self.transport is not None:
            self.transport.close()

    def close_if_idle(self) -> None:
        if not self.busy and not self.queue:
            self._close()


class HttpServer:
    """``await start(host, port)`` -> bound port; ``await stop()`` finishes what it accepted."""

    def __init__(self, handler: Handler, max_body: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.handler = handler
        self.max_body = max_body
        self.read_time = TurnClock(clock)
        self.stopping = False
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[_Connection] = set()
        self._tasks: set[asyncio.Future] = set()  # answers still to come

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, backlog=1024)
        return self._server.sockets[0].getsockname()[1]

    def close(self) -> None:
        """Stop accepting connections; open ones are still answered."""
        self.stopping = True
        if self._server is not None:
            self._server.close()

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, let running handlers answer (up to ``timeout``), close connections."""
        self.close()
        for c in list(self._conns):
            c.close_if_idle()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)
        if self._tasks:  # still running: cancelled, they answer 503 before their connection closes
            late = list(self._tasks)
            for t in late:
                t.cancel()
            await asyncio.wait(late, timeout=1.0)
            await asyncio.sleep(0)
        for c in list(self._conns):
            c._close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
