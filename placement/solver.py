"""The placement solver: a pure function from (demand, profiles, inventory) to a frozen Plan.

The problem, per GPU class ``c`` (interchangeable GPUs), slice kind ``k`` and candidate ``j``
(one variant of one model at one MPS share on one slice kind, with its capacity at the SLO):

    minimise   sum_c,L  w_c * y[c,L]                        (GPUs or cost; accuracy breaks ties)
    such that  sum_L y[c,L] <= N_c                           (inventory)
               sum_j:(c,k) share_j * x_j <= sum_L n[L,k] * y[c,L]   (slices of kind k)
               sum_j:m cap_j * x_j >= rate_m * headroom_m    (capacity)

with ``y[c,L]`` the GPUs of class c in layout L (every maximal MIG layout, or whole) and ``x_j``
the replicas. Shares come from a power-of-two grid, so the share constraint packs exactly into
slices (first-fit decreasing); the integer program is therefore exact for that grid.

Methods: ``greedy`` (:mod:`placement.greedy`) fills concrete GPUs first-fit decreasing;
``milp`` solves the program with HiGHS under a time limit. Both report the LP relaxation as a
lower bound, hence a gap.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from placement.capacity import Capacity, fits_memory, legal_shares, replica_capacity
from placement.catalogue import WHOLE, Instance, Layout, gpu_model, layouts
from placement.plan import Demand, GpuClass, GpuPlan, Inventory, Plan, Replica, SlicePlan
from profiles.profile import Profile, ProfileSet

METHODS = ("greedy", "milp")


class SolverError(ValueError):
    """No plan exists (or none was found in time); the message says which model or GPU class."""


class MilpTimeout(SolverError):
    """The MILP hit its time limit before finding any integer solution."""


@dataclass(frozen=True)
class Candidate:
    model: int  # index into demands
    profile: Profile
    cls: int  # index into inventory.classes
    slice: str
    share: float
    cap: Capacity
    gpu_fraction: float  # share x the slice's fraction of its GPU

    @property
    def accuracy(self) -> float:
        return self.profile.accuracy if self.profile.accuracy is not None else -1.0


@dataclass(frozen=True)
class Options:
    """What a solve may use (the baselines switch features off)."""

    mig: bool = True
    mps: bool = True
    whole: bool = True  # whole GPUs without MIG


DEFAULT = Options()


@dataclass(frozen=True)
class LayoutOption:
    layout: Layout  # () for a whole GPU
    counts: tuple[tuple[str, int], ...]  # slice kind -> count


def layout_options(c: GpuClass, opts: Options) -> list[LayoutOption]:
    """Distinct slice-count vectors a GPU of class c can take (one representative layout each)."""
    out: dict[tuple, LayoutOption] = {}
    if opts.whole or not (c.mig and opts.mig):
        out[((WHOLE, 1),)] = LayoutOption((), ((WHOLE, 1),))
    if c.mig and opts.mig:
        for lay in layouts(c.gpu, with_double_memory_1g=True):
            cnt: dict[str, int] = defaultdict(int)
            for inst in lay:
                cnt[inst.profile] += 1
            key = tuple(sorted(cnt.items()))
            out.setdefault(key, LayoutOption(lay, key))
    return list(out.values())


def _slice_kinds(c: GpuClass, opts: Options) -> tuple[str, ...]:
    g = gpu_model(c.gpu)
    kinds = [WHOLE] if opts.whole or not (c.mig and opts.mig) else []
    if c.mig and opts.mig:
        kinds += [p.name for p in g.profiles]
    return tuple(kinds)


def candidates(demands: Sequence[Demand], profiles: ProfileSet, inv: Inventory,
               opts: Options = DEFAULT) -> list[Candidate]:
    """Every useful (model, variant, class, slice kind, share), dominated variants pruned:
    per (model, class, slice, share) a variant is kept only if no kept one has both more
    capacity and at least its accuracy."""
    out: list[Candidate] = []
    by_model_gpu: dict[tuple[str, str], dict[str, list[Profile]]] = defaultdict(lambda: defaultdict(list))
    for p in profiles:
        by_model_gpu[(p.model, p.gpu)][p.slice].append(p)
    for mi, d in enumerate(demands):
        for ci, c in enumerate(inv.classes):
            g = gpu_model(c.gpu)
            by_slice = by_model_gpu.get((d.model, c.gpu), {})
            for k in _slice_kinds(c, opts):
                profs = [p for p in by_slice.get(k, ()) if d.allows(p)]
                if not profs:
                    continue
                frac = g.slice_fraction(k)
                for share in legal_shares(g, k, c.mps and opts.mps):
                    group: list[Candidate] = []
                    for p in profs:
                        if not fits_memory(p, g, k, share):
                            continue
                        cap = replica_capacity(p, d.slo, share)
                        if cap is not None:
                            group.append(Candidate(mi, p, ci, k, share, cap, share * frac))
                    group.sort(key=lambda x: (-x.cap.rate, -x.accuracy))
                    best_acc = -2.0
                    for cand in group:
                        if cand.accuracy > best_acc:
                            out.append(cand)
                            best_acc = cand.accuracy
    return _prune_shares(out)


def _prune_shares(cands: list[Candidate]) -> list[Candidate]:
    """Drop a candidate when one of the same model, variant accuracy or better, class and slice
    kind takes no more share and serves at least as much (it can never be the better pick)."""
    groups: dict[tuple, list[Candidate]] = defaultdict(list)
    for c in cands:
        groups[(c.model, c.cls, c.slice)].append(c)
    out = []
    for group in groups.values():
        for c in group:
            if not any(o is not c and o.share <= c.share and o.cap.rate >= c.cap.rate and o.accuracy >= c.accuracy
                       and (o.share, -o.cap.rate, -o.accuracy) < (c.share, -c.cap.rate, -c.accuracy)
                       for o in group):
                out.append(c)
    return out


def _check_coverable(demands: Sequence[Demand], cands: list[Candidate]) -> None:
    have = {c.model for c in cands}
    for mi, d in enumerate(demands):
        if mi not in have and d.required > 0:
            raise SolverError(
                f"model {d.model}: no allowed variant meets SLO {d.slo * 1e3:g} ms on any slice of the "
                f"pool (variants {list(d.variants) or 'any'}, accuracy floor {d.accuracy_floor})")


# --------------------------------------------------------------------------- packing


def pack(demands: Sequence[Demand], inv: Inventory, profiles: ProfileSet,
         chosen: dict[int, int], cands: list[Candidate],
         gpu_layouts: dict[int, list[LayoutOption]]) -> tuple[GpuPlan, ...]:
    """Turn replica counts (candidate index -> count) and layouts per class into GPUs with
    slices at explicit placements, MPS shares packed first-fit decreasing."""
    gpus: list[GpuPlan] = []
    for ci, c in enumerate(inv.classes):
        opts = gpu_layouts.get(ci, [])
        if len(opts) > len(c.ids):
            raise SolverError(f"class {c.key}: plan needs {len(opts)} GPUs, the pool has {len(c.ids)}")
        # bins: every slice of every GPU of this class, grouped by kind
        bins: dict[str, list[list]] = defaultdict(list)  # kind -> [gpu_idx, instance, fill, replicas]
        for gi, lo in enumerate(opts):
            insts = lo.layout or (Instance(-1, WHOLE),)
            for inst in insts:
                bins[inst.profile].append([gi, inst, 0.0, []])
        items = sorted(((cands[j], n) for j, n in chosen.items() if cands[j].cls == ci and n > 0),
                       key=lambda t: (-t[0].share, demands[t[0].model].model, t[0].profile.variant))
        for cand, n in items:
            for _ in range(n):
                slot = next((b for b in bins[cand.slice] if b[2] + cand.share <= 1.0 + 1e-9), None)
                if slot is None:
                    raise SolverError(f"class {c.key}: no room left on a {cand.slice} slice for "
                                      f"{cand.profile.variant} at {cand.share:.0%}")
                slot[2] += cand.share
                slot[3].append(Replica(demands[cand.model].model, cand.profile.variant, cand.share,
                                       cand.cap.batch, cand.cap.rate))
        per_gpu: dict[int, list[SlicePlan]] = defaultdict(list)
        for kind_bins in bins.values():
            for gi, inst, _fill, reps in kind_bins:
                if reps:
                    mps = len(reps) > 1 or reps[0].share < 1.0
                    start = None if inst.profile == WHOLE else inst.start
                    per_gpu[gi].append(SlicePlan(inst.profile, start, mps, tuple(reps)))
        for gi, lo in enumerate(opts):
            if per_gpu.get(gi):
                sl = tuple(sorted(per_gpu[gi], key=lambda s: (s.start or 0)))
                gpus.append(GpuPlan(c.ids[gi], c.gpu, bool(lo.layout), sl))
    return tuple(gpus)


# --------------------------------------------------------------------------- MILP / LP


@dataclass
class _Program:
    c: np.ndarray
    a: np.ndarray | object
    lo: np.ndarray
    hi: np.ndarray
    ub: np.ndarray
    n_x: int
    y_index: list[tuple[int, LayoutOption]]


CUTS_PER_MODEL = 6


def _rounding_cuts(a, demands: Sequence[Demand], inv: Inventory, cands: list[Candidate]):
    """Append Chvatal-Gomory rounding cuts of each model's capacity row: for a divisor ``d``,
    ``sum_j ceil(c_j / d) x_j >= ceil(req / d)`` holds for integer replicas (``c_j`` the capped
    capacities). Divisors: the capacities of the model's most cost-efficient candidates. They
    make the LP pay for rounding each model up to whole replicas, as every plan must."""
    from scipy.sparse import coo_matrix, vstack

    by_model: dict[int, list[int]] = defaultdict(list)
    for j, c in enumerate(cands):
        by_model[c.model].append(j)
    rows, cols, vals, rhs = [], [], [], []
    for mi, js in by_model.items():
        req = demands[mi].required
        eff = sorted(js, key=lambda j: -cands[j].cap.rate / (inv.weight(inv.classes[cands[j].cls])
                                                             * cands[j].gpu_fraction))
        divisors: list[float] = []
        for j in eff:
            d = cands[j].cap.rate
            if d < req and all(abs(d - e) > 1e-9 * d for e in divisors):
                divisors.append(d)
            if len(divisors) == CUTS_PER_MODEL:
                break
        for d in divisors:
            r = len(rhs)
            for j in js:
                rows.append(r)
                cols.append(j)
                vals.append(math.ceil(min(cands[j].cap.rate, req) / d - 1e-9))
            rhs.append(math.ceil(req / d - 1e-9))
    if not rhs:
        return a, np.zeros(0)
    cuts = coo_matrix((vals, (rows, cols)), shape=(len(rhs), a.shape[1]))
    return vstack([a, cuts]).tocsr(), np.array(rhs, dtype=float)


def _program(demands: Sequence[Demand], inv: Inventory, cands: list[Candidate], opts: Options,
             tie_break: bool, cuts: bool = False) -> _Program:
    from scipy.sparse import lil_matrix

    y_index = [(ci, lo) for ci, c in enumerate(inv.classes) for lo in layout_options(c, opts)]
    n_x, n = len(cands), len(cands) + len(y_index)
    kinds = sorted({(c.cls, c.slice) for c in cands})
    kind_row = {k: i for i, k in enumerate(kinds)}
    rows = len(inv.classes) + len(kinds) + len(demands)
    a = lil_matrix((rows, n))
    lo, hi = np.full(rows, -np.inf), np.zeros(rows)
    for yi, (ci, lay) in enumerate(y_index):
        a[ci, n_x + yi] = 1.0
        for k, cnt in lay.counts:
            if (ci, k) in kind_row:
                a[len(inv.classes) + kind_row[(ci, k)], n_x + yi] = -cnt
    for ci, c in enumerate(inv.classes):
        hi[ci] = len(c.ids)
    base = len(inv.classes) + len(kinds)
    for j, cand in enumerate(cands):
        a[len(inv.classes) + kind_row[(cand.cls, cand.slice)], j] = cand.share
        # capped at the requirement: one replica that covers it counts as covering (valid for
        # integers, and it keeps the LP from using slivers of a huge replica)
        a[base + cand.model, j] = min(cand.cap.rate, demands[cand.model].required)
    for mi, d in enumerate(demands):
        lo[base + mi], hi[base + mi] = d.required, np.inf
    cost = np.zeros(n)
    for yi, (ci, _) in enumerate(y_index):
        cost[n_x + yi] = inv.weight(inv.classes[ci])
    ub = np.zeros(n)
    for j, cand in enumerate(cands):
        ub[j] = math.ceil(demands[cand.model].required / cand.cap.rate)
    for yi, (ci, _) in enumerate(y_index):
        ub[n_x + yi] = len(inv.classes[ci].ids)
    a = a.tocsr()
    if cuts:
        a, rhs = _rounding_cuts(a, demands, inv, cands)
        lo = np.concatenate([lo, rhs])
        hi = np.concatenate([hi, np.full(len(rhs), np.inf)])
    if tie_break:
        # lower accuracy and idle share cost a little, never as much as one GPU in total
        wmin = min(inv.weight(c) for c in inv.classes)
        best_acc: dict[int, float] = defaultdict(lambda: -1.0)
        for cand in cands:
            best_acc[cand.model] = max(best_acc[cand.model], cand.accuracy)
        per = 0.5 * wmin / max(1.0, float(ub[:n_x].sum()))
        for j, cand in enumerate(cands):
            cost[j] = per * (0.5 * min(1.0, best_acc[cand.model] - cand.accuracy) + 0.5 * cand.gpu_fraction)
    return _Program(cost, a, lo, hi, ub, n_x, y_index)


def lower_bound(demands: Sequence[Demand], inv: Inventory, cands: list[Candidate], opts: Options) -> float:
    """The LP relaxation's optimum: no plan on this candidate grid costs less."""
    if not cands:
        return 0.0
    p = _program(demands, inv, cands, opts, tie_break=False, cuts=True)
    res = milp(p.c, constraints=LinearConstraint(p.a, p.lo, p.hi), bounds=Bounds(0, p.ub),
               options={"time_limit": 60.0})
    if res.status != 0 or res.fun is None:
        return 0.0
    # with the GPU count as objective the optimum is an integer
    return float(math.ceil(res.fun - 1e-6)) if inv.objective == "gpus" else float(res.fun)


def _milp_choice(demands: Sequence[Demand], inv: Inventory, cands: list[Candidate], opts: Options,
                 time_limit: float, clock: Callable[[], float] = time.perf_counter,
                 ) -> tuple[dict[int, int], dict[int, list[LayoutOption]], float]:
    """Two stages: the fewest GPUs (or least cost) first, an integer objective HiGHS proves
    fast; then, with that objective held, the most accurate variants and the least share
    (so no idle replicas). Returns the choice, the layouts and the proven lower bound."""
    t0 = clock()
    p = _program(demands, inv, cands, opts, tie_break=False)
    cons = [LinearConstraint(p.a, p.lo, p.hi)]
    integ = np.ones(len(p.c))
    res = milp(p.c, constraints=cons, integrality=integ, bounds=Bounds(0, p.ub),
               options={"time_limit": 0.7 * time_limit, "mip_rel_gap": 1e-6})
    if res.x is None:
        if res.status == 1:  # time or iteration limit
            raise MilpTimeout(f"MILP found no feasible plan within {time_limit:g} s")
        raise SolverError(f"MILP found no feasible plan ({res.message})")
    best, proven = res.x, float(getattr(res, "mip_dual_bound", 0.0) or 0.0)
    left = time_limit - (clock() - t0)
    if left > 0.5:
        tie = _program(demands, inv, cands, opts, tie_break=True).c
        tie[p.n_x:] = 0.0
        hold = LinearConstraint(p.c.reshape(1, -1), -np.inf, float(p.c @ np.round(res.x)) + 1e-6)
        res2 = milp(tie, constraints=[*cons, hold], integrality=integ, bounds=Bounds(0, p.ub),
                    options={"time_limit": left, "mip_rel_gap": 1e-3})
        if res2.x is not None:
            best = res2.x
    x = np.round(best).astype(int)
    chosen = {j: int(x[j]) for j in range(p.n_x) if x[j] > 0}
    lay: dict[int, list[LayoutOption]] = defaultdict(list)
    for yi, (ci, lo) in enumerate(p.y_index):
        lay[ci] += [lo] * int(x[p.n_x + yi])
    return chosen, dict(lay), proven


# --------------------------------------------------------------------------- entry point


MILP_CHUNK = 150  # larger fleets are solved as a sequence of MILPs of about 100 models


def _chunked_milp(demands: Sequence[Demand], profiles: ProfileSet, inv: Inventory, opts: Options,
                  time_limit: float, clock: Callable[[], float] = time.perf_counter) -> tuple[GpuPlan, ...]:
    """Large fleets: models interleaved by size into chunks of about 100, each solved as a MILP
    on the GPUs the earlier chunks left (each chunk rounds up at most a GPU or so). Each chunk
    keeps the better of its MILP and greedy plans (the MILP's share of the time may be short)."""
    from placement.greedy import greedy_gpus  # noqa: PLC0415

    order = sorted(range(len(demands)), key=lambda i: -demands[i].required)
    n = math.ceil(len(demands) / 100)
    chunks = [[demands[i] for i in order[k::n]] for k in range(n)]
    used: set[str] = set()
    out: list[GpuPlan] = []
    for chunk in chunks:
        left = Inventory(tuple(
            GpuClass(c.gpu, tuple(i for i in c.ids if i not in used), c.cost_per_hour, c.mig, c.mps)
            for c in inv.classes), inv.objective)
        left = Inventory(tuple(c for c in left.classes if c.ids), inv.objective)
        cands = candidates(chunk, profiles, left, opts)
        gpus = greedy_gpus(chunk, left, cands, opts)
        try:
            chosen, lay, _ = _milp_choice(chunk, left, cands, opts, time_limit / n, clock)
            milp_gpus = pack(chunk, left, profiles, chosen, cands, lay)
            weight = {i: left.weight(c) for c in left.classes for i in c.ids}
            if sum(weight[g.id] for g in milp_gpus) <= sum(weight[g.id] for g in gpus):
                gpus = milp_gpus
        except MilpTimeout:
            pass
        out += gpus
        used |= {g.id for g in gpus}
    return tuple(out)


def solve(demands: Sequence[Demand], profiles: ProfileSet, inventory: Inventory, method: str = "greedy",
          *, time_limit: float = 10.0, options: Options = DEFAULT, bound: bool = True,
          clock: Callable[[], float] = time.perf_counter) -> Plan:
    """Plan ``demands`` on ``inventory`` from ``profiles``. No I/O; the greedy is deterministic,
    the MILP too unless its time limit cuts the search short. ``clock`` (injected) only meters
    the MILP's time budget and the reported solve time; no decision reads it."""
    if method not in METHODS:
        raise SolverError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    names = [d.model for d in demands]
    if len(set(names)) != len(names):
        raise SolverError(f"models must be unique, got duplicates {sorted({n for n in names if names.count(n) > 1})}")
    t0 = clock()
    cands = candidates(demands, profiles, inventory, options)
    _check_coverable(demands, cands)
    from placement.greedy import greedy_gpus  # noqa: PLC0415  (greedy builds on this module)

    label = method if options == DEFAULT else f"{method}[mig={int(options.mig)},mps={int(options.mps)}]"
    if method == "greedy":
        gpus, proven = greedy_gpus(demands, inventory, cands, options), 0.0
    elif len(demands) > MILP_CHUNK:
        gpus, label = _chunked_milp(demands, profiles, inventory, options, time_limit, clock), label + "-chunked"
        proven = 0.0
    else:
        try:
            chosen, lay, proven = _milp_choice(demands, inventory, cands, options, time_limit, clock)
            gpus = pack(demands, inventory, profiles, chosen, cands, lay)
        except MilpTimeout:
            # no integer solution within the limit: the greedy's plan stands, and says so
            gpus, proven, label = greedy_gpus(demands, inventory, cands, options), 0.0, label + "->greedy"
    lb = lower_bound(demands, inventory, cands, options) if bound else 0.0
    return Plan(gpus, tuple(demands), inventory, label, lb, clock() - t0, profiles, proven)

