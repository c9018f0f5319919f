"""OpenTelemetry tracing of inference requests, with W3C trace context carried to Triton.

Each request is a server span (``POST /v2/models/{model}/infer`` over HTTP,
``inference.GRPCInferenceService/ModelInfer`` over gRPC) whose parent is the client's
``traceparent`` (HTTP header or gRPC metadata), when it sent one. Under it:

- ``admission``: validation and the scheduler's admit-or-refuse decision;
- ``queue``: from admission until the request's batch is sent (or it is refused or given up).

A batch serves several requests, each in its own trace, so it is one ``batch`` span (sent ->
answered; its rows, requests, model, variant and replica as attributes) whose parent is its
first request's span and which links to every other request's span; each of those links
back to it. Under the batch, one ``triton infer`` client span per call to Triton, and
that span's context is what Triton receives as ``traceparent`` (an HTTP header on the HTTP
replica client, gRPC metadata on the gRPC one): Triton's own trace of the batch joins the
trace of the batch's first request.

Off by default, and free when off: nothing imports :mod:`opentelemetry` until
:func:`make_tracing` is called with tracing enabled (it is an optional extra,
``pip install 'headrace[tracing]'``), and the front doors and the driver hold
``tracing: Tracing | None`` and test ``is None`` once per request and per batch.

Sampling is the SDK's parent-based ratio sampler: a client's sampled ``traceparent`` is
always recorded, an unsampled one never, and a request without one starts a trace with
probability ``sample_ratio``. A request whose trace is not recorded gets only its server span
(not recording); its Triton calls carry that span's context, unsampled, and a batch of such
requests has no spans of its own. Spans of the ``otlp`` and ``console`` exporters leave from the
SDK's batch processor thread, off the event loop; ``memory`` keeps them in the process
(``Tracing.memory``, the SDK's in-memory exporter) for tests and embedding.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import grpc

from gateway.errors import ConfigError
from gateway.observe.accesslog import FrontDoor

if TYPE_CHECKING:  # the SDK is imported only when tracing is turned on
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

Exporter = Literal["otlp", "console", "memory"]
TraceHeaders = tuple[tuple[str, str], ...]  # W3C trace context for a replica call: traceparent[, tracestate]

# gRPC codes that are the server's fault (OpenTelemetry's rule for server spans): an error status
_SERVER_FAULTS = frozenset({"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE",
                            "DATA_LOSS"})


class TracingSettings(Protocol):
    """What :func:`make_tracing` reads (``profiles.schema.TracingSpec``)."""

    enabled: bool
    exporter: Exporter
    endpoint: str
    service_name: str
    sample_ratio: float


class ReplicaClient(Protocol):
    def infer(self, variant: str, inputs: list[Any], timeout: float | None, forward: Any = None,
              triton_timeout_us: int = 0, *, trace_headers: TraceHeaders | None = None) -> Awaitable[list[Any]]: ...


def make_tracing(spec: TracingSettings) -> Tracing | None:
    """The tracing ``spec`` asks for, or None when it is off. Turned on without the
    ``tracing`` extra installed: :class:`ConfigError`, one line."""
    if not spec.enabled:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        if spec.exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError as e:
        raise ConfigError(f"tracing.enabled: OpenTelemetry is not installed ({e}); "
                          "install the extra: pip install 'headrace[tracing]'") from None
    provider = TracerProvider(resource=Resource.create({"service.name": spec.service_name}),
                              sampler=ParentBased(TraceIdRatioBased(spec.sample_ratio)))
    memory = None
    if spec.exporter == "memory":
        memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(memory))
    elif spec.exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    else:
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=spec.endpoint)))
    return Tracing(provider, memory)


class Tracing:
    """Makes the spans of requests and batches (see the module docstring)."""

    def __init__(self, provider: TracerProvider, memory: Any = None) -> None:
        from opentelemetry import trace
        from opentelemetry.context import Context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._empty = Context()
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("headrace.gateway")
        self.propagator = TraceContextTextMapPropagator()
        self.memory = memory  # the in-process exporter (``memory``; else None): get_finished_spans()

    def request(self, protocol: FrontDoor, model: str, carrier: Mapping[str, str], received_ago_s: float = 0.0,
                version: str = "") -> RequestTrace:
        """A request's server span, child of the ``traceparent`` in ``carrier`` (HTTP headers
        with lower-case names, or gRPC metadata as a dict), started ``received_ago_s`` ago."""
        parent = self.propagator.extract(carrier, self._empty) if "traceparent" in carrier else self._empty
        if protocol == "grpc":
            name, kind_attrs = "inference.GRPCInferenceService/ModelInfer", {
                "rpc.system": "grpc", "rpc.service": "inference.GRPCInferenceService", "rpc.method": "ModelInfer"}
        else:
            name, kind_attrs = f"POST /v2/models/{model}/infer", {"http.request.method": "POST"}
        start = time.time_ns() - int(max(0.0, received_ago_s) * 1e9)
        span = self.tracer.start_span(name, parent, self._trace.SpanKind.SERVER, start_time=start, attributes={
            **kind_attrs, "headrace.model": model, "headrace.model_version": version})
        return RequestTrace(self, span)

    def batch(self, model: str, variant: str, replica: str, rows: int,
              requests: Sequence[RequestTrace | None]) -> BatchTrace:
        """A batch sent now to ``replica``: each request's queue span ends, and the batch span
        starts under the first recorded request's span, linked to the other recorded ones'.
        With none recorded, no span: its calls carry the first request's context."""
        trace = self._trace
        recorded = []
        for r in requests:
            if r is not None and r.recording:
                r.dispatched()
                recorded.append(r)
        if not recorded:
            first = next((r for r in requests if r is not None), None)
            return BatchTrace(self, None, self._empty if first is None else first.context())
        links = [trace.Link(r.span.get_span_context()) for r in recorded[1:]]
        span = self.tracer.start_span("batch", recorded[0].context(), links=links, attributes={
            "headrace.model": model, "headrace.variant": variant, "headrace.replica": replica,
            "headrace.batch.rows": rows, "headrace.batch.requests": len(requests)})
        ctx = span.get_span_context()
        for r in recorded[1:]:  # the first is its parent
            r.span.add_link(ctx)
        return BatchTrace(self, span, trace.set_span_in_context(span, self._empty))

    def shutdown(self) -> None:
        """Export what is left and stop the exporter."""
        self.provider.shutdown()

    def _error(self, span: Span, message: str) -> None:
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, message))


class RequestTrace:
    """One request's spans: ``admit()`` before the scheduler decides, ``admitted()`` after,
    then the driver's :meth:`Tracing.batch` ends its queue span; ``finish()`` ends them all."""

    __slots__ = ("_t", "span", "recording", "_admission", "_queue")

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self._t = tracing
        self.span = span
        self.recording = span.is_recording()  # not: no child spans (they would not be recorded either)
        self._admission: Span | None = None
        self._queue: Span | None = None

    def context(self) -> Context:
        """A context holding its span: what its children and its Triton calls descend from."""
        t = self._t
        return t._trace.set_span_in_context(self.span, t._empty)

    def _child(self, name: str) -> Span:
        return self._t.tracer.start_span(name, self.context())

    def admit(self) -> None:
        if self.recording:
            self._admission = self._child("admission")

    def admitted(self) -> None:
        if not self.recording:
            return
        if self._admission is not None:
            self._admission.set_attribute("headrace.admitted", True)
            self._admission.end()
            self._admission = None
        self._queue = self._child("queue")

    def dispatched(self) -> None:
        if self._queue is not None:
            self._queue.end()
            self._queue = None

    def finish(self, status: int | str, *, variant: str | None = None, reason: str | None = None,
               tenant: str | None = None, rows: int | None = None) -> None:
        """End every span still open: ``status`` is the HTTP status or the gRPC code name."""
        span = self.span
        if self._admission is not None:  # refused while being admitted
            self._admission.set_attribute("headrace.admitted", False)
            if reason:
                self._admission.set_attribute("headrace.reject_reason", reason)
            self._admission.end()
            self._admission = None
        if self._queue is not None:  # refused or given up in the queue
            self._queue.end()
            self._queue = None
        if self.recording:
            if isinstance(status, int):
                span.set_attribute("http.response.status_code", status)
                failed = status >= 500
            else:
                span.set_attribute("rpc.grpc.status_code", grpc.StatusCode[status].value[0])
                failed = status in _SERVER_FAULTS
            for key, value in (("headrace.variant", variant), ("headrace.reject_reason", reason),
                               ("headrace.tenant", tenant), ("headrace.rows", rows)):
                if value is not None:
                    span.set_attribute(key, value)
            if failed:
                self._t._error(span, f"{status}: {reason}" if reason else str(status))
        span.end()


class BatchTrace:
    """A batch's span (None: no request of it is recorded): :meth:`calls` sends its Triton
    calls, each in a client span whose trace context goes with it; :meth:`ended` (or
    :meth:`end`) ends the batch."""

    __slots__ = ("_t", "span", "_ctx")

    def __init__(self, tracing: Tracing, span: Span | None, ctx: Context) -> None:
        self._t = tracing
        self.span = span
        self._ctx = ctx  # what its calls descend from

    def calls(self, client: ReplicaClient, variant: str, inputs: Sequence[list[Any]], timeout: float | None,
              forward: Any = None, triton_timeout_us: int = 0) -> list[Awaitable[list[Any]]]:
        """``client.infer`` for each group of ``inputs``, each carrying its span's context
        (unrecorded: the context the batch has, and no span)."""
        t = self._t
        if self.span is None:
            headers = self._headers(self._ctx)
            return [client.infer(variant, x, timeout, forward, triton_timeout_us, trace_headers=headers)
                    for x in inputs]
        out = []
        for x in inputs:
            span = t.tracer.start_span("triton infer", self._ctx, t._trace.SpanKind.CLIENT, attributes={
                "headrace.variant": variant, "headrace.batch.rows": int(x[0].shape[0]) if x and x[0].shape else 0})
            try:
                call = client.infer(variant, x, timeout, forward, triton_timeout_us,
                                    trace_headers=self._headers(t._trace.set_span_in_context(span, t._empty)))
            except Exception as e:
                self._failed(span, e)
                raise
            out.append(self._ended(span, call))
        return out

    def _headers(self, ctx: Context) -> TraceHeaders | None:
        """The W3C headers (traceparent, tracestate) of ``ctx``; None when it holds no span."""
        carrier: dict[str, str] = {}
        self._t.propagator.inject(carrier, ctx)
        return tuple(carrier.items()) or None

    async def _ended(self, span: Span, call: Awaitable[list[Any]]) -> list[Any]:
        try:
            result = await call
        except BaseException as e:
            self._failed(span, e)
            raise
        span.end()
        return result

    def _failed(self, span: Span, e: BaseException) -> None:
        span.record_exception(e)
        self._t._error(span, f"{type(e).__name__}: {e}")
        span.end()

    async def ended(self, answer: Awaitable[Any]) -> Any:
        """``answer`` awaited, the batch span ended with its outcome."""
        if self.span is None:
            return await answer
        try:
            result = await answer
        except asyncio.CancelledError:  # every waiter gone: not a failure of the batch
            self.span.set_attribute("headrace.cancelled", True)
            self.span.end()
            raise
        except BaseException as e:
            self.end(e)
            raise
        self.end()
        return result

    def end(self, error: BaseException | None = None) -> None:
        if self.span is None:
            return
        if error is not None:
            self._failed(self.span, error)
        else:
            self.span.end()
