"""Re-planning: a ``PlanDiff`` between two plans, ordered make-before-break, and ``replan``.

A diff is a sequence of steps (create a slice, start an MPS daemon, start or stop a replica,
...). Steps that only add go first; removals follow; additions that need space a removal frees
go last. :meth:`PlanDiff.capacity_dips` replays the steps and names every point where a model's
serving capacity falls below the lower of its old and new requirement.

``replan`` keeps every old replica that still helps, releases whole GPUs whose replicas have
become surplus (never one a replica floor still needs), places only the deficit on free GPUs,
and then meets the replica floors over kept and added GPUs together
(:func:`placement.solve.floors.spread`), so the diff stays small and floors hold across re-plans.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from placement.plan import Demand, GpuClass, GpuPlan, Inventory, Plan, Replica, SlicePlan, node_of
from placement.solve.capacity import replica_capacity
from placement.solve.floors import spread
from placement.solve.solver import DEFAULT, TIME_LIMIT, Options, SolverError, candidates, solve
from profiles.catalogue import gpu_model
from profiles.profile import ProfileSet

Action = Literal["enable_mig", "create_slice", "start_mps", "start_replica",
                 "stop_replica", "stop_mps", "destroy_slice", "disable_mig"]


@dataclass(frozen=True)
class Step:
    action: Action
    gpu: str  # GPU id
    gpu_model: str
    slice: SlicePlan | None = None  # the slice acted on (its replicas are the new ones)
    replica: Replica | None = None
    replica_id: str = ""

    def describe(self) -> str:
        where = self.gpu + (f" {self.slice.label}" if self.slice else "")
        what = f" {self.replica.variant} ({self.replica.share:.0%}, batch {self.replica.max_batch})" if self.replica else ""
        return f"{self.action} {where}{what}"


def replica_ids(g: GpuPlan, s: SlicePlan) -> list[str]:
    """Stable ids of a slice's replicas: ``<gpu>/<slice>/<variant>[#k]``."""
    seen: Counter[str] = Counter()
    out = []
    for r in s.replicas:
        seen[r.variant] += 1
        base = f"{g.id}/{s.label}/{r.variant}"
        out.append(base if seen[r.variant] == 1 else f"{base}#{seen[r.variant]}")
    return out


def _slices(plan: Plan | None) -> dict[tuple[str, str], tuple[GpuPlan, SlicePlan]]:
    if plan is None:
        return {}
    return {(g.id, s.label): (g, s) for g in plan.gpus for s in g.slices if s.replicas}


def _rkey(r: Replica) -> tuple:
    return (r.model, r.variant, r.share, r.max_batch)


@dataclass(frozen=True)
class PlanDiff:
    old: Plan | None
    new: Plan
    steps: tuple[Step, ...]

    @property
    def reconfigurations(self) -> int:
        return len(self.steps)

    def capacity_dips(self) -> list[str]:
        """Where, replaying the steps, a model's capacity drops below min(old, new) need."""
        need: dict[str, float] = {d.model: d.required for d in self.new.demands}
        if self.old is not None:
            for d in self.old.demands:
                need[d.model] = min(need.get(d.model, 0.0), d.required) if d.model in need else 0.0
        cap: dict[str, float] = defaultdict(float)
        if self.old is not None:
            for _, _, r in self.old.replicas():
                cap[r.model] += r.capacity
        out = []
        for i, st in enumerate(self.steps):
            if st.replica is None:
                continue
            sign = 1.0 if st.action == "start_replica" else -1.0
            cap[st.replica.model] += sign * st.replica.capacity
            m = st.replica.model
            if sign < 0 and cap[m] + 1e-6 < need.get(m, 0.0):
                out.append(f"step {i} ({st.describe()}): {m} capacity {cap[m]:.0f} < {need[m]:.0f} req/s")
        return out


def diff(old: Plan | None, new: Plan) -> PlanDiff:
    """Steps turning ``old`` (None: nothing configured) into ``new``, make-before-break."""
    o, n = _slices(old), _slices(new)
    old_gpus = {g.id: g for g in old.used()} if old else {}
    make: list[Step] = []
    brk: list[Step] = []
    late: list[Step] = []
    mig_on = {gid for gid, g in old_gpus.items() if g.mig}
    for key, (g, s) in sorted(n.items()):
        prev = o.get(key)
        same_slice = prev is not None and prev[1].mps == s.mps and prev[1].profile == s.profile
        ids = replica_ids(g, s)
        if same_slice:
            have = Counter(_rkey(r) for r in prev[1].replicas)
            keep_share = sum(r.share for r in prev[1].replicas)
            for r, rid in zip(s.replicas, ids, strict=True):
                if have[_rkey(r)] > 0:
                    have[_rkey(r)] -= 1
                    continue
                # a new client fits now only if the old clients leave it room
                room = keep_share + r.share <= 1.0 + 1e-9
                (make if room else late).append(Step("start_replica", g.id, g.gpu, s, r, rid))
                keep_share += r.share if room else 0.0
            continue
        # a new slice: creatable now unless an old slice holds its region or the GPU changes mode
        old_g = old_gpus.get(g.id)
        # (a surviving old slice cannot overlap it: the new plan is legal)
        blocked = old_g is not None and (old_g.mig != g.mig or any(_overlaps(g.gpu, os_, s) for os_ in old_g.slices))
        seq = late if blocked or (prev is not None) else make
        if g.mig and g.id not in mig_on:
            seq.append(Step("enable_mig", g.id, g.gpu))
            mig_on.add(g.id)
        if g.mig:
            seq.append(Step("create_slice", g.id, g.gpu, s))
        if s.mps:
            seq.append(Step("start_mps", g.id, g.gpu, s))
        for r, rid in zip(s.replicas, ids, strict=True):
            seq.append(Step("start_replica", g.id, g.gpu, s, r, rid))
    for key, (g, s) in sorted(o.items()):
        nxt = n.get(key)
        same_slice = nxt is not None and nxt[1].mps == s.mps and nxt[1].profile == s.profile
        keep = Counter(_rkey(r) for r in nxt[1].replicas) if same_slice else Counter()
        for r, rid in zip(s.replicas, replica_ids(g, s), strict=True):
            if keep[_rkey(r)] > 0:
                keep[_rkey(r)] -= 1
                continue
            brk.append(Step("stop_replica", g.id, g.gpu, s, r, rid))
        if not same_slice:
            if s.mps:
                brk.append(Step("stop_mps", g.id, g.gpu, s))
            if g.mig:
                brk.append(Step("destroy_slice", g.id, g.gpu, s))
    # a GPU going from MIG to whole: after its slices are gone, before its new replica starts
    for g in new.used():
        og = old_gpus.get(g.id)
        if og is not None and og.mig and not g.mig:
            late.insert(0, Step("disable_mig", g.id, g.gpu))
    return PlanDiff(old, new, tuple(make + brk + late))


def _overlaps(gpu: str, a: SlicePlan, b: SlicePlan) -> bool:
    """Whether two slices of one GPU share a memory slice (a whole GPU overlaps everything)."""
    if a.start is None or b.start is None:
        return True
    g = gpu_model(gpu)
    return bool(set(g.profile(a.profile).span(a.start)) & set(g.profile(b.profile).span(b.start)))


def _with_slo(plan: Plan, demands: dict[str, Demand], profiles: ProfileSet) -> list[GpuPlan]:
    """Old GPUs keeping the replicas of models still demanded, capacities at the new SLOs."""
    out = []
    for g in plan.used():
        slices = []
        for s in g.slices:
            reps = []
            for r in s.replicas:
                d = demands.get(r.model)
                if d is None:
                    continue
                p = profiles.get(r.variant, g.gpu, s.profile)
                cap = replica_capacity(p, d.slo, r.share, r.max_batch)
                if cap is not None and d.allows(p):
                    reps.append(replace(r, capacity=cap.rate))
            if reps:
                slices.append(replace(s, replicas=tuple(reps)))
        if slices:
            out.append(replace(g, slices=tuple(slices)))
    return out


def _spares(kept: list[GpuPlan], g: GpuPlan, dm: dict[str, Demand]) -> bool:
    """Whether releasing ``g`` keeps every replica floor of its models that ``kept`` meets: as
    many GPUs as the floor, and as many nodes as the floor that ``kept`` already spans."""
    for m in {r.model for s in g.slices for r in s.replicas}:
        floor = dm[m].min_replicas
        if floor <= 1:
            continue
        before = {h.id for h in kept if any(r.model == m for s in h.slices for r in s.replicas)}
        after = before - {g.id}
        if len(after) < floor or len({node_of(i) for i in after}) < min(floor, len({node_of(i) for i in before})):
            return False
    return True


def replan(old: Plan, demands: Sequence[Demand], profiles: ProfileSet, inventory: Inventory,
           method: str = "greedy", *, time_limit: float = TIME_LIMIT, options: Options = DEFAULT) -> tuple[Plan, PlanDiff]:
    """A plan for the new ``demands`` close to ``old``, and the diff from old to new."""
    dm = {d.model: d for d in demands}
    kept = _with_slo(old, dm, profiles)
    cap: dict[str, float] = defaultdict(float)
    for g in kept:
        for s in g.slices:
            for r in s.replicas:
                cap[r.model] += r.capacity
    # release whole GPUs whose replicas are all surplus, least loaded first (a model at rate 0
    # still requires KEEP_SERVED req/s, so it keeps one replica and no share divides by zero)
    def load(g: GpuPlan) -> float:
        return sum(r.capacity / dm[r.model].required for s in g.slices for r in s.replicas)
    for g in sorted(list(kept), key=load):
        lost: dict[str, float] = defaultdict(float)
        for s in g.slices:
            for r in s.replicas:
                lost[r.model] += r.capacity
        if all(cap[m] - v + 1e-9 >= dm[m].required for m, v in lost.items()) and _spares(kept, g, dm):
            kept.remove(g)
            for m, v in lost.items():
                cap[m] -= v
    # the deficit's own floor is 1: the floors are met over kept and added GPUs together, below
    deficit = [replace(d, rate=(d.required - cap[d.model]) / d.factor, min_replicas=1)
               for d in demands if d.required - cap[d.model] > 1e-6]
    used = {g.id for g in kept}
    free = replace(inventory, classes=tuple(
        GpuClass(c.gpu, tuple(i for i in c.ids if i not in used), c.cost_per_hour, c.mig, c.mps)
        for c in inventory.classes if any(i not in used for i in c.ids)))
    if inventory.accuracy_aware:
        # the split of answers across variants, the budget and the floor are the whole plan's:
        # a plan for the deficit alone cannot honour them
        new = solve(demands, profiles, inventory, method, time_limit=time_limit, options=options)
        return new, diff(old, new)
    try:
        part = solve(deficit, profiles, free, method, time_limit=time_limit, options=options,
                     bound=False) if deficit else None
        if part is not None and part.partial:
            # best-effort short on the free GPUs: from scratch it may fit, and says what does not
            raise SolverError("the free GPUs do not place every best-effort deficit")
        extra = part.gpus if part is not None else ()
        gpus, floors = tuple(kept) + tuple(extra), ()
        if any(d.min_replicas > 1 for d in demands):
            cands = candidates(demands, profiles, inventory, options)
            gpus, floors = spread(gpus, demands, inventory, profiles, cands, options)
        new = Plan(gpus, tuple(demands), inventory, f"replan-{method}", 0.0, 0.0, profiles, floors=floors)
    except SolverError:
        # the free GPUs do not suffice: plan from scratch (the diff may then have to move more)
        new = solve(demands, profiles, inventory, method, time_limit=time_limit, options=options)
    return new, diff(old, new)
