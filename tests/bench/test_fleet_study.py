"""The fleet study compares batch policies on one plan and one arrival trace."""

from __future__ import annotations

import pytest

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
    # only headrace refuses at arrival; the baselines reject at most what times out in their queue
    assert all(row["rejected"] == 0 for row in r["rows"] if row["system"] != "headrace")
    assert all(row["expired"] == 0 for row in r["rows"] if "no queue policy" in row["system"])


def test_the_autoscaled_day_follows_the_operator_autoscaler_one_epoch_late() -> None:
    import numpy as np

    from bench.fleet_autoscale import autoscaled_rates

    rates = {"m": np.array([100.0, 100.0, 300.0, 300.0, 20.0, 20.0, 20.0, 20.0])}
    plan = [r["m"] for r in autoscaled_rates(rates, {"m": 1.0})]
    assert plan[:3] == [100.0, 100.0, 100.0]  # epoch 2's rise is seen only after it
    assert plan[3] == pytest.approx(300 / 0.7)  # re-planned at max / target utilization
    # below half the plan from epoch 4: down once the 2-epoch delay has passed, at 20 / 0.7
    assert plan[4:7] == [pytest.approx(300 / 0.7)] * 3
    assert plan[7] == pytest.approx(20 / 0.7)
