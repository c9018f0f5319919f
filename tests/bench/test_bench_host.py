"""The host probe that annotates live benchmark points."""

from __future__ import annotations

from bench.host import cpu_times, steal_share


def test_steal_share_is_stolen_ticks_over_all_ticks() -> None:
    before = (100, 0, 50, 800, 0, 0, 0, 50, 7, 0)
    after = (160, 0, 70, 900, 0, 0, 0, 70, 9, 0)  # +60 user +20 system +100 idle +20 steal
    assert steal_share(before, after) == 20 / 200


def test_steal_share_without_readings_is_unknown() -> None:
    assert steal_share(None, (1,) * 10) is None
    assert steal_share((1,) * 10, (1,) * 10) is None  # no time passed


def test_cpu_times_reads_this_host() -> None:
    t = cpu_times()
    assert t is None or (len(t) >= 8 and all(x >= 0 for x in t))
