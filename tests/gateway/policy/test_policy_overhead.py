"""The core learns each replica's serving overhead from completions (injected time only)."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.policy import scheduler as sched_mod
from gateway.policy.config import SchedulerConfig
from loadgen.sim.simulator import SimReplica, Simulator
from loadgen.sim.simulator import make_requests as sim_requests
from tests.policy_builders import fake_profile, make_requests, replica


def _cycle(core, now: float, first_id: int, late_by: float = 0.0,
           takes: float | None = None) -> tuple[float, float]:
    """Submit one request and dispatch it; it completes ``late_by`` after its prediction, or
    ``takes`` seconds after dispatch when given. Returns (planned duration, completion time)."""
    (req,) = make_requests(1, slo=1.0, start=now, first_id=first_id)
    assert core.submit(req, now) is None
    (batch,) = core.poll(now).batches
    planned = batch.predicted_finish - batch.dispatched
    done = batch.dispatched + takes if takes is not None else batch.predicted_finish + late_by
    core.on_complete(batch, done)
    return planned, done


def _core(**kw) -> tuple[sched_mod.EdfScheduler, object]:
    core = sched_mod.EdfScheduler(SchedulerConfig(**kw))
    prof = fake_profile()
    core.add_replica(replica(profile=prof), 0.0)
    return core, prof


@pytest.mark.parametrize("true_overhead", [0.003, 0.008])
def test_plans_converge_to_the_observed_overhead(true_overhead):
    core, prof = _core()
    now, planned = 0.0, 0.0
    for i in range(400):  # every batch really takes its profile time plus true_overhead
        planned, now = _cycle(core, now, i, takes=prof.latency(1) + true_overhead)
    # NOTE: the plan ends within one quantile step of profile + overhead (p90 of a constant)
    assert planned == pytest.approx(prof.latency(1) + true_overhead, abs=5e-4)


def test_exact_completions_keep_plans_at_the_profile():
    core, prof = _core()
    now = 0.0
    for i in range(50):
        planned, now = _cycle(core, now, i)
        assert planned == pytest.approx(prof.latency(1), abs=1e-12)


def test_learning_can_be_switched_off():
    core, prof = _core(learn_overhead=False)
    now = 0.0
    for i in range(50):
        planned, now = _cycle(core, now, i, late_by=0.01)
    assert planned == pytest.approx(prof.latency(1), abs=1e-12)


def test_admission_uses_the_learned_overhead():
    """A request whose SLO fits the profile alone but not profile + learned overhead is
    rejected at arrival once the overhead is known."""
    core, prof = _core()
    now = 0.0
    for i in range(400):
        _, now = _cycle(core, now, i, late_by=0.02)
    (tight,) = make_requests(1, slo=prof.latency(1) + 0.005, start=now, first_id=10_000)
    assert core.submit(tight, now) is not None


@pytest.mark.parametrize("excess, transit", [(0.0, 0.005), (0.003, 0.001)])
def test_pipelined_replica_learns_its_run_time_apart_from_the_answer_delay(excess, transit):
    """Back-to-back batches that each run ``excess`` beyond the profile on the replica, with
    ``transit`` each way: the run-time term converges to ``excess``; the delay term stays one
    delivery, not one per batch of the run."""
    core = sched_mod.EdfScheduler(SchedulerConfig())
    arrivals = np.arange(0.0, 20.0, 1 / 500)  # above capacity: the replica never idles
    Simulator(core, [SimReplica(replica(profile=fake_profile(), max_inflight=2))], service="p99",
              overhead=excess, transit=transit).run(sim_requests(arrivals, "m", 1.0))
    (state,) = core.replicas()
    assert state.run_excess == pytest.approx(excess, abs=5e-4)
    assert state.overhead <= 2 * transit + 1e-3


def test_batches_in_flight_are_replanned_from_each_completion():
    """A batch comes back 10 ms late: the one waiting behind it on the replica now ends 10 ms
    later too, so the next batch is formed for then (not for the stale plan)."""
    core = sched_mod.EdfScheduler(SchedulerConfig(learn_overhead=False))
    prof = fake_profile()
    core.add_replica(replica(profile=prof, max_inflight=2), 0.0)
    lead, t1 = core.config.pipeline_lead_s, prof.latency(1)
    a, b, c = make_requests(3, slo=1.0, start=0.0)
    core.submit(a, 0.0)
    (first,) = core.poll(0.0).batches
    core.submit(b, 0.001)
    assert core.poll(0.001).wakeup == pytest.approx(t1 - lead)  # B forms just before A ends
    (second,) = core.poll(t1 - lead).batches
    core.on_complete(first, t1 + 0.010)
    core.submit(c, t1 + 0.010)
    # C waits behind B, which now runs from A's actual return
    assert core.poll(t1 + 0.010).wakeup == pytest.approx(t1 + 0.010 + t1 - lead)
