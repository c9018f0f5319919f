"""Drivers against a tiny v2 server: the open loop charges a 1-s server stall to every request
scheduled during it; the closed loop hides it. Plus the end-to-end API over HTTP and gRPC."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from loadgen.arrivals import Constant, single
from loadgen.clients import LoadError, RawHttpClient
from loadgen.drivers import CLOSED_LOOP_NOTE, closed_loop, open_loop
from loadgen.payload import http_body, parameters, synthesize
from loadgen.run import run_load
from loadgen.spec import InputSpec, LoadSpec
from loadgen.stats import OK, REJECTED, Recorder
from loadgen.testserver import MODEL, Behaviour, serve
from profiles.triton.server import free_port

RATE = 100.0
WARMUP = 0.3
STALL_AT, STALL_S = 1.0, 1.0  # measured seconds
DURATION = 3.0


class SpyRecorder(Recorder):
    """A recorder that also keeps each request (scheduled, latency, outcome)."""

    def __init__(self) -> None:
        super().__init__(window_s=0.25)
        self.rows: list[tuple[float, float, str]] = []

    def record(self, model, variant, scheduled, latency_s, slo_s, outcome, send_lag_s=None,
               pool_wait_s=None):  # fmt: skip
        self.rows.append((scheduled, latency_s, outcome))
        super().record(model, variant, scheduled, latency_s, slo_s, outcome, send_lag_s, pool_wait_s)


def stall_until(start: float, length: float):
    """Server behaviour: a request arriving during [start, start+length) waits until its end."""
    return lambda now: (start + length - now) if start <= now < start + length else 0.0


async def run_with_stall(mode: str) -> SpyRecorder:
    port = free_port()
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.1
    stall_start = t0 + WARMUP + STALL_AT
    stop = await serve(Behaviour(delay=stall_until(stall_start, STALL_S)), port, None)
    inputs = (InputSpec(name="INPUT0", shape=(-1, 4)),)
    body = http_body(
        MODEL, synthesize(inputs, 1, np.random.default_rng(0)), parameters(None, None, True), True
    )
    client = RawHttpClient("127.0.0.1", port, [[body]], connections=16, timeout_s=10.0)
    rec = SpyRecorder()
    try:
        if mode == "open":
            sched = single(MODEL, Constant(RATE), WARMUP + DURATION, np.random.default_rng(0))
            await open_loop(client, sched, t0, WARMUP, 0.1, rec)
        else:
            await closed_loop(
                client, 4, (MODEL,), lambda: 0, t0, WARMUP, WARMUP + DURATION, None, 0.1, rec
            )
    finally:
        await client.close()
        await stop()
    return rec


def test_open_loop_charges_the_stall_to_every_request_scheduled_during_it() -> None:
    rec = asyncio.run(run_with_stall("open"))
    in_stall = [(t, lat) for t, lat, _ in rec.rows if STALL_AT <= t < STALL_AT + STALL_S]
    # NOTE: one request per 1/RATE is scheduled in the stall, and each waits until its end
    assert len(in_stall) == pytest.approx(RATE * STALL_S, abs=2)
    for t, lat in in_stall:
        remaining = STALL_AT + STALL_S - t
        assert lat >= remaining - 0.01, (t, lat)
    s = rec.summary(DURATION, 0.1)
    assert s["latency_ms"]["p90"] >= 200.0  # a third of the run was stalled
    assert s["attainment"] < 0.75
    assert all(o == OK for _, _, o in rec.rows)


def test_closed_loop_hides_the_stall() -> None:
    rec = asyncio.run(run_with_stall("closed"))
    sent_in_stall = [
        lat for t, lat, _ in rec.rows if STALL_AT + 0.01 <= t < STALL_AT + STALL_S - 0.01
    ]
    # NOTE: senders wait for answers, so at most `concurrency` requests meet the stall and
    # none is sent while it lasts: the report has no samples for that second
    assert len(sent_in_stall) == 0
    slow = [lat for _, lat, _ in rec.rows if lat >= 0.5]
    assert 1 <= len(slow) <= 4
    s = rec.summary(DURATION, 0.1)
    assert s["latency_ms"]["p99"] < 100.0  # the stall is invisible in the percentiles
    stalled = [w for w in s["timeline"] if STALL_AT + 0.25 <= w["t"] < STALL_AT + STALL_S - 0.25]
    assert stalled and all(w["offered_rps"] == 0 for w in stalled)


@pytest.mark.parametrize(
    ("scheme", "client", "protocol", "reason"),
    [
        ("http", "raw", "binary", None),
        ("http", "raw", "json", "expired"),
        ("http", "aiohttp", "binary", "expired"),
        ("grpc", "raw", "binary", "expired"),
        ("grpc", "raw", "binary", "infeasible"),
    ],
)
def test_run_load_end_to_end(scheme, client, protocol, reason) -> None:
    async def go():
        hp, gp = free_port(), free_port()
        stop = await serve(Behaviour(reject_every=5, variant="small", reject_reason=reason), hp, gp)
        port = hp if scheme == "http" else gp
        try:
            return await run_load(
                LoadSpec(
                    target=f"{scheme}://127.0.0.1:{port}", model=MODEL, rate=200, duration_s=1.0,
                    warmup_s=0.2, arrival="constant", slo_ms=200, http_client=client,
                    protocol=protocol, lag_warn_ms=1000,
                )
            )  # fmt: skip
        finally:
            await stop()

    r = asyncio.run(go())
    s = r.summary
    assert s["offered"] == pytest.approx(200, abs=2)
    # every fifth answer is a rejection (at arrival, or "expired" in the target's queue, as the
    # reject-reason header says); the rest carry the server's variant
    refused = s["expired"] if reason == "expired" else s["rejected"]
    assert refused == pytest.approx(s["offered"] / 5, abs=2)
    assert s["expired" if reason != "expired" else "rejected"] == 0
    assert s["error_count"] == 0
    by_variant = {v["variant"]: v for v in s["per_variant"]}
    assert by_variant["small"]["ok"] == s["ok"]
    assert s["attainment"] == pytest.approx(s["good"] / s["offered"])
    assert r.warnings == []


def test_multi_process_run_merges_worker_histograms() -> None:
    async def go():
        hp = free_port()
        stop = await serve(Behaviour(), hp, None)
        try:
            spec = LoadSpec(target=f"http://127.0.0.1:{hp}", model=MODEL, rate=300, duration_s=1.0,
                            warmup_s=0.2, arrival="constant", processes=2, lag_warn_ms=1000)  # fmt: skip
            sched, _ = spec.measured(spec.schedule())
            return await run_load(spec), len(sched.window(spec.warmup_s, 1e9))
        finally:
            await stop()

    r, expected = asyncio.run(go())
    assert r.summary["offered"] == expected
    assert r.summary["ok"] == expected
    assert r.summary["processes"] == 2


def test_unreachable_target_and_unknown_model_fail_clearly() -> None:
    port = free_port()  # nothing listens here
    with pytest.raises(
        LoadError, match=f"cannot reach http://127.0.0.1:{port}: connection refused"
    ):
        asyncio.run(run_load(LoadSpec(target=f"http://127.0.0.1:{port}", model="m", duration_s=1)))

    async def unknown():
        hp = free_port()
        stop = await serve(Behaviour(), hp, None)
        try:
            await run_load(LoadSpec(target=f"http://127.0.0.1:{hp}", model="nope", duration_s=1))
        finally:
            await stop()

    with pytest.raises(LoadError, match="model 'nope' unavailable .*404: unknown model"):
        asyncio.run(unknown())


def test_closed_loop_result_explains_coordinated_omission() -> None:
    async def go():
        hp = free_port()
        stop = await serve(Behaviour(), hp, None)
        try:
            return await run_load(LoadSpec(target=f"http://127.0.0.1:{hp}", model=MODEL, mode="closed",
                                           concurrency=2, duration_s=0.5, warmup_s=0.1))  # fmt: skip
        finally:
            await stop()

    r = asyncio.run(go())
    assert r.summary["ok"] > 0 and r.summary["concurrency"] == 2
    assert CLOSED_LOOP_NOTE in r.warnings
    assert REJECTED not in r.summary["errors"]


def test_raw_client_reads_chunked_answers() -> None:
    async def go():
        hp = free_port()
        stop = await serve(Behaviour(chunked=True, variant="v"), hp, None)
        try:
            return await run_load(LoadSpec(target=f"http://127.0.0.1:{hp}", model=MODEL, rate=100,
                                           duration_s=0.5, warmup_s=0.1, lag_warn_ms=1000))  # fmt: skip
        finally:
            await stop()

    s = asyncio.run(go()).summary
    assert s["error_count"] == 0 and s["ok"] == s["offered"] > 0
    assert [v["variant"] for v in s["per_variant"]] == ["v"]


def test_realtime_sending_is_undone_after_the_run() -> None:
    import os

    async def go():
        hp = free_port()
        stop = await serve(Behaviour(), hp, None)
        try:
            return await run_load(LoadSpec(target=f"http://127.0.0.1:{hp}", model=MODEL, rate=200,
                                           duration_s=0.5, warmup_s=0.1, realtime=True,
                                           lag_warn_ms=1000))  # fmt: skip
        finally:
            await stop()

    before = os.sched_getscheduler(0)
    try:
        r = asyncio.run(go())
    except LoadError as e:  # not permitted here: the message says what is needed
        assert "CAP_SYS_NICE" in str(e)
        return
    assert r.summary["ok"] == r.summary["offered"] > 0
    assert os.sched_getscheduler(0) == before


def test_trace_and_timestamp_replays_drive_the_open_loop(tmp_path) -> None:
    from loadgen.arrivals import AzureReplay, read_azure_trace

    sample = Path(__file__).parents[2] / "loadgen" / "data" / "azure_sample.csv"
    ts = tmp_path / "ts.txt"
    ts.write_text("\n".join(str(0.05 * i) for i in range(40)) + "\n")

    async def go():
        hp = free_port()
        stop = await serve(Behaviour(models=("a", "b")), hp, None)
        target = f"http://127.0.0.1:{hp}"
        try:
            trace = await run_load(LoadSpec(target=target, arrival="trace", trace=sample,
                                            trace_models=("a", "b"), time_scale=60, duration_s=1.0,
                                            warmup_s=0.0, lag_warn_ms=1000))  # fmt: skip
            stamps = await run_load(LoadSpec(target=target, model="a", arrival="timestamps",
                                             timestamps=ts, duration_s=1.5, warmup_s=0.5,
                                             lag_warn_ms=1000))  # fmt: skip
            return trace.summary, stamps.summary
        finally:
            await stop()

    trace, stamps = asyncio.run(go())
    # NOTE: at 60x one trace minute lasts a second: its counts are what was offered
    funcs = read_azure_trace(sample)
    replay = AzureReplay(tuple(funcs), ("a", "b"), time_scale=60, minutes=1)
    assert trace["offered"] == len(replay.schedule(np.random.default_rng(0)).window(0, 1.0))
    assert set(trace["per_model"]) == {"a", "b"} and trace["error_count"] == 0
    assert stamps["offered"] == 30  # 0.5 s .. 1.95 s of the file, one per 50 ms


def test_a_503_that_says_why_is_a_refusal_and_a_bare_503_an_error():
    from loadgen.clients import http_outcome
    from loadgen.stats import EXPIRED, REJECTED

    assert http_outcome(503, "no_replica") == REJECTED  # headrace: no replica up, answered on purpose
    assert http_outcome(503, None) == "http_503"
    assert http_outcome(429, "expired") == EXPIRED and http_outcome(429, None) == REJECTED
