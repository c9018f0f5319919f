"""Replicas for availability: a deployment's ``replicas`` / ``autoscaling.min_replicas`` is a
floor the planner meets on distinct GPUs, and on distinct nodes where the pool has them, in the
greedy and the MILP alike; a floor the pool cannot meet is reported (plan and ``status``), the
re-planning diff keeps floors, and the autoscaler never scales a deployment below its floor."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from rich.console import Console

from deploy.operator.desired import Desired, base_profiles, prepare
from deploy.operator.observe import Observer
from deploy.operator.status import print_status, status
from placement.autoscale import initial, step
from placement.diff import replan, replica_ids
from placement.llm import LlmPlan
from placement.plan import Demand, GpuClass, Inventory, Plan, PlanError, node_of
from placement.solve.solver import solve
from profiles.profile import ProfileSet
from profiles.schema import AutoscalingSpec, SpecError

METHODS = ("greedy", "milp")


@pytest.fixture(scope="module")
def profiles() -> ProfileSet:
    return base_profiles()


def pool(per_node: dict[str, int], **kw: Any) -> Inventory:
    """A100s (MIG and MPS allowed) on named nodes, ids ``<node>/gpu<i>`` as a GpuPool gives them."""
    ids = tuple(f"{n}/gpu{i}" for n, k in per_node.items() for i in range(k))
    return Inventory((GpuClass("A100-80GB", ids),), **kw)


def planned(ds: list[Demand], profiles: ProfileSet, inv: Inventory, method: str) -> Plan:
    plan = solve(ds, profiles, inv, method, clock=lambda: 0.0)
    plan.verify()
    return plan


def hosts(plan: Plan, model: str) -> tuple[list[str], set[str]]:
    gpus = sorted({g.id for g, _, r in plan.replicas() if r.model == model})
    return gpus, {node_of(i) for i in gpus}


def resnet(rate: float, floor: int, slo: float = 0.1) -> Demand:
    return Demand("resnet50", rate, slo, min_replicas=floor)


# --------------------------------------------------------------------------- the planners


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("rate", [0.0, 300.0, 3000.0])
def test_a_floor_lands_on_distinct_gpus_of_distinct_nodes(profiles: ProfileSet, method: str, rate: float) -> None:
    inv = pool({"n0": 2, "n1": 1, "n2": 1})
    plan = planned([resnet(rate, 3)], profiles, inv, method)
    gpus, nodes = hosts(plan, "resnet50")
    # NOTE: three nodes can take one each, so no two of the floor's replicas share a node
    assert len(gpus) >= 3 and len(nodes) == 3, gpus
    assert plan.floors == ()
    assert plan.capacity("resnet50") >= max(rate, 1e-3)


@pytest.mark.parametrize("method", METHODS)
def test_without_a_floor_one_replica_serves_rate_zero(profiles: ProfileSet, method: str) -> None:
    plan = planned([resnet(0.0, 1)], profiles, pool({"n0": 2, "n1": 2}), method)
    assert len(plan.replicas()) == 1 and plan.floors == ()


@pytest.mark.parametrize("method", METHODS)
def test_a_floor_beside_other_models_uses_their_free_room_first(profiles: ProfileSet, method: str) -> None:
    inv = pool({"n0": 1, "n1": 1, "n2": 1})
    alone = planned([Demand("bert-base", 200, 0.1)], profiles, inv, method)
    both = planned([Demand("bert-base", 200, 0.1), resnet(0.0, 2)], profiles, inv, method)
    gpus, nodes = hosts(both, "resnet50")
    assert len(gpus) == 2 and len(nodes) == 2
    # one of the two replicas shares a GPU bert-base already opened: one GPU more at most
    assert both.gpu_count <= alone.gpu_count + 1


@pytest.mark.parametrize("method", METHODS)
def test_a_replica_moves_to_another_node_rather_than_taking_another_gpu(profiles: ProfileSet, method: str) -> None:
    inv = pool({"n0": 2, "n1": 1})
    alone = planned([resnet(3500.0, 1)], profiles, inv, method)
    assert len(hosts(alone, "resnet50")[1]) == 1  # without a floor, both replicas stand on n0
    spread = planned([resnet(3500.0, 2)], profiles, inv, method)
    assert len(hosts(spread, "resnet50")[1]) == 2
    assert spread.gpu_count == alone.gpu_count and spread.capacity("resnet50") == pytest.approx(alone.capacity("resnet50"))


@pytest.mark.parametrize("method", METHODS)
def test_more_nodes_than_the_pool_has_is_a_warning_not_a_failure(profiles: ProfileSet, method: str) -> None:
    plan = planned([resnet(0.0, 3)], profiles, pool({"n0": 2, "n1": 2}), method)
    gpus, nodes = hosts(plan, "resnet50")
    assert len(gpus) == 3 and len(nodes) == 2
    (f,) = plan.floors
    assert f.met and (f.gpus, f.nodes) == (3, 2)
    assert f.describe() == "model resnet50: floor 3 replicas: 3 placed on 2 nodes, only 2 nodes"


@pytest.mark.parametrize("method", METHODS)
def test_a_floor_the_pool_cannot_meet_is_reported_not_dropped(profiles: ProfileSet, method: str) -> None:
    plan = planned([resnet(0.0, 3)], profiles, pool({"n0": 1, "n1": 1}), method)
    assert len(hosts(plan, "resnet50")[0]) == 2
    (f,) = plan.floors
    assert not f.met
    assert f.describe() == "model resnet50: floor 3 replicas: 2 placed, only 2 GPUs can serve it"
    # NOTE: a plan that breaks a floor without saying so is refused by its verifier
    with pytest.raises(PlanError, match=r"\[replicas\] model resnet50: floor 3 replicas"):
        replace(plan, floors=()).verify()


@pytest.mark.parametrize("method", METHODS)
def test_a_budget_that_allows_no_more_gpus_is_named(profiles: ProfileSet, method: str) -> None:
    inv = pool({"n0": 1, "n1": 1, "n2": 1}, objective="accuracy", max_gpus=1)
    plan = planned([resnet(0.0, 2)], profiles, inv, method)
    assert plan.gpu_count == 1
    (f,) = plan.floors
    assert f.describe() == "model resnet50: floor 2 replicas: 1 placed, max_gpus 1 allows no more GPUs"


@pytest.mark.parametrize("method", METHODS)
def test_the_same_input_gives_the_same_plan(profiles: ProfileSet, method: str) -> None:
    inv = pool({"n0": 2, "n1": 2})
    ds = [resnet(900.0, 3), Demand("bert-base", 150, 0.1, min_replicas=2)]
    first, again = (planned(ds, profiles, inv, method) for _ in range(2))
    assert first.to_dict() == again.to_dict()
    assert len(hosts(first, "bert-base")[1]) == 2


@pytest.mark.parametrize("seed", range(6))
def test_random_pools_and_floors_give_verified_plans_and_replans(profiles: ProfileSet, seed: int) -> None:
    rng = random.Random(seed)
    ids = tuple(f"n{k}/gpu{i}" for k in range(rng.randint(1, 3)) for i in range(rng.randint(1, 2)))
    inv = Inventory((GpuClass("A100-80GB", ids, mig=rng.random() < 0.7, mps=rng.random() < 0.8),
                     GpuClass("cpu", ("n0/gpu9",), mig=False)), rng.choice(["gpus", "cost", "accuracy"]))
    ds = [Demand(m, rng.choice([0, 10, 300, 2000]), 0.1, min_replicas=rng.randint(0, 4),
                 priority=rng.choice(["guaranteed", "best-effort"]))
          for m in rng.sample(["resnet50", "bert-base", "digits"], rng.randint(1, 3))]
    for method in METHODS:
        plan = planned(ds, profiles, inv, method)  # NOTE: verify() refuses a floor broken unreported
        assert planned(ds, profiles, inv, method).to_dict() == plan.to_dict()
        later = [replace(d, rate=rng.choice([0, 50, 1000]), min_replicas=rng.randint(0, 4)) for d in ds]
        replan(plan, later, profiles, inv, method)[0].verify()


# --------------------------------------------------------------------------- documents to demands


DOCS = """
apiVersion: headrace.dev/v1
kind: GpuPool
metadata: {{name: pool}}
spec:
  emulate: true
  nodes:
    - {{name: a, gpus: [{{model: A100-80GB, count: 1}}]}}
    - {{name: b, gpus: [{{model: A100-80GB, count: 1}}]}}
---
apiVersion: headrace.dev/v1
kind: ModelDeployment
metadata: {{name: resnet50}}
spec: {{model: resnet50, rate: 0, slo_ms: 100, {extra}}}
"""


def desired(extra: str, profiles: ProfileSet) -> Desired:
    return prepare(DOCS.format(extra=extra), profiles, "test")


@pytest.mark.parametrize("extra, floor", [("autoscaling: {min_replicas: 2}", 2), ("replicas: 2", 2),
                                          ("replicas: 2, autoscaling: {min_replicas: 1}", 2),
                                          ("replicas: 1, autoscaling: {min_replicas: 2}", 2),
                                          ("autoscaling: {min_replicas: 0}", 0), ("headroom: 1.1", 1)])
def test_replicas_and_min_replicas_reach_the_planner(profiles: ProfileSet, extra: str, floor: int) -> None:
    want = desired(extra, profiles)
    (d,) = want.demands({"resnet50": 0.0})  # the autoscaler's planned rate replaces the rate, not the floor
    assert d.min_replicas == floor


@pytest.mark.parametrize("method", METHODS)
def test_rate_zero_with_min_replicas_2_is_two_replicas_on_two_nodes(profiles: ProfileSet, method: str) -> None:
    from placement.spec import inventory, single_pool

    want = desired("autoscaling: {min_replicas: 2}", profiles)
    plan = planned(want.demands({}), want.profiles, inventory(single_pool(want.docs, ["test"])), method)
    gpus, nodes = hosts(plan, "resnet50")
    assert len(plan.replicas()) == 2 and gpus == ["a/gpu0", "b/gpu0"] and nodes == {"a", "b"}


@pytest.mark.parametrize("extra, message", [
    ("replicas: 3, autoscaling: {max_replicas: 2}", "replicas (3) exceeds autoscaling.max_replicas (2)"),
    ("replicas: 0", "replicas"),
])
def test_a_bad_replicas_field_is_one_line(profiles: ProfileSet, extra: str, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        desired(extra, profiles)


# --------------------------------------------------------------------------- re-planning


@pytest.mark.parametrize("method", METHODS)
def test_a_replan_to_rate_zero_keeps_the_floor(profiles: ProfileSet, method: str) -> None:
    inv = pool({"n0": 2, "n1": 2})
    old = planned([resnet(3000.0, 2)], profiles, inv, method)
    new, d = replan(old, [resnet(0.0, 2)], profiles, inv, method)
    new.verify()
    gpus, nodes = hosts(new, "resnet50")
    assert len(gpus) == 2 and len(nodes) == 2 and new.floors == ()
    # NOTE: going down keeps the floor's replicas where they run: nothing is started to replace them
    assert [s.describe() for s in d.steps if s.action == "start_replica"] == []
    assert d.capacity_dips() == []


@pytest.mark.parametrize("method", METHODS)
def test_a_floor_added_by_a_replan_only_adds(profiles: ProfileSet, method: str) -> None:
    inv = pool({"n0": 2, "n1": 2})
    old = planned([resnet(100.0, 1)], profiles, inv, method)
    new, d = replan(old, [resnet(100.0, 3)], profiles, inv, method)
    new.verify()
    gpus, nodes = hosts(new, "resnet50")
    assert len(gpus) == 3 and len(nodes) == 2
    # NOTE: the old replica stays where it was; the floor's replicas are started beside it
    assert {s.action for s in d.steps} <= {"enable_mig", "create_slice", "start_mps", "start_replica"}
    again, d2 = replan(old, [resnet(100.0, 3)], profiles, inv, method)
    assert again.to_dict() == new.to_dict() and [s.describe() for s in d2.steps] == [s.describe() for s in d.steps]


@pytest.mark.parametrize("method", METHODS)
def test_a_replan_on_a_pool_too_small_reports_the_floor(profiles: ProfileSet, method: str) -> None:
    inv = pool({"n0": 1, "n1": 1})
    old = planned([resnet(100.0, 2)], profiles, inv, method)
    new, _ = replan(old, [resnet(100.0, 3)], profiles, inv, method)
    new.verify()
    assert [f.describe() for f in new.floors] == ["model resnet50: floor 3 replicas: 2 placed, only 2 GPUs can "
                                                  "serve it"]
    same, d = replan(new, [resnet(100.0, 3)], profiles, inv, method)
    assert d.steps == () and same.floors == new.floors


# --------------------------------------------------------------------------- the autoscaler


def idle(spec: AutoscalingSpec, replicas: int | None, until: float = 300.0) -> list[str | None]:
    """The directions an idle deployment planned at 100 req/s gets, one observation every 5 s."""
    st, out = initial(100.0, 0.0), []
    for k in range(int(until / 5) + 1):
        d, st = step(spec, st, 0.0, k * 5.0, replicas=replicas)
        out.append(d.direction)
    return out


def test_the_autoscaler_holds_a_deployment_at_its_floor_quietly() -> None:
    spec = AutoscalingSpec(min_replicas=2, downscale_delay_s=30)
    # NOTE: at its floor an idle deployment holds: no event, so no re-plan, every downscale delay
    assert idle(spec, replicas=2) == [None] * 61
    st = initial(100.0, 0.0)
    for t in (0.0, 30.0):
        d, st = step(spec, st, 0.0, t, replicas=2)
    assert d.direction is None and "at its floor: 2 replicas (min_replicas 2)" in d.reason


def test_the_autoscaler_scales_down_to_its_floor_once() -> None:
    spec = AutoscalingSpec(min_replicas=2, downscale_delay_s=30)
    above = idle(spec, replicas=3)
    assert above.count("down") == 1 and above.index("down") == 6
    assert idle(spec, replicas=None).count("down") == 1  # replicas unknown: as before


# --------------------------------------------------------------------------- status


class Running:
    """A runtime whose every replica process runs."""

    def endpoints(self) -> dict:
        return {}

    def alive(self, rid: str) -> bool:
        return True


@dataclass
class Seen:
    """What :func:`deploy.operator.status.status` reads of a controller whose every replica
    serves, with no process behind it."""

    desired: Desired
    plan: Plan
    clock: Any = lambda: 100.0
    wall: Any = lambda: 1.7e9
    llm_plan: LlmPlan = field(default_factory=LlmPlan)
    runtime: Any = field(default_factory=Running)
    engines: Any = None
    gateway: Any = None
    observer: Observer = field(default_factory=Observer)
    generation: int = 1
    observed_generation: int = 1
    rates: dict[str, float] = field(default_factory=dict)
    applying: str | None = None
    failure: str | None = None
    rolled_back: str | None = None
    generations: dict = field(default_factory=dict)
    observed: dict = field(default_factory=dict)
    restarting: dict[str, str] = field(default_factory=dict)
    transitions: dict = field(default_factory=dict)
    events: deque = field(default_factory=deque)
    admin_url: str = ""

    def serving(self) -> dict[str, tuple[int, bool]]:
        return {rid: (0, True) for g in self.plan.used() for s in g.slices for rid in replica_ids(g, s)}


@pytest.mark.parametrize("extra, degraded, line", [
    ("replicas: 3", "FloorUnmet", "resnet50: Degraded (FloorUnmet): model resnet50: floor 3 replicas: 2 placed, "
                                  "only 2 GPUs can serve it"),
    ("replicas: 2", None, None),
])
def test_status_shows_a_floor_that_cannot_be_met(profiles: ProfileSet, extra: str, degraded: str | None,
                                                 line: str | None) -> None:
    from placement.spec import inventory, single_pool

    want = desired(extra, profiles)
    plan = planned(want.demands({}), want.profiles, inventory(single_pool(want.docs, ["test"])), "greedy")
    st = status(Seen(want, plan))  # type: ignore[arg-type]
    (dep,) = st["deployments"]
    assert dep["min_replicas"] == int(extra.split()[-1])
    cond = {c["type"]: c for c in dep["conditions"]}["Degraded"]
    console = Console(width=400, record=True)
    print_status(st, console)
    if degraded is None:
        assert "floor" not in dep and st["floors"] == [] and cond["status"] == "False"
        return
    assert dep["floor"] == {"model": "resnet50", "floor": 3, "gpus": 2, "nodes": 2, "met": False,
                            "why": "only 2 GPUs can serve it",
                            "message": "model resnet50: floor 3 replicas: 2 placed, only 2 GPUs can serve it"}
    assert cond["reason"] == degraded
    assert line in console.export_text()
