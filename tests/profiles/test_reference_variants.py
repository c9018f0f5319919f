"""Reference variants: every accuracy has a source, the image-classification family is a real
trade-off, and the YAML on disk is exactly what ``profiles.build_reference`` writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from profiles import ProfileSet
from profiles.build_reference import CV_BATCHES, IMAGENET_A100_80GB, OUT, build
from profiles.profile import load_profiles, profile_to_dict, save_profiles

REFERENCE = ProfileSet.reference()


def test_every_reference_variant_has_an_accuracy_or_says_why_not():
    for p in REFERENCE:
        src = p.provenance.accuracy_source
        if p.accuracy is None:
            # NOTE: an unknown accuracy is explicit, never a silent gap
            assert src.startswith("unknown: "), f"{p.name}: accuracy None without a reason"
        else:
            assert 0 < p.accuracy <= 1 and src and not src.startswith("unknown"), f"{p.name}: {src!r}"


def test_files_on_disk_are_what_the_builder_writes(tmp_path: Path):
    built = build()
    assert sorted(f.name for f in OUT.glob("*.yaml")) == sorted(built), "a reference file the builder does not write"
    for name, profiles in built.items():
        save_profiles(tmp_path / name, profiles)
        # NOTE: byte-equal, so a hand edit of a generated file fails here
        assert (OUT / name).read_text() == (tmp_path / name).read_text(), \
            f"profiles/reference/{name} is stale or hand-edited: python -m profiles.build_reference"
    assert len(REFERENCE) == sum(len(v) for v in built.values())


def test_imagenet_family_is_slower_where_it_is_more_accurate():
    family = REFERENCE.find(model="imagenet")
    by_slice: dict[str, list] = {}
    for p in family:
        by_slice.setdefault(p.slice, []).append(p)
    # the same slices as resnet50, so the two are comparable
    assert set(by_slice) == {p.slice for p in REFERENCE.find(model="resnet50")}
    for ps in by_slice.values():
        ps.sort(key=lambda p: p.accuracy)
        assert [p.variant for p in ps] == ["imagenet-resnet50", "imagenet-vit-b16"]
        for small, big in zip(ps, ps[1:], strict=False):
            for b in range(1, 257):
                assert big.latency(b, "p50") > small.latency(b, "p50"), f"{big.name} not slower at batch {b}"


@pytest.mark.parametrize("variant", sorted(IMAGENET_A100_80GB))
def test_imagenet_fit_stays_near_every_measured_point(variant: str):
    for sl, (ms, _) in IMAGENET_A100_80GB[variant].items():
        p = REFERENCE.get(variant, "A100-80GB", sl)
        assert p.provenance.measured_batches == CV_BATCHES
        for b, t in zip(CV_BATCHES, ms, strict=True):
            assert p.latency(b, "p50") * 1e3 == pytest.approx(t, rel=0.16), f"{p.name} at batch {b}"


def test_accuracy_source_round_trips_and_old_files_still_load(tmp_path: Path):
    p = REFERENCE.get("imagenet-vit-b16", "A100-80GB", "1g.10gb")
    save_profiles(tmp_path / "p.yaml", [p])
    assert load_profiles(tmp_path / "p.yaml") == [p]
    doc = profile_to_dict(p)
    del doc["spec"]["provenance"]["accuracy_source"]
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(doc))
    (old,) = load_profiles(tmp_path / "old.yaml")
    assert old.provenance.accuracy_source == "" and old.accuracy == p.accuracy
