"""The live view: per window of completions, the answer rate, the share in SLO and the p99,
on an injected clock; and the labels reports carry (CV defaults that agree with the
simulator, the synthetic sample trace said to be synthetic)."""

from __future__ import annotations

import argparse

import pytest

from loadgen.live import LiveMeter


def test_a_window_closes_every_window_s_with_rate_attainment_and_p99() -> None:
    m = LiveMeter(window_s=1.0, has_slo=True, start=10.0)
    m.add(50, 49, [0.010] * 50)
    assert m.roll(10.5) is None  # still open
    m.add(50, 50, [0.010] * 45 + [0.200] * 5)
    w = m.roll(11.0)
    assert w is not None and w.answered_rps == 100.0 and w.attainment == 0.99
    assert w.p99_ms == pytest.approx(200.0)  # the 5% tail
    assert w.line() == "last 1 s: 100.0/s answered, in SLO 99.0%, p99 200.0 ms"
    assert m.roll(11.5) is w  # the last closed window stays on show
    m.add(10, 0, [])
    w2 = m.roll(12.0)
    assert w2.answered_rps == 10.0 and w2.attainment == 0.0 and w2.p99_ms is None


def test_without_an_slo_the_live_attainment_is_na() -> None:
    m = LiveMeter(window_s=0.5, has_slo=False, start=0.0)
    m.add(5, 5, [0.001] * 5)
    assert "in SLO n/a" in m.roll(0.5).line()


def test_load_and_sim_agree_on_the_gamma_cv_default() -> None:
    from loadgen import cli
    from loadgen.sim import cli as sim_cli

    defaults = {}
    for name, mod in (("load", cli), ("sim", sim_cli)):
        ap = argparse.ArgumentParser()
        mod.register(ap.add_subparsers())
        args = ["load", "--target", "http://h:1"] if name == "load" else ["sim"]
        defaults[name] = ap.parse_args(args).cv
    assert defaults["load"] == defaults["sim"] == 4.0


def test_help_says_the_bundled_trace_is_synthetic(capsys) -> None:
    from deploy.cli import main

    with pytest.raises(SystemExit):
        main(["load", "--help"])
    out = capsys.readouterr().out
    assert "SYNTHETIC" in out and "the Azure Functions 2019 trace shape" not in out


@pytest.mark.parametrize("processes", [1, 2])
def test_a_run_reports_live_windows_as_it_goes(processes: int) -> None:
    import asyncio

    from loadgen.run import run_load
    from loadgen.spec import LoadSpec
    from loadgen.testserver import MODEL, Behaviour, serve
    from profiles.triton.server import free_port

    seen = []

    async def go() -> None:
        port = free_port()
        stop = await serve(Behaviour(), port, None)
        try:
            await run_load(LoadSpec(target=f"http://127.0.0.1:{port}", model=MODEL, rate=200,
                                    arrival="constant", duration_s=2.2, warmup_s=0.1, slo_ms=500,
                                    processes=processes, lag_warn_ms=1000),
                           lambda sent, done, total, live: seen.append(live))  # fmt: skip
        finally:
            await stop()

    asyncio.run(go())
    windows = {id(w): w for w in seen if w is not None}.values()
    assert len(windows) >= 1
    for w in windows:
        assert w.answered_rps == pytest.approx(200, rel=0.3) and w.attainment == 1.0


def test_reports_say_what_latencies_count_from() -> None:
    from loadgen.report import table
    from loadgen.stats import OK, Recorder

    rec = Recorder()
    rec.record("m", None, 0.1, 0.01, 0.1, OK)
    base = {**rec.summary(1.0, 0.1), "rate": 10.0, "arrival": "poisson", "duration_s": 1.0}
    caption = {name: str(table({**base, **extra}).caption) for name, extra in {
        "open": {"mode": "open"}, "closed": {"mode": "closed", "concurrency": 2},
        "sim": {"mode": "open", "sim": {}}}.items()}  # fmt: skip
    assert "from the scheduled send" in caption["open"]
    assert "from each send (closed loop)" in caption["closed"]
    assert "scheduled" not in caption["closed"]
    assert "from arrival, in virtual time" in caption["sim"] and "send lag" not in caption["sim"]
