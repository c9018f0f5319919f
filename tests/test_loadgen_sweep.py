"""Rate sweeps and the max-rate search, against a server with a known capacity; model mixes."""

from __future__ import annotations

import asyncio

import pytest

from loadgen.run import run_load
from loadgen.spec import LoadSpec
from loadgen.sweep import find_max_rate, parse_range, stability
from loadgen.testserver import MODEL, Behaviour, serve
from profiles.tritonserver import free_port

SERVICE_S = 0.004  # one request at a time: capacity 250 req/s


def single_server_queue(service_s: float):
    """FIFO single server: each request waits for those before it, then takes service_s."""
    busy_until = 0.0

    def delay(now: float) -> float:
        nonlocal busy_until
        busy_until = max(now, busy_until) + service_s
        return busy_until - now

    return delay


def test_parse_range() -> None:
    assert parse_range("100:300:100") == [100.0, 200.0, 300.0]
    assert parse_range("50:80") == [50.0, 80.0]
    for bad in ("0:10:1", "10:5", "a:b", "1:2:3:4", "1:100000:1"):
        with pytest.raises(ValueError, match="range"):
            parse_range(bad)


def window(t: float, thr: float, p50: float, offered: float | None = None) -> dict:
    return {"t": t, "offered_rps": offered or thr, "throughput_rps": thr, "p50_ms": p50,
            "attainment": 1.0}  # fmt: skip


def test_stability_needs_three_agreeing_windows() -> None:
    steady = {
        "timeline": [
            window(0, 50, 30),
            window(1, 100, 10),
            window(2, 104, 10.5),
            window(3, 98, 9.8),
        ]
    }
    assert stability(steady, 0.1)
    drifting = {"timeline": [window(1, 100, 10), window(2, 100, 14), window(3, 100, 20)]}
    assert not stability(drifting, 0.1)
    jitter_below_a_ms = {
        "timeline": [window(1, 100, 0.5), window(2, 100, 1.2), window(3, 100, 0.6)]
    }
    assert stability(jitter_below_a_ms, 0.1)
    # Poisson arrivals: the offered load varies, all of it is answered: stable
    bursty = {"timeline": [window(1, 100, 10), window(2, 70, 10), window(3, 130, 10)]}
    assert stability(bursty, 0.1)
    falling_share = {
        "timeline": [window(1, 100, 10, 100), window(2, 80, 10, 100), window(3, 60, 10, 100)]
    }
    assert not stability(falling_share, 0.1)
    assert not stability({"timeline": [window(0, 100, 10)]}, 0.1)


def test_max_rate_search_finds_the_servers_capacity() -> None:
    async def go():
        port = free_port()
        stop = await serve(Behaviour(delay=single_server_queue(SERVICE_S)), port, None)
        try:
            spec = LoadSpec(target=f"http://127.0.0.1:{port}", model=MODEL, slo_ms=60, warmup_s=0.3,
                            arrival="constant", lag_warn_ms=1000)  # fmt: skip
            return await find_max_rate(spec, 100, 400, target=0.95, window_s=0.4, tolerance=0.3,
                                       max_windows=6, precision=0.2)  # fmt: skip
        finally:
            await stop()

    res = asyncio.run(go())
    seen = [(t["rate"], t["attainment"], t["stable"], t["passed"]) for t in res.trials]
    # NOTE: capacity is 1 / SERVICE_S = 250 req/s; past it the queue grows without bound, and
    # below it constant arrivals never queue
    assert res.best_rate is not None, seen
    assert 150 <= res.best_rate <= 260, seen
    rates = [t["rate"] for t in res.trials]
    assert rates[:2] == [100, 400]
    assert not next(t for t in res.trials if t["rate"] == 400)["passed"]


def test_weighted_mix_reports_each_model() -> None:
    async def go():
        port = free_port()
        stop = await serve(Behaviour(models=("a", "b")), port, None)
        try:
            return await run_load(LoadSpec(target=f"http://127.0.0.1:{port}", mix="a:3,b:1", rate=400,
                                           duration_s=1.0, warmup_s=0.2, lag_warn_ms=1000))  # fmt: skip
        finally:
            await stop()

    s = asyncio.run(go()).summary
    a, b = s["per_model"]["a"]["offered"], s["per_model"]["b"]["offered"]
    assert a + b == s["offered"]
    assert a / (a + b) == pytest.approx(0.75, abs=0.07)
    assert s["error_count"] == 0
