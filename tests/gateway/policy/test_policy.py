"""The EDF scheduler core, driven by hand with an injected clock."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.batching import POLICIES, get_policy
from gateway.policy.types import Priority, Request
from tests.policy_builders import fake_profile, make_requests, replica


def sched(policy: str = "adaptive", **kw) -> EdfScheduler:
    return EdfScheduler(SchedulerConfig(policy=policy, **kw))


def test_registry_rejects_unknown_policy_listing_known_ones() -> None:
    with pytest.raises(KeyError, match="known: adaptive, aimd, largest-prefix, skip-heads, take-all"):
        get_policy("nope")
    with pytest.raises(ValidationError, match="unknown policy 'nope'"):
        SchedulerConfig(policy="nope")
    assert set(POLICIES) >= {"take-all", "largest-prefix", "skip-heads", "adaptive"}


def test_config_errors_name_field_and_value() -> None:
    with pytest.raises(ValidationError) as e:
        SchedulerConfig(headroom=-1)
    assert "headroom" in str(e.value) and "-1" in str(e.value)
    with pytest.raises(ValidationError, match=r"burst_window_s \(0.05\) must not exceed rate_window_s \(0.01\)"):
        SchedulerConfig(admission="burst", rate_window_s=0.01)
    assert SchedulerConfig(admission="plan", rate_window_s=0.01).rate_window_s == 0.01


def test_replica_max_batch_beyond_profile_is_refused_with_values() -> None:
    s = sched()
    with pytest.raises(ValueError, match=r"max_batch \(64\) exceeds profile max \(32\)"):
        s.add_replica(replica(profile=fake_profile(max_batch=32), max_batch=64), 0.0)


def test_no_replica_is_rejected_at_once() -> None:
    s = sched()
    rej = s.submit(make_requests(1)[0], 0.0)
    assert rej is not None and rej.reason == "no_replica" and rej.retry_after > 0


def test_duplicate_pending_id_is_a_driver_bug() -> None:
    s = sched()
    s.add_replica(replica(), 0.0)
    r = make_requests(1)[0]
    assert s.submit(r, 0.0) is None
    with pytest.raises(ValueError, match="already pending"):
        s.submit(r, 0.0)


def test_request_that_cannot_finish_alone_is_rejected_at_submit() -> None:
    s = sched()
    s.add_replica(replica(), 0.0)  # t(1) = 10.7 ms
    rej = s.submit(make_requests(1, slo=0.005)[0], 0.0)
    assert rej is not None and rej.reason == "infeasible" and rej.retry_after >= 0.01


def test_admission_counts_work_queued_ahead() -> None:
    # NOTE: 64 rows ahead on one max-batch-32 replica take two 83.5 ms batches (167 ms);
    # admission "plan" (64 arrivals at once are a burst, where the default also protects)
    s = sched(wait=False, admission="plan")
    s.add_replica(replica(), 0.0)
    for r in make_requests(64, slo=0.17):
        assert s.submit(r, 0.0) is None
    rej = s.submit(Request(999, "m", 0.0, 0.175), 0.0)  # behind 64 rows: 167 + 10.7 ms
    assert rej is not None and rej.reason == "infeasible"
    assert rej.retry_after == pytest.approx(max(0.01, 2 * 0.0835146 + 0.010746 - 0.175))
    # an earlier deadline goes ahead of the queue under EDF, so it is admitted
    assert s.submit(Request(998, "m", 0.0, 0.05), 0.0) is None


def test_alone_admission_leaves_queue_choices_to_the_batcher() -> None:
    s = sched(wait=False, admission="alone")
    s.add_replica(replica(), 0.0)
    for r in make_requests(64, slo=0.17):
        s.submit(r, 0.0)
    assert s.submit(Request(999, "m", 0.0, 0.175), 0.0) is None  # the plan would reject it
    assert s.submit(Request(998, "m", 0.0, 0.005), 0.0).reason == "infeasible"  # alone: 10.7 ms


def test_protect_admission_refuses_a_request_that_would_push_an_admitted_one_late() -> None:
    # NOTE: one 32-row batch ending by 85.1 ms; a 33rd row starts a second batch
    s = sched(admission="protect")
    s.add_replica(replica(), 0.0)
    for r in make_requests(20, slo=0.061):  # 20 rows take 55.3 ms
        assert s.submit(r, 0.0) is None
    # with deadline 0.1 it would join the batch (21 rows, 57.7 ms) and push nobody late
    assert s.submit(Request(500, "m", 0.0, 0.1), 0.0) is None
    # 4 more rows: 22 rows take 60.0 ms and fit the admitted requests' 61 ms; 23 take 62.4 ms
    rejects = [s.submit(Request(600 + i, "m", 0.0, 0.1), 0.0) for i in range(4)]
    assert [r is None for r in rejects] == [True, False, False, False]
    assert all(r.reason == "infeasible" for r in rejects if r is not None)
    plain = sched(admission="plan")
    plain.add_replica(replica(), 0.0)
    for r in make_requests(20, slo=0.061) + [Request(600 + i, "m", 0.0, 0.1) for i in range(4)]:
        assert plain.submit(r, 0.0) is None  # "plan" only asks whether the newcomer itself fits


def test_burst_admission_protects_only_while_arrivals_outrun_capacity() -> None:
    # NOTE: the fake profile's capacity is 32 rows / 83.5 ms = 383/s; the same 24 arrivals
    # in one 50 ms window (480/s) are steady load at burst_factor 1.5 and a burst at 1.0
    def arrive(s) -> list:
        s.add_replica(replica(), 0.0)
        for r in make_requests(20, slo=0.061):  # 20 rows take 55.3 ms
            assert s.submit(r, 0.0) is None
        return [s.submit(Request(600 + i, "m", 0.0, 0.1), 0.0) for i in range(4)]

    assert arrive(sched(admission="burst")) == [None] * 4  # "plan" decides
    during = arrive(sched(admission="burst", burst_factor=1.0))
    # "protect" decides: 22 rows fit the admitted requests' 61 ms, 23 do not
    assert [r is None for r in during] == [True, True, False, False]
    assert all(r.reason == "infeasible" for r in during[2:])


def test_batch_never_exceeds_max_and_meets_predicted_deadlines() -> None:
    s = sched(wait=False)
    s.add_replica(replica(max_batch=8, profile=fake_profile(max_batch=8)), 0.0)
    for r in make_requests(20, slo=1.0):
        s.submit(r, 0.0)
    d = s.poll(0.0)
    assert len(d.batches) == 1
    b = d.batches[0]
    assert b.rows == 8 and all(r.deadline >= b.predicted_finish for r in b.requests)


def test_skip_heads_answers_hopeless_heads_at_once_and_keeps_the_batch_large() -> None:
    # 3 urgent heads (deadline 20 ms) and 20 relaxed requests; a 23-row batch takes 62 ms
    heads = make_requests(3, slo=0.02)
    rest = make_requests(20, slo=0.1, first_id=100)
    for policy in ("skip-heads", "adaptive"):
        s = sched(policy, wait=False)
        s.add_replica(replica(), 0.0)
        for r in heads + rest:
            assert s.submit(r, 0.0) is None
        d = s.poll(0.0)
        (b,) = d.batches
        # NOTE: the batch is the EDF run after the skipped heads; skipped heads could not make it
        assert [r.id for r in b.requests] == [r.id for r in rest]
        assert {rj.request.id for rj in d.rejects} == {0, 1, 2}
        assert {rj.reason for rj in d.rejects} == {"expired"}


def test_largest_prefix_serves_the_head_with_a_small_batch() -> None:
    s = sched("largest-prefix", wait=False)
    s.add_replica(replica(), 0.0)
    for r in make_requests(3, slo=0.02) + make_requests(20, slo=0.1, first_id=100):
        s.submit(r, 0.0)
    (b,) = s.poll(0.0).batches
    assert b.rows == 4  # t(4) = 17.8 ms <= 20 ms < t(5)


def test_take_all_ignores_deadlines_and_queue_timeout_rejects() -> None:
    s = sched("take-all", queue_timeout_s=0.05)
    s.add_replica(replica(max_batch=4, profile=fake_profile(max_batch=4)), 0.0)
    reqs = make_requests(6, slo=0.001)
    for r in reqs:
        assert s.submit(r, 0.0) is None  # no admission in Triton's batcher
    (b,) = s.poll(0.0).batches
    assert b.rows == 4
    d = s.poll(0.06)
    assert {rj.request.id for rj in d.rejects} == {4, 5}
    assert {rj.reason for rj in d.rejects} == {"expired"}


def test_take_all_waits_max_queue_delay_for_a_full_batch() -> None:
    s = sched("take-all", max_queue_delay_s=0.005)
    s.add_replica(replica(), 0.0)
    s.submit(make_requests(1, start=1.0)[0], 1.0)
    d = s.poll(1.0)
    assert d.batches == () and d.wakeup == pytest.approx(1.005)
    assert len(s.poll(1.005).batches) == 1


def test_waits_for_a_larger_batch_only_when_rate_and_slack_allow() -> None:
    s = sched("adaptive", wait=True)
    s.add_replica(replica(), 0.0)
    # 300 req/s observed for a second: one replica needs batches of about 11 rows
    for r in make_requests(300, slo=0.1, gap=1 / 300):
        s.submit(r, r.arrival)
        d = s.poll(r.arrival)
        for b in d.batches:
            s.on_complete(b, b.predicted_finish)
    s.poll(1.0)
    head = Request(5000, "m", 1.0, 1.1)
    assert s.submit(head, 1.0) is None
    d = s.poll(1.0)
    assert d.batches == () and d.wakeup is not None and 1.0 < d.wakeup < 1.1
    # no slack: the same lone request is dispatched at once
    s2 = sched("adaptive", wait=True)
    s2.add_replica(replica(), 0.0)
    for r in make_requests(300, slo=0.1, gap=1 / 300):
        s2.submit(r, r.arrival)
        for b in s2.poll(r.arrival).batches:
            s2.on_complete(b, b.predicted_finish)
    s2.poll(1.0)
    s2.submit(Request(5000, "m", 1.0, 1.02), 1.0)
    assert len(s2.poll(1.0).batches) == 1


def test_best_effort_only_fills_what_guaranteed_leaves_and_is_shed_first() -> None:
    s = sched(wait=False)
    s.add_replica(replica(max_batch=8, profile=fake_profile(max_batch=8)), 0.0)
    be = make_requests(4, slo=1.0, first_id=100, priority=Priority.BEST_EFFORT)
    g = make_requests(6, slo=1.0)
    for r in be + g:
        assert s.submit(r, 0.0) is None
    (b,) = s.poll(0.0).batches
    assert [r.id for r in b.requests] == [0, 1, 2, 3, 4, 5, 100, 101]
    # a best-effort request behind a long guaranteed queue is shed, a guaranteed one is not
    s2 = sched(wait=False)
    s2.add_replica(replica(), 0.0)
    for r in make_requests(40, slo=0.5):
        s2.submit(r, 0.0)
    rej = s2.submit(Request(900, "m", 0.0, 0.1, Priority.BEST_EFFORT), 0.0)
    assert rej is not None and rej.reason == "shed"
    assert s2.submit(Request(901, "m", 0.0, 0.1), 0.0) is None


def test_failed_batch_is_retried_elsewhere_or_answered_failed() -> None:
    s = sched(wait=False)
    s.add_replica(replica("a"), 0.0)
    s.add_replica(replica("b"), 0.0)
    for r in make_requests(2, slo=0.1):
        s.submit(r, 0.0)
    d = s.poll(0.0)
    first = d.batches[0]
    s.set_healthy(first.replica, False, 0.001)
    s.on_complete(first, 0.001, retry=first.requests)
    d2 = s.poll(0.001)
    assert [b.replica for b in d2.batches] == [r for r in ("a", "b") if r != first.replica] or d2.batches == ()
    # late retry: nothing can finish it any more
    s3 = sched(wait=False)
    s3.add_replica(replica("a"), 0.0)
    (r,) = make_requests(1, slo=0.02)
    s3.submit(r, 0.0)
    (b,) = s3.poll(0.0).batches
    s3.on_complete(b, 0.015, retry=b.requests)
    d3 = s3.poll(0.015)
    assert [(x.request.id, x.reason) for x in d3.rejects] == [(r.id, "failed")]
    assert s3.pending == 0


def test_remove_replica_hands_back_inflight_and_orphaned_queue() -> None:
    s = sched(wait=False)
    s.add_replica(replica("a", max_batch=2, profile=fake_profile(max_batch=2)), 0.0)
    for r in make_requests(5, slo=1.0):
        s.submit(r, 0.0)
    (b,) = s.poll(0.0).batches
    back = s.remove_replica("a", 0.001)
    assert sorted(r.id for r in back) == [0, 1, 2, 3, 4]
    assert s.pending == 0 and s.queued() == 0
    s.on_complete(b, 0.01)  # a late completion for handed-back requests changes nothing
    assert s.pending == 0


def test_pipelined_replica_gets_its_next_batch_just_before_the_running_one_ends() -> None:
    """max_inflight=2: the next batch is formed ``pipeline_lead_s`` before the batch in flight
    is predicted to finish (so it catches the arrivals until then), and it is planned to start
    when that batch finishes."""
    core = sched(learn_overhead=False, pipeline_lead_s=0.002)
    core.add_replica(replica(max_inflight=2), 0.0)
    first = make_requests(1, start=0.0)
    assert core.submit(first[0], 0.0) is None
    d = core.poll(0.0)
    assert len(d.batches) == 1
    busy_until = d.batches[0].predicted_finish
    later = make_requests(3, start=0.001, gap=0.001, first_id=10)
    for r in later:
        assert core.submit(r, r.arrival) is None
    d = core.poll(0.004)
    assert d.batches == () and d.wakeup == pytest.approx(busy_until - 0.002)
    d = core.poll(d.wakeup)
    assert [len(b.requests) for b in d.batches] == [3]
    assert d.batches[0].predicted_finish == pytest.approx(busy_until + fake_profile().latency(3, "p99"))
    # a third batch waits for a slot, whatever the lead
    core.submit(make_requests(1, start=0.02, first_id=20)[0], 0.02)
    assert core.poll(busy_until - 0.001).batches == ()
