"""The core learns each replica's serving overhead from completions (injected time only)."""

from __future__ import annotations

import pytest

from gateway.policy import scheduler as sched_mod
from gateway.policy.config import SchedulerConfig
from tests.policy_builders import fake_profile, make_requests, replica


def _cycle(core, now: float, late_by: float, first_id: int) -> tuple[float, float]:
    """Submit one request, dispatch it, complete it ``late_by`` after its prediction."""
    (req,) = make_requests(1, slo=1.0, start=now, first_id=first_id)
    assert core.submit(req, now) is None
    (batch,) = core.poll(now).batches
    planned = batch.predicted_finish - batch.dispatched
    done = batch.predicted_finish + late_by
    core.on_complete(batch, done)
    return planned, done


@pytest.mark.parametrize("true_overhead", [0.003, 0.008])
def test_plans_converge_to_the_observed_overhead(true_overhead):
    core = sched_mod.EdfScheduler(SchedulerConfig())
    prof = fake_profile()
    core.add_replica(replica(profile=prof), 0.0)
    now, planned = 0.0, 0.0
    for i in range(400):
        # every batch really takes its profile time plus true_overhead
        (req,) = make_requests(1, slo=1.0, start=now, first_id=i)
        core.submit(req, now)
        (batch,) = core.poll(now).batches
        planned = batch.predicted_finish - batch.dispatched
        now = batch.dispatched + prof.latency(1) + true_overhead
        core.on_complete(batch, now)
    # NOTE: the plan ends within one quantile step of profile + overhead (p90 of a constant)
    assert planned == pytest.approx(prof.latency(1) + true_overhead, abs=5e-4)


def test_exact_completions_keep_plans_at_the_profile():
    core = sched_mod.EdfScheduler(SchedulerConfig())
    prof = fake_profile()
    core.add_replica(replica(profile=prof), 0.0)
    now = 0.0
    for i in range(50):
        planned, now = _cycle(core, now, late_by=0.0, first_id=i)
        assert planned == pytest.approx(prof.latency(1), abs=1e-12)


def test_learning_can_be_switched_off():
    core = sched_mod.EdfScheduler(SchedulerConfig(learn_overhead=False))
    prof = fake_profile()
    core.add_replica(replica(profile=prof), 0.0)
    now = 0.0
    for i in range(50):
        planned, now = _cycle(core, now, late_by=0.01, first_id=i)
    assert planned == pytest.approx(prof.latency(1), abs=1e-12)


def test_admission_uses_the_learned_overhead():
    """A request whose SLO fits the profile alone but not profile + learned overhead is
    rejected at arrival once the overhead is known."""
    core = sched_mod.EdfScheduler(SchedulerConfig())
    prof = fake_profile()
    core.add_replica(replica(profile=prof), 0.0)
    now = 0.0
    for i in range(400):
        _, now = _cycle(core, now, late_by=0.02, first_id=i)
    (tight,) = make_requests(1, slo=prof.latency(1) + 0.005, start=now, first_id=10_000)
    assert core.submit(tight, now) is not None
