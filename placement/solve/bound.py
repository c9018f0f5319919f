"""The lower bound every plan is measured against, and the integer program it relaxes.

The program (see :mod:`placement.solve.solver`) in matrix form, with Chvatal-Gomory rounding cuts of
each model's capacity row; the bound is the better of its LP relaxation and a Lagrangian bound
that keeps each model's replicas integer (:func:`lower_bound`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from placement.plan import Demand, Inventory
from placement.solve.candidates import Candidate, LayoutOption, Options, layout_options


@dataclass
class Program:
    """The integer program in matrix form: costs ``c``, rows ``lo <= a @ v <= hi``, column
    bounds ``ub``; the first ``n_x`` columns are replicas, then one per (class, layout) in
    ``y_index``."""

    c: np.ndarray
    a: np.ndarray | object
    lo: np.ndarray
    hi: np.ndarray
    ub: np.ndarray
    n_x: int
    y_index: list[tuple[int, LayoutOption]]
    kinds: list[tuple[int, str]]  # (class, slice kind) of each slice-kind row, after the class rows


Cover = tuple[int, dict[int, int]]  # a model and whole replicas of its candidates that cover it


CUTS_PER_MODEL = 6


@dataclass(frozen=True)
class _Columns:
    """The candidates as arrays: model, share, capacity and that capacity capped at the
    model's requirement, GPU cost per replica, and slice-kind row."""

    model: np.ndarray
    share: np.ndarray
    rate: np.ndarray
    capped: np.ndarray
    spend: np.ndarray  # the class's weight x the candidate's GPU fraction
    kind: np.ndarray  # index into the program's kinds
    required: np.ndarray  # per model


def _columns(demands: Sequence[Demand], inv: Inventory, cands: list[Candidate],
             kind_row: dict[tuple[int, str], int]) -> _Columns:
    n = len(cands)
    required = np.array([d.required for d in demands], dtype=float)
    weight = np.array([inv.weight(c) for c in inv.classes], dtype=float)
    model = np.fromiter((c.model for c in cands), dtype=np.int64, count=n)
    rate = np.fromiter((c.cap.rate for c in cands), dtype=float, count=n)
    frac = np.fromiter((c.gpu_fraction for c in cands), dtype=float, count=n)
    cls = np.fromiter((c.cls for c in cands), dtype=np.int64, count=n)
    return _Columns(model, np.fromiter((c.share for c in cands), dtype=float, count=n), rate,
                    np.minimum(rate, required[model]), weight[cls] * frac,
                    np.fromiter((kind_row[(c.cls, c.slice)] for c in cands), dtype=np.int64, count=n), required)


def _rounding_cuts(a, cols: _Columns, uncut: frozenset[int] = frozenset()):
    """Append Chvatal-Gomory rounding cuts of each model's capacity row: for a divisor ``d``,
    ``sum_j ceil(c_j / d) x_j >= ceil(req / d)`` holds for integer replicas (``c_j`` the capped
    capacities). Divisors: the capacities of the model's most cost-efficient candidates. They
    make the LP pay for rounding each model up to whole replicas, as every plan must. Models in
    ``uncut`` get none (their demand may be placed in part, where the cuts do not hold)."""
    from scipy.sparse import coo_matrix, vstack

    # each model's candidates in their order, then by cost efficiency (best first, stable)
    by_model = np.argsort(cols.model, kind="stable")
    starts = np.searchsorted(cols.model[by_model], np.arange(len(cols.required) + 1))
    neg_eff = -cols.rate / cols.spend
    rows, cols_i, vals, rhs = [], [], [], []
    for mi in range(len(cols.required)):
        js = by_model[starts[mi]:starts[mi + 1]]
        if not len(js) or mi in uncut:
            continue
        req = float(cols.required[mi])
        divisors: list[float] = []
        for j in js[np.argsort(neg_eff[js], kind="stable")]:
            d = float(cols.rate[j])
            if d < req and all(abs(d - e) > 1e-9 * d for e in divisors):
                divisors.append(d)
            if len(divisors) == CUTS_PER_MODEL:
                break
        for d in divisors:
            rows.append(np.full(len(js), len(rhs)))
            cols_i.append(js)
            vals.append(np.ceil(cols.capped[js] / d - 1e-9))
            rhs.append(math.ceil(req / d - 1e-9))
    if not rhs:
        return a, np.zeros(0)
    cuts = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols_i))),
                      shape=(len(rhs), a.shape[1]))
    return vstack([a, cuts]).tocsr(), np.array(rhs, dtype=float)


def program(demands: Sequence[Demand], inv: Inventory, cands: list[Candidate], opts: Options,
             tie_break: bool, cuts: bool = False, uncut: frozenset[int] = frozenset()) -> Program:
    from scipy.sparse import coo_matrix

    y_index = [(ci, lo) for ci, c in enumerate(inv.classes) for lo in layout_options(c, opts)]
    n_x, n = len(cands), len(cands) + len(y_index)
    kinds = sorted({(c.cls, c.slice) for c in cands})
    kind_row = {k: i for i, k in enumerate(kinds)}
    cols = _columns(demands, inv, cands, kind_row)
    n_cls = len(inv.classes)
    rows = n_cls + len(kinds) + len(demands)
    r_i: list[int] = []
    c_i: list[int] = []
    v_i: list[float] = []
    lo, hi = np.full(rows, -np.inf), np.zeros(rows)
    for yi, (ci, lay) in enumerate(y_index):
        r_i.append(ci), c_i.append(n_x + yi), v_i.append(1.0)
        for k, cnt in lay.counts:
            if (ci, k) in kind_row:
                r_i.append(n_cls + kind_row[(ci, k)]), c_i.append(n_x + yi), v_i.append(-cnt)
    for ci, c in enumerate(inv.classes):
        hi[ci] = len(c.ids)
    base = n_cls + len(kinds)
    # per candidate, its share on its slice kind's row and (capped at the requirement: one
    # replica that covers it counts as covering, valid for integers, and it keeps the LP from
    # using slivers of a huge replica) its capacity on its model's row
    j = np.arange(n_x)
    a = coo_matrix((np.r_[v_i, np.column_stack([cols.share, cols.capped]).ravel()],
                    (np.r_[np.asarray(r_i, dtype=np.int64), np.column_stack([n_cls + cols.kind, base + cols.model]).ravel()],
                     np.r_[np.asarray(c_i, dtype=np.int64), np.repeat(j, 2)])), shape=(rows, n)).tocsr()
    lo[base:base + len(demands)], hi[base:base + len(demands)] = cols.required, np.inf
    cost = np.zeros(n)
    for yi, (ci, _) in enumerate(y_index):
        cost[n_x + yi] = inv.weight(inv.classes[ci])
    ub = np.zeros(n)
    ub[:n_x] = np.ceil(cols.required[cols.model] / cols.rate)
    for yi, (ci, _) in enumerate(y_index):
        ub[n_x + yi] = len(inv.classes[ci].ids)
    if cuts:
        a, rhs = _rounding_cuts(a, cols, uncut)
        lo = np.concatenate([lo, rhs])
        hi = np.concatenate([hi, np.full(len(rhs), np.inf)])
    if tie_break:
        # lower accuracy and idle share cost a little, never as much as one GPU in total
        wmin = min(inv.weight(c) for c in inv.classes)
        acc = np.fromiter((c.accuracy for c in cands), dtype=float, count=n_x)
        best_acc = np.full(len(demands), -1.0)
        np.maximum.at(best_acc, cols.model, acc)
        per = 0.5 * wmin / max(1.0, float(ub[:n_x].sum()))
        frac = np.fromiter((c.gpu_fraction for c in cands), dtype=float, count=n_x)
        cost[:n_x] = per * (0.5 * np.minimum(1.0, best_acc[cols.model] - acc) + 0.5 * frac)
    return Program(cost, a, lo, hi, ub, n_x, y_index, kinds)


def with_slack(p: Program, demands: Sequence[Demand], inv: Inventory, cands: list[Candidate],
              slack: Sequence[int]) -> Program:
    """``p`` with a continuous column per model of ``slack`` on its capacity row: the req/s
    left unplaced, each priced above the dearest req/s any replica serves."""
    from scipy.sparse import coo_matrix, hstack

    base = len(inv.classes) + len(p.kinds)
    cheapest = min((min(c.cap.rate, demands[c.model].required) for c in cands if c.model in set(slack)),
                   default=1.0)
    price = 2.0 * max(inv.weight(c) for c in inv.classes) / max(cheapest, 1e-9)
    cols = coo_matrix((np.ones(len(slack)), ([base + mi for mi in slack], range(len(slack)))),
                      shape=(p.a.shape[0], len(slack)))
    return Program(np.r_[p.c, np.full(len(slack), price)], hstack([p.a, cols]).tocsr(), p.lo, p.hi,
                   np.r_[p.ub, [demands[mi].required for mi in slack]], p.n_x, p.y_index, p.kinds)


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
    p = program(demands, inv, cands, opts, tie_break=False, cuts=True)
    return rounded(inv, bound_and_covers(demands, inv, cands, p, lagrangian)[0])


def timed_bound(demands: Sequence[Demand], inventory: Inventory, cands: list[Candidate], options: Options,
                wanted: bool, clock: Callable[[], float], known: tuple[float, float] | None = None
                ) -> tuple[float, float]:
    """The plan's lower bound (0 when not ``wanted``: a partial plan has none) and the seconds
    of ``clock`` it took, which a plan reports apart from the rest of the solve; ``known``: the
    two already found (the MILP's master is built from the bound), not computed again."""
    if wanted and known is not None:
        return known
    t = clock()
    lb = lower_bound(demands, inventory, cands, options) if wanted else 0.0
    return lb, clock() - t


def rounded(inv: Inventory, bound: float) -> float:
    """``bound`` as a plan's cost can be: with the GPU count as objective, an integer."""
    return float(math.ceil(bound - 1e-6)) if inv.unit == "gpus" else float(bound)


def bound_and_covers(demands: Sequence[Demand], inv: Inventory, cands: list[Candidate], p: Program,
                     lagrangian: bool = True) -> tuple[float, list[Cover]]:
    """The bound of :func:`lower_bound` on ``p`` (the program with rounding cuts) before
    rounding, and the whole-replica covers its Lagrangian pricing went through: every
    candidate alone, and each model's cheapest covers at each price vector tried (none without
    ``lagrangian``). The covers are the columns of :func:`placement.solve.milp.master_choice`."""
    lp = _solve_lp(p)
    if lp is None:
        return 0.0, []
    best, duals = lp
    if not lagrangian:
        return best, []
    lagrange, covers = _lagrangian_bound(demands, inv, cands, p, duals)
    return max(best, lagrange), covers


def _solve_lp(p: Program) -> tuple[float, np.ndarray] | None:
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


def cheapest_cover(items: Sequence[tuple[float, float, int]], need: float) -> tuple[float, dict[int, int]]:
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


def _lagrangian_bound(demands: Sequence[Demand], inv: Inventory, cands: list[Candidate], p: Program,
                      duals: np.ndarray) -> tuple[float, list[Cover]]:
    """The best Lagrangian bound over the slice-kind prices tried: first the LP's duals, then
    those of a restricted Dantzig-Wolfe master (columns: each model's whole-replica sets); and
    those columns.

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
    req = [d.required for d in demands]
    cap = [min(c.cap.rate, req[c.model]) for c in cands]
    kind_of = [kind_row[(c.cls, c.slice)] for c in cands]

    def evaluate(pi: np.ndarray) -> tuple[float, list[tuple[int, dict[int, int]]]]:
        reduced = layout_cost + layouts[n_cls:].T @ pi  # w_c - pi . n_L per layout
        value = sum(min(0.0, float(reduced[cols].min())) * n for n, cols in class_layouts if len(cols))
        covers = []
        for mi in models:
            v, counts = cheapest_cover([(pi[kind_of[j]] * cands[j].share, cap[j], j) for j in by_model[mi]],
                                        req[mi])
            value += v
            covers.append((mi, counts))
        return value, covers

    columns: list[Cover] = []
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
        counts = {j: math.ceil(req[c.model] / cap[j] - 1e-9)} if cap[j] > 0 else {}
        key = (c.model, tuple(counts.items()))
        if key not in seen:
            seen.add(key)
            columns.append((c.model, counts))
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
    return best, columns


