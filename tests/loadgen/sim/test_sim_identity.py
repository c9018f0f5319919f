"""The simulator and the core make exactly the same decisions as before their speed-ups: fixed
seeded runs are compared, record by record, with digests taken from the slower code.

A change that alters any answer (its time, its outcome, its batch, its variant) changes a
digest; a deliberate policy change updates them here with the reason in its commit."""

from __future__ import annotations

import hashlib
import heapq

import numpy as np

from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.types import Priority, ReplicaInfo, Request
from loadgen.arrivals import Gamma, Poisson, times
from loadgen.sim.simulator import Fault, SimReplica, Simulator, make_requests
from tests.policy_builders import fake_profile


def digest(records) -> str:
    h = hashlib.sha256()
    for r in records:
        h.update(repr((r.id, r.model, r.variant, r.priority, r.arrival, r.deadline, r.end, r.outcome,
                       r.reason, r.batch_rows)).encode())
    return h.hexdigest()[:16]


# the cases taken before admission "burst" became the default name admission "plan"
PLAN = SchedulerConfig(admission="plan")


def single() -> list:
    """One replica near capacity, Poisson, the default batcher with admission plan."""
    p = fake_profile()
    reqs = make_requests(times(Poisson(330), 20, np.random.default_rng(1)), "m", 0.1)
    return Simulator(EdfScheduler(PLAN), [SimReplica(ReplicaInfo("r0", "m", "m", p, 32))]).run(reqs).records


def bursty() -> list:
    """Gamma cv 4 over two pipelined replicas (burst admission, waiting on), one of them down
    for a while, best-effort traffic mixed in, transit and jitter."""
    p = fake_profile()
    ts = times(Gamma(600, 4.0), 10, np.random.default_rng(2))
    reqs = [Request(i, "m", float(t), float(t) + 0.1, Priority.BEST_EFFORT if i % 5 == 0 else Priority.GUARANTEED)
            for i, t in enumerate(ts)]
    reps = [SimReplica(ReplicaInfo(f"r{i}", "m", "m", p, 32, 2)) for i in range(2)]
    core = EdfScheduler(SchedulerConfig(admission="burst", wait=True))
    sim = Simulator(core, reps, faults=[Fault("r1", 3.0, 2.0)], transit=0.001, jitter=0.0005, seed=3)
    return sim.run(reqs).records


def variants_shared() -> list:
    """Two variants of a model (accuracy objective) and a second model, time-slicing one slice."""
    fast, slow = fake_profile(4.0, 1.0, variant="fast", accuracy=0.7), fake_profile(variant="slow", accuracy=0.8)
    reps = [SimReplica(ReplicaInfo("a", "m", "fast", fast, 32)),
            SimReplica(ReplicaInfo("b", "m", "slow", slow, 32)),
            SimReplica(ReplicaInfo("c", "n", "m", fake_profile(), 32), slice_id="g0"),
            SimReplica(ReplicaInfo("d", "n", "m", fake_profile(), 32), slice_id="g0")]
    rng = np.random.default_rng(4)
    reqs = make_requests(times(Poisson(500), 8, rng), "m", 0.08)
    reqs += make_requests(times(Poisson(200), 8, rng), "n", 0.15, start_id=len(reqs))
    return Simulator(EdfScheduler(SchedulerConfig(admission="plan", wait=True)), reps).run(reqs).records


def fleet(config: SchedulerConfig = PLAN) -> list:
    """Gamma cv 4 near the capacity of four replicas of one model (the simulator's speed
    benchmark's fleet case)."""
    reqs = make_requests(times(Gamma(1300, 4.0), 15, np.random.default_rng(5)), "m", 0.1)
    reps = [SimReplica(ReplicaInfo(f"r{i}", "m", "m", fake_profile(), 32)) for i in range(4)]
    return Simulator(EdfScheduler(config), reps).run(reqs).records


def fleet_default() -> list:
    """The fleet case with the default settings (admission burst)."""
    return fleet(SchedulerConfig())


def test_fixed_seeded_runs_give_exactly_the_same_answers() -> None:
    got = {f.__name__: digest(f()) for f in (single, bursty, variants_shared, fleet, fleet_default)}
    assert got == GOLDEN


GOLDEN = {"single": "8eaf822ad5eada27", "bursty": "a1896b0d43e31902", "variants_shared": "3c609af0d65d5cb2",
          "fleet": "aab3e0c5575cfe43", "fleet_default": "8a1a01d0e3d82d9e"}



def test_the_burst_window_count_resumes_exactly_as_a_scan_from_the_newest() -> None:
    from gateway.policy.rate import RateEstimator

    def scan(times: list[float], at: float, window: float) -> float:
        n = 0
        for t in reversed(times):
            if t < at - window:
                break
            n += 1
        return n / window

    rng = np.random.default_rng(9)
    for ordered in (True, False):
        est, seen, now = RateEstimator(window=0.5, max_kept=300), [], 0.0
        for _ in range(3000):
            now += float(rng.exponential(0.002))
            t = now if ordered or rng.random() > 0.01 else now - 0.05  # a few out of order
            rows = int(rng.integers(1, 3))
            est.observe(t, rows)
            seen += [t] * rows
            if rng.random() < 0.3:
                est.rate(now)  # drops times older than its window, as submit does
            at = now - (0.03 if rng.random() < 0.1 else 0.0)  # sometimes asked a little earlier
            assert est.recent(at, 0.05) == scan(seen, at, 0.05)


def test_the_protect_check_plans_only_past_the_shared_batches_with_the_same_verdict() -> None:
    from gateway.policy.admission import Lane, finishes_from, pushes_late

    def plan_finishes(lanes: list[Lane], sizes: list[int]) -> list[float]:
        """The whole plan: each queued request's finish, the queue going out in EDF order."""
        if not lanes:
            return [float("inf")] * len(sizes)
        heap = [(ln.start, i) for i, ln in enumerate(lanes)]
        heapq.heapify(heap)
        return finishes_from(lanes, heap, sizes)

    def whole(lanes: list[Lane], queue: list[Request], idx: int, size: int) -> bool:
        before = plan_finishes(lanes, [r.size for r in queue])
        after = plan_finishes(lanes, [r.size for r in queue[:idx]] + [size] + [r.size for r in queue[idx:]])
        return any(b <= r.deadline < a for r, b, a in zip(queue, before, after[:idx] + after[idx + 1:], strict=True))

    rng = np.random.default_rng(11)
    verdicts = set()
    for _ in range(3000):
        lanes = [Lane(float(rng.uniform(0, 0.05)), fake_profile(max_batch=mb).latency, mb)
                 for mb in rng.integers(1, 9, size=int(rng.integers(1, 4)))]
        unit = bool(rng.random() < 0.5)
        n = int(rng.integers(0, 40))
        deadlines = np.sort(rng.uniform(0.0, 0.4, size=n))
        queue = [Request(i, "m", 0.0, float(d), size=1 if unit else int(rng.integers(1, 10)))
                 for i, d in enumerate(deadlines)]
        idx, size = int(rng.integers(0, n + 1)), int(rng.integers(1, 4))
        got = pushes_late(lanes, queue, idx, size, unit)
        assert got == whole(lanes, queue, idx, size)
        verdicts.add(got)
    assert verdicts == {True, False}  # both verdicts were exercised


def _small_fleet():
    """Models shaped like the fleet hour's: each on its own replica with its own profile (p99
    above p50, so the core keeps learning how much faster batches run than it plans), a few
    tens of requests per second each, one model with two unlike replicas and two models
    time-slicing one slice."""
    from loadgen.sim.fleet import SimFleet, SimModel

    shapes = [(6.0, 1.1, 8), (3.0, 0.4, 64), (9.5, 2.0, 16), (4.2, 0.9, 32), (12.0, 3.1, 4)]
    reps, models = [], {}
    for k, (a, c, mb) in enumerate(shapes):
        name = f"m{k}"
        models[name] = SimModel(name, 0.05 + 0.02 * k, 0.05 * (k % 2))
        p = fake_profile(a, c, mb, p99_factor=1.3)
        reps.append(SimReplica(ReplicaInfo(f"{name}-r0", name, "m", p, mb)))
    reps.append(SimReplica(ReplicaInfo("m3-r1", "m3", "m", fake_profile(5.0, 0.7, 16, p99_factor=1.1), 16)))
    for k in (5, 6):
        models[f"m{k}"] = SimModel(f"m{k}", 0.1)
        reps.append(SimReplica(ReplicaInfo(f"m{k}-r0", f"m{k}", "m", fake_profile(p99_factor=1.2), 32),
                               slice_id="shared"))
    return SimFleet(SchedulerConfig(), models, tuple(reps), "test")


def small_models() -> list:
    """The small fleet under one core with the default settings, Gamma cv 2 per model."""
    fleet = _small_fleet()
    rng = np.random.default_rng(12)
    reqs: list[Request] = []
    for k, (name, m) in enumerate(fleet.models.items()):
        ts = times(Gamma(15.0 + 25 * k, 2.0), 20, rng)
        reqs += make_requests(ts, name, m.slo * (1 - m.margin), start_id=len(reqs))
    return Simulator(EdfScheduler(fleet.scheduler), fleet.replicas).run(reqs).records


def run_digest(processes: int) -> str:
    """``headrace sim``'s whole summary of the small fleet over a trace replay (warm-up, per-model
    tables, timeline), split into its groups over ``processes`` worker processes."""
    import json
    import tempfile
    from pathlib import Path

    from loadgen.arrivals import AZURE_HEADER
    from loadgen.sim.cli import SIM_TARGET
    from loadgen.sim.run import SimOptions, run_sim
    from loadgen.spec import LoadSpec

    fleet = _small_fleet()
    rng = np.random.default_rng(13)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.csv"
        rows = [",".join([*AZURE_HEADER, "1", "2"])]
        rows += [f"o,a,f{k},http,{int(rng.integers(200, 3000))},{int(rng.integers(200, 3000))}"
                 for k in range(len(fleet.models))]
        trace.write_text("\n".join(rows) + "\n")
        spec = LoadSpec(target=SIM_TARGET, arrival="trace", trace=trace, trace_models=tuple(fleet.models),
                        trace_cv=2.0, time_scale=3.0, duration_s=25.0, warmup_s=5.0, seed=14, window_s=5.0)
        summary, _ = run_sim(fleet, spec, SimOptions(processes=processes))
    keep = {k: v for k, v in summary.items() if k not in ("elapsed_s", "run", "processes")}
    keep["sim"] = {k: v for k, v in summary["sim"].items() if k != "requests_per_wall_minute"}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


def test_a_fleet_of_small_models_gives_exactly_the_same_answers_in_one_process_or_two() -> None:
    assert digest(small_models()) == SMALL_GOLDEN["small_models"]
    assert run_digest(1) == run_digest(2) == SMALL_GOLDEN["run"]


# "run" digests the summary, which lists every scheduler setting: it moved when request_timeouts
# was added (00595bce45e281a6 without it), not an answer
SMALL_GOLDEN = {"small_models": "eea5ee8fa7398418", "run": "0752dfb98ee04dcd"}
