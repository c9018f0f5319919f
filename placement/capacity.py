"""Capacity model: the highest request rate one replica sustains while meeting an SLO.

A replica running batches of ``b`` back to back makes a request wait, in the worst case, for the
batch in flight and then for its own batch: ``2 * t(b) <= SLO``. It serves ``b / t(b)``
requests per second. Capacity is the best such rate over the allowed batch sizes, with ``t`` the
gateway batcher's own predictor (:meth:`profiles.profile.Profile.latency` at p99), and under MPS
:func:`profiles.sharing.mps_latency` with neighbours assumed busy (the profile's interference
factor always applies to a share below 1). The rule is conservative by design: the EDF batcher
reaches about 330 req/s at 99% attainment on ResNet-50 1g.10gb at 100 ms where this rule
predicts 345 (the profile's ceiling is 383).

MPS shares come from a power-of-two grid (1, 1/2, 1/4, 1/8): such shares pack into slices
exactly (first-fit decreasing fills every slice whenever their sum allows), which keeps the
solver's aggregate share constraint exact. A client's device memory is capped in proportion to
its share (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``), so memory packs with it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from placement.catalogue import GpuModel
from profiles.profile import Profile, Quantile
from profiles.sharing import mps_latency

SHARES = (1.0, 0.5, 0.25, 0.125)
QUANTILE: Quantile = "p99"


@dataclass(frozen=True)
class Capacity:
    rate: float  # requests per second at the SLO
    batch: int  # the batch size reaching it (the replica's max batch)
    batch_latency: float  # seconds, predicted for one batch of ``batch`` at this share


def batch_latency(profile: Profile, batch: int, share: float = 1.0) -> float:
    """Predicted seconds for one batch: the whole slice, or an MPS share of it (neighbours busy)."""
    if share >= 1.0:
        return profile.latency(batch, QUANTILE)
    return mps_latency(profile, batch, share, busy_neighbours=True, quantile=QUANTILE)


def replica_capacity(profile: Profile, slo: float, share: float = 1.0, max_batch: int | None = None) -> Capacity | None:
    """Highest sustainable rate of one replica at ``slo`` seconds, or None if even a batch of
    one cannot meet it. ``max_batch`` (default the profile's) caps the batch size."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"MPS share ({share}) must be in (0, 1]")
    top = min(max_batch or profile.max_batch, profile.max_batch)
    budget = slo / 2.0
    table = _tables.get(profile, share, top)
    if table is not None:
        return table.query(budget)
    if batch_latency(profile, 1, share) > budget:
        return None
    bmax = _largest_batch_within(profile, share, budget, top)
    # the latency is piecewise linear between measured batches, so b / t(b) peaks at a
    # segment end: the measured batches up to bmax, and bmax itself
    ends = [p.batch for p in profile.points[: bisect.bisect_right([p.batch for p in profile.points], bmax)]]
    best: Capacity | None = None
    for b in (*ends, bmax):
        t = batch_latency(profile, b, share)
        if t <= budget and (best is None or b / t > best.rate):
            best = Capacity(b / t, b, t)
    return best


@dataclass(frozen=True)
class _Table:
    """Every batch size's latency for one curve and share, sorted, with the best rate so far:
    answers any SLO exactly with one bisection."""

    times: tuple[float, ...]  # sorted latencies
    best: tuple[Capacity, ...]  # best capacity among batches with latency <= times[i]

    @classmethod
    def build(cls, profile: Profile, share: float, top: int) -> _Table:
        pts = sorted((batch_latency(profile, b, share), b) for b in range(1, top + 1))
        best: list[Capacity] = []
        for t, b in pts:
            if not best or b / t > best[-1].rate:
                best.append(Capacity(b / t, b, t))
            else:
                best.append(best[-1])
        return cls(tuple(t for t, _ in pts), tuple(best))

    def query(self, budget: float) -> Capacity | None:
        i = bisect.bisect_right(self.times, budget)
        return self.best[i - 1] if i else None


class _Tables:
    """Tables for curves asked about often (a fleet's many models share few curves); a curve
    seen fewer than ``after`` times is answered by search instead. Memoisation only: the
    answers are the same either way."""

    def __init__(self, after: int = 3, limit: int = 4096) -> None:
        self.after, self.limit = after, limit
        self.seen: dict[tuple, int] = {}
        self.tables: dict[tuple, _Table] = {}

    def get(self, profile: Profile, share: float, top: int) -> _Table | None:
        key = (profile.points, profile.mps_interference, share, top)
        t = self.tables.get(key)
        if t is not None:
            return t
        n = self.seen.get(key, 0) + 1
        if n < self.after:
            if len(self.seen) > 16 * self.limit:
                self.seen.clear()
            self.seen[key] = n
            return None
        if len(self.tables) >= self.limit:
            self.tables.clear()
        t = self.tables[key] = _Table.build(profile, share, top)
        return t


_tables = _Tables()


def _largest_batch_within(profile: Profile, share: float, budget: float, top: int) -> int:
    """Largest batch in 1..top whose predicted latency fits ``budget`` (batch 1 fits).

    The sharing rule only scales latency, so the estimate solves the piecewise-linear curve
    directly; the final answer is checked and nudged against :func:`batch_latency` itself."""
    scale = batch_latency(profile, 1, share) / profile.latency(1, QUANTILE)
    raw = budget / scale
    pts = profile.points
    est = 1
    for i, p in enumerate(pts):
        y = getattr(p, QUANTILE)
        if y <= raw:
            est = p.batch
            continue
        lo = pts[i - 1] if i else None
        if lo is not None:
            ylo = getattr(lo, QUANTILE)
            est = lo.batch + int((raw - ylo) * (p.batch - lo.batch) / (y - ylo)) if y > ylo else p.batch
        break
    else:
        if len(pts) >= 2:
            a, b = pts[-2], pts[-1]
            ya, yb = getattr(a, QUANTILE), getattr(b, QUANTILE)
            slope = (yb - ya) / (b.batch - a.batch)
            est = b.batch + (int((raw - yb) / slope) if slope > 0 else top)
        elif getattr(pts[0], QUANTILE) <= raw:
            est = top if pts[0].batch >= top else max(pts[0].batch, int(raw / getattr(pts[0], QUANTILE) * pts[0].batch))
    b = max(1, min(top, est))
    while b > 1 and batch_latency(profile, b, share) > budget:
        b -= 1
    while b < top and batch_latency(profile, b + 1, share) <= budget:
        b += 1
    return b


def fits_memory(profile: Profile, gpu: GpuModel, slice_name: str, share: float = 1.0) -> bool:
    """The variant's memory fits its share of the slice's memory."""
    return profile.memory_mb <= gpu.slice_memory_gb(slice_name) * 1024.0 * share


def legal_shares(gpu: GpuModel, slice_name: str, mps: bool) -> tuple[float, ...]:
    """Shares a client may hold on this slice kind: 1 without MPS; with MPS the power-of-two
    grid down to the slice's client limit."""
    if not mps:
        return (1.0,)
    limit = gpu.mps_client_limit(slice_name)
    return tuple(s for s in SHARES if round(1.0 / s) <= limit)
