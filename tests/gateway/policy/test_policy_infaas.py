"""The INFaaS baseline objective (``infaas``): of the variants meeting a request's floor whose
profiled latency meets its SLO, the cheapest not overloaded; the cheapest when all are; never
an admission refusal by prediction."""

from __future__ import annotations

from dataclasses import replace

from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.selector import infaas_pick
from gateway.policy.types import Request
from tests.policy_builders import fake_profile, replica

# (name, a_ms, c_ms, accuracy, price per hour): bigger is slower, more accurate and dearer
FAMILY = [("r152", 12.0, 3.0, 0.78, 4.0), ("r50", 6.0, 1.5, 0.76, 2.0), ("r18", 2.0, 0.5, 0.70, 1.0)]


def fleet() -> EdfScheduler:
    core = EdfScheduler(SchedulerConfig(wait=False))
    for name, a, c, acc, price in FAMILY:
        info = replica(f"{name}-0", fake_profile(a_ms=a, c_ms=c, max_batch=16, variant=name, accuracy=acc),
                       max_batch=16)
        core.add_replica(replace(info, price_per_hour=price, objective="infaas"), 0.0)
    return core


def chosen(core: EdfScheduler, now: float = 0.0) -> dict[int, str]:
    return {r.id: b.variant for b in core.poll(now).batches for r in b.requests}


def test_the_pick_is_the_cheapest_within_the_slo_that_is_not_overloaded() -> None:
    alone = {"cheap": 0.005, "mid": 0.010, "slow": 0.200}.__getitem__
    cap = {"cheap": 100.0, "mid": 100.0, "slow": 100.0}.__getitem__
    order = ["slow", "cheap", "mid"]  # cheapest first
    assert infaas_pick(order, alone, {"slow": 0, "cheap": 0, "mid": 0}.__getitem__, cap, 0.1) == "cheap"
    assert infaas_pick(order, alone, {"slow": 0, "cheap": 150, "mid": 0}.__getitem__, cap, 0.1) == "mid"
    # NOTE: every variant within the SLO overloaded: INFaaS still serves on the cheapest of them
    assert infaas_pick(order, alone, {"slow": 0, "cheap": 150, "mid": 150}.__getitem__, cap, 0.1) == "cheap"
    assert infaas_pick(order, alone, lambda v: 0.0, cap, 0.001) is None


def test_a_floor_takes_the_cheapest_meeting_it_until_that_variant_is_overloaded() -> None:
    core = fleet()
    # r50 sustains 16 rows per 30 ms (533/s); 30 requests at t=0 read as 600/s over the 50 ms least span
    for i in range(30):
        assert core.submit(Request(i, "m", 0.0, 1.0, accuracy_floor=0.75), 0.0) is None
    assert core.submit(Request(30, "m", 0.0, 1.0, accuracy_floor=0.75), 0.0) is None
    assert core.submit(Request(31, "m", 0.0, 1.0), 0.0) is None
    got = chosen(core)  # each replica's first batch
    assert [i for i, v in got.items() if v == "r50"] == list(range(16))
    assert got[30] == "r152" and got[31] == "r18"  # the floor is never broken; no floor: the cheapest


def test_nothing_is_refused_by_prediction_only_by_profile() -> None:
    core = fleet()
    # 200 requests of 40 ms SLO on r152 alone (floor 0.77): headrace-cost would refuse those its queue cannot
    # finish in time; INFaaS queues every one (the batcher answers the late ones)
    assert all(core.submit(Request(i, "m", 0.0, 0.04, accuracy_floor=0.77), 0.0) is None for i in range(200))
    rj = core.submit(Request(200, "m", 0.0, 0.010, accuracy_floor=0.77), 0.0)  # r152 alone takes 15 ms
    assert rj is not None and rj.reason == "infeasible" and "profiled" in rj.message
