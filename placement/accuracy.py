"""Plans that trade GPUs for accuracy: the most accurate answers within a budget (objective
``accuracy``), or the fewest GPUs whose answers meet a mean-accuracy floor.

The gateway's ``accuracy`` objective fills a model's most accurate variant to its capacity and
overflows the rest to the next one, so a plan's answers split across its variants by capacity.
The program is :mod:`placement.solver`'s (replicas ``x_j``, layouts ``y[c,L]``; inventory, slice
and capacity rows) plus, per model ``m`` and variant ``v``, the requests per second ``v``
answers, ``s[m,v] >= 0``:

    s[m,v] <= sum_j:(m,v) min(cap_j, rate_m) x_j        (v answers what its replicas sustain)
    sum_v s[m,v] = rate_m                              (every expected request is answered)
    sum_c,L y[c,L] <= max_gpus,  sum_c,L cost_c y[c,L] <= max_cost_per_hour       (budget)
    sum_v acc_v s[m,v] >= floor * rate_m               (mean_accuracy_floor, each model)

Objective ``accuracy``: maximise ``sum_m,v acc_v s[m,v] / sum_m rate_m`` (the rate-weighted
mean accuracy of all answers), then, with it held, the fewest GPUs (the least cost when the
budget is a cost alone). Otherwise: the fewest GPUs or least cost under the floor. For fixed
replicas the best ``s`` is exactly the gateway's fill, so the split the plan predicts
(:meth:`Plan.split`) is as accurate as the program's. A variant of unknown accuracy counts 0,
so it serves only what the known ones cannot; a model none of whose allowed variants has a
known accuracy is exempt from the floor and adds nothing to the objective.

The greedy (method ``greedy``, and the fallback when the MILP finds nothing in time) upgrades
whole models: from the fewest-GPU greedy plan, a model below the floor keeps only the variants
that meet it; under ``accuracy`` each model in turn (largest gain in accurate answers first)
keeps only its most accurate variant when the plan still fits the budget. It never mixes
variants on purpose, so the MILP's plans are at least as accurate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix, hstack, vstack

from placement.plan import EPS, Demand, GpuPlan, Inventory, Plan, has_known_accuracy
from placement.solver import (
    Candidate,
    LayoutOption,
    MilpTimeout,
    Options,
    SolverError,
    _check_coverable,
    _program,
    candidates,
    lower_bound,
    pack,
)
from profiles.profile import ProfileSet

HOLD = 1e-6  # the second stage keeps the first stage's mean accuracy to within this


def _budget(inv: Inventory) -> str:
    parts = [f"max_gpus {inv.max_gpus}" if inv.max_gpus is not None else "",
             f"max_cost_per_hour {inv.max_cost_per_hour:g}" if inv.max_cost_per_hour is not None else ""]
    return " and ".join(p for p in parts if p) or "the pool"


def over_budget(plan: Plan) -> str | None:
    """Why the plan spends more than its pool's budget, or None."""
    inv = plan.inventory
    if inv.max_gpus is not None and plan.gpu_count > inv.max_gpus:
        return f"{plan.gpu_count} GPUs exceed max_gpus {inv.max_gpus}"
    if inv.max_cost_per_hour is not None and plan.cost_per_hour > inv.max_cost_per_hour + EPS:
        return f"{plan.cost_per_hour:g} per hour exceeds max_cost_per_hour {inv.max_cost_per_hour:g}"
    return None


def _check_floor_reachable(demands: Sequence[Demand], profiles: ProfileSet, inv: Inventory,
                           cands: list[Candidate]) -> None:
    floor = inv.mean_accuracy_floor
    if floor is None:
        return
    for mi, d in enumerate(demands):
        if d.rate <= 0 or not has_known_accuracy(d, profiles):
            continue
        mine = [c for c in cands if c.model == mi]
        top = max(mine, key=lambda c: c.profile.accuracy or 0.0)
        if (top.profile.accuracy or 0.0) + EPS < floor:
            raise SolverError(f"model {d.model}: mean_accuracy_floor {floor:g} is out of reach: the most accurate "
                              f"variant that meets SLO {d.slo * 1e3:g} ms on the pool, {top.profile.variant}, "
                              f"has accuracy {top.profile.accuracy}")


# --------------------------------------------------------------------------- MILP


def _split_program(demands: Sequence[Demand], profiles: ProfileSet, inv: Inventory, cands: list[Candidate],
                   opts: Options):
    """The solver's program with the served-rate columns and the budget and floor rows.
    Returns (base program, matrix, row bounds, column bounds, integrality, spend, tie-break,
    accuracy objective); the vectors span every column."""
    base = _program(demands, inv, cands, opts, tie_break=False, cuts=True)
    tie = _program(demands, inv, cands, opts, tie_break=True).c
    n0 = len(base.c)
    known = [d.rate > 0 and has_known_accuracy(d, profiles) for d in demands]
    pairs: dict[tuple[int, str], int] = {}
    acc: list[float] = []
    for c in cands:
        key = (c.model, c.profile.variant)
        if known[c.model] and key not in pairs:
            pairs[key] = len(pairs)
            acc.append(c.profile.accuracy or 0.0)
    ns = len(pairs)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(entries: Sequence[tuple[int, float]], low: float, high: float) -> None:
        r = len(lo)
        for col, v in entries:
            rows.append(r), cols.append(col), vals.append(v)
        lo.append(low), hi.append(high)

    links: dict[int, list[tuple[int, float]]] = {k: [(n0 + k, 1.0)] for k in range(ns)}
    for j, c in enumerate(cands):
        k = pairs.get((c.model, c.profile.variant))
        if k is not None:
            links[k].append((j, -min(c.cap.rate, demands[c.model].rate)))
    for k in range(ns):
        row(links[k], -np.inf, 0.0)
    by_model: dict[int, list[int]] = {}
    for (mi, _v), k in pairs.items():
        by_model.setdefault(mi, []).append(k)
    for mi, ks in by_model.items():
        rate = demands[mi].rate
        row([(n0 + k, 1.0) for k in ks], rate, rate)
        if inv.mean_accuracy_floor is not None:
            row([(n0 + k, acc[k]) for k in ks], inv.mean_accuracy_floor * rate, np.inf)
    ys = list(enumerate(base.y_index))
    if inv.max_gpus is not None:
        row([(base.n_x + yi, 1.0) for yi, _ in ys], -np.inf, float(inv.max_gpus))
    if inv.max_cost_per_hour is not None:
        row([(base.n_x + yi, inv.classes[ci].cost_per_hour) for yi, (ci, _) in ys], -np.inf, inv.max_cost_per_hour)
    n = n0 + ns
    extra = coo_matrix((vals, (rows, cols)), shape=(len(lo), n))
    a = vstack([hstack([base.a, coo_matrix((base.a.shape[0], ns))]), extra]).tocsr()
    row_lo, row_hi = np.r_[base.lo, lo], np.r_[base.hi, hi]
    rate = {k: demands[mi].rate for (mi, _v), k in pairs.items()}
    ub = np.r_[base.ub, [rate[k] for k in range(ns)]]
    integ = np.r_[np.ones(n0), np.zeros(ns)]
    spend = np.r_[base.c, np.zeros(ns)]
    total = sum(demands[mi].rate for mi in by_model) or 1.0
    accuracy = np.r_[np.zeros(n0), -np.array(acc) / total]
    return base, a, row_lo, row_hi, ub, integ, spend, np.r_[tie, np.zeros(ns)], accuracy


def _milp_accuracy(demands: Sequence[Demand], profiles: ProfileSet, inv: Inventory, cands: list[Candidate],
                   opts: Options, time_limit: float, clock: Callable[[], float],
                   ) -> tuple[dict[int, int], dict[int, list[LayoutOption]], float, float]:
    """Two stages: the objective (most accurate, or least spend under the floor), then with it
    held the least spend and tie-break. Returns the choice, the layouts, the proven spend lower
    bound (floor) and the proven upper bound on the mean accuracy (objective accuracy)."""
    t0 = clock()
    base, a, lo, hi, ub, integ, spend, tie, acc = _split_program(demands, profiles, inv, cands, opts)
    cons = [LinearConstraint(a, lo, hi)]
    bounds = Bounds(0, ub)
    maximise = inv.objective == "accuracy"
    first = acc if maximise else spend
    res = milp(first, constraints=cons, integrality=integ, bounds=bounds,
               options={"time_limit": 0.7 * time_limit, "mip_rel_gap": 1e-6})
    if res.x is None:
        if res.status == 1:
            raise MilpTimeout(f"MILP found no feasible plan within {time_limit:g} s")
        need = lower_bound(demands, replace(inv, objective="gpus", max_gpus=None, max_cost_per_hour=None,
                                            mean_accuracy_floor=None), cands, opts, lagrangian=False)
        floor = (f" with every model's mean accuracy >= {inv.mean_accuracy_floor:g}"
                 if inv.mean_accuracy_floor is not None else "")
        raise SolverError(f"no plan serves every model at its SLO within {_budget(inv)}{floor} "
                          f"(serving every rate needs at least {need:g} GPUs)")
    best = res.x
    dual = float(getattr(res, "mip_dual_bound", 0.0) or 0.0)
    proven, acc_bound = (0.0, max(0.0, -dual)) if maximise else (dual, 0.0)
    left = time_limit - (clock() - t0)
    if left > 0.5:
        hold = LinearConstraint(first.reshape(1, -1), -np.inf, float(first @ res.x) + HOLD)
        second = tie.copy()
        if not maximise:
            second[base.n_x:base.n_x + len(base.y_index)] = 0.0  # spend is held; only the tie-break is left
        res2 = milp(second, constraints=[*cons, hold], integrality=integ, bounds=bounds,
                    options={"time_limit": left, "mip_rel_gap": 1e-3})
        if res2.x is not None:
            best = res2.x
    x = np.round(best[:base.n_x + len(base.y_index)]).astype(int)
    chosen = {j: int(x[j]) for j in range(base.n_x) if x[j] > 0}
    lay: dict[int, list[LayoutOption]] = {}
    for yi, (ci, lo_) in enumerate(base.y_index):
        lay.setdefault(ci, []).extend([lo_] * int(x[base.n_x + yi]))
    return chosen, lay, proven, acc_bound


# --------------------------------------------------------------------------- greedy


def _keep_at_least(d: Demand, cands: list[Candidate], mi: int, level: float) -> Demand:
    """``d`` allowed only the variants (among its candidates) of accuracy >= ``level``."""
    keep = sorted({c.profile.variant for c in cands if c.model == mi
                   and c.profile.accuracy is not None and c.profile.accuracy + EPS >= level})
    return replace(d, variants=tuple(keep))


def greedy_accuracy(demands: Sequence[Demand], profiles: ProfileSet, inv: Inventory, cands: list[Candidate],
                    opts: Options) -> tuple[GpuPlan, ...]:
    """Whole-model upgrades of the greedy's plan (see the module's docstring)."""
    from placement.greedy import greedy_gpus  # noqa: PLC0415  (greedy builds on the solver)

    def run(ds: list[Demand]) -> tuple[GpuPlan, ...]:
        cs = candidates(ds, profiles, inv, opts)
        _check_coverable(ds, cs)
        return greedy_gpus(ds, inv, cs, opts)

    def plan(gpus: tuple[GpuPlan, ...]) -> Plan:
        return Plan(gpus, tuple(demands), inv, profiles=profiles)

    current = list(demands)
    gpus = run(current)
    floor = inv.mean_accuracy_floor
    if floor is not None:
        means = plan(gpus).mean_accuracies()
        low = [i for i, d in enumerate(demands) if d.rate > 0 and means[d.model] is not None
               and means[d.model] + EPS < floor]
        for i in low:
            current[i] = _keep_at_least(demands[i], cands, i, floor)
        if low:
            gpus = run(current)
    why = over_budget(plan(gpus))
    if why:
        raise SolverError(f"greedy: the plan's {why}; --method milp may find one that fits")
    if inv.objective != "accuracy":
        return gpus
    means = plan(gpus).mean_accuracies()
    top = {i: max((c.profile.accuracy or 0.0) for c in cands if c.model == i) for i in range(len(demands))}
    gain = {i: d.rate * (top[i] - (means[d.model] or 0.0)) for i, d in enumerate(demands)
            if means[d.model] is not None}
    best = plan(gpus).mean_accuracy() or 0.0
    for i in sorted(gain, key=lambda i: -gain[i]):
        if gain[i] <= EPS:
            break
        trial = [*current[:i], _keep_at_least(demands[i], cands, i, top[i]), *current[i + 1:]]
        try:
            g = run(trial)
        except SolverError:
            continue  # the pool runs out
        p = plan(g)
        if over_budget(p) is None and (p.mean_accuracy() or 0.0) > best + EPS:
            current, gpus, best = trial, g, p.mean_accuracy() or 0.0
    return gpus


# --------------------------------------------------------------------------- entry point


def solve_accuracy(demands: Sequence[Demand], profiles: ProfileSet, inv: Inventory, cands: list[Candidate],
                   method: str, label: str, opts: Options, time_limit: float, clock: Callable[[], float],
                   t0: float, bound: bool) -> Plan:
    """:func:`placement.solver.solve` for a pool that asks for accuracy (an objective or a floor)."""
    _check_floor_reachable(demands, profiles, inv, cands)
    proven = acc_bound = 0.0
    if method == "greedy":
        gpus = greedy_accuracy(demands, profiles, inv, cands, opts)
    else:
        try:
            chosen, lay, proven, acc_bound = _milp_accuracy(demands, profiles, inv, cands, opts, time_limit, clock)
            gpus = pack(demands, inv, profiles, chosen, cands, lay)
        except MilpTimeout:
            gpus, label = greedy_accuracy(demands, profiles, inv, cands, opts), label + "->greedy"
    lb = lower_bound(demands, inv, cands, opts) if bound else 0.0
    return Plan(gpus, tuple(demands), inv, label, lb, clock() - t0, profiles, proven, acc_bound)


__all__ = ["greedy_accuracy", "over_budget", "solve_accuracy"]
