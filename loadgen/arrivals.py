"""Arrival processes: pure, seeded generators of send times (seconds from the run's start).

"When" is separate from "send": a driver asks a process for timestamps and sleeps until
each one. Every process takes an injected ``numpy.random.Generator``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHUNK = 4096  # gaps drawn per call to the generator


@dataclass(frozen=True)
class Constant:
    rate: float  # requests per second

    def chunk(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, 1.0 / self.rate)

    def gaps(self, rng: np.random.Generator) -> Iterator[float]:
        while True:
            yield from self.chunk(rng, CHUNK)


@dataclass(frozen=True)
class Poisson:
    rate: float

    def chunk(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(1.0 / self.rate, n)

    def gaps(self, rng: np.random.Generator) -> Iterator[float]:
        while True:
            yield from self.chunk(rng, CHUNK)


@dataclass(frozen=True)
class Gamma:
    """Gamma inter-arrival gaps: shape = 1/cv², scale = cv²/rate (cv = 1 is Poisson)."""

    rate: float
    cv: float = 1.0

    def chunk(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.gamma(1.0 / self.cv**2, self.cv**2 / self.rate, n)

    def gaps(self, rng: np.random.Generator) -> Iterator[float]:
        while True:
            yield from self.chunk(rng, CHUNK)


def times(
    process: Constant | Poisson | Gamma, duration: float, rng: np.random.Generator
) -> np.ndarray:
    """All arrival times in [0, duration) of one seeded run (gaps drawn CHUNK at a time)."""
    parts: list[np.ndarray] = []
    t = 0.0
    while True:
        ts = t + np.cumsum(process.chunk(rng, CHUNK))
        if ts[-1] >= duration:
            parts.append(ts[ts < duration])
            break
        parts.append(ts)
        t = float(ts[-1])
    return np.concatenate(parts)


Process = Constant | Poisson | Gamma


def make_process(kind: str, rate: float, cv: float = 1.0) -> Process:
    """The named arrival process; raises on an unknown name and lists the known ones."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if kind == "constant":
        return Constant(rate)
    if kind == "poisson":
        return Poisson(rate)
    if kind == "gamma":
        if cv <= 0:
            raise ValueError(f"cv must be > 0, got {cv}")
        return Gamma(rate, cv)
    raise ValueError(f"unknown arrival process {kind!r}; known: constant, poisson, gamma")


# ---- schedules: times plus which model each arrival addresses -----------------------------


@dataclass(frozen=True)
class Schedule:
    """Sorted send times (s from the run's start) and, per arrival, an index into ``models``."""

    times: np.ndarray  # float64, non-decreasing
    model_idx: np.ndarray  # int32, same length
    models: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.times)

    def shift(self, dt: float) -> Schedule:
        return Schedule(self.times + dt, self.model_idx, self.models)

    def window(self, start: float, end: float) -> Schedule:
        """Arrivals with start <= t < end."""
        lo, hi = np.searchsorted(self.times, [start, end], side="left")
        return Schedule(self.times[lo:hi], self.model_idx[lo:hi], self.models)

    def first(self, n: int) -> Schedule:
        return Schedule(self.times[:n], self.model_idx[:n], self.models)

    def share(self, i: int, n: int) -> Schedule:
        """The i-th of n interleaved shares (for worker processes)."""
        return Schedule(self.times[i::n], self.model_idx[i::n], self.models)

    @property
    def duration(self) -> float:
        return float(self.times[-1]) if len(self.times) else 0.0


def single(model: str, process: Process, duration: float, rng: np.random.Generator) -> Schedule:
    t = times(process, duration, rng)
    return Schedule(t, np.zeros(len(t), dtype=np.int32), (model,))


@dataclass(frozen=True)
class Mix:
    """One arrival process whose arrivals go to models at random in proportion to weights."""

    process: Process
    weights: tuple[tuple[str, float], ...]  # (model, weight > 0)

    def __post_init__(self) -> None:
        if not self.weights:
            raise ValueError("a mix needs at least one (model, weight)")
        for m, w in self.weights:
            if not w > 0:
                raise ValueError(f"weight of model {m!r} must be > 0, got {w}")

    def schedule(self, duration: float, rng: np.random.Generator) -> Schedule:
        t = times(self.process, duration, rng)
        w = np.array([w for _, w in self.weights], dtype=float)
        idx = rng.choice(len(w), size=len(t), p=w / w.sum()).astype(np.int32)
        return Schedule(t, idx, tuple(m for m, _ in self.weights))


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    """``"resnet:3,bert:1"`` -> (("resnet", 3.0), ("bert", 1.0)); a bare name weighs 1."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, w = part.partition(":")
        try:
            weight = float(w) if w else 1.0
        except ValueError:
            raise ValueError(f"bad weight {w!r} for model {name!r} in mix {text!r}") from None
        if not name or not weight > 0:
            raise ValueError(f"bad mix entry {part!r} in {text!r}: want MODEL[:WEIGHT>0]")
        out.append((name, weight))
    if not out:
        raise ValueError(f"empty model mix {text!r}")
    return tuple(out)


def merge(schedules: list[Schedule]) -> Schedule:
    """One schedule from several (per-model processes run side by side)."""
    models: list[str] = []
    ts, idx = [], []
    for s in schedules:
        remap = np.array([_index(models, m) for m in s.models], dtype=np.int32)
        ts.append(s.times)
        idx.append(remap[s.model_idx] if len(s.models) else s.model_idx)
    t = np.concatenate(ts) if ts else np.empty(0)
    i = np.concatenate(idx) if idx else np.empty(0, dtype=np.int32)
    order = np.argsort(t, kind="stable")
    return Schedule(t[order], i[order].astype(np.int32), tuple(models))


def _index(names: list[str], name: str) -> int:
    if name not in names:
        names.append(name)
    return names.index(name)


# ---- trace replay -------------------------------------------------------------------------


class TraceError(ValueError):
    """A trace file is malformed; the message names the file and line."""


@dataclass(frozen=True)
class AzureFunction:
    owner: str
    app: str
    function: str
    trigger: str
    counts: np.ndarray  # invocations per minute


AZURE_HEADER = ("HashOwner", "HashApp", "HashFunction", "Trigger")


def read_azure_trace(path: str | Path) -> list[AzureFunction]:
    """Parse the Azure Functions 2019 per-minute format
    (``HashOwner,HashApp,HashFunction,Trigger,1..1440``). Raises :class:`TraceError` naming
    the line of the first malformed row."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise TraceError(f"{path}: cannot read trace: {e.strerror}") from None
    if not lines:
        raise TraceError(
            f"{path}:1: empty file, expected the header {','.join(AZURE_HEADER)},1,..."
        )
    header = [h.strip() for h in lines[0].split(",")]
    if tuple(header[:4]) != AZURE_HEADER or len(header) < 5:
        raise TraceError(
            f"{path}:1: header must start with {','.join(AZURE_HEADER)},1,... got {lines[0][:80]!r}"
        )
    minutes = header[4:]
    if minutes != [str(i) for i in range(1, len(minutes) + 1)]:
        raise TraceError(f"{path}:1: minute columns must be 1..N in order")
    out = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = line.split(",")
        if len(cells) != len(header):
            raise TraceError(f"{path}:{n}: expected {len(header)} columns, got {len(cells)}")
        try:
            counts = np.array([int(c) for c in cells[4:]], dtype=np.int64)
        except ValueError:
            bad = next(c for c in cells[4:] if not c.strip().lstrip("-").isdigit())
            raise TraceError(f"{path}:{n}: per-minute count {bad!r} is not an integer") from None
        if (counts < 0).any():
            raise TraceError(f"{path}:{n}: per-minute counts must be >= 0")
        if not cells[2].strip():
            raise TraceError(f"{path}:{n}: empty HashFunction")
        out.append(AzureFunction(cells[0], cells[1], cells[2], cells[3], counts))
    if not out:
        raise TraceError(f"{path}: no function rows after the header")
    return out


@dataclass(frozen=True)
class AzureReplay:
    """Replays per-minute counts. Each function maps to a model: ``mapping`` where it names
    the function; else, with ``top`` or ``sample``, only the ``top`` most invoked functions
    (or ``sample`` functions drawn with ``seed``) replay, dealt onto ``models`` round-robin by
    rank of invocation count (the busiest to the first model); else every function, dealt
    round-robin in file order, as AlpaServe does. ``time_scale`` compresses time (60 makes a
    trace minute last one second, keeping counts); ``rate_scale`` multiplies counts. Within
    each minute arrivals are Poisson (cv = 1) or Gamma(cv).

    Ranks count the invocations in the minutes replayed. The real Azure file holds 46,412
    functions whose invocations are concentrated in a few: dealt in file order, a handful
    of models take nearly all the load; by rank, each model gets functions of every size."""

    functions: tuple[AzureFunction, ...]
    models: tuple[str, ...]
    mapping: tuple[tuple[str, str], ...] = ()  # (HashFunction, model)
    time_scale: float = 1.0
    rate_scale: float = 1.0
    cv: float = 1.0
    start_minute: int = 0
    minutes: int | None = None
    top: int | None = None  # replay only the top-N functions by invocations
    sample: int | None = None  # replay N functions drawn with ``seed`` (uniformly, without replacement)
    seed: int = 0

    def _counts(self, f: AzureFunction) -> np.ndarray:
        end = len(f.counts) if self.minutes is None else self.start_minute + self.minutes
        return f.counts[self.start_minute : end]

    def chosen(self) -> list[AzureFunction]:
        """The functions replayed: all of them in file order, or the selected ones by rank
        (most invocations first; ties in file order)."""
        if self.top is None and self.sample is None:
            return list(self.functions)
        if self.top is not None and self.sample is not None:
            raise ValueError("choose top or sample, not both")
        k = self.top if self.top is not None else self.sample
        if k is None or k < 1:
            raise ValueError(f"top / sample must be at least 1, got {k}")
        pool = list(range(len(self.functions)))
        if self.sample is not None and k < len(pool):
            pool = sorted(np.random.default_rng(self.seed).choice(len(pool), size=k, replace=False).tolist())
        totals = {i: int(self._counts(self.functions[i]).sum()) for i in pool}
        ranked = sorted(pool, key=lambda i: (-totals[i], i))
        return [self.functions[i] for i in ranked[:k]]

    def model_of(self, chosen: Sequence[AzureFunction] | None = None) -> dict[str, str]:
        """Function -> model, over ``chosen`` (default :meth:`chosen`)."""
        explicit = dict(self.mapping)
        out = {}
        for i, f in enumerate(self.chosen() if chosen is None else chosen):
            out[f.function] = explicit.get(f.function) or self.models[i % len(self.models)]
        return out

    def table(self) -> list[tuple[int, str, int, str]]:
        """The mapping, as printed: (rank, function hash, invocations replayed, model)."""
        chosen = self.chosen()
        fmap = self.model_of(chosen)
        return [(k + 1, f.function, int(self._counts(f).sum()), fmap[f.function]) for k, f in enumerate(chosen)]

    def schedule(self, rng: np.random.Generator) -> Schedule:
        if not self.models and not self.mapping:
            raise ValueError("trace replay needs models (or a function->model mapping)")
        if self.time_scale <= 0 or self.rate_scale <= 0 or self.cv <= 0:
            raise ValueError("time_scale, rate_scale and cv must be > 0")
        chosen = self.chosen()
        fmap = self.model_of(chosen)
        names: list[str] = []
        minute_len = 60.0 / self.time_scale
        ts, idx = [], []
        # NOTE: each (function, minute) draws from its own stream, so a longer replay extends a
        # shorter one with the same seed instead of reshuffling it
        base = int(rng.integers(2**63))
        position = {id(f): fi for fi, f in enumerate(self.functions)}
        for f in chosen:
            fi = position[id(f)]
            counts = self._counts(f) * self.rate_scale
            mi = _index(names, fmap[f.function])
            for k, c in enumerate(counts):
                if c <= 0:
                    continue
                rate = c / minute_len
                proc = Poisson(rate) if self.cv == 1.0 else Gamma(rate, self.cv)
                sub = np.random.default_rng([base, fi, self.start_minute + k])
                t = times(proc, minute_len, sub) + k * minute_len
                ts.append(t)
                idx.append(np.full(len(t), mi, dtype=np.int32))
        t = np.concatenate(ts) if ts else np.empty(0)
        i = np.concatenate(idx) if idx else np.empty(0, dtype=np.int32)
        order = np.argsort(t, kind="stable")
        return Schedule(t[order], i[order], tuple(names))


def read_timestamps(path: str | Path, intervals_us: bool = False) -> np.ndarray:
    """Send times from a file, one number a line (``#`` comments and blank lines skipped):
    seconds from the start, non-decreasing; or with ``intervals_us`` gaps in microseconds
    (perf_analyzer's ``--request-intervals`` format)."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise TraceError(f"{path}: cannot read timestamps: {e.strerror}") from None
    vals: list[float] = []
    for n, line in enumerate(lines, start=1):
        s = line.split("#", 1)[0].strip()
        if not s:
            continue
        try:
            v = float(s)
        except ValueError:
            raise TraceError(f"{path}:{n}: {s!r} is not a number") from None
        if not np.isfinite(v) or v < 0:
            raise TraceError(f"{path}:{n}: {s!r} must be a finite number >= 0")
        if not intervals_us and vals and v < vals[-1]:
            raise TraceError(f"{path}:{n}: timestamp {v} is before the previous one {vals[-1]}")
        vals.append(v)
    if not vals:
        raise TraceError(f"{path}: no timestamps")
    arr = np.asarray(vals, dtype=float)
    return np.cumsum(arr) / 1e6 if intervals_us else arr
