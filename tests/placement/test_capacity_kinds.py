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
