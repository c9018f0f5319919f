"""Sweeps over open-loop rates: a fixed list (``--rate-range a:b:step``), and a search for the
highest rate that holds a target SLO attainment.

Each search trial measures consecutive windows (perf_analyzer's measurement windows) and is
*stable* when the last ``STABLE_WINDOWS`` windows agree on the fraction of the offered load
answered and on median latency within ``stability`` (a fraction of their mean; latency also
within ``STABLE_SLACK_MS``), as perf_analyzer's ``-s`` does for throughput and latency. A trial passes when
it is stable and both the whole run and every one of those windows meet the target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadgen.run import LoadResult, run_load
from loadgen.spec import LoadSpec

STABLE_WINDOWS = 3
STABLE_SLACK_MS = 1.0  # latency differences below this are noise, not instability


def parse_range(text: str) -> list[float]:
    """``"100:500:100"`` -> [100, 200, 300, 400, 500]; ``"100:500"`` steps by 100 too."""
    parts = text.split(":")
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"bad range {text!r}: want START:END[:STEP] numbers") from None
    if len(nums) not in (2, 3):
        raise ValueError(f"bad range {text!r}: want START:END[:STEP]")
    start, end = nums[0], nums[1]
    step = nums[2] if len(nums) == 3 else (end - start if end > start else 1.0)
    if start <= 0 or end < start or step <= 0:
        raise ValueError(f"bad range {text!r}: need 0 < START <= END and STEP > 0")
    n = int(np.floor((end - start) / step + 1e-9)) + 1
    if n > 1000:
        raise ValueError(f"range {text!r} has {n} points; at most 1000")
    return [round(start + i * step, 9) for i in range(n)]


def stability(summary: dict[str, Any], tolerance: float) -> bool:
    """True when the last STABLE_WINDOWS full windows agree within ``tolerance``."""
    tl = [w for w in summary["timeline"] if w["offered_rps"] > 0]
    if len(tl) < STABLE_WINDOWS:
        return False
    last = tl[-STABLE_WINDOWS:]
    # NOTE: open-loop arrivals vary per window by design (Poisson, gamma), so throughput is
    # judged as the fraction of the offered load answered, not in requests per second
    served = [w["throughput_rps"] / w["offered_rps"] for w in last]
    p50 = [w["p50_ms"] for w in last]
    if any(v is None for v in p50):
        return False
    for vals, slack in ((served, 0.0), (p50, STABLE_SLACK_MS)):
        mean = float(np.mean(vals))
        if max(abs(v - mean) for v in vals) > tolerance * mean + slack:
            return False
    return True


def window_attainments(summary: dict[str, Any]) -> list[float]:
    tl = [w for w in summary["timeline"] if w["offered_rps"] > 0]
    return [w["attainment"] or 0.0 for w in tl[-STABLE_WINDOWS:]]


async def sweep_rates(
    spec: LoadSpec, rates: list[float], on_result: Callable[[LoadResult], None] | None = None
) -> list[LoadResult]:
    out = []
    for r in rates:
        res = await run_load(spec.model_copy(update={"rate": r}))
        res.summary["stable"] = stability(res.summary, 0.1)
        out.append(res)
        if on_result:
            on_result(res)
    return out


@dataclass
class SearchResult:
    best_rate: float | None  # highest passing rate found, None if even the lowest failed
    target: float
    trials: list[dict[str, Any]]  # summaries, each with "rate", "stable", "passed"


async def find_max_rate(
    spec: LoadSpec,
    lo: float,
    hi: float,
    target: float = 0.99,
    window_s: float = 5.0,
    tolerance: float = 0.1,
    max_windows: int = 10,
    precision: float = 0.05,
    on_trial: Callable[[dict[str, Any]], None] | None = None,
) -> SearchResult:
    """Bisect [lo, hi] for the highest rate whose attainment holds ``target``, to within
    ``precision`` (a fraction of the rate)."""
    if not 0 < lo <= hi:
        raise ValueError(f"need 0 < lo ({lo}) <= hi ({hi})")
    if not 0 < target <= 1:
        raise ValueError(f"target attainment must be in (0, 1], got {target}")
    trials: list[dict[str, Any]] = []

    async def trial(rate: float) -> bool:
        windows = STABLE_WINDOWS
        while True:
            s = (
                await run_load(
                    spec.model_copy(
                        update={
                            "rate": rate,
                            "window_s": window_s,
                            "duration_s": windows * window_s,
                            "requests": None,
                        }
                    )
                )
            ).summary
            stable = stability(s, tolerance)
            if stable or windows >= max_windows:
                break
            windows = min(max_windows, windows * 2)
        att = s["attainment"] or 0.0
        passed = stable and att >= target and min(window_attainments(s), default=0) >= target
        s.update(rate=rate, stable=stable, passed=passed)
        trials.append(s)
        if on_trial:
            on_trial(s)
        return passed

    if not await trial(lo):
        return SearchResult(None, target, trials)
    if await trial(hi):
        return SearchResult(hi, target, trials)
    good, bad = lo, hi
    while (bad - good) > precision * good:
        mid = (good + bad) / 2
        if await trial(mid):
            good = mid
        else:
            bad = mid
    return SearchResult(good, target, trials)
