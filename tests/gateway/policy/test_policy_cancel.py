"""The core's cancel: a request its client gave up on leaves the queue and is never sent."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.policy.scheduler import EdfScheduler
from tests.policy_builders import make_requests, replica


def core_with(n: int, slo: float = 0.5) -> tuple[EdfScheduler, list]:
    core = EdfScheduler()
    core.add_replica(replica("r0", max_batch=4), 0.0)
    reqs = make_requests(n, slo=slo)
    for r in reqs:
        assert core.submit(r, 0.0) is None
    return core, reqs


def sent(core: EdfScheduler, now: float = 0.0) -> list[int]:
    return [r.id for b in core.poll(now).batches for r in b.requests]


def test_a_cancelled_queued_request_is_never_sent_and_no_longer_pending() -> None:
    core, reqs = core_with(3)
    assert core.cancel(reqs[1].id, 0.0) is True
    assert core.pending == 2 and core.queued() == 2
    # NOTE: a cancelled request is in no batch, and the others keep their EDF order
    assert sent(core) == [reqs[0].id, reqs[2].id]


def test_cancel_of_a_request_in_flight_or_unknown_changes_nothing() -> None:
    core, reqs = core_with(2)
    batch = core.poll(0.0).batches[0]
    assert core.cancel(reqs[0].id, 0.0) is False  # in flight: its batch runs
    assert core.cancel(999, 0.0) is False
    assert core.pending == 2
    core.on_complete(batch, 0.05)
    assert core.pending == 0
    assert core.cancel(reqs[0].id, 0.1) is False  # already answered


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 19), max_size=20), st.integers(1, 20))
def test_cancels_never_lose_or_duplicate_the_rest(cancel: list[int], n: int) -> None:
    core, reqs = core_with(n, slo=10.0)
    gone = {i for i in cancel if i < n and core.cancel(reqs[i].id, 0.0)}
    seen: list[int] = []
    now = 0.0
    while core.pending:
        d = core.poll(now)
        for b in d.batches:
            seen += [r.id for r in b.requests]
            core.on_complete(b, now + 0.1)
        seen += [rj.request.id for rj in d.rejects]
        now += 0.1
    # NOTE: every request not cancelled is answered exactly once, no cancelled one ever
    assert sorted(seen) == sorted(reqs[i].id for i in range(n) if i not in gone)
