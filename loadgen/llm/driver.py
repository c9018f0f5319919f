"""The open-loop streaming driver: sends each request of a :class:`~loadgen.llm.workload.Workload`
at its scheduled time, whatever earlier answers are doing, and times every streamed token.

APIs: OpenAI ``/v1/completions`` (the prompt as token ids, so its length is exact on any
tokenizer) and ``/v1/chat/completions`` (the prompt as text, one word per token id), both with
``stream: true`` and ``stream_options.include_usage``; and Triton's generate extension,
``/v2/models/{model}/generate_stream`` (``text_input``, one SSE event per token). Each request asks
for exactly its output length: ``max_tokens`` with ``min_tokens`` and ``ignore_eos``, which vLLM
and the emulated engine honour. Per-request SLOs go as ``x-slo-ttft-ms`` / ``x-slo-tpot-ms``; a
request's priority band as ``x-headrace-priority`` when the run has a priority mix
(:func:`priorities`, seeded), and its tenant as ``x-headrace-tenant`` (``tenant-N``) when the
workload has tenants.

Bodies are encoded before the run; one aiohttp session with an unbounded connection pool sends
them, and the SSE stream is split into lines by hand, so the client stays cheap per token. Times
count from each request's *scheduled* send (no coordinated omission); how late each send left is
kept as its send lag.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
import numpy as np

from loadgen.llm.workload import Workload

APIS = ("completions", "chat", "triton")
START_DELAY_S = 0.05  # the schedule starts this long after the bodies are ready
BANDS = ("critical", "standard", "sheddable")  # the priority bands a mix draws from
PRIORITY_HEADER = "x-headrace-priority"
TENANT_HEADER = "x-headrace-tenant"


class TargetError(Exception):
    """The target cannot be reached or does not serve the model."""


@dataclass(slots=True)
class Outcome:
    """One request as the client saw it; times in seconds from its scheduled send."""

    index: int
    scheduled: float  # s from the run's start
    input_tokens: int
    wanted_tokens: int
    send_lag: float = 0.0  # how late the send left against its schedule
    status: int = 0  # HTTP status; 0: no answer
    error: str | None = None  # None: the stream ended well
    ttft: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when reported
    band: str | None = None  # the priority band it was sent with (None: no header)
    tenant: str | None = None  # the tenant it was sent as (None: no header)
    itl: list[float] = field(default_factory=list)  # gaps between streamed tokens

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - TTFT) / (tokens - 1); 0 for one token."""
        if self.ttft is None or self.e2e is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


@dataclass(frozen=True)
class Target:
    """Where and how requests go."""

    url: str  # http://HOST:PORT, no path
    model: str
    api: str = "completions"
    slo_ttft_ms: float | None = None  # sent as x-slo-ttft-ms when given
    slo_tpot_ms: float | None = None
    api_key: str | None = None
    request_timeout_s: float = 600.0
    priority_mix: Mapping[str, float] | None = None  # band -> share of requests (the rest: standard)

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"unknown API {self.api!r}; known: {', '.join(APIS)}")
        if self.priority_mix is not None:
            check_mix(self.priority_mix)

    @property
    def path(self) -> str:
        if self.api == "triton":
            return f"/v2/models/{self.model}/generate_stream"
        return "/v1/completions" if self.api == "completions" else "/v1/chat/completions"

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.slo_ttft_ms is not None:
            h["x-slo-ttft-ms"] = f"{self.slo_ttft_ms:g}"
        if self.slo_tpot_ms is not None:
            h["x-slo-tpot-ms"] = f"{self.slo_tpot_ms:g}"
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


def parse_mix(text: str) -> dict[str, float]:
    """``critical=0.2,sheddable=0.5`` as band -> share; ValueError naming what is wrong."""
    mix: dict[str, float] = {}
    for part in text.split(","):
        name, eq, share = part.strip().partition("=")
        try:
            mix[name.strip()] = float(share) if eq else float("nan")
        except ValueError:
            mix[name.strip()] = float("nan")
    check_mix(mix, text)
    return mix


def check_mix(mix: Mapping[str, float], text: str | None = None) -> None:
    where = f"priority mix {text!r}" if text is not None else f"priority mix {dict(mix)}"
    for name, share in mix.items():
        if name not in BANDS:
            raise ValueError(f"{where}: unknown band {name!r}; bands: {', '.join(BANDS)}")
        if not 0 <= share <= 1:
            raise ValueError(f"{where}: {name}'s share must be a number in [0, 1]")
    if sum(mix.values()) > 1 + 1e-9:
        raise ValueError(f"{where}: shares add up to {sum(mix.values()):g}, more than 1")


def priorities(mix: Mapping[str, float], n: int, seed: int) -> list[str]:
    """The band of each of ``n`` requests, drawn independently: critical and sheddable with the
    mix's shares, standard the rest; seeded apart from the workload's other draws."""
    critical, sheddable = mix.get("critical", 0.0), mix.get("sheddable", 0.0)
    p = np.array([critical, max(0.0, 1.0 - critical - sheddable), sheddable])
    return [BANDS[k] for k in np.random.default_rng([seed, 7]).choice(len(BANDS), size=n, p=p / p.sum())]


def request_headers(target: Target, work: Workload, bands: Sequence[str] | None, i: int) -> dict[str, str]:
    """The headers of request ``i``: the target's, its band's and its tenant's."""
    h = target.headers()
    if bands is not None:
        h[PRIORITY_HEADER] = bands[i]
    tenants = work.rows.tenant
    if tenants is not None:
        h[TENANT_HEADER] = f"tenant-{int(tenants[i])}"
    return h


def request_body(target: Target, work: Workload, i: int) -> dict:
    """The JSON body of request ``i``."""
    out = int(work.rows.output_len[i])
    if target.api == "triton":
        return {"text_input": work.prompt_text(i), "max_tokens": out, "ignore_eos": True, "stream": True}
    body: dict = {"model": target.model, "max_tokens": out, "min_tokens": out, "ignore_eos": True,
                  "stream": True, "stream_options": {"include_usage": True}}
    if target.api == "completions":
        body["prompt"] = work.prompt(i)
    else:
        body["messages"] = [{"role": "user", "content": work.prompt_text(i)}]
    return body


def _token_count(target: Target, event: dict) -> int:
    """Tokens a stream event carries (1 for any text; vLLM and Triton send one per event)."""
    if target.api == "triton":
        return 1 if event.get("text_output") else 0
    choices = event.get("choices") or ()
    if not choices:
        return 0
    c = choices[0]
    text = c.get("text") if target.api == "completions" else (c.get("delta") or {}).get("content")
    return 1 if text else 0


def _error_text(event: dict) -> str | None:
    err = event.get("error")
    if err is None and event.get("object") == "error":
        err = event
    if err is None:
        return None
    msg = err.get("message") if isinstance(err, dict) else err
    return f"stream error: {' '.join(str(msg).split())[:200]}"


async def _send(session: aiohttp.ClientSession, target: Target, body: bytes, headers: dict[str, str], o: Outcome,
                t_sched: float, loop: asyncio.AbstractEventLoop) -> None:
    last = None
    done = target.api == "triton"  # Triton ends its stream without [DONE]
    try:
        async with session.post(target.url + target.path, data=body, headers=headers) as resp:
            o.status = resp.status
            if resp.status != 200:
                text = (await resp.text())[:300]
                o.error = f"HTTP {resp.status}: {' '.join(text.split())}"
                o.e2e = loop.time() - t_sched
                return
            async for raw in resp.content:
                if not raw.startswith(b"data:"):
                    continue
                data = raw[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if (err := _error_text(event)) is not None:
                    o.error = err
                    break
                if n := _token_count(target, event):
                    now = loop.time()
                    if last is None:
                        o.ttft = now - t_sched
                    else:
                        o.itl.append(now - last)
                    last = now
                    o.output_tokens += n
                usage = event.get("usage")
                if usage:
                    o.output_tokens = usage.get("completion_tokens", o.output_tokens)
                    o.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        o.e2e = loop.time() - t_sched
        if o.error is None and not done:
            o.error = "stream ended before [DONE]"
        elif o.error is None and o.ttft is None:
            o.error = "no tokens streamed"
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:  # ValueError: bad JSON, an over-long line
        o.e2e = loop.time() - t_sched
        o.error = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}" if str(e) else type(e).__name__


ProgressFn = Callable[[int, int, int], None]  # (sent, done, total)


async def check_target(session: aiohttp.ClientSession, target: Target) -> None:
    """Raises :class:`TargetError` unless the target answers and serves the model."""
    path = f"/v2/models/{target.model}/ready" if target.api == "triton" else "/v1/models"
    try:
        async with session.get(target.url + path, headers=target.headers(),
                               timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status != 200:
                raise TargetError(f"{target.url}{path} answered {resp.status}: is {target.model!r} served there?")
            if target.api != "triton":
                served = [m.get("id") for m in (await resp.json()).get("data", [])]
                if target.model not in served:
                    raise TargetError(f"{target.url} serves {', '.join(map(str, served)) or 'no model'}, "
                                      f"not {target.model!r}")
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        raise TargetError(f"cannot reach {target.url}: {' '.join(str(e).split()) or type(e).__name__}") from None


async def drive(work: Workload, target: Target, on_progress: ProgressFn | None = None) -> tuple[list[Outcome], float]:
    """Send every request of ``work`` open loop; returns the outcomes (in schedule order) and the
    wall time the run took."""
    bodies = [json.dumps(request_body(target, work, i)).encode() for i in range(len(work))]
    bands = None if target.priority_mix is None else priorities(target.priority_mix, len(work), work.seed)
    heads = [request_headers(target, work, bands, i) for i in range(len(work))]
    loop = asyncio.get_running_loop()
    timeout = aiohttp.ClientTimeout(total=target.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    outcomes = [Outcome(i, float(t), int(work.rows.input_len[i]), int(work.rows.output_len[i]),
                        band=heads[i].get(PRIORITY_HEADER), tenant=heads[i].get(TENANT_HEADER))
                for i, t in enumerate(work.rows.times)]
    done = 0

    async def one(o: Outcome, body: bytes, t_sched: float) -> None:
        nonlocal done
        await _send(session, target, body, heads[o.index], o, t_sched, loop)
        done += 1
        if on_progress is not None:
            on_progress(len(tasks), done, len(outcomes))

    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await check_target(session, target)
        t0 = loop.time() + START_DELAY_S
        tasks: list[asyncio.Task] = []
        for o, body in zip(outcomes, bodies, strict=True):
            t_sched = t0 + o.scheduled
            delay = t_sched - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            o.send_lag = max(0.0, loop.time() - t_sched)
            tasks.append(asyncio.create_task(one(o, body, t_sched)))
        await asyncio.gather(*tasks)
        elapsed = loop.time() - t0
    return outcomes, elapsed
