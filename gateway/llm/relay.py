"""Generative requests to their engines and their answers back, as they come: OpenAI-compatible
engines, and Triton decoupled models read as one (:mod:`gateway.llm.triton`).

:class:`LlmService` holds the generative models of a gateway's config and their engine
replicas. A request goes to the replica :func:`~gateway.llm.picker.pick` chooses, over a
kept-alive connection of that engine's pool (:mod:`gateway.llm.upstream`); a whole answer is
relayed as the engine gave it, a streamed one event by event as each arrives (nothing is held
back to coalesce). Closing the engine's stream
aborts the request there (vLLM and ``headrace engine`` abort a request whose connection
closes), which is what happens when the client goes away, stops reading, or the replica is
removed before its streams end.

Measured here, as the client sees it: TTFT from the request's arrival to its first content
token written, TPOT = (last token - first token) / (output tokens - 1), the tokens from the
engine's ``usage`` (the engine is always asked for it; a client that did not ask does not get
that chunk), and each request's meeting of its TTFT SLO, TPOT SLO and both.

An engine serving the model under another name (``model:`` of its replica) is sent that name,
and its answers' ``"model":"<its name>"`` read back as the name the client asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from gateway.errors import REASON_HEADER
from gateway.frontdoor.httpserver import HttpResponse
from gateway.frontdoor.stream import StreamResponse
from gateway.llm import triton
from gateway.llm.api import (
    TPOT_HEADER,
    TTFT_HEADER,
    LlmCall,
    OpenAiError,
    error_response,
    slo_ms,
    unknown_model,
)
from gateway.llm.picker import LlmReplica, parse_load, pick
from gateway.llm.upstream import EngineConnection, Upstream
from gateway.observe.metrics import GatewayMetrics
from gateway.policy.types import Priority
from profiles.gateway_config import LlmModelConfig, LlmReplicaConfig

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
    """One request open at an engine: its response, and why it was cut short (if it was)."""

    __slots__ = ("conn", "reason", "settled", "ended")

    def __init__(self) -> None:
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
    """The generative models of one gateway and their engines. ``await start()`` (the HTTP
    session and the metrics reads), ``await stop()``. ``scrape_interval``: how often each
    engine's ``/metrics`` is read for its load."""

    def __init__(self, models: list[LlmModelConfig], metrics: GatewayMetrics,
                 clock: Callable[[], float] = time.monotonic, scrape_interval: float = 0.5,
                 connect_timeout: float = 5.0) -> None:
        self.metrics = metrics
        self.clock = clock
        self.scrape_interval = scrape_interval
        self.connect_timeout = connect_timeout
        self.models: dict[str, LlmModel] = {}
        self.replicas: dict[str, list[LlmReplica]] = {}  # by model
        self._open: dict[str, set[_Open]] = {}  # by replica id
        self._upstreams: dict[str, Upstream] = {}  # by replica id
        self._meters: dict[str, tuple[Upstream, bytes]] = {}  # by replica id, where its load is read elsewhere
        self._drained: dict[str, asyncio.Event] = {}  # by replica id, while it drains
        self._scraper: asyncio.Task | None = None
        self._started = False
        for m in models:
            self.models[m.name] = LlmModel.of(m)
            self.replicas[m.name] = []
            for r in m.replicas:
                self.add_replica(m, r)

    # ---- the fleet
    def add_replica(self, model: LlmModelConfig, r: LlmReplicaConfig) -> LlmReplica:
        """Serve ``model`` on engine ``r`` from now on (a new model is addressable at once)."""
        if model.name not in self.models:
            self.models[model.name] = LlmModel.of(model)
            self.replicas[model.name] = []
        rep = LlmReplica(model.replica_id(r), model.name, r.url, r.engine, r.model or model.name, r.max_inflight)
        self.replicas[model.name].append(rep)
        self._open[rep.id] = set()
        self._upstreams[rep.id] = Upstream(rep.url)
        if r.metrics_url is not None:
            self._meters[rep.id] = (Upstream(r.metrics_url), b"/metrics")
        elif r.engine == "triton":  # Triton's HTTP port has no /metrics: its readiness only
            self._meters[rep.id] = (self._upstreams[rep.id], b"/v2/health/ready")
        if self._started:
            self._read_loads()
        return rep

    def set_model(self, model: LlmModelConfig) -> None:
        """``model``'s default SLOs and priority from now on (a new model is addressable at
        once, answered 503 until it has an engine); its replicas are left as they are."""
        self.models[model.name] = LlmModel.of(model)
        self.replicas.setdefault(model.name, [])

    def drop_model(self, name: str) -> None:
        """Stop serving a model whose engines are all removed: clients get 404 for it."""
        if self.replicas.get(name):
            raise ValueError(f"model {name!r} still has engines: {[r.id for r in self.replicas[name]]}")
        self.models.pop(name, None)
        self.replicas.pop(name, None)

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
        """Read the engines' loads from now on (nothing runs while no engine is served)."""
        self._started = True
        if any(self.replicas.values()):
            self._read_loads()

    def _read_loads(self) -> None:
        if self._scraper is None:
            self._scraper = asyncio.get_running_loop().create_task(self._scrape_loop())

    async def stop(self) -> None:
        if self._scraper is not None:
            self._scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scraper
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
            await asyncio.sleep(self.scrape_interval)

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

    # ---- requests
    def model_list(self) -> HttpResponse:
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "headrace"} for name in self.models]
        return HttpResponse(200, json.dumps({"object": "list", "data": data}).encode(), "application/json")

    def check_model(self, call: LlmCall) -> LlmModel:
        model = self.models.get(call.model)
        if model is None:
            raise unknown_model(call.model)
        return model

    def slos(self, call: LlmCall, headers: Mapping[str, str]) -> tuple[float, float]:
        """The TTFT and TPOT SLOs (seconds) of ``call`` to a served model: its headers', else its
        model's; an unknown model or a bad header is an :class:`OpenAiError`."""
        model = self.check_model(call)
        return (slo_ms(headers, TTFT_HEADER, model.ttft_slo * 1e3), slo_ms(headers, TPOT_HEADER, model.tpot_slo * 1e3))

    async def call(self, call: LlmCall, ttft_slo: float, tpot_slo: float, arrival: float,
                   priority: Priority | None = None,
                   ended: Callable[[str | None], None] | None = None) -> HttpResponse | StreamResponse:
        """The engine's answer to ``call``: whole, or a stream relayed as it comes.
        ``priority``: the request's class (None: its model's); a best-effort one is shed
        (429, reason ``shed``) when every engine has requests waiting. ``ended``: told, when a
        streamed answer ends, why it was cut short (None: it was not)."""
        reps = self.replicas.get(call.model, [])
        best_effort = (priority == Priority.BEST_EFFORT if priority is not None
                       else self.models[call.model].priority == "best-effort")
        rep = pick(reps, best_effort)
        if rep is None:
            if best_effort and pick(reps) is not None:
                return error_response(429, f"best-effort request to model {call.model!r} shed: every engine has "
                                      "requests waiting", None, (("Retry-After", "1"), (REASON_HEADER, "shed")))
            if any(not r.draining for r in reps):
                return error_response(429, f"every replica of model {call.model!r} is at its max_inflight",
                                      None, (("Retry-After", "1"),))
            return error_response(503, f"no replica serves model {call.model!r}", None, (("Retry-After", "1"),))
        if rep.engine == "triton":
            try:
                path, body, prompt = triton.request(call, rep.served)
            except OpenAiError as e:
                return e.response()
        else:
            path, body, prompt = _PATHS[call.kind], _outgoing(call, rep.served), ""
        opened = _Open()
        rep.outstanding += 1
        self._open[rep.id].add(opened)
        streaming = False
        try:
            try:
                conn, status = await self._send(self._upstreams[rep.id], path, body, opened)
            except (OSError, ValueError) as e:
                if opened.reason is not None:  # removed while connecting
                    return _cut_short(call.model, opened.reason)
                rep.reachable = False
                return error_response(503, f"engine of model {call.model!r} is unreachable ({rep.id}): "
                                      f"{type(e).__name__}: {e}", None, (("Retry-After", "1"),))
            answer: EngineConnection | triton.TritonAnswer = conn
            if rep.engine == "triton":
                answer = triton.TritonAnswer(conn, call, rep.served, status, prompt)
            if status != 200 or not call.stream:
                try:
                    raw = await answer.whole()
                except (OSError, ValueError) as e:
                    return _cut_short(call.model, opened.reason or f"{type(e).__name__}: {e}")
                kind = answer.headers.get(b"content-type", b"application/json").decode("latin-1")
                if isinstance(answer, triton.TritonAnswer):
                    status = answer.status  # an error event is its status
                if status != 200:
                    return _relayed_error(status, raw, kind, rep)
                raw = self._record_whole(rep, raw, arrival, ttft_slo)
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
        rep.outstanding -= 1
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
                self._record_stream(rep, arrival, first, last, events, usage, ttft_slo, tpot_slo)

    # ---- measuring
    def _record_whole(self, rep: LlmReplica, raw: bytes, arrival: float, ttft_slo: float) -> bytes:
        """Record a whole answer (its TTFT: the answer's); the answer, named as the client asked."""
        now = self.clock()
        usage = None
        try:
            doc = json.loads(raw)
            usage = doc.get("usage")
            if rep.served != rep.model and doc.get("model") == rep.served:
                doc["model"] = rep.model
                raw = json.dumps(doc).encode()
        except (ValueError, AttributeError):
            pass
        self._record(rep, now - arrival, None, usage, ttft_slo, 0.0)
        return raw

    def _record_stream(self, rep: LlmReplica, arrival: float, first: float, last: float, events: int,
                       usage: dict | None, ttft_slo: float, tpot_slo: float) -> None:
        if not first:  # no token came (an empty answer, or an error event)
            self._record(rep, None, None, usage, ttft_slo, tpot_slo)
            return
        n = usage.get("completion_tokens", events + 1) if isinstance(usage, dict) else events + 1
        tpot = (last - first) / (n - 1) if isinstance(n, int) and n > 1 else None
        self._record(rep, first - arrival, tpot, usage, ttft_slo, tpot_slo)

    def _record(self, rep: LlmReplica, ttft: float | None, tpot: float | None, usage: dict | None,
                ttft_slo: float, tpot_slo: float) -> None:
        m, model, variant = self.metrics, rep.model, rep.served
        m.of(m.llm_requests, model, variant).inc()
        if ttft is not None:
            m.of(m.llm_ttft, model, variant).observe(ttft)
        if tpot is not None:
            m.of(m.llm_tpot, model, variant).observe(tpot)
        ttft_met = ttft is not None and ttft <= ttft_slo
        tpot_met = tpot is None or tpot <= tpot_slo
        if ttft_met:
            m.of(m.llm_slo_met, model, variant, "ttft").inc()
        if tpot_met:
            m.of(m.llm_slo_met, model, variant, "tpot").inc()
        if ttft_met and tpot_met:
            m.of(m.llm_slo_met, model, variant, "both").inc()
        if isinstance(usage, dict):
            for kind, key in (("input", "prompt_tokens"), ("output", "completion_tokens")):
                v = usage.get(key)
                if isinstance(v, int) and v > 0:
                    m.of(m.llm_tokens, model, variant, kind).inc(v)


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

