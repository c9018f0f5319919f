"""Generative requests to their engines and their answers back, as they come: OpenAI-compatible
engines, and Triton decoupled models read as one (:mod:`gateway.llm.triton`).

:class:`LlmService` holds the generative models of a gateway's config and their engine
replicas, and one router per model (``llm_routing:``; :mod:`gateway.llm.routing`, driven by
:mod:`gateway.llm.dispatch`). A request goes, as a :class:`~gateway.policy.llm.types.TokenRequest`,
to its model's router, which routes it to a replica, holds it (it waits here for the router's
decision) or refuses it (429 with the router's reason and ``Retry-After``); the router hears of
its first token (a whole answer: only of its end) and its end, of the engines' loads read from
their ``/metrics``, and of an emulated engine's KV cache events (:mod:`gateway.llm.kvevents`).
A replica whose metrics stop answering is out of routing while another answers. The request goes over a
kept-alive connection of that engine's pool (:mod:`gateway.llm.upstream`); a whole answer is
relayed as the engine gave it, a streamed one event by event as each arrives (nothing is held
back to coalesce). Closing the engine's stream
aborts the request there (vLLM and ``headrace engine`` abort a request whose connection
closes), which is what happens when the client goes away, stops reading, or the replica is
removed before its streams end.

Each request is measured as its client sees it (:mod:`gateway.llm.measure`): TTFT and TPOT,
its tokens from the engine's ``usage`` (the engine is always asked for it; a client that did not
ask does not get that chunk), and its meeting of its SLOs.

An engine serving the model under another name (``model:`` of its replica) is sent that name,
and its answers' ``"model":"<its name>"`` read back as the name the client asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway.errors import REASON_HEADER, transport_text
from gateway.frontdoor.httpserver import HttpResponse
from gateway.frontdoor.stream import StreamResponse
from gateway.llm import kvevents, measure, triton
from gateway.llm.api import LlmCall, OpenAiError, error_response, unknown_model
from gateway.llm.dispatch import ModelRouter
from gateway.llm.picker import LlmReplica, available, parse_load, saturated
from gateway.llm.routing import (
    VOCAB,
    EngineModel,
    LlmAsk,
    engine_model,
    make_router,
    read_ask,
    token_request,
)
from gateway.llm.upstream import EngineConnection, Upstream
from gateway.observe.metrics import GatewayMetrics
from gateway.policy.llm.types import METRICS_INTERVAL_S, Band, Refuse
from gateway.policy.types import Priority
from profiles.gateway_config import LlmModelConfig, LlmReplicaConfig, LlmRoutingConfig
from profiles.llm.kv import BLOCK_SIZE
from profiles.schema import FlowControlSpec

log = logging.getLogger("headrace.gateway")
_PATHS = {"completion": b"/v1/completions", "chat": b"/v1/chat/completions"}
_DONE = b"data: [DONE]"
_USAGE = b'"usage":{'
_NO_CHOICES = b'"choices":[]'


@dataclass(frozen=True, slots=True)
class LlmModel:
    """A generative model clients address, with its default token SLOs (seconds)."""

    name: str
    ttft_slo: float
    tpot_slo: float
    priority: str

    @classmethod
    def of(cls, m: LlmModelConfig) -> LlmModel:
        return cls(m.name, m.slo_ttft_ms / 1e3, m.slo_tpot_ms / 1e3, m.priority)


class _Open:
    """One request open at an engine: its response, why it was cut short (if it was), and the
    router that routed it, told of its first token and its end."""

    __slots__ = ("conn", "reason", "settled", "ended", "router", "id", "first")

    def __init__(self, router: ModelRouter, request_id: str) -> None:
        self.router, self.id = router, request_id
        self.first = False  # its router was told of its first token
        self.conn: EngineConnection | None = None
        self.reason: str | None = None
        self.settled = False
        self.ended: Callable[[str | None], None] | None = None  # told how a stream ended

    def abort(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        if self.conn is not None:
            self.conn.close()  # the engine sees its connection close and aborts the request


class _Relayed:
    """A relayed stream: its events, and its request settled once it is closed, whether it was
    read to its end, cut short, or never begun (an async generator never begun runs no
    ``finally``)."""

    __slots__ = ("events", "settle")

    def __init__(self, events: AsyncIterator[bytes], settle: Callable[[], None]) -> None:
        self.events, self.settle = events, settle

    def __aiter__(self) -> _Relayed:
        return self

    def __anext__(self):  # noqa: ANN204  (the events' own awaitable)
        return self.events.__anext__()

    async def aclose(self) -> None:
        try:
            await self.events.aclose()  # type: ignore[attr-defined]
        finally:
            self.settle()


class LlmService:
    """The generative models of one gateway, their engines and their routers. ``await
    start()`` (the metrics reads and KV event streams), ``await stop()``. ``scrape_interval``:
    how often each engine's ``/metrics`` is read for its load. ``routing``: which router each
    model gets (default: headrace's); ``flow``: the gateway's flow control, by which headrace's
    router holds requests; ``base_dir``: where relative profile paths lie. A replica
    whose profile cannot be found is a :class:`~profiles.profile.ProfileError`."""

    def __init__(self, models: list[LlmModelConfig], metrics: GatewayMetrics,
                 clock: Callable[[], float] = time.monotonic, scrape_interval: float = METRICS_INTERVAL_S,
                 connect_timeout: float = 5.0, routing: LlmRoutingConfig | None = None,
                 base_dir: Path | None = None, kv_retry_s: float = 1.0, flow: FlowControlSpec | None = None) -> None:
        self.metrics = metrics
        self.clock = clock
        self.scrape_interval = scrape_interval
        self.connect_timeout = connect_timeout
        self.routing = routing or LlmRoutingConfig()
        self.flow = flow
        self.base_dir = base_dir
        self.kv_retry_s = kv_retry_s
        self.models: dict[str, LlmModel] = {}
        self.replicas: dict[str, list[LlmReplica]] = {}  # by model
        self.routers: dict[str, ModelRouter] = {}  # by model
        self._engines: dict[str, EngineModel] = {}  # by replica id
        self._open: dict[str, set[_Open]] = {}  # by replica id
        self._upstreams: dict[str, Upstream] = {}  # by replica id
        self._meters: dict[str, tuple[Upstream, bytes]] = {}  # by replica id, where its load is read elsewhere
        self._kv: dict[str, asyncio.Task] = {}  # by replica id: its engine's KV events followed
        self._drained: dict[str, asyncio.Event] = {}  # by replica id, while it drains
        self._scraper: asyncio.Task | None = None
        self._started = False
        # NOTE: a router with flow control of its own sheds; the baselines get the gateway's shedding
        self._sheds = self.routing.router != "headrace"
        for m in models:
            self.set_model(m)
            for r in m.replicas:
                self.add_replica(m, r)

    # ---- the fleet
    def add_replica(self, model: LlmModelConfig, r: LlmReplicaConfig) -> LlmReplica:
        """Serve ``model`` on engine ``r`` from now on (a new model is addressable at once)."""
        if model.name not in self.models:
            self.set_model(model)
        rid = model.replica_id(r, self._engines)
        engine = engine_model(rid, r, self.base_dir)  # a bad profile fails here, before anything changes
        rep = LlmReplica(rid, model.name, r.url, r.engine, r.model or model.name, r.max_inflight)
        self.replicas[model.name].append(rep)
        self._engines[rep.id] = engine
        self._open[rep.id] = set()
        self._upstreams[rep.id] = Upstream(rep.url)
        if r.metrics_url is not None:
            self._meters[rep.id] = (Upstream(r.metrics_url), b"/metrics")
        elif r.engine == "triton":  # Triton's HTTP port has no /metrics: its readiness only
            self._meters[rep.id] = (self._upstreams[rep.id], b"/v2/health/ready")
        self.routers[model.name].add_replica(engine.spec)
        if self._started:
            self._read_loads()
            self._follow_kv(rep)
        return rep

    def set_model(self, model: LlmModelConfig) -> None:
        """``model``'s default SLOs and priority from now on (a new model is addressable at
        once, answered 503 until it has an engine); its replicas are left as they are."""
        self.models[model.name] = LlmModel.of(model)
        self.replicas.setdefault(model.name, [])
        if model.name not in self.routers:
            self.routers[model.name] = ModelRouter(model.name, make_router(self.routing, self.flow), self.clock,
                                                   self.metrics)

    def drop_model(self, name: str) -> None:
        """Stop serving a model whose engines are all removed: clients get 404 for it."""
        if self.replicas.get(name):
            raise ValueError(f"model {name!r} still has engines: {[r.id for r in self.replicas[name]]}")
        self.models.pop(name, None)
        self.replicas.pop(name, None)
        router = self.routers.pop(name, None)
        if router is not None:
            router.close()

    def replica_ids(self) -> dict[str, list[str]]:
        return {name: [r.id for r in reps] for name, reps in self.replicas.items()}

    def find(self, replica_id: str) -> LlmReplica | None:
        return next((r for reps in self.replicas.values() for r in reps if r.id == replica_id), None)

    async def remove_replica(self, replica_id: str, timeout: float) -> bool:
        """Take no new request to the replica, let its open ones finish (up to ``timeout``
        seconds; those still open then are aborted at the engine), then forget it. True when
        they finished in time."""
        rep = self.find(replica_id)
        if rep is None:
            raise KeyError(replica_id)
        rep.draining = True
        router = self.routers[rep.model]
        router.drain_replica(rep.id)
        drained = True
        if self._open[rep.id]:
            event = self._drained[rep.id] = asyncio.Event()
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except TimeoutError:
                drained = False
                for o in list(self._open[rep.id]):
                    o.abort("removed")
            finally:
                self._drained.pop(rep.id, None)
        self.replicas[rep.model].remove(rep)
        router.remove_replica(rep.id)
        self._engines.pop(rep.id, None)
        follower = self._kv.pop(rep.id, None)
        if follower is not None:
            follower.cancel()
        self._upstreams.pop(rep.id).close()
        meter = self._meters.pop(rep.id, None)
        if meter is not None:
            meter[0].close()
        self._open.pop(rep.id, None)  # streams cut short settle without it
        return drained

    def ready(self) -> bool:
        """Some replica takes requests: not draining, and its metrics answered lately."""
        return any(not r.draining and r.reachable for reps in self.replicas.values() for r in reps)

    async def drain(self, timeout: float) -> bool:
        """Take no new request; wait up to ``timeout`` seconds for the open ones to end. True
        when they did."""
        reps = [r for reps in self.replicas.values() for r in reps]
        for r in reps:
            r.draining = True
            self.routers[r.model].drain_replica(r.id)
        waits = []
        for r in reps:
            if self._open[r.id]:
                event = self._drained[r.id] = asyncio.Event()
                waits.append(event.wait())
        if not waits:
            return True
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout)
        except TimeoutError:
            return False
        return True

    # ---- lifecycle
    async def start(self) -> None:
        """Read the engines' loads, and the emulated engines' KV events, from now on (nothing
        runs while no engine is served)."""
        self._started = True
        if any(self.replicas.values()):
            self._read_loads()
        for reps in self.replicas.values():
            for rep in reps:
                self._follow_kv(rep)

    def _read_loads(self) -> None:
        if self._scraper is None:
            self._scraper = asyncio.get_running_loop().create_task(self._scrape_loop())

    def _follow_kv(self, rep: LlmReplica) -> None:
        if rep.engine != "emulated" or rep.id in self._kv:
            return
        router = self.routers[rep.model]
        self._kv[rep.id] = asyncio.get_running_loop().create_task(
            kvevents.follow(rep.url, lambda events: router.kv_events(rep.id, events), self.kv_retry_s,
                            self.connect_timeout))

    async def stop(self) -> None:
        tasks = [t for t in (self._scraper, *self._kv.values()) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._kv.clear()
        for router in self.routers.values():
            router.close()
        for opens in self._open.values():
            for o in list(opens):
                o.abort("shutdown")
        for up in self._upstreams.values():
            up.close()
        for up, _ in self._meters.values():
            up.close()

    async def _scrape_loop(self) -> None:
        while True:
            reps = [r for reps in self.replicas.values() for r in reps]
            await asyncio.gather(*(self._scrape(r) for r in reps))
            for name in {r.model for r in reps}:
                self._availability(name)
            wanted = [m.router.metrics_interval_s for m in self.routers.values() if m.router.metrics_interval_s]
            await asyncio.sleep(min([self.scrape_interval, *wanted]))

    async def _scrape(self, rep: LlmReplica) -> None:
        up = self._upstreams.get(rep.id)
        if up is None:
            return
        up, path = self._meters.get(rep.id, (up, b"/metrics"))
        conn = None
        try:
            async with asyncio.timeout(max(1.0, self.scrape_interval)):
                conn, _ = await up.connect()
                status = await conn.start(path, None)
                text = (await conn.whole()).decode("utf-8", "replace")
        except (OSError, ValueError):
            rep.reachable = False
            if conn is not None:
                conn.close()
            return
        conn.release()
        rep.reachable = status == 200
        if rep.reachable and path == b"/metrics":
            rep.load = parse_load(text)
            router = self.routers.get(rep.model)
            if router is not None:
                router.load(rep.id, rep.load)

    def _availability(self, model: str) -> None:
        """Unreachable replicas out of the model's routing while another answers."""
        router = self.routers.get(model)
        if router is not None:
            for rid, ok in available(self.replicas.get(model, ())).items():
                router.set_available(rid, ok)

    # ---- requests
    def model_list(self) -> HttpResponse:
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "headrace"} for name in self.models]
        return HttpResponse(200, json.dumps({"object": "list", "data": data}).encode(), "application/json")

    def check_model(self, call: LlmCall) -> LlmModel:
        model = self.models.get(call.model)
        if model is None:
            raise unknown_model(call.model)
        return model

    def asks(self, call: LlmCall, headers: Mapping[str, str], tenant: str | None = None,
             priority: Priority | None = None) -> LlmAsk:
        """What ``call`` to a served model asks beside its prompt: its TTFT and TPOT SLOs
        (seconds; its headers', else its model's), band and tenant (:func:`~gateway.llm.routing.read_ask`;
        ``tenant`` / ``priority``: its API key's tenant and class). An unknown model or a bad
        header is an :class:`OpenAiError`."""
        model = self.check_model(call)
        key_priority = None if priority is None else "best-effort" if priority == Priority.BEST_EFFORT else "guaranteed"
        return read_ask(call, headers, model.ttft_slo, model.tpot_slo, model.priority, tenant, key_priority)

    def _counting(self, model: str) -> tuple[int, int, int | None]:
        """How the model's prompts are counted: block size, vocabulary, context (its first
        profiled engine's; unprofiled: the emulated engines' defaults)."""
        for rep in self.replicas.get(model, ()):
            e = self._engines.get(rep.id)
            if e is not None and e.max_model_len is not None:
                return e.spec.block_size, e.vocab_size, e.max_model_len
        return BLOCK_SIZE, VOCAB, None

    async def call(self, call: LlmCall, ask: LlmAsk, arrival: float,
                   ended: Callable[[str | None], None] | None = None) -> HttpResponse | StreamResponse:
        """The engine's answer to ``call``: whole, or a stream relayed as it comes, once its
        model's router routes it (a request the router holds waits here; one it refuses is
        answered 429 with the reason and ``Retry-After``). ``ended``: told, when a streamed
        answer ends, why it was cut short (None: it was not)."""
        reps = self.replicas.get(call.model, [])
        router = self.routers.get(call.model)
        if router is None or not any(not r.draining for r in reps):
            return error_response(503, f"no replica serves model {call.model!r}", None, (("Retry-After", "1"),))
        if ask.band is Band.SHEDDABLE and self._sheds and saturated(reps):
            self.metrics.of(self.metrics.llm_refused, call.model, "shed").inc()
            return error_response(429, f"sheddable request to model {call.model!r} shed: every engine has "
                                  "requests waiting", None, (("Retry-After", "1"), (REASON_HEADER, "shed")))
        block, vocab, context = self._counting(call.model)
        request = token_request(router.next_id(), call, ask, block, vocab, context)
        decision = await router.decide(request)  # cancelled: withdrawn
        if isinstance(decision, Refuse):
            retry = str(max(1, math.ceil(decision.retry_after)))
            return error_response(429, f"request to model {call.model!r} refused: {decision.reason}", None,
                                  (("Retry-After", retry), (REASON_HEADER, decision.reason)))
        rep = next((r for r in reps if r.id == decision.replica), None)
        if rep is None:  # removed since the router chose it
            router.finish(request.id)
            return error_response(503, f"replica {decision.replica} of model {call.model!r} was removed", None,
                                  (("Retry-After", "1"),))
        return await self._relay_call(call, ask, arrival, ended, rep, router, request.id)

    async def _relay_call(self, call: LlmCall, ask: LlmAsk, arrival: float,
                          ended: Callable[[str | None], None] | None, rep: LlmReplica, router: ModelRouter,
                          rid: str) -> HttpResponse | StreamResponse:
        ttft_slo, tpot_slo = ask.ttft_slo, ask.tpot_slo
        if rep.engine == "triton":
            try:
                path, body, prompt = triton.request(call, rep.served)
            except OpenAiError as e:
                router.finish(rid)
                return e.response()
        else:
            path, body, prompt = _PATHS[call.kind], _outgoing(call, rep.served), ""
        opened = _Open(router, rid)
        self._open[rep.id].add(opened)
        streaming = False
        try:
            try:
                conn, status = await self._send(self._upstreams[rep.id], path, body, opened)
            except (OSError, ValueError) as e:
                if opened.reason is not None:  # removed while connecting
                    return _cut_short(call.model, opened.reason)
                rep.reachable = False
                self._availability(rep.model)
                log.warning("engine %s at %s is unreachable: %s: %s", rep.id, rep.url, type(e).__name__, e)
                return error_response(503, f"engine of model {call.model!r} is unreachable ({rep.id}): "
                                      f"{transport_text(e)}", None, (("Retry-After", "1"),))
            answer: EngineConnection | triton.TritonAnswer = conn
            if rep.engine == "triton":
                answer = triton.TritonAnswer(conn, call, rep.served, status, prompt)
            if status != 200 or not call.stream:
                try:
                    raw = await answer.whole()
                except (OSError, ValueError) as e:
                    return _cut_short(call.model, opened.reason or transport_text(e))
                kind = answer.headers.get(b"content-type", b"application/json").decode("latin-1")
                if isinstance(answer, triton.TritonAnswer):
                    status = answer.status  # an error event is its status
                if status != 200:
                    return _relayed_error(status, raw, kind, rep)
                raw = measure.whole(self.metrics, rep, raw, self.clock() - arrival, ttft_slo)
                return HttpResponse(200, raw, kind)
            streaming = True
            opened.ended = ended
            events = self._relay(rep, answer, opened, call.include_usage, arrival, ttft_slo, tpot_slo)
            return StreamResponse(200, _Relayed(events, lambda: self._settle(rep, opened)), aborted=opened.abort)
        except asyncio.CancelledError:  # the client went away before its answer
            opened.abort("disconnect")
            raise
        finally:
            if not streaming:  # a stream settles when its relay ends
                self._settle(rep, opened)

    async def _send(self, up: Upstream, path: bytes, body: bytes, opened: _Open) -> tuple[EngineConnection, int]:
        """The request sent on a kept-alive connection, and its answer's status. A reused
        connection the engine closed meanwhile is retried once on a new one; a new one not
        made within ``connect_timeout`` is a :class:`TimeoutError`."""
        conn, reused = up.reuse(), True
        if conn is None:
            async with asyncio.timeout(self.connect_timeout):
                conn, reused = await up.connect(fresh=True)
        while True:
            opened.conn = conn
            if opened.reason is not None:
                conn.close()
                raise ConnectionError(opened.reason)
            try:
                return conn, await conn.start(path, body)
            except ConnectionError:
                if not reused or opened.reason is not None:
                    raise
                async with asyncio.timeout(self.connect_timeout):
                    conn, reused = await up.connect(fresh=True)

    def _settle(self, rep: LlmReplica, opened: _Open) -> None:
        if opened.settled:
            return
        opened.settled = True
        if opened.conn is not None:
            opened.conn.close() if opened.reason is not None else opened.conn.release()
        if opened.reason is not None and opened.reason != "shutdown":
            self.metrics.of(self.metrics.llm_aborted, rep.model, opened.reason).inc()
        opened.router.finish(opened.id)
        if opened.ended is not None:
            opened.ended(opened.reason)
        opens = self._open.get(rep.id)
        if opens is not None:
            opens.discard(opened)
            if not opens and rep.id in self._drained:
                self._drained[rep.id].set()

    async def _relay(self, rep: LlmReplica, conn: EngineConnection | triton.TritonAnswer, opened: _Open, include_usage: bool,
                     arrival: float, ttft_slo: float, tpot_slo: float) -> AsyncIterator[bytes]:
        """The engine's events, each read relayed at once; the usage chunk kept back unless the
        client asked for it."""
        clock = self.clock
        renaming = _renaming(rep.served, rep.model) if rep.served != rep.model else None
        first = last = 0.0
        events = 0  # content events after the first token
        usage: dict | None = None
        done = False
        rest = b""
        try:
            while (data := await conn.read()) is not None:
                now = clock()
                buf = rest + data if rest else data
                cut = buf.rfind(b"\n\n") + 2
                if cut < 2:
                    cut = buf.rfind(b"\r\n\r\n") + 4  # events may end in CRLF CRLF too
                    if cut < 4:
                        rest = buf
                        continue
                rest = buf[cut:]
                whole = buf[:cut]
                out = whole
                for ev in (whole if b"\r" not in whole else whole.replace(b"\r\n", b"\n")).split(b"\n\n")[:-1]:
                    ev = ev.strip()
                    if not ev.startswith(b"data:"):
                        continue
                    if ev == _DONE:
                        done = True
                    elif _USAGE in ev and _NO_CHOICES in ev:
                        with contextlib.suppress(ValueError, KeyError, TypeError):
                            usage = json.loads(ev[5:])["usage"]
                        if not include_usage:
                            out = out.replace(ev + b"\n\n", b"")
                    elif first:
                        last = now
                        events += 1
                    elif _has_token(ev):
                        first = last = now
                        if not opened.first:
                            opened.first = True
                            opened.router.first_token(opened.id)
                if out:
                    yield out if renaming is None else out.replace(*renaming)
            if rest.strip():
                yield rest
        except (OSError, ValueError) as e:  # the engine broke off (or the replica was removed)
            if opened.reason is None:
                opened.reason = "engine"
                log.warning("engine stream of %s broke off: %s: %s", rep.id, type(e).__name__, e)
            err = {"error": {"message": f"the engine's stream broke off ({opened.reason or type(e).__name__})",
                             "type": "ServiceUnavailableError", "param": None, "code": 503}}
            yield b"data: " + json.dumps(err).encode() + b"\n\n"
        finally:
            if not done and opened.reason is None:
                opened.reason = "disconnect"
            if done:
                measure.stream(self.metrics, rep, arrival, first, last, events, usage, ttft_slo, tpot_slo)

def _outgoing(call: LlmCall, served: str) -> bytes:
    """The body for the engine: the engine's model name, and a stream always asks for usage."""
    rename = served != call.model
    ask_usage = call.stream and not call.include_usage
    if not rename and not ask_usage:
        return call.raw
    if not rename and "stream_options" not in call.body:  # one field put first: no key repeated
        start = call.raw.index(b"{") + 1
        return b'{"stream_options":{"include_usage":true},' + call.raw[start:]
    body = dict(call.body, model=served)
    if ask_usage:
        body["stream_options"] = {**(call.body.get("stream_options") or {}), "include_usage": True}
    return json.dumps(body).encode()


def _renaming(served: str, model: str) -> tuple[bytes, bytes]:
    return b'"model":' + json.dumps(served).encode(), b'"model":' + json.dumps(model).encode()


def _has_token(ev: bytes) -> bool:
    """Whether a chunk carries generated text (a chat's first chunk carries only the role)."""
    try:
        choices = json.loads(ev[5:]).get("choices") or ()
    except (ValueError, AttributeError):
        return False
    for c in choices:
        if not isinstance(c, dict):
            continue
        delta = c.get("delta")
        if c.get("text") or (isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls"))):
            return True
    return False


def _relayed_error(status: int, raw: bytes, kind: str, rep: LlmReplica) -> HttpResponse:
    """The engine's own answer when it is a 4xx; a 5xx is a 502 naming it (a gateway never
    answers 500 for an engine)."""
    if status < 500:
        return HttpResponse(status, raw, kind)
    return error_response(502, f"engine {rep.id} answered {status}: {raw[:500].decode('utf-8', 'replace')}")


def _cut_short(model: str, why: str) -> HttpResponse:
    return error_response(503, f"the request to model {model!r} was cut short: {why}", None, (("Retry-After", "1"),))

