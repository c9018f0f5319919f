"""The live routing benchmark: its fidelity arithmetic and plan (fast), its quick mode end to end
and its fleet's teardown (slow: they start engines and a gateway)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.llm_routing_live import (
    METRICS,
    Fleet,
    Point,
    fidelity,
    main,
    markdown,
    plan,
    refresh,
    rel_err,
    spread,
    tally,
)


def metrics(**over: float) -> dict[str, float]:
    base = {"ttft_p50_ms": 100.0, "ttft_p90_ms": 200.0, "tpot_p50_ms": 10.0, "tpot_p90_ms": 20.0, "goodput_rps": 5.0}
    return base | over


def test_relative_error_is_against_live():
    assert rel_err(110.0, 100.0) == pytest.approx(0.10)
    assert rel_err(90.0, 100.0) == pytest.approx(-0.10)
    assert rel_err(None, 100.0) is None
    assert rel_err(5.0, 0.0) is None  # nothing to be relative to


def test_fidelity_flags_ten_percent_and_the_hosts_floor():
    sim = metrics(ttft_p50_ms=109.0, ttft_p90_ms=260.0, tpot_p50_ms=14.0)
    floor = {m: 0.05 for m in METRICS} | {"ttft_p90_ms": 0.35}
    f = fidelity(sim, metrics(), floor)
    assert f["ttft_p50_ms"]["within_10pct"] and f["ttft_p50_ms"]["within_floor"]
    # NOTE: a miss of 10% inside the twin runs' spread is the host's noise, not the simulator's
    assert not f["ttft_p90_ms"]["within_10pct"] and f["ttft_p90_ms"]["within_floor"]
    assert not f["tpot_p50_ms"]["within_10pct"] and not f["tpot_p50_ms"]["within_floor"]
    assert fidelity(sim, metrics(), None)["ttft_p50_ms"]["within_floor"] is None


def test_twin_spread_is_unsigned():
    s = spread(metrics(), metrics(ttft_p50_ms=80.0, goodput_rps=5.5))
    assert s["ttft_p50_ms"] == pytest.approx(0.2)
    assert s["goodput_rps"] == pytest.approx(0.1)
    assert s["tpot_p50_ms"] == 0.0


def test_a_row_is_held_to_its_own_points_twin_else_the_narrowest():
    pt = {"arrival": "poisson", "cv": 1.0, "rate": 5.0, "requests": 10}
    live = metrics()
    sim = metrics(ttft_p50_ms=125.0)  # 25% over live
    twins = [{"point": pt | {"label": "knee"}, "spread": {m: 0.02 for m in METRICS}},
             {"point": pt | {"label": "overload"}, "spread": {m: 0.3 for m in METRICS}}]
    rows = [{"router": "a", "point": pt | {"label": label}, "sim": sim, "live": live}
            for label in ("knee", "overload", "light")]
    got = refresh({"rows": rows, "twins": twins})
    assert [r["fidelity"]["ttft_p50_ms"]["within_floor"] for r in got["rows"]] == [False, True, False]
    assert (got["summary"]["compared"], got["summary"]["within_10pct"], got["summary"]["within_floor"]) == (15, 12, 13)


def test_plan_brackets_the_simulators_knees():
    knees = {"bound": {"rate": 20.0}, "routers": {"a": {"knee": 10.0}, "b": {"knee": 16.0}, "c": {"knee": 0.0}}}
    pts = {p.label: p for p in plan(knees, 100)}
    assert pts["light"].rate < pts["knee"].rate == 10.0 < pts["overload"].rate
    assert pts["overload"].rate > 16.0  # past every router's knee
    assert pts["burst"].arrival == "gamma" and pts["burst"].cv == 4.0 and pts["burst"].rate == 10.0


def test_a_points_workload_is_the_scaled_shared_prefix():
    w = Point("x", 5.0, requests=50).work()
    assert len(w) == 50
    assert set(w.rows.input_len.tolist()) == {6144 + 1200}
    assert set(w.rows.output_len.tolist()) == {200}
    assert int(w.rows.tenant.max()) < 75
    assert Point("x", 5.0, requests=50).work().rows.times.tolist() == w.rows.times.tolist()  # seeded


def test_report_keeps_a_failed_row_and_counts_the_rest(tmp_path: Path):
    live = metrics() | {"attainment": 1.0, "prefix_hit_rate": 0.5, "refused": 0, "cpu_share": 0.3,
                        "send_lag_p99_ms": 2.0}
    sim = metrics(ttft_p50_ms=150.0) | {"attainment": 1.0, "prefix_hit_rate": 0.5, "refused": 0}
    pt = {"label": "knee", "rate": 5.0, "arrival": "poisson", "cv": 1.0, "requests": 10}
    rows = [{"router": "headrace", "point": pt, "sim": sim, "live": live},
            {"router": "dynamo", "point": pt, "sim": sim, "live": None, "error": "the gateway exited"}]
    doc = {"date": "d", "version": {"commit": "c"}, "cpus": 2, "load_avg_before": (1.0, 1.0, 1.0),
           "load_avg_after": (1.0, 1.0, 1.0), "wall_s": 60.0, "knees": None, "rows": rows, "twins": [],
           "settings": {"profile": "p", "engines": 4, "tenants": 75, "system_len": 6144, "question_len": 1200,
                        "output_len": 200, "requests": 10, "slo_ttft_s": 1.0, "slo_tpot_s": 0.05, "target": 0.9}}
    (tmp_path / "in.json").write_text(json.dumps(doc))
    assert main(["--render", str(tmp_path / "in.json"), "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "llm_routing_live.json").read_text())
    assert out["summary"] == tally(out["rows"])
    assert out["summary"]["compared"] == 5 and out["summary"]["within_10pct"] == 4
    assert out["summary"]["by_metric"]["ttft_p50_ms"] == [0, 1]
    md = (tmp_path / "llm_routing_live.md").read_text()
    assert md == markdown(out)
    assert "live run failed: the gateway exited" in md
    assert "+50% (+50) ✗" in md  # TTFT p50: 150 ms simulated against 100 ms live
    assert "**4/5**" in md


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_fleet_is_stopped_by_group_when_the_block_fails(tmp_path: Path):
    pids: list[int] = []
    with pytest.raises(KeyboardInterrupt), Fleet("least-request", tmp_path) as f:
        pids = [p for ps in f.pids().values() for p in ps]
        assert len(pids) == 5  # four engines and the gateway
        raise KeyboardInterrupt
    assert all(_gone(p) for p in pids)


@pytest.mark.slow
def test_quick_mode_end_to_end(tmp_path: Path):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "llm_routing_live.json").read_text())
    assert [r["router"] for r in doc["rows"]] == ["headrace", "least-request"]
    for r in doc["rows"]:
        live, sim = r["live"], r["sim"]
        assert live["ok"] == r["point"]["requests"] and not live["errors"]
        assert 0 < live["prefix_hit_rate"] < 1 and 0 < sim["prefix_hit_rate"] < 1
        assert live["cpu_s"]["engines"] > 0 and live["cpu_s"]["gateway"] > 0
        assert set(r["fidelity"]) == set(METRICS)
    assert doc["version"]["commit"]
    assert "## Fidelity" in (tmp_path / "llm_routing_live.md").read_text()
