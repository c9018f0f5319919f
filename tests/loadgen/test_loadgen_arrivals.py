"""Arrival processes, schedules and trace replay: rates, burstiness, seeding, parse errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loadgen import arrivals
from loadgen.arrivals import (
    AzureReplay,
    Constant,
    Gamma,
    Mix,
    Poisson,
    TraceError,
    read_azure_trace,
    read_timestamps,
    times,
)

SAMPLE = Path(arrivals.__file__).parent / "data" / "azure_sample.csv"


def rng(seed: int = 7) -> np.random.Generator:
    return np.random.default_rng(seed)


def cv_of(t: np.ndarray) -> float:
    g = np.diff(t)
    return float(g.std() / g.mean())


@pytest.mark.parametrize(
    ("process", "cv"),
    [
        (Constant(800.0), 0.0),
        (Poisson(800.0), 1.0),
        (Gamma(800.0, 0.5), 0.5),
        (Gamma(800.0, 4.0), 4.0),
    ],
)
def test_processes_hit_mean_rate_and_cv(process, cv) -> None:
    duration = 150.0
    t = times(process, duration, rng())
    assert t.min() >= 0 and t.max() < duration
    assert np.all(np.diff(t) >= 0)
    assert len(t) / duration == pytest.approx(process.rate, rel=0.05)
    assert cv_of(t) == pytest.approx(cv, rel=0.1, abs=1e-6)


def test_seeded_runs_reproduce_exactly_and_seeds_differ() -> None:
    p = Gamma(300.0, 3.0)
    a, b, c = times(p, 20.0, rng(1)), times(p, 20.0, rng(1)), times(p, 20.0, rng(2))
    assert np.array_equal(a, b)
    assert not np.array_equal(a[: min(len(a), len(c))], c[: min(len(a), len(c))])


def test_make_process_names_the_known_ones() -> None:
    assert arrivals.make_process("gamma", 10, 2.0) == Gamma(10, 2.0)
    with pytest.raises(ValueError, match="known: constant, poisson, gamma"):
        arrivals.make_process("pareto", 10)


def test_mix_splits_arrivals_by_weight() -> None:
    s = Mix(Poisson(1000.0), (("a", 3.0), ("b", 1.0))).schedule(40.0, rng())
    frac_a = float(np.mean(s.model_idx == s.models.index("a")))
    assert frac_a == pytest.approx(0.75, abs=0.02)
    assert arrivals.parse_mix("a:3, b") == (("a", 3.0), ("b", 1.0))
    with pytest.raises(ValueError, match="bad weight"):
        arrivals.parse_mix("a:x")


def test_schedule_shares_partition_the_schedule() -> None:
    s = arrivals.single("m", Poisson(500.0), 5.0, rng())
    shares = [s.share(i, 3) for i in range(3)]
    merged = np.sort(np.concatenate([x.times for x in shares]))
    assert np.array_equal(merged, s.times)


def test_sample_trace_parses() -> None:
    funcs = read_azure_trace(SAMPLE)
    assert len(funcs) >= 4
    assert all(len(f.counts) == 1440 for f in funcs)
    assert len({f.function for f in funcs}) == len(funcs)


def test_trace_replay_keeps_counts_maps_round_robin_and_scales_time() -> None:
    funcs = tuple(read_azure_trace(SAMPLE))
    replay = AzureReplay(funcs, ("r50", "bert"), time_scale=60.0, minutes=30)
    s = replay.schedule(rng())
    expected = sum(int(f.counts[:30].sum()) for f in funcs)
    assert len(s) == pytest.approx(expected, rel=0.05)  # Poisson within each minute
    assert s.duration <= 30.0  # 30 trace minutes in 30 s at 60x
    owner = replay.model_of()
    assert [owner[f.function] for f in funcs[:4]] == ["r50", "bert", "r50", "bert"]
    # per-model counts follow the mapping
    for mi, m in enumerate(s.models):
        want = sum(int(f.counts[:30].sum()) for f in funcs if owner[f.function] == m)
        assert int(np.sum(s.model_idx == mi)) == pytest.approx(want, rel=0.07)


def test_trace_replay_is_seeded_and_a_longer_replay_extends_a_shorter_one() -> None:
    funcs = tuple(read_azure_trace(SAMPLE))
    r = AzureReplay(funcs, ("m",), time_scale=120.0, cv=2.0, minutes=10)
    assert np.array_equal(r.schedule(rng(3)).times, r.schedule(rng(3)).times)
    longer = AzureReplay(funcs, ("m",), time_scale=120.0, cv=2.0, minutes=20).schedule(rng(3))
    assert np.array_equal(longer.window(0, 5.0).times, r.schedule(rng(3)).times)


def _write_trace(tmp_path: Path, rows: list[str], minutes: int = 3) -> Path:
    header = "HashOwner,HashApp,HashFunction,Trigger," + ",".join(
        str(i) for i in range(1, minutes + 1)
    )
    p = tmp_path / "trace.csv"
    p.write_text("\n".join([header, *rows]) + "\n")
    return p


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ("o,a,f2,http,1,x,3", r"trace\.csv:3: per-minute count 'x'"),
        ("o,a,f2,http,1,2", r"trace\.csv:3: expected 7 columns, got 6"),
        ("o,a,f2,http,1,-2,3", r"trace\.csv:3: per-minute counts must be >= 0"),
        ("o,a,,http,1,2,3", r"trace\.csv:3: empty HashFunction"),
    ],
)
def test_malformed_trace_rows_are_rejected_with_their_line(tmp_path, bad_row, message) -> None:
    p = _write_trace(tmp_path, ["o,a,f1,http,1,2,3", bad_row])
    with pytest.raises(TraceError, match=message):
        read_azure_trace(p)


def test_trace_header_is_checked(tmp_path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("Owner,App,Function,Trigger,1\no,a,f,http,1\n")
    with pytest.raises(TraceError, match=r"t\.csv:1: header must start with HashOwner"):
        read_azure_trace(p)


def test_timestamp_file_replay(tmp_path) -> None:
    p = tmp_path / "ts.txt"
    p.write_text("# send times\n0.0\n0.5\n\n1.25\n")
    assert read_timestamps(p).tolist() == [0.0, 0.5, 1.25]
    q = tmp_path / "iv.txt"
    q.write_text("1000\n2000\n")
    assert read_timestamps(q, intervals_us=True).tolist() == pytest.approx([0.001, 0.003])
    bad = tmp_path / "bad.txt"
    bad.write_text("0.5\n0.2\n")
    with pytest.raises(TraceError, match=r"bad\.txt:2: timestamp 0\.2 is before"):
        read_timestamps(bad)
    bad.write_text("0.5\nsoon\n")
    with pytest.raises(TraceError, match=r"bad\.txt:2: 'soon' is not a number"):
        read_timestamps(bad)
