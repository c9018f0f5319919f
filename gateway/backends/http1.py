"""HTTP/1.1 client framing: request heads, and a keep-alive connection that carries one
request at a time and parses its answer with httptools (llhttp) as the bytes arrive.

Two clients are built on it: the gateway's Triton replica client (``gateway.backends.http``)
and the load generator's raw pool (``loadgen.clients``). Each subclasses :class:`Connection`
and says what a complete answer (:meth:`Connection.answered`) and a missing one
(:meth:`Connection.failed`) mean to it. Answers are framed by ``Content-Length`` or chunked
transfer coding. An answer framed by the end of the connection is not read (the connection is
meant for the next request): it fails when that end comes. The check runs then, not per
answer, so the hot path pays nothing for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httptools

Headers = dict[bytes, bytes]  # header names lower-cased


def request_head(method: bytes, target: bytes, host: bytes, length: int, headers: bytes = b"") -> bytes:
    """The head of a request whose body is ``length`` bytes. ``host`` is the Host header's
    value (``host:port``); ``headers`` are further header lines, each ending in CRLF."""
    return b"%s %s HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n" % (method, target, host, headers, length)


class AnswerTooLarge(ValueError):
    """An answer past the connection's ``max_body``: the request's fault, not the server's."""


class Connection(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight (no pipelining).

    Each :meth:`send` gets exactly one of :meth:`answered` (the whole answer) or
    :meth:`failed`: a ``ValueError`` for a malformed or oversized answer (the connection is
    then closed) or one framed by the connection's end (once it ends), a ``ConnectionError``
    for a connection lost otherwise. ``closed`` is set once the connection cannot carry another request (closed by
    either side, or an answer without keep-alive).
    """

    __slots__ = ("max_body", "transport", "parser", "busy", "headers", "body", "size", "closed")

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.busy = False  # a request in flight, not yet answered or failed
        self.headers: Headers = {}
        self.body: list[bytes] = []
        self.size = 0
        self.closed = False

    def answered(self, status: int, headers: Headers, body: bytes) -> None:
        """The answer to the request in flight."""
        raise NotImplementedError

    def failed(self, e: Exception) -> None:
        """The request in flight gets no answer; ``e`` says why."""
        raise NotImplementedError

    def send(self, parts: Sequence[bytes]) -> None:
        """Write a request: its head and body parts."""
        self.headers, self.body, self.size, self.busy = {}, [], 0, True
        self.transport.writelines(parts)  # type: ignore[union-attr]

    def close(self) -> None:
        self.closed = True
        # the parser refers back to this connection: until the cycle collector frees the pair,
        # an answer cut off (refused, cancelled) would keep its pieces
        self.body = []
        if self.transport is not None:
            self.transport.close()

    def refuse(self, e: Exception) -> None:
        """Fail the request in flight with ``e`` and close the connection."""
        self.close()
        if self.busy:
            self.busy = False
            self.failed(e)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        h = self.headers
        if self.busy and h and b"content-length" not in h and b"transfer-encoding" not in h:
            self.refuse(ValueError("an answer framed by the end of the connection"))
        else:
            self.refuse(ConnectionError(f"connection lost: {exc}" if exc else "connection closed by the server"))

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            raise  # a fault of answered() or failed(), not of the answer
        except httptools.HttpParserError as e:
            self.refuse(ValueError(f"malformed HTTP answer: {e}"))

    # httptools' callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.max_body:
            self.refuse(AnswerTooLarge(f"response body exceeds {self.max_body} bytes"))
        elif self.busy:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if not self.busy:  # refused, or an answer nothing asked for
            return
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []  # a pooled connection keeps no answer's pieces until its next request
        if not self.parser.should_keep_alive():
            self.close()
        self.busy = False
        self.answered(self.parser.get_status_code(), self.headers, body)
