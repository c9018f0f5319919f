"""HTTP/1.1 client framing on its own: each request gets exactly one outcome, whole answers
(by Content-Length or chunked, in any split) on one kept-alive connection, and a refusal that
closes the connection for an answer it cannot frame."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.backends.http import TritonHttpReplica
from gateway.backends.http1 import AnswerTooLarge, Connection, Headers, request_head
from gateway.errors import BackendError


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def writelines(self, parts) -> None:
        self.written.append(b"".join(parts))

    def close(self) -> None:
        self.closed = True


class Recorder(Connection):
    """A connection that keeps each request's outcome: (status, headers, body) or the error."""

    def __init__(self, max_body: int = 1 << 20) -> None:
        super().__init__(max_body)
        self.outcomes: list[tuple[int, Headers, bytes] | Exception] = []
        self.connection_made(Transport())  # type: ignore[arg-type]

    def answered(self, status: int, headers: Headers, body: bytes) -> None:
        self.outcomes.append((status, headers, body))

    def failed(self, e: Exception) -> None:
        self.outcomes.append(e)


def answer(body: bytes, status: str = "200 OK", *headers: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n%s\r\n%s" % (status.encode(), len(body), b"".join(headers), body)


def test_the_request_head_names_host_extra_headers_and_length() -> None:
    head = request_head(b"POST", b"/v2/models/m/infer", b"127.0.0.1:8000", 12, b"X-A: 1\r\n")
    assert head == (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nX-A: 1\r\n"
                    b"Content-Length: 12\r\n\r\n")


def test_answers_in_any_split_each_reach_their_request_whole_on_one_connection() -> None:
    c = Recorder()
    first = answer(b"hello", "200 OK", b"Inference-Header-Content-Length: 2\r\n")
    chunked = b"HTTP/1.1 429 Too Many Requests\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    c.send([b"GET / HTTP/1.1\r\n\r\n"])
    for i in range(len(first)):  # one byte at a time
        c.data_received(first[i : i + 1])
    c.send([b"GET / HTTP/1.1\r\n\r\n"])
    c.data_received(chunked)
    assert c.outcomes == [(200, {b"content-length": b"5", b"inference-header-content-length": b"2"}, b"hello"),
                          (429, {b"transfer-encoding": b"chunked"}, b"abcde")]
    assert not c.closed and not c.transport.closed  # type: ignore[union-attr]


def test_an_answer_without_keep_alive_is_answered_and_the_connection_closes() -> None:
    c = Recorder()
    c.send([b"GET / HTTP/1.1\r\n\r\n"])
    c.data_received(answer(b"{}", "200 OK", b"Connection: close\r\n"))
    assert c.outcomes[0][2] == b"{}"  # type: ignore[index]
    assert c.closed and c.transport.closed  # type: ignore[union-attr]


@pytest.mark.parametrize(("raw", "why"), [
    (answer(b"x" * 11), "exceeds 10 bytes"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "malformed HTTP answer"),
])
def test_an_answer_it_cannot_frame_fails_its_request_once_and_closes_the_connection(raw: bytes, why: str) -> None:
    c = Recorder(max_body=10)
    c.send([b"GET / HTTP/1.1\r\n\r\n"])
    c.data_received(raw)
    c.connection_lost(None)  # NOTE: the close that follows adds no second outcome
    assert len(c.outcomes) == 1 and isinstance(c.outcomes[0], ValueError) and why in str(c.outcomes[0])
    assert c.closed and c.transport.closed  # type: ignore[union-attr]


def test_an_answer_framed_by_the_end_of_the_connection_fails_as_unreadable_when_it_ends() -> None:
    c = Recorder()
    c.send([b"GET / HTTP/1.1\r\n\r\n"])
    c.data_received(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}")
    assert c.outcomes == []  # NOTE: it may go on: only the end says where it stops
    c.connection_lost(None)
    assert len(c.outcomes) == 1 and isinstance(c.outcomes[0], ValueError)
    assert "framed by the end of the connection" in str(c.outcomes[0])


def test_a_connection_lost_mid_answer_fails_the_request_in_flight_only() -> None:
    c = Recorder()
    c.connection_lost(None)  # idle: nothing to fail
    c.send([b"GET / HTTP/1.1\r\n\r\n"])
    c.data_received(answer(b"hello")[:-2])
    c.connection_lost(None)
    assert len(c.outcomes) == 1 and isinstance(c.outcomes[0], ConnectionError)


def test_no_answer_leaves_its_pieces_on_the_connection() -> None:
    """A pooled connection keeps nothing of an answer once it is given (the parser refers back
    to the connection: what it holds lives until a full collection), nor of one refused."""
    c = Recorder(max_body=10)
    c.send([b"GET / HTTP/1.1\r\n\r\n"])
    raw = answer(b"hello")
    c.data_received(raw[:-2])
    c.data_received(raw[-2:])
    assert c.body == []
    c.send([b"GET / HTTP/1.1\r\n\r\n"])
    raw = answer(b"x" * 11)
    c.data_received(raw[:-3])  # 8 bytes of the body kept so far
    c.data_received(raw[-3:])  # past 10: refused
    assert isinstance(c.outcomes[-1], AnswerTooLarge) and c.body == []


def test_an_answer_too_large_is_the_requests_fault_not_the_replicas() -> None:
    """RESOURCE_EXHAUSTED, not retried elsewhere, and the server stays reachable: its other
    models' requests are not failed over because one batch's answer was too large."""
    async def main() -> None:
        body = b"x" * 4096

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(answer(body))
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        rep = TritonHttpReplica(f"127.0.0.1:{port}", max_message_bytes=1024)
        with pytest.raises(BackendError) as e:
            await rep._request(b"GET", "/v2/models/m/ready", b"", b"", 5.0, "m")  # noqa: SLF001
        assert e.value.grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED and not e.value.retryable
        assert not rep.reach.down
        await rep.close()
        server.close()
        await server.wait_closed()
    asyncio.run(main())
