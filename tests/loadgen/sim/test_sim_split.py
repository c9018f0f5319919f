"""Splitting a schedule over groups that share nothing: each group gets exactly its models'
arrivals, in time order, with their model indices."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen.arrivals import Schedule
from loadgen.sim.run import shares, split


def _expected(sched: Schedule, group: list[str]) -> tuple[np.ndarray, np.ndarray]:
    keep = np.isin(sched.model_idx, [sched.models.index(m) for m in group if m in sched.models])
    return sched.times[keep], sched.model_idx[keep]


@pytest.mark.parametrize("n_models", [5, 40_000])  # 16-bit keys (radix sort), and too many for them
def test_each_group_gets_its_models_arrivals_in_time_order(n_models: int) -> None:
    rng = np.random.default_rng(3)
    models = tuple(f"m{i}" for i in range(n_models))
    used = [0, 1, 2, 3, n_models - 1]
    times = np.sort(rng.random(2_000)).round(3)  # rounded: ties in time across models
    idx = rng.choice(used, size=len(times)).astype(np.int32)
    sched = Schedule(times, idx, models)
    groups = [["m1"], [models[-1], "m0"], ["m3", "m2"], ["absent"]]
    parts = split(sched, groups)
    assert len(parts) == len(groups)
    for g, part in zip(groups, parts, strict=True):
        t, i = _expected(sched, g)
        assert np.array_equal(part.times, t) and np.array_equal(part.model_idx, i), g
        assert part.models == models
    assert sum(len(p) for p in parts) == len(sched)


def test_shares_deal_sizes_into_bins_of_about_equal_total() -> None:
    sizes = [50, 10, 40, 30, 20, 20]
    bins = shares(sizes, 2)
    assert sorted(i for b in bins for i in b) == list(range(len(sizes)))
    totals = [sum(sizes[i] for i in b) for b in bins]
    assert max(totals) - min(totals) <= min(sizes)
