"""Several small MPS shares of one variant on one slice become fewer, larger replicas where
those serve more (:func:`placement.solve.merge.merge_shares`), and no plan keeps them."""

from __future__ import annotations

import collections

from placement.plan import Demand, GpuPlan, Replica, SlicePlan
from placement.solve.capacity import replica_capacity
from placement.solve.merge import merge_shares
from placement.solve.solver import solve
from profiles.profile import ProfileSet

PS = ProfileSet.reference()
SLO = 0.1


def eighths(model: str = "resnet50", n: int = 8) -> GpuPlan:
    p = PS.get("resnet50", "A100-80GB", "7g.80gb")
    cap = replica_capacity(p, SLO, 0.125)
    reps = tuple(Replica(model, "resnet50", 0.125, cap.max_batch, cap.rate) for _ in range(n))
    return GpuPlan("n0/gpu0", "A100-80GB", True, (SlicePlan("7g.80gb", 0, True, reps),))


def test_eight_eighths_become_the_replica_that_serves_more():
    g = eighths()
    before = sum(r.capacity for r in g.slices[0].replicas)
    (merged,), n = merge_shares([g], [Demand("resnet50", 100.0, SLO)], PS)
    reps = merged.slices[0].replicas
    whole = replica_capacity(PS.get("resnet50", "A100-80GB", "7g.80gb"), SLO, 1.0)
    assert whole.rate > before  # the premise: one whole slice serves more than eight eighths
    assert n == 7 and [(r.share, r.capacity) for r in reps] == [(1.0, whole.rate)]
    assert reps[0].max_batch == whole.max_batch


def test_a_count_floor_keeps_its_replicas():
    g = eighths(n=4)
    (merged,), n = merge_shares([g], [Demand("resnet50", 100.0, SLO, min_count=3)], PS)
    shares = sorted(r.share for r in merged.slices[0].replicas)
    assert n == 1 and shares == [0.125, 0.125, 0.25]


def test_other_variants_and_models_are_left_alone():
    p = PS.get("resnet50", "A100-80GB", "7g.80gb")
    cap = replica_capacity(p, SLO, 0.125)
    reps = (Replica("a", "resnet50", 0.125, cap.max_batch, cap.rate), Replica("b", "resnet50", 0.125, cap.max_batch, cap.rate))
    g = GpuPlan("n0/gpu0", "A100-80GB", True, (SlicePlan("7g.80gb", 0, True, reps),))
    out, n = merge_shares([g], [Demand("a", 1.0, SLO), Demand("b", 1.0, SLO)], PS)
    assert n == 0 and out[0] is g


def test_no_plan_keeps_same_variant_shares_that_would_serve_more_merged():
    """On the generated 100-model fleet both methods place such pairs (the greedy dozens) and
    the merge pass leaves none."""
    from bench.fleet import generate

    demands, ps, inv = generate(100, 500, 17).problem()
    for method in ("greedy", "milp"):
        plan = solve(demands, ps, inv, method)
        plan.verify()
        slo = {d.model: d.slo for d in demands}
        for g in plan.gpus:
            for s in g.slices:
                same = collections.Counter((r.model, r.variant, r.share) for r in s.replicas)
                for (model, variant, share), k in same.items():
                    if k < 2 or share >= 1.0:
                        continue
                    one = next(r.capacity for r in s.replicas if (r.model, r.variant, r.share) == (model, variant, share))
                    merged = replica_capacity(ps.get(variant, g.gpu, s.profile), slo[model], 2 * share)
                    assert merged is None or merged.rate <= 2 * one, (method, g.id, s.label, model)
