"""Variant selection: the most accurate variant that meets the deadline and the accuracy
floor; cheaper variants first under sustained overload, with hysteresis."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.selector import Level, VariantInfo, candidate_order, next_level
from gateway.policy.types import Request
from loadgen.sim import SimReplica, Simulator
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


def test_level_moves_with_hysteresis_and_dwell() -> None:
    vs = [VariantInfo("b", 0.8, 100), VariantInfo("s", 0.7, 300)]
    kw = {"high": 0.9, "low": 0.7, "dwell": 2.0}
    lv = next_level(Level(), vs, 95.0, 10.0, **kw)
    assert lv == Level(1, 10.0)
    assert next_level(lv, vs, 30.0, 11.0, **kw) == lv  # within dwell: no move
    assert next_level(lv, vs, 80.0, 13.0, **kw) == lv  # between low and high: stay (no flapping)
    assert next_level(lv, vs, 60.0, 13.0, **kw) == Level(0, 13.0)
    assert next_level(Level(1, 0.0), vs, 1e6, 50.0, **kw).skip == 1  # no cheaper variant left


def test_hysteresis_thresholds_are_validated() -> None:
    with pytest.raises(ValidationError, match=r"variant_low_load \(0.9\) must be below variant_high_load \(0.8\)"):
        SchedulerConfig(variant_low_load=0.9, variant_high_load=0.8)


def test_sustained_overload_shifts_to_the_cheaper_variant_and_back() -> None:
    # 6 s at 250 req/s (above big's capacity of 190), then 6 s at 40 req/s
    rng = np.random.default_rng(0)
    t1 = np.cumsum(rng.exponential(1 / 250, 1500))
    t2 = t1[-1] + np.cumsum(rng.exponential(1 / 40, 240))
    reqs = [Request(i, "m", float(t), float(t) + 0.15) for i, t in enumerate(np.concatenate([t1, t2]))]
    core = EdfScheduler(SchedulerConfig(variant_dwell_s=1.0))
    reps = [SimReplica(replica("big0", BIG, max_batch=16)), SimReplica(replica("small0", SMALL, max_batch=16))]
    res = Simulator(core, reps, service="p99").run(reqs)
    assert res.unanswered == 0

    def share_small(lo: float, hi: float) -> float:
        rs = [r for r in res.records if lo <= r.arrival < hi and r.variant]
        return sum(r.variant == "small" for r in rs) / len(rs)

    end1 = float(t1[-1])
    assert share_small(2.0, end1) > 0.6  # overload: most traffic on the cheaper variant
    assert share_small(end1 + 3.0, end1 + 6.0) < 0.2  # load fell: back to the accurate one
    assert core.level("m") == 0
