"""A replica count floor: ``Demand.min_count`` replicas in all, on any GPUs (the gateway's worker
count: each worker batches for replicas of its own), in the greedy and the MILP alike, kept by
re-plans, and reported as a :class:`FloorShortfall` where the pool has no room for it."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from deploy.operator.desired import base_profiles
from placement.diff import replan, replica_ids
from placement.plan import Demand, GpuClass, Inventory, Plan, drop_replica
from placement.solve.candidates import SolverError
from placement.solve.solver import solve
from profiles.profile import ProfileSet

METHODS = ("greedy", "milp")
A100 = "local/gpu0"


@pytest.fixture(scope="module")
def profiles() -> ProfileSet:
    return base_profiles()


def quickstart(**a100: Any) -> Inventory:
    """The quickstart's pool less its H100: one emulated A100-80GB (MIG and MPS allowed unless
    ``a100`` says otherwise) and the host's cores, on one node."""
    return Inventory((GpuClass("A100-80GB", (A100,), **a100), GpuClass("cpu", ("local/gpu1",), mig=False)))


def resnet(rate: float = 250.0, count: int = 0, **kw: Any) -> Demand:
    return Demand("resnet50", rate, 0.1, headroom=1.1, min_count=count, **kw)


def planned(ds: list[Demand], profiles: ProfileSet, inv: Inventory, method: str) -> Plan:
    plan = solve(ds, profiles, inv, method, clock=lambda: 0.0)
    plan.verify()
    return plan


def ids(plan: Plan) -> set[str]:
    return {rid for g in plan.used() for s in g.slices for rid in replica_ids(g, s)}


def layout(plan: Plan) -> list[tuple[str, str, float]]:
    return [(g.id, s.label, r.share) for g, s, r in plan.replicas()]


# --------------------------------------------------------------------------- the planners


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("count", [2, 3])
def test_min_count_places_that_many_replicas_on_one_gpu(profiles: ProfileSet, method: str, count: int) -> None:
    inv = quickstart()
    assert planned([resnet()], profiles, inv, method).count("resnet50") == 1  # capacity alone: one replica
    plan = planned([resnet(count=count)], profiles, inv, method)
    # NOTE: the count asks for replicas, not for GPUs: the one A100 holds them all
    assert plan.count("resnet50") >= count and {g.id for g in plan.used()} == {A100}
    assert plan.floors == () and plan.capacity("resnet50") >= 275.0
    assert plan.to_dict()["status"]["models"][0]["min_count"] == count


@pytest.mark.parametrize("method", METHODS)
def test_a_replica_sized_to_the_whole_gpu_is_split_for_the_count(profiles: ProfileSet, method: str) -> None:
    plan = planned([resnet(2000.0, 2)], profiles, quickstart(), method)
    # NOTE: the greedy's one replica takes the whole A100; two at half its share still carry 2200 req/s
    assert plan.count("resnet50") >= 2 and plan.floors == () and plan.capacity("resnet50") >= 2200.0


@pytest.mark.parametrize("method", METHODS)
def test_a_count_of_one_changes_nothing(profiles: ProfileSet, method: str) -> None:
    inv = quickstart()
    plain, one = (planned([resnet(count=c)], profiles, inv, method) for c in (0, 1))
    assert one.gpus == plain.gpus and "min_count" not in plain.to_dict()["status"]["models"][0]


@pytest.mark.parametrize("method", METHODS)
def test_both_floors_together(profiles: ProfileSet, method: str) -> None:
    inv = Inventory((GpuClass("A100-80GB", ("a/gpu0", "b/gpu0")),))
    plan = planned([resnet(count=3, min_replicas=2)], profiles, inv, method)
    assert plan.count("resnet50") >= 3 and len(plan.hosts("resnet50")[0]) == 2 and plan.floors == ()


@pytest.mark.parametrize("method", METHODS)
def test_a_scaled_to_zero_model_gets_no_replica(profiles: ProfileSet, method: str) -> None:
    plan = planned([resnet(0.0, 2, min_replicas=0)], profiles, quickstart(), method)
    assert plan.replicas() == [] and plan.floors == ()


@pytest.mark.parametrize("method", METHODS)
def test_rate_zero_still_served_keeps_the_count(profiles: ProfileSet, method: str) -> None:
    assert planned([resnet(0.0, 3)], profiles, quickstart(), method).count("resnet50") == 3


@pytest.mark.parametrize("method", METHODS)
def test_a_replica_removed_by_hand_is_refused(profiles: ProfileSet, method: str) -> None:
    plan = planned([resnet(10.0, 2)], profiles, quickstart(), method)
    gpus = list(plan.gpus)
    drop_replica(gpus, 0, 0, 0)
    broken = replace(plan, gpus=tuple(gpus))
    # NOTE: a plan below its count floor without a shortfall saying so is refused
    assert "[replicas] model resnet50: min_count 2 replicas in all, placed 1, not reported" in {
        str(e) for e in broken.violations()}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("inv, why", [
    (quickstart(mig=False, mps=False), "no room on the pool's GPUs"),
    (Inventory((GpuClass("A100-80GB", ("a/gpu0", "b/gpu0"), mig=False, mps=False),), "accuracy", max_gpus=1),
     "max_gpus 1 allows no more GPUs"),
])
def test_no_room_is_a_floor_shortfall(profiles: ProfileSet, method: str, inv: Inventory, why: str) -> None:
    plan = planned([resnet(count=2)], profiles, inv, method)  # NOTE: verify() passes: the shortfall says so
    assert plan.count("resnet50") == 1
    (f,) = plan.floors
    assert not f.met and f.to_dict()["kind"] == "count" and f.to_dict()["replicas"] == 1
    assert f.describe() == f"model resnet50: 2 replicas in all (one per gateway worker), placed 1: {why}"
    # a shortfall that miscounts is refused as well
    with pytest.raises(Exception, match=r"\[replicas\] model resnet50: 2 replicas in all reported placed 2"):
        replace(plan, floors=(replace(f, replicas=2),)).verify()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("priority", ["guaranteed", "best-effort"])
def test_any_rate_meets_the_count_or_says_so(profiles: ProfileSet, method: str, priority: str) -> None:
    inv = quickstart()
    for rate in (0.0, 0.001, 1.0, 250.0, 1e4, 1e6):
        d = resnet(rate, 2, priority=priority)
        try:
            plan = planned([d], profiles, inv, method)
        except SolverError:
            # NOTE: only guaranteed demand the pool cannot hold fails, with the count floor or without
            assert priority == "guaranteed"
            with pytest.raises(SolverError):
                solve([replace(d, min_count=0)], profiles, inv, method)
            continue
        assert plan.count("resnet50") >= 2 or [f.kind for f in plan.floors] == ["count"], rate


@pytest.mark.parametrize("seed", range(6))
def test_random_pools_and_counts_give_verified_plans_and_replans(profiles: ProfileSet, seed: int) -> None:
    rng = random.Random(seed)
    ids_ = tuple(f"n{k}/gpu{i}" for k in range(rng.randint(1, 2)) for i in range(rng.randint(1, 2)))
    inv = Inventory((GpuClass("A100-80GB", ids_, mig=rng.random() < 0.7, mps=rng.random() < 0.8),
                     GpuClass("cpu", ("n0/gpu9",), mig=False)), rng.choice(["gpus", "cost", "accuracy"]))
    ds = [Demand(m, rng.choice([0, 10, 300, 2000]), 0.1, min_replicas=rng.randint(0, 2), min_count=rng.randint(0, 4),
                 priority=rng.choice(["guaranteed", "best-effort"]))
          for m in rng.sample(["resnet50", "bert-base", "digits"], rng.randint(1, 3))]
    for method in METHODS:
        plan = planned(ds, profiles, inv, method)  # NOTE: verify() refuses a count broken unreported
        short = {f.model for f in plan.floors if f.kind == "count"}
        assert all(plan.count(d.model) >= d.count_floor or d.model in short for d in ds)
        later = [replace(d, rate=rng.choice([0, 50, 1000]), min_count=rng.randint(0, 4)) for d in ds]
        replan(plan, later, profiles, inv, method)[0].verify()


# --------------------------------------------------------------------------- re-planning


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("rate", [250.0, 2000.0])
def test_a_replan_to_a_lower_rate_keeps_the_count(profiles: ProfileSet, method: str, rate: float) -> None:
    inv = quickstart()
    old = planned([resnet(rate, 2)], profiles, inv, method)
    new, d = replan(old, [resnet(10.0, 2)], profiles, inv, method)
    new.verify()
    assert new.count("resnet50") >= 2 and new.floors == ()
    # NOTE: the count's replicas stay where they run (a surplus above it may go): none starts again
    assert [s.describe() for s in d.steps if s.action == "start_replica"] == []


@pytest.mark.parametrize("method", METHODS)
def test_a_count_already_met_adds_nothing_to_a_deficit(profiles: ProfileSet, method: str) -> None:
    inv = Inventory((GpuClass("A100-80GB", ("a/gpu0", "a/gpu1")),))
    old = planned([resnet(10.0, 2)], profiles, inv, method)
    new, _ = replan(old, [resnet(3000.0, 2)], profiles, inv, method)
    plain, _ = replan(old, [resnet(3000.0)], profiles, inv, method)
    new.verify()
    # NOTE: the count is met over the whole plan, not again by the replicas added for the deficit
    assert layout(new) == layout(plain) and new.count("resnet50") >= 2


@pytest.mark.parametrize("method", METHODS)
def test_a_count_raised_by_a_replan_only_adds(profiles: ProfileSet, method: str) -> None:
    inv = quickstart()
    old = planned([resnet(250.0, 1)], profiles, inv, method)
    new, d = replan(old, [resnet(250.0, 2)], profiles, inv, method)
    new.verify()
    assert new.count("resnet50") == 2 and new.floors == ()
    # NOTE: the running replica stays; one more starts beside it
    assert ids(old) <= ids(d.new)
    assert [s.action for s in d.steps if s.replica is not None] == ["start_replica"]
    assert {s.action for s in d.steps} <= {"create_slice", "start_mps", "start_replica"}
