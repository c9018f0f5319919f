"""Tracing: a request's spans (server, admission, queue) sit in the client's trace; a batch
span parents under its first request and links the others; the Triton call carries a
traceparent of the client's trace. Off, nothing imports OpenTelemetry; on without the extra
installed, one line says what to install."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.tracing import make_tracing

ROOT = Path(__file__).resolve().parent.parent
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"


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
    spans = by_name(tracing.finished_spans())
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
    spans = by_name(tracing.finished_spans())
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
    spans = by_name(tracing.finished_spans())
    assert spans["triton infer"][0].status.status_code.name == "ERROR"
    assert spans["batch"][0].status.status_code.name == "ERROR"


def test_unsampled_requests_record_nothing() -> None:
    pytest.importorskip("opentelemetry.sdk")
    tracing = make_tracing(spec(sample_ratio=0.0))
    client = run_batch_of_two(tracing)
    # the client's sampled traceparent is honoured; the request without one is not sampled
    names = sorted(s.name for s in tracing.finished_spans())
    assert names.count("inference.GRPCInferenceService/ModelInfer") == 0
    assert names.count("POST /v2/models/m/infer") == 1
    assert client.headers[0]["traceparent"].startswith(f"00-{CLIENT_TRACE}-")


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_off_the_gateway_never_imports_opentelemetry() -> None:
    done = python(
        "import sys\n"
        "from types import SimpleNamespace\n"
        "import gateway.app, gateway.tracing, gateway.accesslog\n"
        "assert gateway.tracing.make_tracing(SimpleNamespace(enabled=False)) is None\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "print(loaded)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_on_without_the_extra_installed_is_one_line_naming_the_extra() -> None:
    done = python(
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if the extra were not installed\n"
        "from types import SimpleNamespace\n"
        "from gateway.tracing import make_tracing\n"
        "try:\n"
        "    make_tracing(SimpleNamespace(enabled=True, exporter='otlp'))\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip()
    assert "\n" not in out
    assert out.startswith("ConfigError tracing.enabled: OpenTelemetry is not installed")
    assert "pip install 'headrace[tracing]'" in out
