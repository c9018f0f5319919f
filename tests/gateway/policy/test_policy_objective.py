"""Variant choice by constraints and objective, in the core: a request's accuracy floor, cost
cap and pin are never violated; it is refused only when no allowed variant passes admission;
under ``accuracy`` it joins the most accurate feasible variant, under ``cost`` the cheapest,
and best-effort the cheapest whatever the objective; a queued request its variant can no
longer finish in time moves to one that can before it is refused."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.replica import cost_per_answer
from gateway.policy.types import Priority, Request
from tests.policy_builders import fake_profile, replica

# (name, a_ms, c_ms, accuracy, price per hour): bigger is slower, more accurate and dearer
FAMILY = [("r152", 12.0, 3.0, 0.78, 4.0), ("r50", 6.0, 1.5, 0.76, 2.0), ("r18", 2.0, 0.5, 0.70, 1.0)]


def fleet(objective: str = "accuracy", names: tuple[str, ...] = ("r152", "r50", "r18"),
          **config) -> EdfScheduler:
    core = EdfScheduler(SchedulerConfig(wait=False, **config))
    for name, a, c, acc, price in FAMILY:
        if name in names:
            info = replica(f"{name}-0", fake_profile(a_ms=a, c_ms=c, max_batch=16, variant=name, accuracy=acc),
                           max_batch=16)
            core.add_replica(replace(info, price_per_hour=price, objective=objective), 0.0)
    return core


def costs(core: EdfScheduler) -> dict[str, float]:
    return {st.info.variant: cost_per_answer([core._replicas[st.info.id]])  # noqa: SLF001
            for st in core.replicas()}


def accuracy(name: str) -> float:
    return next(acc for n, _, _, acc, _ in FAMILY if n == name)


def chosen(core: EdfScheduler, now: float = 0.0) -> dict[int, str]:
    return {r.id: b.variant for b in core.poll(now).batches for r in b.requests}


def test_cost_is_derived_from_the_profile_and_the_price_of_the_hardware() -> None:
    c = costs(fleet())
    # r18: (2 + 0.5 * 16) ms for 16 rows at $1/h
    assert c["r18"] == (2.0 + 0.5 * 16) / 1e3 / 16 * 1.0 / 3600
    assert c["r18"] < c["r50"] < c["r152"]


def test_objectives_order_the_allowed_variants() -> None:
    core = fleet("accuracy")
    assert core.submit(Request(1, "m", 0.0, 1.0), 0.0) is None
    assert core.submit(Request(2, "m", 0.0, 1.0, priority=Priority.BEST_EFFORT), 0.0) is None
    assert chosen(core) == {1: "r152", 2: "r18"}  # best-effort: the cheapest, whatever the objective
    core = fleet("cost")
    assert core.submit(Request(1, "m", 0.0, 1.0), 0.0) is None
    assert core.submit(Request(2, "m", 0.0, 1.0, accuracy_floor=0.75), 0.0) is None
    assert chosen(core) == {1: "r18", 2: "r50"}  # the cheapest that meets the floor


def test_a_pin_and_a_cost_cap_are_honoured_or_refused_with_reason() -> None:
    core = fleet()
    c = costs(core)
    assert core.submit(Request(1, "m", 0.0, 1.0, variant="r50"), 0.0) is None
    assert core.submit(Request(2, "m", 0.0, 1.0, max_cost=c["r50"]), 0.0) is None
    assert chosen(core) == {1: "r50", 2: "r50"}
    rj = core.submit(Request(3, "m", 0.0, 1.0, max_cost=c["r18"], accuracy_floor=0.75), 0.0)
    assert rj is not None and rj.reason == "infeasible"
    assert "accuracy floor 0.75" in rj.message and "cost cap" in rj.message


request_constraints = st.fixed_dictionaries({
    "floor": st.sampled_from([None, 0.69, 0.72, 0.77, 0.8]),
    "cap_of": st.sampled_from([None, "r18", "r50", "r152"]),
    "pin": st.sampled_from([None, "r18", "r50", "r152", "nope"]),
    "slo": st.sampled_from([0.004, 0.01, 0.02, 0.05, 0.5]),
    "best_effort": st.booleans(),
})


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["accuracy", "cost"]), st.lists(request_constraints, min_size=1, max_size=40))
def test_constraints_hold_and_refusals_are_only_when_no_allowed_variant_passes_admission(objective, reqs) -> None:
    core = fleet(objective)
    c = costs(core)
    by_id: dict[int, Request] = {}
    for i, k in enumerate(reqs):
        r = Request(i, "m", 0.0, k["slo"], Priority.BEST_EFFORT if k["best_effort"] else Priority.GUARANTEED,
                    accuracy_floor=k["floor"], max_cost=None if k["cap_of"] is None else c[k["cap_of"]],
                    variant=k["pin"])
        allowed = [v for v, *_ in FAMILY if (r.accuracy_floor is None or accuracy(v) >= r.accuracy_floor)
                   and (r.max_cost is None or c[v] <= r.max_cost) and (r.variant is None or v == r.variant)]
        # the core's own admission test for each allowed variant, taken before the submit: its
        # predicted finish is in time, and (admission protect / burst) admitting it there pushes
        # no queued request late
        model = core._models["m"]  # noqa: SLF001
        feasible = [v for v in allowed
                    if core._plan(model.groups[v], core._healthy(model.groups[v]), r, 0.0) <= r.deadline  # noqa: SLF001
                    and core._protects(model, model.groups[v], core._healthy(model.groups[v]), r, 0.0)]  # noqa: SLF001
        rj = core.submit(r, 0.0)
        if rj is not None:
            assert not feasible, (r, rj)
        else:
            assert feasible, r
            by_id[i] = r
    now = 0.0
    while core.pending:
        d = core.poll(now)
        for b in d.batches:
            for r in b.requests:
                v = b.variant
                assert r.accuracy_floor is None or accuracy(v) >= r.accuracy_floor
                assert r.max_cost is None or c[v] <= r.max_cost
                assert r.variant is None or v == r.variant
            now = max(now, b.predicted_finish)
            core.on_complete(b, now)
        if not d.batches:
            now = d.wakeup if d.wakeup is not None else now + 0.01


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["accuracy", "cost"]), st.sampled_from([None, 0.72, 0.77]), st.booleans())
def test_on_an_idle_fleet_the_objectives_best_allowed_variant_serves(objective, floor, best_effort) -> None:
    core = fleet(objective)
    c = costs(core)
    r = Request(1, "m", 0.0, 1.0, Priority.BEST_EFFORT if best_effort else Priority.GUARANTEED, accuracy_floor=floor)
    assert core.submit(r, 0.0) is None
    allowed = [v for v, *_ in FAMILY if floor is None or accuracy(v) >= floor]
    best = (min(allowed, key=lambda v: c[v]) if objective == "cost" or best_effort
            else max(allowed, key=accuracy))
    assert chosen(core) == {1: best}


def test_a_queued_request_its_variant_cannot_finish_in_time_moves_before_it_is_refused() -> None:
    core = fleet("accuracy", names=("r152", "r18"))
    twin = replace(core._replicas["r152-0"].info, id="r152-1")  # noqa: SLF001
    core.add_replica(twin, 0.0)
    for rid in ("r152-0", "r152-1"):  # one request at a time: 15 ms each
        rep = core._replicas[rid]  # noqa: SLF001
        rep.info = replace(rep.info, max_batch=1)
    reqs = [Request(i, "m", 0.0, 0.035) for i in range(4)]
    for r in reqs:
        assert core.submit(r, 0.0) is None  # two lanes of r152: 15, 15, 30, 30 ms, all in time
    core.set_healthy("r152-1", False, 0.0)  # one lane left: the last two cannot make it there
    got: dict[int, str] = {}
    now = 0.0
    while core.pending:
        d = core.poll(now)
        assert not d.rejects, d.rejects
        for b in d.batches:
            got.update({r.id: b.variant for r in b.requests})
        if d.batches:
            now = min(b.predicted_finish for b in d.batches)
            for b in d.batches:
                core.on_complete(b, now)
        else:
            now = d.wakeup if d.wakeup is not None else now + 0.001
    assert sorted(got) == [0, 1, 2, 3] and list(got.values()).count("r18") >= 1
    assert core.variant_moves("m")[2] >= 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.2), st.sampled_from([0.01, 0.03, 0.08, 0.3])), min_size=1, max_size=60),
       st.lists(st.tuples(st.floats(0.0, 0.3), st.sampled_from(["r152-0", "r50-0", "r18-0"]), st.booleans()),
                max_size=6),
       st.sampled_from(["accuracy", "cost"]))
def test_moves_between_variants_never_lose_or_duplicate_a_request(arrivals, flips, objective) -> None:
    core = fleet(objective)
    events = sorted([(t, "arrive", i, slo) for i, (t, slo) in enumerate(arrivals)]
                    + [(t, "flip", rid, up) for t, rid, up in flips], key=lambda e: e[0])
    answered: dict[int, int] = {}
    inflight: list = []
    now = 0.0

    def drain(until: float) -> None:
        nonlocal now
        while True:
            d = core.poll(now)
            for rj in d.rejects:
                answered[rj.request.id] = answered.get(rj.request.id, 0) + 1
            inflight.extend(d.batches)
            done = [b for b in inflight if b.predicted_finish <= until]
            if not done and (d.wakeup is None or d.wakeup > until) and not d.batches:
                break
            if done:
                b = min(done, key=lambda x: x.predicted_finish)
                inflight.remove(b)
                now = max(now, b.predicted_finish)
                core.on_complete(b, now)
                for r in b.requests:
                    answered[r.id] = answered.get(r.id, 0) + 1
            elif d.wakeup is not None and d.wakeup <= until:
                now = max(now, d.wakeup)

    submitted = set()
    for t, kind, a, b in events:
        drain(t)
        now = max(now, t)
        if kind == "arrive":
            r = Request(a, "m", now, now + b)
            submitted.add(a)
            rj = core.submit(r, now)
            if rj is not None:
                answered[a] = answered.get(a, 0) + 1
        else:
            core.set_healthy(a, b, now)
    for rid in ("r152-0", "r50-0", "r18-0"):
        core.set_healthy(rid, True, now)
    drain(now + 100.0)
    assert core.pending == 0
    assert answered == dict.fromkeys(submitted, 1)
