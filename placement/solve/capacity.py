"""Capacity model: the highest request rate one replica sustains while meeting an SLO.

The replica is a batch queue: the gateway's batcher starts a batch whenever the replica is
free, taking what is queued up to the max batch, and a batch of ``b`` takes ``t(b)`` (the
gateway's own predictor, :meth:`profiles.profile.Profile.latency` at p99, and under MPS
:func:`profiles.sharing.mps_latency` with neighbours assumed busy). At a Poisson rate ``r``
the rule asks how late the :data:`SERVED` share of requests can be, two ways, and keeps the
larger:

- **Cycle by cycle** (:func:`cycle_wait`). The batch size follows the map ``x -> r t(x)``
  (a batch of ``x`` runs while ``r t(x)`` arrive). Its steady point is the equilibrium
  ``x = r t(x)`` (``t`` read linearly between sizes) just below the *steady batch*: the least
  size from which every larger batch keeps up (serves at least ``r``), so that a burst,
  even through a dip in rows per second (MPS-slowed curves have them), drains. Around it the
  batch size is an AR(1) process whose coefficient is the map's slope over the burst,
  ``phi = r (t(q) - t(x)) / (q - x)``, and whose spread is the Poisson count's
  (:data:`ARRIVAL_QUANTILE`) widened by ``1 / sqrt(1 - phi**2)``; what would exceed the
  max batch is backlog, the other view's. A request waits for half the batch in flight on
  average and then runs in the next one; both are read at that spread. Near-proportional
  curves (small MPS shares, where a larger batch is barely cheaper per row) have ``phi``
  near 1 and wide swings.
- **Backlog across cycles** (:func:`backlog_wait`). Work arrives at ``r`` times the cost of
  a row in the batch a burst forms (the cycle view's, at most ``B``); the queue of that work
  is an M/D/1 queue, whose :data:`SERVED` quantile of waiting comes from the Cramer-Lundberg
  approximation ``P(W > x) ~ C exp(-theta x)``, after the batch in flight and before its own.
  Near the replica's saturation this is what binds.

The max batch ``B`` of a planned replica is the batch size with the most rows per second
(the largest on ties), never more than the profile's: a batch past it serves fewer rows per
second and, under load, only makes a backlog worse (on MPS-slowed curves ``t(2)`` can exceed
``2 t(1)``, and such a replica runs batches of one). Capacity is the largest rate, from
every steady batch size and a grid of fractions of ``B / t(B)``, whose wait fits the SLO.
It is checked against the gateway's own batcher in the simulator, at planned capacity and at
planned / 0.9, over a stratified sample of every profile, slice and share the planner uses
(``bench/capacity_check.py``; its worst kinds are ``tests/placement/test_capacity_kinds.py``).

Both views let every late request queue. The gateway refuses at arrival a request predicted to
miss, so refused work never queues, which matters most where batches stay small and every row
costs about the same (small MPS shares), where the views plan up to 0.6x less than the batcher
sustains. So capacity is at least the simulator's own answer, :data:`SMALL_BATCH`
(``bench/capacity_table.py``): the rate keeping 99% in SLO for a curve ``t(b) = t1 (1 +
slope (b - 1))``, by SLO / ``t1`` and slope, read linearly between its cells, less
:data:`SMALL_BATCH_MARGIN` (:func:`small_batch_rate`).

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
from pathlib import Path

import numpy as np
import yaml

from profiles.catalogue import GpuModel
from profiles.profile import Profile, Quantile
from profiles.sharing import mps_latencies, mps_latency

SHARES = (1.0, 0.5, 0.25, 0.125)
QUANTILE: Quantile = "p99"
SERVED = 0.99  # share of requests the capacity keeps in SLO
ARRIVAL_QUANTILE = 0.9995  # of the Poisson count of arrivals during one batch
SATURATION_GRID = tuple(i / 100 for i in range(30, 100))  # fractions of B / t(B) tried as rates
SMALL_BATCH = Path(__file__).with_name("small_batch.yaml")  # the simulator's small-batch table
SMALL_BATCH_MARGIN = 0.92  # of the table's rate, read between its cells (it is the 99% rate itself)


@dataclass(frozen=True)
class Capacity:
    rate: float  # requests per second at the SLO
    batch: int  # the steady-state batch size at that rate
    max_batch: int  # the replica's max batch: the batch size with the most rows per second


def batch_latency(profile: Profile, batch: int, share: float = 1.0) -> float:
    """Predicted seconds for one batch: the whole slice, or an MPS share of it (neighbours busy)."""
    if share >= 1.0:
        return profile.latency(batch, QUANTILE)
    return mps_latency(profile, batch, share, busy_neighbours=True, quantile=QUANTILE)


def arrivals_during(mean: float) -> int:
    """The :data:`ARRIVAL_QUANTILE` of the number of Poisson arrivals while one batch runs, in
    the steady state where ``mean`` arrive on average (read to 0.01)."""
    return _arrivals(round(max(mean, 0.01), 2))


@lru_cache(maxsize=65536)
def _arrivals(mean: float) -> int:
    return max(1, poisson_quantile(ARRIVAL_QUANTILE, mean))


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


def best_batch(lat: list[float], top: int) -> int:
    """The batch size up to ``top`` with the most rows per second (the largest on ties);
    ``lat[b]`` is a batch of ``b``'s seconds."""
    return max(range(1, top + 1), key=lambda b: (b / lat[b], b))


def _rows_time(lat: np.ndarray, rows: np.ndarray, top: int) -> np.ndarray:
    """Seconds to serve ``rows`` (rounded up) in batches of at most ``top``, full ones first."""
    full, rest = np.divmod(np.maximum(1, np.ceil(rows - 1e-9)).astype(np.int64), top)
    return full * lat[top] + np.where(rest > 0, lat[rest], 0.0)


def _frac_time(lat: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A batch's seconds at a fractional size (``lat`` read linearly between whole sizes,
    and as a batch of one below one)."""
    lo = np.clip(np.floor(rows).astype(np.int64), 1, len(lat) - 1)
    hi = np.minimum(lo + 1, len(lat) - 1)
    return lat[lo] + (np.maximum(rows, 1.0) - lo) * (lat[hi] - lat[lo])


def _cycle_waits(lat: np.ndarray, rates: np.ndarray, batches: np.ndarray, top: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`cycle_wait` for many (rate, steady batch) pairs at once, with the batch a burst
    forms (rows)."""
    # the equilibrium x = rate t(x) on the segment below the steady batch (t read linearly):
    # every larger batch keeps up, so the batch size map rate t(x) stays under x past it
    b = batches.astype(float)
    step = lat[batches] - lat[np.maximum(batches - 1, 0)]
    eq = np.where(batches > 1, rates * (lat[np.maximum(batches - 1, 1)] - (b - 1) * step)
                  / np.maximum(1.0 - rates * step, 1e-12), rates * lat[1])
    eq = np.clip(eq, 1e-3, b)
    q = np.array([arrivals_during(m) for m in eq.tolist()], dtype=float)
    burst = q - eq
    q = np.minimum(q, top)  # what exceeds the max batch is backlog (the other view)
    phi = np.zeros_like(rates)
    base = _frac_time(lat, eq)
    for _ in range(3):  # the marginal cost is read over the burst it widens
        slope = (_frac_time(lat, q) - base) / np.maximum(q - eq, 1e-9)
        phi = np.clip(rates * slope, 0.0, 0.99)
        q = np.minimum(eq + burst / np.sqrt(1.0 - phi * phi), top)
    return 0.5 * _rows_time(lat, eq + phi * (q - eq), top) + _rows_time(lat, q, top), np.ceil(q - 1e-9)


def cycle_wait(lat: list[float], rate: float, batch: int, top: int) -> float:
    """A late request's seconds at ``rate`` with steady batch ``batch`` (see :func:`latency_at`):
    half the batch in flight (it arrives at a uniform point of it) and its own batch, both at
    the spread of an AR(1) batch size around the equilibrium (see the module docstring).
    ``lat[b]`` is a batch of ``b``'s seconds, ``top`` the max batch."""
    return float(_cycle_waits(np.asarray(lat, dtype=float), np.array([rate]), np.array([batch]), top)[0][0])


def _backlog_waits(rates: np.ndarray, cost: float | np.ndarray) -> np.ndarray:
    """:func:`backlog_wait` for many rates at once."""
    rho = rates * cost
    # P(W > 0) = rho: at rho <= 1 - SERVED the quantile is no wait (the approximation, an
    # asymptote in x, overstates the tail there)
    ok = (rho > 1.0 - SERVED) & (rho < 1.0 - 1e-9)
    r = np.where(ok, rho, 0.5)
    # x = theta * cost solves rho * (e^x - 1) = x; Newton from the lesser of 2 (1 - rho) / rho
    # and 2 ln(1 / rho) + 2, both above the root, descends to it monotonically (the function
    # is convex) in a few steps
    x = np.minimum(2.0 * (1.0 - r) / r, 2.0 * np.log(1.0 / r) + 2.0)
    for _ in range(40):
        em1 = np.expm1(x)  # e^x - 1 without cancellation near rho = 1, where x is tiny
        step = (r * em1 - x) / (r * em1 + r - 1.0)
        x = x - step
        if np.all(np.abs(step) <= 1e-9 * x):
            break
    c = (1.0 - r) / (r * np.expm1(x) + r - 1.0)
    waits = np.maximum(0.0, np.log(c / (1.0 - SERVED)) * cost / x)
    return np.where(ok, waits, np.where(rho <= 1.0 - SERVED, 0.0, math.inf))


def backlog_wait(rate: float, cost: float) -> float:
    """The :data:`SERVED` quantile of waiting in an M/D/1 queue of Poisson ``rate`` and ``cost``
    seconds per request (Cramer-Lundberg: ``P(W > x) ~ C exp(-theta x)``, ``theta`` the root of
    ``rate (exp(theta cost) - 1) = theta``, ``C = (1 - rho) / (rho exp(theta cost) - 1)``);
    inf at or past saturation."""
    return float(_backlog_waits(np.array([rate]), cost)[0])


def _waits(lat: np.ndarray, rates: np.ndarray, batches: np.ndarray, top: int) -> np.ndarray:
    """The rule's wait: the larger of the cycle-by-cycle and the backlog views."""
    cycle, burst = _cycle_waits(lat, rates, batches, top)
    rows = burst.astype(np.int64)
    backlog = 2.0 * lat[batches] + _backlog_waits(rates, lat[rows] / rows)
    return np.maximum(cycle, backlog)


@lru_cache(maxsize=1)
def _small_batch() -> tuple[list[float], list[float], list[list[float]], list[float]]:
    doc = yaml.load(SMALL_BATCH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return doc["slo_ratios"], doc["slopes"], doc["rho"], doc["rho_max_batch_one"]


def small_batch_slope(lat: list[float] | np.ndarray, top: int) -> float:
    """What each row past the first adds to a batch, over a batch of one: the largest average
    slope to a batch of 2, 4, 8 or 16 (0 at a max batch of one)."""
    if top < 2:
        return 0.0
    return float(max((lat[b] - lat[1]) / ((b - 1) * lat[1]) for b in (2, 4, 8, 16) if b <= top))


def small_batch_rate(lat: list[float] | np.ndarray, top: int, slo: float) -> float:
    """The :data:`SMALL_BATCH` table's rate for a replica whose batches of ``b <= top`` take
    ``lat[b]``, at ``slo`` seconds: read linearly between the table's cells, at
    :data:`SMALL_BATCH_MARGIN` of it, and never past that margin of the replica's full batches
    back to back; 0 off the table (an SLO under two batches of one, a steeper slope than its
    steepest, a max batch from 2 to 15, below the table's 32 by more than its batches use)."""
    return _small_batch_rate(*_small_terms(lat, top), top, slo)


def _small_terms(lat: list[float] | np.ndarray, top: int) -> tuple[float, float, float]:
    """(t(1), :func:`small_batch_slope`, full batches' rows per second): what the table is read by."""
    return float(lat[1]), small_batch_slope(lat, top), top / float(lat[top])


def _small_batch_rate(t1: float, slope: float, full: float, top: int, slo: float) -> float:
    ratios, slopes, rho, one = _small_batch()
    x = slo / t1
    if x < ratios[0] or 1 < top < 16 or (top > 1 and slope > slopes[-1]):
        return 0.0
    i = min(bisect.bisect_right(ratios, x) - 1, len(ratios) - 2)
    u = min(1.0, (x - ratios[i]) / (ratios[i + 1] - ratios[i]))

    def row(k: int) -> float:  # the cell's rho at this slope, read linearly between columns
        if top == 1:
            return one[k]
        j = min(max(bisect.bisect_right(slopes, slope) - 1, 0), len(slopes) - 2)
        v = min(1.0, max(0.0, (slope - slopes[j]) / (slopes[j + 1] - slopes[j])))
        return rho[k][j] + v * (rho[k][j + 1] - rho[k][j])

    return float(SMALL_BATCH_MARGIN * min((row(i) + u * (row(i + 1) - row(i))) / t1, full))


def _steady(lat: np.ndarray, rates: np.ndarray, top: int) -> np.ndarray:
    """Each rate's steady batch: the least batch size from which every larger batch keeps up
    with it (serves at least the rate). Where rows per second dip in the middle of a curve
    (MPS-slowed curves can), a burst pushes the batch through the dip to there."""
    return np.minimum(np.searchsorted(_floors(lat, top), rates * (1.0 - 1e-12)) + 1, top)


def _floors(lat: np.ndarray, top: int) -> np.ndarray:
    """``[i]``: the least rows per second of any batch from ``i + 1`` to ``top``."""
    return np.minimum.accumulate((np.arange(1, top + 1) / lat[1:top + 1])[::-1])[::-1]


def latency_at(lat: list[float], rate: float, top: int) -> tuple[float, int]:
    """(the rule's wait at ``rate``, the steady batch size) for a replica whose batches of
    ``b <= top`` take ``lat[b]`` and whose max batch is ``top`` (see :func:`best_batch`)."""
    arr = np.asarray(lat, dtype=float)
    batch = _steady(arr, np.array([rate]), top)
    return float(_waits(arr, np.array([rate]), batch, top)[0]), int(batch[0])


def replica_capacity(profile: Profile, slo: float, share: float = 1.0, max_batch: int | None = None) -> Capacity | None:
    """Highest sustainable rate of one replica at ``slo`` seconds, or None if even a batch of
    one cannot meet it. ``max_batch`` (default the profile's) caps the batch size."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"MPS share ({share}) must be in (0, 1]")
    top = min(max_batch or profile.max_batch, profile.max_batch)
    return _table(profile, share, top).query(slo)


@dataclass(frozen=True)
class _Table:
    """The rule's wait at every candidate rate for one curve and share, sorted, with the best
    rate so far: answers any SLO exactly with one bisection."""

    waits: list[float]  # ascending: where the best rate so far rises
    rates: list[float]  # the best rate among rates with wait <= waits[i]
    batches: list[int]  # its steady batch
    top: int  # the max batch
    small: tuple[float, float, float]  # _small_terms: what the small-batch table is read by
    floor: tuple[float, ...]  # _floors: where the small-batch rate's steady batch is read

    @classmethod
    def build(cls, profile: Profile, share: float, top: int) -> _Table:
        # each batch once, as batch_latency predicts it; batches past the best are never run
        lat = profile.latencies(top, QUANTILE) if share >= 1.0 else mps_latencies(profile, top, share, QUANTILE)
        top = best_batch(lat, top)
        arr = np.asarray(lat[:top + 1], dtype=float)
        # every batch size's own rate, then fractions of saturation, where the backlog binds
        rates = np.concatenate([np.arange(1, top + 1) / arr[1:], np.array(SATURATION_GRID) * (top / arr[top])])
        batches = _steady(arr, rates, top)
        waits = _waits(arr, rates, batches, top)
        order = np.lexsort((-rates, waits))  # by wait, the higher rate first
        order = order[np.isfinite(waits[order])]
        r = rates[order]
        rises = np.flatnonzero(r > np.concatenate([[-1.0], np.maximum.accumulate(r)[:-1]]))
        keep = order[rises]
        return cls(waits[keep].tolist(), rates[keep].tolist(), batches[keep].tolist(), top,
                   _small_terms(arr, top),
                   tuple(_floors(arr, top).tolist()))

    def query(self, slo: float) -> Capacity | None:
        i = bisect.bisect_right(self.waits, slo)
        rule = Capacity(self.rates[i - 1], self.batches[i - 1], self.top) if i else None
        small = _small_batch_rate(*self.small, self.top, slo)
        if small > (rule.rate if rule else 0.0):
            steady = min(bisect.bisect_left(self.floor, small * (1.0 - 1e-12)) + 1, self.top)  # as _steady
            return Capacity(small, steady, self.top)
        return rule


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
