"""No coordinated omission in the open loop: a request's latency counts from its *scheduled*
send, so time the client itself lost before sending (a stalled sender, a busy host) is in the
latency of every request that should have gone out meanwhile. Timing from the actual send
would report those requests as instant; these tests fail if it did.

The clock is injected: the stall is a jump of a fake clock, not a sleep."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from loadgen.arrivals import Schedule
from loadgen.clients import Answer
from loadgen.drivers import open_loop
from loadgen.stats import OK, Recorder

STALL_S = 1.0
GAP_S = 0.01
N = 50  # all scheduled inside the stall


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class StallingSender:
    """A callback client whose first send stalls ``STALL_S`` before writing; the server then
    answers everything at once."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sends = 0

    def send(self, model_idx: int, done, deadline: float = math.inf) -> None:
        self.sends += 1
        if self.sends == 1:
            self.clock.t += STALL_S
        done(OK, None, 0.0)

    async def close(self) -> None: ...


class StallingInfer:
    """The same, through the awaitable ``infer`` path."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sends = 0

    async def infer(self, model_idx: int, deadline: float = math.inf) -> Answer:
        self.sends += 1
        if self.sends == 1:
            self.clock.t += STALL_S
        return OK, None, 0.0

    async def close(self) -> None: ...


class Rows(Recorder):
    def __init__(self) -> None:
        super().__init__(window_s=1.0)
        self.rows: list[tuple[float, float, float | None]] = []  # scheduled, latency, send lag

    def record(self, model, variant, scheduled, latency_s, slo_s, outcome, send_lag_s=None,
               pool_wait_s=None):  # fmt: skip
        self.rows.append((scheduled, latency_s, send_lag_s))
        super().record(model, variant, scheduled, latency_s, slo_s, outcome, send_lag_s, pool_wait_s)


@pytest.mark.parametrize("client_kind", [StallingSender, StallingInfer])
def test_a_stall_before_sending_is_in_the_latency_of_every_request_scheduled_during_it(
    client_kind,
) -> None:
    clock = FakeClock()
    client = client_kind(clock)
    rec = Rows()
    sched = Schedule(np.arange(N) * GAP_S, np.zeros(N, dtype=np.int32), ("m",))

    async def go() -> None:
        await open_loop(client, sched, clock.t, 0.0, 0.1, rec, clock=clock)

    asyncio.run(go())
    assert len(rec.rows) == N
    for scheduled, latency, lag in rec.rows[1:]:
        # NOTE: request k was due at k * GAP_S but went out when the stall ended at STALL_S;
        # it was answered at once, so all of its latency is the client's lateness
        assert lag == pytest.approx(STALL_S - scheduled)
        assert latency == pytest.approx(STALL_S - scheduled), (scheduled, latency)
    s = rec.summary(N * GAP_S, 0.1)
    assert s["latency_ms"]["p50"] >= 700.0
    assert s["attainment"] == 0.0  # every request answered 0.5-1 s after it was due
