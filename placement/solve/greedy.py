"""The fast greedy: first-fit decreasing onto concrete GPUs, preferring room already opened.

Guaranteed demand is placed first, then best-effort into what is left (room already opened
first, then the GPUs still free); where the pool holds everything, a pass over every model
together may be cheaper and is then taken. Within each pass:
Phase 1, for every model in decreasing order of required rate, one of two (the greedy plans
both and keeps the cheaper): bulk, whole replicas of its most efficient candidate (capacity
per unit of GPU cost) while they do not exceed what is left; or cover, the set of whole
replicas of least GPU cost that covers it (:func:`placement.solve.bound.cheapest_cover`).
Phase 2 (remainders, largest first): a replica that fits in room already opened (free MPS
share on a slice, or a free slice of a GPU whose layout is chosen) when it covers what is left,
or when it is nearly as efficient as a new GPU would be; otherwise a new GPU for the cheapest
candidate that covers the rest (or the most efficient one).
A new GPU takes the layout holding the most slices of the candidate's kind; the rest of that
layout stays open for later replicas.
When the pool runs out, best-effort demand is left unplaced (:attr:`Greedy.unplaced`) and
guaranteed demand goes on onto GPUs beyond the pool, counted in :attr:`Greedy.missing`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from placement.plan import Demand, GpuPlan, Inventory, Replica, SlicePlan
from placement.solve.bound import cheapest_cover
from placement.solve.candidates import (
    Candidate,
    LayoutOption,
    Options,
    SolverError,
    Start,
    layout_options,
)
from profiles.catalogue import WHOLE, Instance

FIT_EFFICIENCY = 1.0  # opened room serving part of a remainder: as efficient as a new GPU, per req/s it serves
COVER_SLACK = 1.0  # opened room covering a remainder is taken only if no dearer than a new GPU's cheapest cover


@dataclass
class _Slot:
    gpu: int
    inst: Instance
    free: float = 1.0
    replicas: list[Replica] = field(default_factory=list)


@dataclass
class _Gpu:
    cls: int
    layout: LayoutOption
    slots: list[_Slot]
    beyond: bool = False  # past the pool's GPUs of its class (guaranteed demand that does not fit)


@dataclass(frozen=True)
class Greedy:
    """The greedy's plan, the same plan as the program's values (the MILP's start), the
    best-effort req/s it found no room for (model index -> req/s) and the GPUs beyond the pool
    its guaranteed demand needs (class index -> count; the plan is void when any)."""

    gpus: tuple[GpuPlan, ...]
    start: Start
    unplaced: dict[int, float]
    missing: dict[int, int]


@dataclass(frozen=True)
class _Lookup:
    """What every pass of the greedy reads of the candidates, built once for them all."""

    index: dict[int, int]  # id(candidate) -> its index in the candidates
    by_model: dict[int, list[Candidate]]  # model index -> its candidates, in their order
    weights: dict[int, float]  # id(candidate) -> one replica's GPU cost: class weight x GPU fraction
    layouts: dict[int, list[LayoutOption]]  # class index -> the layouts its GPUs can take

    @classmethod
    def of(cls, inv: Inventory, cands: list[Candidate], opts: Options) -> _Lookup:
        by_model: dict[int, list[Candidate]] = defaultdict(list)
        for c in cands:
            by_model[c.model].append(c)
        class_weight = [inv.weight(c) for c in inv.classes]
        return cls({id(c): j for j, c in enumerate(cands)}, by_model,
                   {id(c): class_weight[c.cls] * c.gpu_fraction for c in cands},
                   {ci: layout_options(c, opts) for ci, c in enumerate(inv.classes)})


def greedy_gpus(demands: Sequence[Demand], inv: Inventory, cands: list[Candidate],
                opts: Options) -> tuple[GpuPlan, ...]:
    """The greedy's GPUs; :class:`SolverError` if any demand does not fit the pool."""
    g = greedy_choice(demands, inv, cands, opts)
    if g.missing or g.unplaced:
        short = [f"model {demands[mi].model} ({r:.0f} req/s unplaced)" for mi, r in g.unplaced.items()]
        raise SolverError(f"the pool ran out of GPUs: {', '.join(short) or missing_text(inv, g.missing)}")
    return g.gpus


def missing_text(inv: Inventory, missing: dict[int, int]) -> str:
    """``3 more GPUs (2 x H100-80GB, 1 x A30-24GB)``."""
    by_gpu: dict[str, int] = defaultdict(int)
    for ci, n in missing.items():
        by_gpu[inv.classes[ci].gpu] += n
    parts = ", ".join(f"{n} x {g}" for g, n in sorted(by_gpu.items(), key=lambda t: (-t[1], t[0])))
    return f"{sum(by_gpu.values())} more GPU{'s' if sum(by_gpu.values()) != 1 else ''} ({parts})"


def greedy_choice(demands: Sequence[Demand], inv: Inventory, cands: list[Candidate],
                  opts: Options) -> Greedy:
    """The greedy's plan. Guaranteed demand first, then best-effort into what is left; where
    the pool holds everything either way, also every model in one pass, largest first, and the
    cheaper of the plans (placing by class only matters when the pool runs short)."""
    def spend(g: Greedy) -> float:
        return sum(inv.weight(inv.classes[ci]) * len(los) for ci, los in g.start.layouts.items())

    def short(g: Greedy) -> tuple[float, float, float]:
        return sum(g.missing.values()), sum(g.unplaced.values()), spend(g)

    # NOTE: neither phase 1 is better everywhere: cheapest covers win on fleets of many small
    # models, bulk replicas on fewer larger ones; the greedy keeps the cheaper plan
    look = _Lookup.of(inv, cands, opts)
    passes = [_greedy(demands, inv, look, split=True, cover=cover) for cover in (False, True)]
    best = min(passes, key=short)
    if best.missing or best.unplaced or len({d.guaranteed for d in demands}) < 2:
        return best
    cover = best is passes[1]
    together = _greedy(demands, inv, look, split=False, cover=cover)
    if together.missing or together.unplaced:
        return best
    return together if spend(together) < spend(best) else best


def _greedy(demands: Sequence[Demand], inv: Inventory, look: _Lookup, split: bool, cover: bool) -> Greedy:
    """Guaranteed demand first (``split``), or every model in one pass; phase 1 takes each
    model's cheapest whole-replica cover (``cover``) or bulk replicas of its most efficient
    candidate."""
    index, by_model, weights, los = look.index, look.by_model, look.weights, look.layouts
    chosen: dict[int, int] = defaultdict(int)
    budget = [len(c.ids) for c in inv.classes]
    gpus: list[_Gpu] = []
    free: dict[tuple[int, str], list[_Slot]] = defaultdict(list)  # (class, kind) -> slots with room
    missing: dict[int, int] = defaultdict(int)
    unplaced: dict[int, float] = {}

    def weight(c: Candidate) -> float:
        return weights[id(c)]

    def fitting(c: Candidate) -> _Slot | None:
        # best fit: the slot with the least room that still takes the share
        best = None
        for s in free[(c.cls, c.slice)]:
            if s.free + 1e-9 >= c.share and (best is None or s.free < best.free):
                best = s
        return best

    def place(c: Candidate, slot: _Slot) -> None:
        chosen[index[id(c)]] += 1
        slot.free -= c.share
        slot.replicas.append(Replica(demands[c.model].model, c.profile.variant, c.share, c.cap.max_batch, c.cap.rate))
        if slot.free <= 1e-9:
            free[(c.cls, c.slice)].remove(slot)

    def open_gpu(c: Candidate, beyond: bool = False) -> _Slot:
        if beyond:
            missing[c.cls] += 1
        elif budget[c.cls] <= 0:
            raise SolverError(f"class {inv.classes[c.cls].key}: the pool ran out of GPUs")
        else:
            budget[c.cls] -= 1
        lo = max((x for x in los[c.cls] if dict(x.counts).get(c.slice)),
                 key=lambda x: (dict(x.counts)[c.slice], -sum(n for _, n in x.counts)))
        g = _Gpu(c.cls, lo, [], beyond)
        gi = len(gpus)
        for inst in lo.layout or (Instance(-1, WHOLE),):
            slot = _Slot(gi, inst)
            g.slots.append(slot)
            free[(c.cls, inst.profile)].append(slot)
        gpus.append(g)
        return fitting(c)

    def efficiency(c: Candidate) -> float:
        return c.cap.rate / weight(c)

    def most_efficient(cs: list[Candidate]) -> Candidate:
        """Within 2% of the best capacity per unit of GPU cost, the most accurate."""
        top = max(efficiency(c) for c in cs)
        return max((c for c in cs if efficiency(c) >= 0.98 * top), key=lambda c: (c.accuracy, efficiency(c)))

    def fill(group: list[int], reserved: bool) -> None:
        order = sorted(group, key=lambda i: -demands[i].required)
        left = {mi: demands[mi].required for mi in order}
        # phase 1, bulk: whole replicas of each model's most efficient candidate
        for mi in order:
            if cover:
                # the least-spend set of whole replicas covering the model, as the bound prices it
                usable = [c for c in by_model[mi] if budget[c.cls] > 0]
                _, counts = cheapest_cover([(weight(c), min(c.cap.rate, left[mi]), k) for k, c in enumerate(usable)],
                                           left[mi])
                for k, n in sorted(counts.items(), key=lambda t: -usable[t[0]].share):
                    c = usable[k]
                    for _ in range(n):
                        s = fitting(c)
                        if s is None:
                            if budget[c.cls] <= 0:
                                break
                            s = open_gpu(c)
                        place(c, s)
                        left[mi] -= c.cap.rate
                continue
            while True:
                usable = [c for c in by_model[mi] if budget[c.cls] > 0 or fitting(c) is not None]
                if not usable:
                    break
                c = most_efficient(usable)
                if c.cap.rate > left[mi]:
                    break
                s = fitting(c) or open_gpu(c)
                place(c, s)
                left[mi] -= c.cap.rate
        # phase 2, remainders, largest first: room already opened, else a new GPU
        for mi in sorted(order, key=lambda i: -left[i]):
            r = left[mi]
            mine = by_model[mi]
            while r > 1e-9:
                usable = [c for c in mine if budget[c.cls] > 0 or fitting(c) is not None]
                if not usable:
                    if not reserved:
                        unplaced[mi] = r  # best-effort: what is left of the pool is all it gets
                        break
                    # guaranteed: go on beyond the pool, counting the GPUs that are missing
                    c = most_efficient(mine)
                    s = fitting(c) or open_gpu(c, beyond=True)
                else:
                    c, s = _next(usable, r, fitting, open_gpu, weight, efficiency, most_efficient,
                                 lambda c: budget[c.cls] > 0)
                place(c, s)
                r -= c.cap.rate

    if not split:
        fill(list(range(len(demands))), reserved=True)
    else:
        fill([i for i, d in enumerate(demands) if d.guaranteed], reserved=True)
        if not missing:
            fill([i for i, d in enumerate(demands) if not d.guaranteed], reserved=False)
    out = []
    layouts: dict[int, list[LayoutOption]] = defaultdict(list)
    opened: dict[int, int] = defaultdict(int)  # GPUs of each class taken so far: the next id
    for g in gpus:
        if g.beyond:
            continue
        cls = inv.classes[g.cls]
        slices = tuple(
            SlicePlan(s.inst.profile, None if s.inst.profile == WHOLE else s.inst.start,
                      len(s.replicas) > 1 or s.replicas[0].share < 1.0, tuple(s.replicas))
            for s in sorted(g.slots, key=lambda s: s.inst.start) if s.replicas)
        if slices:
            out.append(GpuPlan(cls.ids[opened[g.cls]], cls.gpu, bool(g.layout.layout), slices))
            layouts[g.cls].append(g.layout)
        opened[g.cls] += 1
    return Greedy(tuple(out), Start(dict(chosen), dict(layouts)), unplaced, dict(missing))


def _next(usable: list[Candidate], r: float, fitting, open_gpu, weight, efficiency, most_efficient,
          has_budget) -> tuple[Candidate, _Slot]:  # noqa: ANN001  (the greedy's own closures)
    """The replica for a remainder ``r``: one that fits opened room and covers it, or opened
    room nearly as efficient as a new GPU, else a new GPU (see the module's docstring)."""
    fresh = [c for c in usable if has_budget(c)]
    top = max((min(c.cap.rate, r) / weight(c) for c in fresh), default=0.0)
    dearest = COVER_SLACK * min((weight(c) for c in fresh if c.cap.rate >= r), default=float("inf"))
    fits = [(c, s) for c in usable if (s := fitting(c)) is not None]
    covering = [(c, s) for c, s in fits if c.cap.rate >= r and weight(c) <= dearest]
    good = [(c, s) for c, s in fits if min(c.cap.rate, r) / weight(c) >= FIT_EFFICIENCY * top]
    if covering:
        return min(covering, key=lambda t: (weight(t[0]), -t[0].accuracy, -t[0].share, -t[0].cap.rate))
    if good:
        return max(good, key=lambda t: (t[0].cap.rate, t[0].accuracy))
    if not fresh:
        return max(fits, key=lambda t: (t[0].cap.rate, t[0].accuracy))
    cover = [c for c in fresh if c.cap.rate >= r]
    c = min(cover, key=lambda c: (weight(c), -c.accuracy, -c.share, -c.cap.rate)) if cover else most_efficient(fresh)
    return c, open_gpu(c)
