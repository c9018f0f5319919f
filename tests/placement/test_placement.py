"""Placement: catalogue, capacity model, verifier, solver optimality, diffs and executors."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from placement.apply.executors import DryRun, ExecutorError, Nvml
from placement.diff import diff, replan
from placement.plan import Demand, GpuClass, GpuPlan, Inventory, Plan, PlanError, Replica, SlicePlan
from placement.solve.capacity import (
    backlog_wait,
    batch_latency,
    best_batch,
    cycle_wait,
    latency_at,
    replica_capacity,
    small_batch_rate,
)
from placement.solve.solver import Options, SolverError, candidates, lower_bound, solve
from placement.spec import SpecError, load_problem
from profiles.catalogue import Instance, gpu_model, layouts, overlap_reason
from profiles.derive import with_derived
from profiles.profile import LatencyPoint, Profile, ProfileSet


def fake_profile(model: str, slice_: str, a_ms: float = 5.0, c_ms: float = 2.0, gpu: str = "A100-80GB",
                 variant: str | None = None, memory_mb: float = 1000.0, max_batch: int = 64,
                 accuracy: float | None = None) -> Profile:
    """t(b) = a + c*b ms, p99 = p50."""
    pts = tuple(LatencyPoint(b, (a_ms + c_ms * b) / 1e3, (a_ms + c_ms * b) / 1e3) for b in (1, max_batch))
    return Profile(model, variant or model, gpu, slice_, max_batch, pts, memory_mb, accuracy, 0.1)


def pool(n: int = 4, gpu: str = "A100-80GB", mig: bool = True, mps: bool = True, cost: float = 1.0) -> Inventory:
    return Inventory((GpuClass(gpu, tuple(f"n0/gpu{i}" for i in range(n)), cost, mig, mps),))


# ------------------------------------------------------------------ catalogue


def test_a100_has_19_maximal_layouts_without_the_two_slice_1g_and_78_with_it():
    assert len(layouts("A100-40GB")) == 19
    assert len(layouts("A100-80GB", with_double_memory_1g=True)) == 78
    names = {"+".join(i.profile for i in lay) for lay in layouts("A100-40GB")}
    assert "4g.20gb+3g.20gb" in names and "7g.40gb" in names
    assert "1g.5gb+" * 6 + "1g.5gb" in names


def test_every_enumerated_layout_is_legal_and_maximal():
    g = gpu_model("A100-40GB")
    singles = [Instance(s, p.name) for p in g.profiles if p.name != "1g.10gb" for s in p.starts]
    for lay in layouts("A100-40GB"):
        assert overlap_reason(g, lay) is None
        # NOTE: maximal means no further instance fits
        assert all(overlap_reason(g, (*lay, extra)) for extra in singles if extra not in lay)


def test_illegal_placements_are_explained():
    g = gpu_model("A100-80GB")
    assert "not a legal placement" in overlap_reason(g, (Instance(2, "3g.40gb"),))
    assert "overlaps" in overlap_reason(g, (Instance(0, "4g.40gb"), Instance(0, "3g.40gb")))
    assert len(layouts("A30-24GB")) == 5


# ------------------------------------------------------------------ capacity


def test_capacity_waits_for_the_batch_in_flight_and_the_burst_behind_it():
    p = ProfileSet.reference().get("resnet50", "A100-80GB", "1g.10gb").with_max_batch(32)
    cap = replica_capacity(p, 0.100)
    lat = [0.0] + [batch_latency(p, b) for b in range(1, 33)]
    assert cap.max_batch == best_batch(lat, 32) == 32  # the curve's rows per second rise to the end
    wait, batch = latency_at(lat, cap.rate, 32)
    assert wait <= 0.100 and batch == cap.batch
    # a little more would not fit: the rule's wait grows with the rate
    assert latency_at(lat, cap.rate * 1.02, 32)[0] > 0.100
    assert cap.rate < cap.max_batch / lat[cap.max_batch]  # never at saturation
    half = replica_capacity(p, 0.100, share=0.5)
    assert half.rate < cap.rate / 2  # MPS pays interference and a smaller batch
    assert replica_capacity(p, 0.015) is None


def test_capacity_widens_bursts_on_proportional_curves_and_refuses_saturation():
    lat = [0.0] + [0.010 * b for b in range(1, 17)]  # proportional: a larger batch is no cheaper per row
    assert cycle_wait(lat, 90.0, 1, 16) > 2 * cycle_wait(lat, 50.0, 1, 16)  # phi = rate x 10 ms
    assert latency_at(lat, 100.0, 16)[0] == float("inf")  # rho = 1: the backlog never drains
    assert backlog_wait(100.0, 0.010) == float("inf")
    # M/D/1, 10 ms: the 99th percentile wait by Lindley's recursion over 2M arrivals is 33.4 ms
    # at rho = 0.5 and 222.9 ms at rho = 0.9
    assert backlog_wait(50.0, 0.010) == pytest.approx(0.0334, rel=0.02)
    assert backlog_wait(90.0, 0.010) == pytest.approx(0.2229, rel=0.03)
    assert backlog_wait(1.0, 0.010) == 0.0  # almost never queued


def test_capacity_caps_the_max_batch_where_rows_per_second_peak():
    """On a curve where a batch of two serves fewer rows per second than a batch of one (MPS-
    slowed curves can), the planned replica runs batches of one, below saturation."""
    p = ProfileSet.reference().get("resnet50", "A100-80GB", "1g.10gb")
    lat = [0.0, 0.007, 0.022, 0.037]
    assert best_batch(lat, 3) == 1
    pts = (LatencyPoint(1, 0.007, 0.007), LatencyPoint(2, 0.022, 0.022), LatencyPoint(3, 0.037, 0.037))
    slow = replace(p, points=pts, max_batch=3)
    cap = replica_capacity(slow, 0.120)
    assert cap.max_batch == 1 and cap.batch == 1
    assert 0.6 / 0.007 < cap.rate < 0.95 / 0.007


@pytest.mark.parametrize(("slice_", "slo"), [("1g.10gb", 0.100), ("1g.10gb", 0.060), ("2g.20gb", 0.070)])
def test_capacity_is_what_the_gateway_batcher_sustains_at_99_percent(slice_, slo):
    """The planner's capacity against the gateway's own policy core in virtual time: Poisson
    load at it keeps >= 99% of requests in time, at 1 / 0.9 of it not (so it is >= 90% of the
    rate that keeps 99%). ``bench/capacity_check.py`` does this for a sample of every kind."""
    import numpy as np

    from gateway.policy import EdfScheduler
    from gateway.policy.types import ReplicaInfo
    from loadgen.sim.simulator import SimReplica, Simulator, make_requests

    p = ProfileSet.reference().get("resnet50", "A100-80GB", slice_).with_max_batch(32)
    cap = replica_capacity(p, slo).rate

    def attainment(rate: float) -> float:
        ts = np.cumsum(np.random.default_rng(7).exponential(1 / rate, int(rate * 30)))
        rep = SimReplica(ReplicaInfo("r", "m", p.variant, p, 32))
        res = Simulator(EdfScheduler(), [rep], service="p99").run(make_requests(ts, "m", slo))
        return res.summary()["attainment"]

    assert attainment(cap) >= 0.99
    assert attainment(cap / 0.9) < 0.99


def test_derived_profiles_say_how():
    ps = with_derived(ProfileSet.reference())
    h = ps.get("resnet50", "H100-80GB", "3g.40gb")
    a = ps.get("resnet50", "A100-80GB", "3g.40gb")
    assert h.provenance.kind == "derived" and "SM ratio" in h.provenance.notes
    assert h.latency(64) < a.latency(64)


# ------------------------------------------------------------------ verify


def _one_gpu_plan(slices: tuple[SlicePlan, ...], demands: tuple[Demand, ...], profiles: ProfileSet,
                  inv: Inventory | None = None, mig: bool = True) -> Plan:
    return Plan((GpuPlan("n0/gpu0", "A100-80GB", mig, slices),), demands, inv or pool(1), "hand", 0, 0, profiles)


@pytest.fixture()
def small() -> tuple[ProfileSet, Demand]:
    ps = ProfileSet([fake_profile("m", s, a_ms=2, c_ms=0.5) for s in ("1g.10gb", "3g.40gb", "4g.40gb", "gpu")])
    return ps, Demand("m", 10.0, 0.1)


def _rep(ps: ProfileSet, s: str, share: float = 1.0, model: str = "m") -> Replica:
    cap = replica_capacity(ps.get(model, "A100-80GB", s), 0.1, share)
    return Replica(model, model, share, cap.batch, cap.rate)


def test_a_legal_hand_plan_verifies(small):
    ps, d = small
    _one_gpu_plan((SlicePlan("1g.10gb", 0, False, (_rep(ps, "1g.10gb"),)),), (d,), ps).verify()


@pytest.mark.parametrize("rule,needle,build", [
    ("placement", "overlaps", lambda ps: (SlicePlan("4g.40gb", 0, False, (_rep(ps, "4g.40gb"),)),
                                          SlicePlan("3g.40gb", 0, False, (_rep(ps, "3g.40gb"),)))),
    ("placement", "not a legal placement", lambda ps: (SlicePlan("3g.40gb", 2, False, (_rep(ps, "3g.40gb"),)),)),
    ("mps-share", "exceed 100%", lambda ps: (SlicePlan("3g.40gb", 0, True, (_rep(ps, "3g.40gb", .5),
                                                                             _rep(ps, "3g.40gb", 1.0))),)),
    ("mps-clients", "limit of 6", lambda ps: (SlicePlan("1g.10gb", 0, True, tuple(_rep(ps, "1g.10gb", .125)
                                                                                  for _ in range(7))),)),
    ("mps-share", "without MPS", lambda ps: (SlicePlan("3g.40gb", 0, False, (_rep(ps, "3g.40gb"),) * 2),)),
])
def test_illegal_plans_are_rejected_naming_gpu_slices_and_rule(small, rule, needle, build):
    ps, d = small
    plan = _one_gpu_plan(build(ps), (d,), ps)
    with pytest.raises(PlanError) as e:
        plan.verify()
    assert e.value.rule == rule and needle in str(e.value) and "n0/gpu0" in str(e.value)
    assert "@" in str(e.value)  # the slice is named


def test_memory_and_capacity_and_permissions_are_checked(small):
    ps, d = small
    big = ProfileSet([fake_profile("m", "1g.10gb", memory_mb=12_000)])
    with pytest.raises(PlanError, match=r"\[memory\].*n0/gpu0 slice 1g.10gb@0"):
        _one_gpu_plan((SlicePlan("1g.10gb", 0, False, (_rep(big, "1g.10gb"),)),), (d,), big).verify()
    hot = replace(d, rate=1e6)
    with pytest.raises(PlanError, match=r"\[capacity\] model m: predicted capacity .* < demand 1e\+06"):
        _one_gpu_plan((SlicePlan("1g.10gb", 0, False, (_rep(ps, "1g.10gb"),)),), (hot,), ps).verify()
    with pytest.raises(PlanError, match=r"\[mps-allowed\] GPU n0/gpu0: slices 1g.10gb@0"):
        _one_gpu_plan((SlicePlan("1g.10gb", 0, True, (_rep(ps, "1g.10gb", .5),)),), (d,), ps,
                      pool(1, mps=False)).verify()
    with pytest.raises(PlanError, match=r"\[mig-allowed\]"):
        _one_gpu_plan((SlicePlan("1g.10gb", 0, False, (_rep(ps, "1g.10gb"),)),), (d,), ps,
                      pool(1, mig=False)).verify()


# ------------------------------------------------------------------ solver


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_seven_one_g_replicas_per_gpu_is_optimal(method):
    # only a 1g profile exists, no MPS: 15 replicas' worth needs 7 + 7 + 1 slices = 3 GPUs
    ps = ProfileSet([fake_profile("m", "1g.10gb")])
    cap = replica_capacity(ps.get("m", "A100-80GB", "1g.10gb"), 0.1).rate
    plan = solve([Demand("m", 14.5 * cap, 0.1)], ps, pool(5, mps=False), method)
    plan.verify()
    assert plan.gpu_count == 3 and plan.lower_bound == 3 and plan.gap == 0


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_a_plan_tells_the_seconds_of_its_bound_apart_from_the_whole_solve(method):
    # a clock that moves one second per reading: the bound is read twice around it
    ticks = iter(range(1_000_000))
    ps = ProfileSet([fake_profile("m", "1g.10gb")])
    cap = replica_capacity(ps.get("m", "A100-80GB", "1g.10gb"), 0.1).rate
    plan = solve([Demand("m", 2.5 * cap, 0.1)], ps, pool(2, mps=False), method, clock=lambda: float(next(ticks)))
    assert plan.bound_seconds == 1.0 and plan.solve_seconds > plan.bound_seconds
    assert plan.to_dict()["status"]["bound_seconds"] == 1.0


@pytest.mark.parametrize("method", ["greedy", "milp"])
def test_four_g_and_three_g_share_a_gpu(method):
    # a needs two 3g, b one 4g: 4g+3g on one GPU and a 3g on another is optimal (2 GPUs)
    ps = ProfileSet([fake_profile("a", "3g.40gb"), fake_profile("b", "4g.40gb")])
    ca = replica_capacity(ps.get("a", "A100-80GB", "3g.40gb"), 0.1).rate
    cb = replica_capacity(ps.get("b", "A100-80GB", "4g.40gb"), 0.1).rate
    plan = solve([Demand("a", 1.5 * ca, 0.1), Demand("b", 0.9 * cb, 0.1)], ps, pool(4, mps=False), method)
    plan.verify()
    assert plan.gpu_count == 2 and plan.lower_bound == 2


def test_cost_objective_picks_the_cheaper_gpu_and_accuracy_breaks_ties():
    ps = ProfileSet([fake_profile("m", "gpu", variant="m-lo", accuracy=0.7),
                     fake_profile("m", "gpu", variant="m-hi", accuracy=0.9),
                     fake_profile("m", "gpu", gpu="H100-80GB", c_ms=1.0)])
    inv = Inventory((GpuClass("A100-80GB", ("a/gpu0", "a/gpu1"), 1.0, False, False),
                     GpuClass("H100-80GB", ("h/gpu0",), 5.0, False, False)), "cost")
    plan = solve([Demand("m", 100.0, 0.1)], ps, inv, "milp")
    plan.verify()
    assert [g.gpu for g in plan.used()] == ["A100-80GB"]
    assert plan.replicas()[0][2].variant == "m-hi"


def test_mps_packs_small_models_into_one_slice():
    ps = ProfileSet([fake_profile(m, "1g.10gb", a_ms=2, c_ms=0.5) for m in "abcd"])
    demands = [Demand(m, 20.0, 0.1) for m in "abcd"]
    with_mps = solve(demands, ps, pool(2), "milp")
    without = solve(demands, ps, pool(2, mps=False), "milp")
    with_mps.verify()
    without.verify()
    slices = lambda p: sum(len(g.slices) for g in p.used())  # noqa: E731
    assert slices(with_mps) == 1 < slices(without) == 4


def test_unservable_slo_is_a_clear_error():
    from placement.solve.solver import SolverError

    ps = ProfileSet([fake_profile("m", "1g.10gb")])
    with pytest.raises(SolverError, match="model m: no allowed variant meets SLO 5 ms"):
        solve([Demand("m", 10.0, 0.005)], ps, pool(1))


# ------------------------------------------------------------------ lower bound


def test_the_bound_charges_each_model_whole_replicas():
    # one 7g slice kind with MPS, where a half-share replica serves 39% of a full one and a
    # quarter 14% (interference). a needs 1.1 full replicas' worth: at best 1 full + 1 quarter,
    # 1.25 GPUs; b needs 1.6: at best 2 GPUs' worth. 3.25 GPUs round up to 4, while the LP
    # relaxation spreads 2.7 GPUs of full replicas (2.87 with its rounding cuts) and says 3.
    ps = ProfileSet([fake_profile(m, "7g.80gb") for m in "ab"])
    full = replica_capacity(ps.get("a", "A100-80GB", "7g.80gb"), 0.1).rate
    demands = [Demand("a", 1.1 * full, 0.1), Demand("b", 1.6 * full, 0.1)]
    inv, opts = pool(6), Options()
    cands = candidates(demands, ps, inv, opts)
    assert lower_bound(demands, inv, cands, opts, lagrangian=False) == 3
    assert lower_bound(demands, inv, cands, opts) == 4
    plan = solve(demands, ps, inv, "milp")
    plan.verify()
    assert plan.gpu_count == 4 and plan.lower_bound == 4 and plan.gap == 0


SLICE_KINDS = ("gpu", "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


@st.composite
def small_fleets(draw) -> tuple[list[Demand], ProfileSet, Inventory]:
    """1-3 models with linear latency curves on 1-3 slice kinds of A100s and/or H100s, each
    needing 0.2-2.5 replicas' worth, on pools of 8 GPUs per class (MPS on or off, GPU count
    or cost objective)."""
    gpus = draw(st.sampled_from([("A100-80GB",), ("H100-80GB",), ("A100-80GB", "H100-80GB")]))
    demands, profiles = [], []
    for i in range(draw(st.integers(1, 3))):
        m = f"m{i}"
        a_ms, c_ms = draw(st.floats(1.0, 10.0)), draw(st.floats(0.2, 4.0))
        kinds = draw(st.lists(st.sampled_from(SLICE_KINDS), min_size=1, max_size=3, unique=True))
        mine = [fake_profile(m, k, a_ms, c_ms, gpu=g) for g in gpus for k in kinds]
        full = replica_capacity(mine[0], 0.1).rate
        demands.append(Demand(m, round(draw(st.floats(0.2, 2.5)) * full, 1), 0.1))
        profiles += mine
    classes = tuple(GpuClass(g, tuple(f"{g}/gpu{k}" for k in range(8)), draw(st.sampled_from([1.0, 2.0, 3.5])),
                             True, draw(st.booleans())) for g in gpus)
    return demands, ProfileSet(profiles), Inventory(classes, draw(st.sampled_from(["gpus", "cost"])))


@settings(max_examples=40, deadline=None)
@given(small_fleets())
def test_no_plan_beats_the_lower_bound(fleet):
    # NOTE: the bound is valid: the MILP's plan (optimal on instances this small) never costs less
    demands, ps, inv = fleet
    try:
        plan = solve(demands, ps, inv, "milp")
    except SolverError:
        assume(False)  # the pool is too small for this draw
    plan.verify()
    assert plan.lower_bound <= plan.objective + 1e-6


# ------------------------------------------------------------------ diff and replan


def test_replan_is_make_before_break_and_keeps_what_still_serves():
    ps = ProfileSet([fake_profile("a", s) for s in ("1g.10gb", "3g.40gb")] +
                    [fake_profile("b", s) for s in ("1g.10gb", "3g.40gb")])
    inv = pool(6)
    cap = replica_capacity(ps.get("a", "A100-80GB", "3g.40gb"), 0.1).rate
    old = solve([Demand("a", 2 * cap, 0.1), Demand("b", cap, 0.1)], ps, inv, "milp")
    new, d = replan(old, [Demand("a", 4 * cap, 0.1), Demand("b", 0.2 * cap, 0.1)], ps, inv)
    new.verify()
    assert d.capacity_dips() == []
    acts = [s.action for s in d.steps]
    assert "start_replica" in acts
    # NOTE: every start comes before any stop
    if "stop_replica" in acts:
        assert max(i for i, a in enumerate(acts) if a == "start_replica") < acts.index("stop_replica")
    # kept replicas are not restarted: fewer steps than building from scratch
    assert d.reconfigurations < diff(None, new).reconfigurations


def test_a_diff_that_breaks_first_reports_the_dip():
    ps = ProfileSet([fake_profile("m", "3g.40gb")])
    d = Demand("m", 10.0, 0.1)
    r = _rep(ps, "3g.40gb")
    a = _one_gpu_plan((SlicePlan("3g.40gb", 0, False, (r,)),), (d,), ps)
    b = _one_gpu_plan((SlicePlan("3g.40gb", 4, False, (r,)),), (d,), ps)
    ordered = diff(a, b)
    assert [s.action for s in ordered.steps][:2] == ["create_slice", "start_replica"]
    assert ordered.capacity_dips() == []
    broken = replace(ordered, steps=tuple(reversed(ordered.steps)))
    assert broken.capacity_dips() and "capacity 0" in broken.capacity_dips()[0]


# ------------------------------------------------------------------ executors


def _mixed_plan() -> Plan:
    ps = ProfileSet([fake_profile("a", "3g.40gb"), fake_profile("b", "1g.10gb", a_ms=2, c_ms=0.5),
                     fake_profile("c", "1g.10gb", a_ms=2, c_ms=0.5)])
    demands = (Demand("a", 10.0, 0.1), Demand("b", 10.0, 0.1), Demand("c", 10.0, 0.1))
    slices = (SlicePlan("1g.10gb", 0, True, (_rep(ps, "1g.10gb", .5, "b"), _rep(ps, "1g.10gb", .25, "c"))),
              SlicePlan("3g.40gb", 4, False, (_rep(ps, "3g.40gb", 1.0, "a"),)))
    return Plan((GpuPlan("n0/gpu2", "A100-80GB", True, slices),), demands, pool(3), "hand", 0, 0, ps)


def test_dry_run_records_the_exact_command_sequence():
    plan = _mixed_plan()
    plan.verify()
    got = [c.shell() for c in DryRun().apply(plan)]
    mps = "/tmp/headrace-mps/n0-gpu2-1g.10gb-0"
    dev = 'CUDA_VISIBLE_DEVICES="MIG-$GPU_2/$GI_2_0/$CI_2_0"'
    env = f"{dev} CUDA_MPS_PIPE_DIRECTORY={mps}/pipe CUDA_MPS_LOG_DIRECTORY={mps}/log"
    repos = "/var/lib/headrace/repos/n0_gpu2_"
    # NOTE: the same Triton command line as the local launcher's, listening on every address
    rest = ("--http-address=0.0.0.0 --grpc-address=0.0.0.0 --allow-metrics=true --exit-on-error=true "
            "--strict-readiness=true --log-verbose=0")
    run = "/run/headrace/n0_gpu2_"
    # NOTE: instance ids come from nvidia-smi's answer (tests/placement/test_executors.py runs it against a fake)
    assert [g for g in got if "awk" not in g and not g.startswith("timeout")] == [
        "nvidia-smi -i 2 -mig 1",
        "CREATED_2_0=$(nvidia-smi mig -i 2 -cgi 1g.10gb:0 -C)",
        'test -n "$GI_2_0"',
        "GPU_2=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 2)",
        f"mkdir -p {mps}/pipe {mps}/log",
        f"{env} nvidia-cuda-mps-control -d",
        f"{env} CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4864M setsid tritonserver "
        f"--model-repository={repos}1g.10gb@0_b --http-port=8100 --grpc-port=8101 --metrics-port=0 {rest} "
        f">{run}1g.10gb@0_b.log 2>&1 </dev/null & echo $! >{run}1g.10gb@0_b.pid",
        f"{env} CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2432M setsid tritonserver "
        f"--model-repository={repos}1g.10gb@0_c --http-port=8102 --grpc-port=8103 --metrics-port=0 {rest} "
        f">{run}1g.10gb@0_c.log 2>&1 </dev/null & echo $! >{run}1g.10gb@0_c.pid",
        "CREATED_2_4=$(nvidia-smi mig -i 2 -cgi 3g.40gb:4 -C)",
        'test -n "$GI_2_4"',
        'CUDA_VISIBLE_DEVICES="MIG-$GPU_2/$GI_2_4/$CI_2_4" setsid tritonserver '
        f"--model-repository={repos}3g.40gb@4_a --http-port=8104 --grpc-port=8105 --metrics-port=0 {rest} "
        f">{run}3g.40gb@4_a.log 2>&1 </dev/null & echo $! >{run}3g.40gb@4_a.pid",
    ]


def test_examples_parse_and_bad_fields_name_the_value(tmp_path):
    inv, demands, _ = load_problem("placement/examples/pool.yaml", "placement/examples/models.yaml")
    assert sum(len(c.ids) for c in inv.classes) == 6 and len(demands) == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: headrace.dev/v1\nkind: ModelDeployment\nmetadata: {name: x}\n"
                   "spec: {model: x, rate: -3, slo_ms: 100}\n")
    with pytest.raises(SpecError, match=r"spec.rate: .*greater than or equal to 0 \(got -3\)"):
        load_problem("placement/examples/pool.yaml", bad)
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text("kind: GpuPool\nmetadata: {name: p}\nspec: {nodes: [{name: a, gpus: [{model: V100, count: 1}]}]}\n")
    with pytest.raises(SpecError, match=r"model \('V100'\) is not a known GPU"):
        load_problem(gpu, "placement/examples/models.yaml")


class FakeNvml:
    """Just enough of pynvml for MIG set-up, enforcing the A100 placement table on its own."""

    NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_DISABLE = 1, 0
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
    # constant -> (profile id, size in memory slices, legal starts), as the A100 reports them
    TABLE = {1: (19, 1, range(7)), 12: (15, 2, (0, 2, 4, 6)), 2: (14, 2, (0, 2, 4)),
             3: (9, 4, (0, 4)), 4: (5, 4, (0,)), 7: (0, 8, (0,))}
    NVML_GPU_INSTANCE_PROFILE_1_SLICE, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 1, 12
    NVML_GPU_INSTANCE_PROFILE_2_SLICE, NVML_GPU_INSTANCE_PROFILE_3_SLICE = 2, 3
    NVML_GPU_INSTANCE_PROFILE_4_SLICE, NVML_GPU_INSTANCE_PROFILE_7_SLICE = 4, 7
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 101, 103

    class NVMLError(Exception):
        pass

    class c_nvmlGpuInstancePlacement_t:  # noqa: N801  (pynvml's name)
        start = size = 0

    def __init__(self) -> None:
        self.mig: dict[int, int] = {}
        self.gis: dict[int, dict[int, tuple[int, int]]] = {}  # dev -> gi id -> (start, size)
        self.calls: list[str] = []

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return i

    def nvmlDeviceSetMigMode(self, dev, mode):  # noqa: N802
        self.mig[dev] = mode

    def nvmlDeviceGetGpuInstanceProfileInfo(self, dev, const):  # noqa: N802
        pid, size, _ = self.TABLE[const]
        return type("Info", (), {"id": pid, "sliceCount": size})()

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, dev, pid, placement):  # noqa: N802
        if self.mig.get(dev) != 1:
            raise self.NVMLError("MIG mode is not enabled")
        _, size, starts = next(v for v in self.TABLE.values() if v[0] == pid)
        if placement.start not in starts or placement.size != size:
            raise self.NVMLError(f"invalid placement {placement.start}:{placement.size}")
        used = {m for s, n in self.gis.setdefault(dev, {}).values() for m in range(s, s + n)}
        if used & set(range(placement.start, placement.start + size)):
            raise self.NVMLError("Insufficient Resources")
        gi = len(self.gis[dev]) + 1
        self.gis[dev][gi] = (placement.start, size)
        self.calls.append(f"gi {dev} {pid}@{placement.start}")
        return (dev, gi)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, const, eng):  # noqa: N802
        return type("Info", (), {"id": const})()

    def nvmlGpuInstanceCreateComputeInstance(self, gi, pid):  # noqa: N802
        self.calls.append(f"ci {gi[0]} {gi[1]}")
        return gi

    def nvmlGpuInstanceGetInfo(self, gi):  # noqa: N802
        return type("Info", (), {"id": gi[1]})()

    def nvmlDeviceGetMaxMigDeviceCount(self, dev):  # noqa: N802
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, dev, i):  # noqa: N802
        ids = sorted(self.gis.get(dev, {}))
        if i >= len(ids):
            raise self.NVMLError("not found")
        return (dev, ids[i])

    def nvmlDeviceGetGpuInstanceId(self, mig):  # noqa: N802
        return mig[1]

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return f"MIG-fake-{h[0]}-{h[1]}" if isinstance(h, tuple) else f"GPU-fake-{h}"


class RecordingRunner:
    def __init__(self) -> None:
        self.started: list[tuple[str, dict]] = []

    def start(self, key, argv, env, stdin=""):
        self.started.append((key, env))
        return 1

    def stop(self, key):
        self.started.append((f"stop {key}", {}))


def test_nvml_executor_creates_instances_at_explicit_placements_and_launches_on_their_uuids():
    fake, runner = FakeNvml(), RecordingRunner()
    uuids = Nvml(nvml=fake, runner=runner, ready=lambda hp: True).apply(_mixed_plan())
    assert fake.calls == ["gi 2 19@0", "ci 2 1", "gi 2 9@4", "ci 2 2"]
    assert uuids == {("n0/gpu2", "1g.10gb@0"): "MIG-fake-2-1", ("n0/gpu2", "3g.40gb@4"): "MIG-fake-2-2"}
    envs = {k: e for k, e in runner.started}
    assert envs["n0/gpu2/3g.40gb@4/a"]["CUDA_VISIBLE_DEVICES"] == "MIG-fake-2-2"
    assert envs["n0/gpu2/1g.10gb@0/c"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_nvml_executor_reports_an_overlap_the_fake_driver_refuses():
    plan = _mixed_plan()
    g = plan.gpus[0]
    clash = replace(plan, gpus=(replace(g, slices=(replace(g.slices[1], start=0), g.slices[0])),))
    with pytest.raises(PlanError):
        clash.verify()
    with pytest.raises(ExecutorError, match="create_slice n0/gpu2 3g.40gb@0.*Insufficient Resources"):
        Nvml(nvml=FakeNvml(), runner=RecordingRunner(), ready=lambda hp: True).apply(clash)


def test_capacity_search_matches_brute_force_on_every_reference_curve():
    """The table's answer is the largest candidate rate whose wait fits, found by brute force,
    or the small-batch table's rate where that is more."""
    from placement.solve.capacity import SATURATION_GRID

    ps = with_derived(ProfileSet.reference(), gpus=("A100-80GB",))
    for p in ps:
        for share in (1.0, 0.25):
            lat = [0.0] + [batch_latency(p, b, share) for b in range(1, p.max_batch + 1)]
            top = best_batch(lat, p.max_batch)
            rates = [b / lat[b] for b in range(1, top + 1)] + [u * top / lat[top] for u in SATURATION_GRID]
            waits = [(latency_at(lat, r, top)[0], r) for r in rates]
            for slo in (0.02, 0.1, 0.137):
                got = replica_capacity(p, slo, share)
                want = max([r for w, r in waits if w <= slo] + [small_batch_rate(lat[:top + 1], top, slo)])
                assert (got is None) == (want == 0.0), p.name
                if got is not None:
                    assert got.rate == pytest.approx(want, rel=1e-9), (p.name, slo, share)
                    assert got.max_batch == top


def test_cli_plans_the_examples_and_prints_dry_run_commands(capsys):
    from deploy.cli import main

    rc = main(["plan", "-f", "placement/examples/pool.yaml", "-f", "placement/examples/models.yaml",
               "--output", "yaml", "--apply", "--executor", "dry-run"])
    out = capsys.readouterr().out
    assert rc == 0 and "kind: Plan" in out and "tritonserver --model-repository=" in out
    rc = main(["plan", "-f", "placement/examples/pool.yaml"])
    assert rc == 2 and "no ModelDeployment documents" in capsys.readouterr().err


def test_the_greedy_computes_its_lower_bound_only_when_asked(capsys):
    from deploy.cli import main

    files = ["-f", "placement/examples/pool.yaml", "-f", "placement/examples/models.yaml"]
    assert main(["plan", *files, "--output", "both"]) == 0
    out = capsys.readouterr().out
    assert "no bound (--bound computes it)" in out and "lower_bound: 0.0" in out and "gap: null" in out
    assert main(["plan", *files, "--output", "both", "--bound"]) == 0
    out = capsys.readouterr().out
    assert "lower bound" in out and "gap: null" not in out
    assert main(["plan", *files, "--output", "yaml", "--method", "milp"]) == 0  # the MILP always has it
    assert "gap: null" not in capsys.readouterr().out


def test_changing_a_gpu_from_whole_to_mig_breaks_first_and_says_so():
    ps = ProfileSet([fake_profile("m", "gpu"), fake_profile("m", "3g.40gb")])
    d = Demand("m", 10.0, 0.1)
    whole = _one_gpu_plan((SlicePlan("gpu", None, False, (_rep(ps, "gpu"),)),), (d,), ps, mig=False)
    mig = _one_gpu_plan((SlicePlan("3g.40gb", 0, False, (_rep(ps, "3g.40gb"),)),), (d,), ps)
    whole.verify()
    mig.verify()
    steps = diff(whole, mig).steps
    acts = [s.action for s in steps]
    # NOTE: MIG mode cannot change under a running replica: the old one stops first
    assert acts.index("stop_replica") < acts.index("enable_mig") < acts.index("create_slice")
    assert diff(whole, mig).capacity_dips()
