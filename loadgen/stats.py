"""Load-test statistics: mergeable HDR histograms of latency and send lag, SLO attainment,
goodput, rejections and errors by kind, per model and per variant, plus a timeline.

A :class:`Recorder` is fed one call per request (``record``) by a live driver or by the
simulator. Latency is measured from the request's *scheduled* time (wrk2: no coordinated
omission). Recorders from several processes merge exactly: ``Recorder.encode()`` gives a
plain, picklable dict and ``Recorder.merge(encoded)`` adds it (HDR ``encode`` /
``decode_and_add``), so a merged recorder equals one that saw all samples itself.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from gateway.policy.types import RejectReason
from loadgen.accuracy import variant_mix

OK = "ok"  # answered successfully
REJECTED = "rejected"  # answered at once with 429 / RESOURCE_EXHAUSTED (admission control)
# 429 / RESOURCE_EXHAUSTED for a request the target had queued and then found it could no longer
# finish in time (headrace's x-headrace-reject-reason "expired" or "failed"): answered before
# its deadline, but not at arrival
EXPIRED = "expired"
QUEUED_REASONS = frozenset({RejectReason.EXPIRED, RejectReason.FAILED})


def refusal(reason: str | None) -> str:
    """The outcome of a 429 / RESOURCE_EXHAUSTED given its reject reason (None: not said)."""
    return EXPIRED if reason in QUEUED_REASONS else REJECTED


NO_VARIANT = "-"  # the response did not name a variant

LATENCY_MAX_US = 3_600_000_000  # one hour
WINDOW_LATENCY_MAX_US = 600_000_000  # ten minutes, coarser histograms per timeline window
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
FLUSH_EVERY = 8192  # buffered values per histogram before a vectorized flush


def new_latency_histogram() -> HdrHistogram:
    """Microseconds from 1 µs to one hour at 3 significant digits."""
    return HdrHistogram(1, LATENCY_MAX_US, 3)


def _window_histogram() -> HdrHistogram:
    return HdrHistogram(1, WINDOW_LATENCY_MAX_US, 2)


def to_us(seconds: float) -> int:
    return max(1, int(round(seconds * 1e6)))


def _merge_into(dst: HdrHistogram, encoded: str | bytes) -> None:
    if encoded:
        dst.decode_and_add(encoded)


def _encode(h: HdrHistogram) -> bytes:
    return h.encode() if h.get_total_count() else b""


def record_many(h: HdrHistogram, values: np.ndarray) -> None:
    """Record many values (integers >= 1) at once; the same buckets as ``record_value``,
    computed with numpy (``record_value`` is pure Python and too slow for the hot path)."""
    v = np.clip(np.asarray(values, dtype=np.int64), 1, h.highest_trackable_value)
    if not len(v):
        return
    # bit length of (v | sub_bucket_mask), exact for values below 2**53
    pow2ceiling = np.frexp((v | h.sub_bucket_mask).astype(np.float64))[1].astype(np.int64)
    bucket = pow2ceiling - h.unit_magnitude - (h.sub_bucket_half_count_magnitude + 1)
    sub = v >> (bucket + h.unit_magnitude)
    idx = ((bucket + 1) << h.sub_bucket_half_count_magnitude) + sub - h.sub_bucket_half_count
    counts = np.ctypeslib.as_array(h.counts)
    counts += np.bincount(idx, minlength=len(counts)).astype(counts.dtype)
    h.total_count += len(v)
    h.min_value = min(h.min_value, int(v.min()))
    h.max_value = max(h.max_value, int(v.max()))


class _Buffered:
    """An HDR histogram fed through an append-only buffer, flushed in vectorized chunks."""

    __slots__ = ("hist", "buf")

    def __init__(self, factory=None) -> None:
        self.hist = (factory or new_latency_histogram)()
        self.buf = array("q")

    def add_value(self, us: int) -> None:
        self.buf.append(us)
        if len(self.buf) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> HdrHistogram:
        if self.buf:
            record_many(self.hist, np.frombuffer(self.buf, dtype=np.int64))
            self.buf = array("q")
        return self.hist


class Series:
    """Counts and latencies of one (model, variant) stream."""

    __slots__ = (
        "offered", "ok", "good", "rejected", "expired", "errors", "latency_sum_us", "_latency",
        "_reject_latency", "_reject_wire",
    )  # fmt: skip

    def __init__(self) -> None:
        self.offered = 0
        self.ok = 0
        self.good = 0  # answered OK within its SLO
        self.rejected = 0  # refused at arrival
        self.expired = 0  # refused after queueing
        self.errors: Counter[str] = Counter()
        self.latency_sum_us = 0  # of OK answers, for an exact mean
        self._latency = _Buffered()  # OK answers, µs from the scheduled time
        self._reject_latency = _Buffered()  # refusals at arrival, µs from the scheduled time
        self._reject_wire = _Buffered()  # the same from the actual send: the server's share

    @property
    def latency(self) -> HdrHistogram:
        return self._latency.flush()

    @property
    def reject_latency(self) -> HdrHistogram:
        return self._reject_latency.flush()

    @property
    def reject_wire(self) -> HdrHistogram:
        return self._reject_wire.flush()

    def add(self, other: Series) -> None:
        self.offered += other.offered
        self.ok += other.ok
        self.good += other.good
        self.rejected += other.rejected
        self.expired += other.expired
        self.errors.update(other.errors)
        self.latency_sum_us += other.latency_sum_us
        self.latency.add(other.latency)
        self.reject_latency.add(other.reject_latency)
        self.reject_wire.add(other.reject_wire)

    def encode(self) -> dict[str, Any]:
        return {
            "offered": self.offered,
            "ok": self.ok,
            "good": self.good,
            "rejected": self.rejected,
            "expired": self.expired,
            "errors": dict(self.errors),
            "latency_sum_us": self.latency_sum_us,
            "latency": _encode(self.latency),
            "reject_latency": _encode(self.reject_latency),
            "reject_wire": _encode(self.reject_wire),
        }

    @classmethod
    def decode(cls, d: dict[str, Any]) -> Series:
        s = cls()
        s.offered, s.ok, s.good, s.rejected = d["offered"], d["ok"], d["good"], d["rejected"]
        s.expired = d.get("expired", 0)
        s.errors = Counter(d["errors"])
        s.latency_sum_us = d["latency_sum_us"]
        _merge_into(s.latency, d["latency"])
        _merge_into(s.reject_latency, d["reject_latency"])
        _merge_into(s.reject_wire, d["reject_wire"])
        return s


@dataclass
class Window:
    """One timeline bin (by scheduled time)."""

    offered: int = 0
    ok: int = 0
    good: int = 0
    rejected: int = 0
    errors: int = 0
    lat: _Buffered = field(default_factory=lambda: _Buffered(_window_histogram))

    @property
    def latency(self) -> HdrHistogram:  # OK answers, µs
        return self.lat.flush()


class Recorder:
    """Collects per-request outcomes. Not thread-safe; one per process or event loop.

    ``window_s`` is the width of timeline bins, keyed by scheduled time (seconds from the start
    of the measured period).
    """

    def __init__(self, window_s: float = 1.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self.series: dict[tuple[str, str], Series] = {}
        self._send_lag = _Buffered()  # µs behind schedule when the send began
        # µs each request waited for a connection of the client's own pool (1 µs: none)
        self._pool_wait = _Buffered()
        self.pool_queued = 0  # requests that waited for a connection at all
        self.windows: dict[int, Window] = {}

    @property
    def send_lag(self) -> HdrHistogram:
        return self._send_lag.flush()

    @property
    def pool_wait(self) -> HdrHistogram:
        return self._pool_wait.flush()

    # ---- feeding -------------------------------------------------------------------------
    def record(
        self,
        model: str,
        variant: str | None,
        scheduled: float,
        latency_s: float,
        slo_s: float | None,
        outcome: str,
        send_lag_s: float | None = None,
        pool_wait_s: float | None = None,
    ) -> None:
        """One request: ``scheduled`` (s from the measured start), ``latency_s`` from the
        scheduled time to the answer, ``outcome`` = OK, REJECTED, EXPIRED or an error kind;
        ``send_lag_s`` how late the send began, ``pool_wait_s`` how long it then waited for a
        connection (None: not measured)."""
        key = (model, variant or NO_VARIANT)
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series()
        w_idx = int(scheduled // self.window_s)
        w = self.windows.get(w_idx)
        if w is None:
            w = self.windows[w_idx] = Window()
        s.offered += 1
        w.offered += 1
        us = to_us(latency_s)
        if outcome == OK:
            s.ok += 1
            w.ok += 1
            s._latency.add_value(us)
            s.latency_sum_us += us
            w.lat.add_value(us)
            if slo_s is None or latency_s <= slo_s:
                s.good += 1
                w.good += 1
        elif outcome == REJECTED:
            s.rejected += 1
            w.rejected += 1
            s._reject_latency.add_value(us)
            if send_lag_s is not None:
                s._reject_wire.add_value(to_us(max(0.0, latency_s - send_lag_s)))
        elif outcome == EXPIRED:
            s.expired += 1
            w.rejected += 1
        else:
            s.errors[outcome] += 1
            w.errors += 1
        if send_lag_s is not None:
            self._send_lag.add_value(to_us(send_lag_s))
        if pool_wait_s is not None:
            self._pool_wait.add_value(to_us(pool_wait_s))
            if pool_wait_s > 0:
                self.pool_queued += 1

    # ---- merging -------------------------------------------------------------------------
    def encode(self) -> dict[str, Any]:
        """A plain, picklable snapshot for sending to another process."""
        return {
            "window_s": self.window_s,
            "series": [[m, v, s.encode()] for (m, v), s in self.series.items()],
            "send_lag": _encode(self.send_lag),
            "pool_wait": _encode(self.pool_wait),
            "pool_queued": self.pool_queued,
            "windows": [
                [i, w.offered, w.ok, w.good, w.rejected, w.errors, _encode(w.latency)]
                for i, w in self.windows.items()
            ],
        }

    def merge(self, encoded: dict[str, Any]) -> None:
        if encoded["window_s"] != self.window_s:
            raise ValueError(
                f"cannot merge recorders with windows {encoded['window_s']} s and {self.window_s} s"
            )
        for m, v, d in encoded["series"]:
            other = Series.decode(d)
            mine = self.series.get((m, v))
            if mine is None:
                self.series[(m, v)] = other
            else:
                mine.add(other)
        _merge_into(self.send_lag, encoded["send_lag"])
        _merge_into(self.pool_wait, encoded.get("pool_wait", b""))
        self.pool_queued += encoded.get("pool_queued", 0)
        for i, offered, ok, good, rejected, errors, lat in encoded["windows"]:
            w = self.windows.get(i)
            if w is None:
                w = self.windows[i] = Window()
            w.offered += offered
            w.ok += ok
            w.good += good
            w.rejected += rejected
            w.errors += errors
            _merge_into(w.latency, lat)

    # ---- reading -------------------------------------------------------------------------
    def total(self) -> Series:
        out = Series()
        for s in self.series.values():
            out.add(s)
        return out

    def by_model(self) -> dict[str, Series]:
        out: dict[str, Series] = {}
        for (m, _), s in self.series.items():
            out.setdefault(m, Series()).add(s)
        return out

    def summary(self, duration_s: float, slo_s: float | None = None) -> dict[str, Any]:
        """Everything a report needs, as plain JSON-able data (times in ms, rates in /s)."""
        if duration_s <= 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s}")
        # NOTE: without an SLO there is nothing to attain: attainment is None (n/a), never
        # "100%" for answers of any latency; goodput is then the OK answers per second
        slo = slo_s is not None
        out = summarize(self.total(), duration_s, slo)
        out["slo_ms"] = None if slo_s is None else slo_s * 1e3
        out["send_lag_ms"] = {
            "p50": _ms(self.send_lag, 50.0),
            "p99": _ms(self.send_lag, 99.0),
            "max": self.send_lag.get_max_value() / 1e3 if self.send_lag.get_total_count() else 0.0,
        }
        waits = self.pool_wait.get_total_count()
        out["pool_wait_ms"] = None if not waits else {
            "p50": _ms(self.pool_wait, 50.0),
            "p99": _ms(self.pool_wait, 99.0),
            "max": self.pool_wait.get_max_value() / 1e3,
            "queued_share": self.pool_queued / waits,
        }  # fmt: skip
        out["per_model"] = {m: summarize(s, duration_s, slo) for m, s in sorted(self.by_model().items())}
        out["per_variant"] = [
            {"model": m, "variant": v, **summarize(s, duration_s, slo)}
            for (m, v), s in sorted(self.series.items())
        ]
        out["variants"] = variant_mix(out["per_variant"])
        out["timeline"] = self.timeline(slo)
        return out

    def timeline(self, slo: bool = True) -> list[dict[str, Any]]:
        """Per window: start (s), offered rate, throughput, goodput (/s) and p99 (ms)."""
        rows = []
        if not self.windows:
            return rows
        for i in range(min(self.windows), max(self.windows) + 1):
            w = self.windows.get(i, Window())
            rows.append(
                {
                    "t": i * self.window_s,
                    "offered_rps": w.offered / self.window_s,
                    "throughput_rps": w.ok / self.window_s,
                    "goodput_rps": w.good / self.window_s,
                    "rejected_rps": w.rejected / self.window_s,
                    "errors": w.errors,
                    "attainment": w.good / w.offered if w.offered and slo else None,
                    "p50_ms": _ms(w.latency, 50.0),
                    "p99_ms": _ms(w.latency, 99.0),
                }
            )
        return rows


def percentile(h: HdrHistogram, pct: float) -> int:
    """``h.get_value_at_percentile(pct)`` with the bucket walk done by numpy."""
    total = h.get_total_count()
    if not total:
        return 0
    target = h.get_target_count_at_percentile(pct)
    cum = np.cumsum(np.ctypeslib.as_array(h.counts))
    idx = int(np.searchsorted(cum, target, side="left"))
    value = h.get_value_from_index(min(idx, h.counts_len - 1))
    return h.get_highest_equivalent_value(value) if pct else h.get_lowest_equivalent_value(value)


def _ms(h: HdrHistogram, pct: float) -> float | None:
    if not h.get_total_count():
        return None
    return percentile(h, pct) / 1e3


def summarize(s: Series, duration_s: float, slo: bool = True) -> dict[str, Any]:
    """Counts, rates and latency percentiles of one series; ``slo`` False: the run had no
    SLO, so its attainment is None."""
    lat = {f"p{p:g}": _ms(s.latency, p) for p in PERCENTILES}
    if s.latency.get_total_count():
        lat["mean"] = s.latency_sum_us / s.ok / 1e3
        lat["max"] = s.latency.get_max_value() / 1e3
    else:
        lat["mean"] = lat["max"] = None
    return {
        "offered": s.offered,
        "ok": s.ok,
        "good": s.good,
        "rejected": s.rejected,
        "expired": s.expired,
        "errors": dict(sorted(s.errors.items())),
        "error_count": sum(s.errors.values()),
        "attainment": s.good / s.offered if s.offered and slo else None,
        "offered_rps": s.offered / duration_s,
        "throughput_rps": s.ok / duration_s,
        "goodput_rps": s.good / duration_s,
        "latency_ms": lat,
        "reject_latency_p99_ms": _ms(s.reject_latency, 99.0),
        "reject_latency_from_send_p99_ms": _ms(s.reject_wire, 99.0),
    }
