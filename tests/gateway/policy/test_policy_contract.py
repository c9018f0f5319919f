"""The core's side of the request contract: requests that Triton must see differently never
share a batch (batch keys), a request restricted to some variants goes only there, and
sequence requests stick to one replica, run one at a time in order, and always alone."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.policy.scheduler import EdfScheduler
from gateway.policy.types import Batch, Request
from tests.policy_builders import make_requests, replica


def batches(core: EdfScheduler, now: float = 0.0) -> list[Batch]:
    return list(core.poll(now).batches)


def run_all(core: EdfScheduler, step: float = 0.1) -> list[Batch]:
    """Poll and complete every batch until nothing is pending; the batches, in order."""
    sent, now = [], 0.0
    while core.pending:
        d = core.poll(now)
        assert not d.rejects
        for b in d.batches:
            sent.append(b)
            now += step
            core.on_complete(b, now)
    return sent


def test_requests_with_different_batch_keys_never_share_a_batch() -> None:
    core = EdfScheduler()
    core.add_replica(replica("r0", max_batch=8), 0.0)
    keys = [None, ("a",), None, ("a",), ("b",), None]
    reqs = [replace(r, key=k) for r, k in zip(make_requests(6, slo=1.0), keys, strict=True)]
    for r in reqs:
        assert core.submit(r, 0.0) is None
    got = run_all(core)
    assert [[r.id for r in b.requests] for b in got] == [[0, 2, 5], [1, 3], [4]]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from([None, "x", "y"]), min_size=1, max_size=30))
def test_batch_keys_never_mix_and_nothing_is_lost(keys: list[str | None]) -> None:
    core = EdfScheduler()
    core.add_replica(replica("r0", max_batch=4, max_inflight=1), 0.0)
    reqs = [replace(r, key=k) for r, k in zip(make_requests(len(keys), slo=100.0), keys, strict=True)]
    for r in reqs:
        assert core.submit(r, 0.0) is None
    seen = []
    for b in run_all(core):
        assert len({r.key for r in b.requests}) == 1
        seen += [r.id for r in b.requests]
    assert sorted(seen) == [r.id for r in reqs]


def test_a_request_restricted_to_replicas_goes_only_there() -> None:
    core = EdfScheduler()
    for rid in ("r0", "r1", "r2"):
        core.add_replica(replica(rid, max_batch=8), 0.0)
    free = make_requests(3, slo=1.0)
    pinned = [replace(r, key=("v2",), replicas=frozenset({"r2"})) for r in make_requests(3, slo=1.0, first_id=10)]
    for r in [*free, *pinned]:
        assert core.submit(r, 0.0) is None
    for b in run_all(core):
        if any(r.replicas for r in b.requests):
            assert b.replica == "r2" and all(r.replicas for r in b.requests)
    gone = replace(make_requests(1, slo=1.0, first_id=99)[0], replicas=frozenset({"elsewhere"}))
    rj = core.submit(gone, 0.0)
    assert rj is not None and rj.reason == "no_replica" and "elsewhere" in rj.message


def seq(rid: int, sid: object, start: bool = False, end: bool = False, slo: float = 10.0) -> Request:
    return Request(rid, "m", 0.0, slo, sequence=sid, sequence_start=start, sequence_end=end)


def test_a_sequence_sticks_to_its_replica_runs_alone_and_in_order() -> None:
    core = EdfScheduler()
    for i in range(3):
        core.add_replica(replica(f"r{i}", max_batch=8, max_inflight=2), 0.0)
    for r in (seq(1, 7, start=True), seq(2, 7), seq(3, 7, end=True)):
        assert core.submit(r, 0.0) is None
    sent: list[Batch] = []
    now = 0.0
    while core.pending:
        got = batches(core, now)
        assert len(got) <= 1  # the next of the sequence only once the one before is answered
        for b in got:
            assert len(b.requests) == 1
            sent.append(b)
            now += 0.05
            core.on_complete(b, now)
    assert [b.requests[0].id for b in sent] == [1, 2, 3]
    assert len({b.replica for b in sent}) == 1


def test_sequences_spread_over_replicas_and_never_share_batches_with_others() -> None:
    core = EdfScheduler()
    core.add_replica(replica("r0", max_batch=8, max_inflight=4), 0.0)
    core.add_replica(replica("r1", max_batch=8, max_inflight=4), 0.0)
    plain = make_requests(4, slo=10.0, first_id=100)
    for r in [seq(1, "a", start=True), seq(2, "b", start=True), *plain]:
        assert core.submit(r, 0.0) is None
    got = batches(core)
    by_seq = {b.requests[0].sequence: b.replica for b in got if b.requests[0].sequence is not None}
    assert set(by_seq) == {"a", "b"} and by_seq["a"] != by_seq["b"]
    for b in got:
        kinds = {r.sequence for r in b.requests}
        assert kinds == {None} or len(b.requests) == 1
    # a later request of "a" goes where "a" lives, even if the other replica is idle
    for b in got:
        core.on_complete(b, 0.1)
    assert core.submit(seq(3, "a"), 0.1) is None
    (b,) = [b for b in batches(core, 0.1) if b.requests[0].sequence == "a"]
    assert b.replica == by_seq["a"] and [r.id for r in b.requests] == [3]


def test_a_sequence_whose_replica_is_down_is_refused_and_a_restart_rebinds() -> None:
    core = EdfScheduler()
    core.add_replica(replica("r0"), 0.0)
    core.add_replica(replica("r1"), 0.0)
    assert core.submit(seq(1, "s", start=True), 0.0) is None
    (b,) = batches(core)
    core.on_complete(b, 0.05)
    core.set_healthy(b.replica, False, 0.05)
    rj = core.submit(seq(2, "s"), 0.05)
    assert rj is not None and rj.reason == "no_replica" and "start the sequence again" in rj.message
    assert core.submit(seq(3, "s", start=True), 0.05) is None
    (b2,) = batches(core, 0.05)
    assert b2.replica != b.replica


def test_cancel_and_removal_answer_waiting_sequence_requests() -> None:
    core = EdfScheduler()
    core.add_replica(replica("r0", max_inflight=1), 0.0)
    for r in (seq(1, "s", start=True), seq(2, "s"), seq(3, "s")):
        assert core.submit(r, 0.0) is None
    (b,) = batches(core)
    assert core.cancel(2, 0.0) is True
    assert core.queued() == 1
    core.drain_replica("r0", 0.0)
    back = core.remove_replica("r0", 0.0)
    assert sorted(r.id for r in back) == [1, 3]  # in flight, and still waiting
    assert core.pending == 0


def test_a_failed_sequence_request_is_answered_failed_not_moved() -> None:
    core = EdfScheduler()
    core.add_replica(replica("r0"), 0.0)
    core.add_replica(replica("r1"), 0.0)
    assert core.submit(seq(1, "s", start=True), 0.0) is None
    (b,) = batches(core)
    core.set_healthy(b.replica, False, 0.01)
    core.on_complete(b, 0.01, retry=b.requests)
    d = core.poll(0.01)
    assert not d.batches
    assert [(rj.request.id, rj.reason) for rj in d.rejects] == [(1, "failed")]
    assert core.pending == 0
