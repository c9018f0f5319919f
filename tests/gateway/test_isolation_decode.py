"""No request blocks the loop (issue #31, row 3): a request is checked against its model's
signature before its data is decoded, and a large one is decoded by a worker process, so the
event loop answers others meanwhile.

The front doors are driven in-process (the HTTP door as its server calls it, the gRPC
servicer's infer) against a driver whose model has a known signature; a ticker on the same
loop measures its lag while each request is answered."""

from __future__ import annotations

import asyncio
import gzip
import json
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from bench.decode_lag import Driver, bytes_body, json_numbers_body, sig_of, valid_json_body
from gateway.codec import InferInput, parse_grpc_infer, parse_http_infer
from gateway.errors import InvalidRequest
from gateway.frontdoor.decode import Decoder, read_grpc, split_grpc
from gateway.frontdoor.decodepool import FairQueue
from gateway.frontdoor.grpc import InferenceServicer
from gateway.frontdoor.http import HttpFrontDoor
from gateway.frontdoor.httpmessage import HttpRequest, HttpResponse
from gateway.frontdoor.httpserver import Later
from gateway.precheck import check_json_size, max_json_bytes
from gateway.serving import run_on_serve_loop

MiB = 1 << 20
LAG_MAX_S = 0.1  # the decode before this held the loop 0.5-1 s for each of these bodies


async def with_lag(work: Callable[[], Awaitable[Any]]) -> tuple[Any, list[float]]:
    """``work()``'s result and the loop's lag (s) sampled every millisecond meanwhile."""
    loop = asyncio.get_running_loop()
    lags: list[float] = []

    async def tick() -> None:
        while True:
            t = loop.time()
            await asyncio.sleep(0.001)
            lags.append(loop.time() - t - 0.001)

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0.005)
    lags.clear()
    try:
        result = await work()
        await asyncio.sleep(0.003)
    finally:
        ticker.cancel()
    return result, lags


def http_answer(door: HttpFrontDoor, body: bytes, header_len: str | None = None,
                headers: dict[str, str] | None = None) -> Callable[[], Awaitable[HttpResponse]]:
    async def answer() -> HttpResponse:
        h = dict(headers or {})
        if header_len is not None:
            h["inference-header-content-length"] = header_len
        a = door(HttpRequest("POST", "/v2/models/m/infer", h, body))
        if isinstance(a, Later):
            await asyncio.wait([a.future])
            a = a.make(a.future)
        assert isinstance(a, HttpResponse)
        return a
    return answer


def run(main: Callable[[Decoder], Awaitable[None]]) -> None:
    async def go() -> None:
        decoder = Decoder()
        try:
            await main(decoder)
        finally:
            await decoder.close()
    run_on_serve_loop(go())  # the loop headrace serve runs on (uvloop's pipes differ from asyncio's)


# --------------------------------------------------------------------------- signature checks first


def test_the_worst_case_bodies_are_refused_before_any_element_is_read() -> None:
    # NOTE: refused from what they declare: no walk over 2 million length prefixes, no JSON parse
    b8, h8 = bytes_body(8 * MiB)
    j8 = json_numbers_body(8 * MiB)

    async def main(decoder: Decoder) -> None:
        for sig, body, hl, says in (
            (sig_of("BYTES", (16,)), b8, h8, "does not match the model's [-1, 16]"),
            (sig_of("FP32", (16,)), j8, None, "larger than any valid request for model 'm'"),
        ):
            door = HttpFrontDoor(Driver(sig), None, 64 * MiB, decoder=decoder)  # type: ignore[arg-type]
            t = time.perf_counter()
            a, lags = await with_lag(http_answer(door, body, hl))
            assert a.status == 400 and says in json.loads(a.body)["error"]
            assert time.perf_counter() - t < LAG_MAX_S and max(lags, default=0.0) < LAG_MAX_S
        assert not decoder.pool._all  # no worker was needed
    run(main)


def test_a_bytes_shape_its_data_cannot_hold_is_refused_unread() -> None:
    head = json.dumps({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 1000],
                                   "parameters": {"binary_data_size": 3999}}]}).encode()
    with pytest.raises(InvalidRequest, match="declares 1000 BYTES elements, which take at least 4000 bytes"):
        parse_http_infer(head + bytes(3999), str(len(head)), sig=sig_of("BYTES", (-1,)), model="m")


def test_the_json_bound_is_the_largest_valid_request() -> None:
    sig = sig_of("FP32", (16,), max_batch=8)
    most = max_json_bytes(sig)
    assert most == 8 * 16 * 64 + 64 * 1024
    check_json_size(sig, "m", most)
    with pytest.raises(InvalidRequest, match=f"\\({most} bytes"):
        check_json_size(sig, "m", most + 1)
    assert max_json_bytes(sig_of("FP32", (-1,))) is None and max_json_bytes(sig_of("BYTES", (4,))) is None
    # a pretty-printed request of the largest batch fits
    x = np.random.default_rng(1).random((8, 16)) * -1e-300
    doc = json.dumps({"inputs": [{"name": "x", "datatype": "FP64", "shape": [8, 16], "data": x.tolist()}]},
                     indent=8).encode()
    check_json_size(sig_of("FP64", (16,)), "m", len(doc))


# --------------------------------------------------------------------------- large bodies off the loop


def test_a_valid_20mb_json_request_is_decoded_exactly_while_the_loop_answers_others() -> None:
    body, x = valid_json_body(20 * MiB)
    driver = Driver(sig_of("FP32", (-1,)))

    async def main(decoder: Decoder) -> None:
        door = HttpFrontDoor(driver, None, 64 * MiB, decoder=decoder)  # type: ignore[arg-type]
        a, lags = await with_lag(http_answer(door, body))
        assert a.status == 200
        assert max(lags) < LAG_MAX_S, f"loop held {max(lags) * 1e3:.0f} ms"
        (got,) = driver.got
        assert np.array_equal(np.frombuffer(got.inputs[0].raw, np.float32), x)
        assert got.inputs[0].shape == [1, len(x)]
    run(main)


def test_bytes_elements_past_the_inline_walk_are_counted_by_a_worker() -> None:
    b8, h8 = bytes_body(8 * MiB)
    driver = Driver(sig_of("BYTES", (-1,)))

    async def main(decoder: Decoder) -> None:
        door = HttpFrontDoor(driver, None, 64 * MiB, decoder=decoder)  # type: ignore[arg-type]
        a, lags = await with_lag(http_answer(door, b8, h8))
        assert a.status == 200 and max(lags) < LAG_MAX_S
        t = driver.got[0].inputs[0]
        assert t.shape == [1, 2 * MiB] and len(t.raw) == 8 * MiB
        # one more length prefix than the shape says: a 400 from the worker
        head = json.dumps({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 2 * MiB],
                                       "parameters": {"binary_data_size": 8 * MiB + 4}}]}).encode()
        a = await http_answer(door, head + bytes(8 * MiB + 4), str(len(head)))()
        assert a.status == 400 and "does not hold 2097152 elements" in json.loads(a.body)["error"]
    run(main)


def test_a_compressed_body_is_inflated_off_the_loop_and_a_bomb_is_a_413() -> None:
    body, x = valid_json_body(4 * MiB)
    driver = Driver(sig_of("FP32", (-1,)))

    async def main(decoder: Decoder) -> None:
        door = HttpFrontDoor(driver, None, 64 * MiB, decoder=decoder)  # type: ignore[arg-type]
        gz = {"content-encoding": "gzip"}
        a = await http_answer(door, gzip.compress(body, 1), headers=gz)()
        assert a.status == 200 and np.array_equal(np.frombuffer(driver.got[0].inputs[0].raw, np.float32), x)
        a = await http_answer(door, gzip.compress(b" " * (65 * MiB), 1), headers=gz)()
        assert a.status == 413 and "once decoded" in json.loads(a.body)["error"]
        a = await http_answer(door, b"\x1f\x8b" + bytes(64 * 1024), headers=gz)()
        assert a.status == 400 and "corrupt" in json.loads(a.body)["error"]
    run(main)


# --------------------------------------------------------------------------- gRPC


def grpc_request(shape: list[int], raw: bytes | None = None, datatype: str = "BYTES",
                 strings: list[bytes] | None = None) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m", id="r1")
    inp = req.inputs.add(name="x", datatype=datatype, shape=shape)
    req.outputs.add(name="y")
    req.parameters["priority"].int64_param = 2
    if raw is not None:
        req.raw_input_contents.append(raw)
    if strings is not None:
        inp.contents.bytes_contents.extend(strings)
    return req


def test_grpc_raw_contents_are_read_where_they_lie_and_decode_as_protobuf_does() -> None:
    values = [b"", b"a", b"\x00" * 300, "é".encode()]
    raw = b"".join(struct.pack("<I", len(v)) + v for v in values)
    for req in (grpc_request([1, 4], raw), grpc_request([1, 4], strings=values)):
        msg = req.SerializeToString()
        split = split_grpc(msg)
        assert split is not None and len(split.head) < len(msg) or not req.raw_input_contents
        call = read_grpc(msg)
        got = parse_grpc_infer(call.req, call.raws, sig_of("BYTES", (-1,)), "m")
        want = parse_grpc_infer(pb.ModelInferRequest.FromString(msg))
        assert [(t.name, t.datatype, t.shape, bytes(t.raw)) for t in got.inputs] == \
               [(t.name, t.datatype, t.shape, bytes(t.raw)) for t in want.inputs]
        assert (got.outputs, got.id, got.parameters) == (want.outputs, want.id, want.parameters)
    assert split_grpc(b"\xff" * 12) is None  # not a message: protobuf says why


def test_grpc_worst_case_is_refused_unread_and_a_large_one_is_decoded_off_the_loop() -> None:
    n = 2 * MiB
    attack = grpc_request([1, n], bytes(4 * n)).SerializeToString()
    typed = grpc_request([1, 200_000], strings=[b"ab"] * 200_000).SerializeToString()

    async def main(decoder: Decoder) -> None:
        bounded = InferenceServicer(Driver(sig_of("BYTES", (16,))), None, decoder=decoder)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match=r"does not match the model's \[-1, 16\]"):
            await with_lag(lambda: bounded._infer(read_grpc(attack), None))
        driver = Driver(sig_of("BYTES", (-1,)))
        door = InferenceServicer(driver, None, decoder=decoder)  # type: ignore[arg-type]
        for msg, count in ((attack, n), (typed, 200_000)):
            _, lags = await with_lag(lambda m=msg: door._infer(read_grpc(m), None))  # type: ignore[misc]
            assert max(lags) < LAG_MAX_S, f"loop held {max(lags) * 1e3:.0f} ms"
            t = driver.got[-1].inputs[0]
            assert t.shape == [1, count]
        assert bytes(driver.got[-1].inputs[0].raw[:6]) == b"\x02\x00\x00\x00ab"
        assert read_grpc(typed).deferred and not read_grpc(attack).deferred
    run(main)


# --------------------------------------------------------------------------- the worker pool


def test_the_decode_queue_serves_clients_in_turn_within_its_bytes() -> None:
    q: FairQueue[str] = FairQueue(max_bytes=10)
    for item in ("a1", "a2", "a3"):
        assert q.push("a", item, 2)
    assert q.push("b", "b1", 2)
    assert not q.push("b", "b2", 3)  # 8 + 3 > 10: refused, nothing queued
    # NOTE: a client's many jobs delay another's by one of its own at most
    assert [q.pop() for _ in range(5)] == ["a1", "b1", "a2", "a3", None]
    assert q.bytes == 0 and len(q) == 0


def test_a_worker_that_dies_fails_its_job_alone_and_is_replaced() -> None:
    body, x = valid_json_body(1 * MiB)
    driver = Driver(sig_of("FP32", (-1,)))

    async def main(decoder: Decoder) -> None:
        door = HttpFrontDoor(driver, None, 64 * MiB, decoder=decoder)  # type: ignore[arg-type]
        assert (await http_answer(door, body)()).status == 200
        (worker,) = decoder.pool._all
        worker.proc.kill()
        await worker.proc.wait()
        assert (await http_answer(door, body)()).status == 503
        assert (await http_answer(door, body)()).status == 200
        assert len(driver.got) == 2 and all(isinstance(g, InferInput) for g in driver.got)
    run(main)
