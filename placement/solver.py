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
``milp`` solves the program with HiGHS under a time limit. Both report a lower bound, hence a
gap: the better of the LP relaxation (with rounding cuts) and a Lagrangian bound that keeps each
model's replicas integer (:func:`lower_bound`).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from placement.capacity import Capacity, fits_memory, legal_shares, replica_capacity
from placement.plan import Demand, GpuClass, GpuPlan, Inventory, Plan, Replica, SlicePlan
from profiles.catalogue import WHOLE, Instance, Layout, gpu_model, layouts
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
                                       cand.cap.max_batch, cand.cap.rate))
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
    kinds: list[tuple[int, str]]  # (class, slice kind) of each slice-kind row, after the class rows


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
    return _Program(cost, a, lo, hi, ub, n_x, y_index, kinds)


def _milp_choice(demands: Sequence[Demand], inv: Inventory, cands: list[Candidate], opts: Options,
                 time_limit: float, clock: Callable[[], float] = time.perf_counter,
                 ) -> tuple[dict[int, int], dict[int, list[LayoutOption]], float]:
    """Two stages: the fewest GPUs (or least cost) first, an integer objective HiGHS proves
    fast; then, with that objective held, the most accurate variants and the least share
    (so no idle replicas). Returns the choice, the layouts and the proven lower bound.
    The program carries the rounding cuts: valid for integers, they leave the optimum alone
    and tighten HiGHS's relaxation (100 models, seed 1: optimal in ~8 s instead of ~27 s)."""
    t0 = clock()
    p = _program(demands, inv, cands, opts, tie_break=False, cuts=True)
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


# --------------------------------------------------------------------------- lower bound


def lower_bound(demands: Sequence[Demand], inv: Inventory, cands: list[Candidate], opts: Options,
                *, lagrangian: bool = True) -> float:
    """A lower bound on every plan on this candidate grid: the better of the LP relaxation
    (with the rounding cuts) and, unless ``lagrangian`` is off, Lagrangian bounds that keep
    each model's replicas integer.

    The LP lets a model run 2.3 replicas of its most efficient candidate; every real plan rounds
    each model up to whole replicas, often with less efficient small MPS replicas, and on a
    fleet of small models that rounding is what the LP misses (about a GPU per 100 models). The
    Lagrangian bound prices each slice kind (the LP's duals, then those of a small column-
    generation master) and charges every model its cheapest *whole-replica* set at those
    prices, so it pays for that rounding."""
    if not cands:
        return 0.0
    p = _program(demands, inv, cands, opts, tie_break=False, cuts=True)
    lp = _solve_lp(p)
    if lp is None:
        return 0.0
    best, duals = lp
    if lagrangian:
        best = max(best, _lagrangian_bound(demands, inv, cands, p, duals))
    # with the GPU count as objective the optimum is an integer
    return float(math.ceil(best - 1e-6)) if inv.unit == "gpus" else float(best)


def _solve_lp(p: _Program) -> tuple[float, np.ndarray] | None:
    """The program's LP relaxation: its optimum and each row's dual price (>= 0 on a binding
    upper side), or None if HiGHS finds no optimum."""
    from scipy.optimize import linprog
    from scipy.sparse import vstack

    up, down = np.isfinite(p.hi), np.isfinite(p.lo)
    res = linprog(p.c, A_ub=vstack([p.a[up], -p.a[down]]), b_ub=np.r_[p.hi[up], -p.lo[down]],
                  bounds=np.c_[np.zeros(len(p.c)), p.ub], method="highs")
    if res.status != 0:
        return None
    duals = np.zeros(len(p.hi))
    duals[up] = -res.ineqlin.marginals[: int(up.sum())]
    return float(res.fun), duals


LAGRANGIAN_ROUNDS = 8  # column-generation rounds that may raise the Lagrangian bound
COVER_NODES = 20_000  # branch-and-bound nodes per cheapest-cover search before it settles for its LP bound


def _cheapest_cover(items: Sequence[tuple[float, float, int]], need: float) -> tuple[float, dict[int, int]]:
    """Least total price of whole replicas, items ``(price, capacity, id)``, whose capacities
    add up to ``need``: a lower bound on that least price (exact unless the search runs out of
    nodes, then the LP bound) and the cheapest replica counts found.

    Depth-first branch and bound over the items in order of price per capacity, bounded by the
    LP of what is left (capacities capped at it: one replica larger than the rest covers it).
    Counts are unbounded, a relaxation that changes nothing: prices are >= 0 and ``ceil(need /
    cap)`` replicas of one item already cover the need."""
    tol = 1e-9 * max(1.0, need)
    if need <= tol:
        return 0.0, {}
    front: list[tuple[float, float, int]] = []  # no item on it is both dearer and smaller than another
    for price, cap, j in sorted(((max(0.0, pr), min(c, need), j) for pr, c, j in items), key=lambda t: (t[0], -t[1])):
        if cap > 0 and (not front or cap > front[-1][1]):
            front.append((price, cap, j))
    if not front:
        return math.inf, {}
    order = sorted(front, key=lambda t: t[0] / t[1])

    def lp(i: int, left: float) -> float:
        return min(price * max(1.0, left / cap) for price, cap, _ in order[i:])

    best, counts = min(((price * math.ceil((need - tol) / cap), {j: math.ceil((need - tol) / cap)})
                        for price, cap, j in order), key=lambda t: t[0])
    nodes = 0
    chosen: dict[int, int] = {}

    def search(i: int, left: float, spent: float) -> None:
        nonlocal best, counts, nodes
        if left <= tol:
            if spent < best:
                best, counts = spent, {j: k for j, k in chosen.items() if k}
            return
        if i == len(order) or nodes >= COVER_NODES or spent + lp(i, left) >= best - 1e-12:
            return
        nodes += 1
        price, cap, j = order[i]
        for k in range(math.ceil((left - tol) / cap), -1, -1):
            if nodes >= COVER_NODES:
                break
            chosen[j] = k
            search(i + 1, left - k * cap, spent + k * price)
        chosen[j] = 0

    search(0, need, 0.0)
    return (best if nodes < COVER_NODES else lp(0, need)), counts


def _lagrangian_bound(demands: Sequence[Demand], inv: Inventory, cands: list[Candidate], p: _Program,
                      duals: np.ndarray) -> float:
    """The best Lagrangian bound over the slice-kind prices tried: first the LP's duals, then
    those of a restricted Dantzig-Wolfe master (columns: each model's whole-replica sets).

    Validity: for any prices ``pi >= 0`` on the slice-kind rows, moving those rows into the
    objective only lowers the optimum (a plan's rows are <= 0, so ``pi`` times them is <= 0),
    and what remains splits into independent parts, each solved exactly or bounded below:
    per class the best layout's ``w_c - pi . n_L`` on all or none of its ``N_c`` GPUs (y may be
    fractional, a relaxation), and per model the cheapest cover of its requirement with whole
    replicas at price ``pi_k * share``. So ``L(pi) <= `` every plan's cost, whatever ``pi`` is;
    the master only picks good prices and is never itself taken as a bound.

    The layouts' part is ``p``'s own: its class and slice-kind rows over the layout columns."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix, hstack

    n_cls, n_kinds = len(inv.classes), len(p.kinds)
    layouts = p.a[:n_cls + n_kinds, p.n_x:]  # +1 per GPU on its class row, -n_L on kind rows
    layout_cost = p.c[p.n_x:]
    layout_class = np.array([ci for ci, _ in p.y_index])
    class_layouts = [(len(c.ids), np.flatnonzero(layout_class == ci)) for ci, c in enumerate(inv.classes)]
    kind_row = {k: i for i, k in enumerate(p.kinds)}
    by_model: dict[int, list[int]] = defaultdict(list)
    for j, c in enumerate(cands):
        by_model[c.model].append(j)
    models = sorted(by_model)
    cap = [min(c.cap.rate, demands[c.model].required) for c in cands]
    kind_of = [kind_row[(c.cls, c.slice)] for c in cands]

    def evaluate(pi: np.ndarray) -> tuple[float, list[tuple[int, dict[int, int]]]]:
        reduced = layout_cost + layouts[n_cls:].T @ pi  # w_c - pi . n_L per layout
        value = sum(min(0.0, float(reduced[cols].min())) * n for n, cols in class_layouts if len(cols))
        covers = []
        for mi in models:
            v, counts = _cheapest_cover([(pi[kind_of[j]] * cands[j].share, cap[j], j) for j in by_model[mi]],
                                        demands[mi].required)
            value += v
            covers.append((mi, counts))
        return value, covers

    columns: list[tuple[int, dict[int, int]]] = []
    seen: set[tuple] = set()

    def add(mi: int, counts: dict[int, int]) -> bool:
        key = (mi, tuple(sorted(counts.items())))
        if key in seen:
            return False
        seen.add(key)
        columns.append((mi, counts))
        return True

    def master() -> tuple[float, np.ndarray] | None:
        rows, cols, vals, e_rows = [], [], [], []
        model_row = {mi: r for r, mi in enumerate(models)}
        for q, (mi, counts) in enumerate(columns):
            for j, k in counts.items():
                rows.append(n_cls + kind_of[j]), cols.append(q), vals.append(cands[j].share * k)
            e_rows.append(model_row[mi])
        n = len(p.y_index) + len(columns)
        sets = coo_matrix((vals, (rows, cols)), shape=(n_cls + n_kinds, len(columns)))
        res = linprog(np.r_[layout_cost, np.zeros(len(columns))], A_ub=hstack([layouts, sets]).tocsr(),
                      b_ub=np.r_[p.hi[:n_cls], np.zeros(n_kinds)],
                      A_eq=coo_matrix((np.ones(len(e_rows)), (e_rows, len(p.y_index) + np.arange(len(columns)))),
                                      shape=(len(models), n)).tocsr(),
                      b_eq=np.ones(len(models)), bounds=(0, None), method="highs")
        if res.status != 0:
            return None
        return float(res.fun), np.maximum(0.0, -res.ineqlin.marginals[n_cls:])

    best, covers = evaluate(np.maximum(0.0, duals[n_cls:n_cls + n_kinds]))
    for j, c in enumerate(cands):  # one column per candidate alone, so the master is feasible
        add(c.model, {j: math.ceil(demands[c.model].required / cap[j] - 1e-9)} if cap[j] > 0 else {})
    for mi, counts in covers:
        add(mi, counts)
    for _ in range(LAGRANGIAN_ROUNDS):
        m = master()
        if m is None:
            break
        top, pi = m  # no price vector gives more than the master's optimum
        if top - best <= 1e-6 * max(1.0, abs(top)) or (
                inv.unit == "gpus" and math.ceil(best - 1e-6) >= math.ceil(top - 1e-6)):
            break
        value, covers = evaluate(pi)
        best = max(best, value)
        if not any([add(mi, counts) for mi, counts in covers if counts]):
            break
    return best


# --------------------------------------------------------------------------- entry point


MILP_CHUNK = 150  # fleets with more models are solved as a sequence of MILPs ...
CHUNK_MODELS = 100  # ... of about this many models each


def _chunked_milp(demands: Sequence[Demand], profiles: ProfileSet, inv: Inventory, opts: Options,
                  time_limit: float, clock: Callable[[], float] = time.perf_counter) -> tuple[GpuPlan, ...]:
    """Large fleets: models interleaved by size into chunks of about :data:`CHUNK_MODELS`, each solved as a MILP
    on the GPUs the earlier chunks left (each chunk rounds up at most a GPU or so). Each chunk
    keeps the better of its MILP and greedy plans (the MILP's share of the time may be short)."""
    from placement.greedy import greedy_gpus  # noqa: PLC0415

    order = sorted(range(len(demands)), key=lambda i: -demands[i].required)
    n = math.ceil(len(demands) / CHUNK_MODELS)
    chunks = [[demands[i] for i in order[k::n]] for k in range(n)]
    used: set[str] = set()
    out: list[GpuPlan] = []
    for chunk in chunks:
        free = ((c, tuple(i for i in c.ids if i not in used)) for c in inv.classes)
        left = replace(inv, classes=tuple(GpuClass(c.gpu, ids, c.cost_per_hour, c.mig, c.mps)
                                          for c, ids in free if ids))
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
    if inventory.accuracy_aware:
        from placement.accuracy import solve_accuracy  # noqa: PLC0415  (builds on this module)

        return solve_accuracy(demands, profiles, inventory, cands, method, label, options, time_limit, clock, t0, bound)
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

