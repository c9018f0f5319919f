"""The profile model: interpolation, reference data, and clear errors for bad YAML."""

from __future__ import annotations

import pytest

from profiles import LatencyPoint, Profile, ProfileError, ProfileSet, Provenance
from profiles.profile import load_profiles, save_profiles


def fake_profile(points: dict[int, float], max_batch: int = 32) -> Profile:
    return Profile(
        model="m", variant="m", gpu="G", slice="1g", max_batch=max_batch,
        points=tuple(LatencyPoint(b, ms / 1e3, ms * 1.1 / 1e3) for b, ms in sorted(points.items())),
        provenance=Provenance("test"),
    )


def test_interpolates_between_measured_batches_and_extrapolates_beyond():
    p = fake_profile({1: 10.0, 4: 16.0, 8: 24.0}, max_batch=16)
    assert p.latency(2, "p50") == pytest.approx(0.012)
    assert p.latency(4, "p50") == pytest.approx(0.016)
    assert p.latency(16, "p50") == pytest.approx(0.040)  # slope of the last segment
    assert p.latency(2, "p99") == pytest.approx(0.0132)


def test_batch_outside_range_is_an_error_naming_the_profile():
    p = fake_profile({1: 10.0, 8: 20.0}, max_batch=8)
    with pytest.raises(ProfileError, match=r"batch \(9\) exceeds max_batch \(8\)"):
        p.latency(9)


def test_best_batch_within_budget():
    p = fake_profile({1: 10.0, 32: 72.0})  # 2 ms per extra sample
    assert p.best_batch_within(0.030, "p50") == 11
    assert p.best_batch_within(0.005, "p50") == 0


def test_reference_resnet50_matches_the_published_fit():
    p = ProfileSet.reference().get("resnet50", "A100-80GB", "1g.10gb")
    for b in (1, 5, 17, 32, 100, 256):
        assert p.latency(b, "p50") == pytest.approx(max(7.86, 8.4 + 2.346 * b) / 1e3, rel=1e-6)
    assert p.provenance.measured_batches == (1, 64, 256)


def test_round_trip_yaml(tmp_path):
    p = fake_profile({1: 10.0, 8: 20.0})
    save_profiles(tmp_path / "p.yaml", [p])
    (q,) = load_profiles(tmp_path / "p.yaml")
    assert q.latency(5, "p99") == pytest.approx(p.latency(5, "p99"))


def test_malformed_yaml_names_the_field_and_the_value(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(
        "apiVersion: headrace.dev/v1\nkind: Profile\nspec:\n  model: m\n  variant: m\n  gpu: G\n"
        "  slice: 1g\n  max_batch: -3\n  latency_ms: [{batch: 1, p50: 5}]\n  provenance: {source: x}\n"
    )
    with pytest.raises(ProfileError, match=r"spec\.max_batch.*-3"):
        load_profiles(f)


def test_unknown_profile_lists_known_ones():
    with pytest.raises(ProfileError, match="known:.*resnet50@A100-80GB/1g.10gb"):
        ProfileSet.reference().get("resnet51", "A100-80GB", "1g.10gb")


def test_find_by_index_equals_a_scan_for_every_filter():
    ps = ProfileSet.reference()
    every = list(ps)
    models = sorted({p.model for p in every}) + ["nope", None]
    variants = sorted({p.variant for p in every})[:4] + ["nope", None]
    gpus = sorted({p.gpu for p in every}) + [None]
    slices = sorted({p.slice for p in every})[:3] + [None]
    for m in models:
        for v in variants:
            for g in gpus:
                for s in slices:
                    scan = [p for p in every if (m is None or p.model == m) and (v is None or p.variant == v)
                            and (g is None or p.gpu == g) and (s is None or p.slice == s)]
                    assert ps.find(model=m, variant=v, gpu=g, slice=s) == scan, (m, v, g, s)


@pytest.mark.parametrize("text", [
    "a: 1\nb: [1, 2.5, true, null, ~, 2026-11-28, 0x1f, 1e3, .inf, -.nan, '3', \"x\"]\n",
    "---\n---\nkey: value\n...\n--- [1, {a: b}]\n",
    "base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\n",
    "a: !!str 1\nb: !!float 2\n",
    "? [1, 2]\n: pair\n",
    "a: 1\na: 2\n",
    "{}\n",
    "- - - deep\n  - x\n- {k: [], j: {}}\n",
])
def test_profile_yaml_reads_as_pyyaml_safe_load_does(text):
    """The profile loader's fast path over libyaml's events gives PyYAML's documents, or its
    error (its own loader takes anchors, aliases, tags, merge keys and container keys)."""
    import yaml

    from profiles.profile import _yaml_documents

    def outcome(load):  # noqa: ANN001, ANN202
        try:
            return repr(load(text))  # repr: nan equals itself
        except yaml.YAMLError as e:
            return type(e).__name__

    assert outcome(_yaml_documents) == outcome(lambda t: list(yaml.safe_load_all(t)))


def test_profile_yaml_that_is_not_yaml_is_one_clear_error(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("a: [1, 2\nb: }\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profiles(f)
