"""How long one large JSON answer holds the gateway's event loop, step by step.

A client sends ``S`` MiB of FP32 (binary) and asks for its output as JSON (no
``binary_data_output``); the model answers OUTPUT0 = INPUT0 + 1, the same size, as the
emulated model of ``tests/test_front_door_adversarial.py`` does. For ``S`` = 8 and 60 (the
issue's sizes) this prints what each step on the answer's way holds the loop:

- ``steps``: synchronous steps, each timed once on this thread: the batch's concatenation of
  8 such requests and its split, a transport's write of the batch to a socket not read yet
  (as the replica client writes it: Python 3.11's ``writelines`` joins the parts, and
  ``write`` copies what the socket does not take into its buffer), the join of the batch's
  answer from the pieces it arrives in (as the replica client's connection does), the JSON
  encoding of one answer (:func:`gateway.codec.encode_http_response`, which the door ran on
  the loop), and the HTTP server's copies of that answer (``HttpResponse.encode`` joins head
  and body, then the transport's ``write``), and the gRPC door's answer of the same output
  (raw bytes, built and serialized);
- ``replica``: the HTTP replica client sending a batch of 8 requests to a Triton stand-in
  (:mod:`bench.echo_backend`, in another process) and reading its binary answer: the loop's
  lag (p99, max) meanwhile;
- ``door``: the HTTP front door answering the request in-process, a ticker on the same loop
  waking every millisecond: "inline" encodes the answer on the loop (as before
  :mod:`gateway.frontdoor.encode`), "worker" as the door does now;
- ``server``: the same through the gateway's HTTP server, a client in another process
  reading the answer from a socket.

Large blocks are mapped as the gateway maps them (:func:`gateway.observe.memory.pin_large_blocks`):
each copy of a large block then pays its page faults. Prints a table; writes nothing.
``--sizes 8`` for a quick run.

    .venv/bin/python -m bench.encode_lag [--sizes 8 60] [--parts steps replica door server]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.decode_lag import _Info, _Model, sig_of
from gateway.codec import (
    InferInput,
    Signature,
    Tensor,
    concat,
    encode_grpc_response,
    encode_http_response,
    split,
)
from gateway.driver import InferResult
from gateway.frontdoor.decode import Decoder
from gateway.frontdoor.http import HttpFrontDoor
from gateway.frontdoor.httpmessage import HttpRequest, HttpResponse
from gateway.frontdoor.httpserver import HttpServer, Later
from gateway.observe.memory import pin_large_blocks

MiB = 1 << 20
BATCH = 8


@dataclass
class PlusOneDriver:
    """Answers each request at once with output ``y`` = its input + 1 (computed before the
    run: the model's work is not the gateway's)."""

    sig: Signature
    answers: dict[int, bytes] = field(default_factory=dict)  # len(input) -> output bytes

    def model(self, name: str, version: str = "") -> _Model:
        return _Model(_Info(self.sig))

    def submit(self, name: str, inp: InferInput, *args: object, **kw: object) -> asyncio.Future:
        x = inp.inputs[0]
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(InferResult([Tensor("y", "FP32", x.shape, self.answers[len(x.raw)])], "v", "r", True))
        return fut


def request(values: np.ndarray) -> tuple[bytes, str]:
    """A binary FP32 request of ``values`` as shape [1, n], its output asked for as JSON."""
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, values.size],
                                   "parameters": {"binary_data_size": values.nbytes}}]}).encode()
    return head + values.tobytes(), str(len(head))


def plus_one_case(mib: float, driver: PlusOneDriver | None = None, seed: int = 0
                  ) -> tuple[bytes, str, PlusOneDriver]:
    """A request of ``mib`` MiB and a driver (``driver``, else a new one) that answers it."""
    x = np.random.default_rng(seed).random(int(mib * MiB) // 4).astype(np.float32)
    body, hl = request(x)
    driver = driver or PlusOneDriver(sig_of("FP32", (-1,)))
    driver.answers[x.nbytes] = (x + 1).tobytes()
    return body, hl, driver


async def start_worker(driver: PlusOneDriver, decoder: Decoder) -> None:
    """Answer a 0.5 MiB request through ``decoder``'s pool: its worker's start is not measured."""
    small, hl, _ = plus_one_case(0.5, driver, seed=1)
    await door_answer(HttpFrontDoor(driver, None, 128 * MiB, decoder=decoder), small, hl)()  # type: ignore[arg-type]


async def lag_while(work: Callable[[], Awaitable[Any]]) -> tuple[Any, float, list[float]]:
    """``work()``'s result, its time (s) and the loop's lag (s) sampled every millisecond meanwhile."""
    loop = asyncio.get_running_loop()
    lags: list[float] = []

    async def tick() -> None:
        while True:
            t = loop.time()
            await asyncio.sleep(0.001)
            lags.append(loop.time() - t - 0.001)

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0.02)
    lags.clear()
    t = time.perf_counter()
    try:
        result = await work()
        took = time.perf_counter() - t
        await asyncio.sleep(0.005)
    finally:
        ticker.cancel()
    return result, took, lags


def door_answer(door: HttpFrontDoor, body: bytes, hl: str) -> Callable[[], Awaitable[HttpResponse]]:
    async def answer() -> HttpResponse:
        a = door(HttpRequest("POST", "/v2/models/m/infer", {"inference-header-content-length": hl}, body))
        if isinstance(a, Later):
            await asyncio.wait([a.future])
            a = a.make(a.future)
        assert isinstance(a, HttpResponse)
        return a
    return answer


def row(label: str, took: float, lags: list[float], note: str = "") -> None:
    p99, worst = (float(np.percentile(lags, 99)) * 1e3, max(lags) * 1e3) if lags else (0.0, 0.0)
    print(f"  {label:44} took {took * 1e3:8.0f} ms   lag p99 {p99:8.2f} ms   max {worst:8.2f} ms  {note}")


def timed(label: str, fn: Callable[[], Any]) -> Any:
    t = time.perf_counter()
    out = fn()
    print(f"  {label:44} held the loop {(time.perf_counter() - t) * 1e3:8.1f} ms")
    return out


async def steps(mib: float) -> None:
    body, hl, driver = plus_one_case(mib)
    x = memoryview(body)[int(hl):]
    parts = [Tensor("x", "FP32", [1, len(x) // 4], x) for _ in range(BATCH)]
    batch = timed(f"concat of {BATCH} x {mib:g} MiB", lambda: concat(parts))
    timed(f"split of {BATCH * mib:g} MiB into {BATCH}", lambda: split(batch, [1] * BATCH))
    async with _unread_socket() as t:
        timed(f"transport.writelines of {BATCH * mib:g} MiB", lambda: t.writelines([b"head", batch.raw]))
    pieces = [bytes(batch.raw[i : i + (256 << 10)]) for i in range(0, len(batch.raw), 256 << 10)]
    timed(f"join of a {BATCH * mib:g} MiB answer from 256 KiB reads", lambda: b"".join(pieces))
    out = Tensor("y", "FP32", [1, len(x) // 4], driver.answers[len(x)])
    answer, _ = timed("JSON encoding of one answer (inline)",
                      lambda: encode_http_response("m", "1", InferInput([parts[0]]), [out], {}))
    resp = HttpResponse(200, answer, "application/json")
    async with _unread_socket() as t:
        timed(f"HttpResponse.encode + transport.write, {len(answer) / MiB:.0f} MiB",
              lambda: t.write(resp.encode(True)))
    timed(f"gRPC answer of {mib:g} MiB, built and serialized",
          lambda: encode_grpc_response("m", "1", InferInput([parts[0]]), [out], {}).SerializeToString())


@contextlib.asynccontextmanager
async def _unread_socket() -> Any:
    """A transport to a socket whose other end reads nothing (yet)."""
    import socket

    a, b = socket.socketpair()
    t, _ = await asyncio.get_running_loop().connect_accepted_socket(asyncio.Protocol, a)
    try:
        yield t
    finally:
        t.abort()
        b.close()


async def replica(mib: float) -> None:
    from gateway.backends.http import TritonHttpReplica

    port = _free_port()
    echo = subprocess.Popen([sys.executable, "-m", "bench.echo_backend", str(port)])
    client = TritonHttpReplica(f"127.0.0.1:{port}", max_message_bytes=BATCH * int(mib * MiB) + MiB)
    try:
        for _ in range(200):  # until it listens
            with contextlib.suppress(OSError):
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            await asyncio.sleep(0.05)
        x = np.zeros(BATCH * int(mib * MiB) // 4, np.float32)
        batch = Tensor("INPUT0", "FP32", [BATCH, x.size // BATCH], x.tobytes())
        await client.infer("echo", [batch], 30.0)  # a connection to reuse
        outs, took, lags = await lag_while(lambda: client.infer("echo", [batch], 30.0))
        assert len(outs[0].raw) == len(batch.raw)
        row(f"replica: a batch of {BATCH} x {mib:g} MiB and its answer", took, lags)
    finally:
        await client.close()
        echo.terminate()
        echo.wait()


async def door(mib: float) -> None:
    body, hl, driver = plus_one_case(mib)
    for label, inline in (("door, JSON encoded inline (before)", True), ("door, JSON encoded by a worker", False)):
        decoder = Decoder(inline_values=1 << 62) if inline else Decoder()
        front = HttpFrontDoor(driver, None, 128 * MiB, decoder=decoder)  # type: ignore[arg-type]
        try:
            if not inline:
                await start_worker(driver, decoder)
            resp, took, lags = await lag_while(door_answer(front, body, hl))
            assert resp.status == 200, resp.body[:200]
            row(label, took, lags, f"({len(resp.body) / MiB:.0f} MiB of JSON)")
        finally:
            await decoder.close()


async def server(mib: float) -> None:
    body, hl, driver = plus_one_case(mib)
    for label, inline in (("server, JSON encoded inline (before)", True), ("server, JSON encoded by a worker", False)):
        decoder = Decoder(inline_values=1 << 62) if inline else Decoder()
        front = HttpFrontDoor(driver, None, 128 * MiB, decoder=decoder)  # type: ignore[arg-type]
        srv = HttpServer(front, 128 * MiB)
        port = await srv.start("127.0.0.1", 0)
        try:
            if not inline:
                await start_worker(driver, decoder)
            got, took, lags = await lag_while(lambda p=port: _post(p, body, hl))  # type: ignore[misc]
            row(label, took, lags, f"(client read {got / MiB:.0f} MiB)")
        finally:
            await srv.stop(timeout=1)
            await decoder.close()


_CLIENT = r"""
import socket, sys
port, hl, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
body = sys.stdin.buffer.read(n)
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: %s\r\n"
          b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (hl.encode(), len(body)) + body)
got = 0
while chunk := s.recv(1 << 20):
    got += len(chunk)
print(got)
"""


async def _post(port: int, body: bytes, hl: str) -> int:
    """Bytes a client in another process read in answer to ``body``."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _CLIENT, str(port), hl, str(len(body)),
                                                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate(body)
    return int(out or 0)


def _free_port() -> int:
    import socket

    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def main(sizes: list[float], parts: list[str]) -> None:
    print(f"one request of S MiB FP32 answered as JSON (OUTPUT0 = INPUT0 + 1); batch of {BATCH}")
    for mib in sizes:
        print(f"S = {mib:g} MiB")
        if "steps" in parts:
            await steps(mib)
        if "replica" in parts:
            await replica(mib)
        if "door" in parts:
            await door(mib)
        if "server" in parts:
            await server(mib)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[8.0, 60.0], help="MiB of FP32 per request")
    ap.add_argument("--parts", nargs="+", default=["steps", "replica", "door", "server"],
                    choices=["steps", "replica", "door", "server"])
    a = ap.parse_args()
    pin_large_blocks()
    asyncio.run(main(a.sizes, a.parts))
