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

Methods: ``greedy`` (:mod:`placement.solve.greedy`) fills concrete GPUs first-fit decreasing;
``milp`` (:mod:`placement.solve.milp`) solves the program with HiGHS under a time limit, started from
the greedy's plan, first over the whole-replica covers the lower bound's pricing finds. Both report a lower bound, hence a gap: the better of the LP relaxation
(with rounding cuts) and a Lagrangian bound that keeps each model's replicas integer
(:func:`placement.solve.bound.lower_bound`). Candidates and layouts: :mod:`placement.solve.candidates`.

Guaranteed demand is placed whole or not at all: if the pool cannot hold it the solve fails
saying how many GPUs of which kind are missing. Best-effort demand fills what is left; on an
overfull pool the plan is partial, with a :class:`placement.plan.Shortfall` per best-effort
model placed short (:mod:`placement.solve.shortfall`).

After either method, several replicas of one variant at small MPS shares on one slice become
fewer at larger shares where those serve more (:func:`placement.solve.merge.merge_shares`).
Replica floors (a demand's ``min_replicas``, and its ``min_count`` replicas in all) are then met
by one pass over its GPUs, :func:`placement.solve.floors.spread`: distinct
GPUs, distinct nodes where the pool has them, then the count on any GPUs, and a
:class:`placement.plan.FloorShortfall` where the pool cannot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from placement.plan import Demand, Inventory, Plan
from placement.solve.bound import lower_bound, timed_bound
from placement.solve.candidates import (
    DEFAULT,
    Candidate,
    LayoutOption,
    MilpTimeout,
    Options,
    SolverError,
    candidates,
    check_coverable,
    layout_options,
)
from placement.solve.floors import placed, spread
from placement.solve.greedy import greedy_choice, missing_text
from placement.solve.merge import merge_shares
from placement.solve.packing import pack
from placement.solve.shortfall import capacities, shortfalls
from profiles.profile import ProfileSet

__all__ = ["DEFAULT", "METHODS", "TIME_LIMIT", "Candidate", "LayoutOption", "MilpTimeout", "Options", "SolverError",
           "candidates", "layout_options", "lower_bound", "solve"]

METHODS = ("greedy", "milp")
# seconds: the MILP's safety stop. Its work budget (Effort) ends the search first: the 1,000-model
# fleet's plan, whole, takes about a fifth of this on a 2-core host (docs/placement.md)
TIME_LIMIT = 60.0


# --------------------------------------------------------------------------- entry point


def solve(demands: Sequence[Demand], profiles: ProfileSet, inventory: Inventory, method: str = "greedy",
          *, time_limit: float = TIME_LIMIT, options: Options = DEFAULT, bound: bool = True,
          clock: Callable[[], float] = time.perf_counter) -> Plan:
    """Plan ``demands`` on ``inventory`` from ``profiles``. No I/O, and deterministic: the MILP
    searches within a budget of work (:class:`placement.solve.milp.Effort`); ``time_limit``
    seconds of ``clock`` (injected) is only its safety stop, which a plan it cut short names in
    its method (``milp[time-limit]``). ``clock`` also meters the reported solve time."""
    if method not in METHODS:
        raise SolverError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    names = [d.model for d in demands]
    if len(set(names)) != len(names):
        raise SolverError(f"models must be unique, got duplicates {sorted({n for n in names if names.count(n) > 1})}")
    t0 = clock()
    cands = candidates(demands, profiles, inventory, options)
    check_coverable(demands, cands)
    label = method if options == DEFAULT else f"{method}[mig={int(options.mig)},mps={int(options.mps)}]"
    if inventory.accuracy_aware:
        from placement.solve.accuracy import solve_accuracy  # noqa: PLC0415  (imports scipy's MILP)

        return solve_accuracy(demands, profiles, inventory, cands, method, label, options, time_limit, clock, t0, bound)
    proven, lower = 0.0, None
    g = greedy_choice(demands, inventory, cands, options)
    lacking = ""
    if g.missing:
        lacking = (f"guaranteed demand does not fit the pool: it needs {missing_text(inventory, g.missing)} "
                   f"beyond the pool's {sum(len(c.ids) for c in inventory.classes)}")
    if method == "greedy":
        if lacking:
            raise SolverError(lacking)
        gpus, chosen = g.gpus, g.start.chosen
    else:
        from placement.solve.milp import milp_choice  # noqa: PLC0415  (imports HiGHS)

        # the greedy may run out of GPUs where the program does not: then no start, best-effort
        # may be placed in part
        start = None if lacking else g.start
        slack = [mi for mi, d in enumerate(demands) if not d.guaranteed] if (g.unplaced or lacking) else []
        try:
            m = milp_choice(demands, inventory, cands, options, time_limit - (clock() - t0), clock, start, slack,
                            g.unplaced)
            chosen, proven, lower = m.chosen, m.proven, m.lower
            gpus = pack(demands, inventory, profiles, chosen, cands, m.layouts)
            if m.stopped:
                label += "[time-limit]"  # the safety stop cut the search: another run may differ
        except SolverError:
            if start is None:
                if lacking:
                    raise SolverError(lacking) from None
                raise
            # no integer solution within the limit: the greedy's plan stands, and says so
            gpus, chosen = g.gpus, g.start.chosen
            label += "->greedy"
    gpus, merges = merge_shares(gpus, demands, profiles)
    gpus, floors = spread(gpus, demands, inventory, profiles, cands, options)
    caps = placed(gpus, demands) if merges or any(d.floored for d in demands) else capacities(cands, chosen)
    short = shortfalls(demands, inventory, cands, options, caps)
    # NOTE: the bound is the floorless problem's, a floor only adds constraints: still a lower bound
    lb, lb_s = timed_bound(demands, inventory, cands, options, bound and not short, clock, lower)
    return Plan(gpus, tuple(demands), inventory, label, lb, clock() - t0, profiles, proven, shortfall=short,
                bound_seconds=lb_s, floors=floors)
