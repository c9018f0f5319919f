"""The autoscaling policy, driven by an injected time sequence (no clock, no sleeps)."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from placement.autoscale import ScaleDecision, initial, step
from profiles.schema import AutoscalingSpec, ModelDeployment, format_error

PLANNED = 100.0


def times(stop: float, dt: float = 1.0, start: float = 0.0) -> list[float]:
    """Observation times start, start + dt, ... < stop (multiplied, never accumulated)."""
    return [start + i * dt for i in range(math.ceil((stop - start) / dt))]


def drive(spec: AutoscalingSpec, load: Callable[[float], float], ts: Sequence[float],
          planned: float = PLANNED) -> list[tuple[float, ScaleDecision]]:
    """Feed ``load(t)`` at each time in ``ts`` and return every (time, decision)."""
    state = initial(planned, ts[0])
    out = []
    for t in ts:
        decision, state = step(spec, state, load(t), t)
        out.append((t, decision))
    return out


def events(trace: list[tuple[float, ScaleDecision]]) -> list[tuple[float, ScaleDecision]]:
    return [(t, d) for t, d in trace if d.direction is not None]


def noisy(level: float, noise: float, seed: int) -> Callable[[float], float]:
    """A steady load at ``level`` req/s, each observation off by up to +-``noise`` (a fraction)."""
    rng = random.Random(seed)
    return lambda t: level * (1 + rng.uniform(-noise, noise))


@pytest.mark.parametrize("dt", [1.0, 0.7, 3.0])
def test_load_step_scales_up_once_at_first_observation_after_delay(dt: float) -> None:
    spec = AutoscalingSpec()
    ts = times(200, dt)
    trace = drive(spec, lambda t: 3 * PLANNED if t >= 5 else PLANNED, ts)
    first_high = next(t for t in ts if t >= 5)
    due = next(t for t in ts if t - first_high >= spec.upscale_delay_s)

    ups = events(trace)
    assert [d.direction for _, d in ups] == ["up"]
    t_up, up = ups[0]
    assert t_up == due
    assert up.rate >= 3 * PLANNED
    assert "upscale_delay_s 10" in up.reason and "> planned 100 req/s" in up.reason


def test_load_step_on_whole_seconds_scales_up_exactly_at_delay() -> None:
    trace = drive(AutoscalingSpec(), lambda t: 3 * PLANNED if t >= 5 else PLANNED, times(100))
    assert [(t, d.direction) for t, d in events(trace)] == [(15.0, "up")]


def test_load_falling_back_scales_down_once_after_delay_then_holds() -> None:
    spec = AutoscalingSpec()
    trace = drive(spec, lambda t: 3 * PLANNED if 5 <= t < 100 else PLANNED, times(2000))

    assert [(t, d.direction) for t, d in events(trace)] == [(15.0, "up"), (100.0 + 60.0, "down")]
    _, down = events(trace)[1]
    # NOTE: the rate planned after a down event still covers the load, inside the band
    assert down.rate * spec.downscale_below < PLANNED < down.rate


def test_rising_ramp_is_covered_by_the_max_over_the_delay() -> None:
    spec = AutoscalingSpec()
    trace = drive(spec, lambda t: PLANNED + 10 * t, times(20))  # above planned from t=1
    (t_up, up), = events(trace)
    assert t_up == 11.0
    # NOTE: the new rate covers the top of the ramp seen so far, not its start
    assert up.rate >= PLANNED + 10 * t_up


@pytest.mark.parametrize(("peak", "tail"), [(3.0, 1.5), (0.45, 0.05)])
def test_new_rate_covers_the_peak_of_the_run_not_its_last_observation(peak: float, tail: float) -> None:
    trace = drive(AutoscalingSpec(), lambda t: PLANNED * (peak if t < 3 else tail), times(100))
    first = events(trace)[0][1]
    assert first.direction == ("up" if peak > 1 else "down")
    assert first.rate >= peak * PLANNED


@pytest.mark.parametrize("level", [3.0, 0.2])
def test_excursion_shorter_than_delay_resets_the_timer(level: float) -> None:
    spec = AutoscalingSpec()
    delay = spec.upscale_delay_s if level > 1 else spec.downscale_delay_s
    period = delay + 1.0  # `delay` seconds outside the band (elapsed delay - 1), one back inside

    def load(t: float) -> float:
        return PLANNED * (level if t % period < delay else 0.8)

    trace = drive(spec, load, times(20 * period))
    # NOTE: every excursion lasts delay - 1 s, so a timer that survives the dip would fire
    assert events(trace) == []


@settings(max_examples=150, deadline=None)
@given(level=st.floats(0.2, 3.0), noise=st.floats(0.0, 0.1), seed=st.integers(0, 2**32 - 1))
def test_steady_noisy_load_never_flaps(level: float, noise: float, seed: int) -> None:
    spec = AutoscalingSpec()
    trace = drive(spec, noisy(level * PLANNED, noise, seed), times(1200))
    found = events(trace)
    # NOTE: a steady load may need one event to settle, never a second
    assert len(found) <= 1
    low, high = level * (1 - noise), level * (1 + noise)
    if spec.downscale_below < low and high <= 1:
        # NOTE: a load whose whole noise band lies inside the planned band never moves the plan
        assert found == []


@settings(max_examples=100, deadline=None)
@given(level=st.floats(0.2, 0.95), noise=st.floats(0.0, 0.1), seed=st.integers(0, 2**32 - 1))
def test_steady_noisy_load_after_settling_produces_no_event(level: float, noise: float, seed: int) -> None:
    spec = AutoscalingSpec()
    low, high = level * (1 - noise), level * (1 + noise)
    # a load whose noise straddles a threshold crosses it for a full delay sooner or later: an
    # event then is the policy working, not flapping
    assume(not (low < spec.downscale_below <= high) and not (low <= 1 < high))
    load = noisy(level * PLANNED, noise, seed)
    settle = drive(spec, load, times(300))
    planned = next((d.rate for _, d in reversed(events(settle))), PLANNED)
    assert events(drive(spec, load, times(3000, start=300), planned)) == []


@pytest.mark.parametrize("seed", range(5))
def test_step_up_and_back_makes_one_event_per_direction(seed: int) -> None:
    spec = AutoscalingSpec()
    rng = random.Random(seed)

    def load(t: float) -> float:
        base = 3 * PLANNED if 50 <= t < 600 else PLANNED
        return base * (1 + rng.uniform(-0.05, 0.05))

    trace = drive(spec, load, times(5000, dt=2.5))
    assert [d.direction for _, d in events(trace)] == ["up", "down"]


def test_cooldown_delays_an_opposite_event() -> None:
    spec = AutoscalingSpec(upscale_delay_s=1, downscale_delay_s=1, cooldown_s=30)

    def load(t: float) -> float:
        return PLANNED * (1.0 if t < 5 else 3.0 if t < 8 else 0.1)

    trace = drive(spec, load, times(100))
    found = [(t, d.direction) for t, d in events(trace)]
    assert found[0] == (6.0, "up")
    assert found[1] == (36.0, "down")  # due at t=9, held until 30 s after the up
    assert len(found) == 2


def test_same_direction_is_not_held_by_cooldown() -> None:
    spec = AutoscalingSpec(upscale_delay_s=1, cooldown_s=1000)
    trace = drive(spec, lambda t: PLANNED * 2 ** t, times(12))
    assert len(events(trace)) > 1
    assert all(d.direction == "up" for _, d in events(trace))


def test_downscale_stops_at_min_rate() -> None:
    spec = AutoscalingSpec(min_rate=80.0, min_replicas=2, max_replicas=8)
    trace = drive(spec, lambda t: 1.0, times(1000))
    found = events(trace)
    assert [(d.direction, d.rate) for _, d in found] == [("down", 80.0)]
    assert (found[0][1].min_replicas, found[0][1].max_replicas) == (2, 8)
    assert "min_rate" in trace[-1][1].reason


def test_no_event_keeps_the_current_rate() -> None:
    decision, _ = step(AutoscalingSpec(), initial(PLANNED, 0.0), 70.0, 1.0)
    assert decision.direction is None and decision.rate == PLANNED


@pytest.mark.parametrize(("kwargs", "field", "value"), [
    ({"upscale_delay_s": -1.0}, "upscale_delay_s", "-1.0"),
    ({"downscale_delay_s": math.nan}, "downscale_delay_s", "nan"),
    ({"cooldown_s": -5.0}, "cooldown_s", "-5.0"),
    ({"min_rate": -1.0}, "min_rate", "-1.0"),
    ({"downscale_below": 1.0}, "downscale_below", "1.0"),
    ({"downscale_below": -0.1}, "downscale_below", "-0.1"),
    ({"downscale_below": 0.8}, "downscale_below", "0.8"),  # above target_utilization 0.7
    ({"target_utilization": 0.0}, "target_utilization", "0.0"),
    ({"target_utilization": 1.5}, "target_utilization", "1.5"),
    ({"min_replicas": -1}, "min_replicas", "-1"),
    ({"max_replicas": 0}, "max_replicas", "0"),
    ({"min_replicas": 3, "max_replicas": 2}, "max_replicas", "2"),
])
def test_invalid_spec_names_field_and_value(kwargs: dict, field: str, value: str) -> None:
    with pytest.raises(ValidationError) as e:
        AutoscalingSpec(**kwargs)
    assert re.search(rf"\b{field}\b.*(\(got {value}\)|\({value}\))", format_error(e.value, "autoscaling"))


def test_cross_field_error_quotes_both_values() -> None:
    with pytest.raises(ValueError, match=r"downscale_below \(0\.8\).*target_utilization \(0\.7\)"):
        AutoscalingSpec(downscale_below=0.8)


@pytest.mark.parametrize(("rate", "now", "match"), [
    (-1.0, 1.0, r"observed_rate \(-1\.0\)"),
    (math.inf, 1.0, r"observed_rate \(inf\)"),
    (10.0, 4.0, r"now \(4\.0\).*\(5\.0\)"),
])
def test_invalid_observation_raises(rate: float, now: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        step(AutoscalingSpec(), initial(PLANNED, 5.0), rate, now)


def test_initial_rejects_a_negative_rate() -> None:
    with pytest.raises(ValueError, match=r"planned_rate \(-3\.0\)"):
        initial(-3.0, 0.0)


def test_a_windowed_rate_scales_down_to_the_new_level_not_the_transition() -> None:
    # the observed rate is a 5 s moving mean: after a fall from 120 to 40 req/s it takes 5 s to settle
    def mean_rate(t: float) -> float:
        return 120.0 if t < 20 else 40.0 + 80.0 * max(0.0, 25.0 - t) / 5.0

    spec = AutoscalingSpec(upscale_delay_s=3, downscale_delay_s=8)
    state = initial(180.0, 0.0)
    downs = []
    for t in times(60):
        d, state = step(spec, state, mean_rate(t), t, window_s=5.0)
        if d.direction == "down":
            downs.append((t, d.rate))
    # NOTE: one event, planned for the settled 40 req/s (40 / 0.7), not the transition's 72-120
    assert len(downs) == 1 and downs[0][1] == pytest.approx(40.0 / 0.7), downs
    state, rates = initial(180.0, 0.0), []
    for t in times(60):
        d, state = step(spec, state, mean_rate(t), t)
        rates += [d.rate] if d.direction == "down" else []
    assert rates[0] > 40.0 / 0.7 + 1  # without the window the first plan keeps the transition's peak


def test_downscale_below_zero_never_scales_down() -> None:
    # NOTE: 0 is "off" for downscaling, in the policy and in the document alike
    spec = AutoscalingSpec(downscale_below=0)
    assert events(drive(spec, lambda t: 0.0, times(600))) == []
    assert events(drive(spec, lambda t: 3 * PLANNED, times(100)))[0][1].direction == "up"
    assert ModelDeployment.model_validate(
        {"kind": "ModelDeployment", "metadata": {"name": "m"},
         "spec": {"model": "m", "rate": 1, "slo_ms": 100, "autoscaling": {"downscale_below": 0}}})


def test_an_invalid_window_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError, match=r"window_s \(-1\.0\)"):
        step(AutoscalingSpec(), initial(PLANNED, 0.0), PLANNED, 1.0, window_s=-1.0)
