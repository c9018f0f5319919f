"""The MILP is deterministic: work budgets, not the clock, end its search, so a slow host (a
slowed clock) gets the same plan; the time limit is a safety stop that holds on an overfull
pool and names itself in the plan's method."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

import pytest

from bench.fleet import generate
from placement.plan import GpuClass, Inventory, Plan
from placement.solve.greedy import greedy_choice
from placement.solve.milp import milp_choice
from placement.solve.solver import DEFAULT, candidates, solve
from profiles.derive import with_derived


def fleet(models: int, gpus: int):
    demands, ps, inv = generate(models, gpus, seed=5).problem()
    return demands, with_derived(ps, gpus=tuple(sorted({c.gpu for c in inv.classes}))), inv


def guaranteed_only(demands, ps, inv: Inventory) -> Inventory:
    """``inv`` cut down to the GPUs the greedy gives the guaranteed models alone: too small for
    the best-effort ones."""
    plan = solve([d for d in demands if d.guaranteed], ps, inv, "greedy", bound=False)
    by_id, keep = inv.by_id(), {}
    for g in plan.used():
        keep[by_id[g.id].key] = keep.get(by_id[g.id].key, 0) + 1
    return replace(inv, classes=tuple(GpuClass(c.gpu, c.ids[:keep[c.key]], c.cost_per_hour, c.mig, c.mps)
                                      for c in inv.classes if keep.get(c.key)))


@pytest.fixture(scope="module")
def small():
    return fleet(40, 30)


@pytest.fixture(scope="module")
def overfull():
    demands, ps, inv = fleet(200, 100)
    return demands, ps, guaranteed_only(demands, ps, inv)


def slowed(factor: float):
    """A clock on a host ``factor`` times slower: every phase seems to take longer."""
    t0 = time.perf_counter()
    return lambda: t0 + factor * (time.perf_counter() - t0)


def placement(plan: Plan) -> dict:
    """What a plan decides (its timings left out)."""
    d = plan.to_dict()
    for k in ("solve_seconds", "bound_seconds"):
        d["status"].pop(k)
    return d


@pytest.mark.parametrize("case", ["small", "overfull"])
def test_a_slow_host_gets_the_same_plan(case, request):
    demands, ps, inv = request.getfixturevalue(case)
    plan = solve(demands, ps, inv, "milp")
    # NOTE: a clock 20x slow would leave a time-shared search a twentieth of its time; the
    # budget is work, so nothing changes while the safety stop is not reached
    slow = solve(demands, ps, inv, "milp", time_limit=1e6, clock=slowed(20.0))
    assert plan.method == slow.method == "milp"
    assert placement(slow) == placement(plan)
    plan.verify()
    assert plan.partial == (case == "overfull")


def test_the_overfull_pool_stops_within_its_limit(overfull):
    demands, ps, inv = overfull
    limit = 1.0  # the whole search takes about twice this on a 2-core host
    t0 = time.perf_counter()
    plan = solve(demands, ps, inv, "milp", time_limit=limit)
    wall = time.perf_counter() - t0
    # NOTE: HiGHS checks its limit between rounds, and the plan is packed after the stop
    assert wall <= limit + 1.5, wall
    plan.verify()
    assert plan.partial
    # a host fast enough to finish the search first has a plan no stop cut short
    assert plan.method == "milp[time-limit]" or wall <= limit + 0.5, (plan.method, wall)


def test_past_the_stop_no_search_runs_and_the_greedy_plan_stands(overfull):
    demands, ps, inv = overfull
    cands = candidates(demands, ps, inv)
    g = greedy_choice(demands, inv, cands, DEFAULT)
    ticks = itertools.count()
    best_effort = [mi for mi, d in enumerate(demands) if not d.guaranteed]
    m = milp_choice(demands, inv, cands, DEFAULT, 0.5, lambda: float(next(ticks)), g.start, best_effort,
                    g.unplaced)
    assert m.stopped and m.chosen == g.start.chosen


@pytest.mark.parametrize("limit", ["0", "-5", "nan", "inf", "soon"])
def test_a_time_limit_that_is_no_positive_number_of_seconds_is_refused(limit, capsys):
    from deploy.cli import main

    with pytest.raises(SystemExit) as e:
        main(["plan", "-f", "placement/examples/pool.yaml", "-f", "placement/examples/models.yaml", "--method",
              "milp", "--time-limit", limit])
    assert e.value.code == 2
    assert "argument --time-limit: " in capsys.readouterr().err


def test_a_plan_the_stop_cut_short_says_so_in_its_table(capsys):
    from deploy.cli import main

    # NOTE: a microsecond runs out before the search starts: the greedy's plan stands
    assert main(["plan", "-f", "placement/examples/pool.yaml", "-f", "placement/examples/models.yaml", "--method",
                 "milp", "--time-limit", "1e-6", "--output", "table"]) == 0
    assert "plan (milp[time-limit], objective gpus)" in capsys.readouterr().out
