"""Plans that trade GPUs for accuracy: the most accurate answers within a budget (objective
``accuracy``), or the fewest GPUs whose answers meet a mean-accuracy floor.

The gateway's ``accuracy`` objective fills a model's most accurate variant to its capacity and
overflows the rest to the next one, so a plan's answers split across its variants by capacity.
The program is :mod:`placement.solve.solver`'s (replicas ``x_j``, layouts ``y[c,L]``; inventory, slice
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

Partial plans, as under the gpus and cost objectives: guaranteed demand must fit the budget
whole; when best-effort demand does not (the program above is infeasible), each best-effort
model ``m`` gets a continuous slack ``u[m]``, the req/s left unplaced (``sum_v s[m,v] + u[m] =
rate_m``, and on its capacity row), priced above any gain in accuracy or spend, so the program
places every guaranteed req/s, then as much best-effort as fits, then the most accurate answers
(or the least spend). The floor then holds for the answers a model gets: ``sum_v (acc_v -
floor) s[m,v] >= 0``. The plan reports each model placed short (:mod:`placement.solve.shortfall`).

The greedy (method ``greedy``, and the fallback when the MILP finds nothing in time) upgrades
whole models: from the fewest-GPU greedy plan, a model below the floor keeps only the variants
that meet it; under ``accuracy`` each model in turn (largest gain in accurate answers first)
keeps only its most accurate variant when the plan still fits the budget and places as much
best-effort demand. It never mixes variants on purpose, so the MILP's plans are at least as
accurate. A plan over the budget is planned again on the pool cut down to the budget: the GPUs
guaranteed demand alone takes, then as many of the others the over-budget plan took as the
budget allows; best-effort demand fills what that pool holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix, hstack, vstack

from placement.plan import (
    ACCURACY_EPS,
    EPS,
    KEEP_SERVED,
    Demand,
    GpuPlan,
    Inventory,
    Plan,
    drop_replica,
    has_known_accuracy,
)
from placement.solve.bound import lower_bound, program, timed_bound, with_slack
from placement.solve.candidates import (
    Candidate,
    LayoutOption,
    MilpTimeout,
    Options,
    SolverError,
    candidates,
    check_coverable,
)
from placement.solve.floors import spread
from placement.solve.greedy import greedy_choice, missing_text
from placement.solve.milp import EFFORT, Effort, SafetyStop
from placement.solve.packing import pack
from placement.solve.shortfall import shortfalls
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
                   opts: Options, slack: Sequence[int] = ()):
    """The solver's program with the served-rate columns and the budget and floor rows; the
    models of ``slack`` (best-effort) may be placed in part (the module's docstring).
    Returns (base program, matrix, row bounds, column bounds, integrality, spend, tie-break,
    accuracy objective); the vectors span every column."""
    base = program(demands, inv, cands, opts, tie_break=False, cuts=True, uncut=frozenset(slack))
    tie = program(demands, inv, cands, opts, tie_break=True).c
    if slack:
        base = with_slack(base, demands, inv, cands, slack)
    n0 = len(base.c)
    unplaced = {mi: n0 - len(slack) + i for i, mi in enumerate(slack)}  # the slack columns
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
        row([(n0 + k, 1.0) for k in ks] + ([(unplaced[mi], 1.0)] if mi in unplaced else []), rate, rate)
        if inv.mean_accuracy_floor is not None:
            row([(n0 + k, acc[k] - inv.mean_accuracy_floor) for k in ks], 0.0, np.inf)
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
    integ = np.r_[np.ones(n0 - len(slack)), np.zeros(len(slack) + ns)]
    spend = np.r_[base.c, np.zeros(ns)]
    # (a subnormal rate would scale the objective to infinity: the total is at least KEEP_SERVED)
    total = max(sum(demands[mi].rate for mi in by_model), KEEP_SERVED)
    # an unplaced req/s costs more than the most accurate answer is worth
    accuracy = np.r_[np.zeros(n0 - len(slack)), np.full(len(slack), 2.0 / total), -np.array(acc) / total]
    return base, a, row_lo, row_hi, ub, integ, spend, np.r_[tie, np.zeros(len(slack) + ns)], accuracy


def _milp_accuracy(demands: Sequence[Demand], profiles: ProfileSet, inv: Inventory, cands: list[Candidate],
                   opts: Options, time_limit: float, clock: Callable[[], float], effort: Effort = EFFORT,
                   ) -> tuple[dict[int, int], dict[int, list[LayoutOption]], float, float, bool]:
    """Two stages: the objective (most accurate, or least spend under the floor), then with it
    held the least spend and tie-break, each within ``effort``'s nodes (``time_limit`` seconds
    of ``clock`` is the safety stop). Returns the choice, the layouts, the proven spend lower
    bound (floor), the proven upper bound on the mean accuracy (objective accuracy) and whether
    the safety stop cut a stage short."""
    stop = SafetyStop(clock, time_limit)
    maximise = inv.objective == "accuracy"
    best_effort = [mi for mi, d in enumerate(demands) if not d.guaranteed and d.rate > 0]
    for slack in ([], best_effort):
        base, a, lo, hi, ub, integ, spend, tie, acc = _split_program(demands, profiles, inv, cands, opts, slack)
        cons = [LinearConstraint(a, lo, hi)]
        bounds = Bounds(0, ub)
        first = acc if maximise else spend
        res = milp(first, constraints=cons, integrality=integ, bounds=bounds,
                   options={"node_limit": effort.accuracy_nodes, "time_limit": max(0.1, stop.left()),
                            "mip_rel_gap": 1e-6})
        if res.x is not None or res.status == 1 or not best_effort:
            break  # planned, out of nodes or time, or nothing to place in part
    stop.hit = stop.left() <= 0
    if res.x is None:
        if res.status == 1:
            raise MilpTimeout(f"MILP found no feasible plan within {effort.accuracy_nodes} nodes "
                              f"and {time_limit:g} s")
        raise SolverError(_unplannable(demands, profiles, inv, opts, cands))
    best = res.x
    dual = float(getattr(res, "mip_dual_bound", 0.0) or 0.0)
    proven, acc_bound = (0.0, max(0.0, -dual)) if maximise else (dual, 0.0)
    if stop.left() > 0:
        hold = LinearConstraint(first.reshape(1, -1), -np.inf, float(first @ res.x) + HOLD)
        second = tie.copy()
        if not maximise:
            second[base.n_x:base.n_x + len(base.y_index)] = 0.0  # spend is held; only the tie-break is left
        res2 = milp(second, constraints=[*cons, hold], integrality=integ, bounds=bounds,
                    options={"node_limit": effort.accuracy_nodes, "time_limit": stop.left(), "mip_rel_gap": 1e-3})
        stop.hit |= stop.left() <= 0
        if res2.x is not None:
            best = res2.x
    else:
        stop.hit = True
    x = np.round(best[:base.n_x + len(base.y_index)]).astype(int)
    chosen = {j: int(x[j]) for j in range(base.n_x) if x[j] > 0}
    lay: dict[int, list[LayoutOption]] = {}
    for yi, (ci, lo_) in enumerate(base.y_index):
        lay.setdefault(ci, []).extend([lo_] * int(x[base.n_x + yi]))
    return chosen, lay, proven, acc_bound, stop.hit


def _unplannable(demands: Sequence[Demand], profiles: ProfileSet, inv: Inventory, opts: Options,
                 cands: list[Candidate]) -> str:
    """Why no plan exists: the budget (and floor) against the GPUs the demand that must be
    placed whole (guaranteed, or every model when none is best-effort) needs at least."""
    whole = [d for d in demands if d.guaranteed]
    which, must = ("every guaranteed model", whole) if len(whole) < len(demands) else ("every model", list(demands))
    if must is not demands:
        cands = candidates(must, profiles, inv, opts)
    need = lower_bound(must, replace(inv, objective="gpus", max_gpus=None, max_cost_per_hour=None,
                                     mean_accuracy_floor=None), cands, opts, lagrangian=False)
    floor = (f" with every model's mean accuracy >= {inv.mean_accuracy_floor:g}"
             if inv.mean_accuracy_floor is not None else "")
    return (f"no plan serves {which} at its SLO within {_budget(inv)}{floor} "
            f"(serving its rate needs at least {need:g} GPUs)")


# --------------------------------------------------------------------------- greedy


def _keep_at_least(d: Demand, cands: list[Candidate], mi: int, level: float) -> Demand:
    """``d`` allowed only the variants (among its candidates) of accuracy >= ``level``."""
    keep = sorted({c.profile.variant for c in cands if c.model == mi
                   and c.profile.accuracy is not None and c.profile.accuracy + EPS >= level})
    return replace(d, variants=tuple(keep))


@dataclass(frozen=True)
class _Fit:
    gpus: tuple[GpuPlan, ...]
    unplaced: float  # best-effort req/s the plan leaves out


def _per_class(inv: Inventory, gpus: Sequence[GpuPlan]) -> dict[int, int]:
    """GPUs used per class index."""
    cls = {i: ci for ci, c in enumerate(inv.classes) for i in c.ids}
    out: dict[int, int] = {}
    for g in gpus:
        out[cls[g.id]] = out.get(cls[g.id], 0) + 1
    return out


def _cut_to_budget(inv: Inventory, low: dict[int, int], high: dict[int, int]) -> Inventory:
    """``inv`` with only the GPUs guaranteed demand takes (``low`` per class) and as many of
    the others an over-budget plan took (``high``) as the budget allows, class by class in
    proportion; every class stays (its candidates keep their indices)."""
    keep = dict(low)
    extra = sorted(((k + 1) / (high[ci] - low.get(ci, 0)), ci)
                   for ci in high for k in range(high[ci] - low.get(ci, 0)))

    def within(k: dict[int, int]) -> bool:
        gpus = sum(k.values())
        cost = sum(n * inv.classes[ci].cost_per_hour for ci, n in k.items())
        return ((inv.max_gpus is None or gpus <= inv.max_gpus)
                and (inv.max_cost_per_hour is None or cost <= inv.max_cost_per_hour + EPS))

    for _, ci in extra:
        trial = {**keep, ci: keep.get(ci, 0) + 1}
        if within(trial):
            keep = trial
    return replace(inv, classes=tuple(replace(c, ids=c.ids[:keep.get(ci, 0)]) for ci, c in enumerate(inv.classes)))


def _greedy_fit(ds: list[Demand], profiles: ProfileSet, inv: Inventory, opts: Options) -> _Fit:
    """The greedy's plan of ``ds`` within the pool and its budget: guaranteed demand whole (else
    :class:`SolverError`), best-effort in what is left (see the module's docstring)."""
    def run(pool: Inventory, demands: list[Demand]):  # noqa: ANN202  (placement.solve.greedy.Greedy)
        cs = candidates(demands, profiles, pool, opts)
        check_coverable(demands, cs)
        g = greedy_choice(demands, pool, cs, opts)
        if g.missing:
            raise SolverError(f"guaranteed demand does not fit the pool: it needs {missing_text(pool, g.missing)} "
                              f"beyond the pool's {sum(len(c.ids) for c in pool.classes)}")
        return g

    g = run(inv, ds)
    why = over_budget(Plan(g.gpus, tuple(ds), inv))
    if why is None:
        return _Fit(g.gpus, sum(g.unplaced.values()))
    whole = [d for d in ds if d.guaranteed]
    if len(whole) == len(ds):
        raise SolverError(f"greedy: the plan's {why}; --method milp may find one that fits")
    alone = run(inv, whole)
    why = over_budget(Plan(alone.gpus, tuple(whole), inv))
    if why:
        raise SolverError(f"greedy: guaranteed demand alone: the plan's {why}; --method milp may find one that fits")
    cut = _cut_to_budget(inv, _per_class(inv, alone.gpus), _per_class(inv, g.gpus))
    try:
        g = run(cut, ds)
    except SolverError as e:
        raise SolverError(f"greedy: within {_budget(inv)}, {e}; --method milp may find one that fits") from None
    return _Fit(g.gpus, sum(g.unplaced.values()))


def greedy_accuracy(demands: Sequence[Demand], profiles: ProfileSet, inv: Inventory, cands: list[Candidate],
                    opts: Options) -> tuple[GpuPlan, ...]:
    """Whole-model upgrades of the greedy's plan (see the module's docstring)."""
    def run(ds: list[Demand]) -> _Fit:
        return _greedy_fit(ds, profiles, inv, opts)

    def plan(gpus: tuple[GpuPlan, ...]) -> Plan:
        return Plan(gpus, tuple(demands), inv, profiles=profiles)

    current = list(demands)
    fit = run(current)
    floor = inv.mean_accuracy_floor
    if floor is not None:
        means = plan(fit.gpus).mean_accuracies()
        low = [i for i, d in enumerate(demands) if d.rate > 0 and means[d.model] is not None
               and means[d.model] + EPS < floor]
        for i in low:
            current[i] = _keep_at_least(demands[i], cands, i, floor)
        if low:
            fit = run(current)
    if inv.objective != "accuracy":
        return fit.gpus
    means = plan(fit.gpus).mean_accuracies()
    top = {i: max(((c.profile.accuracy or 0.0) for c in cands if c.model == i), default=0.0)
           for i in range(len(demands))}
    gain = {i: d.rate * (top[i] - (means[d.model] or 0.0)) for i, d in enumerate(demands)
            if means[d.model] is not None}
    best = plan(fit.gpus).mean_accuracy() or 0.0
    for i in sorted(gain, key=lambda i: -gain[i]):
        if gain[i] <= EPS:
            break
        trial = [*current[:i], _keep_at_least(demands[i], cands, i, top[i]), *current[i + 1:]]
        try:
            f = run(trial)
        except SolverError:
            continue  # the pool or the budget runs out
        # NOTE: best-effort demand placed comes before accuracy: an upgrade never places less
        if f.unplaced <= fit.unplaced + EPS and (plan(f.gpus).mean_accuracy() or 0.0) > best + EPS:
            current, fit, best = trial, f, plan(f.gpus).mean_accuracy() or 0.0
    return fit.gpus


def _hold_floor(gpus: Sequence[GpuPlan], demands: Sequence[Demand], inv: Inventory,
                profiles: ProfileSet) -> tuple[GpuPlan, ...]:
    """``gpus`` without the least accurate replicas of a best-effort model whose mean accuracy
    misses the floor. Placed short, such a model has every replica serve at capacity, so its
    mean is its replicas' capacity-weighted one, which the program's served-rate columns may
    leave below the floor (they need not fill a replica); fewer of its least accurate replicas
    raise it. One replica is always kept."""
    floor = inv.mean_accuracy_floor
    if floor is None:
        return tuple(gpus)
    out = list(gpus)
    acc = {p.variant: p.accuracy or 0.0 for d in demands for p in profiles.find(model=d.model)}
    for d in demands:
        if d.guaranteed:
            continue
        while True:
            mean = Plan(tuple(out), tuple(demands), inv, profiles=profiles).mean_accuracy(d.model)
            mine = [(acc.get(r.variant, 0.0), r.capacity, gi, si, ri) for gi, g in enumerate(out)
                    for si, s in enumerate(g.slices) for ri, r in enumerate(s.replicas) if r.model == d.model]
            if mean is None or mean + ACCURACY_EPS >= floor or len(mine) <= 1:
                break
            drop_replica(out, *min(mine)[2:])
    return tuple(out)


# --------------------------------------------------------------------------- entry point


def solve_accuracy(demands: Sequence[Demand], profiles: ProfileSet, inv: Inventory, cands: list[Candidate],
                   method: str, label: str, opts: Options, time_limit: float, clock: Callable[[], float],
                   t0: float, bound: bool) -> Plan:
    """:func:`placement.solve.solver.solve` for a pool that asks for accuracy (an objective or a floor)."""
    _check_floor_reachable(demands, profiles, inv, cands)
    proven = acc_bound = 0.0
    if method == "greedy":
        gpus = greedy_accuracy(demands, profiles, inv, cands, opts)
    else:
        try:
            chosen, lay, proven, acc_bound, stopped = _milp_accuracy(demands, profiles, inv, cands, opts,
                                                                     time_limit - (clock() - t0), clock)
            gpus = pack(demands, inv, profiles, chosen, cands, lay)
            if stopped:
                label += "[time-limit]"  # the safety stop cut the search: another run may differ
        except MilpTimeout:
            gpus, label = greedy_accuracy(demands, profiles, inv, cands, opts), label + "->greedy"
    gpus = _hold_floor(gpus, demands, inv, profiles)
    gpus, floors = spread(gpus, demands, inv, profiles, cands, opts)
    placed = Plan(gpus, tuple(demands), inv, profiles=profiles).capacities()
    short = shortfalls(demands, inv, cands, opts, {mi: placed[d.model] for mi, d in enumerate(demands)})
    lb, lb_s = timed_bound(demands, inv, cands, opts, bound and not short, clock)
    return Plan(gpus, tuple(demands), inv, label, lb, clock() - t0, profiles, proven, acc_bound, shortfall=short,
                bound_seconds=lb_s, floors=floors)


__all__ = ["greedy_accuracy", "over_budget", "solve_accuracy"]
