"""The emulated GPU's physics and arbiter, driven with plain numbers for time."""

from __future__ import annotations

import random

import pytest

from profiles.emulator.arbiter import ArbiterCore
from profiles.emulator.batchtime import batch_seconds
from profiles.emulator.overhead import Overhead
from profiles.emulator.physics import SharedGpu
from profiles.emulator.repository import write_emulated_model
from profiles.profile import LatencyPoint, Profile, ProfileError
from profiles.sharing import ActiveJob
from profiles.triton.repository import TensorSpec


def fake_profile(b1_ms: float = 10.0, b8_ms: float = 24.0, max_batch: int = 8,
                 tail: float = 1.2, interference: float = 0.15) -> Profile:
    return Profile("m", "m", "EMU", "1g", max_batch, (
        LatencyPoint(1, b1_ms / 1e3, b1_ms * tail / 1e3),
        LatencyPoint(8, b8_ms / 1e3, b8_ms * tail / 1e3),
    ), mps_interference=interference)


def finish_times(gpu: SharedGpu, until: float) -> dict[int, float]:
    return {f.job_id: f.finished for f in gpu.advance(until)}


# ------------------------------------------------------------------ physics


def test_mig_slices_never_slow_each_other():
    gpu = SharedGpu()
    gpu.start(1, ActiveJob("gpu0/a", "x"), 1.0, now=0.0)
    gpu.start(2, ActiveJob("gpu0/b", "y"), 2.0, now=0.5)
    assert finish_times(gpu, 10.0) == pytest.approx({1: 1.0, 2: 2.5})


def test_time_slicing_serializes_and_speeds_up_when_a_tenant_leaves():
    gpu = SharedGpu()
    gpu.start(1, ActiveJob("s", "x"), 1.0, now=0.0)
    gpu.start(2, ActiveJob("s", "y"), 3.0, now=0.0)
    # both at half speed until job 1 is done at t=2; job 2 then has 2 s left at full speed
    assert finish_times(gpu, 10.0) == pytest.approx({1: 2.0, 2: 4.0})


def test_mps_halves_pay_interference_only_while_both_busy():
    f = 0.2
    gpu = SharedGpu()
    gpu.start(1, ActiveJob("s", "x", "mps", 0.5, f), 1.0, now=0.0)
    gpu.start(2, ActiveJob("s", "y", "mps", 0.5, f), 1.0, now=0.0)
    assert finish_times(gpu, 10.0) == pytest.approx({1: 2 * (1 + f), 2: 2 * (1 + f)})
    gpu.start(3, ActiveJob("s", "x", "mps", 0.5, f), 1.0, now=10.0)
    # alone, a 50% client still runs at 50% (MPS caps threads) but without interference
    assert finish_times(gpu, 20.0) == pytest.approx({3: 12.0})


def test_cancelled_job_frees_its_share_at_once():
    gpu = SharedGpu()
    gpu.start(1, ActiveJob("s", "x"), 1.0, now=0.0)
    gpu.start(2, ActiveJob("s", "y"), 100.0, now=0.0)
    gpu.cancel(2, now=0.5)  # job 1 did 0.25 s of work at half speed
    assert finish_times(gpu, 10.0) == pytest.approx({1: 1.25})
    assert len(gpu) == 0


# ------------------------------------------------------------------ arbiter core


def run_msg(seq: int, work: float, t: float | None = None, slice_: str = "s", mode: str = "timeslice",
            share: float = 1.0, client: str = "c") -> dict:
    msg = {"op": "run", "seq": seq, "slice": slice_, "client": client, "mode": mode, "share": share,
           "interference": 0.0, "work": work}
    if t is not None:
        msg["t"] = t
    return msg


def test_arbiter_pushes_etas_and_moves_them_when_a_tenant_arrives_and_leaves():
    core = ArbiterCore()
    out = core.on_message("A", run_msg(1, 1.0), now=0.0)
    assert out == [("A", {"seq": 1, "eta": pytest.approx(1.0)})]
    out = dict(core.on_message("B", run_msg(7, 0.25), now=0.5))
    # A did 0.5 s alone; now both at half speed: B ends at 1.0, then A alone again
    assert out["A"] == {"seq": 1, "eta": pytest.approx(1.5)}
    assert out["B"] == {"seq": 7, "eta": pytest.approx(1.0)}
    assert core.next_wakeup() == pytest.approx(1.0)
    out = core.on_timer(now=1.0003)  # a late timer still completes B at its exact time
    assert ("B", {"seq": 7, "done": pytest.approx(1.0)}) in out
    assert ("A", {"seq": 1, "eta": pytest.approx(1.25)}) in out


def test_arbiter_starts_a_job_when_the_client_sent_it():
    core = ArbiterCore()
    out = core.on_message("A", run_msg(1, 1.0, t=4.9), now=5.0)
    assert out == [("A", {"seq": 1, "eta": pytest.approx(5.9)})]


def test_closed_connection_cancels_its_job_and_others_speed_up():
    core = ArbiterCore()
    core.on_message("A", run_msg(1, 10.0), now=0.0)
    core.on_message("B", run_msg(1, 1.0), now=0.0)
    out = core.on_close("A", now=1.0)  # B did 0.5 s; alone it needs 0.5 s more
    assert out == [("B", {"seq": 1, "eta": pytest.approx(1.5)})]
    assert core.on_timer(1.5) == [("B", {"seq": 1, "done": pytest.approx(1.5)})]
    assert core.next_wakeup() is None


def test_a_new_job_on_a_connection_ends_its_previous_one():
    core = ArbiterCore()
    core.on_message("A", run_msg(1, 10.0), now=0.0)
    out = core.on_message("A", run_msg(2, 1.0), now=1.0)
    assert out == [("A", {"seq": 2, "eta": pytest.approx(2.0)})]
    assert len(core.gpu) == 1


@pytest.mark.parametrize(("msg", "needle"), [
    ({"op": "run", "slice": "s", "work": -1}, "work must be in [0, 3600] seconds, got -1"),
    ({"op": "run", "slice": "s", "work": 1, "mode": "exclusive"}, "mode must be 'mps' or 'timeslice', got 'exclusive'"),
    ({"op": "run", "slice": "s", "work": 1, "mode": "mps", "share": 1.5}, "share must be in (0, 1], got 1.5"),
    ({"op": "run", "work": 1}, "lacks field 'slice'"),
    ({"op": "fly"}, "unknown op 'fly'"),
    ([1, 2], "JSON object"),
])
def test_bad_messages_get_an_error_that_names_the_problem(msg, needle):
    core = ArbiterCore()
    [(conn, reply)] = core.on_message("A", msg, now=0.0)
    assert conn == "A" and needle in reply["error"]
    assert len(core.gpu) == 0


# ------------------------------------------------------------------ batch time, overhead, writer


def test_batch_time_is_p50_by_default_and_a_seeded_tail_reaching_p99():
    prof = fake_profile()
    assert batch_seconds(prof, 8) == pytest.approx(0.024)
    rng = random.Random(3)
    draws = sorted(batch_seconds(prof, 8, rng) for _ in range(20000))
    assert draws[len(draws) // 2 - 200] == pytest.approx(0.024)  # half the batches take p50
    assert draws[int(0.99 * len(draws))] == pytest.approx(0.024 * 1.2, rel=0.01)
    assert draws[-1] > 0.024 * 1.2  # the tail goes past p99, rarely
    a, b = random.Random(5), random.Random(5)
    assert [batch_seconds(prof, 8, a) for _ in range(50)] == [batch_seconds(prof, 8, b) for _ in range(50)]


def test_overhead_grows_with_the_batch_and_never_exceeds_it():
    o = Overhead(fixed_ms=0.5, idle_ms=1.0, ramp_ms=10.0)
    assert o.seconds(0.0002) == pytest.approx(0.0002)
    assert o.seconds(0.005) == pytest.approx(0.001)
    assert o.seconds(0.080) == pytest.approx(0.0015)
    assert Overhead.from_params(o.to_params()) == o
    assert Overhead.none().seconds(0.01) == 0.0


def test_writer_refuses_a_max_batch_beyond_the_profile(tmp_path):
    with pytest.raises(ProfileError, match=r"max_batch \(64\) exceeds profile max \(8\) for m on 1g"):
        write_emulated_model(tmp_path, "m", fake_profile(), slice_id="g/1g@0", max_batch=64)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"mode": "mps", "share": 0.0}, r"share \(0.0\) must be in \(0, 1\]"),
    ({"share": 0.5}, "needs mode 'mps'"),
    ({"mode": "exclusive"}, "mode must be"),
    ({"output": TensorSpec("OUTPUT0", "FP32", (8,))}, "must match"),
    ({"slice_id": ""}, "slice_id must not be empty"),
])
def test_writer_rejects_bad_settings_by_name(tmp_path, kwargs, needle):
    args = {"slice_id": "g/1g@0", **kwargs}
    with pytest.raises(ProfileError, match=needle):
        write_emulated_model(tmp_path, "m", fake_profile(), **args)


def test_writer_puts_settings_in_config_parameters_and_the_profile_beside_the_model(tmp_path):
    mdir = write_emulated_model(tmp_path, "m", fake_profile(), slice_id="g/1g@0", mode="mps", share=0.5,
                                arbiter="/tmp/x.sock", max_batch=4, instance_count=2)
    cfg = (mdir / "config.pbtxt").read_text()
    for needle in ('key: "slice_id" value: { string_value: "g/1g@0" }', 'key: "share" value: { string_value: "0.5" }',
                   'key: "interference" value: { string_value: "0.15" }', "max_batch_size: 4", "count: 2",
                   'key: "arbiter" value: { string_value: "/tmp/x.sock" }'):
        assert needle in cfg
    assert (mdir / "1" / "model.py").exists()
    from profiles.profile import load_profiles

    copied = load_profiles(mdir / "1" / "profile.yaml")[0]
    assert [(p.batch, p.p50, p.p99) for p in copied.points] == [
        (p.batch, pytest.approx(p.p50), pytest.approx(p.p99)) for p in fake_profile().points]
