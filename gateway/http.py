"""KServe v2 / Triton HTTP front door (aiohttp app factory).

Domain errors (:mod:`gateway.errors`) become ``{"error": msg}`` with their status here, at
the handler edge, and only here. Rejections carry ``Retry-After``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from google.protobuf import json_format

from gateway.codec import encode_http_response, parse_http_infer
from gateway.driver import SLO_HEADER, Driver
from gateway.errors import REASON_HEADER, GatewayError, InvalidRequest, Rejected
from gateway.stats import ServerInfo, model_config_dict, model_metadata_dict

DRIVER = web.AppKey("driver", Driver)
INFO = web.AppKey("info", ServerInfo)

HEADER_LEN = "Inference-Header-Content-Length"
_JSON = "application/json"


def _error(status: int, msg: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=json.dumps({"error": msg}).encode(), content_type=_JSON,
                        headers=headers)


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    try:
        return await handler(request)
    except Rejected as e:
        return _error(429, str(e), {"Retry-After": str(max(1, math.ceil(e.retry_after))),
                                    REASON_HEADER: e.reason})
    except GatewayError as e:
        return _error(e.http_status, str(e))
    except web.HTTPRequestEntityTooLarge as e:
        return _error(413, f"request body exceeds {e.max_size} bytes" if hasattr(e, "max_size") else e.text)
    except web.HTTPException as e:
        if e.status >= 400:
            return _error(e.status, e.reason)
        raise


def _version(request: web.Request) -> str:
    v = request.match_info.get("version", "")
    if v and not v.isdigit():
        raise InvalidRequest(f"model version {v!r} must be a positive integer")
    return v


async def live(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def ready(request: web.Request) -> web.Response:
    return web.Response(status=200 if request.app[DRIVER].ready() else 503)


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response(request.app[INFO].server_metadata())


async def model_metadata(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    name = request.match_info["model"]
    _version(request)
    return web.json_response(model_metadata_dict(driver.model(name), name))


async def model_ready(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    name = request.match_info["model"]
    _version(request)
    driver.model(name)
    return web.Response(status=200 if driver.model_ready(name) else 400)


async def model_config(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    name = request.match_info["model"]
    return web.json_response(model_config_dict(driver.model(name), name))


async def model_stats(request: web.Request) -> web.Response:
    name = request.match_info.get("model") or None
    if name is not None:
        request.app[DRIVER].model(name)
    stats = request.app[INFO].statistics(name)
    return web.json_response(json_format.MessageToDict(stats, preserving_proto_field_name=True))


async def repository_index(request: web.Request) -> web.Response:
    return web.json_response(request.app[INFO].repository_index())


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[DRIVER].metrics.render(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def infer(request: web.Request) -> web.Response:
    driver = request.app[DRIVER]
    name = request.match_info["model"]
    version = _version(request)
    driver.model(name)  # unknown model: 404 before reading the body
    try:  # aiohttp undoes gzip/deflate Content-Encoding, within client_max_size
        body = await request.read()
    except RequestPayloadError as e:
        raise InvalidRequest(f"unreadable request body: {e.message if hasattr(e, 'message') else e}") from None
    inp = parse_http_infer(body, request.headers.get(HEADER_LEN))
    info = request.app[INFO]
    start = info.clock()
    try:
        res = await driver.infer(name, inp, request.headers.get(SLO_HEADER))
    except GatewayError:
        info.record(name, start, ok=False)
        raise
    info.record(name, start, ok=True)
    out, header_len = encode_http_response(name, version or "1", inp, res.outputs, res.parameters())
    if header_len is None:
        return web.Response(body=out, content_type=_JSON)
    return web.Response(body=out, content_type="application/octet-stream",
                        headers={HEADER_LEN: str(header_len)})


def create_app(driver: Driver, info: ServerInfo, max_body_bytes: int = 64 << 20) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_errors])
    app[DRIVER] = driver
    app[INFO] = info
    m = "/v2/models/{model}"
    v = "/v2/models/{model}/versions/{version}"
    # the hot route first: aiohttp matches resources in order
    app.router.add_post(m + "/infer", infer)
    app.router.add_post(v + "/infer", infer)
    app.router.add_get("/v2/health/live", live)
    app.router.add_get("/v2/health/ready", ready)
    app.router.add_get("/v2", server_metadata)
    app.router.add_get("/v2/models/stats", model_stats)
    for base in (m, v):
        app.router.add_get(base, model_metadata)
        app.router.add_get(base + "/ready", model_ready)
        app.router.add_get(base + "/config", model_config)
        app.router.add_get(base + "/stats", model_stats)
    app.router.add_post("/v2/repository/index", repository_index)
    app.router.add_get("/metrics", metrics)
    return app
