"""How co-located work shares one GPU: the one definition of the sharing rules.

The emulated GPU's arbiter, the simulator and the placement capacity model all use these
functions, so an emulated slice, a simulated slice and a planned slice behave alike.

Rules (a *job* is one batch executing; its *work* is its solo latency on the slice):
- MIG: jobs on different slices never affect each other (``slice_id`` differs).
- MPS: a client with active-thread share ``p`` gets ``p`` of the slice's SMs (shares adding up
  past 1 are scaled down proportionally). Only the part of a batch that fills SMs slows down;
  the shape comes from the profile's own curve (:func:`mps_terms`). On a fraction ``q``:

      M(q) = (L**K + (F + S/q)**K) ** (1/K)        t(b; q) = t(b) * M(q) / M(1)

  ``L`` is the curve's floor (its first point: launch and framework time a small batch
  cannot go below), ``a + c*b`` the line through its last two points (the batch filling the
  SMs), of which ``F = FIXED * a`` does not shrink with SMs and ``S = a - F + c*b`` scales as
  ``1/q``; ``K`` makes the bend between floor-bound and SM-bound smooth. A batch too small to
  fill its share is barely slowed; a large one slows as ``1/q``. ``FIXED`` and ``K`` are
  fitted on published MIG and MPS measurements (``reference/sharing/measurements.yaml``) and
  checked on a disjoint set (:func:`check_published`). A term for memory-bound work that keeps
  the whole bandwidth under MPS lowered the fit's error by 15% and changed no checked point's
  verdict, so the model goes without it.
  While another client is busy on the slice a job also slows by ``sqrt(f_self * f_other)``,
  ``f`` being each profile's ``mps_interference`` (its slowdown next to its own kind, 5-30%
  published, more for memory-bound work): a memory-bound neighbour slows it more. This pair
  rule is not fitted: the published co-location numbers found (``context`` in the
  measurements file) are pairs of one model with itself, which only bound ``f``.
- Time-slicing (plain co-location, no MPS): the busy jobs on a slice take equal turns
  (checked against published pairs: within 6%).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from profiles.profile import LatencyPoint, Profile, ProfileError, Provenance, Quantile

SharingMode = Literal["mps", "timeslice"]

FIXED = 0.9  # fraction of the curve's intercept that does not shrink with SMs (fitted)
KNEE = 8.0  # sharpness of the bend between floor-bound and SM-bound (fitted)
# (floor, fixed, scalable) as fractions of the batch's solo time: (0, 0, 1) is work that
# scales fully with its share, the rule for a job whose curve is unknown
FULLY_SCALABLE = (0.0, 0.0, 1.0)

MEASUREMENTS = Path(__file__).parent / "reference" / "sharing" / "measurements.yaml"
FIT_GRID_FIXED = tuple(i / 20 for i in range(21))
FIT_GRID_KNEE = (2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 20.0)
CHECK_TOLERANCE = 0.15


@dataclass(frozen=True)
class ActiveJob:
    slice_id: str
    client: str
    mode: SharingMode = "timeslice"
    share: float = 1.0  # MPS active-thread fraction in (0, 1]
    interference: float = 0.0  # slowdown next to a busy MPS client of its own kind
    terms: tuple[float, float, float] = FULLY_SCALABLE  # :func:`mps_terms` of this batch


def share_slowdown(terms: tuple[float, float, float], q: float, knee: float = KNEE) -> float:
    """How many times its solo time a batch with ``terms`` takes on a fraction ``q`` of the SMs."""
    if q >= 1.0:
        return 1.0
    floor, fixed, scalable = terms

    def m(x: float) -> float:
        return (floor**knee + (fixed + scalable / x) ** knee) ** (1.0 / knee)

    return max(1.0, m(q) / m(1.0))


def pair_interference(own: float, other: float) -> float:
    """Fractional slowdown of a job with pair slowdown ``own`` next to a busy ``other``."""
    return math.sqrt(max(0.0, own) * max(0.0, other))


def progress_rates(jobs: Sequence[ActiveJob]) -> list[float]:
    """Fraction of solo speed at which each active job progresses right now."""
    by_slice: dict[str, list[int]] = defaultdict(list)
    for i, j in enumerate(jobs):
        by_slice[j.slice_id].append(i)
    rates = [0.0] * len(jobs)
    for idx in by_slice.values():
        modes = {jobs[i].mode for i in idx}
        if modes == {"mps"}:
            total = sum(jobs[i].share for i in idx)
            scale = 1.0 / total if total > 1.0 else 1.0
            for i in idx:
                me = jobs[i]
                others = [jobs[k].interference for k in idx if jobs[k].client != me.client]
                slow = 1.0 + pair_interference(me.interference, max(others)) if others else 1.0
                # jobs of one client split that client's share
                same = sum(1 for k in idx if jobs[k].client == me.client)
                rates[i] = 1.0 / share_slowdown(me.terms, me.share * scale / same) / slow
        else:
            # time-slicing (or any mix with it): equal turns among busy jobs
            for i in idx:
                rates[i] = 1.0 / len(idx)
    return rates


def curve_split(points: tuple[LatencyPoint, ...], quantile: Quantile = "p99") -> tuple[float, float, float]:
    """(floor, intercept a, slope c) of a latency curve, seconds: the floor is its first
    point, ``a + c*b`` the line through its last two (intercept clamped to [0, floor])."""
    ys = [getattr(p, quantile) for p in points]
    if len(points) < 2:
        return ys[0], 0.0, ys[0] / points[0].batch
    lo, hi = points[-2], points[-1]
    c = max(0.0, (ys[-1] - ys[-2]) / (hi.batch - lo.batch))
    a = min(max(0.0, ys[-1] - c * hi.batch), ys[0])
    return ys[0], a, c


def mps_terms(profile: Profile, batch: int, quantile: Quantile = "p99",
              fixed_share: float = FIXED) -> tuple[float, float, float]:
    """(floor, fixed, scalable) of one batch as fractions of its solo latency (see the module
    docstring); what :class:`ActiveJob` carries so shared time follows the profile's curve."""
    return _terms(profile.latency(batch, quantile), curve_split(profile.points, quantile), batch, fixed_share)


def _terms(t: float, split: tuple[float, float, float], batch: int, fixed_share: float) -> tuple[float, float, float]:
    floor, a, c = split
    fixed = fixed_share * a
    return floor / t, fixed / t, (a - fixed + c * batch) / t


def mps_latencies(profile: Profile, top: int, share: float, quantile: Quantile = "p99") -> list[float]:
    """:func:`mps_latency` with busy neighbours of the same kind for every batch ``1..top``
    (index ``b``; index 0 unused), the curve read once: the planner's capacity tables."""
    solo = profile.latencies(top, quantile)
    split = curve_split(profile.points, quantile)
    busy = 1.0 + pair_interference(profile.mps_interference, profile.mps_interference)
    return [0.0] + [solo[b] * share_slowdown(_terms(solo[b], split, b, FIXED), share) * busy for b in range(1, top + 1)]


def mps_latency(profile: Profile, batch: int, share: float, busy_neighbours: bool,
                quantile: Quantile = "p99", neighbour_interference: float | None = None) -> float:
    """Seconds for one batch of a client holding ``share`` of an MPS slice (steady state).
    Busy neighbours are of the same kind unless ``neighbour_interference`` says otherwise."""
    t = profile.latency(batch, quantile) * share_slowdown(mps_terms(profile, batch, quantile), share)
    if not busy_neighbours:
        return t
    other = profile.mps_interference if neighbour_interference is None else neighbour_interference
    return t * (1.0 + pair_interference(profile.mps_interference, other))


def timeslice_latency(profile: Profile, batch: int, busy_tenants: int, quantile: Quantile = "p99") -> float:
    """Seconds for one batch when ``busy_tenants`` (>=1) jobs take turns on the slice."""
    return profile.latency(batch, quantile) * max(1, busy_tenants)


# --------------------------------------------------------------------------- published data


class _SliceModel(BaseModel):
    """A MIG slice (``slice``, ``sms``, ``memory_slices``) or an MPS client (``mps_threads``)."""

    model_config = ConfigDict(extra="forbid")
    slice: str | None = Field(default=None, min_length=1, description="MIG profile measured")
    sms: int | None = Field(default=None, ge=1, description="SMs of the slice")
    memory_slices: int | None = Field(default=None, ge=1, le=8, description="memory slices of 8 it holds")
    mps_threads: int | None = Field(default=None, ge=1, le=100, description="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    latency_ms: dict[int, float] = Field(min_length=1, description="batch size -> mean ms")

    @model_validator(mode="after")
    def _one_kind(self) -> _SliceModel:
        mig = (self.slice, self.sms, self.memory_slices)
        if (self.mps_threads is None) == (None in mig):
            raise ValueError("give either slice, sms and memory_slices (MIG) or mps_threads (MPS)")
        return self

    @property
    def name(self) -> str:
        return self.slice or f"mps {self.mps_threads}%"

    def shares(self, base: _SliceModel) -> tuple[float, float]:
        """(SM fraction, memory fraction) of ``base``: under MPS the threads and all the
        memory; a MIG slice holds both, so the lesser of its SM and memory fractions."""
        if self.mps_threads is not None and base.mps_threads is not None:
            return self.mps_threads / base.mps_threads, 1.0
        if self.sms and base.sms and self.memory_slices and base.memory_slices:
            q = min(self.sms / base.sms, self.memory_slices / base.memory_slices)
            return q, q
        raise ValueError(f"{self.name} and its baseline {base.name} must both be MIG or both MPS")


class _SeriesModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    role: Literal["fit", "check"] = Field(description="fits the constants, or checks them")
    model: str = Field(min_length=1)
    gpu: str = Field(min_length=1)
    setup: str = ""
    source: str = Field(min_length=1, description="paper/repository, file or table, commit")
    approximate: bool = Field(default=False, description="read off a figure")
    baseline: _SliceModel
    slices: list[_SliceModel] = Field(min_length=1)


class _NeighbourModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    batch: int = Field(ge=1)
    colocated_ms: float = Field(gt=0, description="the target's latency next to this neighbour")
    file: str = ""


class _ColocatedModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    role: Literal["check"] = Field(description="the time-slicing rule has no constants to fit")
    mode: Literal["timeslice"]
    model: str = Field(min_length=1)
    gpu: str = Field(min_length=1)
    batch: int = Field(ge=1)
    source: str = Field(min_length=1)
    solo_ms: float = Field(gt=0)
    neighbours: list[_NeighbourModel] = Field(min_length=1)


class _MeasurementsDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    series: list[_SeriesModel] = Field(min_length=1)
    colocated: list[_ColocatedModel] = Field(default_factory=list)
    context: list[dict] = Field(default_factory=list, description="published numbers kept for reference only")


@dataclass(frozen=True)
class PublishedPoint:
    """One published latency of a smaller share of a GPU, with the full-share curve it is
    predicted from."""

    series: str
    role: Literal["fit", "check"]
    model: str
    gpu: str
    slice: str  # MIG profile, or "mps P%"
    share: float  # SM fraction of the baseline (a MIG slice: the lesser of its SM and memory fractions)
    memory_share: float  # memory-bandwidth fraction of the baseline (1 under MPS)
    batch: int
    published_ms: float
    approximate: bool
    source: str
    baseline: Profile
    mode: SharingMode = "mps"  # timeslice: next to ``tenants - 1`` busy neighbours, taking turns
    tenants: int = 1


@dataclass(frozen=True)
class Prediction:
    point: PublishedPoint
    predicted_ms: float

    @property
    def error(self) -> float:
        """Relative error of the prediction against the published value."""
        return self.predicted_ms / self.point.published_ms - 1.0


def load_published(path: str | Path = MEASUREMENTS) -> list[PublishedPoint]:
    """Every published point of the measurements file (one-line error on a bad file)."""
    path = Path(path)
    try:
        doc = _MeasurementsDoc.model_validate(yaml.safe_load(path.read_text()))
    except (OSError, yaml.YAMLError) as e:
        raise ProfileError(f"{path}: cannot read: {e}") from None
    except ValidationError as e:
        first = e.errors()[0]
        raise ProfileError(f"{path}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    out = []
    for s in doc.series:
        b = s.baseline
        pts = tuple(LatencyPoint(k, v / 1e3, v / 1e3) for k, v in sorted(b.latency_ms.items()))
        base = Profile(model=s.model, variant=s.id, gpu=s.gpu, slice=b.slice or "gpu", max_batch=pts[-1].batch,
                       points=pts, provenance=Provenance(s.source))
        for sl in s.slices:
            try:
                q, m = sl.shares(b)
            except ValueError as e:
                raise ProfileError(f"{path}: series {s.id}: {e}") from None
            for batch, ms in sorted(sl.latency_ms.items()):
                out.append(PublishedPoint(s.id, s.role, s.model, s.gpu, sl.name, q, m, batch, ms,
                                          s.approximate, s.source, base))
    for c in doc.colocated:
        solo = Profile(model=c.model, variant=c.id, gpu=c.gpu, slice="gpu", max_batch=c.batch,
                       points=(LatencyPoint(c.batch, c.solo_ms / 1e3, c.solo_ms / 1e3),),
                       provenance=Provenance(c.source))
        for n in c.neighbours:
            out.append(PublishedPoint(c.id, c.role, c.model, c.gpu, f"with {n.model} b{n.batch}", 1.0, 1.0,
                                      c.batch, n.colocated_ms, False, c.source, solo, c.mode, 2))
    return out


def predict(point: PublishedPoint, fixed_share: float = FIXED, knee: float = KNEE) -> Prediction:
    """The model's latency for a published point, from its full-share curve alone."""
    base = point.baseline
    if point.mode == "timeslice":
        return Prediction(point, timeslice_latency(base, point.batch, point.tenants, "p50") * 1e3)
    terms = mps_terms(base, point.batch, "p50", fixed_share)
    t = base.latency(point.batch, "p50") * share_slowdown(terms, point.share, knee)
    return Prediction(point, t * 1e3)


def fit_constants(points: Sequence[PublishedPoint]) -> tuple[float, float]:
    """(FIXED, KNEE) on the grid minimising the squared relative error over the FIT points."""
    fit = [p for p in points if p.role == "fit"]
    if not fit:
        raise ValueError("no FIT points to fit the sharing model on")

    def sse(fk: tuple[float, float]) -> float:
        return sum(predict(p, *fk).error ** 2 for p in fit)

    return min(((f, k) for f in FIT_GRID_FIXED for k in FIT_GRID_KNEE), key=sse)


def check_published(path: str | Path = MEASUREMENTS) -> list[Prediction]:
    """The model's prediction of every CHECK point, with the constants in force."""
    return [predict(p) for p in load_published(path) if p.role == "check"]
