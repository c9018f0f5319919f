"""How long one large infer body holds the gateway's event loop while it is decoded.

For each body (issue #31 row 3, at full scale by default), the HTTP front door is handed the
request as its server would hand it, with a ticker on the same loop waking every millisecond:
its lateness is the loop's lag. "before" is the decode as the front door ran it before
requests were checked and offloaded (one synchronous ``parse_http_infer``, without the model's
signature): the loop is held for all of it. "after" is the front door as it is
(:mod:`gateway.frontdoor.decode`): the lag's p99 and max over the ticks while the request is
answered, and the answer's status and time.

Bodies: 63 MiB of zero-length BYTES elements (binary extension), 28 MiB of JSON numbers and a
valid 60 MiB FP32 JSON request; the first two both against a model whose dims bound them
(refused by the signature check) and one with a -1 dim (decoded by a worker, as a valid
request would be). Prints a table; writes nothing. ``--scale 0.1`` for a quick run.

    .venv/bin/python -m bench.decode_lag [--scale 1.0] [--repeat 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field

import numpy as np

from gateway.codec import InferInput, Signature, TensorSig, parse_http_infer
from gateway.driver import InferResult
from gateway.errors import GatewayError
from gateway.frontdoor.http import HttpFrontDoor
from gateway.frontdoor.httpmessage import HttpRequest, HttpResponse
from gateway.frontdoor.httpserver import Later

MiB = 1 << 20


@dataclass
class _Model:
    """What the front door reads of a served model."""

    info: object
    default_version: str = "1"

    def check_version(self, version: str) -> None:
        pass


@dataclass
class _Info:
    signature: Signature


@dataclass
class Driver:
    """Resolves every model name to ``sig``; answers each request at once with no output."""

    sig: Signature
    got: list[InferInput] = field(default_factory=list)

    def model(self, name: str, version: str = "") -> _Model:
        return _Model(_Info(self.sig))

    async def infer(self, name: str, inp: InferInput, *args: object, **kw: object) -> InferResult:
        return await self.submit(name, inp)

    def submit(self, name: str, inp: InferInput, *args: object, **kw: object) -> asyncio.Future:
        self.got.append(inp)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(InferResult([], "v", "r", True))
        return fut


def sig_of(datatype: str, dims: tuple[int, ...], max_batch: int = 8) -> Signature:
    return Signature({"x": TensorSig("x", datatype, dims)}, {"y": TensorSig("y", "FP32", (-1,))}, max_batch)


def bytes_body(nbytes: int) -> tuple[bytes, str]:
    """``nbytes`` of zero-length BYTES elements as one binary input of shape [1, n]."""
    n = nbytes // 4
    head = json.dumps({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, n],
                                   "parameters": {"binary_data_size": 4 * n}}]}).encode()
    return head + bytes(4 * n), str(len(head))


def json_numbers_body(nbytes: int) -> bytes:
    """``nbytes`` of JSON zeros as one FP32 input of shape [1, n]."""
    n = nbytes // 2
    return b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,%d],"data":[' % n + b"0," * (n - 1) + b"0]}]}"


def valid_json_body(nbytes: int, seed: int = 0) -> tuple[bytes, np.ndarray]:
    """A valid FP32 JSON request of about ``nbytes``: random numbers as Python prints them."""
    n = nbytes // 20  # repr of a float32 in [0, 1) as a double: ~19 characters and a comma
    x = np.random.default_rng(seed).random(n).astype(np.float32)
    data = ",".join(map(repr, x.astype(np.float64).tolist())).encode()
    return b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,%d],"data":[' % n + data + b"]}]}", x


async def _ticks(out: list[float], period: float = 0.001) -> None:
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(period)
        out.append(loop.time() - t - period)


async def answer_with_lag(door: HttpFrontDoor, body: bytes, header_len: str | None) -> tuple[int, float, list[float]]:
    """The door's answer's status, its time, and the loop's lag samples meanwhile."""
    lags: list[float] = []
    ticker = asyncio.ensure_future(_ticks(lags))
    await asyncio.sleep(0.02)
    lags.clear()
    headers = {"content-length": str(len(body))}
    if header_len is not None:
        headers["inference-header-content-length"] = header_len
    t = time.perf_counter()
    answer = door(HttpRequest("POST", "/v2/models/m/infer", headers, body))
    if isinstance(answer, Later):
        await asyncio.wait([answer.future])
        answer = answer.make(answer.future)
    took = time.perf_counter() - t
    await asyncio.sleep(0.005)
    ticker.cancel()
    assert isinstance(answer, HttpResponse)
    return answer.status, took, lags


def before(body: bytes, header_len: str | None) -> tuple[int, float]:
    t = time.perf_counter()
    try:
        parse_http_infer(body, header_len)
        status = 200
    except GatewayError as e:
        status = e.http_status
    return status, time.perf_counter() - t


async def main(scale: float, repeat: int) -> None:
    bounded = sig_of("BYTES", (16,))
    open_bytes = sig_of("BYTES", (-1,))
    bounded_fp = sig_of("FP32", (16,))
    open_fp = sig_of("FP32", (-1,))
    b63, h63 = bytes_body(int(63 * MiB * scale))
    j28 = json_numbers_body(int(28 * MiB * scale))
    v60, _ = valid_json_body(int(60 * MiB * scale))
    cases = [
        ("63 MiB zero-length BYTES, model [-1,16]", bounded, b63, h63),
        ("63 MiB zero-length BYTES, model [-1,-1]", open_bytes, b63, h63),
        ("28 MiB JSON numbers, model FP32 [-1,16]", bounded_fp, j28, None),
        ("28 MiB JSON numbers, model FP32 [-1,-1]", open_fp, j28, None),
        ("valid 60 MiB FP32 JSON, model [-1,-1]", open_fp, v60, None),
    ]
    print(f"scale {scale}: loop lag (ms) while one body is answered; 'before' held the loop for all of its decode")
    print(f"{'body':42} {'before: status, loop held':>27} {'after: status, took':>22} {'lag p99':>8} {'lag max':>8}")
    for label, sig, body, hl in cases:
        driver = Driver(sig)
        door = HttpFrontDoor(driver, None, 128 * MiB)  # type: ignore[arg-type]
        try:
            await answer_with_lag(door, b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,1],"data":[1]}]}',
                                  None)  # nothing to start yet: a small body is decoded on the loop
            s0, held = before(body, hl)
            for _ in range(repeat):
                status, took, lags = await answer_with_lag(door, body, hl)
                p99, worst = (float(np.percentile(lags, 99)) * 1e3, max(lags) * 1e3) if lags else (0.0, 0.0)
                print(f"{label:42} {s0:>10} {held * 1e3:>12.0f} ms {status:>8} {took * 1e3:>9.0f} ms "
                      f"{p99:>8.2f} {worst:>8.2f}")
        finally:
            await door.decoder.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="body sizes as a fraction of the issue's")
    ap.add_argument("--repeat", type=int, default=1, help="answers per body (the first starts the worker)")
    a = ap.parse_args()
    asyncio.run(main(a.scale, a.repeat))
