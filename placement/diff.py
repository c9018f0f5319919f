"""Re-planning: a ``PlanDiff`` between two plans, ordered make-before-break, and ``replan``.

A diff is a sequence of steps (create a slice, start an MPS daemon, start or stop a replica,
...). Steps that only add go first; then each replacement on a slice both plans hold, one at
a time: the successor starts beside its predecessor (their shares oversubscribe the slice
for the handover, which MPS and time-slicing both allow; memory must fit both), then the
predecessor stops. Removals follow; additions that need space a removal frees go last.
:meth:`PlanDiff.dips` replays the steps and names every point where a model's serving
capacity falls below the lower of its old and new requirement.

A replica's identity is everything that changes what it serves: model, variant, share, max
batch and its ``revision`` (the artifact's digest and Triton settings). A kept replica keeps
its id; a successor gets one its predecessor does not hold.

``replan`` keeps every old replica that still helps, releases whole GPUs whose replicas have
become surplus (never one a replica floor still needs: a GPU of its distinct floor, a replica
of its count), places the deficit first in room the kept GPUs leave
(:func:`placement.solve.floors.fill`), then on free GPUs, and then meets the replica floors
over kept and added GPUs together (:func:`placement.solve.floors.spread`), so the diff stays
small and floors hold across re-plans.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from placement.plan import (
    KEEP_SERVED,
    Demand,
    GpuClass,
    GpuPlan,
    Inventory,
    Plan,
    Replica,
    SlicePlan,
    drop_replica,
    node_of,
)
from placement.solve.capacity import replica_capacity
from placement.solve.floors import fill, spread
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


def _name(r: Replica) -> str:
    return r.variant + (f"~{r.revision[:8]}" if r.revision else "")


def replica_ids(g: GpuPlan, s: SlicePlan) -> list[str]:
    """Ids of a slice's replicas: each one's own once a diff named it, else
    ``<gpu>/<slice>/<variant>[~<revision>][#k]`` by position."""
    seen: Counter[str] = Counter()
    out = []
    for r in s.replicas:
        seen[_name(r)] += 1
        base = f"{g.id}/{s.label}/{_name(r)}"
        out.append(r.id or (base if seen[_name(r)] == 1 else f"{base}#{seen[_name(r)]}"))
    return out


def _fresh_id(g: GpuPlan, s: SlicePlan, r: Replica, taken: set[str]) -> str:
    base, k = f"{g.id}/{s.label}/{_name(r)}", 1
    rid = base
    while rid in taken:
        k += 1
        rid = f"{base}#{k}"
    taken.add(rid)
    return rid


def _slices(plan: Plan | None) -> dict[tuple[str, str], tuple[GpuPlan, SlicePlan]]:
    if plan is None:
        return {}
    return {(g.id, s.label): (g, s) for g in plan.gpus for s in g.slices if s.replicas}


def _rkey(r: Replica) -> tuple:
    return (r.model, r.variant, r.share, r.max_batch, r.revision)


def _memory_mb(plans: Sequence[Plan | None], r: Replica, gpu: str, slice_profile: str) -> float:
    """A replica's memory from the first plan whose profiles know its variant there (0: none)."""
    for p in plans:
        if p is not None and p.profiles is not None:
            found = p.profiles.find(variant=r.variant, gpu=gpu, slice=slice_profile)
            if found:
                return found[0].memory_mb
    return 0.0


@dataclass(frozen=True)
class PlanDiff:
    old: Plan | None
    new: Plan  # every replica carries its id (a kept one its old id)
    steps: tuple[Step, ...]

    @property
    def reconfigurations(self) -> int:
        return len(self.steps)

    def dips(self) -> list[tuple[int, str, float, float]]:
        """Where, replaying the steps, a model's capacity drops below the lower of its old and
        new requirement: (step index, model, capacity then, requirement), req/s."""
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
            m = st.replica.model
            cap[m] += sign * st.replica.capacity
            if sign < 0 and cap[m] + 1e-6 < need.get(m, 0.0):
                out.append((i, m, max(0.0, cap[m]), need[m]))
        return out

    def down(self, i: int, model: str) -> int:
        """Replicas of ``model`` short after step ``i``: fewer running than both plans hold."""
        def count(p: Plan | None) -> int:
            return sum(1 for _, _, r in p.replicas() if r.model == model) if p is not None else 0
        running = before = count(self.old)
        for st in self.steps[:i + 1]:
            if st.replica is not None and st.replica.model == model:
                running += 1 if st.action == "start_replica" else -1
        return max(0, min(before, count(self.new)) - running)

    def capacity_dips(self) -> list[str]:
        """:meth:`dips`, each as one line."""
        return [f"step {i} ({self.steps[i].describe()}): {m} capacity {c:.0f} < {n:.0f} req/s"
                for i, m, c, n in self.dips()]


@dataclass
class _SliceChange:
    """One slice both plans hold alike (profile, start, MPS): which replicas stay, start and stop."""

    make: list[Step]
    # successors started beside their predecessors, then the predecessors stopped: groups of
    # (successor, predecessor) pairs the slice holds all at once (one model, up to its surge)
    swap: list[list[tuple[Step, Step]]]
    stop: list[Step]
    late: list[Step]  # starts that need room a stop frees
    replicas: tuple[Replica, ...]  # the new slice's, each with its id


def _same_slice(g: GpuPlan, s: SlicePlan, og: GpuPlan, os_: SlicePlan, plans: Sequence[Plan | None],
                surge: Mapping[str, int]) -> _SliceChange:
    """Kept replicas keep their ids; a new one starts now where the slice has room (share, MPS
    clients, memory), else beside one of the old ones it replaces (preferring the same model)
    when memory allows (their shares oversubscribe the slice for the handover), up to
    ``surge[model]`` of one model beside theirs at once, else after the removals."""
    gm = gpu_model(g.gpu)
    olds = list(zip(os_.replicas, replica_ids(og, os_), strict=True))
    pool: dict[tuple, list[tuple[Replica, str]]] = defaultdict(list)
    for r, rid in olds:
        pool[_rkey(r)].append((r, rid))
    taken = {rid for _, rid in olds}
    ids: list[str | None] = []
    for r in s.replicas:
        ids.append(pool[_rkey(r)].pop(0)[1] if pool[_rkey(r)] else None)
    added = [i for i, rid in enumerate(ids) if rid is None]
    for i in added:
        ids[i] = _fresh_id(g, s, s.replicas[i], taken)
    left = {rid for lst in pool.values() for _, rid in lst}
    removed = [(r, rid) for r, rid in olds if rid in left]  # in the old slice's order
    share = sum(r.share for r, _ in olds)
    mem = sum(_memory_mb(plans, r, g.gpu, s.profile) for r, _ in olds)
    clients, limit = len(olds), gm.mps_client_limit(s.profile) if s.mps else 1
    limit_mb = gm.slice_memory_gb(s.profile) * 1024.0 + 1e-6
    out = _SliceChange([], [], [], [], tuple(replace(r, id=rid or "") for r, rid in zip(s.replicas, ids, strict=True)))
    group: list[tuple[Step, Step]] = []  # successors starting together, their predecessors still running

    def handed_over() -> None:  # the group's predecessors stop: their share and memory are free again
        nonlocal share, mem
        if group:
            out.swap.append(list(group))
            for _, stop in group:
                ro = stop.replica
                assert ro is not None
                share, mem = share - ro.share, mem - _memory_mb(plans, ro, g.gpu, s.profile)
            group.clear()

    for i in added:
        r = out.replicas[i]
        need = _memory_mb(plans, r, g.gpu, s.profile)
        start = Step("start_replica", g.id, g.gpu, s, r, r.id)
        if s.mps and share + r.share <= 1.0 + 1e-9 and clients + len(group) < limit and mem + need <= limit_mb:
            out.make.append(start)
            share, mem, clients = share + r.share, mem + need, clients + 1
            continue
        if removed:
            if group and (group[0][0].replica.model != r.model  # type: ignore[union-attr]
                          or len(group) >= max(1, surge.get(r.model, 1))):
                handed_over()
            if mem + need > limit_mb or (s.mps and clients + len(group) >= gm.mps_client_limit(s.profile)):
                handed_over()  # the slice cannot hold one more beside the group: the group first
            if mem + need <= limit_mb and not (s.mps and clients + len(group) >= gm.mps_client_limit(s.profile)):
                k = next((j for j, (ro, _) in enumerate(removed) if ro.model == r.model), 0)
                ro, rid = removed.pop(k)
                group.append((start, Step("stop_replica", og.id, og.gpu, os_, ro, rid)))
                share, mem = share + r.share, mem + need
                continue
        out.late.append(start)
    handed_over()
    out.stop = [Step("stop_replica", og.id, og.gpu, os_, ro, rid) for ro, rid in removed]
    return out


def diff(old: Plan | None, new: Plan, surge: Mapping[str, int] | None = None) -> PlanDiff:
    """Steps turning ``old`` (None: nothing configured) into ``new``, make-before-break: what
    only adds first, then successors beside their predecessors (a rolling replacement), then
    removals, then what needs the room they free. The diff's plan is ``new`` with every
    replica's id (kept replicas keep theirs). ``surge``: model -> successors started at once
    (Kubernetes' ``maxSurge``; default 1), see :func:`_swap_waves`."""
    o, n = _slices(old), _slices(new)
    old_gpus = {g.id: g for g in old.used()} if old else {}
    plans = (new, old)
    make: list[Step] = []
    swaps: list[list[list[tuple[Step, Step]]]] = []  # per slice, its groups of (successor, predecessor)
    brk: list[Step] = []
    late: list[Step] = []
    mig_on = {gid for gid, g in old_gpus.items() if g.mig}
    named: dict[tuple[str, str], tuple[Replica, ...]] = {}
    for key, (g, s) in sorted(n.items()):
        prev = o.get(key)
        if prev is not None and prev[1].mps == s.mps and prev[1].profile == s.profile:
            ch = _same_slice(g, s, prev[0], prev[1], plans, surge or {})
            make += ch.make
            swaps.append(ch.swap)
            brk += ch.stop
            late += ch.late
            named[key] = ch.replicas
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
        reps = named[key] = tuple(replace(r, id=rid) for r, rid in zip(s.replicas, replica_ids(g, s), strict=True))
        for r in reps:
            seq.append(Step("start_replica", g.id, g.gpu, s, r, r.id))
    for key, (g, s) in sorted(o.items()):
        nxt = n.get(key)
        if nxt is not None and nxt[1].mps == s.mps and nxt[1].profile == s.profile:
            continue  # its stops are the slice change's
        for r, rid in zip(s.replicas, replica_ids(g, s), strict=True):
            brk.append(Step("stop_replica", g.id, g.gpu, s, r, rid))
        if s.mps:
            brk.append(Step("stop_mps", g.id, g.gpu, s))
        if g.mig:
            brk.append(Step("destroy_slice", g.id, g.gpu, s))
    # a GPU going from MIG to whole: after its slices are gone, before its new replica starts
    for g in new.used():
        og = old_gpus.get(g.id)
        if og is not None and og.mig and not g.mig:
            late.insert(0, Step("disable_mig", g.id, g.gpu))
    gpus = tuple(replace(g, slices=tuple(replace(s, replicas=named.get((g.id, s.label), s.replicas))
                                         for s in g.slices)) for g in new.gpus)
    return PlanDiff(old, replace(new, gpus=gpus), tuple(make + _swap_waves(swaps, surge or {}) + brk + late))


def _swap_waves(swaps: Sequence[Sequence[Sequence[tuple[Step, Step]]]], surge: Mapping[str, int]) -> list[Step]:
    """The replacements as waves: up to ``surge[model]`` successors of one model start
    together, then their predecessors stop. A wave takes at most one group of each slice (the
    pairs its memory and MPS clients hold at once) and each slice's groups stay in order, so
    every successor finds the room it was planned with. With a surge of 1, one pair at a
    time, in slice order."""
    queues = [list(q) for q in swaps if q]
    out: list[Step] = []
    while queues:
        model = queues[0][0][0][0].replica.model  # type: ignore[union-attr]
        room = max(1, surge.get(model, 1))
        wave: list[tuple[Step, Step]] = []
        for q in queues:
            if q[0][0][0].replica.model == model and (not wave or len(wave) + len(q[0]) <= room):  # type: ignore[union-attr]
                wave += q.pop(0)
        out += [start for start, _ in wave] + [stop for _, stop in wave]
        queues = [q for q in queues if q]
    return out


def waves(steps: Sequence[Step], surge: Mapping[str, int]) -> list[list[Step]]:
    """``steps`` as the executor runs them: each run of consecutive replica starts of one
    model, up to ``surge[model]`` (default 1) at a time, together; every other step alone."""
    out: list[list[Step]] = []
    for st in steps:
        last = out[-1] if out else None
        if (last is not None and st.action == "start_replica" and st.replica is not None
                and all(p.action == "start_replica" and p.replica is not None
                        and p.replica.model == st.replica.model for p in last)
                and len(last) < max(1, surge.get(st.replica.model, 1))):
            last.append(st)
        else:
            out.append([st])
    return out


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
                found = profiles.find(variant=r.variant, gpu=g.gpu, slice=s.profile)
                if not found:  # its profile left with the documents that named it: a replacement
                    continue
                p = found[0]
                cap = replica_capacity(p, d.slo, r.share, r.max_batch)
                if cap is not None and d.allows(p):
                    reps.append(replace(r, capacity=cap.rate))
            if reps:
                slices.append(replace(s, replicas=tuple(reps)))
        if slices:
            out.append(replace(g, slices=tuple(slices)))
    return out


def _spares(kept: list[GpuPlan], g: GpuPlan, dm: dict[str, Demand]) -> bool:
    """Whether releasing ``g`` keeps every replica floor of its models that ``kept`` meets."""
    held = Counter(r.model for s in g.slices for r in s.replicas)
    return all(_keeps(kept, g, dm[m], n) for m, n in held.items())


def _keeps(kept: list[GpuPlan], g: GpuPlan, d: Demand, lose: int) -> bool:
    """Whether ``kept`` without ``lose`` of ``g``'s replicas of ``d`` keeps its floors: its
    count floor in all, and, where ``g`` keeps none, as many GPUs as its floor and as many nodes
    as the floor that ``kept`` already spans."""
    if not d.floored:
        return True
    on = [h for h in kept if any(r.model == d.model for s in h.slices for r in s.replicas)]
    count = sum(r.model == d.model for h in on for s in h.slices for r in s.replicas)
    if count - lose < d.count_floor:
        return False
    floor = d.min_replicas
    if floor <= 1 or lose < sum(r.model == d.model for s in g.slices for r in s.replicas):
        return True
    before = {h.id for h in on}
    after = before - {g.id}
    return len(after) >= floor and len({node_of(i) for i in after}) >= min(floor, len({node_of(i) for i in before}))


def _trim(kept: list[GpuPlan], dm: dict[str, Demand], cap: dict[str, float]) -> list[GpuPlan]:
    """``kept`` without the replicas a model can spare (capacity above its requirement without
    it), the largest such first, so load that fell frees room on a GPU that stays; never one
    a replica floor still needs (its GPU, or its count). ``cap`` is updated."""
    gpus = list(kept)
    while True:
        best = None
        for gi, g in enumerate(gpus):
            for si, s in enumerate(g.slices):
                for ri, r in enumerate(s.replicas):
                    if cap[r.model] - r.capacity + 1e-9 < dm[r.model].required:
                        continue
                    if not _keeps(gpus, g, dm[r.model], 1):
                        continue
                    if best is None or r.capacity > best[0]:
                        best = (r.capacity, gi, si, ri)
        if best is None:
            return gpus
        r = drop_replica(gpus, *best[1:])
        cap[r.model] -= r.capacity


def stamp(plan: Plan, revisions: Mapping[tuple[str, str], str]) -> Plan:
    """``plan`` with each replica's revision set from ``revisions`` (by model and variant; "" where absent)."""
    def one(r: Replica) -> Replica:
        rev = revisions.get((r.model, r.variant), "")
        return r if r.revision == rev else replace(r, revision=rev)
    return replace(plan, gpus=tuple(replace(g, slices=tuple(replace(s, replicas=tuple(one(r) for r in s.replicas))
                                                            for s in g.slices)) for g in plan.gpus))


def replan(old: Plan, demands: Sequence[Demand], profiles: ProfileSet, inventory: Inventory,
           method: str = "greedy", *, time_limit: float = TIME_LIMIT, options: Options = DEFAULT,
           revisions: Mapping[tuple[str, str], str] | None = None,
           surge: Mapping[str, int] | None = None) -> tuple[Plan, PlanDiff]:
    """A plan for the new ``demands`` close to ``old``, and the diff from old to new (the
    diff's plan names every replica). ``revisions``: what each (model, variant) serves now; a
    kept replica of another revision is replaced in place, ``surge[model]`` at a time (default 1)."""
    dm = {d.model: d for d in demands}
    kept = _with_slo(old, dm, profiles)
    cap: dict[str, float] = defaultdict(float)
    for g in kept:
        for s in g.slices:
            for r in s.replicas:
                cap[r.model] += r.capacity
    # release whole GPUs whose replicas are all surplus, least loaded first (a model at rate 0
    # still requires KEEP_SERVED req/s, so it keeps one replica, unless scaled to zero)
    def load(g: GpuPlan) -> float:
        return sum(r.capacity / max(dm[r.model].required, KEEP_SERVED) for s in g.slices for r in s.replicas)
    for g in sorted(list(kept), key=load):
        lost: dict[str, float] = defaultdict(float)
        for s in g.slices:
            for r in s.replicas:
                lost[r.model] += r.capacity
        if all(cap[m] - v + 1e-9 >= dm[m].required for m, v in lost.items()) and _spares(kept, g, dm):
            kept.remove(g)
            for m, v in lost.items():
                cap[m] -= v
    kept = _trim(kept, dm, cap)
    if inventory.accuracy_aware:
        # the split of answers across variants, the budget and the floor are the whole plan's:
        # a plan for the deficit alone cannot honour them
        new = stamp(solve(demands, profiles, inventory, method, time_limit=time_limit, options=options),
                    revisions or {})
        d = diff(old, new, surge)
        return d.new, d
    short = {mi: d.required - cap[d.model] for mi, d in enumerate(demands) if d.required - cap[d.model] > 1e-6}
    cands = None
    if short:  # first into room the running GPUs leave: nothing that serves moves
        cands = candidates(demands, profiles, inventory, options)
        filled, short = fill(kept, demands, short, inventory, profiles, cands, options)
        kept = list(filled)
    # the deficit's own floors are 1 and no count: the floors are met over kept and added GPUs
    # together, below
    deficit = [replace(demands[mi], rate=v / demands[mi].factor, min_replicas=1, min_count=0)
               for mi, v in short.items() if v > 1e-6]
    used = {g.id for g in kept}
    free = replace(inventory, classes=tuple(
        GpuClass(c.gpu, tuple(i for i in c.ids if i not in used), c.cost_per_hour, c.mig, c.mps)
        for c in inventory.classes if any(i not in used for i in c.ids)))
    try:
        part = solve(deficit, profiles, free, method, time_limit=time_limit, options=options,
                     bound=False) if deficit else None
        if part is not None and part.partial:
            # best-effort short on the free GPUs: from scratch it may fit, and says what does not
            raise SolverError("the free GPUs do not place every best-effort deficit")
        extra = part.gpus if part is not None else ()
        gpus, floors = tuple(kept) + tuple(extra), ()
        if any(d.floored for d in demands):
            cands = cands or candidates(demands, profiles, inventory, options)
            gpus, floors = spread(gpus, demands, inventory, profiles, cands, options)
        new = Plan(gpus, tuple(demands), inventory, f"replan-{method}", 0.0, 0.0, profiles, floors=floors)
    except SolverError:
        # the free GPUs do not suffice: plan from scratch (the diff may then have to move more)
        new = solve(demands, profiles, inventory, method, time_limit=time_limit, options=options)
    d = diff(old, stamp(new, revisions or {}), surge)
    return d.new, d
