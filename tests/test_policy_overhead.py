"""The core learns each replica's serving overhead from completions (injected time only)."""

from __future__ import annotations

import pytest

from gateway.policy import scheduler as sched_mod
from gateway.policy.config import SchedulerConfig
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
