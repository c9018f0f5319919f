"""The clairvoyant bound is exact on small cases and no online policy beats it."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from bench.policy_bound import clairvoyant_ok, served_latency
from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.types import ReplicaInfo
from loadgen.arrivals import Poisson, times
from loadgen.sim.simulator import SimReplica, Simulator, make_requests
from tests.policy_builders import fake_profile


def brute_force(arrivals: list[float], lat: list[float], slo: float, max_batch: int, idle: bool) -> int:
    """Every single-replica schedule: each request dropped or given a batch label, batches run
    in label order, each as soon as the replica is free and its members are there; a member
    counts if it finishes within its own deadline. No ordering or dropping rule assumed."""
    n, best = len(arrivals), 0
    for labels in itertools.product(range(-1, n), repeat=n):
        batches = [[k for k in range(n) if labels[k] == b] for b in range(n)]
        if any(len(m) > max_batch for m in batches):
            continue
        free, ok, valid = 0.0, 0, True
        for members in filter(None, batches):
            ready = max(arrivals[k] for k in members)
            if not idle and ready > max(free, min(arrivals[k] for k in members)):
                valid = False  # waits for a member not yet there
                break
            finish = max(free, ready) + lat[len(members)]
            ok += sum(1 for k in members if finish <= arrivals[k] + slo)
            free = finish
        if valid:
            best = max(best, ok)
    return best


@pytest.mark.parametrize("idle", [True, False])
def test_matches_every_schedule_on_small_cases(idle: bool) -> None:
    rng = random.Random(7)
    for _ in range(12):
        n = rng.randint(1, 5)
        arrivals = sorted(round(rng.uniform(0, 0.04), 3) for _ in range(n))
        max_batch = rng.randint(1, 3)
        lat = [0.0] + [0.006 + 0.004 * b for b in range(1, max_batch + 1)]
        slo = rng.choice([0.012, 0.02, 0.03])
        assert clairvoyant_ok(arrivals, lat, slo, max_batch, idle=idle) == \
            brute_force(arrivals, lat, slo, max_batch, idle), (arrivals, max_batch, slo)


def test_waiting_can_pay_and_never_hurts() -> None:
    # a batch of 2 that starts when the second request arrives serves both; without waiting
    # the first goes alone and the second misses behind it
    lat = [0.0, 0.010, 0.011]
    assert clairvoyant_ok([0.0, 0.001], lat, 0.0125, 2, idle=True) == 2
    assert clairvoyant_ok([0.0, 0.001], lat, 0.0125, 2, idle=False) == 1


def test_rejects_unsorted_arrivals() -> None:
    with pytest.raises(ValueError, match="sorted"):
        clairvoyant_ok([0.2, 0.1], [0.0, 0.01], 0.1, 1)


@pytest.mark.parametrize(("policy", "rate", "seed"), [("adaptive", 420.0, 1), ("skip-heads", 380.0, 2),
                                                      ("take-all", 400.0, 3)])
def test_no_online_policy_beats_it(policy: str, rate: float, seed: int) -> None:
    """Near and past capacity the bound is above what the online core finishes in time, by
    the same latency model (the core predicts with p99, the replica runs at p50)."""
    prof = fake_profile()
    info = ReplicaInfo("r0", "m", prof.variant, prof, 32)
    arrivals = times(Poisson(rate), 3.0, np.random.default_rng(seed))
    res = Simulator(EdfScheduler(SchedulerConfig(policy=policy)), [SimReplica(info)], service="p50").run(
        make_requests(arrivals, "m", 0.1))
    online = res.summary()["ok"]
    bound = clairvoyant_ok(list(arrivals), served_latency(prof, 32), 0.1, 32)
    assert online <= bound
    assert online < len(arrivals)  # the case is loaded enough to lose requests
