"""The core's live replica API with an injected clock: a drained replica takes no new batch and
counts as no capacity, removing a variant's last replica moves its queue to another variant,
an added replica takes batches at once, and no interleaving loses or duplicates a request."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.migrate import destination
from gateway.policy.selector import Level, VariantInfo
from gateway.policy.types import Batch, Priority, Request
from tests.policy_builders import fake_profile, make_requests, replica

BIG = fake_profile(a_ms=20, c_ms=4, max_batch=16, variant="big", accuracy=0.80)  # t(1) = 24 ms
SMALL = fake_profile(a_ms=4, c_ms=1, max_batch=16, variant="small", accuracy=0.70)  # t(1) = 5 ms
TINY = fake_profile(a_ms=2, c_ms=0.5, max_batch=16, variant="tiny")  # accuracy unknown


def sched(**kw) -> EdfScheduler:
    return EdfScheduler(SchedulerConfig(policy="adaptive", wait=False, **kw))


class Books:
    """What a driver learns from the core: each request's answers, counted."""

    def __init__(self, core: EdfScheduler) -> None:
        self.core = core
        self.submitted: set[int] = set()
        self.answers: Counter[int] = Counter()
        self.handed_back: set[int] = set()
        self.dispatched: list[Batch] = []

    def submit(self, r: Request, now: float) -> bool:
        self.submitted.add(r.id)
        rej = self.core.submit(r, now)
        if rej is not None:
            self.answers[r.id] += 1
        return rej is None

    def poll(self, now: float) -> list[Batch]:
        d = self.core.poll(now)
        for rj in d.rejects:
            self.answers[rj.request.id] += 1
        self.dispatched += d.batches
        return list(d.batches)

    def complete(self, b: Batch, now: float, retry: tuple[Request, ...] = ()) -> None:
        self.core.on_complete(b, now, retry)
        again = {r.id for r in retry}
        for r in b.requests:
            if r.id not in again and r.id not in self.handed_back:  # the driver owns those
                self.answers[r.id] += 1

    def remove(self, rid: str, now: float) -> tuple[Request, ...]:
        back = self.core.remove_replica(rid, now)
        for r in back:
            self.answers[r.id] += 1
            self.handed_back.add(r.id)
        return back

    def check(self) -> None:
        """Every request answered at most once; those unanswered are still held by the core,
        each either queued or in flight on a replica (none is held nowhere)."""
        assert not [i for i, n in self.answers.items() if n > 1], "answered twice"
        held = self.core.pending
        inflight = {r.id for st_ in self.core.replicas() for b in st_.inflight for r in b.requests}
        assert held == self.core.queued() + len(inflight)
        assert len(self.submitted) == len(self.answers) + held


def test_drained_replica_takes_no_new_batch_while_its_batch_in_flight_completes() -> None:
    s = sched()
    books = Books(s)
    s.add_replica(replica("a"), 0.0)
    s.add_replica(replica("b"), 0.0)
    first, second, third = make_requests(3, slo=1.0)
    books.submit(first, 0.0)
    (b1,) = books.poll(0.0)
    s.drain_replica(b1.replica, 0.001)
    other = "b" if b1.replica == "a" else "a"
    books.submit(second, 0.002)
    (b2,) = books.poll(0.002)
    assert b2.replica == other
    books.submit(third, 0.003)
    # NOTE: the drained replica has room, the other is busy: the request waits for the other
    assert books.poll(0.003) == []
    books.complete(b1, 0.011)  # the drained replica's batch completes as usual
    assert books.poll(0.011) == []
    state = {x.info.id: x for x in s.replicas()}
    assert state[b1.replica].draining and state[b1.replica].inflight == ()
    books.complete(b2, 0.013)
    (b3,) = books.poll(0.013)
    assert b3.replica == other and b3.requests == (third,)
    books.complete(b3, 0.025)
    books.check()
    assert books.answers.keys() == books.submitted and s.pending == 0
    with pytest.raises(KeyError, match="'nope'"):
        s.drain_replica("nope", 0.03)


@pytest.mark.parametrize("drain", [False, True])
def test_admission_no_longer_counts_a_drained_replica(drain: bool) -> None:
    # max batch 1, t(1) = 10.7 ms: two requests with a 15 ms SLO fit only on two replicas
    s = sched()
    for rid in ("a", "b"):
        s.add_replica(replica(rid, fake_profile(max_batch=1), max_batch=1), 0.0)
    if drain:
        s.drain_replica("b", 0.0)
    r1, r2 = make_requests(2, slo=0.015)
    assert s.submit(r1, 0.0) is None
    rej = s.submit(r2, 0.0)
    assert (rej is not None and rej.reason == "infeasible") == drain


def test_draining_the_only_replica_answers_its_queue_at_the_next_poll() -> None:
    s = sched()
    books = Books(s)
    s.add_replica(replica("a", fake_profile(max_batch=1), max_batch=1), 0.0)
    for r in make_requests(3, slo=1.0):
        books.submit(r, 0.0)
    (b,) = books.poll(0.0)
    s.drain_replica("a", 0.001)
    d = s.poll(0.001)
    assert sorted((rj.request.id, rj.reason) for rj in d.rejects) == [(1, "no_replica"), (2, "no_replica")]
    assert d.batches == ()
    for rj in d.rejects:
        books.answers[rj.request.id] += 1
    books.complete(b, 0.011)
    books.check()
    assert s.pending == 0 and s.remove_replica("a", 0.012) == ()


def two_variants() -> tuple[EdfScheduler, Books]:
    s = sched()  # a burst at t=0 stays on big (the level moves only past both variants' capacity)
    s.add_replica(replica("big0", BIG, max_batch=2), 0.0)
    s.add_replica(replica("small0", SMALL, max_batch=2), 0.0)
    return s, Books(s)


def deadlines_shuffled(n: int, first_id: int = 0) -> list[Request]:
    order = [3, 0, 5, 1, 4, 2, 7, 6][:n]
    return [Request(first_id + i, "m", 0.0, 0.5 + 0.01 * k) for i, k in enumerate(order)]


@pytest.mark.parametrize("drain_first", [False, True])
def test_removing_a_variants_last_replica_moves_its_queue_to_another_variant(drain_first: bool) -> None:
    s, books = two_variants()
    reqs = deadlines_shuffled(8)
    for r in reqs:
        assert books.submit(r, 0.0)  # all to big: the most accurate variant in time
    (on_big,) = books.poll(0.0)
    assert on_big.replica == "big0" and s.queued() == 6
    if drain_first:
        s.drain_replica("big0", 0.001)
        books.complete(on_big, 0.028)  # drain -> idle -> remove: nothing is handed back
        assert books.remove("big0", 0.028) == ()
    else:  # removed with its batch in flight: that batch is the driver's, the queue moves on
        assert {r.id for r in books.remove("big0", 0.001)} == {r.id for r in on_big.requests}
        books.complete(on_big, 0.028)  # a late completion of handed-back requests changes nothing
    now = 0.028
    while s.queued():
        (b,) = books.poll(now)
        assert b.variant == "small"
        now = b.predicted_finish
        books.complete(b, now)
    moved = [r for b in books.dispatched[1:] for r in b.requests]
    # NOTE: the moved requests go out in EDF order, and none is answered twice or lost
    assert [r.deadline for r in moved] == sorted(r.deadline for r in moved)
    assert {r.id for r in moved} == {r.id for r in reqs} - {r.id for r in on_big.requests}
    books.check()
    assert books.answers.keys() == books.submitted and s.pending == 0


def test_a_request_no_other_variant_may_serve_is_handed_back() -> None:
    s, books = two_variants()
    floor = Request(1, "m", 0.0, 1.0, accuracy_floor=0.75)  # only big meets the floor
    plain = Request(2, "m", 0.0, 1.0)
    s.add_replica(replica("big1", BIG, max_batch=2), 0.0)
    s.set_healthy("big1", False, 0.0)  # an unhealthy replica keeps the variant (it may come back)
    s.set_healthy("big0", False, 0.0)
    assert books.submit(Request(0, "m", 0.0, 1.0, accuracy_floor=0.75), 0.0) is False  # no_replica
    s.set_healthy("big0", True, 0.0)
    assert books.submit(floor, 0.0) and books.submit(plain, 0.0)
    s.remove_replica("big1", 0.0)
    assert books.remove("big0", 0.001) == (floor,)
    assert s.queued() == 1  # plain moved to small
    (b,) = books.poll(0.001)
    assert b.requests == (plain,) and b.variant == "small"
    books.complete(b, 0.01)
    books.check()
    assert s.pending == 0


def test_removing_the_only_variant_hands_its_queue_back() -> None:
    s = sched()
    books = Books(s)
    s.add_replica(replica("a", fake_profile(max_batch=1), max_batch=1), 0.0)
    for r in make_requests(3, slo=1.0):
        books.submit(r, 0.0)
    (b,) = books.poll(0.0)
    assert sorted(r.id for r in books.remove("a", 0.001)) == [0, 1, 2]
    books.complete(b, 0.011)
    books.check()
    assert s.pending == 0 and s.queued() == 0


def test_a_moved_request_no_plan_finishes_in_time_expires_through_the_normal_path() -> None:
    s = sched()
    books = Books(s)
    s.add_replica(replica("acc0", fake_profile(a_ms=8, c_ms=2, variant="acc", accuracy=0.8)), 0.0)  # 10 ms
    s.add_replica(replica("slow0", fake_profile(a_ms=45, c_ms=5, variant="slow", accuracy=0.7)), 0.0)  # 50 ms
    r = Request(0, "m", 0.0, 0.03)
    assert books.submit(r, 0.0)  # queued for acc: 10 ms <= 30 ms
    assert books.remove("acc0", 0.0) == ()  # moved to slow, though slow cannot make it
    d = s.poll(0.0)
    assert [(rj.request, rj.reason) for rj in d.rejects] == [(r, "expired")]
    books.answers[r.id] += 1
    books.check()
    assert s.pending == 0


def test_destination_is_the_first_in_time_else_the_earliest() -> None:
    vs = [VariantInfo("big", 0.8, 100), VariantInfo("small", 0.7, 300), VariantInfo("tiny", 0.6, 900)]
    r = Request(0, "m", 0.0, 0.05)
    plans = {"big": 0.09, "small": 0.04, "tiny": 0.01}
    assert destination(r, vs, Level(), lambda v: True, plans.get) == "small"  # first in time, not the fastest
    late = {"big": 0.2, "small": 0.09, "tiny": 0.1}
    assert destination(r, vs, Level(), lambda v: True, late.get) == "small"  # none in time: the earliest
    assert destination(r, vs, Level(), lambda v: v != "small", late.get) == "tiny"  # rows must fit
    floor = Request(1, "m", 0.0, 0.05, accuracy_floor=0.75)
    assert destination(floor, vs, Level(), lambda v: v != "big", plans.get) is None
    assert destination(r, vs, Level(1), lambda v: True, None) == "small"  # deadline-blind: the level's first


def test_with_the_other_variant_unhealthy_the_queue_moves_there_and_is_answered() -> None:
    s, books = two_variants()
    reqs = [Request(i, "m", 0.0, 0.2) for i in range(6)]
    for r in reqs:
        assert books.submit(r, 0.0)
    (first,) = books.poll(0.0)
    s.set_healthy("small0", False, 0.0)  # it may come back: the variant still takes the queue
    assert books.remove("big0", 0.0) == tuple(first.requests)
    d = s.poll(0.001)
    assert sorted(rj.request.id for rj in d.rejects) == sorted(r.id for r in reqs[2:])
    assert {rj.reason for rj in d.rejects} == {"no_replica"}
    for rj in d.rejects:
        books.answers[rj.request.id] += 1
    books.complete(first, 0.03)
    books.check()
    assert s.pending == 0 and books.answers.keys() == books.submitted


def test_a_replica_added_live_takes_a_batch_at_the_next_poll() -> None:
    s = sched()
    books = Books(s)
    s.add_replica(replica("a", fake_profile(max_batch=1), max_batch=1), 0.0)
    for r in make_requests(2, slo=1.0):
        books.submit(r, 0.0)
    (b1,) = books.poll(0.0)
    assert books.poll(0.001) == []  # a is busy
    s.add_replica(replica("b", fake_profile(max_batch=1), max_batch=1), 0.002)
    (b2,) = books.poll(0.002)
    assert b2.replica == "b"
    # NOTE: a new, more accurate variant is chosen by the very next submit
    s.add_replica(replica("big0", BIG, max_batch=2), 0.003)
    books.submit(Request(7, "m", 0.003, 1.0), 0.003)
    (b3,) = books.poll(0.003)
    assert (b3.replica, b3.variant) == ("big0", "big")
    for b in (b1, b2, b3):
        books.complete(b, b.predicted_finish)
    books.check()
    assert s.pending == 0


def test_a_failed_batch_on_a_drained_variant_retries_on_another() -> None:
    s, books = two_variants()
    r = Request(0, "m", 0.0, 0.5)
    books.submit(r, 0.0)
    (b,) = books.poll(0.0)
    assert b.variant == "big"
    s.drain_replica("big0", 0.001)
    books.complete(b, 0.01, retry=b.requests)
    (again,) = books.poll(0.01)
    assert (again.variant, again.requests) == ("small", (r,))
    books.complete(again, 0.02)
    books.check()
    assert books.answers == {0: 1}


# --------------------------------------------------------------------------- property

PROFILES = {"big": BIG, "small": SMALL, "tiny": TINY}

submit = st.tuples(st.just("submit"), st.floats(0.004, 0.3), st.integers(1, 3), st.sampled_from([None, 0.75]),
                  st.booleans())
poll = st.tuples(st.just("poll"))
complete = st.tuples(st.just("complete"), st.integers(0, 50), st.booleans())
op = st.one_of(
    submit, submit, submit, poll, poll, complete, complete,
    st.tuples(st.just("advance"), st.floats(0.0, 0.05)),
    st.tuples(st.just("drain"), st.integers(0, 50)),
    st.tuples(st.just("remove"), st.integers(0, 50)),
    st.tuples(st.just("add"), st.sampled_from(sorted(PROFILES)), st.integers(1, 2)),
    st.tuples(st.just("health"), st.integers(0, 50), st.booleans()),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=10, max_size=150), st.sampled_from(["plan", "protect", "alone"]), st.booleans())
def test_no_interleaving_of_fleet_changes_loses_or_duplicates_a_request(ops, admission, aware) -> None:
    s = EdfScheduler(SchedulerConfig(policy="adaptive" if aware else "take-all", wait=False, admission=admission,
                                     queue_timeout_s=None if aware else 0.1))
    books = Books(s)
    inflight: list[Batch] = []
    now, ids, names = 0.0, 0, 0

    def add(variant: str, inflight_max: int) -> None:
        nonlocal names
        s.add_replica(replica(f"{variant}{names}", PROFILES[variant], max_batch=4, max_inflight=inflight_max), now)
        names += 1

    def pick(i: int) -> str | None:
        reps = [x.info.id for x in s.replicas()]
        return reps[i % len(reps)] if reps else None

    add("big", 1)
    for o in ops:
        kind = o[0]
        if kind == "submit":
            prio = Priority.BEST_EFFORT if o[4] else Priority.GUARANTEED
            books.submit(Request(ids, "m", now, now + o[1], prio, o[2], o[3]), now)
            ids += 1
        elif kind == "poll":
            draining = {x.info.id for x in s.replicas() if x.draining}
            got = books.poll(now)
            assert not [b for b in got if b.replica in draining], "a batch went to a draining replica"
            inflight += got
        elif kind == "complete" and inflight:
            b = inflight.pop(o[1] % len(inflight))
            books.complete(b, now, b.requests if o[2] else ())
        elif kind == "advance":
            now += o[1]
        elif kind == "drain" and (rid := pick(o[1])):
            s.drain_replica(rid, now)
        elif kind == "remove" and (rid := pick(o[1])):
            books.remove(rid, now)
        elif kind == "add":
            add(o[1], o[2])
        elif kind == "health" and (rid := pick(o[1])):
            s.set_healthy(rid, o[2], now)
        books.check()
    # wind down: complete everything, let time pass, then remove the whole fleet
    for _ in range(200):
        if not inflight and not s.queued():
            break
        for b in inflight:
            books.complete(b, now)
        now += 0.05
        inflight = books.poll(now)
        books.check()
    for x in s.replicas():
        books.remove(x.info.id, now)
    for b in inflight:
        books.complete(b, now)
    books.check()
    # NOTE: every submitted request was answered exactly once, and the core holds nothing
    assert s.pending == 0 and books.answers.keys() == books.submitted
    assert set(books.answers.values()) <= {1}
