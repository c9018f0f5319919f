"""Replica floors: a model's ``min_replicas`` on as many distinct GPUs, and on as many distinct
nodes where the pool has them (anti-affinity), and its ``min_count`` replicas in all, as one
pass over a plan's GPUs.

The floor follows KServe's predictor ``minReplicas`` (kserve/kserve,
``python/kserve/docs/V1beta1ComponentExtensionSpec.md``: "Minimum number of replicas, defaults
to 1") and Kubernetes' ``spec.replicas``, read as a floor: the rate may need more replicas,
never fewer. The spread is what a Deployment gets from required pod anti-affinity on
``kubernetes.io/hostname``: no two of the floor's replicas share a node while another node can
take one; here, no two share a GPU either, since a GPU is what fails.

The greedy and the MILP both plan capacity first and then run :func:`spread` on their GPUs
(the re-planning diff runs it on the kept and the added GPUs), so a floor costs the same in
both and the plan stays deterministic: every choice is ordered by a key that ends in the pool's
GPU order. For each model with a floor above 1, in demand order, while its replicas stand on
fewer nodes than it can reach (at most the floor), then while on fewer GPUs than the floor, one
replica is added on a GPU that holds none of the model's:

1. room already opened first (a free MPS share on a slice of its kind, or a free region of a
   MIG GPU where its slice fits), then a GPU the plan leaves free, of the cheapest class
   (within the pool's ``max_gpus`` and ``max_cost_per_hour``);
2. on opened room the candidate serving the most of the model's requirement, on a free GPU
   the one taking the least of it (its rest stays open for other floors);
3. a move before an add, where one lands on room as cheap: one of the model's replicas on a
   GPU holding another of them (or, to reach a new node, on a node holding another of its
   GPUs), largest first, goes where a candidate of no less capacity fits.

A replica it adds may make another of the model's replicas surplus, one on a GPU holding two
or more, or on a node holding two or more of its GPUs while more GPUs than the floor hold it:
the largest such that capacity still covers the requirement is removed, so moving a replica
costs nothing. Under an accuracy objective or floor, whose split across variants either could
lower, nothing is removed and a replica moves only to its own variant. A floor
still short (fewer GPUs or nodes that can serve the model, or no room left) is reported as a
:class:`placement.plan.FloorShortfall`, never dropped.

The count floor (``min_count``, while the model is served) is the gateway's: its workers share
one port, the kernel hands each a share of the connections, every worker answers every model
and batches only for replicas of its own, so each needs one (docs/scaleout.md). Replicas need
not stand apart for that: after the model's distinct floor, while it has fewer replicas than
the count floor, one is added where :func:`_best` finds room on any GPU, opened room first
(a free MPS share, a free MIG region of a used GPU), then a free GPU within the budget; where
none is left, one of its replicas becomes two at half its MPS share on its slice while
capacity still covers the requirement (one replica sized to a whole GPU leaves no room; not
under an accuracy objective or floor, as the variant's lower capacity may move answers). No
removal (a surplus replica, a released GPU, a trimmed one in a re-plan) takes a model below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from placement.plan import (
    EPS,
    Demand,
    FloorShortfall,
    GpuPlan,
    Inventory,
    Replica,
    SlicePlan,
    node_of,
)
from placement.solve.candidates import Candidate, Options
from profiles.catalogue import WHOLE, Instance, gpu_model, overlap_reason
from profiles.profile import ProfileSet


@dataclass
class _Slice:
    profile: str
    start: int | None
    replicas: list[Replica]


@dataclass
class _Gpu:
    id: str
    gpu: str
    mig: bool
    slices: list[_Slice] = field(default_factory=list)

    def holds(self, model: str) -> int:
        return sum(r.model == model for s in self.slices for r in s.replicas)


@dataclass(frozen=True)
class _Option:
    """One way to add a replica: candidate ``c`` on GPU ``gid`` into its slice ``slot``, or into
    a new slice at ``start`` (``slot`` None; a fresh GPU when ``fresh``)."""

    key: tuple
    gid: str
    c: Candidate
    slot: int | None
    start: int | None
    fresh: bool


def spread(gpus: Sequence[GpuPlan], demands: Sequence[Demand], inv: Inventory, profiles: ProfileSet,
           cands: Sequence[Candidate], opts: Options) -> tuple[tuple[GpuPlan, ...], tuple[FloorShortfall, ...]]:
    """``gpus`` with every floor of ``demands`` met where the pool allows (see the module's
    docstring), and a :class:`FloorShortfall` per floor met short. ``cands``: the candidates of
    ``demands`` on ``inv`` (their model indices)."""
    floored = [mi for mi, d in enumerate(demands) if d.floored]
    if not floored:
        return tuple(gpus), ()
    order = [i for c in inv.classes for i in c.ids]
    rank = {i: k for k, i in enumerate(order)}
    cls_of = {i: ci for ci, c in enumerate(inv.classes) for i in c.ids}
    plan: dict[str, _Gpu] = {}
    outside: list[GpuPlan] = []  # GPUs of the plan that are not in the pool: kept as they are
    for g in gpus:
        if g.id not in cls_of:
            outside.append(g)
            continue
        plan[g.id] = _Gpu(g.id, g.gpu, g.mig, [_Slice(s.profile, s.start, list(s.replicas)) for s in g.slices])
    memory = {(r.variant, g.gpu, s.profile): profiles.get(r.variant, g.gpu, s.profile).memory_mb
              for g in plan.values() for s in g.slices for r in s.replicas}
    drop = not inv.accuracy_aware
    short: list[FloorShortfall] = []
    for mi in floored:
        d = demands[mi]
        mine = [c for c in cands if c.model == mi]
        reach = sorted({i for c in mine for i in inv.classes[c.cls].ids}, key=rank.__getitem__)
        apart = _distinct(plan, mine, d, inv, opts, cls_of, rank, memory, reach, drop) if d.min_replicas > 1 else None
        count = _count(plan, mine, d, inv, opts, cls_of, rank, memory, reach, drop)
        # NOTE: an unmet floor first: a reader taking a model's first record sees what degrades it
        short += [f for f in (count, apart) if f is not None]
    out = [_frozen(g) for g in sorted(plan.values(), key=lambda g: rank[g.id]) if any(s.replicas for s in g.slices)]
    return tuple(out) + tuple(outside), tuple(short)


def _distinct(plan: dict[str, _Gpu], mine: Sequence[Candidate], d: Demand, inv: Inventory, opts: Options,
              cls_of: dict[str, int], rank: dict[str, int], memory: dict[tuple[str, str, str], float],
              reach: Sequence[str], drop: bool) -> FloorShortfall | None:
    """``d``'s ``min_replicas`` on distinct GPUs and nodes in ``plan`` (see the module's
    docstring), or the shortfall. ``reach``: the pool's GPUs that can serve ``d``."""
    reach_nodes = {node_of(i) for i in reach}
    want_nodes = min(d.min_replicas, len(reach_nodes))
    blocked = ""
    while True:
        hosts = [gid for gid, g in plan.items() if g.holds(d.model)]
        nodes = {node_of(h) for h in hosts}
        if len(nodes) < want_nodes:
            new_node = True
        elif len(hosts) < d.min_replicas:
            new_node = False
        else:
            break
        avoid = nodes if new_node else None
        best = _best(plan, mine, d, inv, opts, cls_of, rank, memory, set(hosts), avoid)
        moved = _move(plan, mine, d, inv, opts, cls_of, rank, memory, set(hosts), avoid, new_node, drop)
        if moved is not None and (best is None or moved[0].key[0] <= best.key[0]):
            _add(plan, moved[0], d, memory)
            moved[1].replicas.pop(moved[2])
            continue
        if best is None:
            blocked = _budget_reason(plan, inv, reach) or "no room"
            if new_node and len(hosts) < d.min_replicas:
                want_nodes = len(nodes)  # no other node takes one: other GPUs still may
                continue
            break
        _add(plan, best, d, memory)
        if drop:
            _drop_surplus(plan, d, rank)
    hosts = [gid for gid, g in plan.items() if g.holds(d.model)]
    nodes = {node_of(h) for h in hosts}
    if min(len(hosts), len(nodes)) >= d.min_replicas:
        return None
    return FloorShortfall(d.model, d.min_replicas, len(hosts), len(nodes),
                          _why(d.min_replicas, len(hosts), len(reach), len(reach_nodes), blocked))


def _count(plan: dict[str, _Gpu], mine: Sequence[Candidate], d: Demand, inv: Inventory, opts: Options,
           cls_of: dict[str, int], rank: dict[str, int], memory: dict[tuple[str, str, str], float],
           reach: Sequence[str], split: bool) -> FloorShortfall | None:
    """``d``'s count floor in ``plan``: replicas added where :func:`_best` finds room on any
    GPU, none removed, then (``split``) replicas split; or the shortfall."""
    blocked = ""
    while sum(g.holds(d.model) for g in plan.values()) < d.count_floor:
        best = _best(plan, mine, d, inv, opts, cls_of, rank, memory, set(), None)
        if best is None:
            if split and _split(plan, mine, d, inv, opts, cls_of, rank, memory):
                continue
            blocked = _budget_reason(plan, inv, reach) or ("no room on the pool's GPUs" if reach
                                                           else "no GPU of the pool can serve it")
            break
        _add(plan, best, d, memory)
    if not blocked:
        return None
    hosts = [gid for gid, g in plan.items() if g.holds(d.model)]
    return FloorShortfall(d.model, d.count_floor, len(hosts), len({node_of(h) for h in hosts}), blocked,
                          kind="count", replicas=sum(plan[h].holds(d.model) for h in hosts))


def _split(plan: dict[str, _Gpu], mine: Sequence[Candidate], d: Demand, inv: Inventory, opts: Options,
           cls_of: dict[str, int], rank: dict[str, int], memory: dict[tuple[str, str, str], float]) -> bool:
    """One of ``d``'s replicas made two at half its MPS share on its slice, the largest first,
    where the slice takes another client and capacity still covers the requirement (placed
    short: what it had). False if none can be."""
    total = sum(r.capacity for g in plan.values() for s in g.slices for r in s.replicas if r.model == d.model)
    need = min(d.required, total) - EPS * max(1.0, d.required)
    best: tuple[tuple, _Slice, int, Candidate] | None = None
    for gid, g in plan.items():
        if not (inv.classes[cls_of[gid]].mps and opts.mps):
            continue
        gm = gpu_model(g.gpu)
        for s in g.slices:
            if len(s.replicas) + 1 > gm.mps_client_limit(s.profile):
                continue
            free_mb = gm.slice_memory_gb(s.profile) * 1024.0 - sum(memory[(r.variant, g.gpu, s.profile)]
                                                                     for r in s.replicas)
            for k, r in enumerate(s.replicas):
                for c in mine:
                    if (r.model != d.model or (c.cls, c.slice) != (cls_of[gid], s.profile) or c.profile.variant != r.variant
                            or abs(2 * c.share - r.share) > EPS or c.profile.memory_mb > free_mb + EPS
                            or total - r.capacity + 2 * c.cap.rate < need):
                        continue
                    key = (-r.share * gm.slice_fraction(s.profile), rank[gid], s.start or 0, k)
                    if best is None or key < best[0]:
                        best = (key, s, k, c)
    if best is None:
        return False
    _, s, k, c = best
    half = Replica(d.model, c.profile.variant, c.share, c.cap.max_batch, c.cap.rate)
    s.replicas[k:k + 1] = [half, half]
    return True


def fill(gpus: Sequence[GpuPlan], demands: Sequence[Demand], deficit: dict[int, float], inv: Inventory,
         profiles: ProfileSet, cands: Sequence[Candidate], opts: Options) -> tuple[tuple[GpuPlan, ...], dict[int, float]]:
    """``gpus`` with room they already open (a free MPS share of a slice, a free MIG region)
    taken by replicas for ``deficit`` (req/s short, by index into ``demands``), in demand
    order, most of the deficit served first, as :func:`spread` ranks room. Returns the GPUs and
    the deficits left. A re-plan places here first: the GPUs are running, and a replica added
    beside the others changes nothing that serves."""
    order = [i for c in inv.classes for i in c.ids]
    rank = {i: k for k, i in enumerate(order)}
    cls_of = {i: ci for ci, c in enumerate(inv.classes) for i in c.ids}
    plan = {g.id: _Gpu(g.id, g.gpu, g.mig, [_Slice(s.profile, s.start, list(s.replicas)) for s in g.slices])
            for g in gpus if g.id in cls_of}
    memory = {(r.variant, g.gpu, s.profile): profiles.get(r.variant, g.gpu, s.profile).memory_mb
              for g in plan.values() for s in g.slices for r in s.replicas}
    left, changed = dict(deficit), set()
    for mi in sorted(left):
        mine = [c for c in cands if c.model == mi]
        while left[mi] > EPS * max(1.0, demands[mi].required):
            d = replace(demands[mi], rate=left[mi] / demands[mi].factor)
            o = _best(plan, mine, d, inv, opts, cls_of, rank, memory, set(), None, opened=True)
            if o is None:
                break
            _add(plan, o, d, memory)
            changed.add(o.gid)
            left[mi] = max(0.0, left[mi] - o.c.cap.rate)
    mps = {(g.id, s.profile, s.start): s.mps for g in gpus for s in g.slices}  # a running slice keeps its mode
    out = []
    for g in gpus:
        if g.id not in changed:
            out.append(g)
            continue
        f = _frozen(plan[g.id])
        out.append(replace(f, slices=tuple(replace(s, mps=mps.get((g.id, s.profile, s.start), s.mps))
                                           for s in f.slices)))
    return tuple(out), left


def placed(gpus: Sequence[GpuPlan], demands: Sequence[Demand]) -> dict[int, float]:
    """Planned req/s per model index, read from the GPUs."""
    index = {d.model: mi for mi, d in enumerate(demands)}
    out: dict[int, float] = {}
    for g in gpus:
        for s in g.slices:
            for r in s.replicas:
                if r.model in index:
                    out[index[r.model]] = out.get(index[r.model], 0.0) + r.capacity
    return out


def _why(floor: int, gpus: int, reach: int, reach_nodes: int, blocked: str) -> str:
    if gpus < floor:
        if reach < floor:
            return f"only {reach} GPU{'s' if reach != 1 else ''} can serve it"
        return f"{blocked} on the pool's other GPUs" if blocked == "no room" else blocked
    if reach_nodes < floor:
        return f"only {reach_nodes} node{'s' if reach_nodes != 1 else ''}"
    return f"{blocked} on the pool's other nodes" if blocked == "no room" else blocked


def _budget_reason(plan: dict[str, _Gpu], inv: Inventory, reach: Sequence[str]) -> str:
    """``max_gpus 2 allows no more GPUs`` when the budget, not the pool, kept a free GPU out."""
    by_id = inv.by_id()
    used = [gid for gid, g in plan.items() if any(s.replicas for s in g.slices)]
    free = [i for i in reach if i not in used]
    if not free:
        return ""
    if inv.max_gpus is not None and len(used) >= inv.max_gpus:
        return f"max_gpus {inv.max_gpus} allows no more GPUs"
    spent = sum(by_id[i].cost_per_hour for i in used)
    if (inv.max_cost_per_hour is not None
            and spent + min(by_id[i].cost_per_hour for i in free) > inv.max_cost_per_hour + EPS):
        return f"max_cost_per_hour {inv.max_cost_per_hour:g} allows no more GPUs"
    return ""


def _move(plan: dict[str, _Gpu], mine: Sequence[Candidate], d: Demand, inv: Inventory, opts: Options,
          cls_of: dict[str, int], rank: dict[str, int], memory: dict[tuple[str, str, str], float],
          hosts: set[str], avoid_nodes: set[str] | None, new_node: bool,
          any_variant: bool) -> tuple[_Option, _Slice, int] | None:
    """A replica of ``d`` that can move where :func:`_best` would add one, with no less
    capacity there (of its own variant unless ``any_variant``): one on a GPU holding another of
    its replicas, or (``new_node``) on a node holding another of its GPUs; the largest first.
    None if none can."""
    per_node: dict[str, int] = {}
    for h in hosts:
        per_node[node_of(h)] = per_node.get(node_of(h), 0) + 1
    movable = []
    for g in plan.values():
        n = g.holds(d.model)
        if n == 0 or (n == 1 and not (new_node and per_node[node_of(g.id)] > 1)):
            continue
        frac = gpu_model(g.gpu).slice_fraction
        for s in g.slices:
            for k, r in enumerate(s.replicas):
                if r.model == d.model:
                    movable.append(((-r.share * frac(s.profile), r.capacity, rank[g.id], s.start or 0, k), s, k, r))
    for _, s, k, r in sorted(movable, key=lambda t: t[0]):
        o = _best(plan, mine, d, inv, opts, cls_of, rank, memory, hosts, avoid_nodes, least=r.capacity,
                  variant=None if any_variant else r.variant)
        if o is not None:
            return o, s, k
    return None


def _best(plan: dict[str, _Gpu], mine: Sequence[Candidate], d: Demand, inv: Inventory, opts: Options,
          cls_of: dict[str, int], rank: dict[str, int], memory: dict[tuple[str, str, str], float],
          hosts: set[str], avoid_nodes: set[str] | None, least: float = 0.0,
          variant: str | None = None, opened: bool = False) -> _Option | None:
    """The best way to add one replica of ``d`` on a GPU outside ``hosts`` (and outside
    ``avoid_nodes`` when given), of at least ``least`` req/s (of ``variant`` when given; only
    on GPUs the plan uses when ``opened``), or None."""
    used = {gid for gid, g in plan.items() if any(s.replicas for s in g.slices)}
    by_id = inv.by_id()
    spent_gpus = len(used)
    spent_cost = sum(by_id[g].cost_per_hour for g in used)
    best: _Option | None = None
    for gid, ci in cls_of.items():
        if gid in hosts or (avoid_nodes is not None and node_of(gid) in avoid_nodes):
            continue
        cls = inv.classes[ci]
        fresh = gid not in used
        if fresh and opened:
            continue
        if fresh and ((inv.max_gpus is not None and spent_gpus + 1 > inv.max_gpus) or
                      (inv.max_cost_per_hour is not None
                       and spent_cost + cls.cost_per_hour > inv.max_cost_per_hour + EPS)):
            continue
        g = plan.get(gid) if not fresh else None
        gm = gpu_model(cls.gpu)
        for c in mine:
            if c.cls != ci or c.cap.rate + EPS * max(1.0, least) < least or variant not in (None, c.profile.variant):
                continue
            served = min(c.cap.rate, d.required)
            for slot, start in _room(g, c, gm, cls.mps and opts.mps, memory):
                tail = (-c.accuracy, rank[gid], c.profile.variant, c.slice, c.share)
                if fresh:  # a whole GPU more: the cheapest class, then the least of it taken
                    key: tuple = (1, inv.weight(cls), c.gpu_fraction, -served, *tail)
                else:  # free room: an opened slice first, then the most of the requirement served
                    key = (0, int(slot is None), -served, c.gpu_fraction, *tail)
                if best is None or key < best.key:
                    best = _Option(key, gid, c, slot, start, fresh)
    return best


def _room(g: _Gpu | None, c: Candidate, gm, mps: bool,  # noqa: ANN001  (profiles.catalogue.GpuModel)
          memory: dict[tuple[str, str, str], float]) -> list[tuple[int | None, int | None]]:
    """Where candidate ``c`` fits on ``g`` (None: a free GPU): ``(slice index, None)`` into an
    opened slice, ``(None, start)`` as a new slice; at most one of each, first legal."""
    whole = c.slice == WHOLE
    if g is None:
        return [(None, None if whole else gm.profile(c.slice).starts[0])]
    out: list[tuple[int | None, int | None]] = []
    limit_mb = gm.slice_memory_gb(c.slice) * 1024.0
    for k, s in enumerate(g.slices):
        if s.profile != c.slice or not s.replicas or not mps:
            continue
        shares = sum(r.share for r in s.replicas)
        used_mb = sum(memory[(r.variant, g.gpu, s.profile)] for r in s.replicas)
        if (shares + c.share <= 1.0 + EPS and len(s.replicas) + 1 <= gm.mps_client_limit(s.profile)
                and used_mb + c.profile.memory_mb <= limit_mb + EPS):
            out.append((k, None))
            break
    if g.mig and not whole:
        have = tuple(Instance(s.start, s.profile) for s in g.slices if s.start is not None and s.replicas)
        for start in gm.profile(c.slice).starts:
            if overlap_reason(gm, (*have, Instance(start, c.slice))) is None:
                out.append((None, start))
                break
    return out


def _add(plan: dict[str, _Gpu], o: _Option, d: Demand, memory: dict[tuple[str, str, str], float]) -> None:
    c = o.c
    r = Replica(d.model, c.profile.variant, c.share, c.cap.max_batch, c.cap.rate)
    g = plan.get(o.gid)
    if g is None or o.fresh:
        g = plan[o.gid] = _Gpu(o.gid, c.profile.gpu, c.slice != WHOLE)
    memory[(c.profile.variant, g.gpu, c.slice)] = c.profile.memory_mb
    if o.slot is not None:
        g.slices[o.slot].replicas.append(r)
    else:
        g.slices.append(_Slice(c.slice, o.start, [r]))
        g.slices.sort(key=lambda s: s.start or 0)


def _drop_surplus(plan: dict[str, _Gpu], d: Demand, rank: dict[str, int]) -> None:
    """Remove the largest replica of ``d`` whose capacity the model can spare and whose GPU
    the floor can spare (its GPU holds another, or the model keeps the floor's GPUs and every
    node it stands on without it): the one just added moved it. Never one the count floor needs."""
    if sum(g.holds(d.model) for g in plan.values()) <= d.count_floor:
        return
    total = sum(r.capacity for g in plan.values() for s in g.slices for r in s.replicas if r.model == d.model)
    hosts = [gid for gid, g in plan.items() if g.holds(d.model)]
    per_node: dict[str, int] = {}
    for h in hosts:
        per_node[node_of(h)] = per_node.get(node_of(h), 0) + 1
    best: tuple[tuple, _Slice, int] | None = None
    for g in plan.values():
        n = g.holds(d.model)
        if n == 0 or (n == 1 and (len(hosts) <= d.min_replicas or per_node[node_of(g.id)] < 2)):
            continue
        for s in g.slices:
            for k, r in enumerate(s.replicas):
                if r.model != d.model or total - r.capacity + EPS * max(1.0, d.required) < d.required:
                    continue
                taken = r.share * gpu_model(g.gpu).slice_fraction(s.profile)
                key = (-taken, r.capacity, rank[g.id], s.start or 0, k)
                if best is None or key < best[0]:
                    best = (key, s, k)
    if best is not None:
        best[1].replicas.pop(best[2])


def _frozen(g: _Gpu) -> GpuPlan:
    slices = tuple(SlicePlan(s.profile, s.start, len(s.replicas) > 1 or s.replicas[0].share < 1.0,
                             tuple(s.replicas)) for s in g.slices if s.replicas)
    return GpuPlan(g.id, g.gpu, g.mig, slices)
