"""The planner's capacity holds on the kinds where it held least: the 20 replica kinds (a
profile on a slice at an MPS share, with an SLO) lowest at planned capacity in
``bench/capacity_check.py``'s last run, kept in ``capacity_kinds.json``. Each runs in the
simulator (the gateway's own policy core) at the capacity the planner computes now, and must
keep at least 98% of requests in SLO (the bench's floor for any seed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.capacity_check import MIN_REQUESTS, Kind, _profiles, attainment
from placement.solve.capacity import replica_capacity

KINDS = json.loads((Path(__file__).parent / "capacity_kinds.json").read_text())


@pytest.mark.parametrize("row", KINDS, ids=lambda r: f"{r['variant']}@{r['gpu']}/{r['slice']}x{r['share']:g}")
def test_planned_capacity_keeps_98_percent_in_slo(row: dict) -> None:
    kind = Kind(row["variant"], row["gpu"], row["slice"], row["share"], row["slo_ms"] / 1e3)
    cap = replica_capacity(_profiles().get(kind.variant, kind.gpu, kind.slice), kind.slo, kind.share)
    assert cap is not None, kind.name
    got = attainment(kind, cap.rate, cap.max_batch, seed=0, requests=MIN_REQUESTS)
    assert got >= 0.98, f"{kind.name}: {got:.2%} in SLO at the planned {cap.rate:.1f} req/s"


def test_the_small_batch_table_belongs_to_the_gateways_default_scheduler() -> None:
    """bench/capacity_table.py found the table under the default scheduler: re-run it when they change."""
    import yaml

    from bench.capacity_table import scheduler_defaults
    from placement.solve.capacity import SMALL_BATCH

    assert yaml.safe_load(SMALL_BATCH.read_text())["meta"]["scheduler"] == scheduler_defaults()


@pytest.mark.parametrize(("slo_ratio", "slope"), [(5.0, 0.9), (8.0, 1.0), (12.0, 0.7)])
def test_a_small_batch_table_cell_holds_in_the_simulator(slo_ratio: float, slope: float) -> None:
    """At the rate the table gives a curve of its own grid, the gateway's batcher keeps >= 98%."""
    from bench.capacity_table import T1, curve
    from bench.capacity_table import attainment as cell_attainment
    from placement.solve.capacity import small_batch_rate

    p = curve(slope)
    lat = [0.0] + [p.latency(b, "p99") for b in range(1, p.max_batch + 1)]
    rate = small_batch_rate(lat, p.max_batch, slo_ratio * T1)
    assert rate > 0
    assert cell_attainment(slope, p.max_batch, rate * T1, slo_ratio * T1, seed=7) >= 0.98


def test_the_small_batch_table_is_read_between_its_cells_less_its_margin() -> None:
    """On a grid point the table's rate less the margin; between points, between theirs."""
    from bench.capacity_table import T1, curve
    from placement.solve.capacity import SMALL_BATCH_MARGIN, _small_batch, small_batch_rate

    ratios, slopes, rho, _ = _small_batch()
    i, j = ratios.index(6.0), slopes.index(0.9)

    def rate(slope: float, ratio: float, top: int = 32) -> float:
        p = curve(slope)
        lat = [0.0] + [p.latency(b, "p99") for b in range(1, p.max_batch + 1)]
        return small_batch_rate(lat[:top + 1], top, ratio * T1) * T1 / SMALL_BATCH_MARGIN

    assert rate(0.9, 6.0) == pytest.approx(rho[i][j])
    assert rho[i][j + 1] <= rate(0.95, 6.0) <= rho[i][j]
    assert rho[i][j] <= rate(0.9, 6.5) <= rho[i + 1][j]
    assert rate(0.9, 1.5) == 0.0  # below the table's least SLO ratio
    assert rate(1.5, 6.0) == 0.0  # steeper than its steepest slope
    assert rate(0.9, 6.0, top=2) == 0.0  # a max batch of 2: the rule alone
