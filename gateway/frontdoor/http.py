"""KServe v2 / Triton HTTP front door: one routing function over :mod:`gateway.frontdoor.httpserver`.

Routes: health (live, ready), server metadata, model metadata / ready / config / stats (with
or without ``/versions/N``: a version the model does not have is a 404), all-model stats, the
repository index, ``/metrics`` and infer.
Domain errors (:mod:`gateway.errors`) become ``{"error": msg}`` with their status here, at
the handler edge, and only here. Rejections carry ``Retry-After`` and the reject reason.

With tenants configured (:mod:`gateway.frontdoor.security`), every route but the health probes needs an
API key (``Authorization: Bearer KEY`` or ``x-api-key: KEY``): without a valid one the answer
is 401 with ``WWW-Authenticate: Bearer``. A tenant's inferences take its priority class and
spend its quota (429, reason ``quota``), and every answer is counted by tenant and status in
``headrace_tenant_requests_total``. ``/metrics`` here answers only a tenant with ``metrics:
true`` (403 for the others: it shows every tenant's counts). With a separate metrics listener,
``/metrics`` is served there (:func:`metrics_door`), without a key, and not here.

Generative models (:mod:`gateway.llm`) answer on the OpenAI API: ``GET /v1/models``, ``POST
/v1/completions`` and ``POST /v1/chat/completions`` (whole or streamed), with their errors in
OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``); keys, tenants' quotas
and the limits hold there as on the KServe routes.

With an access log or tracing on (``observer``, :mod:`gateway.observe.request`), every inference
request is seen from arrival to answer, refusals included; off, the door checks it once.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from urllib.parse import unquote

from google.protobuf import json_format

from gateway.codec import InferInput, encode_http_response
from gateway.contract import choice_headers
from gateway.driver import SLO_HEADER, Driver, InferResult
from gateway.errors import (
    REASON_HEADER,
    Forbidden,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    Rejected,
    Unauthenticated,
)
from gateway.fleet import Model
from gateway.frontdoor.decode import Decoder, inflate
from gateway.frontdoor.encode import Encoded, encoded_first, may_be_large
from gateway.frontdoor.httpserver import Handler, HttpRequest, HttpResponse, Later, error_response
from gateway.frontdoor.limits import Refusal
from gateway.frontdoor.security import OPEN_HTTP_PATHS, Tenant, Tenants, bearer_key
from gateway.frontdoor.stats import ServerInfo, model_config_dict, model_metadata_dict
from gateway.frontdoor.stream import StreamResponse
from gateway.llm import generate
from gateway.llm.api import LlmCall, OpenAiError, read_call
from gateway.llm.api import error_response as openai_error
from gateway.llm.relay import LlmService
from gateway.llm.routing import LlmAsk
from gateway.observe.request import Observer, Seen
from profiles.schema import UNAUTHENTICATED

HEADER_LEN = "inference-header-content-length"
_JSON = "application/json"
_OK = HttpResponse(200)
_METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_CHALLENGE = (("WWW-Authenticate", "Bearer"),)
_UNREAD_401 = HttpResponse(401)  # what a refusal before the body counts as


def _json(doc: object) -> HttpResponse:
    return HttpResponse(200, json.dumps(doc).encode(), _JSON)


def decoded_body(req: HttpRequest, max_bytes: int) -> bytes:
    """``req``'s body with its Content-Encoding undone (:func:`~gateway.frontdoor.decode.inflate`)."""
    return inflate(req.body, req.headers.get("content-encoding"), max_bytes)


class HttpFrontDoor:
    """The gateway's HTTP handler: ``door(request)`` -> a response now, or :class:`Later`.
    ``tenants``: who may call (None: everyone); ``serve_metrics``: answer ``/metrics`` here;
    ``observer``: the access log and tracing (None: both off); ``llm``: the generative models
    served on ``/v1/`` (None: none); ``decoder``: how infer bodies are decoded (:mod:`gateway.frontdoor.decode`)."""

    def __init__(self, driver: Driver, info: ServerInfo, max_body_bytes: int, max_json_depth: int = 64,
                 tenants: Tenants | None = None, serve_metrics: bool = True,
                 observer: Observer | None = None, llm: LlmService | None = None,
                 decoder: Decoder | None = None) -> None:
        self.driver = driver
        self.info = info
        self.max_body = max_body_bytes
        self.max_depth = max_json_depth
        self.tenants = tenants
        self.serve_metrics = serve_metrics
        self.observer = observer
        self.llm = llm
        self.decoder = decoder or Decoder()  # infer bodies: large ones off the loop

    def __call__(self, req: HttpRequest) -> HttpResponse | Later:
        """The answer now, or (an admitted inference) later, when the driver's future is done:
        no task per request, and a refusal is written in the loop turn that read the request."""
        if self.observer is not None:
            return self._observed(req, self.observer)
        return self._answer(req, None)

    def _answer(self, req: HttpRequest, seen: Seen | None) -> HttpResponse | Later:
        if self.tenants is not None and req.path not in OPEN_HTTP_PATHS:
            return self._as_tenant(req, self.tenants, seen)
        try:
            return self._route(req, None, seen)
        except GatewayError as e:
            return _error(e)

    def _observed(self, req: HttpRequest, observer: Observer) -> HttpResponse | Later:
        """The answer, and for an inference its access log line and spans once it is known
        (a client that hangs up first: 499)."""
        seen = observer.http_request(req.path, req.headers, req.received)
        answer = self._answer(req, seen)
        if seen is None:
            return answer
        if isinstance(answer, HttpResponse):
            seen.http_answered(answer)
            return answer
        fut, make = answer.future, answer.make
        fut.add_done_callback(lambda f: f.cancelled() and seen.cancelled())

        def made(f: asyncio.Future) -> HttpResponse:
            try:
                resp = make(f)
            except Exception as e:
                seen.answered(500, reason=f"internal error: {type(e).__name__}: {e}")
                raise
            seen.http_answered(resp, None if f.exception() is not None else f.result())
            return resp

        return Later(fut, made)

    def body_client(self, path: str, headers: dict[str, str], peer: str) -> str:
        """Whom a request's body is counted against as it arrives (the HTTP server's
        ``identify``): its tenant, its key checked before a byte of the body is read. A missing
        or unknown key is refused unread (:class:`Refusal` 401), so a client without a key
        holds no buffer; the health probes are counted by address."""
        if self.tenants is None or path in OPEN_HTTP_PATHS:
            return peer
        try:
            tenant = self.tenants.identify(bearer_key(headers.get("authorization"), headers.get("x-api-key")))
        except Unauthenticated as e:
            self._counted(UNAUTHENTICATED, _UNREAD_401)
            raise Refusal(401, str(e), headers=_CHALLENGE) from None
        return "tenant:" + tenant.name

    def _as_tenant(self, req: HttpRequest, tenants: Tenants, seen: Seen | None = None) -> HttpResponse | Later:
        """``req`` answered for the tenant its key names (401 without one), and counted."""
        h = req.headers
        try:
            tenant = tenants.identify(bearer_key(h.get("authorization"), h.get("x-api-key")))
        except Unauthenticated as e:
            if req.path.startswith("/v1/"):
                return self._counted(UNAUTHENTICATED, openai_error(401, str(e), None, _CHALLENGE))
            return self._counted(UNAUTHENTICATED, _error(e))
        if seen is not None:
            seen.tenant = tenant.name
        try:
            answer = self._route(req, tenant, seen)
        except GatewayError as e:
            answer = _error(e)
        if isinstance(answer, HttpResponse):
            return self._counted(tenant.name, answer)
        make = answer.make
        return Later(answer.future, lambda f: self._counted(tenant.name, make(f)))

    def _counted(self, tenant: str, resp: HttpResponse | StreamResponse) -> HttpResponse | StreamResponse:
        m = self.driver.metrics
        m.of(m.tenant_requests, tenant, str(resp.status)).inc()
        return resp

    def _route(self, req: HttpRequest, tenant: Tenant | None, seen: Seen | None = None) -> HttpResponse | Later:
        parts = [unquote(p) for p in req.path.strip("/").split("/")]
        if parts[0] == "v1" and self.llm is not None:
            return self._openai(req, parts, self.llm, tenant)
        if len(parts) >= 3 and parts[0] == "v2" and parts[1] == "models" and parts[2] != "stats":
            return self._model_route(req, parts[2], parts[3:], tenant, seen)
        route = _ROUTES.get(tuple(parts))
        if route is None:
            raise _NotFound(f"no route for {req.method} {req.path}")
        method, fn = route
        _allow(req, method)
        if parts == ["metrics"] and tenant is not None and not tenant.metrics and self.serve_metrics:
            raise Forbidden(f"tenant '{tenant.name}' may not read /metrics (it shows every tenant's counts)")
        return fn(self, req)

    def _model_route(self, req: HttpRequest, name: str, rest: list[str],
                     tenant: Tenant | None, seen: Seen | None = None) -> HttpResponse | Later:
        version = ""  # the model's default
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = rest[1], rest[2:]
            if version and not version.isdigit():
                raise InvalidRequest(f"model version {version!r} must be a positive integer")
        action = rest[0] if len(rest) == 1 else "" if not rest else None
        if action in ("generate", "generate_stream"):
            if self.llm is None or name not in self.llm.models:
                try:
                    self.driver.model(name, version)
                except ModelNotFound:
                    return generate.error_response(404, f"Request for unknown model: '{name}' is not found")
                return generate.error_response(400, f"model '{name}' is not generative: it has no generate "
                                               "extension (use /infer)")
            return self._generate(req, name, action == "generate_stream", self.llm, tenant)
        if action == "infer":
            _allow(req, "POST")
            return self._infer(req, name, version, tenant, seen)
        handler = _MODEL_ROUTES.get(action)  # type: ignore[arg-type]
        if handler is None:
            raise _NotFound(f"no route for {req.method} {req.path}")
        _allow(req, "GET")
        return handler(self, name, version)

    def _openai(self, req: HttpRequest, parts: list[str], llm: LlmService,
                tenant: Tenant | None) -> HttpResponse | Later:
        """The OpenAI routes; every error in OpenAI's shape. With an access log or tracing on,
        every completion is seen from arrival to its answer's end (a stream's last event)."""
        checked = self._openai_checked(req, parts, llm, tenant)
        return self._llm_call(req, llm, checked, tenant, parts[-1] == "completions", None)

    def _generate(self, req: HttpRequest, name: str, stream: bool, llm: LlmService,
                  tenant: Tenant | None) -> HttpResponse | Later:
        """Triton's generate extension on a generative model; every error Triton's
        ``{"error": ...}``."""
        try:
            if req.method != "POST":
                raise OpenAiError(405, f"{req.method} is not allowed on {req.path} (use POST)")
            checked = self._llm_checked(req, generate.read_generate(name, decoded_body(req, self.max_body),
                                                                    stream, self.max_depth), llm, tenant)
        except OpenAiError as e:
            checked = e.response()
        except GatewayError as e:
            checked = _llm_refusal(e)
        return self._llm_call(req, llm, checked, tenant, True, lambda r: generate.answer(r, name))

    def _llm_call(self, req: HttpRequest, llm: LlmService,
                  checked: HttpResponse | tuple[LlmCall, LlmAsk], tenant: Tenant | None, observed: bool,
                  shape: Callable[[HttpResponse | StreamResponse], HttpResponse | StreamResponse] | None,
                  ) -> HttpResponse | Later:
        """A checked generative call relayed to its engines (or its refusal), its answer put in
        ``shape`` (None: OpenAI's) and seen by the access log and tracing when ``observed``."""
        seen = None
        if self.observer is not None and observed:
            model = None if isinstance(checked, HttpResponse) else checked[0].model
            seen = self.observer.request("http", model, "", req.headers, req.received)
            seen.tenant = None if tenant is None else tenant.name
        if isinstance(checked, HttpResponse):
            if shape is not None:
                checked = shape(checked)  # type: ignore[assignment]
            if seen is not None:
                seen.http_answered(checked)
            return checked
        call, ask = checked
        arrival = req.received if req.received is not None else self.driver.clock()
        ended = None if seen is None else seen.stream_ended
        task = asyncio.ensure_future(llm.call(call, ask, arrival, ended))
        if seen is None and shape is None:
            return Later(task, asyncio.Future.result)
        if seen is not None:
            task.add_done_callback(lambda f: f.cancelled() and seen.cancelled())

        def made(f: asyncio.Future) -> HttpResponse | StreamResponse:
            resp = f.result()
            if shape is not None:
                resp = shape(resp)
            if seen is not None and isinstance(resp, HttpResponse):
                seen.http_answered(resp)
            return resp

        return Later(task, made)

    def _openai_checked(self, req: HttpRequest, parts: list[str], llm: LlmService,
                        tenant: Tenant | None) -> HttpResponse | tuple[LlmCall, LlmAsk]:
        """The answer now (the model list, or a refusal), or the request checked with what it
        asks of its router (SLOs, band, tenant)."""
        try:
            route = _OPENAI_ROUTES.get(tuple(parts))
            if route is None:
                raise OpenAiError(404, f"no route for {req.method} {req.path}")
            method, kind = route
            if req.method != method:
                raise OpenAiError(405, f"{req.method} is not allowed on {req.path} (use {method})")
            if kind is None:
                return llm.model_list()
            return self._llm_checked(req, read_call(kind, decoded_body(req, self.max_body), self.max_depth),
                                     llm, tenant)
        except OpenAiError as e:
            return e.response()
        except GatewayError as e:
            return _llm_refusal(e)

    def _llm_checked(self, req: HttpRequest, call: LlmCall, llm: LlmService,
                     tenant: Tenant | None) -> tuple[LlmCall, LlmAsk]:
        """``call`` with what it asks of its router (SLOs, band, tenant), its tenant admitted
        (over quota: a :class:`Rejected`)."""
        ask = llm.asks(call, req.headers, *(() if tenant is None else (tenant.name, tenant.priority)))
        if tenant is not None:
            self.tenants.admit(tenant)  # type: ignore[union-attr]  (over quota: 429)
        return call, ask

    # ---- handlers
    def _live(self, req: HttpRequest) -> HttpResponse:
        return _OK

    def _ready(self, req: HttpRequest) -> HttpResponse:
        llm_ready = self.llm is not None and self.llm.ready()
        return HttpResponse(200 if llm_ready or self.driver.ready() else 503)

    def _server_metadata(self, req: HttpRequest) -> HttpResponse:
        return _json(self.info.server_metadata())

    def _all_stats(self, req: HttpRequest) -> HttpResponse:
        return _json(json_format.MessageToDict(self.info.statistics(None), preserving_proto_field_name=True))

    def _repository_index(self, req: HttpRequest) -> HttpResponse:
        decoded_body(req, self.max_body)  # a body, if any, must at least decode
        return _json(self.info.repository_index())

    def _metrics(self, req: HttpRequest) -> HttpResponse:
        if not self.serve_metrics:  # served on the metrics listener instead
            raise _NotFound(f"no route for {req.method} {req.path}")
        return HttpResponse(200, self.driver.render_metrics(), _METRICS_TYPE)

    def _model_metadata(self, name: str, version: str) -> HttpResponse:
        return _json(model_metadata_dict(self.driver.model(name, version), name))

    def _model_ready(self, name: str, version: str) -> HttpResponse:
        self.driver.model(name, version)
        return HttpResponse(200 if self.driver.model_ready(name) else 400)

    def _model_config(self, name: str, version: str) -> HttpResponse:
        return _json(model_config_dict(self.driver.model(name, version), name))

    def _model_stats(self, name: str, version: str) -> HttpResponse:
        self.driver.model(name, version)
        return _json(json_format.MessageToDict(self.info.statistics(name, version), preserving_proto_field_name=True))

    def _infer(self, req: HttpRequest, name: str, version: str, tenant: Tenant | None,
               seen: Seen | None = None) -> HttpResponse | Later:
        driver = self.driver
        model = driver.model(name)  # unknown model or version: 404 before decoding the body
        if version:
            model.check_version(version)
        if tenant is not None:
            self.tenants.admit(tenant)  # type: ignore[union-attr]  (over quota: 429 before decoding)
        client = (req.peer or None) if tenant is None else tenant.name
        info = getattr(model, "info", None)  # None: no replica has told its signature yet
        sig = None if info is None else info.signature
        decoded = self.decoder.http(req.body, req.headers.get(HEADER_LEN), req.headers.get("content-encoding"),
                                    self.max_body, self.max_depth, sig, name, client or "")
        decoded_inp: list[InferInput] = []  # the request, once decoded

        def submit(inp: InferInput) -> asyncio.Future[InferResult]:
            decoded_inp.append(inp)
            if seen is not None:
                seen.parsed(inp, sig is not None and sig.batched)
            return driver.submit(name, inp, req.headers.get(SLO_HEADER), req.received, version=version,
                                 priority=None if tenant is None else tenant.priority,
                                 hints=choice_headers(req.headers), trace=None if seen is None else seen.trace,
                                 client=client)

        # an answer that may carry many JSON values is encoded once it comes (off the loop when it
        # does: gateway.frontdoor.encode) into encoded; any other in answer(), as the result comes
        encoded: list[Encoded] = []
        if isinstance(decoded, InferInput):
            result = submit(decoded)
            if sig is not None and may_be_large(sig, decoded, self.decoder.inline_values):
                result = self._encoded_first(result, decoded, name, version, model, client, encoded)
        else:  # a large body is decoded off the loop (gateway.frontdoor.decode), then submitted
            result = asyncio.ensure_future(_then(decoded, lambda inp: self._answered(
                submit(inp), inp, name, version, model, client, encoded)))

        def answer(f: asyncio.Future[InferResult]) -> HttpResponse:
            e = f.exception()
            if e is None:
                try:
                    return _inferred(name, version, model, decoded_inp[0], f.result(), *encoded)
                except GatewayError as err:  # an output that has no JSON form (BF16): as off the loop
                    return _error(err)
            if isinstance(e, GatewayError):
                return _error(e)
            raise e

        return Later(result, answer)

    def _answered(self, result: asyncio.Future[InferResult], inp: InferInput, name: str, version: str, model: Model,
                  client: str | None, encoded: list[Encoded]) -> asyncio.Future[InferResult]:
        """``result``, or :meth:`_encoded_first` of it when its answer may carry many JSON values
        (by the model's signature as it is now: it may have been told while ``inp`` was decoded)."""
        info = getattr(model, "info", None)  # None: the driver refused it
        if info is None or not may_be_large(info.signature, inp, self.decoder.inline_values):
            return result
        return self._encoded_first(result, inp, name, version, model, client, encoded)

    def _encoded_first(self, result: asyncio.Future[InferResult], inp: InferInput, name: str, version: str,
                       model: Model, client: str | None, encoded: list[Encoded]) -> asyncio.Future[InferResult]:
        """A future of ``result`` done once its answer is encoded into ``encoded`` (by a worker
        when it carries many JSON values)."""
        return encoded_first(result, lambda res: self.decoder.http_answer(
            name, version or model.default_version, inp, res.outputs, res.parameters(), client or ""), encoded)


async def _then(decoding: Awaitable[InferInput], submit: Callable[[InferInput], Awaitable[InferResult]]) -> InferResult:
    return await submit(await decoding)


def _inferred(name: str, version: str, model: Model, inp: InferInput, res: InferResult,
              encoded: Encoded | None = None) -> HttpResponse:
    out, header_len = encoded or encode_http_response(name, version or model.default_version, inp, res.outputs,
                                                      res.parameters())
    if header_len is None:
        return HttpResponse(200, out, _JSON)
    return HttpResponse(200, out, "application/octet-stream", (("Inference-Header-Content-Length",
                                                                  str(header_len)),))


def _llm_refusal(e: GatewayError) -> HttpResponse:
    """A refusal of a generative request in OpenAI's shape."""
    headers: tuple[tuple[str, str], ...] = ()
    if isinstance(e, Rejected):
        headers = (("Retry-After", str(max(1, math.ceil(e.retry_after)))), (REASON_HEADER, e.reason))
    return openai_error(e.http_status, str(e), None, headers)


def _error(e: GatewayError) -> HttpResponse:
    if isinstance(e, Unauthenticated):
        return error_response(401, str(e), _CHALLENGE)
    if isinstance(e, Rejected):  # 429, or 503 when no replica serves the model
        return error_response(e.http_status, str(e), (("Retry-After", str(max(1, math.ceil(e.retry_after)))),
                                                      (REASON_HEADER, e.reason)))
    return error_response(e.http_status, str(e))


class _NotFound(GatewayError):
    http_status = 404


class _MethodNotAllowed(GatewayError):
    http_status = 405


def _allow(req: HttpRequest, method: str) -> None:
    if req.method != method:
        raise _MethodNotAllowed(f"{req.method} is not allowed on {req.path} (use {method})")


_Fn = Callable[[HttpFrontDoor, HttpRequest], HttpResponse]
_ROUTES: dict[tuple[str, ...], tuple[str, _Fn]] = {
    ("v2", "health", "live"): ("GET", HttpFrontDoor._live),
    ("v2", "health", "ready"): ("GET", HttpFrontDoor._ready),
    ("v2",): ("GET", HttpFrontDoor._server_metadata),
    ("v2", "models", "stats"): ("GET", HttpFrontDoor._all_stats),
    ("v2", "repository", "index"): ("POST", HttpFrontDoor._repository_index),
    ("metrics",): ("GET", HttpFrontDoor._metrics),
}
_OPENAI_ROUTES: dict[tuple[str, ...], tuple[str, str | None]] = {
    ("v1", "models"): ("GET", None),
    ("v1", "completions"): ("POST", "completion"),
    ("v1", "chat", "completions"): ("POST", "chat"),
}
_MODEL_ROUTES: dict[str, Callable[[HttpFrontDoor, str, str], HttpResponse]] = {
    "": HttpFrontDoor._model_metadata,
    "ready": HttpFrontDoor._model_ready,
    "config": HttpFrontDoor._model_config,
    "stats": HttpFrontDoor._model_stats,
}


def openai_refusal(path: str, resp: HttpResponse) -> HttpResponse:
    """A refusal the HTTP server made (a limit, malformed HTTP) in OpenAI's error shape when
    its path is an OpenAI route; as it was otherwise."""
    if not path.startswith("/v1/"):
        return resp
    try:
        message = json.loads(resp.body)["error"]
    except (ValueError, KeyError, TypeError):
        return resp
    return openai_error(resp.status, str(message), None, resp.headers)


def metrics_door(driver: Driver, llm: LlmService | None = None) -> Handler:
    """The metrics listener's handler: ``GET /metrics`` and the health probes, no key asked
    (ready while the driver or ``llm``, the generative models, has a replica ready)."""

    def door(req: HttpRequest) -> HttpResponse:
        if req.method != "GET":
            return error_response(405, f"{req.method} is not allowed on {req.path} (use GET)")
        if req.path == "/metrics":
            return HttpResponse(200, driver.render_metrics(), _METRICS_TYPE)
        if req.path == "/v2/health/live":
            return _OK
        if req.path == "/v2/health/ready":
            return HttpResponse(200 if driver.ready() or (llm is not None and llm.ready()) else 503)
        return error_response(404, f"no route for {req.method} {req.path} (this listener serves /metrics)")

    return door
