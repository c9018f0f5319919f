"""Streamed completions of token-id prompts at set times, timed at the client: the load both the
CPU engine's profile measurement and the fidelity comparison send, to real vLLM and to the
emulated engine alike (the same body, so both generate the same tokens: ``ignore_eos`` and a
fixed ``max_tokens``).

A request's TTFT is from its scheduled send time (not when the client got round to sending it)
to the first streamed token; its TPOT is the time from the first token to the last over the
tokens after the first. A server that falls behind may send several tokens in one chunk: each
token's time is its chunk's.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True, slots=True)
class Send:
    at: float  # seconds after the run starts
    prompt: Sequence[int]  # token ids
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Timing:
    ttft: float
    tpot: float | None  # None for a single token
    tokens: int
    cached: int | None  # prompt tokens found in the prefix cache, where the server says
    e2e: float
    times: tuple[float, ...]  # each token's arrival, from the scheduled send (a chunk of k tokens counts k)


async def stream(session: aiohttp.ClientSession, url: str, model: str, send: Send, start: float) -> Timing:
    body = {"model": model, "prompt": list(send.prompt), "max_tokens": send.max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.0, "return_token_ids": True}
    scheduled = start + send.at
    first = last = None
    usage: dict = {}
    times: list[float] = []
    async with session.post(url + "/v1/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {await r.text()}")
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                last = time.perf_counter()
                if first is None:
                    first = last
                # vLLM names a chunk's tokens (return_token_ids); a server that does not sends one a chunk
                times += [last - scheduled] * max(1, len(chunk["choices"][0].get("token_ids") or ()))
            if chunk.get("usage"):
                usage = chunk["usage"]
    if first is None or last is None:
        raise RuntimeError("the stream carried no token")
    n = int(usage.get("completion_tokens", send.max_tokens))
    details = usage.get("prompt_tokens_details") or {}
    return Timing(ttft=first - scheduled, tpot=(last - first) / (n - 1) if n > 1 else None, tokens=n,
                  cached=details.get("cached_tokens"), e2e=last - scheduled, times=tuple(times))


async def _run(url: str, model: str, sends: Sequence[Send]) -> list[Timing]:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        start = time.perf_counter() + 0.05

        async def one(s: Send) -> Timing:
            delay = start + s.at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            return await stream(session, url, model, s, start)

        return list(await asyncio.gather(*(one(s) for s in sends)))


def run(url: str, model: str, sends: Sequence[Send]) -> list[Timing]:
    """Send each request at its time (open loop); their timings, in the order given."""
    return asyncio.run(_run(url, model, sends))


def quiet(limit: float = 2.5, wait_s: float = 1200.0, step_s: float = 60.0,
          log: Callable[[str], None] = print) -> float:
    """Wait, in ``step_s`` steps up to ``wait_s``, for the 1-minute load average to fall below
    ``limit`` (timings on a shared host mean little above it); the load average found."""
    t0 = time.monotonic()
    while True:
        load = os.getloadavg()[0]
        if load < limit or time.monotonic() - t0 + step_s > wait_s:
            return load
        log(f"load average {load:.2f} >= {limit}: waiting {step_s:.0f} s")
        time.sleep(step_s)
