"""Drivers: the open loop sends each request at its scheduled time and measures latency from
that time (wrk2, no coordinated omission); the closed loop keeps a fixed number of requests in
flight and measures from each send (which hides stalls: see ``CLOSED_LOOP_NOTE``).

Both run inside one asyncio loop of one process and feed a ``stats.Recorder``. Times are the
loop's monotonic clock (``loop.time()``, system-wide on Linux, so worker processes share it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from loadgen.arrivals import Schedule
from loadgen.clients import Client
from loadgen.stats import Recorder

SPIN_S = 0.0012  # closer than this to a send time, nap instead of sleeping (epoll rounds to ms)
NAP_S = 0.0002  # longest blocking nap while close to a send time

CLOSED_LOOP_NOTE = (
    "closed loop measures latency from each send and sends only when a request returns, so "
    "a server stall delays the senders and the requests that would have arrived during it are "
    "never made (coordinated omission): few samples see the stall and percentiles look good. "
    "Use the open loop for SLO numbers."
)


@dataclass
class Progress:
    """Counters a progress bar reads (shared memory values in worker processes)."""

    sent: int = 0
    done: int = 0


async def open_loop(
    client: Client,
    sched: Schedule,
    t0: float,
    warmup_s: float,
    slo_s: float | None,
    rec: Recorder,
    progress: Progress | None = None,
) -> None:
    """Send ``sched`` (times relative to ``t0`` on the loop clock). Requests scheduled before
    ``warmup_s`` are sent but not recorded; recorded times are relative to the warm-up end."""
    loop = asyncio.get_running_loop()
    times = sched.times.tolist()
    idx = sched.model_idx.tolist()
    models = sched.models
    prog = progress or Progress()
    now_fn = loop.time
    send = getattr(client, "send", None)  # callback path: no task per request
    outstanding = 0
    tasks: set[asyncio.Task] = set()
    drained: asyncio.Future | None = None

    def finish(t: float, mi: int, due: float, lag: float, outcome: str, variant: str | None):
        nonlocal outstanding
        latency = now_fn() - due
        prog.done += 1
        if t >= warmup_s:
            rec.record(models[mi], variant, t - warmup_s, latency, slo_s, outcome, lag)
        outstanding -= 1
        if outstanding == 0 and drained is not None and not drained.done():
            drained.set_result(None)

    def start(t: float, mi: int) -> None:
        due = t0 + t
        lag = now_fn() - due
        if send is not None:
            send(mi, lambda o, v: finish(t, mi, due, lag, o, v))
        else:
            task = loop.create_task(
                _via_task(client, mi, lambda o, v: finish(t, mi, due, lag, o, v))
            )
            tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(tasks.discard)

    n = len(times)
    i = 0
    while i < n:
        now = now_fn()
        wait = t0 + times[i] - now
        if wait > SPIN_S:
            await asyncio.sleep(wait - SPIN_S)
            continue
        if wait > 0:
            await asyncio.sleep(0)  # handle answers that came in
            wait = t0 + times[i] - now_fn()
            if wait > 0:
                # NOTE: a short blocking nap keeps sub-ms precision without spinning the loop;
                # answers wait at most NAP_S for it, so latencies stay within NAP_S
                time.sleep(min(wait, NAP_S))
            continue
        while i < n and t0 + times[i] <= now:
            outstanding += 1
            prog.sent += 1
            start(times[i], idx[i])
            i += 1
        await asyncio.sleep(0)  # let answers in before looking at the clock again
    if outstanding:
        drained = loop.create_future()
        await drained


async def _via_task(client: Client, mi: int, done: Callable[[str, str | None], None]) -> None:
    outcome, variant = await client.infer(mi)
    done(outcome, variant)


async def closed_loop(
    client: Client,
    concurrency: int,
    models: tuple[str, ...],
    pick: Callable[[], int],
    t0: float,
    warmup_s: float,
    end: float | None,
    requests: int | None,
    slo_s: float | None,
    rec: Recorder,
    progress: Progress | None = None,
) -> float:
    """``concurrency`` senders, each sending the next request when the last one returns, from
    ``t0`` until ``t0 + end`` or until ``requests`` measured requests were made. Returns the
    measured duration (s)."""
    loop = asyncio.get_running_loop()
    prog = progress or Progress()
    measured = 0
    last_done = t0 + warmup_s
    stop = False

    async def sender() -> None:
        nonlocal measured, last_done, stop
        while not stop:
            start = loop.time()
            if end is not None and start >= t0 + end:
                return
            t = start - t0
            if requests is not None and t >= warmup_s:
                if measured >= requests:
                    return
                measured += 1
            mi = pick()
            prog.sent += 1
            outcome, variant = await client.infer(mi)
            now = loop.time()
            prog.done += 1
            if t >= warmup_s:
                rec.record(models[mi], variant, t - warmup_s, now - start, slo_s, outcome)
                last_done = max(last_done, now)

    now = loop.time()
    if t0 > now:
        await asyncio.sleep(t0 - now)
    await asyncio.gather(*(sender() for _ in range(concurrency)))
    if end is not None and requests is None:
        return end - warmup_s
    return max(last_done - (t0 + warmup_s), 1e-6)
