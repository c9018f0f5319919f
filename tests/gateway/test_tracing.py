"""Tracing: a request's spans (server, admission, queue) sit in the client's trace; a batch
span parents under its first request and links the others; the Triton call carries a
traceparent of the client's trace. Through the gateway, over HTTP and gRPC, to an in-process
fake Triton reached by either protocol: the spans nest under the client's span and Triton
receives a traceparent of the client's trace. Off, nothing imports OpenTelemetry; on without
the extra installed, one line says what to install."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from gateway.app import GatewayThread
from gateway.codec import InferInput, Tensor
from gateway.config import ServedModel, ServedReplica, parse_config
from gateway.driver import Driver
from gateway.frontdoor.httpserver import HttpRequest, HttpResponse, HttpServer
from gateway.observe.tracing import make_tracing
from gateway.policy.config import SchedulerConfig
from gateway.policy.scheduler import EdfScheduler
from gateway.policy.types import Priority
from profiles.profile import ProfileSet

ROOT = Path(__file__).resolve().parents[2]
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"


PROFILE = "resnet50@A100-80GB/1g.10gb"


class FakeTriton:
    """An in-process Triton, HTTP and gRPC, on a loop of its own: model ``m`` (FP32 x [-1, 2] ->
    y = x, max batch 8). It keeps the ``traceparent`` each infer call came with. Context manager."""

    def __init__(self) -> None:
        self.traceparents: list[str | None] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.http_port = self.grpc_port = 0

    def __enter__(self) -> FakeTriton:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)

    async def _start(self) -> None:
        self._http = HttpServer(self._answer, 1 << 20)
        self.http_port = await self._http.start("127.0.0.1", 0)
        self._grpc = grpc.aio.server()
        self._grpc.add_generic_rpc_handlers((self._grpc_handler(),))
        self.grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        await self._grpc.start()

    async def _stop(self) -> None:
        await self._http.stop(1.0)
        await self._grpc.stop(None)

    @staticmethod
    def metadata() -> dict:
        return {"name": "m", "versions": ["1"], "platform": "python",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]}

    @staticmethod
    def config() -> dict:
        return {"name": "m", "max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}],
                "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}]}

    def _answer(self, req: HttpRequest) -> HttpResponse:
        action = req.path.rstrip("/").split("/")[4:]
        if action == ["infer"]:
            self.traceparents.append(req.headers.get("traceparent"))
            n = int(req.headers["inference-header-content-length"])
            shape = json.loads(req.body[:n])["inputs"][0]["shape"]
            raw = req.body[n:]
            head = json.dumps({"model_name": "m", "model_version": "1", "outputs": [
                {"name": "y", "datatype": "FP32", "shape": shape, "parameters": {"binary_data_size": len(raw)}}]}).encode()
            return HttpResponse(200, head + raw, "application/octet-stream",
                                (("Inference-Header-Content-Length", str(len(head))),))
        doc = {(): self.metadata(), ("config",): self.config(), ("ready",): {}}.get(tuple(action))
        return HttpResponse(404) if doc is None else HttpResponse(200, json.dumps(doc).encode(), "application/json")

    def _grpc_handler(self) -> grpc.GenericRpcHandler:
        async def infer(req: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
            self.traceparents.append(dict(context.invocation_metadata() or ()).get("traceparent"))
            resp = pb.ModelInferResponse(model_name="m", model_version="1")
            resp.outputs.add(name="y", datatype="FP32", shape=req.inputs[0].shape)
            resp.raw_output_contents.append(req.raw_input_contents[0])
            return resp

        async def metadata(req: Any, context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
            md = self.metadata()
            resp = pb.ModelMetadataResponse(name="m", versions=md["versions"], platform="python")
            for kind in ("inputs", "outputs"):
                for t in md[kind]:
                    getattr(resp, kind).add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
            return resp

        async def config(req: Any, context: grpc.aio.ServicerContext) -> pb.ModelConfigResponse:
            cfg = mc.ModelConfig(name="m", max_batch_size=8)
            cfg.input.add(name="x", data_type=mc.TYPE_FP32, dims=[2])
            cfg.output.add(name="y", data_type=mc.TYPE_FP32, dims=[2])
            return pb.ModelConfigResponse(config=cfg)

        async def ready(req: Any, context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
            return pb.ModelReadyResponse(ready=True)

        def unary(fn: Any, req_type: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req_type.FromString,
                                                       response_serializer=lambda m: m.SerializeToString())

        return grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
            "ModelInfer": unary(infer, pb.ModelInferRequest),
            "ModelMetadata": unary(metadata, pb.ModelMetadataRequest),
            "ModelConfig": unary(config, pb.ModelConfigRequest),
            "ModelReady": unary(ready, pb.ModelReadyRequest)})

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.http_port if protocol == 'http' else self.grpc_port}"


@pytest.fixture(scope="module")
def triton():
    with FakeTriton() as t:
        yield t


def spec(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"enabled": True, "exporter": "memory", "endpoint": "http://localhost:4317",
                              "service_name": "headrace-test", "sample_ratio": 1.0, **kw})


def hexid(n: int, width: int = 16) -> str:
    return format(n, f"0{width}x")


class RecordingClient:
    """A replica client that keeps the trace headers each call came with."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []

    def infer(self, variant, inputs, timeout, forward=None, triton_us=0, *, trace_headers=None):  # noqa: ANN001, ANN201
        self.headers.append(dict(trace_headers or ()))

        async def answer() -> list:
            return ["y"]

        return answer()


def finished_spans(tracing) -> list:  # noqa: ANN001
    """The spans ended so far (the ``memory`` exporter keeps them)."""
    return list(tracing.memory.get_finished_spans())


def by_name(spans) -> dict:  # noqa: ANN001
    out: dict = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def run_batch_of_two(tracing) -> RecordingClient:  # noqa: ANN001
    """Two requests, the first with the client's traceparent, served as one batch."""
    client = RecordingClient()

    async def main() -> None:
        first = tracing.request("http", "m", {"traceparent": TRACEPARENT}, received_ago_s=0.002, version="1")
        second = tracing.request("grpc", "m", {})
        for r in (first, second):
            r.admit()
            r.admitted()
        batch = tracing.batch("m", "m-fp16", "m-fp16@r0", 2, [first, second])
        (call,) = batch.calls(client, "m-fp16", [[SimpleNamespace(shape=[2, 3])]], 1.0)
        assert await call == ["y"]
        batch.end()
        first.finish(200, variant="m-fp16", rows=1)
        second.finish("OK", variant="m-fp16", rows=1)

    asyncio.run(main())
    return client


def test_off_is_none() -> None:
    assert make_tracing(spec(enabled=False)) is None


def test_spans_nest_in_the_clients_trace_and_triton_gets_its_traceparent() -> None:
    pytest.importorskip("opentelemetry.sdk")
    tracing = make_tracing(spec())
    client = run_batch_of_two(tracing)
    spans = by_name(finished_spans(tracing))
    server = next(s for s in spans["POST /v2/models/m/infer"])
    (grpc_server,) = spans["inference.GRPCInferenceService/ModelInfer"]
    (batch,) = spans["batch"]
    (call,) = spans["triton infer"]
    # the HTTP request continues the client's trace, under the client's span
    assert hexid(server.context.trace_id, 32) == CLIENT_TRACE
    assert hexid(server.parent.span_id) == "b7ad6b7169203331"
    for name in ("admission", "queue"):
        mine = [s for s in spans[name] if s.context.trace_id == server.context.trace_id]
        assert len(mine) == 1 and mine[0].parent.span_id == server.context.span_id
    # NOTE: a batch parents under its first request and links every other one, which links back
    assert batch.parent.span_id == server.context.span_id
    assert [link.context.span_id for link in batch.links] == [grpc_server.context.span_id]
    assert [link.context.span_id for link in grpc_server.links] == [batch.context.span_id]
    assert grpc_server.context.trace_id != server.context.trace_id  # a trace of its own
    assert call.parent.span_id == batch.context.span_id
    assert dict(batch.attributes) == {"headrace.model": "m", "headrace.variant": "m-fp16",
                                      "headrace.replica": "m-fp16@r0", "headrace.batch.rows": 2,
                                      "headrace.batch.requests": 2}
    # Triton is told the call's span, in the client's trace
    (headers,) = client.headers
    assert headers["traceparent"] == f"00-{CLIENT_TRACE}-{hexid(call.context.span_id)}-01"
    assert server.attributes["http.response.status_code"] == 200
    assert server.end_time - server.start_time >= 2_000_000  # counted from when it was read


def test_queue_ends_when_the_batch_is_sent_and_a_refusal_closes_what_is_open() -> None:
    pytest.importorskip("opentelemetry.sdk")
    tracing = make_tracing(spec())
    refused = tracing.request("http", "m", {})
    refused.admit()
    refused.finish(429, reason="infeasible")
    expired = tracing.request("http", "m", {})
    expired.admit()
    expired.admitted()
    expired.finish(503, reason="no_replica")
    spans = by_name(finished_spans(tracing))
    first_admission = spans["admission"][0]
    assert first_admission.attributes["headrace.admitted"] is False
    assert first_admission.attributes["headrace.reject_reason"] == "infeasible"
    assert len(spans["queue"]) == 1  # ended by the refusal, never left open
    statuses = [s.status.status_code.name for s in spans["POST /v2/models/m/infer"]]
    assert statuses == ["UNSET", "ERROR"]  # a 429 is the client's business, a 503 the server's


def test_a_failed_triton_call_marks_its_span_and_the_batch() -> None:
    pytest.importorskip("opentelemetry.sdk")
    tracing = make_tracing(spec())

    class Broken:
        def infer(self, variant, inputs, timeout, forward=None, triton_us=0, *, trace_headers=None):  # noqa: ANN001, ANN201
            async def fail() -> list:
                raise ConnectionError("replica went away")

            return fail()

    async def main() -> None:
        req = tracing.request("http", "m", {})
        req.admitted()
        batch = tracing.batch("m", "v", "v@r0", 1, [req])
        (call,) = batch.calls(Broken(), "v", [[SimpleNamespace(shape=[1, 3])]], 1.0)
        with pytest.raises(ConnectionError):
            await call
        batch.end(ConnectionError("replica went away"))
        req.finish(503)

    asyncio.run(main())
    spans = by_name(finished_spans(tracing))
    assert spans["triton infer"][0].status.status_code.name == "ERROR"
    assert spans["batch"][0].status.status_code.name == "ERROR"


def test_unsampled_requests_record_nothing() -> None:
    pytest.importorskip("opentelemetry.sdk")
    tracing = make_tracing(spec(sample_ratio=0.0))
    client = run_batch_of_two(tracing)
    # the client's sampled traceparent is honoured; the request without one is not sampled
    names = sorted(s.name for s in finished_spans(tracing))
    assert names.count("inference.GRPCInferenceService/ModelInfer") == 0
    assert names.count("POST /v2/models/m/infer") == 1
    assert client.headers[0]["traceparent"].startswith(f"00-{CLIENT_TRACE}-")


@pytest.mark.parametrize("backend", ["http", "grpc"])
def test_the_replica_clients_carry_the_trace_context_to_triton(triton, backend) -> None:
    pytest.importorskip("opentelemetry.sdk")
    tracing = make_tracing(spec())
    profile = ProfileSet.reference().get("resnet50", "A100-80GB", "1g.10gb").with_max_batch(8)
    model = ServedModel("m", 2.0, 8, Priority.GUARANTEED, (
        ServedReplica("m@fake", triton.url(backend), backend, "m", profile, 1),))

    async def main() -> None:
        driver = Driver([model], EdfScheduler(SchedulerConfig(policy="adaptive", wait=False)), health_interval=3600)
        driver.tracing = tracing
        await driver.start()
        try:
            trace = tracing.request("http", "m", {"traceparent": TRACEPARENT})
            trace.admit()
            x = np.array([[1.5, -2.0]], np.float32)
            fut = driver.submit("m", InferInput([Tensor("x", "FP32", [1, 2], x.tobytes())]), trace=trace)
            trace.admitted()
            res = await fut
            trace.finish(200, variant=res.variant)
            assert np.frombuffer(bytes(res.outputs[0].raw), np.float32).tolist() == [1.5, -2.0]
        finally:
            await driver.stop()

    n = len(triton.traceparents)
    asyncio.run(main())
    (sent,) = triton.traceparents[n:]
    (call,) = [s for s in finished_spans(tracing) if s.name == "triton infer"]
    assert sent == f"00-{CLIENT_TRACE}-{hexid(call.context.span_id)}-01"


# --------------------------------------------------------------------------- through the gateway


@pytest.fixture(scope="module", params=["http", "grpc"])
def traced(triton, request):
    """A gateway tracing into memory, reaching the fake Triton by either protocol."""
    pytest.importorskip("opentelemetry.sdk")
    doc = {"listen": {"http_port": 0, "grpc_port": 0}, "tracing": {"enabled": True, "exporter": "memory"},
           "models": [{"name": "m", "slo_ms": 2000, "max_batch": 8, "replicas": [
               {"url": triton.url(request.param), "protocol": request.param, "variant": "m", "profile": PROFILE}]}]}
    with GatewayThread(parse_config(doc)) as gw:
        yield gw


def http_call(gw, headers: dict[str, str]) -> int:  # noqa: ANN001
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}).encode()
    conn = http.client.HTTPConnection(gw.http_url, timeout=10)
    try:
        conn.request("POST", "/v2/models/m/infer", body, headers)
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def grpc_call(gw, metadata: tuple) -> None:  # noqa: ANN001
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    req.raw_input_contents.append(np.ones((1, 2), np.float32).tobytes())
    with grpc.insecure_channel(gw.grpc_url) as ch:
        pbg.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=10, metadata=metadata)


@pytest.mark.parametrize("client", ["http", "grpc"])
def test_a_request_through_the_gateway_is_traced_in_the_clients_trace_down_to_triton(traced, triton, client) -> None:
    n_spans, n_calls = len(finished_spans(traced.tracing)), len(triton.traceparents)
    if client == "http":
        assert http_call(traced, {"traceparent": TRACEPARENT}) == 200
    else:
        grpc_call(traced, (("traceparent", TRACEPARENT),))
    # NOTE: every span has ended by the time the client has its answer
    spans = finished_spans(traced.tracing)[n_spans:]
    mine = by_name(s for s in spans if hexid(s.context.trace_id, 32) == CLIENT_TRACE)
    server_name = "POST /v2/models/m/infer" if client == "http" else "inference.GRPCInferenceService/ModelInfer"
    (server,) = mine[server_name]
    (admission,), (queue,), (batch,), (call,) = mine["admission"], mine["queue"], mine["batch"], mine["triton infer"]
    assert hexid(server.parent.span_id) == "b7ad6b7169203331"
    for child in (admission, queue, batch):
        assert child.parent.span_id == server.context.span_id
    assert call.parent.span_id == batch.context.span_id
    assert admission.end_time <= queue.start_time and queue.end_time <= batch.start_time
    assert batch.attributes["headrace.batch.rows"] == 1 and batch.attributes["headrace.variant"] == "m"
    (sent,) = triton.traceparents[n_calls:]
    assert sent == f"00-{CLIENT_TRACE}-{hexid(call.context.span_id)}-01"


def test_a_request_without_a_traceparent_starts_a_trace_that_reaches_triton(traced, triton) -> None:
    n_spans, n_calls = len(finished_spans(traced.tracing)), len(triton.traceparents)
    assert http_call(traced, {}) == 200
    (server,) = [s for s in finished_spans(traced.tracing)[n_spans:] if s.name.startswith("POST")]
    assert server.parent is None
    (sent,) = triton.traceparents[n_calls:]
    assert sent.split("-")[1] == hexid(server.context.trace_id, 32)


def test_a_refusal_is_a_span_that_says_why(traced) -> None:
    n_spans = len(finished_spans(traced.tracing))
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}],
                       "parameters": {"timeout": 1}}).encode()
    conn = http.client.HTTPConnection(traced.http_url, timeout=10)
    conn.request("POST", "/v2/models/m/infer", body, {"traceparent": TRACEPARENT})
    assert conn.getresponse().status == 429
    conn.close()
    spans = by_name(finished_spans(traced.tracing)[n_spans:])
    (server,), (admission,) = spans["POST /v2/models/m/infer"], spans["admission"]
    assert server.attributes["headrace.reject_reason"] == "infeasible"
    assert admission.attributes["headrace.admitted"] is False
    assert "batch" not in spans and "queue" not in spans


def test_a_batch_of_unrecorded_requests_makes_no_spans_but_still_tells_triton_its_trace() -> None:
    pytest.importorskip("opentelemetry.sdk")
    tracing = make_tracing(spec(sample_ratio=0.0))
    client = RecordingClient()
    unsampled = f"00-{CLIENT_TRACE}-b7ad6b7169203331-00"

    async def main() -> None:
        req = tracing.request("http", "m", {"traceparent": unsampled})
        req.admit()
        req.admitted()
        batch = tracing.batch("m", "v", "v@r0", 1, [req])
        (call,) = batch.calls(client, "v", [[SimpleNamespace(shape=[1, 3])]], 1.0)
        await batch.ended(call)
        req.finish(200)

    asyncio.run(main())
    assert finished_spans(tracing) == []
    (headers,) = client.headers
    # NOTE: Triton joins the client's trace (under the gateway's unrecorded span), unsampled as asked
    version, trace_id, _, flags = headers["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", CLIENT_TRACE, "00")


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_off_the_gateway_never_imports_opentelemetry() -> None:
    done = python(
        "import sys\n"
        "from types import SimpleNamespace\n"
        "import gateway.app, gateway.observe.tracing, gateway.observe.accesslog\n"
        "assert gateway.observe.tracing.make_tracing(SimpleNamespace(enabled=False)) is None\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "print(loaded)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_on_without_the_extra_installed_is_one_line_naming_the_extra() -> None:
    done = python(
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if the extra were not installed\n"
        "from types import SimpleNamespace\n"
        "from gateway.observe.tracing import make_tracing\n"
        "try:\n"
        "    make_tracing(SimpleNamespace(enabled=True, exporter='otlp'))\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip()
    assert "\n" not in out
    assert out.startswith("ConfigError tracing.enabled: OpenTelemetry is not installed")
    assert "pip install 'headrace[tracing]'" in out
