"""The emulated LLM engine as an OpenAI-compatible server: one :class:`~profiles.llm.engine.Engine`
run in real time on one asyncio loop, spoken to as vLLM's OpenAI server is. It follows vLLM
0.32's behaviour: its errors, word for word; a ``max_tokens`` that runs past the context
shortened to the rest of it; usage whose ``prompt_tokens_details`` (the prefix-cache hits) is
null unless the app is made with ``enable_prompt_tokens_details``, vLLM's
``--enable-prompt-tokens-details``.

Endpoints:
- ``POST /v1/completions`` and ``POST /v1/chat/completions``: whole answers, or SSE chunks, one
  per token as its engine step ends, then ``data: [DONE]`` (wire format:
  :mod:`profiles.emulator.llm_openai`);
- ``GET /v1/models``, ``GET /health``;
- ``GET /metrics``: Prometheus text with vLLM's names and its ``model_name`` and ``engine``
  labels: ``vllm:num_requests_running`` / ``_waiting``, ``vllm:kv_cache_usage_perc`` (a fraction),
  ``vllm:prefix_cache_queries_total`` / ``_hits_total`` (tokens), ``vllm:num_preemptions_total``,
  ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:request_success_total``,
  and the histograms ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
  ``vllm:request_time_per_output_token_seconds`` and ``vllm:e2e_request_latency_seconds``;
- ``GET /v1/kv_events``: the engine's KV cache events, so a router can index the cache exactly.
  vLLM and llm-d-inference-sim publish them on a ZMQ socket as msgpack ``KVEventBatch``es; here
  they are an SSE stream of JSON batches with vLLM's field names, ``id:`` the batch's sequence
  number: ``{"seq", "ts", "events": [{"type": "BlockStored", "block_hashes", "parent_block_hash",
  "block_size"} | {"type": "BlockRemoved", "block_hashes"}]}``. Hashes are
  :func:`profiles.llm.kv.block_hashes`' (a router computes the same from the prompt's token
  ids); a prompt's first block has ``parent_block_hash`` null. A subscriber sees the events from
  its subscription on; one that falls ``KV_EVENTS_BACKLOG`` batches behind is dropped (its stream
  ends) and must resubscribe.

Timing: the driver sleeps until :attr:`EngineLoop.wake` (or, when idle, until a request comes),
then polls; a token is stamped with the end of the step that made it, so TTFT and TPOT are the
profile's step times, and a driver that wakes late delays delivery, never the engine.

A client that disconnects (mid-stream, or while waiting for a whole answer) aborts its request in
the engine: its KV blocks are freed and it makes no more tokens. Bad requests are answered as
vLLM answers them (400, 404 for an unknown model), never with a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from profiles.emulator.llm_openai import (
    DONE,
    ApiError,
    ChunkWriter,
    Generation,
    read_generation,
    response,
    usage,
)
from profiles.llm.engine import Engine, LlmRequest, Seq, StepOutput
from profiles.llm.kv import ROOT_HASH, BlockStored, KvEvent
from profiles.llm.loop import EngineLoop
from profiles.llm.metrics import samples
from profiles.llm.tokens import decode, word

log = logging.getLogger("headrace.engine")

KV_EVENTS_BACKLOG = 10_000  # batches a KV-event subscriber may fall behind before it is dropped
MAX_BODY = 16 * 1024 * 1024

# vLLM's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
_END = None  # a stream's last item


class TokenStream:
    """One request's tokens as the engine makes them: iterate it for the token ids."""

    __slots__ = ("req", "seq", "arrival", "first", "last", "count", "done", "queue")

    def __init__(self, req: LlmRequest, seq: Seq, arrival: float) -> None:
        self.req = req
        self.seq = seq  # the engine's view: cached_tokens once it has started
        self.arrival = arrival
        self.first: float | None = None  # when its first token's step ended
        self.last = 0.0
        self.count = 0
        self.done = False  # finished or aborted: nothing more comes
        self.queue: asyncio.Queue[int | ApiError | None] = asyncio.Queue()

    @property
    def id(self) -> str:
        return self.req.id

    async def __aiter__(self) -> AsyncIterator[int]:
        while True:
            item = await self.queue.get()
            if item is _END:
                return
            if isinstance(item, ApiError):
                raise item
            yield item


class _EngineCollector(Collector):
    """The engine's gauges and counters, read when scraped (nothing is counted per step)."""

    def __init__(self, engine: Engine, labels: list[str]) -> None:
        self.engine, self.labels = engine, labels

    def collect(self):  # noqa: ANN201
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for x in samples(self.engine):
            names = ["model_name", "engine", *(k for k, _ in x.labels)]
            fam = families.get(x.name)
            if fam is None:
                kind = CounterMetricFamily if x.counter else GaugeMetricFamily
                fam = families[x.name] = kind(x.name, x.doc, labels=names)
            fam.add_metric([*self.labels, *(v for _, v in x.labels)], x.value)
        yield from families.values()


class EmulatedEngine:
    """An :class:`Engine` driven in real time on the running asyncio loop: requests in with
    :meth:`submit`, tokens out through each request's :class:`TokenStream`, KV events out to
    subscribers. ``clock`` is the driver's time (monotonic seconds)."""

    def __init__(self, engine: Engine, model_name: str, clock: Callable[[], float] = time.monotonic,
                 frontend_s: float = 0.0) -> None:
        self.engine = engine
        self.loop = EngineLoop(engine, frontend_s)
        self.clock = clock
        self.streams: dict[str, TokenStream] = {}
        self.subscribers: set[asyncio.Queue[bytes | None]] = set()
        self.kv_seq = 0
        self.registry = CollectorRegistry()
        labels = [model_name, "0"]
        self.registry.register(_EngineCollector(engine, labels))

        def hist(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, ["model_name", "engine"], buckets=buckets, registry=self.registry).labels(*labels)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        ITL_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds",
                         "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        REQUEST_BUCKETS)
        self._kick = asyncio.Event()
        self._task: asyncio.Task | None = None

    # requests

    def submit(self, req: LlmRequest) -> TokenStream:
        """Queue a request (ValueError, RequestTooLong among them, when the engine refuses it)."""
        now = self.clock()
        self.loop.add(req, now)
        stream = TokenStream(req, self.engine.seqs[req.id], now)
        self.streams[req.id] = stream
        if self.loop.step is None:
            self._kick.set()
        return stream

    def abort(self, request_id: str) -> bool:
        """Drop a request from the engine (its KV blocks freed); its stream ends."""
        stream = self.streams.pop(request_id, None)
        if stream is not None:
            stream.done = True
            stream.queue.put_nowait(_END)
        return self.loop.abort(request_id)

    # the driver

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drive(), name="engine-driver")

    async def stop(self) -> None:
        """Stop the driver: every request still in the engine fails (503) and every KV-event
        subscription ends."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for rid in list(self.streams):
            self.loop.abort(rid)
        self._fail(ApiError(503, "The engine is shutting down.", "ServiceUnavailableError"))
        for q in self.subscribers:
            q.put_nowait(None)
        self.subscribers.clear()

    async def _drive(self) -> None:
        loop, clock = self.loop, self.clock
        try:
            while True:
                ended = loop.ends_at if loop.step is not None else 0.0
                out = loop.poll(clock())
                if out is not None:
                    self._deliver(out, ended)
                wake = loop.wake
                if wake is None:
                    self._kick.clear()
                    await self._kick.wait()
                else:
                    await asyncio.sleep(max(wake - clock(), 0.0))
        except asyncio.CancelledError:
            raise
        except Exception:  # a fault in the engine fails every request rather than hanging it
            log.exception("engine driver failed")
            self._fail(ApiError(500, "Internal server error", "InternalServerError"))

    def _fail(self, error: ApiError) -> None:
        for stream in self.streams.values():
            stream.done = True
            stream.queue.put_nowait(error)
        self.streams.clear()

    def _deliver(self, out: StepOutput, at: float) -> None:
        streams = self.streams
        for rid, tok in out.tokens:
            s = streams.get(rid)
            if s is None:
                continue
            if s.first is None:
                s.first = at
                self.ttft.observe(at - s.arrival)
            else:
                self.itl.observe(at - s.last)
            s.last = at
            s.count += 1
            s.queue.put_nowait(tok)
        for rid in out.finished:
            s = streams.pop(rid, None)
            if s is None:
                continue
            s.done = True
            s.queue.put_nowait(_END)
            self.e2e.observe(at - s.arrival)
            if s.count > 1 and s.first is not None:
                self.tpot.observe((at - s.first) / (s.count - 1))
        if out.events and self.subscribers:
            self._publish(out.events)

    # KV events

    def subscribe(self) -> asyncio.Queue[bytes | None]:
        q: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[bytes | None]) -> None:
        self.subscribers.discard(q)

    def _publish(self, events: list[KvEvent]) -> None:
        self.kv_seq += 1
        batch = {"seq": self.kv_seq, "ts": time.time(),
                 "events": kv_event_dicts(events, self.engine.config.block_size)}
        data = f"id: {self.kv_seq}\ndata: {json.dumps(batch)}\n\n".encode()
        for q in list(self.subscribers):
            if q.qsize() >= KV_EVENTS_BACKLOG:
                self.subscribers.discard(q)
                q.put_nowait(None)
            else:
                q.put_nowait(data)


def kv_event_dicts(events: Sequence[KvEvent], block_size: int) -> list[dict]:
    """Engine KV events as vLLM's ``BlockStored`` / ``BlockRemoved`` fields, a chain of stored
    blocks (each the parent of the next) or a run of removals merged into one event."""
    out: list[dict] = []
    for ev in events:
        last = out[-1] if out else None
        if isinstance(ev, BlockStored):
            if last is not None and last["type"] == "BlockStored" and last["block_hashes"][-1] == ev.parent:
                last["block_hashes"].extend(ev.hashes)
            else:
                out.append({"type": "BlockStored", "block_hashes": list(ev.hashes),
                            "parent_block_hash": None if ev.parent == ROOT_HASH else ev.parent,
                            "block_size": block_size})
        elif last is not None and last["type"] == "BlockRemoved":
            last["block_hashes"].extend(ev.hashes)
        else:
            out.append({"type": "BlockRemoved", "block_hashes": list(ev.hashes)})
    return out


# the app

ENGINE = web.AppKey("engine", EmulatedEngine)
SERVED = web.AppKey("served", tuple)
PROMPT_TOKENS_DETAILS = web.AppKey("prompt_tokens_details", bool)


def _error(e: ApiError) -> web.Response:
    return web.json_response(e.body(), status=e.status)


@web.middleware
async def _errors(request: web.Request, handler):  # noqa: ANN001, ANN202
    try:
        return await handler(request)
    except ApiError as e:
        return _error(e)
    except (web.HTTPException, ConnectionResetError):
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return _error(ApiError(500, "Internal server error", "InternalServerError"))


async def _body(request: web.Request) -> object:
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"invalid JSON body: {e}") from None


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    engine = request.app[ENGINE]
    cfg = engine.engine.config
    gen = read_generation(kind, await _body(request), request.app[SERVED], cfg.vocab_size,  # type: ignore[arg-type]
                          cfg.max_model_len)
    request_id = f"{'cmpl' if kind == 'completion' else 'chatcmpl'}-{uuid.uuid4().hex}"
    try:
        stream = engine.submit(LlmRequest(request_id, gen.prompt, gen.max_tokens, gen.seed))
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    try:
        if gen.stream:
            return await _stream(request, gen, stream)
        tokens = [tok async for tok in stream]
        use = usage(len(gen.prompt), len(tokens), _cached(request, stream))
        return web.json_response(response(gen, request_id, decode(tokens), use))
    finally:
        if not stream.done:  # the client went away (the handler was cancelled, or a write failed)
            engine.abort(stream.id)


def _cached(request: web.Request, stream: TokenStream) -> int | None:
    """The prompt tokens found in the prefix cache, when the server reports them."""
    return stream.seq.cached_tokens if request.app[PROMPT_TOKENS_DETAILS] else None


async def _stream(request: web.Request, gen: Generation, stream: TokenStream) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    chunks = ChunkWriter(gen, stream.id)
    first = chunks.first()
    if first is not None:
        await resp.write(first)
    n, last = 0, gen.max_tokens
    try:
        async for tok in stream:
            n += 1
            await resp.write(chunks.token(" " + word(tok), n == last))
        if gen.include_usage:
            await resp.write(chunks.usage(usage(len(gen.prompt), n, _cached(request, stream))))
    except ApiError as e:  # after the status line: the error goes in the stream, as vLLM sends it
        await resp.write(b"data: " + json.dumps(e.body()).encode() + b"\n\n")
    except ConnectionResetError:
        return resp
    await resp.write(DONE)
    return resp


async def _models(request: web.Request) -> web.Response:
    cfg = request.app[ENGINE].engine.config
    created = int(time.time())
    data = [{"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": name, "parent": None,
             "max_model_len": cfg.max_model_len} for name in request.app[SERVED]]
    return web.json_response({"object": "list", "data": data})


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(request.app[ENGINE].registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _kv_events(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    q = engine.subscribe()
    try:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await resp.write(b": subscribed\n\n")
        while (data := await q.get()) is not None:
            await resp.write(data)
        return resp
    except ConnectionResetError:
        return resp
    finally:
        engine.unsubscribe(q)


async def _run_engine(app: web.Application) -> AsyncIterator[None]:
    app[ENGINE].start()
    yield
    await app[ENGINE].stop()


async def _end_streams(app: web.Application) -> None:
    await app[ENGINE].stop()


def make_app(engine: EmulatedEngine, served_model_names: Sequence[str],
             enable_prompt_tokens_details: bool = False) -> web.Application:
    """The OpenAI server of one emulated engine, answering for ``served_model_names`` (the first
    is the default when a request names none, and the ``model_name`` label of its metrics).
    ``enable_prompt_tokens_details``: usage reports the prompt tokens found in the prefix cache."""
    if not served_model_names:
        raise ValueError("an engine serves at least one model name")
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY)
    app[ENGINE] = engine
    app[SERVED] = tuple(served_model_names)
    app[PROMPT_TOKENS_DETAILS] = enable_prompt_tokens_details
    app.cleanup_ctx.append(_run_engine)
    app.on_shutdown.append(_end_streams)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/v1/kv_events", _kv_events)
    return app


async def serve(app: web.Application, host: str = "127.0.0.1", port: int = 8000) -> tuple[web.AppRunner, int]:
    """Start serving ``app``; the runner (``await runner.cleanup()`` stops it) and the bound port.
    A handler whose client disconnects is cancelled, which aborts its request in the engine."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, runner.addresses[0][1]
