"""An emulated engine's KV cache events, followed: ``GET /v1/kv_events`` (server-sent events, one
JSON batch each, vLLM's field names; the format is in :mod:`profiles.emulator.llm_server`) read
as :class:`~profiles.llm.kv.BlockStored` / :class:`~profiles.llm.kv.BlockRemoved` for the
model's router.

A stream that ends or breaks (the engine restarted, or dropped a subscriber that fell behind) is
subscribed to again after ``retry_s``; events published meanwhile are missed, which a router's
index bounds by its capacity and corrects as the engine publishes removals.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from gateway.llm.upstream import Upstream
from profiles.llm.kv import ROOT_HASH, BlockRemoved, BlockStored, KvEvent

log = logging.getLogger("headrace.gateway")
PATH = b"/v1/kv_events"


def parse_batch(data: bytes) -> list[KvEvent]:
    """One SSE ``data:`` payload as events; malformed ones are skipped."""
    try:
        batch = json.loads(data)
        raw = batch["events"]
    except (ValueError, KeyError, TypeError):
        return []
    out: list[KvEvent] = []
    for ev in raw if isinstance(raw, list) else ():
        if not isinstance(ev, dict):
            continue
        hashes = ev.get("block_hashes")
        if not isinstance(hashes, list) or not all(type(h) is int for h in hashes):
            continue
        if ev.get("type") == "BlockStored":
            parent = ev.get("parent_block_hash")
            out.append(BlockStored(tuple(hashes), ROOT_HASH if parent is None else int(parent)))
        elif ev.get("type") == "BlockRemoved":
            out.append(BlockRemoved(tuple(hashes)))
    return out


class SseLines:
    """Server-sent events split from the pieces of a body as they arrive: ``feed`` gives each
    complete event's ``data:`` payload."""

    __slots__ = ("rest",)

    def __init__(self) -> None:
        self.rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = (self.rest + data).replace(b"\r\n", b"\n")
        *events, self.rest = buf.split(b"\n\n")
        out = []
        for ev in events:
            payload = [line[5:].strip() for line in ev.split(b"\n") if line.startswith(b"data:")]
            if payload:
                out.append(b"\n".join(payload))
        return out


async def follow(url: str, on_events: Callable[[list[KvEvent]], None], retry_s: float = 1.0,
                 connect_timeout: float = 5.0) -> None:
    """Feed the engine's KV events at ``url`` to ``on_events`` until cancelled, subscribing again
    whenever the stream ends."""
    up = Upstream(url)
    warned = False
    while True:
        conn = None
        try:
            async with asyncio.timeout(connect_timeout):
                conn, _ = await up.connect(fresh=True)
                status = await conn.start(PATH, None)
            if status != 200:
                raise ValueError(f"{url}{PATH.decode()} answered {status}")
            warned = False
            lines = SseLines()
            while (data := await conn.read()) is not None:
                for payload in lines.feed(data):
                    events = parse_batch(payload)
                    if events:
                        on_events(events)
        except (OSError, ValueError) as e:
            if not warned:
                log.warning("KV events of %s: %s: %s (subscribing again every %gs)", url, type(e).__name__, e,
                            retry_s)
                warned = True
        finally:
            if conn is not None:
                conn.close()
        await asyncio.sleep(retry_s)
