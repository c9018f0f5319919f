"""The capacity table: the rate at which a replica keeps 99% in SLO under the gateway's own
batcher, found in the simulator, for curves that batch little.

The planner's queueing rule (:mod:`placement.solve.capacity`) lets every late request queue,
while the gateway refuses at arrival a request predicted to miss: refused work never queues,
so where batches stay small and every row costs about the same (small MPS shares), a replica
sustains more than the rule says (up to 0.6x more, ``bench/results/capacity_check.md`` before
this table). No closed form found held for this batcher (an M/D/1 queue with bounded waiting
overstates it: a batch of near-proportional cost makes its first request wait for the others),
so the simulator answers it once, on a grid of two dimensionless numbers:

- ``slo_ratio``: the SLO over a batch of one's time ``t1``;
- ``slope``: what each further row adds to a batch, over ``t1`` (the curve ``t(b) = t1 (1 +
  slope (b - 1))``, max batch 32); a planned curve is read at its largest average slope to a
  batch of 2, 4, 8 or 16;

and a column for replicas whose max batch is one. Each cell is the largest ``rho = rate * t1``
whose mean attainment over :data:`SEEDS` seeds is >= 99% (bisection, :data:`STEPS` steps, up
to 0.99 of the rate of full batches back to back),
then made monotone downward (no cell above one with a larger SLO ratio or smaller slope), so
the planner's floor lookup never rounds up. The table belongs to the gateway's default
scheduler settings, recorded beside it; a test fails when they change.

    .venv/bin/python -m bench.capacity_table [--processes 2]

Writes placement/solve/small_batch.yaml.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import yaml

from bench.capacity_check import MAX_REQUESTS, MIN_REQUESTS, SLO_SPAN
from bench.output import git_commit

OUT = Path(__file__).resolve().parents[1] / "placement" / "solve" / "small_batch.yaml"
SLO_RATIOS = (2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 15.0, 20.0, 25.0, 30.0, 40.0)
SLOPES = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2)
SEEDS = (0, 1, 2)
STEPS = 9  # bisection steps on rho in (LOW, HIGH x saturation): to 0.005 of saturation
LOW, HIGH = 0.0, 0.99
T1 = 0.010  # seconds; the cells are dimensionless, so any batch-of-one time gives them
MAX_BATCH = 32


def curve(slope: float, top: int = MAX_BATCH):  # noqa: ANN201  (profiles.profile.Profile)
    """A profile whose batch of ``b`` takes ``T1 (1 + slope (b - 1))``."""
    from profiles.profile import LatencyPoint, Profile

    pts = tuple(LatencyPoint(b, T1 * (1 + slope * (b - 1)), T1 * (1 + slope * (b - 1))) for b in range(1, top + 1))
    return Profile("m", "v", "A100-80GB", "gpu", top, pts)


def attainment(slope: float, top: int, rho: float, slo: float, seed: int) -> float:
    """Share in SLO when a replica of :func:`curve` at max batch ``top`` takes Poisson
    ``rho / T1`` under the gateway's default scheduler (as ``bench.capacity_check`` runs a kind)."""
    from bench.capacity_check import replica_attainment

    return replica_attainment(curve(slope, top), top, rho / T1, slo, seed)


def saturation(slope: float, top: int) -> float:
    """rho at which a replica of :func:`curve` at max batch ``top`` runs full batches back to back."""
    return top / (1.0 + slope * (top - 1))


def cell(args: tuple[float, float, int]) -> float:
    """The largest rho (to the bisection's step) whose mean attainment is >= 99%, below
    :data:`HIGH` of saturation."""
    slo_ratio, slope, top = args
    lo, hi = LOW, HIGH * saturation(slope, top)
    if np.mean([attainment(slope, top, hi, slo_ratio * T1, s) for s in SEEDS]) >= 0.99:
        return hi
    for _ in range(STEPS):
        mid = 0.5 * (lo + hi)
        if np.mean([attainment(slope, top, mid, slo_ratio * T1, s) for s in SEEDS]) >= 0.99:
            lo = mid
        else:
            hi = mid
    return lo


def monotone(rho: list[list[float]]) -> list[list[float]]:
    """Each cell no higher than any cell with a larger SLO ratio (row) or smaller slope (column)."""
    out = [row[:] for row in rho]
    for i in range(len(out) - 1, -1, -1):
        for j in range(len(out[i])):
            bound = min([out[i][j]] + ([out[i + 1][j]] if i + 1 < len(out) else []) + ([out[i][j - 1]] if j else []))
            out[i][j] = bound
    return out


def scheduler_defaults() -> dict:
    """The scheduler settings the table was found with (the gateway's defaults)."""
    from gateway.policy.config import SchedulerConfig

    return SchedulerConfig().model_dump(mode="json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    t0 = time.time()
    jobs = [(r, s, MAX_BATCH) for r in SLO_RATIOS for s in SLOPES] + [(r, 1.0, 1) for r in SLO_RATIOS]
    with ProcessPoolExecutor(args.processes) as ex:
        found = list(ex.map(cell, jobs))
    grid = [found[i * len(SLOPES):(i + 1) * len(SLOPES)] for i in range(len(SLO_RATIOS))]
    single = found[len(SLO_RATIOS) * len(SLOPES):]
    table = {
        "meta": {"command": "python -m bench.capacity_table", "commit": git_commit(),
                 "machine": f"{platform.machine()} {platform.python_version()}", "wall_s": round(time.time() - t0, 1),
                 "seeds": list(SEEDS), "steps": STEPS, "requests": [MIN_REQUESTS, MAX_REQUESTS, SLO_SPAN],
                 "max_batch": MAX_BATCH, "scheduler": scheduler_defaults()},
        "slo_ratios": list(SLO_RATIOS), "slopes": list(SLOPES),
        "measured": [[round(x, 4) for x in row] for row in grid],
        "rho": [[round(x, 4) for x in row] for row in monotone(grid)],
        "rho_max_batch_one": [round(row[0], 4) for row in monotone([[x] for x in single])],
    }
    head = "# written by `python -m bench.capacity_table` (see its docstring); read by placement.solve.capacity\n"
    args.out.write_text(head + yaml.safe_dump(table, sort_keys=False, default_flow_style=None, width=120))
    print(json.dumps({k: table[k] for k in ("rho", "rho_max_batch_one")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
