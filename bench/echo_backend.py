"""A trivial Triton stand-in for gateway benchmarks and tests: KServe v2 HTTP with binary
tensors, one model ``echo`` (FP32 [-1, 4] in, the same rows out, max batch 32), answered with
no work beyond finding the request's end, so what a gateway costs shows.

It answers what the gateway's replica client asks: ``/v2/health/{live,ready}``, the model's
metadata, config and ready, and ``POST /v2/models/echo/infer`` (one request at a time per
connection, as the gateway sends them). :class:`EchoStats` counts, per backend, the infer
requests, the most it held at once and the client ports they came from. ``hold_s`` holds each
answer that long (a replica busy with a batch).

    .venv/bin/python -m bench.echo_backend PORT [PORT ...] [--hold-ms 0]

(several ports: one backend on each, all in this process.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass, field

MODEL = "echo"
_METADATA = json.dumps({
    "name": MODEL, "versions": ["1"], "platform": "headrace_echo",
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}],
}).encode()
_CONFIG = json.dumps({
    "name": MODEL, "max_batch_size": 32,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
}).encode()
_EMPTY = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


def _json_ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


_GETS = {
    b"/v2/health/ready": _EMPTY, b"/v2/health/live": _EMPTY, b"/v2/models/echo/ready": _EMPTY,
    b"/v2/models/echo": _json_ok(_METADATA), b"/v2/models/echo/config": _json_ok(_CONFIG),
}


@dataclass
class EchoStats:
    """What one backend saw."""

    requests: int = 0
    inflight: int = 0
    max_inflight: int = 0
    peers: set[int] = field(default_factory=set)  # client ports of the infer requests


def _answer_head(head: bytes) -> bytes:
    """The answer's JSON header for a request's: each input's shape and size, as an output."""
    outs = [{"name": i["name"].replace("INPUT", "OUTPUT"), "datatype": i["datatype"], "shape": i["shape"],
             "parameters": {"binary_data_size": i["parameters"]["binary_data_size"]}}
            for i in json.loads(head)["inputs"]]
    return json.dumps({"model_name": MODEL, "model_version": "1", "outputs": outs}).encode()


class _Echo(asyncio.Protocol):
    def __init__(self, stats: EchoStats, hold_s: float, heads: dict[bytes, bytes]) -> None:
        self.stats, self.hold_s, self.heads = stats, hold_s, heads
        self.buf = bytearray()
        self.t: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, t: asyncio.BaseTransport) -> None:
        self.t = t  # type: ignore[assignment]
        self.port = t.get_extra_info("peername")[1]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._serve()

    def _serve(self) -> None:
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end])
            lower = head.lower()
            n = hl = 0
            for line in lower.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k == b"content-length":
                    n = int(v)
                elif k == b"inference-header-content-length":
                    hl = int(v)
            if len(self.buf) < end + 4 + n:
                return
            body = bytes(self.buf[end + 4:end + 4 + n])
            del self.buf[:end + 4 + n]
            method, path = head.split(b" ", 2)[:2]
            if method != b"POST":
                self.t.write(_GETS.get(path, _NOT_FOUND))  # type: ignore[union-attr]
                continue
            self._infer(body, hl or len(body))

    def _infer(self, body: bytes, hl: int) -> None:
        s = self.stats
        s.requests += 1
        s.inflight += 1
        s.max_inflight = max(s.max_inflight, s.inflight)
        s.peers.add(self.port)
        req_head = body[:hl]
        head = self.heads.get(req_head)
        if head is None:
            head = self.heads[req_head] = _answer_head(req_head)
        out = b"".join((b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
                        % (len(head), len(head) + len(body) - hl), head, body[hl:]))
        if self.hold_s <= 0:
            s.inflight -= 1
            self.t.write(out)  # type: ignore[union-attr]
            return
        self.busy = True

        def done() -> None:
            s.inflight -= 1
            self.busy = False
            if not self.t.is_closing():  # type: ignore[union-attr]
                self.t.write(out)  # type: ignore[union-attr]
                self._serve()

        asyncio.get_running_loop().call_later(self.hold_s, done)


async def start_echo(port: int, hold_s: float = 0.0, host: str = "127.0.0.1"
                     ) -> tuple[asyncio.base_events.Server, EchoStats]:
    """An echo backend listening on ``host:port`` (0: any free) on the running loop."""
    stats, heads = EchoStats(), {}
    server = await asyncio.get_running_loop().create_server(lambda: _Echo(stats, hold_s, heads), host, port)
    return server, stats


def main(argv: list[str] | None = None) -> int:
    from gateway.serving import run_on_serve_loop

    ap = argparse.ArgumentParser(description="trivial KServe v2 echo backend")
    ap.add_argument("ports", type=int, nargs="+")
    ap.add_argument("--hold-ms", type=float, default=0.0)
    a = ap.parse_args(argv)

    async def serve() -> None:
        for port in a.ports:
            await start_echo(port, a.hold_ms / 1e3)
        await asyncio.Event().wait()

    try:
        run_on_serve_loop(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
