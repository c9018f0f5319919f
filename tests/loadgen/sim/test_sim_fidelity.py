"""bench.sim_fidelity's verdict: a simulated point holds when it is within 10% of the live mean
(attainment: 1 point) or within the live runs' own spread, whichever is larger; and the live
and simulated runs of a case read the same seeded arrivals."""

from __future__ import annotations

from bench.sim_fidelity import CASES, capacity, compare, spec_of


def live(p50: float, p99: float, attainment: float, goodput: float) -> dict:
    return {"p50_ms": p50, "p99_ms": p99, "attainment": attainment, "goodput_rps": goodput}


RUNS = [live(50.0, 90.0, 0.990, 300.0), live(51.0, 91.0, 0.992, 301.0), live(52.0, 92.0, 0.994, 302.0)]


def test_within_ten_percent_and_one_point_holds() -> None:
    c = compare(RUNS, live(55.0, 82.0, 0.9825, 280.0))
    assert all(m["pass"] for m in c.values())
    assert c["p50_ms"]["live"] == 51.0 and c["p50_ms"]["spread"] == 2.0


def test_a_difference_beyond_both_fails_and_names_the_metric() -> None:
    c = compare(RUNS, live(57.0, 91.0, 0.979, 301.0))
    assert [k for k, m in c.items() if not m["pass"]] == ["p50_ms", "attainment"]


def test_the_live_spread_widens_the_tolerance_where_it_is_larger() -> None:
    noisy = [*RUNS[:2], live(70.0, 91.0, 0.95, 301.0)]  # one live run on a busy host
    c = compare(noisy, live(58.0, 91.0, 0.96, 301.0))
    assert c["p50_ms"]["tolerance"] == 20.0 and c["p50_ms"]["pass"]
    assert c["attainment"]["tolerance"] > 0.04 and c["attainment"]["pass"]


def test_a_missing_simulated_value_is_not_a_pass() -> None:
    assert not compare(RUNS, live(51.0, 91.0, None, 301.0))["attainment"]["pass"]  # type: ignore[arg-type]


def test_live_and_simulated_specs_differ_only_in_target() -> None:
    for case in CASES:
        a, b = spec_of(case, "http://127.0.0.1:1", 20, 2, 1), spec_of(case, "http://sim:1", 20, 2, 1)
        assert a.model_dump(exclude={"target"}) == b.model_dump(exclude={"target"})
        assert (a.schedule().times == b.schedule().times).all()
    # each model of a pair is offered its share at the case's fraction of capacity
    pair = next(c for c in CASES if c.name == "mig-pair")
    assert spec_of(pair, "http://sim:1", 20, 2, 1).rate == 2 * 0.9 * capacity("mig")
