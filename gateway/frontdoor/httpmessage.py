"""What the gateway's HTTP server (:mod:`gateway.frontdoor.httpserver`) hands a handler and
takes back: a request, an answer now or later, and the clock a burst of requests is stamped
with."""

from __future__ import annotations

import asyncio
import json
import mmap
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.frontdoor.stream import StreamResponse

_REASONS = {
    100: "Continue", 200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 413: "Payload Too Large", 414: "URI Too Long",
    429: "Too Many Requests", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
    501: "Not Implemented", 503: "Service Unavailable", 504: "Gateway Timeout",
}


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
    peer: str = ""  # the client's address (host only): who the per-client limits count it against


@dataclass(slots=True)
class HttpResponse:
    status: int
    body: bytes | mmap.mmap = b""  # mmap: a large answer as a worker wrote it (gateway.frontdoor.encode)
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


# A handler answers at once (an HttpResponse or a StreamResponse), or later: a Later, an asyncio Future of a
# response (followed by a callback, no task) or a coroutine (run as a task).
Handler = Callable[[HttpRequest], "HttpResponse | StreamResponse | Later | Awaitable[HttpResponse | StreamResponse]"]
