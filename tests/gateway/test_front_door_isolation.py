"""One HTTP client cannot take the front door away from others: its bodies are charged as
they arrive and to it (its tenant, or its address), a key is checked before a body is read,
its answers wait for it to read them, its address holds a bounded share of the connections,
and a protocol upgrade or CONNECT gets one answer. Each test holds one client to its share and
shows another is served meanwhile."""

from __future__ import annotations

import asyncio
import time

from gateway.frontdoor.httpserver import HttpRequest, HttpResponse, HttpServer
from gateway.frontdoor.limits import Refusal
from profiles.schema import LimitsSpec
from tests.gateway.test_front_door_limits import (
    MiB,
    door,
    exchange,
    get,
    parse,
    post_head,
    run,  # noqa: F401  (fixture)
    send,
    serving,
    until,
    until_closed,
)


async def connect(port: int, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def answers(reader: asyncio.StreamReader, timeout: float = 2.0) -> list[int]:
    """The statuses of every answer the server sends until it closes the connection."""
    data = await until_closed(reader, timeout)
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        n = next(int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length"))
        out.append(int(lines[0].split()[1]))
        data = rest[n:]
    return out


# --------------------------------------------------------------------------- bodies


def test_one_client_past_max_client_buffered_bytes_gets_429_and_others_go_on(run) -> None:  # noqa: F811
    """Bytes are counted per client (here its address): one client holding its share cannot
    take another's."""
    async def main() -> None:
        async with serving(max_body=MiB, max_buffered_bytes=4 * MiB, max_client_buffered_bytes=MiB,
                           header_timeout_s=30, body_timeout_s=30) as (server, port):
            held = []
            for _ in range(3):  # 3 x 300 kB of unfinished bodies from 127.0.0.2
                _, w = await connect(port, "127.0.0.2")
                await send(w, post_head("/upload", 400_000) + b"x" * 300_000)
                held.append(w)
            await until(lambda: server.client_buffered.get("127.0.0.2") == 900_000)
            reader, w = await connect(port, "127.0.0.2")
            await send(w, post_head("/upload", 400_000) + b"x" * 200_000)
            refused = parse(await until_closed(reader))
            assert refused.status == 429 and refused.headers["retry-after"] == "1"
            assert "max_client_buffered_bytes (1048576 bytes)" in refused.doc["error"]
            w.close()
            # another address is not held back by it
            done, _ = await exchange(port, post_head("/upload", 700_000, b"Connection: close\r\n") + b"z" * 700_000)
            assert done.status == 200 and done.doc["len"] == 700_000
            for w in held:
                w.close()
            await until(lambda: server.buffered == 0 and server.client_buffered == {})

    run(main())


def test_declared_lengths_reserve_nothing(run) -> None:  # noqa: F811
    """Four connections declaring 64 MiB bodies and sending none hold no buffer: another
    client's body is read and answered."""
    async def main() -> None:
        async with serving(max_body=64 * MiB, max_buffered_bytes=64 * MiB, header_timeout_s=30,
                           body_timeout_s=30) as (server, port):
            held = []
            for _ in range(4):
                _, w = await connect(port, "127.0.0.2")
                await send(w, post_head("/v2/models/m/infer", 64 * MiB))
                held.append(w)
            await asyncio.sleep(0.05)
            assert server.buffered == 0
            done, took = await exchange(port, post_head("/upload", MiB, b"Connection: close\r\n") + b"z" * MiB)
            assert done.status == 200 and done.doc["len"] == MiB and took < 1.0
            for w in held:
                w.close()

    run(main())


def test_pipelined_bodies_stay_counted_until_the_handler_takes_them(run) -> None:  # noqa: F811
    """Requests pipelined behind a slow one keep their bytes charged to their client: a
    connection cannot queue past its client's share."""
    async def main() -> None:
        async with serving(max_body=MiB, max_client_buffered_bytes=MiB, header_timeout_s=30,
                           body_timeout_s=30) as (server, port):
            reader, w = await connect(port, "127.0.0.2")
            body = b"q" * 300_000
            await send(w, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n" + (post_head("/upload", len(body)) + body) * 4)
            statuses = await answers(reader, 5.0)
            assert statuses == [200, 200, 200, 200, 429], statuses  # the slow one, 3 x 300 kB, refused
            await until(lambda: server.buffered == 0 and server.client_buffered == {})

    run(main())


def test_a_keyed_gateway_refuses_a_body_without_a_valid_key_before_reading_it(run) -> None:  # noqa: F811
    def identify(path: str, headers: dict[str, str], peer: str) -> str:
        if headers.get("x-api-key") != "good":
            raise Refusal(401, "unknown API key", headers=(("WWW-Authenticate", "Bearer"),))
        return "tenant:a"

    async def main() -> None:
        async with serving(max_body=64 * MiB, header_timeout_s=30, body_timeout_s=30) as (server, port):
            server.identify = identify
            reader, w = await connect(port)
            await send(w, post_head("/v2/models/m/infer", 60 * MiB, b"x-api-key: bad\r\n") + b"z" * 65536)
            t = time.perf_counter()
            refused = parse(await until_closed(reader))
            assert refused.status == 401 and refused.headers["www-authenticate"] == "Bearer"
            assert time.perf_counter() - t < 1.0 and server.buffered == 0
            w.close()
            reader, w = await connect(port)
            await send(w, post_head("/upload", 100_000, b"x-api-key: good\r\n") + b"z" * 50_000)
            await until(lambda: server.client_buffered.get("tenant:a") == 50_000)
            await send(w, b"z" * 50_000)
            assert parse(await reader.readuntil(b"}")).doc["len"] == 100_000
            w.close()

    run(main())


# --------------------------------------------------------------------------- answers


def test_answers_wait_for_a_client_that_reads_none_and_it_is_cut_off(run) -> None:  # noqa: F811
    """A connection pipelining requests for large answers and reading none stops being served
    (and read) once its socket is full; others' probes answer at once; after
    stream_write_timeout_s it is closed."""
    served = [0]
    big = b"m" * (256 << 10)

    def handler(req: HttpRequest) -> HttpResponse:
        if req.path == "/metrics":
            served[0] += 1
            return HttpResponse(200, big, "text/plain")
        return door(req)

    async def main() -> None:
        server = HttpServer(handler, MiB, limits=LimitsSpec(), stream_write_timeout_s=1.0)
        port = await server.start("127.0.0.1", 0)
        try:
            reader, w = await connect(port, "127.0.0.2")
            w.transport.set_write_buffer_limits(high=1 << 22)
            await send(w, get("/metrics") * 2000)
            await asyncio.sleep(0.3)
            stuck = served[0]
            assert stuck < 200, stuck  # bounded by what its socket holds, not by what it sent
            t = time.perf_counter()
            probe, _ = await exchange(port, get("/v2/health/ready", b"Connection: close\r\n"))
            assert probe.status == 200 and time.perf_counter() - t < 0.25
            await asyncio.sleep(0.3)
            assert served[0] == stuck  # nothing more for it while it reads nothing
            await until(lambda: server.connections == 0, 3.0)  # cut off after 1 s without reading
            w.close()
        finally:
            await server.stop(timeout=1)

    run(main())


def test_a_client_that_reads_slowly_gets_every_answer(run) -> None:  # noqa: F811
    """Back-pressure is not a refusal: a client that reads late still gets every answer."""
    big = b"m" * (256 << 10)

    def handler(req: HttpRequest) -> HttpResponse:
        return HttpResponse(200, big, "text/plain")

    async def main() -> None:
        server = HttpServer(handler, MiB, limits=LimitsSpec(), stream_write_timeout_s=5.0)
        port = await server.start("127.0.0.1", 0)
        try:
            reader, w = await connect(port)
            await send(w, get("/a") * 99 + get("/a", b"Connection: close\r\n"))
            await asyncio.sleep(0.5)
            assert await answers(reader, 5.0) == [200] * 100
            w.close()
        finally:
            await server.stop(timeout=1)

    run(main())


# --------------------------------------------------------------------------- connections


def test_one_address_holds_at_most_max_address_connections(run) -> None:  # noqa: F811
    async def main() -> None:
        async with serving(max_connections=100, probe_connections=4, max_address_connections=5) as (server, port):
            held = [await connect(port, "127.0.0.2") for _ in range(5)]
            await until(lambda: server.address_connections.get("127.0.0.2") == 5)
            reader, w = await connect(port, "127.0.0.2")
            await send(w, get("/v2/health/ready"))
            assert await until_closed(reader) == b""  # closed unanswered
            assert server.refused_connections == 1
            # another address is served
            probe, _ = await exchange(port, get("/v2/health/ready", b"Connection: close\r\n"))
            assert probe.status == 200
            held.pop()[1].close()  # one gone, the address may connect again
            await until(lambda: server.address_connections.get("127.0.0.2") == 4)
            r2, w2 = await connect(port, "127.0.0.2")
            await send(w2, get("/v2/health/ready", b"Connection: close\r\n"))
            assert parse(await until_closed(r2)).status == 200
            for _, hw in held:
                hw.close()
            await until(lambda: server.address_connections == {})

    run(main())


def test_probe_room_fills_with_no_one_client(run) -> None:  # noqa: F811
    """10x the probe room of keep-alive connections from one address, each asking one probe,
    leave the room to a probe from elsewhere: a probe-room connection serves one probe and
    closes, and one address holds at most its share."""
    async def main() -> None:
        async with serving(max_connections=8, probe_connections=4, max_address_connections=10) as (server, port):
            attackers = []
            for _ in range(120):
                try:
                    r, w = await connect(port, "127.0.0.2")
                except OSError:
                    continue
                await send(w, get("/v2/health/live"))
                attackers.append((r, w))
            await asyncio.sleep(0.1)
            assert server.connections <= 10
            for _ in range(20):
                probe, took = await exchange(port, get("/v2/health/ready"), timeout=1.0)
                assert probe.status == 200 and took < 0.25
            for _, w in attackers:
                w.close()

    run(main())


# --------------------------------------------------------------------------- one answer per request


def test_upgrade_and_connect_get_one_answer_each(run) -> None:  # noqa: F811
    async def main() -> None:
        async with serving() as (server, port):
            for raw, want in [
                (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                 b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n" + get("/after"), [200]),
                (b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", [200]),
                (b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n" + get("/after"), [405]),
                (get("/first") + b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", [200, 405]),
            ]:
                reader, w = await connect(port)
                await send(w, raw)
                assert await answers(reader) == want, raw
                w.close()

    run(main())
