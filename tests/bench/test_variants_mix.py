"""bench.variants' scoring: an answer below its own request's floor is a miss whatever its
latency, and cost is busy slice time x price per answer Triton gave."""

from __future__ import annotations

import pytest

from bench.variants_mix import HIGH_FLOOR, HIGH_SHARE, LOW_FLOOR, busy_cost, floors, score
from bench.variants_step import Sent

ACC = {"vit-a": 0.8107, "r50-a": 0.7613}
VARIANT = {"vit-a": "vit", "r50-a": "r50"}


def sent(at: float, variant: str | None, latency: float = 0.01, status: int | None = None) -> Sent:
    return Sent(at, 0.0, latency, variant, status)


def test_a_floor_broken_is_a_miss_even_on_time_and_counted_apart() -> None:
    sents = [sent(0.1, "r50-a"), sent(1.0, "r50-a"), sent(1.1, "vit-a"), sent(1.2, "r50-a"),
             sent(1.3, "vit-a", latency=0.5), sent(1.4, None, status=429)]
    floor_of = [HIGH_FLOOR, HIGH_FLOOR, HIGH_FLOOR, LOW_FLOOR, LOW_FLOOR, LOW_FLOOR]
    s = score(sents, floor_of, 0.5, ACC, 0.1, VARIANT)  # the first is warm-up
    assert s["requests"] == 5 and s["attainment"] == 2 / 5
    assert s["misses"] == {"below_floor": 1, "late": 1, "refused": 1}
    assert s["high_floor_misses"] == {"below_floor": 1}
    assert s["shares"] == {"r50": 0.5, "vit": 0.5}


def test_cost_is_busy_seconds_times_price_per_answer() -> None:
    c = busy_cost({"vit-a": {"compute_s": 3.6, "rows": 100.0}, "r50-a": {"compute_s": 0.0, "rows": 100.0}}, 1.0)
    assert c["cost_per_1000"] == pytest.approx(3.6 / 3600 / 200 * 1000)


def test_the_mix_is_seeded_and_near_its_share() -> None:
    f = floors(10_000, 1)
    assert f == floors(10_000, 1) and set(f) == {HIGH_FLOOR, LOW_FLOOR}
    assert abs(f.count(HIGH_FLOOR) / len(f) - HIGH_SHARE) < 0.02
