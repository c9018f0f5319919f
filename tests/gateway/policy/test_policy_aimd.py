"""Clipper's AIMD batcher (the ``aimd`` baseline, NSDI'17 §4.3): per replica, the batch cap grows
by one after each batch whose *measured* latency is within its SLO and backs off by 10% after one
that is not, whatever the profile predicts; it bounds the whole batch, in queue order."""

from __future__ import annotations

from collections.abc import Callable

from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.types import Priority
from tests.policy_builders import fake_profile, make_requests, replica


def _sizes(s: EdfScheduler, rid: str, n: int, measured: Callable[[int], float], t0: float = 0.0) -> list[int]:
    """The rows of ``n`` batches in a row on replica ``rid``, each answered ``measured(rows)``
    seconds after it was sent, before the next is formed."""
    out, now = [], t0
    for _ in range(n):
        (b,) = [b for b in s.poll(now).batches if b.replica == rid]
        out.append(b.rows)
        now += measured(b.rows)
        s.on_complete(b, now)
    return out


def aimd(*reps, n: int = 2000, slo: float = 0.05) -> EdfScheduler:
    s = EdfScheduler(SchedulerConfig(policy="aimd"))
    for r in reps:
        s.add_replica(r, 0.0)
    for r in make_requests(n, slo=slo):
        assert s.submit(r, 0.0) is None  # no admission: Clipper's batcher queues everything
    return s


def test_a_measured_batch_over_the_slo_backs_off_though_the_profile_predicts_it_in_time() -> None:
    # the profile says 32 rows take 17 ms, well within 50 ms; the replica measures 3 ms a row + 6 ms
    s = aimd(replica("r0", profile=fake_profile(a_ms=1.0, c_ms=0.5)))
    sizes = _sizes(s, "r0", 21, lambda rows: 0.006 + 0.003 * rows)
    assert sizes[:15] == list(range(1, 16))  # 14 rows measure 48 ms: within the SLO, one more
    # 15 rows measure 51 ms > 50 ms: the cap backs off to int(15 * 0.9) = 13, then climbs again
    assert sizes[15:] == [13, 14, 15, 13, 14, 15]


def test_the_cap_grows_while_measured_batches_meet_the_slo_though_the_profile_predicts_misses() -> None:
    # the profile predicts 60 ms and more for any batch; the replica answers every one in 20 ms
    s = aimd(replica("r0", profile=fake_profile(a_ms=60.0, c_ms=1.0)))
    assert _sizes(s, "r0", 40, lambda rows: 0.02) == [*range(1, 33), *[32] * 8]  # never past max batch


def test_a_batch_sent_ahead_is_timed_from_the_answers_of_the_batch_before_it() -> None:
    # NOTE: a batch sent to a busy replica waits there; Clipper times only its processing
    s = aimd(replica("r0", max_inflight=2))
    (b1,) = s.poll(0.0).batches
    d = s.poll(0.0)
    assert d.batches == () and d.wakeup is not None  # the next goes out just before b1 is done
    (b2,) = s.poll(d.wakeup).batches
    s.on_complete(b1, 0.030)  # 30 ms: the cap grows to 2
    s.on_complete(b2, 0.060)  # 30 ms after b1's answers (52 ms after it was sent): grows to 3
    assert [b.rows for b in s.poll(0.060).batches] == [3]


def test_the_cap_bounds_the_whole_batch_best_effort_rows_included() -> None:
    s = EdfScheduler(SchedulerConfig(policy="aimd"))
    s.add_replica(replica("r0"), 0.0)
    for r in make_requests(2, slo=0.05) + make_requests(10, slo=0.05, first_id=100, priority=Priority.BEST_EFFORT):
        s.submit(r, 0.0)
    # cap 1, then 2: the second batch is the last guaranteed request and one best-effort one
    assert _sizes(s, "r0", 3, lambda rows: 0.01) == [1, 2, 3]


def test_aimd_keeps_one_cap_per_replica() -> None:
    s = aimd(replica("r0"), n=200)
    assert _sizes(s, "r0", 5, lambda rows: 0.001) == [1, 2, 3, 4, 5]
    s.add_replica(replica("r1"), 0.01)
    rows: dict[str, list[int]] = {"r0": [], "r1": []}
    for k in range(3):
        now = 0.01 + k * 0.001
        batches = s.poll(now).batches
        for b in batches:
            rows[b.replica].append(b.rows)
            s.on_complete(b, now + 0.0005)
    # the new replica starts at one, whatever r0 has learned
    assert rows == {"r0": [6, 7, 8], "r1": [1, 2, 3]}


def test_a_failed_batch_moves_no_cap() -> None:
    s = aimd(replica("r0"), n=20)
    assert _sizes(s, "r0", 2, lambda rows: 0.01) == [1, 2]
    (b,) = s.poll(0.02).batches
    s.on_complete(b, 0.5, retry=b.requests)  # failed after 480 ms: says nothing of its latency
    assert [b.rows for b in s.poll(0.5).batches] == [3]
