"""Partial plans under the ``accuracy`` objective (and a mean-accuracy floor): as under the gpus
and cost objectives, guaranteed demand is placed whole within the budget and best-effort demand
that does not fit is placed in part and reported per model, never a failed plan."""

from __future__ import annotations

import pytest

from placement.plan import Demand, GpuClass, Inventory, Plan
from placement.solve.capacity import replica_capacity
from placement.solve.solver import SolverError, solve
from profiles.profile import LatencyPoint, Profile, ProfileSet

FAST, ACCURATE = 0.70, 0.80  # the two variants' accuracy


def variant(model: str, name: str, per_sample_ms: float, accuracy: float) -> Profile:
    """t(b) = 5 + per_sample_ms x b ms on a 1g.10gb slice of an A100-80GB."""
    pts = tuple(LatencyPoint(b, (5 + per_sample_ms * b) / 1e3, (5 + per_sample_ms * b) / 1e3) for b in (1, 64))
    return Profile(model, name, "A100-80GB", "1g.10gb", 64, pts, 1000.0, accuracy, 0.1)


PS = ProfileSet([p for m in ("g", "b") for p in (variant(m, f"{m}-fast", 2, FAST), variant(m, f"{m}-accurate", 4, ACCURATE))])
CAP = replica_capacity(PS.get("g-fast", "A100-80GB", "1g.10gb"), 0.1).rate  # one fast replica's req/s at 100 ms


def pool(n: int = 2, **kw) -> Inventory:
    """n A100-80GB, MIG only: seven 1g.10gb replicas per GPU."""
    return Inventory((GpuClass("A100-80GB", tuple(f"n0/gpu{i}" for i in range(n)), 2.0, True, False),), **kw)


def fast_replicas(plan: Plan, model: str) -> float:
    """The model's capacity in fast replicas' worth."""
    return plan.capacity(model) / CAP


def overfull() -> list[Demand]:
    # g needs 3 fast replicas (with headroom), b asks for 6: one GPU of 7 holds g and 4 of b's
    return [Demand("b", 5.5 * CAP, 0.1, priority="best-effort"), Demand("g", 2.5 * CAP, 0.1, headroom=1.1)]


@pytest.mark.parametrize("method", ["greedy", "milp"])
@pytest.mark.parametrize("budget", [{"max_gpus": 1}, {"max_cost_per_hour": 2.0}])
def test_a_budget_too_small_for_best_effort_gives_a_partial_plan(method, budget):
    plan = solve(overfull(), PS, pool(2, objective="accuracy", **budget), method, time_limit=10)
    plan.verify()
    assert plan.gpu_count == 1
    g, b = plan.demands[1], plan.demands[0]
    assert plan.capacity("g") >= g.required - 1e-6
    assert [s.model for s in plan.shortfall] == ["b"]
    (short,) = plan.shortfall
    # NOTE: placing best-effort req/s comes before answering more accurately: every slice is used
    assert short.placed == pytest.approx(plan.capacity("b")) and short.placed >= 3.9 * CAP
    assert short.unplaced == pytest.approx(b.required - short.placed)
    assert short.gpus == (("A100-80GB", 1),)
    assert plan.to_dict()["status"]["partial"]


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_a_pool_too_small_for_best_effort_under_the_accuracy_objective_is_partial(method):
    plan = solve(overfull(), PS, pool(1, objective="accuracy"), method, time_limit=10)
    plan.verify()
    assert [s.model for s in plan.shortfall] == ["b"] and plan.capacity("g") >= plan.demands[1].required - 1e-6


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_a_mean_accuracy_floor_on_an_overfull_pool_is_partial_and_keeps_the_floor(method):
    # the floor forces the accurate variant: g takes 6 of the 7 slices, b gets what is left
    plan = solve(overfull(), PS, pool(1, mean_accuracy_floor=ACCURATE), method, time_limit=10)
    plan.verify()
    assert [s.model for s in plan.shortfall] == ["b"]
    assert plan.mean_accuracy("g") == pytest.approx(ACCURATE)
    assert plan.mean_accuracy("b") in (None, pytest.approx(ACCURATE))


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_where_everything_fits_the_budget_buys_accuracy_and_nothing_is_short(method):
    demands = [Demand("b", CAP, 0.1, priority="best-effort"), Demand("g", CAP, 0.1)]  # 3 accurate replicas each
    plan = solve(demands, PS, pool(2, objective="accuracy", max_gpus=1), method, time_limit=10)
    plan.verify()
    assert not plan.partial
    assert plan.mean_accuracy() == pytest.approx(ACCURATE)


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_guaranteed_demand_over_the_budget_is_an_error_not_a_partial_plan(method):
    demands = [Demand("g", 9.5 * CAP, 0.1), Demand("b", CAP, 0.1, priority="best-effort")]
    with pytest.raises(SolverError, match="guaranteed"):
        solve(demands, PS, pool(2, objective="accuracy", max_gpus=1), method, time_limit=10)


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_a_best_effort_model_shed_whole_under_a_floor_is_reported_not_a_floor_violation(method):
    # g's accurate replicas take all 7 slices: b gets none, and its answers' accuracy is not asked
    # (an accurate replica serves 0.46 CAP: seven cover 2.8 CAP x 1.1, six do not)
    demands = [Demand("b", CAP, 0.1, priority="best-effort"), Demand("g", 2.8 * CAP, 0.1, headroom=1.1)]
    plan = solve(demands, PS, pool(1, mean_accuracy_floor=ACCURATE), method, time_limit=10)
    plan.verify()
    assert [(s.model, s.placed) for s in plan.shortfall] == [("b", 0.0)]


def test_headrace_plan_under_the_accuracy_objective_prints_the_partial_plan_and_exits_0(tmp_path, capsys):
    from deploy.cli import main

    pool_doc = tmp_path / "pool.yaml"
    pool_doc.write_text("apiVersion: headrace.dev/v1\nkind: GpuPool\nmetadata: {name: small}\n"
                        "spec:\n  objective: accuracy\n  max_gpus: 1\n"
                        "  nodes:\n    - name: n0\n      gpus: [{model: A100-80GB, count: 2}]\n")
    models = tmp_path / "models.yaml"
    models.write_text(
        "apiVersion: headrace.dev/v1\nkind: ModelDeployment\nmetadata: {name: imagenet}\n"
        "spec: {model: imagenet, rate: 500, slo_ms: 200}\n---\n"
        "apiVersion: headrace.dev/v1\nkind: ModelDeployment\nmetadata: {name: bert-large}\n"
        "spec: {model: bert-large, rate: 4000, slo_ms: 200, priority: best-effort}\n")
    for method in ("greedy", "milp"):
        assert main(["plan", "-f", str(pool_doc), "-f", str(models), "--method", method, "--output", "both"]) == 0
        out = capsys.readouterr().out
        assert "partial plan" in out and "bert-large" in out and "unplaced_rps" in out
