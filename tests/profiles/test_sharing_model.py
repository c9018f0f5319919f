"""The MPS sharing model against published measurements, and its use by the emulator physics."""

from __future__ import annotations

import pytest

from profiles.derive import with_derived
from profiles.emulator.arbiter import parse_job
from profiles.emulator.physics import SharedGpu
from profiles.profile import LatencyPoint, Profile, ProfileError, ProfileSet
from profiles.sharing import (
    CHECK_TOLERANCE,
    FIXED,
    KNEE,
    ActiveJob,
    check_published,
    fit_constants,
    load_published,
    mps_latency,
    mps_terms,
    progress_rates,
)


def curve(*ms: tuple[int, float], interference: float = 0.15) -> Profile:
    return Profile("m", "m", "A100-80GB", "gpu", ms[-1][0],
                   tuple(LatencyPoint(b, t / 1e3, t / 1e3) for b, t in ms), mps_interference=interference)


# a launch-bound small batch and an SM-bound large one: the shape MIGPerf measures
RESNETISH = curve((1, 5.0), (64, 23.0), (256, 83.0))


def test_fit_and_check_points_are_disjoint():
    pts = load_published()
    fit = {(p.series, p.slice, p.batch) for p in pts if p.role == "fit"}
    check = {(p.series, p.slice, p.batch) for p in pts if p.role == "check"}
    assert fit and check and not fit & check
    # NOTE: a series is fitted or checked as a whole: no curve leaks from one side to the other
    assert not {p.series for p in pts if p.role == "fit"} & {p.series for p in pts if p.role == "check"}


def test_constants_are_what_the_fit_points_give():
    assert fit_constants(load_published()) == (FIXED, KNEE)


def _worst(preds):
    w = max(preds, key=lambda p: abs(p.error))
    return (f"{w.point.series} {w.point.slice} batch {w.point.batch}: predicted {w.predicted_ms:.2f} ms, "
            f"published {w.point.published_ms} ms ({w.error:+.1%})")


def _known_gap(p) -> bool:
    # TensorRT AlexNet at batch 1 is weight reads, which slow with fewer SMs; the model keeps
    # most of a curve's intercept fixed (right for the PyTorch curves, launch-bound at batch 1)
    return p.point.series == "igniter-alexnet-v100" and p.point.batch == 1


def test_checked_points_within_tolerance_but_the_known_gap():
    preds = check_published()
    assert len(preds) >= 140
    # MPS clients, MIG slices and time-sliced neighbours are all checked
    assert {(p.point.mode, p.point.memory_share == 1.0) for p in preds} == {
        ("mps", True), ("mps", False), ("timeslice", True)}
    rest = [p for p in preds if not _known_gap(p)]
    assert len(rest) >= len(preds) - 2
    assert all(abs(p.error) <= CHECK_TOLERANCE for p in rest), _worst(rest)


@pytest.mark.xfail(strict=True, reason="AlexNet (TensorRT) at batch 1 under MPS: -48% at 10% threads, -16% at 50%")
def test_every_checked_point_within_tolerance():
    preds = check_published()
    assert all(abs(p.error) <= CHECK_TOLERANCE for p in preds), _worst(preds)


def test_the_old_flat_rule_fails_the_same_check():
    # NOTE: the check can fail: latency / share misses most published points by far more
    old = [p.point.baseline.latency(p.point.batch, "p50") * 1e3 / p.point.share / p.point.published_ms - 1
           for p in check_published()]
    assert sum(abs(e) > CHECK_TOLERANCE for e in old) > len(old) / 2


def test_resnet50_on_an_eighth_of_an_a100_is_near_the_1g_slice_not_47ms():
    ps = with_derived(ProfileSet.reference(), gpus=("A100-80GB",), variants=["resnet50"])
    whole = ps.get("resnet50", "A100-80GB", "gpu")
    shared = mps_latency(whole, 1, 0.125, busy_neighbours=True)
    old = whole.latency(1) / 0.125 * (1 + whole.mps_interference)
    assert old == pytest.approx(0.0479, abs=5e-4)
    # MIGPerf measures 7.86 ms on 1g.10gb (14 of 108 SMs, 1/8 of memory)
    assert shared == pytest.approx(7.86e-3, rel=0.15)


def test_full_share_is_the_profile_itself():
    for b in (1, 8, 64, 256):
        assert mps_latency(RESNETISH, b, 1.0, busy_neighbours=False) == pytest.approx(RESNETISH.latency(b))


def test_small_batches_slow_less_than_large_ones_and_never_beyond_one_over_share():
    for share in (0.5, 0.25, 0.125):
        ratios = [mps_latency(RESNETISH, b, share, False) / RESNETISH.latency(b) for b in (1, 16, 64, 256)]
        assert ratios == sorted(ratios)
        assert 1.0 <= ratios[0] < ratios[-1] <= 1 / share + 1e-9


def test_unknown_shape_keeps_the_proportional_rule():
    # a job whose batch shape is not given progresses at its share (the emulator's default)
    assert progress_rates([ActiveJob("s", "x", "mps", 0.25)]) == [pytest.approx(0.25)]


def test_memory_bound_neighbour_slows_more_than_a_compute_bound_one():
    me = ActiveJob("s", "x", "mps", 0.5, 0.15)
    light = progress_rates([me, ActiveJob("s", "y", "mps", 0.5, 0.02)])[0]
    heavy = progress_rates([me, ActiveJob("s", "y", "mps", 0.5, 0.30)])[0]
    same = progress_rates([me, ActiveJob("s", "y", "mps", 0.5, 0.15)])[0]
    assert heavy < same < light
    assert same == pytest.approx(0.5 / 1.15)


def test_emulator_physics_runs_a_shaped_batch_as_the_model_predicts():
    gpu = SharedGpu()
    share = 0.25
    job = ActiveJob("s", "x", "mps", share, 0.15, mps_terms(RESNETISH, 1, "p50"))
    gpu.start(1, job, RESNETISH.latency(1, "p50"), now=0.0)
    (done,) = gpu.advance(10.0)
    assert done.finished == pytest.approx(mps_latency(RESNETISH, 1, share, False, "p50"))


def test_arbiter_refuses_bad_terms_with_one_line():
    with pytest.raises(ValueError, match="terms must be 3 numbers"):
        parse_job({"slice": "s", "work": 0.01, "mode": "mps", "share": 0.5, "terms": [1, 2]})
    job, _, _ = parse_job({"slice": "s", "work": 0.01, "mode": "mps", "share": 0.5, "terms": [0.1, 0.2, 0.7]})
    assert job.terms == (0.1, 0.2, 0.7)


def test_bad_measurements_file_is_one_line(tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("series: [{id: x}]\n")
    with pytest.raises(ProfileError) as e:
        load_published(bad)
    assert "\n" not in str(e.value) and "series.0" in str(e.value)
