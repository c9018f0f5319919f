"""One client cannot fail or crowd out another's requests, on the driver's side (issue #31):
a request's parameters never change what another request gets (against an in-process Triton
that applies Triton 2.51's own rules to what it receives), shared-memory parameters are
refused, a parameter Triton refuses is the client's error (400 / INVALID_ARGUMENT), and the
requests held for a client are bounded by count and bytes, alone and all together."""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import socket
import time
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from gateway.app import GatewayThread
from gateway.backends.grpc import ModelInfo
from gateway.codec import (
    InferInput,
    RequestedOutput,
    Signature,
    Tensor,
    TensorSig,
    parse_grpc_infer,
    parse_http_infer,
)
from gateway.config import ServedModel, ServedReplica, parse_config
from gateway.contract import MAX_BUDGET_S, timeout_us
from gateway.driver import Driver
from gateway.errors import BackendError, InvalidRequest, Rejected
from gateway.policy.config import SchedulerConfig
from gateway.policy.scheduler import EdfScheduler
from gateway.policy.types import Priority
from gateway.queue_bounds import QUEUE_FULL, Held, QueueBounds
from profiles.schema import LimitsSpec
from tests.gateway.test_front_door_security import config
from tests.gateway.test_gateway_driver import (
    Clock,
    FakeReplica,
    make_driver,
    profile,
    request,
    run,
    settle,
)

MODEL_CONFIG = mc.ModelConfig(
    name="v", max_batch_size=8,
    input=[mc.ModelInput(name="x", data_type=mc.TYPE_FP32, dims=[2])],
    output=[mc.ModelOutput(name="y", data_type=mc.TYPE_FP32, dims=[2])])
STEADY_NS = 10**15  # Triton's steady clock when a request is queued: 11.6 days after boot
U64 = 1 << 64


# --------------------------------------------------------------------------- a strict Triton


class StrictTriton:
    """Triton's gRPC endpoint in process, answering ``y = x``. What it receives is checked as
    Triton 2.51 checks it (triton-inference-server/server ``src/grpc/infer_handler.cc``
    ``SetInferenceRequestMetadata``, ``src/grpc/grpc_utils.{h,cc}`` ``ParseSharedMemoryParams`` and
    ``ParseClassificationParams``): a refusal is INVALID_ARGUMENT for the whole request, as there.
    Its ``timeout`` is read as uint64 µs added ``* 1000`` to a steady-clock ns count in a uint64
    (triton-inference-server/core ``src/scheduler_utils.cc``): past 2**64 the request has expired
    before it ran. A shared-memory parameter that reaches it is a breach (``shm_seen``): Triton
    would read or write a region some other client registered."""

    def __init__(self) -> None:
        self.shm_seen = 0
        self.received: list[pb.ModelInferRequest] = []
        self.server: grpc.aio.Server | None = None

    async def start(self) -> int:
        self.server = grpc.aio.server()
        handlers = {
            "ModelInfer": grpc.unary_unary_rpc_method_handler(
                self.infer, pb.ModelInferRequest.FromString, pb.ModelInferResponse.SerializeToString),
            "ModelMetadata": grpc.unary_unary_rpc_method_handler(
                self.metadata, pb.ModelMetadataRequest.FromString, pb.ModelMetadataResponse.SerializeToString),
            "ModelConfig": grpc.unary_unary_rpc_method_handler(
                self.config, pb.ModelConfigRequest.FromString, pb.ModelConfigResponse.SerializeToString),
            "ModelReady": grpc.unary_unary_rpc_method_handler(
                self.ready, pb.ModelReadyRequest.FromString, pb.ModelReadyResponse.SerializeToString),
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers),))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)

    async def metadata(self, req: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        return pb.ModelMetadataResponse(name=req.name, versions=["1"])

    async def config(self, req: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(config=MODEL_CONFIG)

    async def ready(self, req: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=True)

    async def infer(self, req: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        self.received.append(req)
        refusal = self.refusal(req)
        if refusal is not None:
            await context.abort(*refusal)
        rows = req.inputs[0].shape[0]
        resp = pb.ModelInferResponse(model_name=req.model_name, model_version="1", id=req.id)
        resp.outputs.add(name="y", datatype="FP32", shape=[rows, 2])
        resp.raw_output_contents.append(req.raw_input_contents[0])
        return resp

    def refusal(self, req: pb.ModelInferRequest) -> tuple[grpc.StatusCode, str] | None:
        bad = grpc.StatusCode.INVALID_ARGUMENT
        for t in [*req.inputs, *req.outputs]:
            if any(k.startswith("shared_memory_") for k in t.parameters):
                self.shm_seen += 1
                return bad, f"unable to find shared memory region for tensor '{t.name}'"
        for k, p in req.parameters.items():
            kind = p.WhichOneof("parameter_choice")
            if k == "sequence_id" and kind not in ("int64_param", "string_param"):
                return bad, "invalid value type for 'sequence_id' parameter"
            if k in ("sequence_start", "sequence_end") and kind != "bool_param":
                return bad, f"invalid value type for '{k}' parameter, expected bool_param."
            if k == "priority" and not (kind == "uint64_param" or kind == "int64_param" and p.int64_param >= 0):
                return bad, "invalid value for 'priority'"
            if k == "timeout":
                if kind != "int64_param":
                    return bad, "invalid value type for 'timeout' parameter, expected int64_param."
                if (p.int64_param % U64) * 1000 + STEADY_NS >= U64:
                    return grpc.StatusCode.UNAVAILABLE, "Request timeout expired"
            if k.startswith("triton_") and (k != "triton_enable_empty_final_response" or kind != "bool_param"):
                return bad, "parameter keys starting with 'triton_' are reserved for Triton usage"
            if kind not in ("int64_param", "bool_param", "string_param", "double_param", "uint64_param"):
                return bad, f"invalid value type for '{k}' parameter"
        for o in req.outputs:
            if o.name != "y":
                return bad, f"unexpected inference output '{o.name}' for model '{req.model_name}'"
            c = o.parameters.get("classification")
            if c is not None and (c.WhichOneof("parameter_choice") != "int64_param" or c.int64_param <= 0):
                return bad, "invalid value for 'classification' parameter"
        return None


def strict_driver(port: int, clock: Clock, limits: LimitsSpec | None = None) -> Driver:
    rep = ServedReplica("r0", f"127.0.0.1:{port}", "grpc", "v", profile(), 1)
    model = ServedModel("m", 1.0, 8, Priority.GUARANTEED, (rep,))
    return Driver([model], EdfScheduler(SchedulerConfig(policy="adaptive", wait=False)), clock=clock,
                  health_interval=3600, limits=limits)


# --------------------------------------------------------------------------- what one request may send

VALUES = st.one_of(  # anything a JSON or protobuf parameter can hold, the edges of Triton's integers among it
    st.integers(min_value=0, max_value=10**7),
    st.booleans(),
    st.text(max_size=3),
    st.sampled_from([0, 1, 2, -1, (1 << 63) - 1, 1 << 63, U64 - 1, U64, 10**20, 0.5, float("nan"), float("inf")]),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(),
    st.lists(st.integers(), max_size=2),
)
PLAUSIBLE = {  # what a client that means well sends under each name: half of the draws
    "timeout": st.integers(min_value=0, max_value=10**22), "priority": st.integers(min_value=0, max_value=4),
    "sequence_id": st.integers(min_value=0, max_value=U64) | st.text(max_size=3),
    "sequence_start": st.booleans(), "sequence_end": st.booleans(), "binary_data_output": st.booleans(),
    "shared_memory_region": st.text(max_size=3), "shared_memory_byte_size": st.integers(min_value=0, max_value=64),
    "shared_memory_offset": st.integers(min_value=0, max_value=64), "classification": st.integers(min_value=1, max_value=3),
    "triton_enable_empty_final_response": st.booleans(), "triton_x": st.booleans(),
    "headrace_min_accuracy": st.floats(min_value=0, max_value=1), "headrace_max_cost": st.floats(min_value=0, max_value=1e9),
    "headrace_variant": st.just("v"), "color": st.integers() | st.text(max_size=3) | st.floats(allow_nan=False),
}
PARAMS = st.lists(st.sampled_from(sorted(PLAUSIBLE)), unique=True, max_size=3).flatmap(
    lambda keys: st.fixed_dictionaries({k: PLAUSIBLE[k] | VALUES for k in keys}))
OUTPUTS = st.lists(st.builds(RequestedOutput, st.sampled_from(["y", "y", "z"]), st.none(), PARAMS), max_size=1)


def honest(i: int) -> InferInput:
    return request([i, -i])


async def one_among_others(params: dict[str, Any], outputs: list[RequestedOutput]) -> None:
    triton = StrictTriton()
    port = await triton.start()
    d = strict_driver(port, Clock())
    await d.start()
    try:
        first = d.submit("m", honest(0))  # alone at once: the rest queue behind it and share a batch
        adversary: Any
        try:
            adversary = d.submit("m", InferInput([Tensor("x", "FP32", [1, 2], np.float32([[7, 7]]).tobytes())],
                                                 outputs, "", params))
        except (InvalidRequest, Rejected) as e:
            adversary = e
        rest = [d.submit("m", honest(i)) for i in (1, 2, 3)]
        answers = await asyncio.gather(first, *rest, return_exceptions=True)
        # NOTE: the others get exactly what they would without it: their own rows, served
        for i, a in zip((0, 1, 2, 3), answers, strict=True):
            assert not isinstance(a, BaseException), (params, outputs, a)
            np.testing.assert_array_equal(np.frombuffer(bytes(a.outputs[0].raw), np.float32), [i, -i])
        if isinstance(adversary, asyncio.Future):
            adversary = (await asyncio.gather(adversary, return_exceptions=True))[0]
        # its own outcome is served, or a client error: never one the gateway or Triton makes
        event("its own: " + ("served" if not isinstance(adversary, BaseException) else type(adversary).__name__))
        event(f"Triton calls: {len(triton.received)}")
        if isinstance(adversary, BaseException):
            assert getattr(adversary, "http_status", 500) in (400, 429), (params, outputs, adversary)
            assert adversary.grpc_code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert triton.shm_seen == 0
        assert all(r.parameters["timeout"].int64_param <= MAX_BUDGET_S * 1e6 for r in triton.received)
    finally:
        await d.stop()
        await triton.stop()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=PARAMS, outputs=OUTPUTS)
@example(params={"timeout": 10**20}, outputs=[])  # issue #31 row 6
@example(params={"timeout": (1 << 63) - 1}, outputs=[])  # encodable, but overflows Triton's deadline
@example(params={"color": 1 << 64}, outputs=[])
@example(params={}, outputs=[RequestedOutput("y", None, {"shared_memory_region": "theirs",
                                                             "shared_memory_byte_size": 64})])
@example(params={}, outputs=[RequestedOutput("y", None, {"classification": "2"})])
def test_no_request_can_change_what_another_request_gets(params, outputs):
    asyncio.run(one_among_others(params, outputs))


def test_a_huge_timeout_is_clamped_to_one_bound_for_every_member_and_every_protocol():
    async def main() -> None:
        clock = Clock()
        d, (fake,) = make_driver(clock, slo=1.0)
        await d.start()
        first = asyncio.create_task(d.infer("m", request([0, 0])))
        await settle()
        batch = [asyncio.create_task(d.infer("m", request([1, 1], timeout=10**20))),
                 asyncio.create_task(d.infer("m", request([2, 2])))]
        await settle()
        fake.release()
        await settle()
        fake.release()
        await asyncio.gather(first, *batch)
        # NOTE: Triton's timeout is the longest member's budget, never more than the SLO header allows
        assert fake.calls[-1] == ("v", 2)
        assert fake.forwarded[-1][1] == 3_600_000_000
        await d.stop()

    run(main())
    assert timeout_us(float("inf")) == timeout_us(float("nan")) == timeout_us(1e300) == 3_600_000_000
    assert timeout_us(0.0) == 1


# --------------------------------------------------------------------------- shared memory, client errors


SHM_INPUT_HTTP = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2],
                                         "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8}}]})


def test_an_input_naming_shared_memory_is_refused_by_both_parsers():
    with pytest.raises(InvalidRequest, match="shared memory is not offered"):
        parse_http_infer(SHM_INPUT_HTTP.encode(), None)
    req = pb.ModelInferRequest(model_name="m")
    t = req.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    t.parameters["shared_memory_region"].string_param = "theirs"
    t.parameters["shared_memory_byte_size"].int64_param = 8
    req.raw_input_contents.append(np.float32([[1, 2]]).tobytes())
    with pytest.raises(InvalidRequest, match="shared memory is not offered"):
        parse_grpc_infer(req)


@pytest.mark.parametrize(("params", "outputs", "match"), [
    ({"shared_memory_region": "r"}, [], "shared memory"),
    ({}, [RequestedOutput("y", None, {"shared_memory_region": "r", "shared_memory_byte_size": 8})], "shared memory"),
    ({}, [RequestedOutput("y", None, {"shared_memory_offset": 0})], "shared memory"),
    ({"color": 1 << 63}, [], "out of range"),
    ({"color": float("nan")}, [], "finite"),
    ({"sequence_start": "yes"}, [], "sequence_start"),
    ({"sequence_id": 1 << 63}, [], "sequence_id"),
    ({}, [RequestedOutput("y", None, {"classification": "2"})], "classification"),
    ({}, [RequestedOutput("y", None, {"classification": 0})], "classification"),
])
def test_what_triton_would_refuse_is_refused_before_queueing(params, outputs, match):
    async def main() -> None:
        d, (fake,) = make_driver(Clock())
        await d.start()
        inp = request([1, 1], **params)
        inp.outputs = outputs
        with pytest.raises(InvalidRequest, match=match):
            d.submit("m", inp)
        assert d.core.pending == 0 and not fake.calls and d.bounds.held() == Held()
        await d.stop()

    run(main())


def test_a_batch_triton_refuses_as_invalid_is_each_members_400():
    async def main() -> None:
        d, (fake,) = make_driver(Clock())
        await d.start()
        first = asyncio.create_task(d.infer("m", request([0, 0])))
        await settle()
        waiters = [asyncio.create_task(d.infer("m", request([i, i]))) for i in (1, 2)]
        await settle()
        fake.release()
        await first
        await settle()
        fake.release(BackendError("unexpected shape for input 'x'", grpc.StatusCode.INVALID_ARGUMENT, False))
        for r in await asyncio.gather(*waiters, return_exceptions=True):
            assert isinstance(r, BackendError)
            assert (r.http_status, r.grpc_code) == (400, grpc.StatusCode.INVALID_ARGUMENT)
        await d.stop()

    run(main())


# --------------------------------------------------------------------------- queue bounds


def bounded_driver(clock: Clock, sig: Signature | None = None, **limits: int) -> tuple[Driver, list[FakeReplica]]:
    fakes: list[FakeReplica] = []

    class Fake(FakeReplica):
        async def model_info(self, variant: str) -> ModelInfo:
            info = await super().model_info(variant)
            return info if sig is None else ModelInfo(sig, info.metadata, info.config)

    def factory(protocol: str, url: str) -> FakeReplica:
        fakes.append(Fake(url))
        return fakes[-1]

    rep = ServedReplica("r0", "host:9000", "http", "v", profile(), 1)
    model = ServedModel("m", 1.0, 8, Priority.GUARANTEED, (rep,))
    core = EdfScheduler(SchedulerConfig(policy="adaptive", wait=False))
    return Driver([model], core, clock=clock, health_interval=3600, replica_factory=factory,
                  limits=LimitsSpec(**limits)), fakes


def test_a_client_at_its_bound_is_refused_while_another_is_still_admitted():
    async def main() -> None:
        d, (fake,) = bounded_driver(Clock(), max_client_queued_requests=3)
        await d.start()
        held = [d.submit("m", request([i, i]), client="10.0.0.1") for i in range(3)]
        with pytest.raises(Rejected) as e:
            d.submit("m", request([9, 9]), client="10.0.0.1")
        assert (e.value.reason, e.value.http_status, e.value.grpc_code) == (
            QUEUE_FULL, 429, grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert "limits.max_client_queued_requests: 3" in str(e.value) and e.value.retry_after > 0
        other = d.submit("m", request([5, 5]), client="10.0.0.2")
        internal = d.submit("m", request([6, 6]))  # no client: counted in the totals only
        assert d.bounds.held("10.0.0.1") == Held(3, 24) and d.bounds.held() == Held(5, 40)
        for _ in range(3):
            fake.release()
            await settle()
        await asyncio.gather(*held, other, internal)
        # NOTE: answered requests free their client's room
        d.submit("m", request([1, 1]), client="10.0.0.1")
        assert d.bounds.held("10.0.0.1") == Held(1, 8)
        await d.stop()

    run(main())


def test_bytes_are_bounded_per_client_and_all_together():
    wide = Signature({"x": TensorSig("x", "FP32", (-1,))}, {"y": TensorSig("y", "FP32", (-1,))}, max_batch_size=8)
    half = np.zeros((1, 1 << 17), np.float32)  # 512 KiB

    def big() -> InferInput:
        return InferInput([Tensor("x", "FP32", [1, 1 << 17], half.tobytes())])

    async def main() -> None:
        d, _ = bounded_driver(Clock(), wide, max_client_queued_bytes=1 << 20, max_queued_bytes=2 << 20)
        await d.start()
        d.submit("m", big(), client="a")
        d.submit("m", big(), client="a")
        with pytest.raises(Rejected, match="limits.max_client_queued_bytes"):
            d.submit("m", big(), client="a")
        d.submit("m", big(), client="b")
        d.submit("m", big(), client="c")
        with pytest.raises(Rejected, match=r"limits.max_queued_bytes \(2097152\)") as e:
            d.submit("m", big(), client="d")  # a new client, but the gateway as a whole is full
        assert e.value.reason == QUEUE_FULL
        assert d.bounds.held() == Held(4, 4 << 19)
        await d.stop()
        assert d.bounds.held() == Held() and not d.bounds.clients  # shutdown answers them all

    run(main())


def test_the_global_count_bound_holds_across_clients():
    async def main() -> None:
        d, _ = bounded_driver(Clock(), max_queued_requests=4)
        await d.start()
        for c in "abcd":
            d.submit("m", request([1, 1]), client=c)
        with pytest.raises(Rejected, match="limits.max_queued_requests: 4"):
            d.submit("m", request([1, 1]), client="e")
        await d.stop()

    run(main())


def test_nothing_is_held_after_a_thousand_requests_answered_failed_cancelled_and_refused():
    rng = random.Random(31)

    async def main() -> None:
        d, fakes = bounded_driver(Clock(), max_client_queued_requests=6, max_queued_requests=20)
        (fake,) = fakes
        await d.start()
        futures: list[asyncio.Future] = []
        for _ in range(1000):
            client = rng.choice(["a", "b", "c", None])
            try:
                futures.append(d.submit("m", request([1, 1], **rng.choice([{}, {}, {"timeout": 1000}])),
                                        client=client))
            except Rejected:  # over a bound, or a 1 ms budget no batch can meet
                pass
            roll = rng.random()
            if roll < 0.3 and futures:
                rng.choice(futures).cancel()  # queued or in flight
            elif roll < 0.5:
                fake.release(BackendError("model crashed", grpc.StatusCode.INTERNAL, retryable=False))
            elif roll < 0.8:
                fake.release()
            await settle()
            # NOTE: what is held is exactly what is admitted and not yet answered
            assert d.bounds.held().requests == len(d._pending)  # noqa: SLF001
        while d.bounds.held().requests:
            fake.release()
            await settle()
        await asyncio.gather(*futures, return_exceptions=True)
        assert d.bounds.held() == Held() and not d.bounds.clients
        await d.stop()

    run(main())


def test_the_pure_bounds_refuse_without_charging_and_release_to_nothing():
    b = QueueBounds(max_requests=3, max_bytes=200, max_client_requests=2, max_client_bytes=60)
    b.admit("a", 50)
    with pytest.raises(Rejected, match="max_client_queued_bytes"):
        b.admit("a", 11)
    with pytest.raises(Rejected, match="max_client_queued_bytes"):
        b.admit("b", 61)  # alone larger than a client may hold
    b.admit("a", 10)
    with pytest.raises(Rejected, match="max_client_queued_requests"):
        b.admit("a", 0)
    b.admit(None, 40)
    with pytest.raises(Rejected, match="max_queued_requests"):
        b.admit("b", 0)
    assert b.held() == Held(3, 100) and b.held("a") == Held(2, 60) and b.held("b") == Held()
    for client, n in (("a", 50), ("a", 10), (None, 40)):
        b.release(client, n)
    assert b.held() == Held() and not b.clients


# --------------------------------------------------------------------------- the front doors name the client


def _infer_bytes(host: str) -> bytes:
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}).encode()
    return (f"POST /v2/models/m/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def test_both_front_doors_charge_the_clients_address():
    fakes: list[FakeReplica] = []

    def factory(protocol: str, url: str) -> FakeReplica:
        fakes.append(FakeReplica(url))  # holds every batch until released
        return fakes[-1]

    async def release() -> None:
        for f in fakes:
            f.release()
        await settle()

    thread = GatewayThread(parse_config(config(limits={"max_client_queued_requests": 1})), replica_factory=factory)
    with thread as gw:
        host, port = gw.http_url.rsplit(":", 1)
        bounds = gw.driver.bounds

        def admitted(n: int) -> None:
            end = time.monotonic() + 5
            while bounds.held().requests < n:
                assert time.monotonic() < end, bounds.held()
                time.sleep(0.005)

        held = []
        for source in ("127.0.0.1", "127.0.0.2"):  # two clients, one request each, both held
            s = socket.create_connection((host, int(port)), source_address=(source, 0))
            s.sendall(_infer_bytes(host))
            held.append(s)
            admitted(len(held))
        assert set(bounds.clients) == {"127.0.0.1", "127.0.0.2"}
        conn = http.client.HTTPConnection(host, int(port), source_address=("127.0.0.1", 0), timeout=5)
        conn.request("POST", "/v2/models/m/infer", _infer_bytes(host).split(b"\r\n\r\n", 1)[1],
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 429 and resp.getheader("x-headrace-reject-reason") == QUEUE_FULL, resp.read()
        conn.close()
        req = pb.ModelInferRequest(model_name="m")
        req.inputs.add(name="x", datatype="FP32", shape=[1, 2])
        req.raw_input_contents.append(np.float32([[1, 2]]).tobytes())
        # the same address over gRPC: the same client
        with grpc.insecure_channel(gw.grpc_url) as ch, pytest.raises(grpc.RpcError) as e:
            pbg.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=5)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and QUEUE_FULL in str(e.value.trailing_metadata())
        for _ in range(2):  # the two held requests went out one after the other
            thread.call(release())
        for s in held:
            s.settimeout(5)
            assert s.recv(64).startswith(b"HTTP/1.1 200")
            s.close()


# --------------------------------------------------------------------------- one call's size


def test_a_batch_goes_to_its_replica_in_calls_of_at_most_max_message_bytes() -> None:
    """Members that each fit ``max_message_bytes`` batch together into more: one call carrying
    them all would pass what a gRPC replica takes, and its answer what the gateway reads back
    (eight 8 MiB requests failed together, and their replica was taken for unreachable)."""
    async def main() -> None:
        d, (fake,) = make_driver(Clock())
        d.fleet.max_message_bytes = 3 * 16  # three of the requests below (2 rows x 2 FP32 each)
        await d.start()
        first = asyncio.create_task(d.infer("m", request([0, 0])))
        await settle()
        rest = [asyncio.create_task(d.infer("m", request([i, i], [i, -i]))) for i in range(1, 8)]
        await settle()
        fake.release()
        await settle()
        assert fake.calls[0] == ("v", 1)
        # a batch is 8 rows (4 requests): sent as 3 requests and 1, each call at most 48 bytes
        assert sorted(rows for _, rows in fake.calls[1:]) == [2, 6]
        fake.release()
        await settle()
        assert fake.calls[3:] == [("v", 6)]  # the other 3 requests
        fake.release()
        outs = await asyncio.gather(first, *rest)
        for i, res in enumerate(outs[1:], start=1):
            y = np.frombuffer(bytes(res.outputs[0].raw), np.float32).reshape(res.outputs[0].shape)
            np.testing.assert_array_equal(y, [[i, i], [i, -i]])
        await d.stop()

    run(main())
