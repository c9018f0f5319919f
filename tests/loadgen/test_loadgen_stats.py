"""The recorder: SLO attainment, goodput, rejections, errors, variants, and exact merging of
HDR histograms recorded in separate processes."""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from loadgen.stats import OK, REJECTED, Recorder, new_latency_histogram, percentile, record_many


def make_samples(n: int, seed: int = 3) -> list[tuple]:
    """(model, variant, scheduled, latency_s, slo_s, outcome, send_lag_s) rows."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        u = rng.random()
        outcome = OK if u < 0.9 else REJECTED if u < 0.96 else "http_503"
        rows.append(
            (
                "m1" if i % 3 else "m2",
                ["fast", "accurate", None][i % 3],
                float(rng.uniform(0, 20)),
                float(rng.lognormal(-4, 1)),
                0.05,
                outcome,
                float(rng.exponential(0.0002)),
            )
        )
    return rows


def record_all(rows: list[tuple]) -> dict:
    rec = Recorder(window_s=0.5)
    for r in rows:
        rec.record(*r)
    return rec.encode()


def test_summary_counts_attainment_goodput_and_breakdowns() -> None:
    rec = Recorder()
    rec.record("m", "a", 0.1, 0.010, 0.1, OK)  # good
    rec.record("m", "a", 0.2, 0.300, 0.1, OK)  # late
    rec.record("m", "b", 1.2, 0.001, 0.1, REJECTED)
    rec.record("m", None, 1.5, 0.1, 0.1, "timeout")
    s = rec.summary(duration_s=2.0, slo_s=0.1)
    assert (s["offered"], s["ok"], s["good"], s["rejected"]) == (4, 2, 1, 1)
    assert s["attainment"] == pytest.approx(0.25)
    assert s["goodput_rps"] == pytest.approx(0.5)
    assert s["errors"] == {"timeout": 1}
    assert s["latency_ms"]["p99"] == pytest.approx(300.0, rel=1e-3)
    variants = {v["variant"]: v for v in s["per_variant"]}
    assert variants["a"]["attainment"] == pytest.approx(0.5)
    assert variants["-"]["error_count"] == 1
    assert [w["offered_rps"] for w in s["timeline"]] == [2.0, 2.0]


def test_refusals_are_timed_from_the_schedule_and_from_the_actual_send() -> None:
    rec = Recorder()
    rec.record("m", None, 0.1, 0.012, 0.1, REJECTED, 0.010)  # sent 10 ms late, answered 2 ms later
    rec.record("m", None, 0.2, 0.003, 0.1, REJECTED, 0.0)
    s = rec.summary(duration_s=1.0, slo_s=0.1)
    assert s["reject_latency_p99_ms"] == pytest.approx(12.0, rel=1e-2)
    assert s["reject_latency_from_send_p99_ms"] == pytest.approx(3.0, rel=1e-2)


def test_merge_across_processes_equals_one_recorder_of_all_samples() -> None:
    rows = make_samples(6000)
    single = Recorder(window_s=0.5)
    single.merge(record_all(rows))
    parts = [rows[i::3] for i in range(3)]
    with ProcessPoolExecutor(3, mp_context=mp.get_context("spawn")) as ex:
        encoded = list(ex.map(record_all, parts))
    merged = Recorder(window_s=0.5)
    for e in encoded:
        merged.merge(e)
    assert merged.summary(20.0, 0.05) == single.summary(20.0, 0.05)
    for key, s in single.series.items():
        m = merged.series[key]
        assert list(m.latency.get_recorded_iterator()) != []
        assert [
            (v.value_iterated_to, v.count_at_value_iterated_to)
            for v in m.latency.get_recorded_iterator()
        ] == [
            (v.value_iterated_to, v.count_at_value_iterated_to)
            for v in s.latency.get_recorded_iterator()
        ]
    assert merged.send_lag.get_total_count() == len(rows)


def test_merge_refuses_different_windows() -> None:
    a, b = Recorder(window_s=1.0), Recorder(window_s=0.5)
    with pytest.raises(ValueError, match="windows 0.5 s and 1.0 s"):
        a.merge(b.encode())


def test_vectorized_recording_matches_hdr_record_value() -> None:
    rng = np.random.default_rng(5)
    values = np.concatenate(
        [rng.integers(1, 5000, 2000), (10 ** rng.uniform(0, 9.5, 5000)).astype(np.int64)]
    )
    one_by_one, at_once = new_latency_histogram(), new_latency_histogram()
    for v in values:
        one_by_one.record_value(int(v))
    record_many(at_once, values)
    assert list(at_once.counts) == list(one_by_one.counts)
    assert (at_once.get_total_count(), at_once.get_min_value(), at_once.get_max_value()) == (
        one_by_one.get_total_count(),
        one_by_one.get_min_value(),
        one_by_one.get_max_value(),
    )
    for p in (0.0, 50.0, 90.0, 99.0, 99.9, 100.0):
        assert percentile(at_once, p) == one_by_one.get_value_at_percentile(p)


def test_report_says_how_fast_refusals_came() -> None:
    from loadgen.report import compact

    rec = Recorder()
    rec.record("m", None, 0.1, 0.012, 0.1, REJECTED, 0.010)
    rec.record("m", None, 0.2, 0.020, 0.1, OK, 0.0)
    line = compact(rec.summary(duration_s=1.0, slo_s=0.1))
    assert "rejected 1 (p99 12.0 ms, 2.0 from send)" in line
