"""Drivers: the open loop sends each request at its scheduled time and measures latency from
that time (wrk2, no coordinated omission); the closed loop keeps a fixed number of requests in
flight and measures from each send (which hides stalls: see ``CLOSED_LOOP_NOTE``).

Both run inside one asyncio loop of one process and feed a ``stats.Recorder``. Times are the
loop's monotonic clock (``loop.time()``, system-wide on Linux, so worker processes share it);
``clock`` replaces it in tests. A request times out ``timeout_s`` after its scheduled send
(open loop) or its send (closed loop), whether it is still waiting for a connection or
already in flight.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loadgen.arrivals import Schedule
from loadgen.clients import Client
from loadgen.stats import OK, Recorder

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
    """What a progress line reads while a run goes on: requests sent and answered, and the
    answers since the last :meth:`take` (by completion time) for a live rate, attainment and
    p99 per window."""

    sent: int = 0
    done: int = 0
    answered: int = 0  # since the last take()
    good: int = 0  # of those, OK within the SLO (OK, without an SLO)
    latencies: list[float] = field(default_factory=list)  # s, of the OK answers among them
    live: bool = False  # keep latencies for take(); off, nothing grows while nobody reads

    def note(self, latency_s: float, ok: bool, good: bool) -> None:
        self.answered += 1
        if ok and self.live:
            self.latencies.append(latency_s)
        if good:
            self.good += 1

    def take(self) -> tuple[int, int, list[float]]:
        """(answered, good, OK latencies) since the last call, and start a new window."""
        out = (self.answered, self.good, self.latencies)
        self.answered, self.good, self.latencies = 0, 0, []
        return out


async def open_loop(
    client: Client,
    sched: Schedule,
    t0: float,
    warmup_s: float,
    slo_s: float | None,
    rec: Recorder,
    progress: Progress | None = None,
    *,
    timeout_s: float = math.inf,
    clock: Callable[[], float] | None = None,
) -> None:
    """Send ``sched`` (times relative to ``t0`` on the loop clock). Requests scheduled before
    ``warmup_s`` are sent but not recorded; recorded times are relative to the warm-up end."""
    loop = asyncio.get_running_loop()
    times = sched.times.tolist()
    idx = sched.model_idx.tolist()
    models = sched.models
    prog = progress or Progress()
    now_fn = clock or loop.time
    send = getattr(client, "send", None)  # callback path: no task per request
    outstanding = 0
    tasks: set[asyncio.Task] = set()
    drained: asyncio.Future | None = None

    def finish(
        t: float, mi: int, due: float, lag: float, outcome: str, variant: str | None,
        waited: float | None,
    ) -> None:  # fmt: skip
        nonlocal outstanding
        # NOTE: latency counts from the scheduled send (due), never from when the send
        # happened: send lag and pool wait are the client's delays and belong in it
        latency = now_fn() - due
        prog.done += 1
        if t >= warmup_s:
            rec.record(models[mi], variant, t - warmup_s, latency, slo_s, outcome, lag, waited)
        ok = outcome == OK
        prog.note(latency, ok, ok and (slo_s is None or latency <= slo_s))
        outstanding -= 1
        if outstanding == 0 and drained is not None and not drained.done():
            drained.set_result(None)

    def start(t: float, mi: int) -> None:
        due = t0 + t
        lag = now_fn() - due
        deadline = due + timeout_s

        def done(o: str, v: str | None, w: float | None) -> None:
            finish(t, mi, due, lag, o, v, w)

        if send is not None:
            send(mi, done, deadline)
        else:
            task = loop.create_task(_via_task(client, mi, deadline, done))
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


async def _via_task(
    client: Client, mi: int, deadline: float, done: Callable[[str, str | None, float | None], None]
) -> None:
    done(*await client.infer(mi, deadline))


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
    *,
    timeout_s: float = math.inf,
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
            outcome, variant, waited = await client.infer(mi, start + timeout_s)
            now = loop.time()
            prog.done += 1
            latency = now - start
            if t >= warmup_s:
                rec.record(
                    models[mi], variant, t - warmup_s, latency, slo_s, outcome, None, waited
                )
                last_done = max(last_done, now)
            ok = outcome == OK
            prog.note(latency, ok, ok and (slo_s is None or latency <= slo_s))

    now = loop.time()
    if t0 > now:
        await asyncio.sleep(t0 - now)
    await asyncio.gather(*(sender() for _ in range(concurrency)))
    if end is not None and requests is None:
        return end - warmup_s
    return max(last_done - (t0 + warmup_s), 1e-6)
