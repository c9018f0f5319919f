"""The gateway's HTTP/1.1 server on its own: framing, keep-alive, pipelining, limits."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.frontdoor.httpserver import HttpRequest, HttpResponse, HttpServer, TurnClock


async def echo(req: HttpRequest) -> HttpResponse:
    if req.path == "/slow":
        await asyncio.sleep(0.05)
    if req.path == "/boom":
        raise RuntimeError("bug")
    doc = {"method": req.method, "path": req.path, "len": len(req.body),
           "slo": req.headers.get("x-headrace-slo-ms")}
    return HttpResponse(200, json.dumps(doc).encode(), "application/json")


async def exchange(raw: bytes, max_body: int = 1 << 20, read_until_close: bool = True) -> bytes:
    server = HttpServer(echo, max_body)
    port = await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(-1) if read_until_close else reader.read(65536), 5)
        writer.close()
        return data
    finally:
        await server.stop()


def answers(data: bytes) -> list[tuple[int, dict]]:
    """Split a byte stream of responses (Content-Length framed) into (status, json body)."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        hdrs = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        n = int(hdrs["content-length"])
        out.append((status, json.loads(rest[:n]) if n else {}))
        data = rest[n:]
    return out


def test_pipelined_requests_are_answered_in_order_and_close_is_honoured() -> None:
    raw = (b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
           b"POST /a?q=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nX-Headrace-SLO-ms: 50\r\n\r\nabc"
           b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got = answers(asyncio.run(exchange(raw)))
    assert [d["path"] for _, d in got] == ["/slow", "/a", "/b"]  # order kept despite /slow
    assert got[1][1] == {"method": "POST", "path": "/a", "len": 3, "slo": "50"}


def test_chunked_body_and_expect_continue() -> None:
    raw = (b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n"
           b"Connection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    data = asyncio.run(exchange(raw))
    assert data.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert answers(data[len(b"HTTP/1.1 100 Continue\r\n\r\n"):]) == [
        (200, {"method": "POST", "path": "/c", "len": 5, "slo": None})]


@pytest.mark.parametrize("body_header", [b"Content-Length: 100\r\n\r\n" + b"x" * 100,
                                         b"Transfer-Encoding: chunked\r\n\r\n64\r\n" + b"x" * 100 + b"\r\n0\r\n\r\n"])
def test_oversized_body_is_read_then_answered_413_and_closed(body_header: bytes) -> None:
    data = asyncio.run(exchange(b"POST /big HTTP/1.1\r\nHost: x\r\n" + body_header, max_body=10))
    (status, doc), = answers(data)
    assert status == 413 and "exceeds 10 bytes" in doc["error"]
    assert b"Connection: close" in data


def test_malformed_request_is_400_and_closed() -> None:
    data = asyncio.run(exchange(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\nNOT HTTP AT ALL\r\n\r\n"))
    got = answers(data)
    assert got[0][0] == 200 and got[1][0] == 400 and "malformed" in got[1][1]["error"]


def test_handler_bug_is_a_500_with_a_message_not_a_hang() -> None:
    (status, doc), = answers(asyncio.run(exchange(b"GET /boom HTTP/1.1\r\nConnection: close\r\n\r\n")))
    assert status == 500 and "RuntimeError: bug" in doc["error"]


def stop_during(handler, path: str, timeout: float) -> bytes:
    """Send one request, stop the server (with ``timeout``) while its handler runs, and
    return everything the client received until the connection closed."""
    async def go() -> bytes:
        started = asyncio.Event()

        async def watched(req: HttpRequest) -> HttpResponse:
            started.set()
            return await handler(req)

        server = HttpServer(watched, 1 << 20)
        port = await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        await started.wait()
        await server.stop(timeout=timeout)
        data = await asyncio.wait_for(reader.read(-1), 5)
        writer.close()
        return data

    return asyncio.run(go())


def test_stop_lets_a_running_handler_answer() -> None:
    data = stop_during(echo, "/slow", timeout=5)
    (status, doc), = answers(data)
    assert status == 200 and doc["path"] == "/slow" and b"Connection: close" in data


def test_stop_answers_a_handler_that_outlives_the_timeout_with_503() -> None:
    async def stuck(req: HttpRequest) -> HttpResponse:
        await asyncio.Event().wait()  # never set
        raise AssertionError("unreachable")

    (status, doc), = answers(stop_during(stuck, "/x", timeout=0.05))
    assert status == 503 and "shutting down" in doc["error"]


def test_requests_read_in_one_loop_turn_share_their_received_time() -> None:
    """A burst read in one turn keeps the turn's start as its arrival: the later requests of
    the burst do not lose the time spent parsing the earlier ones."""
    ticks = iter(range(1, 1000))
    seen: list[float] = []

    async def record(req: HttpRequest) -> HttpResponse:
        seen.append(req.received)
        return HttpResponse(200, b"{}", "application/json")

    async def main() -> None:
        server = HttpServer(record, 1 << 20, clock=lambda: float(next(ticks)))
        port = await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n" * 3)  # one segment, one read
            for _ in range(3):
                await asyncio.wait_for(reader.readuntil(b"{}"), 5)
            writer.write(b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await asyncio.wait_for(reader.read(-1), 5)
            writer.close()
        finally:
            await server.stop()

    asyncio.run(main())
    assert len(seen) == 4
    assert seen[0] == seen[1] == seen[2]  # the burst: one clock read for the turn
    assert seen[3] > seen[0]  # a later turn reads the clock again


def test_turn_clock_reads_the_clock_once_per_loop_turn() -> None:
    reads = iter(range(1, 100))
    turn = TurnClock(lambda: float(next(reads)))

    async def main() -> list[float]:
        first = [turn(), turn(), turn()]
        await asyncio.sleep(0)  # the next turn
        return [*first, turn(), turn()]

    assert asyncio.run(main()) == [1.0, 1.0, 1.0, 2.0, 2.0]


def answer_now_or_later(req: HttpRequest):
    """A handler in the gateway's style: an answer at once, a future of one, or a bug."""
    if req.path == "/raise":
        raise RuntimeError("sync bug")
    if req.path == "/later":
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, HttpResponse(200, b'{"later": 1}', "application/json"))
        return fut
    if req.path == "/never":
        return asyncio.get_running_loop().create_future()
    return HttpResponse(200, b'{"now": 1}', "application/json")


def test_answers_now_later_and_from_a_bug_keep_request_order() -> None:
    async def main() -> bytes:
        server = HttpServer(answer_now_or_later, 1 << 20)
        port = await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /later HTTP/1.1\r\nHost: x\r\n\r\nGET /raise HTTP/1.1\r\nHost: x\r\n\r\n"
                         b"GET /now HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = await asyncio.wait_for(reader.read(-1), 5)
            writer.close()
            return data
        finally:
            await server.stop()

    got = answers(asyncio.run(main()))
    assert [s for s, _ in got] == [200, 500, 200]
    assert got[0][1] == {"later": 1} and "sync bug" in got[1][1]["error"] and got[2][1] == {"now": 1}


def test_stop_answers_a_future_that_never_resolves_with_503() -> None:
    async def main() -> bytes:
        server = HttpServer(answer_now_or_later, 1 << 20)
        port = await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /never HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        while not server._tasks:  # noqa: SLF001  (until the request is being handled)
            await asyncio.sleep(0)
        await server.stop(timeout=0.05)
        data = await asyncio.wait_for(reader.read(-1), 5)
        writer.close()
        return data

    (status, doc), = answers(asyncio.run(main()))
    assert status == 503 and "shutting down" in doc["error"]


def test_an_answer_that_cannot_be_encoded_is_a_500_not_a_hang(monkeypatch) -> None:
    import gateway.frontdoor.http as door_mod

    class OneModel:
        def model(self, name: str) -> None:
            pass

        def submit(self, name, inp, slo_header, received, **contract):
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(object())  # any result: encoding it fails below
            return fut

    def broken(*args) -> HttpResponse:
        raise ValueError("cannot encode")

    monkeypatch.setattr(door_mod, "_inferred", broken)

    async def main() -> bytes:
        door = door_mod.HttpFrontDoor(OneModel(), type("Info", (), {"clock": staticmethod(lambda: 0.0),
                                                                  "record": lambda *a, **k: None})(), 1 << 20)
        server = HttpServer(door, 1 << 20)
        port = await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}'
            writer.write(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            data = await asyncio.wait_for(reader.read(-1), 5)
            writer.close()
            return data
        finally:
            await server.stop()

    (status, doc), = answers(asyncio.run(main()))
    assert status == 500 and "cannot encode" in doc["error"]
