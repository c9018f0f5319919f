"""Variant selection: the most accurate variant that meets the deadline and the accuracy
floor; cheaper variants first under sustained overload, with hysteresis."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.selector import (
    Level,
    VariantInfo,
    candidate_order,
    choose,
    fallback_spare,
    next_level,
)
from gateway.policy.types import Request
from loadgen.sim.simulator import SimReplica, Simulator
from tests.policy_builders import fake_profile, replica

BIG = fake_profile(a_ms=20, c_ms=4, max_batch=16, variant="big", accuracy=0.80)  # 16 / 84 ms = 190 req/s
SMALL = fake_profile(a_ms=4, c_ms=1, max_batch=16, variant="small", accuracy=0.70)


def two_variants(**kw) -> EdfScheduler:
    s = EdfScheduler(SchedulerConfig(**kw))
    s.add_replica(replica("big0", BIG, max_batch=16), 0.0)
    s.add_replica(replica("small0", SMALL, max_batch=16), 0.0)
    return s


def test_most_accurate_variant_that_meets_the_deadline() -> None:
    s = two_variants()
    s.submit(Request(1, "m", 0.0, 0.1), 0.0)  # big: 24 ms alone -> fine
    s.submit(Request(2, "m", 0.0, 0.010), 0.0)  # big cannot (24 ms), small can (5 ms)
    d = s.poll(0.0)
    assert {(b.variant, tuple(r.id for r in b.requests)) for b in d.batches} == {("big", (1,)), ("small", (2,))}


def test_accuracy_floor_is_respected_or_rejected_with_reason() -> None:
    s = two_variants()
    rej = s.submit(Request(1, "m", 0.0, 0.010, accuracy_floor=0.75), 0.0)
    assert rej is not None and rej.reason == "infeasible"  # only big qualifies and it is too slow
    rej = s.submit(Request(2, "m", 0.0, 1.0, accuracy_floor=0.9), 0.0)
    assert rej is not None and "accuracy floor 0.9" in rej.message


def test_candidate_order_and_level() -> None:
    vs = [VariantInfo("s", 0.7, 300), VariantInfo("b", 0.8, 100), VariantInfo("u", None, 500)]
    assert candidate_order(vs, None, Level()) == ["b", "s", "u"]
    assert candidate_order(vs, 0.75, Level()) == ["b"]
    # one level down: cheaper first, the skipped accurate one is the last resort
    assert candidate_order(vs, None, Level(1)) == ["s", "u", "b"]
    assert candidate_order(vs, 0.75, Level(1)) == ["b"]


def test_level_moves_only_past_the_capacity_of_every_variant_with_derived_hysteresis() -> None:
    vs = [VariantInfo("b", 0.8, 100), VariantInfo("s", 0.7, 300)]  # together: 400 req/s
    kw = {"window": 1.0, "dwell": 2.0}
    assert next_level(Level(), vs, 390.0, 10.0, **kw) == Level()  # big overflows to small: no move
    lv = next_level(Level(), vs, 410.0, 10.0, **kw)
    assert lv == Level(1, 10.0)
    assert next_level(lv, vs, 30.0, 11.0, **kw) == lv  # within dwell: no move
    # back up only below 400 minus 3 sigma of a Poisson estimate over 1 s (3 * sqrt(380) = 58)
    assert next_level(lv, vs, 380.0, 13.0, **kw) == lv
    assert next_level(lv, vs, 340.0, 13.0, **kw) == Level(0, 13.0)
    assert next_level(Level(1, 0.0), vs, 1e6, 50.0, **kw).skip == 1  # no cheaper variant left


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 2000.0), st.floats(0.1, 10.0), st.floats(0.5, 5.0))
def test_under_a_steady_load_the_level_moves_at_most_once_per_dwell(rate: float, window: float, dwell: float) -> None:
    vs = [VariantInfo("b", 0.8, 100), VariantInfo("m", 0.75, 200), VariantInfo("s", 0.7, 300)]
    lv, moves, t = Level(), [], 0.0
    while t < 20 * dwell:
        new = next_level(lv, vs, rate, t, window=window, dwell=dwell)
        if new != lv:
            moves.append(t)
        lv, t = new, t + dwell / 7
    assert all(b - a >= dwell for a, b in zip(moves, moves[1:], strict=False))
    # a steady load never turns back: the level only walks one way
    assert len(moves) <= len(vs) - 1


def test_overload_of_the_accurate_variant_overflows_to_the_cheaper_one_and_back() -> None:
    # 6 s at 250 req/s (above big's capacity of 190, below both together), then 6 s at 40 req/s
    rng = np.random.default_rng(0)
    t1 = np.cumsum(rng.exponential(1 / 250, 1500))
    t2 = t1[-1] + np.cumsum(rng.exponential(1 / 40, 240))
    reqs = [Request(i, "m", float(t), float(t) + 0.15) for i, t in enumerate(np.concatenate([t1, t2]))]
    core = EdfScheduler(SchedulerConfig(variant_dwell_s=1.0))
    reps = [SimReplica(replica("big0", BIG, max_batch=16)), SimReplica(replica("small0", SMALL, max_batch=16))]
    res = Simulator(core, reps, service="p99").run(reqs)
    assert res.unanswered == 0

    def shares(lo: float, hi: float) -> tuple[float, float]:
        rs = [r for r in res.records if lo <= r.arrival < hi]
        served = [r for r in rs if r.variant]
        return sum(r.variant == "small" for r in served) / len(served), len(served) / len(rs)

    end1 = float(t1[-1])
    small, answered = shares(2.0, end1)
    # overload of big alone: big runs near its capacity, the rest overflows to small; nothing is lost
    assert 0.1 < small < 0.5 and answered > 0.99
    assert shares(end1 + 3.0, end1 + 6.0)[0] < 0.05  # load fell: all on the accurate one
    assert core.level("m") == 0


def test_the_spare_is_the_least_time_any_later_fallback_needs_and_zero_under_cost() -> None:
    alone = {"a": 30.0, "b": 8.0, "c": 12.0}.__getitem__
    assert fallback_spare(["a", "b", "c"], alone) == [8.0, 12.0, 0.0]
    assert fallback_spare(["c", "a"], alone) == [30.0, 0.0]
    assert fallback_spare(["a", "b", "c"], alone, objective="cost") == [0.0, 0.0, 0.0]
    assert fallback_spare(["a", "b", "c"], alone, cheapest=True) == [0.0, 0.0, 0.0]
    assert fallback_spare(["a"], alone) == [0.0]


def test_choose_takes_the_first_with_its_spare_else_the_first_in_time_else_none() -> None:
    finish = {"a": (0.095, True), "b": (0.050, True), "c": (0.200, True)}
    plan = finish.__getitem__
    # a would finish in time but not 10 ms early; b would, with no spare needed (last fallback)
    assert choose(["a", "b"], plan, 0.1, [0.010, 0.0]) == ("b", 0.050)
    # with a spare a meets, a is taken
    assert choose(["a", "b"], plan, 0.1, [0.004, 0.0]) == ("a", 0.095)
    # nobody meets its spare: the first in time is taken, so the spare never refuses
    assert choose(["a", "c"], plan, 0.1, [0.010, 0.0]) == ("a", 0.095)
    # admission's other rules (the bool) veto a variant; nothing in time: none, with the earliest finish
    assert choose(["a", "c"], {"a": (0.095, False), "c": (0.2, True)}.__getitem__, 0.1, [0.0, 0.0]) == (None, 0.095)


def test_under_accuracy_the_accurate_variant_keeps_room_for_its_fallback() -> None:
    # BIG answers one request alone in 24 ms, SMALL in 5 ms: a request BIG can only finish
    # within 5 ms of its deadline goes to SMALL, where it finishes with time to spare
    s = two_variants()
    assert s.submit(Request(1, "m", 0.0, 0.027), 0.0) is None  # big: 24 ms, 3 ms to spare < 5
    assert s.submit(Request(2, "m", 0.0, 0.040), 0.0) is None  # big: 24 ms, 16 ms to spare
    d = s.poll(0.0)
    assert {r.id: b.variant for b in d.batches for r in b.requests} == {1: "small", 2: "big"}
    # with SMALL gone, the same request takes BIG rather than be refused
    t = EdfScheduler(SchedulerConfig())
    t.add_replica(replica("big0", BIG, max_batch=16), 0.0)
    assert t.submit(Request(3, "m", 0.0, 0.027), 0.0) is None
    assert {r.id: b.variant for b in t.poll(0.0).batches for r in b.requests} == {3: "big"}
