"""The load report's variant mix: each variant's share of a model's answers and their mean
accuracy, from the accuracies the profiles record."""

from __future__ import annotations

import pytest

from loadgen.accuracy import accuracy_of, variant_mix
from loadgen.report import table
from loadgen.stats import OK, Recorder


def test_shares_and_mean_accuracy_of_known_variants():
    per_variant = [{"model": "imagenet", "variant": "imagenet-vit-b16", "ok": 30},
                   {"model": "imagenet", "variant": "imagenet-resnet50", "ok": 10},
                   {"model": "other", "variant": "mystery", "ok": 5},
                   {"model": "other", "variant": "-", "ok": 7}]
    mix = variant_mix(per_variant)
    vit, r50 = accuracy_of("imagenet-vit-b16"), accuracy_of("imagenet-resnet50")
    assert vit is not None and r50 is not None and vit > r50
    assert mix["imagenet"]["shares"] == {"imagenet-resnet50": 0.25, "imagenet-vit-b16": 0.75}
    assert mix["imagenet"]["mean_accuracy"] == pytest.approx(0.75 * vit + 0.25 * r50)
    assert mix["other"] == {"shares": {"mystery": 1.0}, "mean_accuracy": None}  # unknown: no mean


def test_the_report_shows_the_mix():
    rec = Recorder()
    for i in range(4):
        rec.record("digits", "digits-large" if i % 2 else "digits-small", i * 0.1, 0.01, 0.1, OK)
    s = rec.summary(1.0, 0.1)
    assert set(s["variants"]["digits"]["shares"]) == {"digits-large", "digits-small"}
    caption = str(table({**s, "target": "t", "duration_s": 1.0, "rate": 4.0, "arrival": "poisson"}).caption)
    assert "digits-large 50%" in caption and "mean accuracy" in caption
