"""The operator's admin API (aiohttp), beside the gateway on the controller's event loop.

Every call but ``GET /healthz`` needs ``Authorization: Bearer <token>``; without it, or with a
wrong one, the answer is 401 and nothing changes. The token is compared in constant time and
never logged. With ``spec.admin.tls`` it is served over HTTPS (the token is still asked for). Errors are ``{"error": "..."}``: 400 for invalid documents, 422 for a demand the
pool cannot place, 409 for a change that would drop a model's capacity (``allow_disruption=1``
accepts it), 503 when an apply fails (it is rolled back; status says where and why).

- ``GET /v1/status``: :func:`deploy.operator.status.status`
- ``GET /v1/documents``: the applied documents (YAML)
- ``POST /v1/apply[?dry_run=1][&allow_disruption=1][&wait=0]``: body is a YAML stream of documents;
  ``wait=0`` answers once the rollout has begun
- ``POST /v1/rollback[?to=N][&dry_run=1][&allow_disruption=1]``: restore generation N (default:
  the previous one)
- ``POST /v1/down``: stop everything; the controller process exits
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl

from aiohttp import web

from deploy.operator.controller import ApplyError, Controller, Disruption
from placement.plan import PlanError
from placement.solve.solver import SolverError
from profiles.profile import ProfileError
from profiles.schema import SpecError

log = logging.getLogger("headrace.operator")
CONTROLLER = web.AppKey("controller", Controller)
TOKEN = web.AppKey("token", str)
MAX_BODY = 16 << 20


@web.middleware
async def _auth(request: web.Request, handler):  # noqa: ANN001, ANN202
    if request.path == "/healthz":
        return await handler(request)
    got = request.headers.get("Authorization", "")
    want = f"Bearer {request.app[TOKEN]}"
    if not hmac.compare_digest(got.encode(), want.encode()):
        return web.json_response({"error": "missing or wrong admin token (Authorization: Bearer ...)"},
                                 status=401, headers={"WWW-Authenticate": "Bearer"})
    return await handler(request)


def _error(status: int, msg: str) -> web.Response:
    return web.json_response({"error": msg}, status=status)


async def _guard(coro):  # noqa: ANN001, ANN202
    try:
        return web.json_response(await coro)
    except (SpecError, ProfileError) as e:
        return _error(400, str(e))
    except (SolverError, PlanError) as e:
        return _error(422, f"cannot place the demand: {e}")
    except Disruption as e:
        return _error(409, str(e))
    except ApplyError as e:
        return _error(503, str(e))


async def _status(request: web.Request) -> web.Response:
    ctl = request.app[CONTROLLER]
    try:
        await ctl.look()
    except Exception as e:  # noqa: BLE001  (status then shows the gateway as last read)
        log.warning("gateway not read for status: %s", e)
    return web.json_response(ctl.status())


async def _documents(request: web.Request) -> web.Response:
    return web.Response(text=request.app[CONTROLLER].documents_yaml(), content_type="application/yaml")


def _flag(request: web.Request, name: str, default: bool = False) -> bool:
    v = request.query.get(name)
    return default if v is None else v in ("1", "true", "yes")


async def _apply(request: web.Request) -> web.Response:
    try:
        text = await request.text()
    except UnicodeDecodeError:
        return _error(400, "the body must be UTF-8 YAML")
    return await _guard(request.app[CONTROLLER].apply(
        text, dry_run=_flag(request, "dry_run"), allow_disruption=_flag(request, "allow_disruption"),
        wait=_flag(request, "wait", True)))


async def _rollback(request: web.Request) -> web.Response:
    to = request.query.get("to")
    if to is not None and not to.isdigit():
        return _error(400, f"to: a generation number, got {to!r}")
    return await _guard(request.app[CONTROLLER].rollback(
        int(to) if to is not None else None, dry_run=_flag(request, "dry_run"),
        allow_disruption=_flag(request, "allow_disruption")))


async def _down(request: web.Request) -> web.Response:
    c = request.app[CONTROLLER]
    asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(c.down()))
    return web.json_response({"stopping": True})


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def make_app(controller: Controller, token: str) -> web.Application:
    app = web.Application(middlewares=[_auth], client_max_size=MAX_BODY)
    app[CONTROLLER] = controller
    app[TOKEN] = token
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/v1/status", _status)
    app.router.add_get("/v1/documents", _documents)
    app.router.add_post("/v1/apply", _apply)
    app.router.add_post("/v1/rollback", _rollback)
    app.router.add_post("/v1/down", _down)
    return app


async def serve_admin(controller: Controller, token: str, host: str, port: int,
                      ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, str]:
    """Start the admin API (over HTTPS with ``ssl_context``); returns the runner (``await
    runner.cleanup()``) and its URL."""
    runner = web.AppRunner(make_app(controller, token), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  (port 0: the one chosen)
    return runner, f"{'https' if ssl_context else 'http'}://{host}:{bound}"
