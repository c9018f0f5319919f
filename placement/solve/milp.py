"""The integer program solved by HiGHS (through ``highspy``), started from the greedy's plan.

Stage 1 minimises GPUs (or cost). It starts with the integer master of the lower bound's
Dantzig-Wolfe pricing ("price and branch"): each model takes one of the whole-replica covers
that pricing went through (the greedy's own among them) and GPUs take layouts whose slices hold
the covers' shares. That program is small, and on a fleet of many small models its optimum is
usually the bound itself, which proves it. Only where it leaves a gap to the bound does HiGHS go
on with the program under the rounding cuts, started from the master's plan: first over the
columns its LP relaxation uses and the plan's (every layout kept), then over all. Either way
the greedy's replica counts and layouts are the first incumbent: whatever the time limit, the
answer is never worse than the greedy's (a 1,000-model fleet is one program, not a sequence of
chunks). Stage 2 holds that spend and prefers the most accurate variants and the least share
(no idle replicas).
``scipy.optimize.milp`` wraps the same HiGHS but takes no starting solution.

On an overfull pool (the greedy left best-effort demand unplaced) each best-effort model's
capacity row gets a continuous slack, the req/s left unplaced, priced above what any replica
costs per req/s: the program places every guaranteed req/s, then as much best-effort as fits,
then uses the fewest GPUs. The whole program of such a pool is too large for HiGHS's root node
(its presolve and cut rounds ran 72 s past a 45 s limit on a 1,000-model fleet), so with the
greedy's plan to start from HiGHS searches only the columns its LP relaxation uses and the
greedy's, every layout and every slack.

Work, not time, ends every phase: HiGHS runs on one thread with a fixed seed, each search
within its :class:`Effort` of branch-and-bound nodes, and no decision reads the clock, so a
problem gets the same plan on any host at any load. The time limit is a safety stop only: a
phase it cuts short (or skips) marks the result, whose plan may then differ between runs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import highspy
import numpy as np
from scipy.sparse import coo_matrix, csc_matrix, hstack, vstack

from placement.plan import Demand, Inventory
from placement.solve.bound import Cover, Program, bound_and_covers, program, rounded, with_slack
from placement.solve.candidates import (
    Candidate,
    LayoutOption,
    MilpTimeout,
    Options,
    SolverError,
    Start,
)


@dataclass(frozen=True)
class Effort:
    """How far each phase of the MILP searches, in HiGHS branch-and-bound nodes (a search that
    proves its optimum first stops there). Stage 1 minimises GPUs or cost; stage 2 holds that
    spend and breaks ties (accuracy, then the least share)."""

    master_nodes: int = 2000  # stage 1's integer master, each of its two runs
    program_nodes: int = 1000  # stage 1's program, when the master leaves a gap (or there is none)
    tie_nodes: int = 500  # stage 2, each run
    # each stage of an accuracy objective or floor (one program with the split; its stage 2
    # minimises the GPUs that keep the accuracy, where 500 nodes leave the 10-model imagenet
    # fleet's most accurate plan a GPU over)
    accuracy_nodes: int = 2000


EFFORT = Effort()


class SafetyStop:
    """The safety stop: ``seconds`` of ``clock`` from now. ``hit`` once it cut a phase short."""

    def __init__(self, clock: Callable[[], float], seconds: float) -> None:
        self.clock, self.at, self.hit = clock, clock() + seconds, False

    def left(self) -> float:
        return self.at - self.clock()


@dataclass(frozen=True)
class MilpChoice:
    """What the MILP chose: replica counts by candidate, layouts by GPU class, the proven lower
    bound, :func:`~placement.solve.bound.lower_bound`'s value with the seconds it took (when
    the master ran), and whether the safety stop cut a phase short."""

    chosen: dict[int, int]
    layouts: dict[int, list[LayoutOption]]
    proven: float
    lower: tuple[float, float] | None
    stopped: bool


def _vector(p: Program, start: Start) -> np.ndarray:
    x = np.zeros(len(p.c))
    for j, n in start.chosen.items():
        x[j] = n
    col = {(ci, lo.counts): p.n_x + yi for yi, (ci, lo) in enumerate(p.y_index)}
    for ci, los in start.layouts.items():
        for lo in los:
            x[col[(ci, lo.counts)]] += 1
    return x


def _run(c: np.ndarray, a, lo: np.ndarray, hi: np.ndarray, ub: np.ndarray, gap: float, start: np.ndarray | None,
         nodes: int, stop: SafetyStop, n_int: int | None = None) -> tuple[np.ndarray | None, float, str]:
    """(solution or None, proven dual bound, status) of one integer program, searched within
    ``nodes`` branch-and-bound nodes; columns past ``n_int`` (default: none) are continuous.
    Past the safety stop it does not run."""
    if stop.left() <= 0:
        stop.hit = True
        return None, 0.0, "Time limit reached"
    m = csc_matrix(a)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = m.shape[1], m.shape[0]
    lp.col_cost_ = np.asarray(c, dtype=float)
    lp.col_lower_, lp.col_upper_ = np.zeros(len(c)), np.asarray(ub, dtype=float)
    inf = highspy.kHighsInf
    lp.row_lower_ = np.where(np.isfinite(lo), lo, -inf)
    lp.row_upper_ = np.where(np.isfinite(hi), hi, inf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = m.indptr, m.indices, m.data
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = m.shape[1], m.shape[0]
    n_int = len(c) if n_int is None else n_int
    lp.integrality_ = ([highspy.HighsVarType.kInteger] * n_int
                       + [highspy.HighsVarType.kContinuous] * (len(c) - n_int))
    # NOTE: the bare core class: highspy.Highs() prints a banner on stdout, which a plan's
    # YAML output must not carry
    h = highspy._Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(stop.left()))
    h.setOptionValue("mip_max_nodes", int(nodes))
    h.setOptionValue("mip_rel_gap", gap)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    h.passModel(lp)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(start)
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    if h.getModelStatus() == highspy.HighsModelStatus.kTimeLimit:
        stop.hit = True
    info = h.getInfo()
    if info.primal_solution_status < 2:  # no feasible point
        return None, 0.0, status
    return np.asarray(h.getSolution().col_value), float(info.mip_dual_bound), status


class _Master:
    """The integer master over ``covers`` and the covers of ``start`` (a plan as program
    values): one cover per model, GPUs per layout within the pool, each slice kind's shares
    within its slices. Its columns: the layouts (as in ``p``), then the covers."""

    def __init__(self, p: Program, inv: Inventory, covers: Sequence[Cover], cands: list[Candidate],
                 start: np.ndarray) -> None:
        n_cls, n_kinds, ny = len(inv.classes), len(p.kinds), len(p.y_index)
        kind_row = {k: i for i, k in enumerate(p.kinds)}
        own: dict[int, dict[int, int]] = defaultdict(dict)
        for j in np.flatnonzero(start[:p.n_x] > 0.5):
            own[cands[j].model][int(j)] = int(round(start[j]))
        index: dict[tuple, int] = {}
        self.columns: list[Cover] = []
        for mi, counts in [*covers, *own.items()]:
            key = (mi, tuple(sorted((j, k) for j, k in counts.items() if k)))
            if key not in index:
                index[key] = len(self.columns)
                self.columns.append((mi, dict(key[1])))
        models = {mi: r for r, mi in enumerate(sorted({mi for mi, _ in self.columns}))}
        rows, cols, vals = [], [], []
        for q, (mi, counts) in enumerate(self.columns):
            for j, k in counts.items():
                rows.append(n_cls + kind_row[(cands[j].cls, cands[j].slice)])
                cols.append(q)
                vals.append(cands[j].share * k)
            rows.append(n_cls + n_kinds + models[mi]), cols.append(q), vals.append(1.0)
        top = p.a[:n_cls + n_kinds, p.n_x:]  # the layouts' class and slice-kind rows
        self.a = csc_matrix(hstack([vstack([top, csc_matrix((len(models), ny))]),
                                    coo_matrix((vals, (rows, cols)),
                                               shape=(n_cls + n_kinds + len(models), len(self.columns)))]))
        self.lo = np.r_[np.full(n_cls + n_kinds, -np.inf), np.ones(len(models))]
        self.hi = np.r_[p.hi[:n_cls], np.zeros(n_kinds), np.ones(len(models))]
        self.ub = np.r_[p.ub[p.n_x:], np.ones(len(self.columns))]
        self.start = np.r_[start[p.n_x:], np.zeros(len(self.columns))]
        for mi in models:
            self.start[ny + index[(mi, tuple(sorted(own.get(mi, {}).items())))]] = 1.0
        self.p, self.ny = p, ny

    def cost(self, program_cost: np.ndarray) -> np.ndarray:
        """A program objective over the master's columns: each cover costs its replicas'."""
        covers = [sum(program_cost[j] * k for j, k in counts.items()) for _, counts in self.columns]
        return np.r_[program_cost[self.p.n_x:self.p.n_x + self.ny], covers]

    def solve(self, cost: np.ndarray, gap: float, nodes: int, stop: SafetyStop, spend: float | None = None,
              restrict: bool = False) -> np.ndarray | None:
        """The master's optimum of ``cost`` from its start (within ``spend``, the plan's cost,
        if given) as program values, or None if HiGHS returns none. ``restrict``: over the
        covers its LP relaxation uses and the start's alone (a restricted master: seconds
        where the whole one spends minutes in root cuts, and on a fleet of many small models
        as good)."""
        a, lo, hi, ub, start = self.a, self.lo, self.hi, self.ub, self.start
        if spend is not None:
            a = csc_matrix(vstack([a, np.r_[self.p.c[self.p.n_x:self.p.n_x + self.ny], np.zeros(len(self.columns))]]))
            lo, hi = np.r_[lo, -np.inf], np.r_[hi, spend + 1e-6]
        cols = np.arange(len(cost))
        if restrict:
            cols, _ = _support(cost, a, lo, hi, ub, start, np.arange(len(cost)) < self.ny, stop)
        x, _, _ = _run(cost[cols], a[:, cols], lo, hi, ub[cols], gap, start[cols], nodes, stop)
        if x is None:
            return None
        self.start = np.zeros(len(cost))
        self.start[cols] = np.round(x)
        out = np.zeros(len(self.p.c))
        out[self.p.n_x:] = self.start[:self.ny]
        for q in np.flatnonzero(self.start[self.ny:] > 0.5):
            for j, k in self.columns[q][1].items():
                out[j] += k
        return out


def _support(c: np.ndarray, a, lo: np.ndarray, hi: np.ndarray, ub: np.ndarray, start: np.ndarray | None,
             always: np.ndarray, stop: SafetyStop) -> tuple[np.ndarray, float | None]:
    """The columns the LP relaxation's optimum uses, the start's and those ``always`` kept, with
    the LP's optimum (a lower bound on the program's); every column and None if the LP has no
    optimum."""
    lp, _, _ = _run(c, a, lo, hi, ub, 0.0, None, 0, stop, n_int=0)
    if lp is None:
        return np.arange(len(c)), None
    used = always | (lp > 1e-9)
    if start is not None:
        used |= start > 0.5
    return np.flatnonzero(used), float(c @ lp)


def milp_choice(demands: Sequence[Demand], inv: Inventory, cands: list[Candidate], opts: Options,
                time_limit: float, clock: Callable[[], float] = time.perf_counter, start: Start | None = None,
                slack: Sequence[int] = (), start_unplaced: dict[int, float] | None = None,
                effort: Effort = EFFORT) -> MilpChoice:
    """The MILP's plan within ``effort`` (``time_limit`` seconds of ``clock`` is the safety
    stop). Raises :class:`MilpTimeout` if the stop came before any integer plan was known (never
    when ``start`` is given). Models in ``slack`` (best-effort) may be placed in part;
    ``start_unplaced`` is the start's req/s left unplaced per model."""
    stop = SafetyStop(clock, time_limit)
    p = program(demands, inv, cands, opts, tie_break=False, cuts=True, uncut=frozenset(slack))
    n_int = len(p.c)
    x0 = _vector(p, start) if start is not None else None
    proven = 0.0
    if slack:
        p = with_slack(p, demands, inv, cands, slack)
        if x0 is not None:
            x0 = np.r_[x0, [(start_unplaced or {}).get(mi, 0.0) for mi in slack]]
    master, lower = None, None
    if x0 is not None and not slack:  # NOTE: then p is lower_bound()'s own program
        tb = clock()
        bound, covers = bound_and_covers(demands, inv, cands, p)
        proven = rounded(inv, bound)
        lower = (proven, clock() - tb)
        master = _Master(p, inv, covers, cands, x0)
        for restrict in (True, False):  # the restricted master first: often it meets the bound
            if float(p.c @ x0) <= proven * (1 + 1e-6):
                break
            xm = master.solve(master.cost(p.c), 1e-6, effort.master_nodes, stop, restrict=restrict)
            if xm is not None and float(p.c @ xm) < float(p.c @ x0):
                x0 = xm
    cols = np.arange(len(p.c))
    if x0 is not None and float(p.c @ x0) <= proven * (1 + 1e-6):
        best = x0  # the master's plan meets the bound: nothing to search
    else:
        master = None  # the program's plan may be no cover of the master's
        best = x0  # NOTE: HiGHS keeps the start as incumbent; this only guards against rounding
        cols, lp = _support(p.c, p.a, p.lo, p.hi, p.ub, x0, np.arange(len(p.c)) >= p.n_x, stop)
        if lp is not None and not slack:
            proven = max(proven, rounded(inv, lp))
        # the program over the LP's columns first; then all of it, unless on an overfull pool
        # with a plan already (there the whole program's root alone outruns any budget)
        for whole in (False, True):
            if whole and slack and best is not None:
                break
            use = np.arange(len(p.c)) if whole else cols
            x, dual, status = _run(p.c[use], p.a[:, use], p.lo, p.hi, p.ub[use], 1e-6,
                                   None if x0 is None else x0[use], effort.program_nodes, stop,
                                   int((use < n_int).sum()))
            if x is not None:
                x = _spread(x, use, len(p.c))
                if best is None or float(p.c @ x) < float(p.c @ best) - 1e-9:
                    best = x
                x0 = best
            if whole:
                cols = use
                if not slack and x is not None:
                    proven = max(proven, dual)
        if best is None:
            if stop.hit:
                raise MilpTimeout(f"MILP found no feasible plan within {time_limit:g} s")
            raise SolverError(f"MILP found no feasible plan ({status})")
        best = np.r_[np.round(best[:n_int]), best[n_int:]]
    tie = np.r_[program(demands, inv, cands, opts, tie_break=True).c, p.c[n_int:]]
    tie[p.n_x:n_int] = 0.0
    tie /= max(float(tie.max()), 1e-12)  # NOTE: the same optimum; HiGHS warns of, and slows on, tiny costs
    spend = float(p.c @ best)
    if master is not None:  # the master's covers, at the plan's spend: restricted, then all
        x2 = master.solve(master.cost(tie), 1e-3, effort.tie_nodes, stop, spend, restrict=True)
        if x2 is not None:
            x_all = master.solve(master.cost(tie), 1e-3, effort.tie_nodes, stop, spend)
            x2 = x2 if x_all is None else x_all
    else:  # the columns stage 1 searched last
        a2 = vstack([p.a[:, cols], p.c[cols].reshape(1, -1)]).tocsc()
        x2, _, _ = _run(tie[cols], a2, np.r_[p.lo, -np.inf], np.r_[p.hi, spend + 1e-6], p.ub[cols], 1e-3,
                        best[cols], effort.tie_nodes, stop, int((cols < n_int).sum()))
        x2 = None if x2 is None else _spread(x2, cols, len(p.c))
    if x2 is not None:
        best = np.r_[np.round(x2[:n_int]), x2[n_int:]]
    x = np.round(best[:n_int]).astype(int)
    chosen = {j: int(x[j]) for j in range(p.n_x) if x[j] > 0}
    lay: dict[int, list[LayoutOption]] = defaultdict(list)
    for yi, (ci, lo) in enumerate(p.y_index):
        lay[ci] += [lo] * int(x[p.n_x + yi])
    return MilpChoice(chosen, dict(lay), proven, lower, stop.hit)


def _spread(x: np.ndarray, cols: np.ndarray, n: int) -> np.ndarray:
    """Values of columns ``cols`` as a vector of all ``n``."""
    out = np.zeros(n)
    out[cols] = x
    return out
