"""Placement for accuracy: the most accurate answers within a GPU or cost budget, and the fewest
GPUs whose answers meet a mean-accuracy floor, with the answers split as the gateway fills
variants (most accurate to its capacity, the rest overflowing to cheaper ones)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.cli import main
from placement.diff import replan
from placement.plan import (
    Demand,
    GpuClass,
    GpuPlan,
    Inventory,
    Plan,
    PlanError,
    Replica,
    SlicePlan,
    fill_split,
)
from placement.solve.capacity import replica_capacity
from placement.solve.solver import SolverError, solve
from profiles.catalogue import layouts
from profiles.profile import LatencyPoint, Profile, ProfileSet

RESNET, VIT = "imagenet-resnet50", "imagenet-vit-b16"
ACC = {RESNET: 0.7613, VIT: 0.81072}
REFERENCE = ProfileSet.reference()


def imagenet(rate: float, slo: float = 0.2, **kw) -> Demand:
    return Demand("imagenet", rate, slo, headroom=1.1, **kw)


def a100s(n: int = 4, cost: float = 1.0, **kw) -> Inventory:
    return Inventory((GpuClass("A100-80GB", tuple(f"n0/gpu{i}" for i in range(n)), cost),), **kw)


def served(plan: Plan, model: str = "imagenet") -> dict[str, float]:
    return {v: r for v, r in plan.split(model).items() if r > 1e-6}


def check(plan: Plan) -> None:
    """The plan is legal, serves every expected rate, and keeps its budget."""
    plan.verify()
    for d in plan.demands:
        assert plan.capacity(d.model) >= d.required - 1e-6
        assert sum(plan.split(d.model).values()) == pytest.approx(d.rate)
    inv = plan.inventory
    assert inv.max_gpus is None or plan.gpu_count <= inv.max_gpus
    assert inv.max_cost_per_hour is None or plan.cost_per_hour <= inv.max_cost_per_hour + 1e-9


# ------------------------------------------------------------------ the split


def test_the_split_fills_the_most_accurate_variant_first_and_unknown_accuracy_last():
    split = fill_split(100, [("cheap", 0.7, 80), ("mystery", None, 500), ("best", 0.9, 60)])
    assert split == {"best": 60, "cheap": 40, "mystery": 0}
    # NOTE: what no variant can take stays unserved; verify() reports it as a capacity violation
    assert sum(fill_split(100, [("a", 0.7, 30)]).values()) == 30


# ------------------------------------------------------------------ objective accuracy, reference family


@settings(max_examples=12, deadline=None)
@given(rate=st.floats(100, 3000))
def test_a_bigger_budget_never_gives_a_lower_mean_accuracy(rate: float):
    means = []
    for budget in (1, 2, 3, 4):
        try:
            plan = solve([imagenet(rate)], REFERENCE, a100s(objective="accuracy", max_gpus=budget), "milp")
        except SolverError:
            assert not means, f"{budget} GPUs fail where {budget - 1} fit"
            continue
        check(plan)
        means.append(plan.mean_accuracy())
    assert means, f"no budget serves {rate:g} req/s"
    assert all(b >= a - 1e-6 for a, b in itertools.pairwise(means)), means


def test_a_budget_that_fits_only_the_cheap_variant_gets_only_the_cheap_variant():
    # 3000 req/s x 1.1 needs the whole GPU as one 7g ResNet-50 (3368 req/s): no room for ViT
    plan = solve([imagenet(3000)], REFERENCE, a100s(objective="accuracy", max_gpus=1), "milp")
    check(plan)
    assert {r.variant for _, _, r in plan.replicas()} == {RESNET}
    assert plan.mean_accuracy() == pytest.approx(ACC[RESNET])


def test_a_generous_budget_answers_everything_with_the_accurate_variant():
    plan = solve([imagenet(1000)], REFERENCE, a100s(objective="accuracy", max_gpus=4), "milp")
    check(plan)
    assert served(plan) == {VIT: pytest.approx(1000)}
    assert plan.mean_accuracy() == pytest.approx(ACC[VIT])
    assert plan.gpu_count == 3  # NOTE: then the fewest GPUs: 1100 req/s of ViT fit in 3, not 4
    assert plan.gap == 0.0


def test_a_budget_between_mixes_the_variants_and_is_proven_optimal():
    plan = solve([imagenet(1000)], REFERENCE, a100s(objective="accuracy", max_gpus=2), "milp")
    check(plan)
    split = served(plan)
    assert set(split) == {VIT, RESNET}
    assert ACC[RESNET] < plan.mean_accuracy() < ACC[VIT]
    assert plan.accuracy_bound == pytest.approx(plan.mean_accuracy(), abs=1e-6)


def test_a_cost_budget_buys_what_the_same_number_of_gpus_does():
    by_gpus = solve([imagenet(1000)], REFERENCE, a100s(objective="accuracy", max_gpus=2), "milp")
    by_cost = solve([imagenet(1000)], REFERENCE, a100s(cost=2.5, objective="accuracy", max_cost_per_hour=5.0), "milp")
    check(by_cost)
    assert by_cost.inventory.unit == "cost"
    assert by_cost.mean_accuracy() == pytest.approx(by_gpus.mean_accuracy(), abs=1e-6)


def test_the_greedy_keeps_the_budget_and_is_never_more_accurate_than_the_milp():
    for budget in (1, 2, 3):
        inv = a100s(objective="accuracy", max_gpus=budget)
        greedy, exact = solve([imagenet(1000)], REFERENCE, inv, "greedy"), solve([imagenet(1000)], REFERENCE, inv, "milp")
        check(greedy)
        assert greedy.mean_accuracy() <= exact.mean_accuracy() + 1e-9
    # with room for all of it, the greedy upgrades the whole model
    assert served(solve([imagenet(1000)], REFERENCE, a100s(objective="accuracy", max_gpus=3), "greedy")) == {
        VIT: pytest.approx(1000)}


def test_a_budget_too_small_for_the_rate_says_what_serving_it_needs():
    with pytest.raises(SolverError, match=r"within max_gpus 1 .*at least 2 GPUs"):
        solve([imagenet(5000)], REFERENCE, a100s(objective="accuracy", max_gpus=1), "milp")


def test_unknown_accuracy_counts_zero_and_serves_only_the_overflow():
    known = fake("m", "2g.12gb", "known", 8.0, 4.0, 0.8)
    mystery = fake("m", "2g.12gb", "mystery", 2.0, 1.0, None)
    cap = replica_capacity(known, 0.1).rate
    assert replica_capacity(mystery, 0.1).rate > 1.5 * cap
    pool = (GpuClass("A30-24GB", ("a/gpu0", "a/gpu1"), 1.0, True, False),)
    d = Demand("m", 2.5 * cap, 0.1)
    # one GPU holds two 2g slices: two known replicas fall short, so one runs the unknown variant
    tight = solve([d], ProfileSet([known, mystery]), Inventory(pool, "accuracy", max_gpus=1), "milp")
    check(tight)
    assert served(tight, "m") == {"known": pytest.approx(cap), "mystery": pytest.approx(1.5 * cap)}
    assert tight.mean_accuracy("m") == pytest.approx(0.8 / 2.5)  # NOTE: the unknown answers count 0
    roomy = solve([d], ProfileSet([known, mystery]), Inventory(pool, "accuracy", max_gpus=2), "milp")
    check(roomy)
    assert served(roomy, "m") == {"known": pytest.approx(2.5 * cap)}


# ------------------------------------------------------------------ mean-accuracy floor


def test_a_mean_floor_needs_fewer_gpus_than_the_same_floor_on_every_variant():
    mean = solve([imagenet(1000)], REFERENCE, a100s(mean_accuracy_floor=0.79), "milp")
    check(mean)
    assert mean.mean_accuracy() >= 0.79 - 1e-6
    every = solve([imagenet(1000, accuracy_floor=0.79)], REFERENCE, a100s(), "milp")
    assert (mean.gpu_count, every.gpu_count) == (2, 3)
    greedy = solve([imagenet(1000)], REFERENCE, a100s(mean_accuracy_floor=0.79), "greedy")
    check(greedy)  # whole-model upgrades: legal, not minimal
    assert greedy.gpu_count >= mean.gpu_count


def test_a_floor_above_every_variant_names_the_model():
    with pytest.raises(SolverError, match="model imagenet: mean_accuracy_floor 0.9 is out of reach"):
        solve([imagenet(100)], REFERENCE, a100s(mean_accuracy_floor=0.9), "milp")


A30_SLICES = {"1g.6gb": 4.0, "2g.12gb": 2.0, "4g.24gb": 1.0}  # slowdown against the whole GPU


def fake(model: str, slice_: str, variant: str, a_ms: float, c_ms: float, accuracy: float | None,
         gpu: str = "A30-24GB") -> Profile:
    """t(b) = a + c*b ms on ``slice_``, p99 = p50."""
    pts = tuple(LatencyPoint(b, (a_ms + c_ms * b) / 1e3, (a_ms + c_ms * b) / 1e3) for b in (1, 32))
    return Profile(model, variant, gpu, slice_, 32, pts, 1000.0, accuracy, 0.1)


def a30_family() -> ProfileSet:
    """A cheap variant and one four times slower and 20 points more accurate, on every A30 slice."""
    return ProfileSet([fake("m", s, v, a * k, c * k, acc) for s, k in A30_SLICES.items()
                       for v, a, c, acc in (("small", 2.0, 1.0, 0.7), ("big", 8.0, 4.0, 0.9))])


def brute_force_fewest_gpus(ps: ProfileSet, d: Demand, floor: float, most: int = 3) -> int | None:
    """Every A30 layout with every slice empty or running one variant (no MPS), on 1..most GPUs:
    the fewest GPUs whose capacity covers rate x headroom with the gateway's fill meeting the floor."""
    cap = {(s, v): c.rate if (c := replica_capacity(ps.get(v, "A30-24GB", s), d.slo)) else 0.0
           for s in A30_SLICES for v in ("small", "big")}
    per_gpu = set()
    for lay in layouts("A30-24GB", with_double_memory_1g=True):
        for pick in itertools.product((None, "small", "big"), repeat=len(lay)):
            per_gpu.add((sum(cap[(i.profile, v)] for i, v in zip(lay, pick, strict=True) if v == "small"),
                         sum(cap[(i.profile, v)] for i, v in zip(lay, pick, strict=True) if v == "big")))
    for n in range(1, most + 1):
        for combo in itertools.combinations_with_replacement(sorted(per_gpu), n):
            small, big = sum(c[0] for c in combo), sum(c[1] for c in combo)
            on_big = min(big, d.rate)  # the gateway fills the accurate variant first
            if small + big >= d.required - 1e-9 and (0.9 * on_big + 0.7 * (d.rate - on_big)) / d.rate >= floor - 1e-9:
                return n
    return None


@pytest.mark.parametrize(("rate", "floor"), [(300, 0.75), (300, 0.85), (600, 0.8), (900, 0.72), (150, 0.9)])
def test_the_floor_plan_uses_the_fewest_gpus_a_brute_force_finds(rate: float, floor: float):
    ps = a30_family()
    d = Demand("m", rate, 0.1, headroom=1.1)
    want = brute_force_fewest_gpus(ps, d, floor)
    assert want is not None
    inv = Inventory((GpuClass("A30-24GB", tuple(f"a/gpu{i}" for i in range(4)), 1.0, True, False),),
                    mean_accuracy_floor=floor)
    plan = solve([d], ps, inv, "milp")
    check(plan)
    assert plan.gpu_count == want
    assert plan.mean_accuracy("m") >= floor - 1e-6


# ------------------------------------------------------------------ verification and re-planning


def _resnet_plan(inv: Inventory, gpus: int = 1) -> Plan:
    rep = Replica("imagenet", RESNET, 1.0, 256, replica_capacity(REFERENCE.get(RESNET, "A100-80GB", "7g.80gb"), 0.2).rate)
    return Plan(tuple(GpuPlan(f"n0/gpu{i}", "A100-80GB", True, (SlicePlan("7g.80gb", 0, False, (rep,)),))
                      for i in range(gpus)), (imagenet(1000),), inv, "hand", profiles=REFERENCE)


def test_verify_refuses_a_plan_below_the_floor_or_over_the_budget():
    _resnet_plan(a100s(mean_accuracy_floor=0.76)).verify()
    with pytest.raises(PlanError, match=r"\[accuracy\] model imagenet: predicted mean accuracy 0.7613 "
                                        r"\(imagenet-resnet50 1000 req/s\) < mean_accuracy_floor 0.78"):
        _resnet_plan(a100s(mean_accuracy_floor=0.78)).verify()
    with pytest.raises(PlanError, match=r"\[budget\] plan uses 2 GPUs, more than max_gpus 1"):
        _resnet_plan(a100s(objective="accuracy", max_gpus=1), gpus=2).verify()


def test_a_replan_under_a_floor_plans_the_whole_fleet_again():
    inv = a100s(mean_accuracy_floor=0.79)
    old = _resnet_plan(a100s())
    new, _ = replan(old, [imagenet(1000)], REFERENCE, inv, "milp")
    check(new)
    assert new.mean_accuracy() >= 0.79 - 1e-6


# ------------------------------------------------------------------ headrace plan


POOL = """apiVersion: headrace.dev/v1
kind: GpuPool
metadata: {{name: lab}}
spec:
{extra}  nodes:
    - name: node0
      gpus:
        - {{model: A100-80GB, count: 4}}
---
apiVersion: headrace.dev/v1
kind: ModelDeployment
metadata: {{name: imagenet}}
spec: {{model: imagenet, rate: 1000, slo_ms: 200}}
"""


def plan_cli(tmp_path: Path, capsys, extra: str, *flags: str) -> tuple[int, str, str]:
    (tmp_path / "fleet.yaml").write_text(POOL.format(extra=extra))
    rc = main(["plan", "-f", str(tmp_path / "fleet.yaml"), "--method", "milp", *flags])
    out, err = capsys.readouterr()
    return rc, out, err


def test_headrace_plan_reports_each_models_mean_accuracy_and_split(tmp_path: Path, capsys):
    rc, out, _ = plan_cli(tmp_path, capsys, "  objective: accuracy\n  max_gpus: 2\n", "--output", "yaml")
    assert rc == 0
    status = yaml.safe_load(out)["status"]
    assert (status["objective"], status["max_gpus"], status["gpus"]) == ("accuracy", 2, 2)
    m = status["models"][0]
    assert set(m["split_rps"]) == {VIT, RESNET} and sum(m["split_rps"].values()) == pytest.approx(1000, abs=0.2)
    assert ACC[RESNET] < m["mean_accuracy"] == status["mean_accuracy"] < ACC[VIT]
    rc, out, _ = plan_cli(tmp_path, capsys, "", "--objective", "accuracy", "--max-gpus", "4", "--output", "table")
    assert rc == 0 and "objective accuracy, max 4 GPUs" in out and "0.8107" in out


@pytest.mark.parametrize(("extra", "flags", "want"), [
    ("  max_gpus: 2\n", (), "document 0: spec: max_gpus (2) is a budget for objective accuracy, not 'gpus'"),
    ("  objective: accuracy\n  max_gpus: 9\n", (), "spec: max_gpus (9) exceeds the pool's 4 GPUs"),
    ("  mean_accuracy_floor: 1.5\n", (), "spec.mean_accuracy_floor: Input should be less than or equal to 1 (got 1.5)"),
    ("", ("--objective", "accuracy", "--max-gpus", "0"),
     "--objective, --max-gpus on GpuPool lab: spec.max_gpus: Input should be greater than or equal to 1 (got 0)"),
])
def test_a_bad_budget_or_floor_is_one_line_naming_the_field(tmp_path: Path, capsys, extra: str,
                                                            flags: tuple[str, ...], want: str):
    rc, out, err = plan_cli(tmp_path, capsys, extra, *flags)
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and want in err, err
