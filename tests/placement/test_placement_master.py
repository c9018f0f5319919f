"""The MILP's integer master (price and branch): each model takes one whole-replica cover the
lower bound's pricing went through, and its plan is a plan of the whole program."""

from __future__ import annotations

import time

import numpy as np
import pytest

from bench.fleet import generate
from placement.problem import load
from placement.solve.bound import bound_and_covers, program, rounded
from placement.solve.candidates import DEFAULT, candidates
from placement.solve.greedy import greedy_choice
from placement.solve.milp import EFFORT, SafetyStop, _Master, _vector
from placement.solve.solver import solve


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    paths = generate(models=40, gpus=30, seed=5).write(tmp_path_factory.mktemp("fleet"), "json")
    inv, demands, profiles = load([str(paths["pool"]), str(paths["models"])], [str(paths["profiles"])])
    return inv, demands, profiles


@pytest.mark.parametrize("restrict", [False, True])
def test_the_master_plan_meets_every_row_of_the_whole_program(fleet, restrict):
    inv, demands, _ = fleet
    cands = candidates(demands, fleet[2], inv, DEFAULT)
    start = greedy_choice(demands, inv, cands, DEFAULT).start
    p = program(demands, inv, cands, DEFAULT, tie_break=False, cuts=True)
    bound, covers = bound_and_covers(demands, inv, cands, p)
    x0 = _vector(p, start)
    master = _Master(p, inv, covers, cands, x0)
    assert len(master.columns) > len(demands)  # more than the start's own covers
    x = master.solve(master.cost(p.c), 1e-6, EFFORT.master_nodes, SafetyStop(time.perf_counter, 30.0), restrict=restrict)
    assert x is not None
    ax = p.a @ x
    assert np.all(ax >= p.lo - 1e-6) and np.all(ax <= p.hi + 1e-6)  # capacity, slices, pool, cuts
    assert np.all(x <= p.ub) and np.all(x == np.round(x))
    assert rounded(inv, bound) <= float(p.c @ x) <= float(p.c @ x0)


def test_milp_plans_within_the_greedy_and_above_the_bound(fleet):
    inv, demands, profiles = fleet
    greedy = solve(demands, profiles, inv, "greedy")
    milp = solve(demands, profiles, inv, "milp", time_limit=30.0)
    milp.verify()
    assert greedy.lower_bound == milp.lower_bound <= milp.gpu_count <= greedy.gpu_count
    assert milp.proven_bound <= milp.gpu_count
    # on this fleet the greedy is 3 GPUs over the bound and the master's plan meets it
    assert milp.gpu_count == milp.lower_bound < greedy.gpu_count
