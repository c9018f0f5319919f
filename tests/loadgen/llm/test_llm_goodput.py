"""Goodput as DistServe defines it, against hand-computed cases: requests per second meeting
both the TTFT and the TPOT SLO, attainment of each and of both, a refused request a miss."""

from __future__ import annotations

import pytest

from loadgen.llm.driver import Outcome
from loadgen.llm.stats import meets, summarize


def answered(i: int, ttft_ms: float, tpot_ms: float, tokens: int = 11, prompt: int = 100) -> Outcome:
    """A request that streamed ``tokens`` tokens, the first at ``ttft_ms``, then one every ``tpot_ms``."""
    o = Outcome(i, scheduled=float(i), input_tokens=prompt, wanted_tokens=tokens, status=200,
                ttft=ttft_ms / 1e3, output_tokens=tokens, itl=[tpot_ms / 1e3] * (tokens - 1))
    o.e2e = o.ttft + (tokens - 1) * tpot_ms / 1e3
    return o


def refused(i: int) -> Outcome:
    return Outcome(i, scheduled=float(i), input_tokens=100, wanted_tokens=11, status=429, error="HTTP 429: busy",
                   e2e=0.002)


def test_tpot_is_the_time_after_the_first_token_over_the_tokens_after_it() -> None:
    o = answered(0, ttft_ms=200, tpot_ms=30)
    assert o.tpot == pytest.approx(0.030)
    assert answered(1, ttft_ms=200, tpot_ms=30, tokens=1).tpot == 0.0


def test_goodput_counts_requests_meeting_both_slos_per_second() -> None:
    outcomes = [
        answered(0, 100, 20),  # both
        answered(1, 100, 60),  # TTFT only
        answered(2, 900, 20),  # TPOT only
        answered(3, 900, 60),  # neither
        answered(4, 499, 49),  # both
        refused(5),            # NOTE: a refused request meets neither SLO
    ]
    s = summarize(outcomes, elapsed_s=4.0, slo_ttft_ms=500, slo_tpot_ms=50)
    assert (s["offered"], s["ok"], s["good"], s["error_count"]) == (6, 5, 2, 1)
    assert s["errors"] == {"HTTP 429": 1}
    assert s["attainment_ttft"] == pytest.approx(3 / 6)
    assert s["attainment_tpot"] == pytest.approx(3 / 6)
    assert s["attainment"] == pytest.approx(2 / 6)
    assert s["goodput_rps"] == pytest.approx(2 / 4.0)
    assert s["throughput_rps"] == pytest.approx(5 / 4.0)
    assert s["output_tokens_per_s"] == pytest.approx(5 * 11 / 4.0)
    assert s["input_tokens_per_s"] == pytest.approx(5 * 100 / 4.0)
    assert s["offered_rps"] == pytest.approx(6 / 5.0)  # over the scheduled span, 0..5 s


def test_percentiles_are_over_answered_requests() -> None:
    outcomes = [answered(i, ttft_ms=100 * (i + 1), tpot_ms=10) for i in range(10)] + [refused(10)]
    s = summarize(outcomes, elapsed_s=10.0, slo_ttft_ms=1000)
    assert s["ttft_ms"]["p50"] == pytest.approx(550.0)
    assert s["ttft_ms"]["max"] == pytest.approx(1000.0)
    assert s["tpot_ms"]["p99"] == pytest.approx(10.0)
    assert s["itl_ms"]["p50"] == pytest.approx(10.0, rel=1e-3)  # HDR: 3 significant digits
    # without a TPOT SLO every answered request meets it: attainment is the TTFT one
    assert s["attainment_tpot"] is None
    assert s["attainment"] == s["attainment_ttft"] == pytest.approx(10 / 11)


def test_without_slos_there_is_no_goodput() -> None:
    s = summarize([answered(0, 100, 10)], elapsed_s=1.0)
    assert s["attainment"] is None and s["goodput_rps"] is None
    assert meets(refused(1), None, None) == (False, False)
    assert meets(answered(2, 100, 10), None, None) == (True, True)
