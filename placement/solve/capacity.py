"""Capacity model: the highest request rate one replica sustains while meeting an SLO.

A replica running batches of ``b`` back to back serves ``b / t(b)`` requests per second, and
in that steady state ``b`` requests arrive while one batch runs. A request arriving just as a
batch starts waits for it, ``t(b)``, and then for everything that arrived meanwhile to be
served: at Poisson arrivals that is ``q(b)`` requests, the :data:`ARRIVAL_QUANTILE` of a
Poisson count with mean ``b``, drained in batches of at most the max batch (``drain``). The
rule:

    t(b) + drain(q(b)) <= SLO          capacity = max over such b of  b / t(b)

with ``t`` the gateway batcher's own predictor (:meth:`profiles.profile.Profile.latency` at
p99) and under MPS :func:`profiles.sharing.mps_latency` with neighbours assumed busy (the
profile's interference factor always applies to a share below 1). The quantile is 99.9%, not
99%: a cycle that overflows delays a whole batch of requests, so for 99% of *requests* in time
overflowing cycles must be about a batch size rarer. Checked against the EDF batcher itself in
virtual time (``tests/placement/test_placement.py``): the rule lands within 2% of the highest Poisson
rate at 99% attainment on every reference case tried (ResNet-50 1g.10gb at 100 ms: 321.6 vs
322.9 req/s), where the deterministic-arrival rule ``2 t(b) <= SLO`` said 352.

MPS shares come from a power-of-two grid (1, 1/2, 1/4, 1/8): such shares pack into slices
exactly (first-fit decreasing fills every slice whenever their sum allows), which keeps the
solver's aggregate share constraint exact. A client's device memory is capped in proportion to
its share (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``), so memory packs with it.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import lru_cache

from profiles.catalogue import GpuModel
from profiles.profile import Profile, Quantile
from profiles.sharing import mps_latencies, mps_latency

SHARES = (1.0, 0.5, 0.25, 0.125)
QUANTILE: Quantile = "p99"
ARRIVAL_QUANTILE = 0.999  # of the Poisson count of arrivals during one batch


@dataclass(frozen=True)
class Capacity:
    rate: float  # requests per second at the SLO
    batch: int  # the steady-state batch size reaching it
    max_batch: int  # the replica's max batch: bursts drain in batches up to this size


def batch_latency(profile: Profile, batch: int, share: float = 1.0) -> float:
    """Predicted seconds for one batch: the whole slice, or an MPS share of it (neighbours busy)."""
    if share >= 1.0:
        return profile.latency(batch, QUANTILE)
    return mps_latency(profile, batch, share, busy_neighbours=True, quantile=QUANTILE)


@lru_cache(maxsize=4096)
def arrivals_during(batch: int) -> int:
    """The :data:`ARRIVAL_QUANTILE` of the number of Poisson arrivals while one batch runs, in
    the steady state where ``batch`` arrive on average."""
    return max(1, poisson_quantile(ARRIVAL_QUANTILE, float(batch)))


def poisson_quantile(q: float, mean: float) -> int:
    """The least ``k`` with ``P(N <= k) >= q`` for a Poisson count ``N`` of mean ``mean``
    (``scipy.stats.poisson.ppf``, without importing scipy.stats). The CDF is summed from
    twelve standard deviations below the mean, where the mass left out is below 1e-30."""
    if not 0.0 < q < 1.0 or mean <= 0.0:
        raise ValueError(f"need 0 < q < 1 and mean > 0 (got {q}, {mean})")
    k = max(0, math.floor(mean - 12.0 * math.sqrt(mean)))
    pmf = math.exp(k * math.log(mean) - mean - math.lgamma(k + 1.0))
    cdf = pmf
    while cdf < q:
        k += 1
        pmf *= mean / k
        cdf += pmf
    return k


def worst_wait(profile: Profile, batch: int, share: float, top: int) -> float:
    """Seconds from arriving as a batch of ``batch`` starts to being answered: that batch,
    then the requests that arrived meanwhile, ``top`` at a time."""
    return _wait(lambda b: batch_latency(profile, b, share), batch, top)


def _wait(latency, batch: int, top: int) -> float:  # noqa: ANN001  (batch size -> seconds)
    full, rest = divmod(arrivals_during(batch), top)
    return latency(batch) + full * latency(top) + (latency(rest) if rest else 0.0)


def replica_capacity(profile: Profile, slo: float, share: float = 1.0, max_batch: int | None = None) -> Capacity | None:
    """Highest sustainable rate of one replica at ``slo`` seconds, or None if even a batch of
    one cannot meet it. ``max_batch`` (default the profile's) caps the batch size."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"MPS share ({share}) must be in (0, 1]")
    top = min(max_batch or profile.max_batch, profile.max_batch)
    return _table(profile, share, top).query(slo)


@dataclass(frozen=True)
class _Table:
    """Every batch size's worst wait for one curve and share, sorted, with the best rate so
    far: answers any SLO exactly with one bisection."""

    waits: tuple[float, ...]  # sorted worst waits
    best: tuple[Capacity, ...]  # best capacity among batches with worst wait <= waits[i]

    @classmethod
    def build(cls, profile: Profile, share: float, top: int) -> _Table:
        # each batch once, as batch_latency predicts it
        lat = profile.latencies(top, QUANTILE) if share >= 1.0 else mps_latencies(profile, top, share, QUANTILE)
        pts = sorted((_wait(lat.__getitem__, b, top), b) for b in range(1, top + 1))
        best: list[Capacity] = []
        for _, b in pts:
            t = lat[b]
            if not best or b / t > best[-1].rate:
                best.append(Capacity(b / t, b, top))
            else:
                best.append(best[-1])
        return cls(tuple(w for w, _ in pts), tuple(best))

    def query(self, slo: float) -> Capacity | None:
        i = bisect.bisect_right(self.waits, slo)
        return self.best[i - 1] if i else None


_TABLES: dict[tuple, _Table] = {}


def _table(profile: Profile, share: float, top: int) -> _Table:
    """Memoised by the curve, not the profile's name: a fleet's many models share few curves."""
    key = (profile.points, profile.mps_interference, share, top)
    t = _TABLES.get(key)
    if t is None:
        if len(_TABLES) >= 4096:
            _TABLES.clear()
        t = _TABLES[key] = _Table.build(profile, share, top)
    return t


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


class CurveCapacity:
    """:func:`replica_capacity` at a profile's own max batch, memoised by the identity of its
    latency points (then, on a miss, by their value): profiles derived from one curve share
    their points, so a fleet of copies builds each table once and looks it up by ``id``."""

    def __init__(self) -> None:
        self._tables: dict[tuple, tuple[object, _Table]] = {}

    def capacity(self, profile: Profile, slo: float, share: float = 1.0) -> Capacity | None:
        key = (id(profile.points), profile.mps_interference, share, profile.max_batch)
        hit = self._tables.get(key)
        if hit is None or hit[0] is not profile.points:
            if not 0.0 < share <= 1.0:
                raise ValueError(f"MPS share ({share}) must be in (0, 1]")
            hit = self._tables[key] = (profile.points, _table(profile, share, profile.max_batch))
        return hit[1].query(slo)
