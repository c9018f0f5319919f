"""Generative load statistics from per-request :class:`~loadgen.llm.driver.Outcome`s.

- TTFT, TPOT and end-to-end time (ms, from the scheduled send) over the requests that streamed
  to the end, p50 / p90 / p99 and mean; every inter-token gap (ITL) in an HDR histogram.
- Token throughput (prompt tokens of answered requests, and streamed tokens) and request
  throughput, per second of the run's wall time (first scheduled send to last answer).
- Goodput as DistServe defines it: requests per second that meet *both* the TTFT and the TPOT
  SLO; attainment of each SLO and of both, over the requests offered. A refused or failed
  request meets neither. An SLO not given is met by every answered request.
- Send lag, errors by kind, and the prefix-cache share of prompt tokens when the server
  reports ``cached_tokens``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from loadgen.llm.driver import Outcome
from loadgen.stats import new_latency_histogram, percentile, record_many

PERCENTILES = (50, 90, 99)


def dist_ms(values_s: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """p50 / p90 / p99 / mean / max of seconds, in ms (None for no values)."""
    v = np.asarray(values_s, dtype=float) * 1e3
    if not len(v):
        return {**{f"p{p}": None for p in PERCENTILES}, "mean": None, "max": None}
    out: dict[str, float | None] = {f"p{p}": float(np.percentile(v, p)) for p in PERCENTILES}
    out["mean"] = float(v.mean())
    out["max"] = float(v.max())
    return out


def itl_ms(outcomes: Sequence[Outcome]) -> dict[str, float | None]:
    """Percentiles of every gap between streamed tokens, from an HDR histogram (µs, 3 digits)."""
    h = new_latency_histogram()
    for o in outcomes:
        if o.itl:
            record_many(h, np.rint(np.asarray(o.itl) * 1e6))
    if not h.get_total_count():
        return {**{f"p{p}": None for p in PERCENTILES}, "mean": None, "max": None}
    out: dict[str, float | None] = {f"p{p}": percentile(h, p) / 1e3 for p in PERCENTILES}
    out["mean"] = h.get_mean_value() / 1e3
    out["max"] = h.get_max_value() / 1e3
    return out


def error_kind(error: str) -> str:
    """An error's kind for counting: ``HTTP 429``, ``stream error``, an exception's name."""
    return error.split(":", 1)[0]


def meets(o: Outcome, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> tuple[bool, bool]:
    """Whether an outcome meets the TTFT SLO and the TPOT SLO (a failed request meets neither)."""
    if not o.ok or o.ttft is None:
        return False, False
    tpot = o.tpot or 0.0
    return (slo_ttft_ms is None or o.ttft * 1e3 <= slo_ttft_ms,
            slo_tpot_ms is None or tpot * 1e3 <= slo_tpot_ms)


def summarize(outcomes: Sequence[Outcome], elapsed_s: float, slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None) -> dict[str, Any]:
    """The summary of one run (``elapsed_s``: its wall time, first scheduled send to last answer)."""
    n = len(outcomes)
    ok = [o for o in outcomes if o.ok]
    met = [meets(o, slo_ttft_ms, slo_tpot_ms) for o in outcomes]
    good_ttft = sum(a for a, _ in met)
    good_tpot = sum(b for _, b in met)
    good = sum(a and b for a, b in met)
    span = max((o.scheduled for o in outcomes), default=0.0)
    per_s = 1.0 / elapsed_s if elapsed_s > 0 else 0.0
    cached = [o for o in ok if o.cached_tokens is not None]
    has_slo = slo_ttft_ms is not None or slo_tpot_ms is not None
    return {
        "offered": n,
        "ok": len(ok),
        "errors": dict(sorted(Counter(error_kind(o.error) for o in outcomes if o.error).items())),
        "error_count": n - len(ok),
        "elapsed_s": elapsed_s,
        "offered_rps": n / span if span > 0 else None,
        "throughput_rps": len(ok) * per_s,
        "input_tokens_per_s": sum(o.input_tokens for o in ok) * per_s,
        "output_tokens_per_s": sum(o.output_tokens for o in ok) * per_s,
        "output_tokens_short": sum(1 for o in ok if o.output_tokens != o.wanted_tokens),
        "slo_ttft_ms": slo_ttft_ms,
        "slo_tpot_ms": slo_tpot_ms,
        "good": good,
        "attainment_ttft": good_ttft / n if n and slo_ttft_ms is not None else None,
        "attainment_tpot": good_tpot / n if n and slo_tpot_ms is not None else None,
        "attainment": good / n if n and has_slo else None,
        "goodput_rps": good * per_s if has_slo else None,
        "ttft_ms": dist_ms([o.ttft for o in ok if o.ttft is not None]),
        "tpot_ms": dist_ms([o.tpot for o in ok if o.tpot is not None and o.output_tokens > 1]),
        "itl_ms": itl_ms(ok),
        "e2e_ms": dist_ms([o.e2e for o in ok if o.e2e is not None]),
        "send_lag_ms": dist_ms([o.send_lag for o in outcomes]),
        "prefix_cache_hit_rate": (sum(o.cached_tokens or 0 for o in cached) / sum(o.input_tokens for o in cached)
                                  if cached else None),
    }


def per_request(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Every request's numbers (ms), for a JSON report."""
    rows = []
    for o in outcomes:
        rows.append({
            "i": o.index, "scheduled_s": round(o.scheduled, 6), "send_lag_ms": round(o.send_lag * 1e3, 3),
            "status": o.status, "error": o.error, "input_tokens": o.input_tokens, "output_tokens": o.output_tokens,
            "ttft_ms": None if o.ttft is None else round(o.ttft * 1e3, 3),
            "tpot_ms": None if o.tpot is None else round(o.tpot * 1e3, 3),
            "e2e_ms": None if o.e2e is None else round(o.e2e * 1e3, 3),
            "cached_tokens": o.cached_tokens,
        })
    return rows
