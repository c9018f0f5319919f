"""Queue timeouts of the batchers that are not deadline-aware (Triton's queue policy with
``timeout_action: REJECT``): ``queue_timeout_s`` is ``default_timeout_microseconds``;
``request_timeouts`` is ``allow_timeout_override``, each request's own timeout being its SLO."""

from __future__ import annotations

import pytest

from gateway.policy import EdfScheduler, SchedulerConfig
from tests.policy_builders import fake_profile, make_requests, replica


def busy(policy: str, **kw) -> tuple[EdfScheduler, list[int]]:
    """Requests 0-5 (SLO 20 ms) and 100-103 (SLO 100 ms), all arrived at t=0, for one replica of
    max batch 4, busy from t=0 with the first batch (requests 0-3 for take-all, 0 for aimd's
    first cap); returns the scheduler and the ids of SLO 20 ms still queued."""
    s = EdfScheduler(SchedulerConfig(policy=policy, **kw))
    s.add_replica(replica(max_batch=4, profile=fake_profile(max_batch=4)), 0.0)
    for r in make_requests(6, slo=0.02) + make_requests(4, slo=0.1, first_id=100):
        assert s.submit(r, 0.0) is None  # no admission
    (b,) = s.poll(0.0).batches
    return s, [i for i in range(6) if i not in {r.id for r in b.requests}]


@pytest.mark.parametrize("policy", ["take-all", "aimd"])
def test_a_queued_request_is_rejected_at_its_own_deadline_and_not_before(policy: str) -> None:
    s, queued = busy(policy, request_timeouts=True)
    d = s.poll(0.01)
    assert d.rejects == () and d.wakeup == 0.02  # the next poll is the earliest deadline queued
    assert s.poll(0.0199).rejects == ()
    d = s.poll(0.02)
    assert [(rj.request.id, rj.reason) for rj in d.rejects] == [(i, "expired") for i in queued]
    assert d.wakeup == 0.1 and s.queued() == 4  # requests 100-103 wait for their own deadline
    assert [rj.request.id for rj in s.poll(0.1).rejects] == [100, 101, 102, 103]


def test_without_request_timeouts_a_request_waits_past_its_deadline() -> None:
    s, _ = busy("take-all")
    d = s.poll(0.05)
    assert d.rejects == () and d.wakeup is None and s.queued() == 6


def test_the_queue_timeout_and_a_requests_own_timeout_whichever_comes_first() -> None:
    # NOTE: Triton takes a request's timeout only where it is below the default
    s, _ = busy("take-all", request_timeouts=True, queue_timeout_s=0.05)
    assert [rj.request.id for rj in s.poll(0.02).rejects] == [4, 5]  # their SLO, 20 ms
    d = s.poll(0.03)
    assert d.rejects == () and d.wakeup == pytest.approx(0.05, abs=1e-5)  # the queue timeout, not 100 ms
    assert [rj.request.id for rj in s.poll(0.0501).rejects] == [100, 101, 102, 103]
