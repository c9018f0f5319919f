"""No division by zero anywhere a rate reaches: the planner, the re-planning diff and the
autoscaler, over rates 0..1e6 and the edges of headroom and SLO the schema allows. Each either
answers or raises its documented error (:class:`SolverError` for a demand the pool cannot
hold); a model at rate 0 is still planned one replica, so it stays addressable."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement.autoscale import initial, step
from placement.diff import diff, replan
from placement.plan import Demand, GpuClass, Inventory, Plan, PlanError
from placement.solve.solver import SolverError, solve
from profiles.profile import ProfileSet
from profiles.schema import AutoscalingSpec

# the schema's bounds (ModelDeploymentSpec): rate >= 0, 1 <= headroom <= 10, 0 < slo_ms <= 600,000
RATES = st.one_of(st.sampled_from([0.0, 1e-9, 1e-3, 0.5, 1.0, 1e6]), st.floats(0.0, 1e6))
HEADROOMS = st.one_of(st.sampled_from([1.0, 10.0]), st.floats(1.0, 10.0))
SLOS = st.sampled_from([1e-6, 1e-3, 0.01, 0.1, 1.0, 600.0])  # seconds
MODELS = ("resnet50", "digits")


@pytest.fixture(scope="module")
def profiles() -> ProfileSet:
    from deploy.operator.desired import base_profiles

    return base_profiles()


def quickstart_pool(a100s: int = 1, objective: str = "gpus", floor: float | None = None) -> Inventory:
    """A100s (MIG and MPS allowed) and the host's cores: the quickstart's classic pool."""
    ids = tuple(f"local/gpu{i}" for i in range(a100s))
    return Inventory((GpuClass("A100-80GB", ids), GpuClass("cpu", (f"local/gpu{a100s}",), mig=False)),
                     objective, mean_accuracy_floor=floor)  # type: ignore[arg-type]


@st.composite
def demands(draw: st.DrawFn) -> list[Demand]:
    models = draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=2, unique=True))
    return [Demand(m, draw(RATES), draw(SLOS), headroom=draw(HEADROOMS),
                   accuracy_floor=draw(st.sampled_from([None, 0.0, 0.97, 1.0])),
                   priority=draw(st.sampled_from(["guaranteed", "best-effort"])),
                   min_replicas=draw(st.sampled_from([1, 1, 0])))
            for m in models]


def plan_or_none(ds: Sequence[Demand], profiles: ProfileSet, inv: Inventory, method: str) -> Plan | None:
    """The verified plan, or None where the solver says the pool cannot hold the demand (or
    the verifier finds the plan breaks a rule: the operator refuses both in one line)."""
    try:
        plan = solve(ds, profiles, inv, method)
        plan.verify()
    except (SolverError, PlanError):
        return None
    return plan


def assert_served(plan: Plan) -> None:
    # NOTE: every demanded model has a replica, so the gateway can address it, even at rate 0,
    # unless min_replicas 0 lets it scale to zero
    for d in plan.demands:
        if d.guaranteed:
            held = any(r.model == d.model for _, _, r in plan.replicas())
            assert held or (d.rate == 0 and d.min_replicas == 0), d
        if d.rate == 0:
            assert plan.headroom(d.model) == math.inf


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=demands(), new=demands(), method=st.sampled_from(["greedy", "milp"]),
       objective=st.sampled_from(["gpus", "cost", "accuracy"]), floor=st.sampled_from([None, 0.0, 0.9]))
def test_plan_replan_and_diff_never_divide_by_zero(profiles: ProfileSet, old: list[Demand], new: list[Demand],
                                                    method: str, objective: str, floor: float | None) -> None:
    inv = quickstart_pool(objective=objective, floor=floor)
    before = plan_or_none(old, profiles, inv, method)
    after = plan_or_none(new, profiles, inv, method)
    for p in (before, after):
        if p is not None:
            assert_served(p)
            p.to_dict()  # the headroom column divides by the rate
    if before is None:
        return
    try:
        planned, d = replan(before, new, profiles, inv, method)
        planned.verify()
    except (SolverError, PlanError):
        return
    assert_served(planned)
    d.capacity_dips()
    if after is not None:
        diff(before, after).capacity_dips()


@pytest.mark.parametrize("rate", [0.0, 0.1])
def test_a_model_at_rate_0_or_near_it_gets_one_replica(profiles: ProfileSet, rate: float) -> None:
    plan = solve([Demand("resnet50", rate, 0.1, headroom=1.1)], profiles, quickstart_pool())
    plan.verify()
    assert [r.model for _, _, r in plan.replicas()] == ["resnet50"]


def test_at_rate_0_with_min_replicas_0_a_model_scales_to_zero(profiles: ProfileSet) -> None:
    inv = quickstart_pool(a100s=2)
    busy = solve([Demand("resnet50", 5000, 0.1, headroom=1.1, min_replicas=0)], profiles, inv)
    idle, d = replan(busy, [Demand("resnet50", 0, 0.1, headroom=1.1, min_replicas=0)], profiles, inv)
    idle.verify()
    assert idle.replicas() == [] and not d.dips() and idle.headroom("resnet50") == math.inf
    assert solve([Demand("resnet50", 0, 0.1, min_replicas=0)], profiles, inv).replicas() == []


def test_replanning_a_busy_model_down_to_rate_0_keeps_one_replica(profiles: ProfileSet) -> None:
    inv = quickstart_pool(a100s=2)
    busy = solve([Demand("resnet50", 5000, 0.1, headroom=1.1)], profiles, inv)
    assert len(busy.replicas()) == 2
    idle, d = replan(busy, [Demand("resnet50", 0, 0.1, headroom=1.1)], profiles, inv)
    idle.verify()
    assert [r.model for _, _, r in idle.replicas()] == ["resnet50"]
    assert d.capacity_dips() == []  # NOTE: a drop to what the new demand needs is no dip
    back, _ = replan(idle, [Demand("resnet50", 5000, 0.1, headroom=1.1)], profiles, inv)
    assert back.capacity("resnet50") >= 5500


SPECS = st.builds(
    lambda up, down, below, target, cooldown, min_rate: AutoscalingSpec(
        upscale_delay_s=up, downscale_delay_s=down, downscale_below=min(below, target / 2), target_utilization=target,
        cooldown_s=cooldown, min_rate=min_rate),
    up=st.sampled_from([0.0, 1.0, 10.0, 86_400.0]), down=st.sampled_from([0.0, 7.0, 60.0]),
    below=st.sampled_from([0.0, 0.1, 0.5]), target=st.sampled_from([1e-9, 0.01, 0.7, 1.0]),
    cooldown=st.sampled_from([None, 0.0, 30.0]), min_rate=st.sampled_from([None, 0.0, 1e-3, 1e7]))


@settings(max_examples=300, deadline=None)
@given(spec=SPECS, planned=RATES, window=st.sampled_from([0.0, 1.0, 5.0]),
       observations=st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 7.0, 60.0]), RATES), min_size=1, max_size=12))
def test_the_autoscaler_step_never_divides_by_zero(spec: AutoscalingSpec, planned: float, window: float,
                                                   observations: list[tuple[float, float]]) -> None:
    now = 0.0
    state = initial(planned, now)
    for dt, rate in observations:
        now += dt
        decision, state = step(spec, state, rate, now, window_s=window)
        # NOTE: what the operator re-plans for is a finite rate >= 0, whatever was observed
        assert math.isfinite(decision.rate) and decision.rate >= 0
        assert state.planned_rate == decision.rate


def test_an_idle_deployment_scales_down_to_rate_0_once_and_then_holds() -> None:
    spec = AutoscalingSpec(downscale_delay_s=7)
    state = initial(110.0, 0.0)
    events = []
    for t in range(0, 60):
        decision, state = step(spec, state, 0.0, float(t))
        if decision.direction:
            events.append((t, decision.direction, decision.rate))
    assert events == [(7, "down", 0.0)]


@pytest.mark.parametrize("objective", ["accuracy", "gpus"])
def test_a_best_effort_model_placed_short_still_meets_the_accuracy_floor(profiles: ProfileSet, objective: str) -> None:
    # at 1e6 req/s digits is placed short: every replica then serves at capacity, so a cheap
    # inaccurate replica the program counted at part of its capacity pulled the mean below 0.9
    plan = solve([Demand("digits", 1e6, 0.1, priority="best-effort")], profiles,
                 quickstart_pool(objective=objective, floor=0.9), "milp")
    plan.verify()
    assert plan.partial and (plan.mean_accuracy("digits") or 0.0) >= 0.9 - 1e-6
