"""KServe v2 / Triton gRPC front door (``inference.GRPCInferenceService`` on grpc.aio).

Requests arrive as raw bytes and are parsed here, so a malformed protobuf is answered with
INVALID_ARGUMENT instead of grpc's generic deserialization error. Domain errors become
status codes here, at the handler edge, and only here. A model version the model does not
have is NOT_FOUND ("" is its default). RPCs not listed (shared memory, model load/unload,
trace, logging) answer UNIMPLEMENTED.

With tenants configured (:mod:`gateway.frontdoor.security`), every RPC but ServerLive and ServerReady
needs an API key in the call's metadata (``authorization: Bearer KEY`` or ``x-api-key: KEY``),
else UNAUTHENTICATED; a tenant's inferences take its priority class and spend its quota
(RESOURCE_EXHAUSTED, reason ``quota``), and every answer is counted by tenant and code name.

With an access log or tracing on (``observer``, :mod:`gateway.observe.request`), ModelInfer is served
by a handler that sees each call from arrival to answer, refusals included (it is chosen when
the server is made: off, the RPCs run as they are).

The listener's limits (:func:`server_options`, the ``grpc_*`` fields of
:class:`~profiles.schema.LimitsSpec`) are grpc core's own channel arguments, as named in grpc's
``include/grpc/impl/channel_arg_names.h`` and read by the installed grpcio (1.85):
``grpc.max_allowed_incoming_connections`` (a connection past the cap is closed as it is
accepted: ``ConnectionQuota::AllowIncomingConnection`` in
``src/core/ext/transport/chttp2/server/chttp2_server.cc``), ``grpc.max_connection_idle_ms``
(GOAWAY, then close, once a connection has had no call open that long),
``grpc.server_handshake_timeout_ms`` (also the time a connection has to send its HTTP/2
SETTINGS; grpc's default is 120 s), ``grpc.max_concurrent_streams`` and the keepalive
policing of ``src/core/ext/transport/chttp2/transport/ping_abuse_policy.cc``. The keepalive
defaults are Triton's (``KeepAliveOptions`` in triton-inference-server/server
``src/grpc/grpc_server.h``: keepalive_time_ms 7200000, keepalive_timeout_ms 20000,
keepalive_permit_without_calls false, http2_max_pings_without_data 2,
http2_min_recv_ping_interval_without_data_ms 300000, http2_max_ping_strikes 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from gateway.codec import InferInput, encode_grpc_response, parse_grpc_infer, raw_to_json
from gateway.contract import choice_headers
from gateway.driver import SLO_HEADER, Driver
from gateway.errors import REASON_HEADER, GatewayError, InvalidRequest, Rejected, Unauthenticated
from gateway.frontdoor.decode import Decoder, GrpcCall, read_grpc
from gateway.frontdoor.httpserver import HttpResponse
from gateway.frontdoor.security import OPEN_GRPC_METHODS, Tenant, Tenants, grpc_key
from gateway.frontdoor.stats import (
    SERVER_NAME,
    SERVER_VERSION,
    ServerInfo,
    model_config_pb,
    model_metadata_pb,
)
from gateway.llm import generate
from gateway.llm.api import LlmCall, OpenAiError
from gateway.llm.relay import LlmService
from gateway.llm.routing import LlmAsk
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.request import Observer, Seen
from profiles.schema import UNAUTHENTICATED, LimitsSpec

SERVICE = "inference.GRPCInferenceService"

log = logging.getLogger("headrace.grpc")


def _parse(cls: type, raw: bytes) -> Any:
    try:
        return cls.FromString(raw)
    except DecodeError as e:
        raise InvalidRequest(f"malformed {cls.__name__}: {e}") from None


def _slo_header(context: grpc.aio.ServicerContext) -> str | None:
    for k, v in context.invocation_metadata() or ():
        if k == SLO_HEADER:
            return v if isinstance(v, str) else v.decode()
    return None


def _client_wait(context: grpc.aio.ServicerContext, clock) -> tuple[float, float | None]:  # noqa: ANN001
    """(when, seconds the client still waits then: its gRPC deadline, None without one). The
    clock is read first, so a deadline counted from ``when`` never outlasts the client's."""
    return clock(), context.time_remaining()


async def _abort(context: grpc.aio.ServicerContext, e: GatewayError) -> None:
    if isinstance(e, Rejected):
        context.set_trailing_metadata((("retry-after", str(max(1, math.ceil(e.retry_after)))),
                                       (REASON_HEADER, e.reason)))
    await context.abort(e.grpc_code, str(e))


def _client(context: grpc.aio.ServicerContext, tenant: Tenant | None) -> str | None:
    """Whom the driver's queue bounds charge a call to: its tenant, else its peer's host
    (``ipv4:10.0.0.7:5123`` -> ``10.0.0.7``, ``ipv6:[::1]:5123`` -> ``::1``; another kind of
    peer, a unix socket, as it is)."""
    if tenant is not None:
        return tenant.name
    peer = context.peer() or ""
    kind, _, addr = peer.partition(":")
    if kind == "ipv4":
        return addr.rpartition(":")[0] or None
    if kind == "ipv6":  # grpc writes the brackets percent-encoded: ipv6:%5B::1%5D:5123
        host = addr.rpartition(":")[0]
        return unquote(host[3:-3] if host.startswith("%5B") else host.strip("[]")) or None
    return unquote(peer) or None


def _reason(e: GatewayError) -> str:
    """What an access log line says of a refusal: the reject reason, else the message."""
    return e.reason if isinstance(e, Rejected) else str(e)


class InferenceServicer:
    """The RPCs; ``tenants``: who may call (None: everyone); ``observer``: the access log and
    tracing (None: both off)."""

    def __init__(self, driver: Driver, info: ServerInfo, tenants: Tenants | None = None,
                 observer: Observer | None = None, llm: LlmService | None = None,
                 decoder: Decoder | None = None, stream_pending: int = 256, write_timeout_s: float = 30.0) -> None:
        self.driver = driver
        self.info = info
        self.tenants = tenants
        self.observer = observer
        self.llm = llm
        self.decoder = decoder or Decoder()  # infer requests: large ones off the loop
        self.stream_pending = stream_pending  # a stream's requests in flight or answered, not yet sent
        self.write_timeout_s = write_timeout_s  # a stream whose client reads nothing this long is ended

    async def _generate(self, req: pb.ModelInferRequest, context: grpc.aio.ServicerContext, llm: LlmService,
                        tenant: Tenant | None, put: Callable[[pb.ModelStreamInferResponse], Awaitable[None]]) -> str:
        """A stream request to a generative model: one response per token as its engine makes
        it (an empty one flagged final at the end when the request asks for it, as Triton's
        ``triton_enable_empty_final_response``); its status code's name."""
        arrival = self.driver.clock()
        name, rid = req.model_name, req.id
        meta = {k: v if isinstance(v, str) else v.decode() for k, v in context.invocation_metadata() or ()}
        inp = parse_grpc_infer(req)
        body: dict[str, Any] = {k: v for k, v in inp.parameters.items() if not k.startswith("triton_")}
        for t in inp.inputs:
            values = raw_to_json(t)
            body[t.name] = values[0] if len(values) == 1 else values
        try:
            call, ask = _llm_checked(generate.generate_call(name, body, True), llm, meta, self.tenants, tenant)
        except OpenAiError as e:
            raise InvalidRequest(e.message) from None
        resp = await llm.call(call, ask, arrival)
        if isinstance(resp, HttpResponse):
            message = generate.answer(resp, name).body.decode()
            await put(pb.ModelStreamInferResponse(error_message=json.loads(message)["error"],
                                                  infer_response=pb.ModelInferResponse(id=rid)))
            return _HTTP_CODES.get(resp.status, "UNAVAILABLE")

        def token(text: str | None, error: str | None) -> pb.ModelStreamInferResponse:
            if error is not None:
                return pb.ModelStreamInferResponse(error_message=error, infer_response=pb.ModelInferResponse(id=rid))
            return pb.ModelStreamInferResponse(infer_response=_text_output(name, rid, text or ""))

        pieces = generate.Pieces(resp.chunks, token)
        code = "OK"
        try:
            async for msgs in pieces:
                for msg in msgs:  # type: ignore[union-attr]
                    code = "UNAVAILABLE" if msg.error_message else code
                    await put(msg)
        finally:
            await pieces.aclose()
        if req.parameters["triton_enable_empty_final_response"].bool_param:
            final = pb.ModelInferResponse(model_name=name, model_version=generate.VERSION, id=rid)
            final.parameters["triton_final_response"].bool_param = True
            await put(pb.ModelStreamInferResponse(infer_response=final))
        return code

    async def _infer(self, req: pb.ModelInferRequest | GrpcCall, slo: str | None,
                     deadline: float | None = None, tenant: Tenant | None = None,
                     hints: dict[str, str] | None = None, seen: Seen | None = None,
                     received: float | None = None, client: str | None = None) -> pb.ModelInferResponse:
        """``deadline``: seconds the client still waits (its gRPC deadline), a cap on the SLO,
        counted from ``received`` (the driver's clock when it was read; default: now);
        ``tenant``: whose request it is (its quota is spent, its priority class applies);
        ``seen``: the access log's and tracing's view of it, answered here when it is served;
        ``client``: whom the driver's queue bounds charge it to (:func:`_client`). ``req`` as
        :func:`~gateway.frontdoor.decode.read_grpc` read it, whose data is decoded here (off the
        loop when large) after what it declares is checked against its model's signature."""
        call = req if isinstance(req, GrpcCall) else GrpcCall(req, None, None)
        req = call.req
        name = req.model_name
        model = self.driver.model(name, req.model_version)
        if tenant is not None:
            self.tenants.admit(tenant)  # type: ignore[union-attr]
        sig = None if model.info is None else model.info.signature
        decoded = self.decoder.grpc(call, sig, name, client or "")
        inp = decoded if isinstance(decoded, InferInput) else await decoded
        if seen is not None:
            seen.parsed(inp, sig is not None and sig.batched)
        res = await self.driver.infer(name, inp, slo, received, version=req.model_version, deadline=deadline,
                                      priority=None if tenant is None else tenant.priority, hints=hints,
                                      trace=None if seen is None else seen.trace, client=client)
        if seen is not None:
            seen.answered("OK", variant=res.variant, queue_s=res.queue_s)
        return encode_grpc_response(name, req.model_version or model.default_version, inp, res.outputs,
                                    res.parameters())

    async def ModelInfer(self, raw: bytes, context: grpc.aio.ServicerContext,
                         tenant: Tenant | None = None) -> pb.ModelInferResponse:
        received, remaining = _client_wait(context, self.driver.clock)
        return await self._infer(read_grpc(raw), _slo_header(context), remaining, tenant,
                                 choice_headers(context.invocation_metadata() or ()), received=received,
                                 client=_client(context, tenant))

    async def ModelStreamInfer(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext, tenant: Tenant | None = None
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        slo = _slo_header(context)
        hints = choice_headers(context.invocation_metadata() or ())
        client = _client(context, tenant)
        # back-pressure: at most stream_pending requests in flight or answered and unsent; past
        # it the next request is not read, and a token stream's messages wait for room
        out: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue(self.stream_pending)
        room = asyncio.Semaphore(self.stream_pending)
        tasks: set[asyncio.Task] = set()

        async def one(raw: bytes) -> None:
            rid, code, seen = "", "OK", None
            try:
                call = read_grpc(raw)
                req = call.req
                rid = req.id
                llm = self.llm
                if llm is not None and req.model_name in llm.models:
                    code = await self._generate(_parse(pb.ModelInferRequest, raw), context, llm, tenant, out.put)
                    if tenant is not None:
                        _count(self.driver.metrics, tenant.name, code)
                    return
                if self.observer is not None:
                    seen = self.observer.grpc_request(req.model_name, req.model_version, context.invocation_metadata())
                    seen.tenant = None if tenant is None else tenant.name
                msg = pb.ModelStreamInferResponse(infer_response=await self._infer(call, slo, tenant=tenant, hints=hints,
                                                                                   seen=seen, client=client))
            except GatewayError as e:
                code = e.grpc_code.name
                if self.observer is not None:
                    seen = seen or self.observer.grpc_request(None, "", context.invocation_metadata())
                    seen.answered(code, reason=_reason(e))
                msg = pb.ModelStreamInferResponse(error_message=str(e), infer_response=pb.ModelInferResponse(id=rid))
            except asyncio.CancelledError:
                if seen is not None:
                    seen.cancelled()
                raise
            if tenant is not None:
                _count(self.driver.metrics, tenant.name, code)
            await out.put(msg)

        async def reader() -> None:
            try:
                it = aiter(requests)
                while True:
                    await room.acquire()
                    try:
                        raw = await anext(it)
                    except StopAsyncIteration:
                        break
                    t = asyncio.create_task(one(raw))
                    tasks.add(t)
                    t.add_done_callback(lambda t: (tasks.discard(t), room.release()))
                if tasks:
                    await asyncio.gather(*list(tasks), return_exceptions=True)
            except asyncio.CancelledError:
                raise  # the call ended: nobody reads the answers any more
            except Exception:  # noqa: BLE001,S110  (the request stream broke: the answers end)
                pass
            await out.put(None)

        rt = asyncio.create_task(reader())
        loop = asyncio.get_running_loop()
        ending: list[asyncio.Task] = []
        # one timer per write_timeout_s at most, not one per answer: it looks at when the
        # answer being written was handed to grpc, and sets itself again while writes go on
        writing: list[float | None] = [None]  # when grpc was handed the answer it is writing
        watch: list[asyncio.TimerHandle | None] = [None]

        def check() -> None:
            since = writing[0]
            watch[0] = None
            if since is None:
                return
            if (left := since + self.write_timeout_s - loop.time()) > 0:
                watch[0] = loop.call_later(left, check)
                return
            stuck()

        def stuck() -> None:
            """The client has read no answer for write_timeout_s (grpc's write of one waits on
            HTTP/2 flow control): its requests stop, nothing more is read, and the call ends
            with RESOURCE_EXHAUSTED, which the client sees after the answers it had not read
            (the status is queued behind them)."""
            log.warning("a ModelStreamInfer client read no answer for %g s: its call is ended", self.write_timeout_s)
            rt.cancel()
            for t in list(tasks):
                t.cancel()

            async def end() -> None:
                with contextlib.suppress(grpc.aio.AbortError, grpc.aio.UsageError, RuntimeError):
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                        f"the client read no answer for {self.write_timeout_s:g} s (write_timeout_s)")

            ending.append(loop.create_task(end()))

        try:
            while (msg := await out.get()) is not None:
                writing[0] = loop.time()
                if watch[0] is None:
                    watch[0] = loop.call_later(self.write_timeout_s, check)
                try:
                    yield msg
                finally:
                    writing[0] = None
        finally:
            if watch[0] is not None:
                watch[0].cancel()
            rt.cancel()
            # the call ended early (its client went, or read nothing for write_timeout_s): its
            # requests go too (a token stream is aborted at its engine), none waits for room
            for t in list(tasks):
                t.cancel()

    async def ServerLive(self, raw: bytes, context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, raw: bytes, context: grpc.aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.driver.ready())

    async def ModelReady(self, raw: bytes, context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
        req = _parse(pb.ModelReadyRequest, raw)
        self.driver.model(req.name, req.version)
        return pb.ModelReadyResponse(ready=self.driver.model_ready(req.name))

    async def ServerMetadata(self, raw: bytes, context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        md = self.info.server_metadata()
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION, extensions=md["extensions"])

    async def ModelMetadata(self, raw: bytes, context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        req = _parse(pb.ModelMetadataRequest, raw)
        return model_metadata_pb(self.driver.model(req.name, req.version), req.name)

    async def ModelConfig(self, raw: bytes, context: grpc.aio.ServicerContext) -> pb.ModelConfigResponse:
        req = _parse(pb.ModelConfigRequest, raw)
        return pb.ModelConfigResponse(config=model_config_pb(self.driver.model(req.name, req.version), req.name))

    async def ModelStatistics(self, raw: bytes, context: grpc.aio.ServicerContext) -> pb.ModelStatisticsResponse:
        req = _parse(pb.ModelStatisticsRequest, raw)
        if req.name:
            self.driver.model(req.name, req.version)
        return self.info.statistics(req.name or None, req.version)

    async def RepositoryIndex(self, raw: bytes, context: grpc.aio.ServicerContext) -> pb.RepositoryIndexResponse:
        resp = pb.RepositoryIndexResponse()
        for m in self.info.repository_index():
            resp.models.add(name=m["name"], version=m["version"], state=m["state"])
        return resp


_HTTP_CODES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED"}


def _llm_checked(call: LlmCall, llm: LlmService, meta: dict[str, str], tenants: Tenants | None,
                 tenant: Tenant | None) -> tuple[LlmCall, LlmAsk]:
    """``call`` with what it asks of its router (SLOs, band, tenant; from the call's metadata
    or its model's), its tenant admitted (over quota: a :class:`Rejected`)."""
    ask = llm.asks(call, meta, *(() if tenant is None else (tenant.name, tenant.priority)))
    if tenant is not None:
        tenants.admit(tenant)  # type: ignore[union-attr]
    return call, ask


def _text_output(name: str, rid: str, text: str) -> pb.ModelInferResponse:
    raw = text.encode()
    return pb.ModelInferResponse(
        model_name=name, model_version=generate.VERSION, id=rid,
        outputs=[pb.ModelInferResponse.InferOutputTensor(name="text_output", datatype="BYTES", shape=[1])],
        raw_output_contents=[len(raw).to_bytes(4, "little") + raw])


def _unary(fn: Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Any]]) -> grpc.RpcMethodHandler:
    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(raw, context)
        except GatewayError as e:
            await _abort(context, e)

    return grpc.unary_unary_rpc_method_handler(handler, response_serializer=_serialize)


def _count(metrics: GatewayMetrics, tenant: str, code: str) -> None:
    metrics.of(metrics.tenant_requests, tenant, code).inc()


async def _identify(tenants: Tenants, metrics: GatewayMetrics, context: grpc.aio.ServicerContext) -> Tenant:
    """The tenant the call's key names; without a valid key the call ends UNAUTHENTICATED."""
    try:
        return tenants.identify(grpc_key(context.invocation_metadata()))
    except Unauthenticated as e:
        _count(metrics, UNAUTHENTICATED, e.grpc_code.name)
        await _abort(context, e)
        raise  # not reached: abort raises


def _unary_as_tenant(fn: Callable[..., Awaitable[Any]], servicer: InferenceServicer,
                     takes_tenant: bool) -> grpc.RpcMethodHandler:
    """``fn`` for callers with a valid key only, each answer counted by tenant and code."""
    tenants, metrics = servicer.tenants, servicer.driver.metrics
    assert tenants is not None

    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        tenant = await _identify(tenants, metrics, context)
        try:
            resp = await (fn(raw, context, tenant) if takes_tenant else fn(raw, context))
        except GatewayError as e:
            _count(metrics, tenant.name, e.grpc_code.name)
            await _abort(context, e)
        _count(metrics, tenant.name, "OK")
        return resp

    return grpc.unary_unary_rpc_method_handler(handler, response_serializer=_serialize)


def _stream_as_tenant(servicer: InferenceServicer) -> grpc.RpcMethodHandler:
    tenants, metrics = servicer.tenants, servicer.driver.metrics
    assert tenants is not None

    async def handler(requests: AsyncIterator[bytes],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ModelStreamInferResponse]:
        tenant = await _identify(tenants, metrics, context)
        async for msg in servicer.ModelStreamInfer(requests, context, tenant):
            yield msg

    return grpc.stream_stream_rpc_method_handler(handler, response_serializer=_serialize)


def _observed_infer(servicer: InferenceServicer, observer: Observer) -> grpc.RpcMethodHandler:
    """ModelInfer with every call seen by the access log and tracing, refusals included (an
    unknown key, a malformed message, a refusal by the scheduler, a call the client cancels);
    with tenants, it identifies the caller as :func:`_unary_as_tenant` does."""
    tenants, metrics = servicer.tenants, servicer.driver.metrics

    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        received, remaining = _client_wait(context, servicer.driver.clock)
        md = context.invocation_metadata()
        tenant, seen = None, None
        try:
            if tenants is not None:
                try:
                    tenant = tenants.identify(grpc_key(md))
                except Unauthenticated as e:
                    _count(metrics, UNAUTHENTICATED, e.grpc_code.name)
                    raise
            req = read_grpc(raw)
            seen = observer.grpc_request(req.req.model_name, req.req.model_version, md)
            seen.tenant = None if tenant is None else tenant.name
            resp = await servicer._infer(req, _slo_header(context), remaining, tenant, choice_headers(md or ()), seen,
                                         received)
        except GatewayError as e:
            if seen is None:  # refused before its model was known
                seen = observer.grpc_request(None, "", md)
                seen.tenant = None if tenant is None else tenant.name
            seen.answered(e.grpc_code.name, reason=_reason(e))
            if tenant is not None:
                _count(metrics, tenant.name, e.grpc_code.name)
            await _abort(context, e)
        except asyncio.CancelledError:
            if seen is not None:
                seen.cancelled()
            raise
        if tenant is not None:
            _count(metrics, tenant.name, "OK")
        return resp

    return grpc.unary_unary_rpc_method_handler(handler, response_serializer=_serialize)


def _serialize(msg: Any) -> bytes:
    return msg.SerializeToString()


def generic_handler(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    names = ["ModelInfer", "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
             "ModelConfig", "ModelStatistics", "RepositoryIndex"]
    if servicer.tenants is None:
        handlers = {n: _unary(getattr(servicer, n)) for n in names}
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            servicer.ModelStreamInfer, response_serializer=_serialize
        )
    else:  # health probes stay open; everything else needs a key
        handlers = {n: _unary(getattr(servicer, n)) if n in OPEN_GRPC_METHODS
                    else _unary_as_tenant(getattr(servicer, n), servicer, takes_tenant=n == "ModelInfer")
                    for n in names}
        handlers["ModelStreamInfer"] = _stream_as_tenant(servicer)
    if servicer.observer is not None:
        handlers["ModelInfer"] = _observed_infer(servicer, servicer.observer)
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


_TRITON_MAX_PINGS_WITHOUT_DATA = 2  # pings the gateway itself sends with no data between (Triton's)


def _ms(seconds: float) -> int:
    return min(2**31 - 1, max(1, round(seconds * 1000)))  # grpc reads an int of milliseconds


def server_options(max_message_bytes: int, limits: LimitsSpec | None = None,
                   reuse_port: bool = False) -> list[tuple[str, int]]:
    """grpc core's channel arguments for the gRPC listener: message sizes, the port's sharing
    and ``limits``' ``grpc_*`` fields (None: their defaults)."""
    s = limits or LimitsSpec()
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", int(reuse_port)),
        ("grpc.max_allowed_incoming_connections", s.grpc_max_connections),
        ("grpc.max_connection_idle_ms", _ms(s.grpc_idle_timeout_s)),
        ("grpc.server_handshake_timeout_ms", _ms(s.grpc_handshake_timeout_s)),
        ("grpc.max_concurrent_streams", s.grpc_max_concurrent_streams),
        ("grpc.keepalive_time_ms", _ms(s.grpc_keepalive_time_s)),
        ("grpc.keepalive_timeout_ms", _ms(s.grpc_keepalive_timeout_s)),
        ("grpc.keepalive_permit_without_calls", int(s.grpc_keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", _TRITON_MAX_PINGS_WITHOUT_DATA),
        ("grpc.http2.min_ping_interval_without_data_ms", _ms(s.grpc_min_ping_interval_s)),
        ("grpc.http2.max_ping_strikes", s.grpc_max_ping_strikes),
    ]


def create_server(driver: Driver, info: ServerInfo, max_message_bytes: int = 64 << 20,
                  tenants: Tenants | None = None, observer: Observer | None = None,
                  reuse_port: bool = False, llm: LlmService | None = None,
                  limits: LimitsSpec | None = None, decoder: Decoder | None = None,
                  write_timeout_s: float = 30.0) -> grpc.aio.Server:
    """The gRPC server; ``reuse_port``: its port may be shared with other gateway processes
    (SO_REUSEPORT), else binding a port in use fails; ``limits``: its connection cap, idle and
    handshake timeouts, streams per connection and keepalive (:func:`server_options`), and the
    answers a stream holds; ``write_timeout_s``: how long a stream's client may read nothing."""
    server = grpc.aio.server(options=server_options(max_message_bytes, limits, reuse_port))
    servicer = InferenceServicer(driver, info, tenants, observer, llm, decoder,
                                 stream_pending=(limits or LimitsSpec()).grpc_stream_pending,
                                 write_timeout_s=write_timeout_s)
    server.add_generic_rpc_handlers((generic_handler(servicer),))
    return server
