"""The virtual-time simulator drives the real scheduler core; results are exact per seed."""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
import pytest

from deploy.cli import main as headrace
from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.types import Batch, Decision, ReplicaInfo, Request
from loadgen.arrivals import Poisson, times
from loadgen.sim.simulator import (
    Fault,
    RequestRecord,
    SimReplica,
    Simulator,
    make_requests,
    summarize,
)
from loadgen.stats import OK, Recorder, refusal
from tests.policy_builders import fake_profile


def one_replica(rid: str = "r0", **kw) -> SimReplica:
    p = fake_profile()
    return SimReplica(ReplicaInfo(rid, "m", p.variant, p, 32), **kw)


def poisson_requests(rate: float, duration: float, seed: int = 0, slo: float = 0.1) -> list[Request]:
    return make_requests(times(Poisson(rate), duration, np.random.default_rng(seed)), "m", slo)


def run(policy: str, reqs: list[Request], reps=None, **kw) -> dict:
    core = EdfScheduler(SchedulerConfig(policy=policy, **kw))
    return Simulator(core, reps or [one_replica()], service="p99").run(reqs).summary()


def test_same_seed_same_records() -> None:
    reqs = poisson_requests(300, 5)
    a = Simulator(EdfScheduler(), [one_replica()]).run(reqs)
    b = Simulator(EdfScheduler(), [one_replica()]).run(reqs)
    assert a.records == b.records and len(a.records) == len(reqs)


def test_light_load_is_all_on_time_without_rejections() -> None:
    s = run("adaptive", poisson_requests(50, 10))
    assert s["rejected"] == 0 and s["late"] == 0 and s["attainment"] == 1.0


def test_skipping_heads_beats_take_all_and_prefix_near_capacity() -> None:
    # NOTE: the DESIGN's finding: largest-prefix < take-all < skip-heads at 330 req/s
    reqs = poisson_requests(330, 20)
    att = {p: run(p, reqs, wait=False)["attainment"] for p in ("take-all", "largest-prefix", "skip-heads")}
    assert att["largest-prefix"] < att["take-all"] < att["skip-heads"]


def test_overload_keeps_goodput_near_capacity_where_take_all_collapses() -> None:
    reqs = poisson_requests(1000, 5)
    mine, triton = run("adaptive", reqs), run("take-all", reqs)
    capacity = 32 / fake_profile().latency(32)
    assert mine["goodput_rps"] > 0.9 * capacity and triton["goodput_rps"] < 0.1 * capacity
    assert mine["late"] == 0 and mine["reject_p99_ms"] < 100


def test_timeslicing_replicas_on_one_slice_slow_each_other_down() -> None:
    p = fake_profile()
    solo = p.latency(1, "p99")
    reqs = [Request(0, "m", 0.0, 10.0), Request(1, "m", 0.0, 10.0)]
    reps = [SimReplica(ReplicaInfo(f"r{i}", "m", "m", p, 1), slice_id="gpu0/s0") for i in range(2)]
    res = Simulator(EdfScheduler(SchedulerConfig(wait=False)), reps, service="p99").run(reqs)
    # both batches run at once, each at half speed: both finish at twice the solo time
    assert [r.end for r in res.records] == pytest.approx([2 * solo, 2 * solo])
    apart = [SimReplica(ReplicaInfo(f"r{i}", "m", "m", p, 1)) for i in range(2)]
    res2 = Simulator(EdfScheduler(SchedulerConfig(wait=False)), apart, service="p99").run(reqs)
    assert [r.end for r in res2.records] == pytest.approx([solo, solo])


def test_replica_fault_retries_elsewhere_and_answers_everything() -> None:
    reqs = poisson_requests(150, 4)
    sim = Simulator(EdfScheduler(), [one_replica("a"), one_replica("b")], service="p99",
                    faults=[Fault("a", 1.0, 1.0), Fault("b", 2.5, 0.5)])
    res = sim.run(reqs)
    s = res.summary()
    assert res.unanswered == 0 and s["offered"] == len(reqs)
    assert s["attainment"] >= 0.98 and s["late"] == 0


def test_unknown_fault_replica_is_named() -> None:
    with pytest.raises(ValueError, match="unknown replica 'zz'; known: r0"):
        Simulator(EdfScheduler(), [one_replica()], faults=[Fault("zz", 1.0, 1.0)])


def test_simulator_never_answers_twice() -> None:
    class Twice(EdfScheduler):
        def poll(self, now: float) -> Decision:
            d = super().poll(now)
            if d.batches:  # also reject a request it just dispatched
                b: Batch = d.batches[0]
                from gateway.policy.types import Reject
                return Decision(d.batches, d.rejects + (Reject(b.requests[0], "expired", 0.0),), d.wakeup)
            return d

    with pytest.raises(RuntimeError, match="answered twice"):
        Simulator(Twice(), [one_replica()]).run(poisson_requests(100, 1))


def to_recorder(records: Iterable[RequestRecord], window_s: float = 1.0) -> Recorder:
    """The same :class:`loadgen.stats.Recorder` a live load test fills, from simulated records
    (latency from the arrival, as live runs measure from the scheduled send time)."""
    rec = Recorder(window_s)
    for r in records:
        # a reject reason means a 429 (expired and failed ones as the client tells them apart)
        outcome = refusal(r.reason) if r.reason else {"ok": OK, "late": OK}.get(r.outcome, r.outcome)
        rec.record(r.model, r.variant or None, r.arrival, r.end - r.arrival, r.deadline - r.arrival, outcome)
    return rec


def test_records_feed_the_load_test_recorder() -> None:
    res = Simulator(EdfScheduler(), [one_replica()], service="p99").run(poisson_requests(400, 5))
    mine = summarize(res.records, 5.0)
    s = to_recorder(res.records).summary(5.0, 0.1)
    assert s["offered"] == mine["offered"] and s["good"] == mine["ok"]
    # refusals at arrival and after queueing ("expired") are told apart, as live runs do
    queued = sum(1 for r in res.records if r.reason in ("expired", "failed"))
    assert s["rejected"] + s["expired"] == mine["rejected"] > 0
    assert s["expired"] == queued > 0


def test_cli_runs_and_reports_bad_input(tmp_path, capsys) -> None:
    out = tmp_path / "s.json"
    assert headrace(["sim", "--rate", "200", "--duration", "3", "--json", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["offered"] > 0 and s["sim"]["unanswered"] == 0
    prot = tmp_path / "p.json"
    assert headrace(["sim", "--rate", "400", "--duration", "3", "--admission", "protect", "--json", str(prot)]) == 0
    assert json.loads(prot.read_text())["sim"]["reject_p99_ms"] < 1.0  # every reject at arrival
    assert headrace(["sim", "--policy", "nope", "--duration", "1"]) == 2
    assert "known: adaptive" in capsys.readouterr().err
    assert headrace(["sim", "--profile", "resnet50@A100-80GB/9g.1gb", "--duration", "1"]) == 2
    assert "no profile for resnet50@A100-80GB/9g.1gb" in capsys.readouterr().err


def test_transit_costs_a_serial_replica_and_pipelining_hides_it() -> None:
    """The live round trip, modelled as ``transit`` each way: with one batch in flight every
    batch pays it twice; with two in flight the next batch waits at the replica instead."""
    reqs = poisson_requests(330, 20, seed=3)

    def attain(inflight: int, transit: float) -> float:
        p = fake_profile()
        rep = SimReplica(ReplicaInfo("r0", "m", p.variant, p, 32, inflight))
        res = Simulator(EdfScheduler(SchedulerConfig()), [rep], transit=transit).run(reqs)
        assert res.unanswered == 0
        return res.summary()["attainment"]

    base, slow, piped = attain(1, 0.0), attain(1, 0.002), attain(2, 0.002)
    assert slow < base - 0.01  # 4 ms a batch of dead time near capacity costs attainment
    assert piped > slow + 0.005  # the pipelined replica gets most of it back


def test_admitted_attainment_counts_requests_refused_from_the_queue_as_admitted_misses() -> None:
    def rec(i: int, outcome: str, reason: str = "") -> RequestRecord:
        return RequestRecord(i, "m", "v", 0, 0.0, 0.1, 0.05, outcome, reason)  # type: ignore[arg-type]

    records = [rec(0, "ok"), rec(1, "ok"), rec(2, "rejected", "expired"), rec(3, "rejected", "infeasible")]
    s = summarize(records, 1.0)
    assert s["answered_attainment"] == 1.0  # both answers that carried a result were on time
    assert s["admitted_attainment"] == pytest.approx(2 / 3)  # the expired one was admitted, then refused
    assert s["attainment"] == 0.5
