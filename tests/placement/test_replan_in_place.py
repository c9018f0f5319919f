"""Re-plans that keep serving: more load goes first into room the running GPUs leave, a
replaced replica starts beside its predecessor, ids never collide, and a diff that cannot
keep capacity says where it drops."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from deploy.operator.desired import base_profiles, prepare
from placement.diff import diff, replan, replica_ids, stamp, waves
from placement.plan import Plan
from placement.solve.solver import solve
from placement.spec import inventory, single_pool
from profiles.profile import ProfileSet

QUICKSTART = Path(__file__).resolve().parents[2] / "deploy/examples/quickstart"


@pytest.fixture(scope="module")
def base() -> ProfileSet:
    return base_profiles()


def quickstart(base: ProfileSet, rate: float = 250, digits: str = "digits-small, digits-medium, digits-large"):
    text = "\n---\n".join((QUICKSTART / f).read_text() for f in ("pool.yaml", "models.yaml", "gateway.yaml"))
    text = text.replace("rate: 250,", f"rate: {rate},").replace(
        "variants: [digits-small, digits-medium, digits-large]", f"variants: [{digits}]")
    want = prepare(text, base)
    inv = inventory(single_pool(want.docs, ["test"]))
    inv = replace(inv, classes=tuple(c for c in inv.classes if c.gpu != "H100-80GB"))  # the LLM's GPU
    return want, inv


def first(base: ProfileSet) -> Plan:
    want, inv = quickstart(base)
    return diff(None, solve(want.demands({}), want.profiles, inv)).new


def test_rate_x2_and_a_variant_change_on_the_quickstart_pool_stop_nothing_that_serves(base: ProfileSet) -> None:
    old = first(base)
    want, inv = quickstart(base, 500, "digits-small, digits-medium")
    new, d = replan(old, want.demands({}), want.profiles, inv)
    new.verify()
    # NOTE: the added resnet50 capacity goes beside the running replica; only the dropped variant stops
    stops = [s for s in d.steps if s.action == "stop_replica"]
    assert [s.replica.variant for s in stops] == ["digits-large"] and not d.dips()  # type: ignore[union-attr]
    assert all(s.action in ("start_replica", "stop_replica") for s in d.steps), [s.describe() for s in d.steps]
    assert d.steps.index(stops[0]) > min(i for i, s in enumerate(d.steps) if s.replica.model == "digits")  # type: ignore[union-attr]
    kept = {r.id for _, _, r in old.replicas()} & {r.id for _, _, r in new.replicas()}
    assert any("resnet50" in k for k in kept)


def test_a_new_revision_starts_beside_its_predecessor_under_another_id(base: ProfileSet) -> None:
    old = first(base)
    (g, s, r), = [(g, s, r) for g, s, r in old.replicas() if r.model == "resnet50"]
    d = diff(old, stamp(old, {("resnet50", "resnet50"): "0123456789abcdef"}))
    assert [(st.action, st.replica_id) for st in d.steps] == [
        ("start_replica", f"{g.id}/{s.label}/resnet50~01234567"), ("stop_replica", r.id)]
    assert not d.dips()
    # the plan the diff returns names the new replica as its start step did
    assert [x.id for _, _, x in d.new.replicas() if x.model == "resnet50"] == [d.steps[0].replica_id]


def test_a_successor_of_the_same_name_never_takes_the_running_ones_id(base: ProfileSet) -> None:
    old = first(base)
    (g, s, r), = [(g, s, r) for g, s, r in old.replicas() if r.model == "resnet50"]
    bigger = replace(r, share=r.share * 2, id="")
    gpus = tuple(replace(x, slices=tuple(replace(y, replicas=tuple(bigger if z is r else z for z in y.replicas))
                                         for y in x.slices)) for x in old.gpus)
    d = diff(old, replace(old, gpus=gpus))
    started = [st.replica_id for st in d.steps if st.action == "start_replica"]
    assert started == [f"{r.id}#2"] and [st.replica_id for st in d.steps if st.action == "stop_replica"] == [r.id]
    assert replica_ids(g, s) == [r.id]


def test_a_slice_without_memory_for_both_replaces_after_the_stop_and_says_so(base: ProfileSet) -> None:
    old = first(base)
    r = next(r for _, _, r in old.replicas() if r.model == "resnet50")
    huge = base.get("resnet50", "A100-80GB", "gpu")
    fat = ProfileSet([p if p is not huge else replace(p, memory_mb=60_000.0) for p in base])
    d = diff(replace(old, profiles=fat), replace(stamp(old, {("resnet50", "resnet50"): "ff"}), profiles=fat))
    assert [st.action for st in d.steps] == ["stop_replica", "start_replica"]
    (i, model, cap, need), = d.dips()
    assert (i, model, cap) == (0, "resnet50", 0.0) and need > 0 and d.down(0, "resnet50") == 1
    assert r.id == d.steps[0].replica_id and "resnet50 capacity 0 < " in d.capacity_dips()[0]


def four_resnets(base: ProfileSet) -> Plan:
    """Four resnet50 replicas filling one MPS slice (25% each): a successor has no share of
    its own, so it starts beside its predecessor."""
    want, inv = quickstart(base)
    demands = [replace(d, min_count=4) if d.model == "resnet50" else d for d in want.demands({})]
    old = diff(None, solve(demands, want.profiles, inv)).new
    gpus = tuple(replace(g, slices=tuple(replace(s, replicas=tuple(replace(r, share=0.25) if r.model == "resnet50"
                                                                   else r for r in s.replicas)) for s in g.slices))
                 for g in old.gpus)
    old = replace(old, gpus=gpus)
    (s,) = {s for _, s, r in old.replicas() if r.model == "resnet50"}
    assert len(s.replicas) == 4 and s.mps
    return old


@pytest.mark.parametrize("surge", [1, 2, 3, 4])
def test_a_rollout_starts_max_surge_successors_at_once_then_stops_their_predecessors(base: ProfileSet,
                                                                                   surge: int) -> None:
    old = four_resnets(base)
    d = diff(old, stamp(old, {("resnet50", "resnet50"): "0123456789abcdef"}), {"resnet50": surge})
    acts = "".join("+" if st.action == "start_replica" else "-" for st in d.steps)
    # NOTE: waves of `surge` successors (the last one what is left), each before its predecessors stop
    sizes = [surge] * (4 // surge) + ([4 % surge] if 4 % surge else [])
    assert acts == "".join("+" * k + "-" * k for k in sizes), acts
    assert not d.dips() and not d.capacity_dips()
    assert [len(w) for w in waves(d.steps, {"resnet50": surge})] == sum(([k] + [1] * k for k in sizes), [])
    # every successor replaces a predecessor of the same model, each stopped once
    assert sorted(st.replica_id for st in d.steps if st.action == "stop_replica") == sorted(
        r.id for _, _, r in old.replicas() if r.model == "resnet50")


def test_a_surge_the_slice_cannot_hold_starts_fewer_at_once(base: ProfileSet) -> None:
    old = four_resnets(base)
    p = base.get("resnet50", "A100-80GB", "gpu")
    # memory on the GPU for the four replicas and two more, not three more
    fat = ProfileSet([x if x is not p else replace(p, memory_mb=12_000.0) for x in base])
    d = diff(replace(old, profiles=fat), replace(stamp(old, {("resnet50", "resnet50"): "ff"}), profiles=fat),
             {"resnet50": 4})
    acts = "".join("+" if st.action == "start_replica" else "-" for st in d.steps)
    assert acts == "++--++--", acts
    assert not d.dips()
