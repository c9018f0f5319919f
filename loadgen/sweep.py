"""Sweeps over open-loop rates: a fixed list (``--rate-range a:b:step``), and a search for the
highest rate that holds a target SLO attainment (``--find-max-rate``).

Each search trial measures consecutive windows (perf_analyzer's measurement windows) and is
*stable* when the last ``STABLE_WINDOWS`` windows agree on the fraction of the offered load
answered and on median latency within ``stability`` (a fraction of their mean; latency also
within ``STABLE_SLACK_MS``), as perf_analyzer's ``-s`` does for throughput and latency.

A trial passes when no window falls more than ``window_tolerance`` below the target, the
whole run meets it, and it is stable; otherwise its *reason* says which test failed (the
window, its attainment and p99). A rate passes when most of its ``trials`` repeated trials
pass (it stops as soon as the majority is decided), so one bad window on a busy host fails
one trial, not the rate, while a rate past the knee fails every trial. The search bisects on
rate verdicts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
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


WINDOW_TOLERANCE = 0.05  # a window may fall this far (a fraction) below the target


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str  # "ok", or the first test that failed, with the numbers


def judge(
    summary: dict[str, Any], target: float, window_tolerance: float, stable: bool
) -> Verdict:
    """One trial against the target: every measured window (within ``window_tolerance`` of
    the target), the overall attainment and stability, in that order."""
    att = summary["attainment"]
    p99 = summary["latency_ms"]["p99"]
    p99s = "-" if p99 is None else f"{p99:.1f} ms"
    floor = target - window_tolerance
    width = summary.get("window_s") or _width(summary["timeline"])
    for w in summary["timeline"]:
        if w["offered_rps"] > 0 and (w["attainment"] or 0.0) < floor:
            wp = "-" if w["p99_ms"] is None else f"{w['p99_ms']:.1f} ms"
            return Verdict(
                False,
                f"window {w['t']:g}-{w['t'] + width:g} s at {w['attainment'] or 0:.2%} < "
                f"{floor:.2%} (p99 {wp})",
            )
    if att is None or att < target:
        a = "n/a" if att is None else f"{att:.2%}"
        return Verdict(False, f"attainment {a} < {target:.2%} (p99 {p99s})")
    if not stable:
        return Verdict(False, f"unstable: the last {STABLE_WINDOWS} windows disagree")
    return Verdict(True, "ok")


def _width(timeline: list[dict[str, Any]]) -> float:
    return timeline[1]["t"] - timeline[0]["t"] if len(timeline) > 1 else 0.0


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


Runner = Callable[[LoadSpec], Awaitable[LoadResult]]


@dataclass
class RateVerdict:
    """Every trial at one rate and the majority's verdict."""

    rate: float
    trials: list[dict[str, Any]]  # summaries, each with "trial", "passed", "reason"
    passed: bool

    def row(self) -> dict[str, Any]:
        """For the JSON: the verdict, how many trials passed, and the failing trials' reasons."""
        atts = [t["attainment"] or 0.0 for t in self.trials]
        p99s = [t["latency_ms"]["p99"] for t in self.trials if t["latency_ms"]["p99"] is not None]
        ok = sum(t["passed"] for t in self.trials)
        fails = [f"trial {t['trial']}: {t['reason']}" for t in self.trials if not t["passed"]]
        return {
            "rate": self.rate,
            "passed": self.passed,
            "trials": len(self.trials),
            "trials_passed": ok,
            "attainment_median": float(np.median(atts)),
            "p99_ms_max": max(p99s) if p99s else None,
            "reason": f"{ok}/{len(self.trials)} trials passed" + (f"; {'; '.join(fails)}" if fails else ""),
        }


@dataclass
class SearchResult:
    best_rate: float | None  # highest passing rate found, None if even the lowest failed
    target: float
    trials: list[dict[str, Any]]  # summaries, each with "rate", "trial", "stable", "passed", "reason"
    rates: list[RateVerdict] = field(default_factory=list)  # in the order tried


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
    trials: int = 3,
    window_tolerance: float = WINDOW_TOLERANCE,
    runner: Runner = run_load,
) -> SearchResult:
    """Bisect [lo, hi] for the highest rate where most of ``trials`` trials hold ``target``,
    to within ``precision`` (a fraction of the rate). ``runner`` runs one trial (default
    :func:`~loadgen.run.run_load`)."""
    if not 0 < lo <= hi:
        raise ValueError(f"need 0 < lo ({lo}) <= hi ({hi})")
    if not 0 < target <= 1:
        raise ValueError(f"target attainment must be in (0, 1], got {target}")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if not 0 <= window_tolerance < 1:
        raise ValueError(f"window tolerance must be in [0, 1), got {window_tolerance}")
    out = SearchResult(None, target, [])
    need = trials // 2 + 1  # a majority

    async def one(rate: float, k: int) -> bool:
        windows = STABLE_WINDOWS
        while True:
            update = {"rate": rate, "window_s": window_s, "duration_s": windows * window_s,
                      "requests": None, "seed": spec.seed + k}  # fmt: skip
            s = (await runner(spec.model_copy(update=update))).summary
            stable = stability(s, tolerance)
            if stable or windows >= max_windows:
                break
            windows = min(max_windows, windows * 2)
        v = judge(s, target, window_tolerance, stable)
        s.update(rate=rate, trial=k + 1, stable=stable, passed=v.passed, reason=v.reason)
        out.trials.append(s)
        if on_trial:
            on_trial(s)
        return v.passed

    async def rate_passes(rate: float) -> bool:
        done: list[dict[str, Any]] = []
        ok = 0
        for k in range(trials):
            ok += await one(rate, k)
            done.append(out.trials[-1])
            if ok >= need or (k + 1 - ok) > trials - need:
                break
        out.rates.append(RateVerdict(rate, done, ok >= need))
        return ok >= need

    if not await rate_passes(lo):
        return out
    if await rate_passes(hi):
        out.best_rate = hi
        return out
    good, bad = lo, hi
    while (bad - good) > precision * good:
        mid = (good + bad) / 2
        if await rate_passes(mid):
            good = mid
        else:
            bad = mid
    out.best_rate = good
    return out
