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
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from placement.plan import Demand, GpuPlan, Inventory, Plan, Replica, SlicePlan
from placement.solve.bound import _program, lower_bound
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
from placement.solve.shortfall import capacities, shortfalls
from profiles.catalogue import WHOLE, Instance
from profiles.profile import ProfileSet

__all__ = ["DEFAULT", "METHODS", "Candidate", "LayoutOption", "MilpTimeout", "Options", "SolverError",
           "candidates", "layout_options", "lower_bound", "pack", "solve", "timed_bound"]

METHODS = ("greedy", "milp")
_check_coverable = check_coverable  # the accuracy planner's name for it
__all__ += ["_check_coverable", "_program"]


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


# --------------------------------------------------------------------------- entry point


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
    check_coverable(demands, cands)
    from placement.solve.greedy import greedy_choice  # noqa: PLC0415  (greedy builds on this module)

    label = method if options == DEFAULT else f"{method}[mig={int(options.mig)},mps={int(options.mps)}]"
    if inventory.accuracy_aware:
        from placement.solve.accuracy import solve_accuracy  # noqa: PLC0415  (builds on this module)

        return solve_accuracy(demands, profiles, inventory, cands, method, label, options, time_limit, clock, t0, bound)
    from placement.solve.greedy import missing_text  # noqa: PLC0415

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
            chosen, lay, proven, lower = milp_choice(demands, inventory, cands, options, time_limit - (clock() - t0),
                                              clock, start, slack, g.unplaced)
            gpus = pack(demands, inventory, profiles, chosen, cands, lay)
        except SolverError:
            if start is None:
                if lacking:
                    raise SolverError(lacking) from None
                raise
            # no integer solution within the limit: the greedy's plan stands, and says so
            gpus, chosen = g.gpus, g.start.chosen
            label += "->greedy"
    short = shortfalls(demands, inventory, cands, options, capacities(cands, chosen))
    lb, lb_s = timed_bound(demands, inventory, cands, options, bound and not short, clock, lower)
    return Plan(gpus, tuple(demands), inventory, label, lb, clock() - t0, profiles, proven, shortfall=short,
                bound_seconds=lb_s)


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
