"""The fleet study compares batch policies on one plan and one arrival trace."""

from __future__ import annotations

from bench.fleet_study import SYSTEMS, run


def test_every_system_runs_the_same_plan_on_the_same_arrivals() -> None:
    r = run(models=6, gpus=20, rate_scale=0.02, minutes=3, minute_s=2.0, cv=2.0, seed=5, processes=1,
            loads=(1.0, 2.0))
    assert {(row["system"], row["load"]) for row in r["rows"]} == {(s, x) for s in SYSTEMS for x in (1.0, 2.0)}
    for load in (1.0, 2.0):
        offered = {row["offered"] for row in r["rows"] if row["load"] == load}
        assert len(offered) == 1 and offered.pop() > 0  # the same requests for every system
    low = {row["offered"] for row in r["rows"] if row["load"] == 1.0}.pop()
    high = {row["offered"] for row in r["rows"] if row["load"] == 2.0}.pop()
    assert 1.7 < high / low < 2.3  # the load factor scales the trace
    assert r["plan"]["gpus"] >= 1 and r["offered_rps"] > 0
    # only headrace refuses; the baselines answer everything, late or not
    assert all(row["rejected"] == 0 for row in r["rows"] if row["system"] != "headrace")
