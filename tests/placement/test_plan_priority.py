"""Guaranteed and best-effort demand in the plan (AntMan's split): guaranteed placed whole on
reserved capacity with its headroom, best-effort at its rate in what is left, partial plans on
an overfull pool, and the GPUs guaranteed demand lacks."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from placement.apply.render import Endpoint, gateway_config
from placement.llm import LlmPlan
from placement.plan import Demand, GpuClass, Inventory, Plan, PlanError, Shortfall
from placement.solve.capacity import replica_capacity
from placement.solve.solver import SolverError, solve
from profiles.profile import LatencyPoint, Profile, ProfileSet


def one_g(model: str) -> Profile:
    """t(b) = 5 + 2b ms on a 1g.10gb slice of an A100-80GB."""
    pts = tuple(LatencyPoint(b, (5 + 2 * b) / 1e3, (5 + 2 * b) / 1e3) for b in (1, 64))
    return Profile(model, model, "A100-80GB", "1g.10gb", 64, pts, 1000.0, None, 0.1)


def pool(n: int) -> Inventory:
    """n A100-80GB, MIG only: seven 1g.10gb replicas per GPU."""
    return Inventory((GpuClass("A100-80GB", tuple(f"n0/gpu{i}" for i in range(n)), 1.0, True, False),))


PS = ProfileSet([one_g("g"), one_g("b"), one_g("c")])
CAP = replica_capacity(PS.get("g", "A100-80GB", "1g.10gb"), 0.1).rate  # one replica's req/s at 100 ms


def replicas(plan: Plan, model: str) -> int:
    return sum(1 for _, _, r in plan.replicas() if r.model == model)


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_an_overfull_pool_places_every_guaranteed_model_and_reports_the_best_effort_shortfall(method):
    # one GPU holds 7 replicas: g takes 3 (reserved), b wants 6 and gets the 4 left
    demands = [Demand("b", 5.5 * CAP, 0.1, priority="best-effort"), Demand("g", 2.5 * CAP, 0.1, headroom=1.1)]
    plan = solve(demands, PS, pool(1), method, time_limit=5)
    plan.verify()
    assert replicas(plan, "g") == 3 and plan.capacity("g") >= demands[1].required
    assert plan.partial and [s.model for s in plan.shortfall] == ["b"]
    (short,) = plan.shortfall
    assert replicas(plan, "b") == 4
    assert short.placed == pytest.approx(4 * CAP) and short.unplaced == pytest.approx(1.5 * CAP)
    assert short.gpus == (("A100-80GB", 1),)  # two more replicas: one more GPU
    status = plan.to_dict()["status"]
    assert status["partial"] and status["shortfall"][0]["unplaced_rps"] == pytest.approx(1.5 * CAP, abs=0.1)


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_best_effort_marking_changes_the_plan(method):
    # at headroom 1.5 the guaranteed model needs 2 replicas; best-effort is planned at its rate: 1
    d = Demand("g", 0.9 * CAP, 0.1, headroom=1.5)
    guaranteed = solve([d], PS, pool(1), method, time_limit=5)
    best_effort = solve([replace(d, priority="best-effort")], PS, pool(1), method, time_limit=5)
    guaranteed.verify()
    best_effort.verify()
    assert replicas(guaranteed, "g") == 2 and replicas(best_effort, "g") == 1
    assert not guaranteed.partial and not best_effort.partial


def test_best_effort_goes_where_guaranteed_demand_leaves_room():
    # NOTE: guaranteed demand is placed first: b (best-effort, larger) never takes the slices
    # that g and c (guaranteed) need, whatever the order of the documents
    demands = [Demand("b", 6.5 * CAP, 0.1, priority="best-effort"), Demand("g", 2.5 * CAP, 0.1, headroom=1.0),
               Demand("c", 1.5 * CAP, 0.1, headroom=1.0)]
    plan = solve(demands, PS, pool(1))
    plan.verify()
    assert (replicas(plan, "g"), replicas(plan, "c"), replicas(plan, "b")) == (3, 2, 2)


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_guaranteed_demand_that_does_not_fit_says_how_many_gpus_are_missing(method):
    # 16 replicas' worth on one GPU of 7: 9 more replicas, two more GPUs
    demands = [Demand("g", 15.5 * CAP, 0.1, headroom=1.0), Demand("b", CAP, 0.1, priority="best-effort")]
    with pytest.raises(SolverError, match=r"guaranteed demand does not fit the pool: it needs 2 more GPUs "
                                          r"\(2 x A100-80GB\) beyond the pool's 1"):
        solve(demands, PS, pool(1), method, time_limit=5)


def test_verify_allows_a_short_best_effort_model_only_as_reported():
    demands = [Demand("b", 5.5 * CAP, 0.1, priority="best-effort"), Demand("g", 2.5 * CAP, 0.1, headroom=1.1)]
    plan = solve(demands, PS, pool(1))
    with pytest.raises(PlanError, match=r"\[capacity\] model b: predicted capacity"):
        replace(plan, shortfall=()).verify()
    with pytest.raises(PlanError, match="model g: guaranteed demand is reported short"):
        replace(plan, shortfall=(*plan.shortfall, Shortfall("g", 1.0, 0.0))).verify()


def test_the_cli_exits_0_with_the_shortfall_and_2_for_missing_guaranteed_gpus(tmp_path, capsys):
    from deploy.cli import main

    pool_doc = tmp_path / "pool.yaml"
    pool_doc.write_text("apiVersion: headrace.dev/v1\nkind: GpuPool\nmetadata: {name: small}\n"
                        "spec:\n  nodes:\n    - name: n0\n      gpus: [{model: A100-80GB, count: 1}]\n")
    models = tmp_path / "models.yaml"

    def write(resnet_priority: str) -> None:
        models.write_text(
            "apiVersion: headrace.dev/v1\nkind: ModelDeployment\nmetadata: {name: resnet50}\n"
            f"spec: {{model: resnet50, rate: 1500, slo_ms: 100, priority: {resnet_priority}}}\n---\n"
            "apiVersion: headrace.dev/v1\nkind: ModelDeployment\nmetadata: {name: bert-large}\n"
            "spec: {model: bert-large, rate: 4000, slo_ms: 200, priority: best-effort}\n")

    write("guaranteed")
    assert main(["plan", "-f", str(pool_doc), "-f", str(models), "--output", "both"]) == 0
    out = capsys.readouterr().out
    assert "partial plan" in out and "bert-large" in out and "unplaced_rps" in out
    write("guaranteed")
    models.write_text(models.read_text().replace("rate: 1500", "rate: 40000"))
    assert main(["plan", "-f", str(pool_doc), "-f", str(models)]) == 2
    err = capsys.readouterr().err
    assert "guaranteed demand does not fit the pool: it needs" in err and len(err.strip().splitlines()) == 1


def test_the_rendered_gateway_config_marks_best_effort_models(tmp_path):
    demands = [Demand("b", CAP, 0.1, priority="best-effort"), Demand("g", CAP, 0.1)]
    plan = solve(demands, PS, pool(1))
    eps = [Endpoint(f"{g.id}/{s.label}#{i}", r.model, r.variant, g.id, s.label, r.share, r.max_batch, r.capacity,
                    f"127.0.0.1:{8000 + i}", f"127.0.0.1:{9000 + i}")
           for i, (g, s, r) in enumerate(plan.replicas())]
    cfg = gateway_config(plan, eps, PS, tmp_path)
    assert {m.name: m.priority for m in cfg.models} == {"b": "best-effort", "g": "guaranteed"}


def test_status_reports_a_short_best_effort_model_as_degraded_by_an_overfull_pool():
    from deploy.operator.status import status
    from placement.diff import replica_ids

    demands = [Demand("b", 5.5 * CAP, 0.1, priority="best-effort"), Demand("g", 2.5 * CAP, 0.1, headroom=1.1)]
    plan = solve(demands, PS, pool(1))
    window = SimpleNamespace(rate=0.0, attainment=None, totals=SimpleNamespace(answered=0, rejected=0))
    docs = [SimpleNamespace(metadata=SimpleNamespace(name=d.model),
                            spec=SimpleNamespace(model=d.model, rate=d.rate, slo_ms=d.slo * 1e3, llm=None))
            for d in demands]
    healthy = {rid: (0, True) for g in plan.used() for s in g.slices for rid in replica_ids(g, s)}  # all serve
    c = SimpleNamespace(clock=lambda: 0.0, wall=lambda: 0.0, desired=SimpleNamespace(docs=SimpleNamespace(deployments=docs)),
                        plan=plan, runtime=SimpleNamespace(endpoints=dict, alive=lambda rid: True),
                        serving=lambda: healthy, llm_plan=LlmPlan(),
                        gateway=SimpleNamespace(http_url="h", grpc_url="g"),
                        restarting=set(), transitions={}, observed_generation=1, generation=1, applying=None,
                        failure=None, rolled_back=None, generations={}, observed={},
                        observer=SimpleNamespace(window=lambda *a: window), rates={}, admin_url=None, events=[])
    st = status(c)
    assert [s["model"] for s in st["shortfall"]] == ["b"]
    by = {d["model"]: {x["type"]: x for x in d["conditions"]} for d in st["deployments"]}
    assert by["b"]["Degraded"]["reason"] == "PoolOverfull" and "req/s not" in by["b"]["Degraded"]["message"]
    assert by["g"]["Degraded"]["status"] == "False"


def test_a_slice_with_too_little_room_left_is_no_room_at_all():
    # one whole GPU shared under MPS: a takes half of it; b needs the whole GPU's memory, so the
    # half left is no use to it (one more GPU as guaranteed, a shortfall as best-effort)
    def whole(model: str, memory_mb: float) -> Profile:
        return replace(one_g(model), slice="gpu", memory_mb=memory_mb)

    ps = ProfileSet([whole("a", 1000.0), whole("b", 60000.0)])
    inv = Inventory((GpuClass("A100-80GB", ("n0/gpu0",), 1.0, False, True),))
    a = Demand("a", 0.5 * replica_capacity(ps.get("a", "A100-80GB", "gpu"), 0.1, 0.5).rate, 0.1, headroom=1.0)
    b = Demand("b", 10.0, 0.1)
    with pytest.raises(SolverError, match=r"it needs 1 more GPU \(1 x A100-80GB\)"):
        solve([a, b], ps, inv)
    plan = solve([a, replace(b, priority="best-effort")], ps, inv)
    plan.verify()
    assert [(s.model, s.placed, s.gpus) for s in plan.shortfall] == [("b", 0.0, (("A100-80GB", 1),))]
