"""The GPU catalogue: published values, where each table comes from, and the GPUs added."""

from __future__ import annotations

import pytest

from profiles.catalogue import GPUS, HOST, gpu_model, layouts


@pytest.mark.parametrize(("gpu", "profile", "gib"), [
    ("H200-141GB", "1g.35gb", 32.25), ("H200-141GB", "2g.35gb", 32.25),
    ("H200-141GB", "3g.71gb", 69.5), ("H200-141GB", "4g.71gb", 69.5),
    ("A100-80GB", "1g.10gb", 9.5), ("H100-NVL", "1g.12gb", 10.75), ("H100-NVL", "2g.24gb", 21.62),
])
def test_published_mig_memory(gpu: str, profile: str, gib: float) -> None:
    p = gpu_model(gpu).profile(profile)
    assert p.memory_gb == gib
    assert not p.derived


def test_every_gpu_names_its_public_source_and_no_file_outside_the_repository() -> None:
    for g in GPUS.values():
        assert g.source, g.name
        assert "gpu-facts" not in g.source and "shared/" not in g.source


def test_b200_and_h100_nvl_have_the_seven_slice_geometry() -> None:
    # NOTE: same placement table as the A100: 19 maximal layouts without the double-memory 1g
    for name in ("B200", "H100-NVL"):
        assert len(layouts(name)) == len(layouts("A100-80GB")) == 19
    assert [p.name for p in gpu_model("B200").profiles] == [
        "1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"]
    assert all(p.derived for p in gpu_model("B200").profiles)


def test_host_pseudo_gpu_has_one_whole_slice() -> None:
    assert gpu_model(HOST).slice_names() == ("gpu",)
