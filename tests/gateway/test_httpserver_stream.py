"""The HTTP server's streamed answers on their own: chunked framing on keep-alive connections,
a close-delimited body otherwise, the answers behind a stream kept in order, and a stream told
why it ended early (its client gone, or not reading) with its source closed."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

from gateway.frontdoor.httpserver import HttpRequest, HttpResponse, HttpServer
from gateway.frontdoor.stream import StreamResponse


class Source:
    """Events as a streamed answer's source: ``n`` of them, ``gap`` seconds apart; records
    whether it was closed and why the stream was aborted."""

    def __init__(self, n: int, gap: float = 0.0, size: int = 8) -> None:
        self.n, self.gap, self.size = n, gap, size
        self.closed = asyncio.Event()
        self.reasons: list[str] = []

    async def events(self) -> AsyncIterator[bytes]:
        try:
            for i in range(self.n):
                if self.gap:
                    await asyncio.sleep(self.gap)
                yield b"data: %d%b\n\n" % (i, b"x" * self.size)
        finally:
            self.closed.set()


def server_of(sources: list[Source], write_timeout: float = 30.0) -> HttpServer:
    def handler(req: HttpRequest) -> HttpResponse | StreamResponse:
        if req.path == "/plain":
            return HttpResponse(200, b"plain", "text/plain")
        src = sources.pop(0)
        return StreamResponse(200, src.events(), aborted=src.reasons.append)

    return HttpServer(handler, 1 << 20, stream_write_timeout_s=write_timeout)


def test_a_stream_is_chunked_and_the_next_answer_waits_for_its_end() -> None:
    async def run() -> bytes:
        src = Source(3, gap=0.01)
        server = server_of([src])
        port = await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /s HTTP/1.1\r\nHost: x\r\n\r\nGET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = await asyncio.wait_for(reader.read(-1), 5)
            writer.close()
            assert src.closed.is_set() and src.reasons == []
            return data
        finally:
            await server.stop()

    data = asyncio.run(run())
    head, _, rest = data.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head and b"text/event-stream" in head
    body, _, after = rest.partition(b"0\r\n\r\n")
    assert body == b"".join(b"%x\r\ndata: %dxxxxxxxx\n\n\r\n" % (len(b"data: 0xxxxxxxx\n\n"), i) for i in range(3))
    assert after.startswith(b"HTTP/1.1 200 OK") and after.endswith(b"plain")


def test_without_keep_alive_the_stream_ends_with_the_connection() -> None:
    async def run() -> bytes:
        server = server_of([Source(2)])
        port = await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /s HTTP/1.0\r\n\r\n")
            data = await asyncio.wait_for(reader.read(-1), 5)
            writer.close()
            return data
        finally:
            await server.stop()

    head, _, body = asyncio.run(run()).partition(b"\r\n\r\n")
    assert b"Connection: close" in head and b"chunked" not in head
    assert body == b"data: 0xxxxxxxx\n\ndata: 1xxxxxxxx\n\n"


def test_a_client_that_leaves_aborts_the_stream_and_closes_its_source() -> None:
    async def run() -> Source:
        src = Source(10_000, gap=0.005)
        server = server_of([src])
        port = await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
            await reader.readuntil(b"data: 2")
            writer.close()
            await asyncio.wait_for(src.closed.wait(), 5)
            return src
        finally:
            await server.stop()

    assert asyncio.run(run()).reasons == ["disconnect"]


def test_a_client_that_stops_reading_is_aborted_after_the_write_timeout() -> None:
    async def run() -> tuple[Source, float]:
        src = Source(100_000, size=1000)  # as fast as the socket takes it
        server = server_of([src], write_timeout=0.3)
        port = await server.start("127.0.0.1", 0)
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await loop.sock_sendall(sock, b"GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
            start = loop.time()
            await asyncio.wait_for(src.closed.wait(), 5)  # never read: the server gives up
            return src, loop.time() - start
        finally:
            sock.close()
            await server.stop()

    src, took = asyncio.run(run())
    assert src.reasons == ["write_timeout"] and took >= 0.3
