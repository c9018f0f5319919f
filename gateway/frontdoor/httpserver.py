"""A lean HTTP/1.1 server for the gateway's front door: asyncio protocols and httptools.

The gateway answers every request from one routing function (:mod:`gateway.frontdoor.http`), so it
needs none of a web framework's machinery: no request/response objects with lazy
properties, no router tree, no middleware chain. This server parses with httptools (the
C parser uvicorn uses), hands each complete request to that function and writes the answer
in one ``write``. At concurrency 1 that is about half the CPU per request of an aiohttp app
(``bench/gateway_overhead.py``).

HTTP behaviour a Triton client relies on: keep-alive (HTTP/1.1 default, ``Connection:
close`` and HTTP/1.0 honoured), chunked request bodies, ``Expect: 100-continue``, answers in
request order on a connection (pipelining) and 400 on a malformed request. Bodies are given
to the handler as received: Content-Encoding is the handler's business (it knows its own
size limit).

A handler may also answer with a :class:`~gateway.frontdoor.stream.StreamResponse`
(server-sent events, :mod:`gateway.frontdoor.stream`); the connection's next answer waits for
its end. A client that stops reading it for ``stream_write_timeout_s`` has its connection
aborted.

What a client may ask of it is bounded (:mod:`gateway.frontdoor.limits`, each compared on the parse
callbacks): connections (past ``max_connections`` a few more may only ask for
``/v2/health/*``, one probe each; past those a new connection is closed at once, and so is
one past ``max_address_connections`` from its address), the request head (414, 431), the
time a head, a body or an idle keep-alive connection may take (408 / close; one timer per
connection, moved only when a deadline comes earlier) and a body past ``max_body`` (413, on
its declared length when there is one). A body's bytes are charged as they arrive, never from
its declared length, to its client (``identify``: its tenant, its key checked before a byte of
the body is read; else its address), and stay charged until the handler takes it, pipelined
ones included: past ``max_client_buffered_bytes`` for its client the answer is 429, past
``max_buffered_bytes`` for all of them 503, both with ``Retry-After``. A refusal is answered
as soon as the answers ahead of it on the connection are written; what the client still sends
is then read and dropped for a moment, so it sees the answer, and the connection closes.

Answers wait for their client: while the connection's socket is full (the transport paused
writing), no further request of it is handed to the handler and nothing more is read from it,
so a client that pipelines requests and reads nothing holds a socket's worth of answers; one
that reads nothing for ``stream_write_timeout_s`` is cut off. A request asking to upgrade the
protocol (``Upgrade:``) is answered as plain HTTP/1.1, and ``CONNECT`` with 405; either closes
the connection after its one answer.

Given an :class:`ssl.SSLContext`, every connection speaks TLS (:class:`~gateway.frontdoor.tls.TlsTransport`,
set up as the connection is accepted, so the limits above hold from its first byte: its
handshake counts against the time its first request has).

Each request carries ``received``: when the loop turn that read its first bytes began
reading. A burst of requests read in one turn all keep that time, so a request that waited
in its socket while the ones before it were parsed does not lose that wait from its
deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import httptools

from gateway.frontdoor.httpmessage import (  # noqa: F401  (HttpRequest, Handler, TurnClock: the server's API)
    Handler,
    HttpRequest,
    HttpResponse,
    Later,
    TurnClock,
    error_response,
)
from gateway.frontdoor.limits import LINGER_S, PROBE_PREFIX, Limits, Refusal, ensure_fd_room
from gateway.frontdoor.stream import StreamResponse, StreamWriter
from gateway.frontdoor.tls import TlsTransport
from profiles.schema import LimitsSpec

log = logging.getLogger("headrace.gateway")

_MAX_PIPELINED = 64  # requests queued on one connection before it stops reading

# what a connection's timer does when its deadline passes
_NONE = 0  # nothing: a request is with the handler, or the connection is closed
_IDLE = 1  # close: no request came
_HEAD = 2  # 408: a request's head is incomplete
_BODY = 3  # 408: a request's body is incomplete
_LINGER = 4  # close: a refusal was answered, what still arrives is dropped


@dataclass(slots=True)
class _Pending:
    request: HttpRequest | None  # None: answer ``early`` (a refusal) without calling the handler
    keep_alive: bool
    early: HttpResponse | None = None
    client: str = ""  # who its body's bytes are counted against until the handler takes it
    reserved: int = 0  # those bytes


class _Message:
    """The request being parsed (a plain class: one is made per request)."""

    __slots__ = ("url", "headers", "body", "size", "reserved", "client", "head", "nheaders", "received")

    def __init__(self, received: float = 0.0) -> None:
        self.url = bytearray()
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0  # body bytes received
        self.reserved = 0  # bytes counted in the server's buffered totals (all of them received)
        self.client = ""  # whom they are counted against: the server's identify(), else the address
        self.head = 0  # bytes of URL and headers (each header counted with ": " and CRLF)
        self.nheaders = 0
        self.received = received


def _refusal_response(r: Refusal) -> HttpResponse:
    headers = r.headers if r.retry_after is None else (*r.headers, ("Retry-After", str(r.retry_after)))
    return error_response(r.status, r.message, headers)


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.loop = server.loop
        self.now = server.loop.time
        self.transport: asyncio.Transport | TlsTransport | None = None
        self.raw: asyncio.Transport | None = None  # the socket's transport (below TLS)
        self.tls: TlsTransport | None = None  # the TLS layer, when the server speaks TLS
        self.parser = httptools.HttpRequestParser(self)
        self.msg = _Message()
        self.queue: deque[_Pending] = deque()
        self.busy = False
        self.waiting: asyncio.Future | None = None  # the answer being awaited (or streamed), while busy
        self.writer: StreamWriter | None = None  # the answer being streamed
        self.write_paused = 0.0  # when the transport paused writing (its buffer past the high-water mark); 0: not
        self.closing = False
        self.paused = False
        self.broken = False  # the parser failed or a refusal was made: nothing after that is read as a request
        self.probe_only = False  # accepted in the probe room past max_connections
        self.read_at = 0.0  # server.read_time() of the latest read
        self.head_seen = 0  # bytes read while the current request's head stayed incomplete
        self.phase = _NONE  # what the timer does at ``deadline`` (one timer, moved only earlier)
        self.armed = _NONE  # the phase ``deadline`` was set for
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = math.inf
        self.peer = ""  # the client's host address
        self.admitted = False  # counted in the server's connections (and its address's)
        self.stall: asyncio.TimerHandle | None = None  # answers wait on a client that does not read

    # ---- transport events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = self.raw = transport  # type: ignore[assignment]
        addr = transport.get_extra_info("peername")
        self.peer = addr[0] if isinstance(addr, tuple) and addr else ""
        if not self.server._admit(self):
            self.closing = self.broken = True
            transport.close()
            return
        if self.server.ssl_context is not None:
            self.tls = self.transport = TlsTransport(transport, self.server.ssl_context)  # type: ignore[arg-type]
        lim = self.limits
        self._expect(_IDLE, min(lim.header_timeout_s, lim.idle_timeout_s))  # the first request must come soon

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.writer is not None:
            self.writer.abort("disconnect")
        if self.waiting is not None and not self.waiting.done():
            self.waiting.cancel()  # the client is gone: a queued request leaves the scheduler
        self._release(self.msg)
        self.msg.body = []  # this object and its parser refer to each other: freed by the
        self._drop_queue()  # cycle collector, later; what they hold is let go now
        self._stop_timer()
        self._unstall()
        self.server._left(self)
        # the transport refers to this protocol and this to it: dropped now, an answer still in
        # its buffer (a client gone mid-answer) is let go at once, not at a full collection
        self.transport = self.raw = self.tls = None

    def pause_writing(self) -> None:
        self.write_paused = self.now()
        if self.writer is not None:
            self.writer.pause(self.write_paused)

    def resume_writing(self) -> None:
        self.write_paused = 0.0
        if self.writer is not None:
            self.writer.resume()
        elif self.stall is not None:  # answers held for the client to read: go on with them
            self._unstall()
            if not self.busy:
                self._next()

    def _unstall(self) -> None:
        if self.stall is not None:
            self.stall.cancel()
            self.stall = None

    def _stalled(self) -> None:
        """The client has read none of its answers for stream_write_timeout_s: it is cut off."""
        self.stall = None
        self.closing = True
        self._drop_queue()
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return
        if self.tls is not None:
            data = self.tls.decrypt(data)
            if not data:
                return
        self.read_at = self.server.read_time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            self._callback_failed(e)
            return
        except httptools.HttpParserUpgrade:
            # the request asking to upgrade (or CONNECT) is answered as plain HTTP/1.1 and closes
            # the connection (on_message_complete saw it): what follows it is not HTTP to read
            self.broken = True
            self.transport.pause_reading()  # type: ignore[union-attr]
            return
        except httptools.HttpParserError as e:
            self._answer_and_close(error_response(400, f"malformed HTTP request: {e}"))
            return
        phase = self.phase
        if phase <= _IDLE or self.closing:  # the usual end of a read: every request in it complete
            return
        if phase != self.armed:  # a request still arriving: its deadline runs from this read
            self._expect(phase, self.limits.header_timeout_s if phase == _HEAD else self.limits.body_timeout_s)
        if phase == _HEAD:  # a head spanning reads: its partial fields wait inside the parser
            self.head_seen = 0 if self.head_seen < 0 else self.head_seen + len(data)
            if self.head_seen > self.limits.max_header_bytes:
                self._answer_and_close(_refusal_response(self.limits.head_too_large()))

    def _callback_failed(self, e: httptools.HttpParserCallbackError) -> None:
        cause = e.__context__
        if isinstance(cause, Refusal):
            self._answer_and_close(_refusal_response(cause))
        else:  # a bug answers 500; the server goes on
            log.error("HTTP parser callback failed", exc_info=cause or e)
            self._answer_and_close(error_response(500, f"internal error: {type(cause).__name__}: {cause}"))

    # ---- parser callbacks (a limit raises Refusal: the parser stops, the refusal is answered)
    def on_message_begin(self) -> None:
        self.msg = _Message(self.read_at)
        self.head_seen = -1  # the read that began it is not counted (its fields are, below)
        self.phase = _HEAD  # its deadline is set at the end of the read if it is still arriving

    def on_url(self, url: bytes) -> None:
        m = self.msg
        m.url += url
        m.head += len(url)
        if len(m.url) > self.limits.max_url_bytes:
            raise self.limits.url_too_long()

    def on_header(self, name: bytes, value: bytes) -> None:
        m, lim = self.msg, self.limits
        m.head += len(name) + len(value) + 4
        m.nheaders += 1
        if m.head > lim.max_header_bytes:
            raise lim.head_too_large()
        if m.nheaders > lim.max_headers:
            raise lim.too_many_headers()
        m.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        m, lim, h = self.msg, self.limits, self.msg.headers
        if self.probe_only and not m.url.startswith(PROBE_PREFIX):
            raise lim.probes_only()
        length = h.get("content-length")
        if length is not None and length.isdigit() and int(length) > lim.max_body:
            raise lim.body_too_large()  # before reading it: answered now, what comes is dropped
        # a body is charged as its bytes arrive, to its client: known (its key checked) first
        identify = self.server.identify
        if identify is None:
            m.client = self.peer
        elif (length is not None and length != "0") or "transfer-encoding" in h:
            m.client = identify(bytes(m.url).split(b"?", 1)[0].decode("latin-1"), h, self.peer)
        if h.get("expect", "").lower() == "100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]
        self.phase = _BODY

    def on_body(self, body: bytes) -> None:
        m = self.msg
        m.size += len(body)
        if m.size > self.limits.max_body:
            raise self.limits.body_too_large()
        self._reserve(m, len(body))
        m.body.append(body)

    def on_message_complete(self) -> None:
        m, p = self.msg, self.parser
        self.phase = self.armed = _NONE
        path = bytes(m.url).split(b"?", 1)[0].decode("latin-1")
        method = p.get_method().decode("latin-1")
        if method == "CONNECT":  # a tunnel: not what a gateway offers (answered once, then closed)
            self._release(m)
            self.queue.append(_Pending(None, False, error_response(405, "CONNECT is not supported")))
            if not self.busy:
                self._next()
            return
        body = m.body[0] if len(m.body) == 1 else b"".join(m.body)
        m.body = []  # the pieces go now: a closed connection waits for the cycle collector
        # its bytes stay counted (to its client) until the handler takes it: pipelined bodies too
        pending = _Pending(HttpRequest(method, path, m.headers, body, m.received, self.peer),
                           p.should_keep_alive() and not p.should_upgrade(), None, m.client, m.reserved)
        m.reserved = 0
        self._enqueue(pending)

    # ---- limits
    def _reserve(self, m: _Message, n: int) -> None:
        server, lim = self.server, self.limits
        if server.buffered + n > lim.max_buffered_bytes:
            raise lim.buffers_full()
        held = server.client_buffered.get(m.client, 0)
        if held + n > lim.max_client_buffered_bytes:
            raise lim.client_buffers_full()
        server.buffered += n
        server.client_buffered[m.client] = held + n
        m.reserved += n

    def _release(self, m: _Message) -> None:
        if m.reserved:
            self.server._release(m.client, m.reserved)
            m.reserved = 0

    def _drop_queue(self) -> None:
        """Forget the requests waiting on this connection, and the bytes they held."""
        for pending in self.queue:
            if pending.reserved:
                self.server._release(pending.client, pending.reserved)
        self.queue.clear()

    def _expect(self, phase: int, timeout: float) -> None:
        """From now the connection is in ``phase`` until ``timeout`` seconds have passed. The
        timer is moved only when this deadline is earlier than the one it is set for; firing
        early, it sets itself again for the current deadline. (A request read whole in one read
        never gets here: its head and body deadlines are set only if it is still arriving when
        the read ends.)"""
        self.phase = self.armed = phase
        at = self.deadline = self.now() + timeout
        if at < self.timer_at:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.loop.call_at(at, self._on_timer)
            self.timer_at = at

    def _stop_timer(self) -> None:
        self.phase = _NONE
        if self.timer is not None:
            self.timer.cancel()
            self.timer, self.timer_at = None, math.inf

    def _on_timer(self) -> None:
        self.timer, self.timer_at = None, math.inf
        phase = self.phase
        if phase == _NONE or self.transport is None:
            return
        if self.now() < self.deadline:
            self.timer_at = self.deadline
            self.timer = self.loop.call_at(self.deadline, self._on_timer)
            return
        if phase in (_IDLE, _LINGER):
            self._close()
        elif self.paused:  # the server stopped reading (answers pending): not the client's doing
            self._expect(phase, self.limits.header_timeout_s if phase == _HEAD else self.limits.body_timeout_s)
        else:
            r = self.limits.head_timed_out() if phase == _HEAD else self.limits.body_timed_out()
            self._answer_and_close(_refusal_response(r))

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
            if self.write_paused:  # the client is not reading its answers: no more until it does
                self._hold()
                return
            pending = self.queue.popleft()
            if pending.request is None:
                self._write(pending.early, False, linger=True)  # type: ignore[arg-type]
                continue
            if pending.reserved:  # the body is the handler's now
                self.server._release(pending.client, pending.reserved)
                pending.reserved = 0
            try:
                answer = self.server.handler(pending.request)
            except Exception as e:  # noqa: BLE001  (a bug answers 500; the server goes on)
                log.error("HTTP handler failed", exc_info=e)
                answer = error_response(500, f"internal error: {type(e).__name__}: {e}")
            if isinstance(answer, HttpResponse):
                self._write(answer, pending.keep_alive)
                continue
            if isinstance(answer, StreamResponse):
                self._start_stream(answer, pending.keep_alive)
                return
            self.busy = True
            if isinstance(answer, Later):
                later, make = answer.future, answer.make
            else:  # a future stays itself, a coroutine becomes a task
                later, make = asyncio.ensure_future(answer), asyncio.Future.result
            self.server._tasks.add(later)
            self.waiting = later
            later.add_done_callback(lambda t, ka=pending.keep_alive, mk=make: self._done(t, ka, mk))
            return
        self.busy = False
        if self.closing:
            return
        if self.paused:
            self.paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        if self.phase == _NONE and not self.broken:  # no request under way: idle until one begins
            self._expect(_IDLE, self.limits.idle_timeout_s)

    def _hold(self) -> None:
        """Answers wait until the client reads the ones written: reading stops (so what it
        pipelines stays in its socket), and a client that reads nothing for
        stream_write_timeout_s is cut off."""
        self.busy = False
        if not self.paused:
            self.paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        if self.stall is None:
            self.stall = self.loop.call_later(self.server.stream_write_timeout_s, self._stalled)

    def _done(self, task: asyncio.Future, keep_alive: bool,
              make: Callable[[asyncio.Future], HttpResponse | StreamResponse]) -> None:
        self.server._tasks.discard(task)
        self.waiting = None
        if task.cancelled():
            resp = error_response(503, "gateway is shutting down")
        else:
            try:
                resp = make(task)
            except Exception as e:  # noqa: BLE001  (a bug answers 500; the server goes on)
                log.error("HTTP handler failed", exc_info=e)
                resp = error_response(500, f"internal error: {type(e).__name__}: {e}")
        if isinstance(resp, StreamResponse):
            self._start_stream(resp, keep_alive)
            return
        self._write(resp, keep_alive)
        self._next()

    # ---- streamed answers
    def _start_stream(self, resp: StreamResponse, keep_alive: bool) -> None:
        """Write ``resp`` as its chunks come, in a task; the next answer waits for its end."""
        if self.transport is None:  # the client left before its answer began: the stream ends
            if resp.aborted is not None:
                resp.aborted("disconnect")
            if (aclose := getattr(resp.chunks, "aclose", None)) is not None:
                task = self.loop.create_task(aclose())
                self.server._tasks.add(task)
                task.add_done_callback(self.server._tasks.discard)
            return
        self.busy = True
        keep_alive = keep_alive and not self.server.stopping
        writer = self.writer = StreamWriter(resp, self.transport, self.raw, keep_alive,  # type: ignore[arg-type]
                                            self.server.stream_write_timeout_s, self.write_paused)
        task = self.loop.create_task(writer.run())
        self.server._tasks.add(task)
        self.waiting = task
        task.add_done_callback(lambda t: self._streamed(t, keep_alive))

    def _streamed(self, task: asyncio.Future, keep_alive: bool) -> None:
        self.server._tasks.discard(task)
        self.waiting = self.writer = None
        failed = not task.cancelled() and task.exception() is not None
        if failed:
            log.error("streamed answer failed", exc_info=task.exception())
        if failed or not keep_alive:  # a body cut short, or ended by closing
            self._close()
        self._next()

    def _write(self, resp: HttpResponse, keep_alive: bool, linger: bool = False) -> None:
        if self.closing:
            return
        # a connection let in past max_connections serves one probe: the room is for others too
        keep_alive = keep_alive and not self.server.stopping and not self.probe_only
        self.transport.write(resp.encode(keep_alive))  # type: ignore[union-attr]
        if not keep_alive:
            self._close(linger)

    def _answer_and_close(self, resp: HttpResponse) -> None:
        """A request refused or that the parser cannot make sense of: answer after those ahead
        of it, then close (the byte stream cannot be resynchronised). Its body is dropped."""
        self.broken = True
        self._release(self.msg)
        self.msg.body = []
        self.phase = _NONE
        server, m = self.server, self.msg
        path = bytes(m.url).split(b"?", 1)[0].decode("latin-1")
        if server.refusal_shape is not None:
            resp = server.refusal_shape(path, resp)
        if server.on_refusal is not None:
            server.on_refusal(path, m.headers, m.received, resp)
        self.queue.append(_Pending(None, False, resp))
        self.transport.pause_reading()  # type: ignore[union-attr]
        if not self.busy:
            self._next()

    def _close(self, linger: bool = False) -> None:
        """Close; with ``linger`` (after a refusal) first send EOF and drop what the client
        still sends for up to LINGER_S, so it reads the answer instead of a reset."""
        self.closing = True
        self._drop_queue()
        self._release(self.msg)
        t = self.transport
        if t is None or t.is_closing():
            self._stop_timer()
            return
        if linger and t.can_write_eof():
            self.broken = True
            t.write_eof()
            t.resume_reading()
            self._expect(_LINGER, min(LINGER_S, self.limits.body_timeout_s))
            return
        self._stop_timer()
        t.close()

    def close_if_idle(self) -> None:
        if not self.busy and not self.queue:
            self._close()


class HttpServer:
    """``await start(host, port)`` -> bound port; ``await stop()`` finishes what it accepted.
    ``limits`` (:class:`~profiles.schema.LimitsSpec`, its defaults when None) bounds what
    clients may ask of it; ``buffered`` is the bytes of request bodies still arriving;
    ``ssl_context``: speak TLS with this server context; ``stream_write_timeout_s``: how long a
    streamed answer's client may leave its socket full before the stream is aborted."""

    def __init__(self, handler: Handler, max_body: int,
                 clock: Callable[[], float] = time.monotonic, limits: LimitsSpec | None = None,
                 ssl_context: ssl.SSLContext | None = None, stream_write_timeout_s: float = 30.0) -> None:
        self.handler = handler
        self.stream_write_timeout_s = stream_write_timeout_s  # a streamed answer's client may read nothing this long
        self.ssl_context = ssl_context  # every connection speaks TLS with it
        self.max_body = max_body
        self.limits = Limits.of(limits, max_body)
        self.read_time = TurnClock(clock)
        self.stopping = False
        self.buffered = 0
        self.client_buffered: dict[str, int] = {}  # the same bytes by client (only those holding some)
        self.address_connections: dict[str, int] = {}  # open connections by client address
        self.refused_connections = 0  # closed at once: past max_connections + probe_connections
        # (path, headers, address) -> the client a request body is counted against (its tenant),
        # called before the body is read; raises Refusal (a missing or unknown key: 401) to refuse
        # it unread. None: every client is its address.
        self.identify: Callable[[str, dict[str, str], str], str] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[_Connection] = set()
        self._tasks: set[asyncio.Future] = set()  # answers still to come
        self._warned_full = False
        # told of each request refused here, before a handler saw it (a limit, malformed HTTP):
        # its path and headers as far as they were read, when it was read, the answer
        self.on_refusal: Callable[[str, dict[str, str], float, HttpResponse], None] | None = None
        self.refusal_shape: Callable[[str, HttpResponse], HttpResponse] | None = None  # (path, refusal) -> as its route answers

    async def start(self, host: str, port: int, reuse_port: bool = False) -> int:
        """Listen on ``host:port`` (0: any free); ``reuse_port``: share it with other processes
        listening there with SO_REUSEPORT (the kernel spreads connections over them)."""
        self.loop = asyncio.get_running_loop()
        ensure_fd_room(self.limits)
        self._server = await self.loop.create_server(lambda: _Connection(self), host, port, backlog=1024,
                                                     reuse_port=reuse_port or None)
        return self._server.sockets[0].getsockname()[1]

    def _admit(self, conn: _Connection) -> bool:
        """Count a new connection in: past max_connections it may only serve health probes,
        past the probe room, or past max_address_connections from its address, it is refused
        (False)."""
        lim, n = self.limits, len(self._conns)
        mine = self.address_connections.get(conn.peer, 0)
        if mine >= lim.max_address_connections:
            self.refused_connections += 1
            if not self._warned_full:
                self._warned_full = True
                log.warning("%d connections from %s (limits.max_address_connections): closing new ones from it",
                            mine, conn.peer)
            return False
        if n >= lim.max_connections:
            if n >= lim.max_connections + lim.probe_connections:
                self.refused_connections += 1
                if not self._warned_full:
                    self._warned_full = True
                    log.warning("%d client connections (limits.max_connections %d + probe_connections %d): "
                                "closing new ones", n, lim.max_connections, lim.probe_connections)
                return False
            conn.probe_only = True
        elif self._warned_full and n < lim.max_connections // 2:
            self._warned_full = False
        self._conns.add(conn)
        self.address_connections[conn.peer] = mine + 1
        conn.admitted = True
        return True

    def _left(self, conn: _Connection) -> None:
        """``conn`` closed: counted out."""
        if conn.admitted:
            conn.admitted = False
            self._conns.discard(conn)
            mine = self.address_connections[conn.peer] - 1
            if mine:
                self.address_connections[conn.peer] = mine
            else:
                del self.address_connections[conn.peer]

    def _release(self, client: str, n: int) -> None:
        """``n`` bytes of ``client``'s requests no longer held here."""
        self.buffered -= n
        held = self.client_buffered[client] - n
        if held:
            self.client_buffered[client] = held
        else:
            del self.client_buffered[client]

    @property
    def connections(self) -> int:
        """Client connections open now."""
        return len(self._conns)

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
