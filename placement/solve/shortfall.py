"""What an overfull pool leaves out: best-effort shortfalls, and the GPUs guaranteed demand lacks.

A best-effort model placed in part gets a :class:`placement.plan.Shortfall`: the capacity it
got, the rest, and per GPU model of the pool how many more GPUs would place that rest (for the
model alone: its cheapest candidate on that GPU model, as many replicas as the rest needs,
packed into the layout holding the most slices of the candidate's kind).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

from placement.plan import EPS, Demand, Inventory, Shortfall
from placement.solve.candidates import Candidate, Options, SolverError, layout_options


def gpus_to_place(rest: float, mine: Sequence[Candidate], inv: Inventory, opts: Options) -> tuple[tuple[str, int], ...]:
    """Per GPU model, the fewest GPUs that would place ``rest`` req/s with one of ``mine``
    (one model's candidates), cheapest first."""
    per_gpu: dict[tuple[int, str], int] = {}
    for ci, c in enumerate(inv.classes):
        for lo in layout_options(c, opts):
            for kind, n in lo.counts:
                per_gpu[(ci, kind)] = max(per_gpu.get((ci, kind), 0), n)
    best: dict[str, tuple[float, int]] = {}
    for c in mine:
        slots = per_gpu.get((c.cls, c.slice), 0)
        if slots <= 0:
            continue
        replicas = math.ceil(rest / c.cap.rate - 1e-9)
        # shares are powers of two, so replicas of one share pack their slices exactly
        n = math.ceil(replicas * c.share / slots - 1e-9)
        cls = inv.classes[c.cls]
        key = (n * inv.weight(cls), n)
        if cls.gpu not in best or key < best[cls.gpu]:
            best[cls.gpu] = key
    return tuple((g, n) for g, (_, n) in sorted(best.items(), key=lambda t: (t[1], t[0])))


def shortfalls(demands: Sequence[Demand], inv: Inventory, cands: Sequence[Candidate], opts: Options,
               capacity: Mapping[int, float]) -> tuple[Shortfall, ...]:
    """A :class:`Shortfall` for every model whose planned ``capacity`` (model index -> req/s)
    is short of its requirement; guaranteed demand short is a :class:`SolverError`."""
    by_model: dict[int, list[Candidate]] = defaultdict(list)
    for c in cands:
        by_model[c.model].append(c)
    out = []
    for mi, d in enumerate(demands):
        placed = capacity.get(mi, 0.0)
        if placed + EPS * max(1.0, d.required) >= d.required:
            continue
        if d.guaranteed:
            raise SolverError(f"model {d.model}: guaranteed demand placed short ({placed:.1f} of "
                              f"{d.required:.1f} req/s)")
        out.append(Shortfall(d.model, d.required, placed,
                             gpus_to_place(d.required - placed, by_model[mi], inv, opts)))
    return tuple(out)


def capacities(cands: Sequence[Candidate], chosen: Mapping[int, int]) -> dict[int, float]:
    """Planned req/s per model index, from replica counts per candidate index."""
    out: dict[int, float] = defaultdict(float)
    for j, n in chosen.items():
        out[cands[j].model] += n * cands[j].cap.rate
    return dict(out)
