"""No answer blocks the loop (issue #31, row 3): an HTTP answer carrying many JSON values is
encoded by a decode worker, byte for byte as the loop encodes a small one, while the event
loop answers others; small answers are encoded on the loop, in the driver's result callback.

The HTTP door is driven in-process (as its server calls it) against a driver whose model
answers at once (OUTPUT0 = INPUT0 + 1, as the emulated model does); a ticker on the same loop
measures its lag."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from bench.encode_lag import request
from gateway.codec import (
    InferInput,
    RequestedOutput,
    Signature,
    Tensor,
    TensorSig,
    encode_http_response,
)
from gateway.driver import InferResult
from gateway.errors import InvalidRequest
from gateway.frontdoor.decode import Decoder
from gateway.frontdoor.decodepool import Blob, DecodePool
from gateway.frontdoor.encode import INLINE_VALUES, may_be_large
from gateway.frontdoor.http import HttpFrontDoor
from gateway.frontdoor.httpmessage import HttpRequest, HttpResponse
from gateway.frontdoor.httpserver import Later
from gateway.serving import loop_factory
from tests.gateway.test_isolation_decode import with_lag

MiB = 1 << 20
LAG_MAX_S = 0.1  # encoding the 8 MiB answer on the loop held it 1.6-2 s


class CountingPool(DecodePool):
    """A decode pool that counts the jobs it is given, by op."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[str] = []

    async def run(self, client: str, op: str, args: tuple, blob: Blob) -> Any:
        self.jobs.append(op)
        return await super().run(client, op, args, blob)


def sig(datatype: str = "FP32", dims: tuple[int, ...] = (-1,), max_batch: int = 8) -> Signature:
    return Signature({"x": TensorSig("x", "FP32", (-1,))}, {"y": TensorSig("y", datatype, dims)}, max_batch)


@dataclass
class Model:
    info: Any
    default_version: str = "1"

    def check_version(self, version: str) -> None:
        pass


@dataclass
class Info:
    signature: Signature


@dataclass
class Driver:
    """A model of signature ``sig`` whose answer to an input is ``outputs(input)``, at once."""

    sig: Signature
    outputs: Callable[[Tensor], list[Tensor]] = lambda x: [Tensor("y", "FP32", x.shape, plus_one(x.raw))]
    futures: list[asyncio.Future] = field(default_factory=list)

    def model(self, name: str, version: str = "") -> Model:
        return Model(Info(self.sig))

    def submit(self, name: str, inp: InferInput, *args: object, **kw: object) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(InferResult(self.outputs(inp.inputs[0]), "v", "r", True))
        self.futures.append(fut)
        return fut


def plus_one(raw: bytes | memoryview) -> bytes:
    return (np.frombuffer(raw, np.float32) + 1).tobytes()


def values(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(n).astype(np.float32)


def call(door: HttpFrontDoor, x: np.ndarray) -> Later | HttpResponse:
    """The door's answer to ``x`` sent binary, its output asked for as JSON."""
    body, hl = request(x)
    return door(HttpRequest("POST", "/v2/models/m/infer", {"inference-header-content-length": hl}, body))


async def answer(door: HttpFrontDoor, x: np.ndarray) -> HttpResponse:
    a = call(door, x)
    if isinstance(a, Later):
        await asyncio.wait([a.future])
        a = a.make(a.future)
    assert isinstance(a, HttpResponse)
    return a


@pytest.fixture(scope="module")
def loop() -> Iterator[tuple[asyncio.Runner, Decoder, CountingPool]]:
    """One event loop and decoder for the module's tests: its worker starts once."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:  # the loop headrace serve runs on
        pool = CountingPool()
        decoder = Decoder(pool)
        try:
            yield runner, decoder, pool
        finally:
            runner.run(decoder.close())


Run = Callable[[Callable[[Decoder, CountingPool], Awaitable[None]]], None]


@pytest.fixture
def run(loop: tuple[asyncio.Runner, Decoder, CountingPool]) -> Run:
    """Run a test's coroutine on the module's loop, given its decoder and pool (no jobs yet)."""
    runner, decoder, pool = loop

    def go(main: Callable[[Decoder, CountingPool], Awaitable[None]]) -> None:
        pool.jobs.clear()
        runner.run(main(decoder, pool))
    return go


def inline_answer(y: np.ndarray) -> bytes:
    """What the loop's encoder writes for ``y`` as output y of shape [1, n], answered as
    :class:`Driver` answers."""
    body, hl = encode_http_response("m", "1", InferInput([]), [Tensor("y", "FP32", [1, y.size], y.tobytes())],
                                    InferResult([], "v", "r", True).parameters())
    assert hl is None
    return body


# --------------------------------------------------------------------------- large answers


def test_an_8mb_fp32_answer_in_json_is_written_by_a_worker_as_the_loop_would_write_it(run: Run) -> None:
    x = values(2 * MiB)  # 8 MiB of FP32 in, 8 MiB out: 2M JSON values
    driver = Driver(sig())

    async def main(decoder: Decoder, pool: CountingPool) -> None:
        door = HttpFrontDoor(driver, None, 64 * MiB, decoder=decoder)  # type: ignore[arg-type]
        a, lags = await with_lag(lambda: answer(door, x))
        assert a.status == 200 and a.content_type == "application/json"
        assert max(lags) < LAG_MAX_S, f"loop held {max(lags) * 1e3:.0f} ms"
        assert pool.jobs == ["http_answer"]
        got = bytes(a.body)
        assert got == inline_answer(x + 1)
        (out,) = json.loads(got)["outputs"]
        assert out["shape"] == [1, x.size] and np.array_equal(np.array(out["data"], np.float32), x + 1)
    run(main)


def test_binary_outputs_beside_large_json_ones_stay_on_the_loop_and_follow_their_json(run: Run) -> None:
    a = Tensor("a", "FP64", [1, 3000], np.random.default_rng(2).random(3000).tobytes())
    b = Tensor("b", "UINT8", [1, 5], b"\x01\x02\x03\x04\x05")
    words = [b"\xc3\xa9t\xc3\xa9 \"q\"\n", b"\xff", b""] * 700
    c = Tensor("c", "BYTES", [1, len(words)], b"".join(len(w).to_bytes(4, "little") + w for w in words))
    req = InferInput([], [RequestedOutput("a"), RequestedOutput("b", binary=True), RequestedOutput("c")], "r7")
    params = {"headrace_variant": "v"}

    async def main(decoder: Decoder, pool: CountingPool) -> None:
        encoded = decoder.http_answer("m", "1", req, [a, b, c], params, "client")
        assert not isinstance(encoded, tuple)  # 5,100 JSON values: not on the loop
        body, hl = await encoded
        assert (bytes(body), hl) == encode_http_response("m", "1", req, [a, b, c], params)
        assert pool.jobs == ["http_answer"]
    run(main)


def test_an_answer_no_encoder_can_write_is_a_400_wherever_it_is_encoded(run: Run) -> None:
    # NOTE: BF16 has no JSON form; the worker refuses it as the loop does, and either way the
    # client, who asked for JSON, gets a 400 naming the output
    def bf16(x: Tensor) -> list[Tensor]:
        return [Tensor("y", "BF16", x.shape, bytes(2 * x.shape[1]))]

    async def main(decoder: Decoder, pool: CountingPool) -> None:
        for dims, n in (((4,), 4), ((-1,), 4), ((-1,), 4 * INLINE_VALUES)):
            door = HttpFrontDoor(Driver(sig("BF16", dims), bf16), None, MiB, decoder=decoder)  # type: ignore[arg-type]
            a = await answer(door, values(n))
            assert a.status == 400 and "output 'y': datatype BF16" in json.loads(a.body)["error"]
        assert pool.jobs == ["http_answer"]
        with pytest.raises(InvalidRequest, match="output 'y': datatype BF16"):
            encode_http_response("m", "1", InferInput([]), bf16(Tensor("x", "FP32", [1, 4], b"")), {})
    run(main)


def test_a_client_gone_while_its_answer_is_encoded_leaves_the_worker_to_others(run: Run) -> None:
    driver = Driver(sig())

    async def main(decoder: Decoder, pool: CountingPool) -> None:
        door = HttpFrontDoor(driver, None, 64 * MiB, decoder=decoder)  # type: ignore[arg-type]
        gone = call(door, values(300_000))
        assert isinstance(gone, Later)
        while not pool.jobs:
            await asyncio.sleep(0.005)
        gone.future.cancel()  # what the server does when the connection is lost
        x = values(5000, seed=3)
        a = await answer(door, x)
        assert a.status == 200 and bytes(a.body) == inline_answer(x + 1)
        assert gone.future.cancelled() and pool.jobs == ["http_answer"] * 2
    run(main)


# --------------------------------------------------------------------------- small answers


def test_a_small_answer_is_encoded_on_the_loop_in_the_results_own_callback(run: Run) -> None:
    # NOTE: the common path: no task, no worker, no loop turn more than before
    x = values(16)
    driver = Driver(sig(dims=(16,)))  # at most 8 x 16 values: the signature bounds it

    async def main(decoder: Decoder, pool: CountingPool) -> None:
        door = HttpFrontDoor(driver, None, MiB, decoder=decoder)  # type: ignore[arg-type]
        a = call(door, x)
        assert isinstance(a, Later) and a.future is driver.futures[-1]
        resp = a.make(a.future)
        assert resp.status == 200 and resp.body == inline_answer(x + 1)
        assert pool.jobs == []
    run(main)


def test_an_answer_the_signature_does_not_bound_is_encoded_on_the_loop_when_it_comes_small(run: Run) -> None:
    driver = Driver(sig(dims=(-1,)))

    async def main(decoder: Decoder, pool: CountingPool) -> None:
        door = HttpFrontDoor(driver, None, MiB, decoder=decoder)  # type: ignore[arg-type]
        for n, jobs in ((INLINE_VALUES, []), (INLINE_VALUES + 1, ["http_answer"])):
            x = values(n)
            resp = await answer(door, x)
            assert resp.status == 200 and bytes(resp.body) == inline_answer(x + 1)
            assert pool.jobs == jobs
    run(main)


def test_which_answers_may_need_a_worker() -> None:
    def inp(*outputs: RequestedOutput, rows: int = 1, **params: Any) -> InferInput:
        return InferInput([Tensor("x", "FP32", [rows, 4], b"")], list(outputs), "", params)

    json_y, binary_y = RequestedOutput("y", binary=False), RequestedOutput("y", binary=True)
    bounded = sig(dims=(128,))  # 128 values a row, up to 8 rows
    cases = [
        (sig(), inp(), True),  # -1 dims: any size
        (sig(), inp(binary_data_output=True), False),  # every output binary
        (sig(), inp(binary_y), False),
        (sig(), inp(binary_y, binary_data_output=False), False),
        (sig(), inp(json_y, binary_data_output=True), True),  # its own flag wins
        (bounded, inp(rows=8), False),  # 1,024 values
        (bounded, inp(rows=9), True),
        (sig("BYTES", (2,)), inp(), True),  # strings of any length
        (sig(dims=(16,)), inp(RequestedOutput("z")), True),  # not in the signature: as it comes
    ]
    for s, i, large in cases:
        assert may_be_large(s, i) is large, (s, i)
