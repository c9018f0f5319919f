"""Measure a live Triton model across batch sizes and concurrency, and write a Profile.

After ``warmup`` requests per batch size, the profiler sends ``samples`` requests per batch
size one at a time, in ``chunks``, the batch sizes taking turns (so a busy spell on the host
spreads over all of them). p50 is the lowest chunk median (``estimator="quietest"``: robust
to other processes loading a shared host; ``"median"`` takes the plain median of all
samples); p99 is over all samples. A batch size whose chunk medians spread by more than
``stability`` gets more chunks (up to ``max_rounds - 1``) and is flagged if it stays unstable.
Each further concurrency level runs ``samples`` requests from that many clients at once and
records throughput and latency; those go into the provenance notes (a :class:`Profile` holds
concurrency-1 numbers).

``measure="client"`` keeps latency as the client sees it (network, serialisation and Triton's
queue included): what a caller of this server waits. ``measure="compute"`` subtracts the
mean serving overhead, taken from Triton's own statistics (mean client latency minus mean
``compute_infer`` of that batch size), leaving the backend's execution time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from profiles.profile import LatencyPoint, Profile, Provenance, save_profiles


class ProfilerError(RuntimeError):
    """The profiler cannot measure: unreachable server, unknown model, bad request."""


class ProfilerConfig(BaseModel):
    """What to measure and how to label the resulting profile."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, description="Triton endpoint, e.g. http://127.0.0.1:8000 or 127.0.0.1:8001")
    model: str = Field(min_length=1, description="model name on the server")
    model_version: str = Field(default="", description="model version; empty = server's choice")
    protocol: Literal["http", "grpc"] = Field(default="http", description="KServe v2 HTTP or gRPC")
    batches: list[int] | None = Field(
        default=None, description="batch sizes; default 1, 2, 4, ... up to the model's max_batch_size"
    )
    concurrency: list[int] = Field(default=[1], description="client concurrency levels to measure")
    samples: int = Field(default=50, ge=5, le=100_000, description="timed requests per batch size")
    warmup: int = Field(default=5, ge=0, le=10_000, description="untimed requests per batch size")
    chunks: int = Field(default=3, ge=1, le=100, description="timed samples are taken in this many chunks")
    max_rounds: int = Field(
        default=3, ge=1, le=20, description="chunks may be added this many times (minus one) while unstable"
    )
    stability: float = Field(
        default=0.1, gt=0, le=1, description="largest relative spread of the chunk medians counted as stable"
    )
    monotone: bool = Field(
        default=True, description="raise any latency below a smaller batch's to it (noise, not physics)"
    )
    estimator: Literal["quietest", "median"] = Field(
        default="quietest",
        description="p50 = lowest chunk median (robust to load spells on a shared host) or plain median",
    )
    measure: Literal["client", "compute"] = Field(
        default="client", description="client-seen latency, or model execution time (overhead removed)"
    )
    gpu: str = Field(default="cpu", min_length=1, description="GPU model label of the profile")
    slice: str = Field(default="cpu", min_length=1, description="slice label of the profile (MIG profile or gpu)")
    variant: str | None = Field(default=None, description="variant name; default the model name")
    family: str | None = Field(default=None, description="model family; default the variant up to its first '-'")
    accuracy: float | None = Field(default=None, ge=0, le=1, description="known accuracy of the variant")
    memory_mb: float = Field(default=0.0, ge=0, description="memory the variant needs, MB")
    mps_interference: float = Field(default=0.1, ge=0, le=2, description="MPS slowdown to record")
    timeout_s: float = Field(default=30.0, gt=0, le=3600, description="per-request timeout, seconds")
    seed: int = Field(default=0, ge=0, description="seed of the random input data")

    @field_validator("batches")
    @classmethod
    def _batches(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if not v or any(not 1 <= b <= 4096 for b in v):
            raise ValueError(f"batch sizes must be a non-empty list of integers in [1, 4096], got {v}")
        return sorted(set(v))

    @field_validator("concurrency")
    @classmethod
    def _concurrency(cls, v: list[int]) -> list[int]:
        if not v or any(not 1 <= c <= 256 for c in v):
            raise ValueError(f"concurrency levels must be a non-empty list of integers in [1, 256], got {v}")
        return sorted({1, *v})  # concurrency 1 gives the profile's latency points


def parse_config(**kwargs: Any) -> ProfilerConfig:
    """A validated config; errors name the field and the value."""
    try:
        return ProfilerConfig(**kwargs)
    except ValidationError as e:
        parts = [f"{'.'.join(map(str, x['loc']))}: {x['msg']} (got {x.get('input')!r})" for x in e.errors()]
        raise ProfilerError("invalid profiler settings: " + "; ".join(parts)) from None


@dataclass(frozen=True)
class BatchStats:
    batch: int
    concurrency: int
    samples: int
    p50: float  # seconds, as recorded in the profile (after ``measure``)
    p99: float
    client_p50: float  # seconds, as the client saw them
    client_p99: float
    throughput: float  # rows per second over the timed window
    overhead: float  # mean client latency minus mean compute_infer (0 if unknown)
    rounds: int
    stable: bool


@dataclass
class ProfileResult:
    profile: Profile
    stats: list[BatchStats] = field(default_factory=list)

    def table(self) -> str:
        head = "batch  conc  p50 ms   p99 ms   client p50  rows/s    overhead ms  stable"
        rows = [
            f"{s.batch:>5}  {s.concurrency:>4}  {s.p50 * 1e3:>7.3f}  {s.p99 * 1e3:>7.3f}  "
            f"{s.client_p50 * 1e3:>10.3f}  {s.throughput:>8.1f}  {s.overhead * 1e3:>11.3f}  {s.stable}"
            for s in self.stats
        ]
        return "\n".join([head, *rows])


# --------------------------------------------------------------------------- server access


def _strip_scheme(url: str) -> str:
    for scheme in ("http://", "grpc://"):
        if url.startswith(scheme):
            return url[len(scheme):].rstrip("/")
    return url.rstrip("/")


@dataclass(frozen=True)
class _Input:
    name: str
    datatype: str
    dims: tuple[int, ...]  # per request, without the batch dimension


class _Server:
    """The few calls the profiler needs, the same over HTTP and gRPC."""

    def __init__(self, cfg: ProfilerConfig) -> None:
        self.cfg = cfg
        self.address = _strip_scheme(cfg.url)
        if cfg.protocol == "http":
            import tritonclient.http as mod
        else:
            import tritonclient.grpc as mod
        self.mod = mod
        try:
            self.client = self.new_client()
            live = self.client.is_server_live()
        except Exception as e:  # noqa: BLE001  (any transport failure means unreachable)
            raise ProfilerError(f"cannot reach Triton at {cfg.url} over {cfg.protocol}: {e}") from None
        if not live:
            raise ProfilerError(f"Triton at {cfg.url} answers but is not live")

    def new_client(self) -> Any:
        if self.cfg.protocol == "http":
            return self.mod.InferenceServerClient(
                self.address, connection_timeout=self.cfg.timeout_s, network_timeout=self.cfg.timeout_s
            )
        return self.mod.InferenceServerClient(self.address)

    def _json(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> dict:
        if self.cfg.protocol == "grpc":
            kw["as_json"] = True
        return fn(*args, **kw)

    def available_models(self) -> list[str]:
        with contextlib.suppress(Exception):
            idx = self._json(self.client.get_model_repository_index)
            entries = idx.get("models", []) if isinstance(idx, dict) else idx
            return sorted({m.get("name", "?") for m in entries})
        return []

    def describe(self) -> tuple[list[_Input], int]:
        """(inputs, max_batch_size) of the model; raises for an unknown or unready model."""
        m, v = self.cfg.model, self.cfg.model_version
        try:
            meta = self._json(self.client.get_model_metadata, m, v)
            conf = self._json(self.client.get_model_config, m, v)
        except Exception as e:  # noqa: BLE001  (tritonclient raises its own exception types)
            known = ", ".join(self.available_models()) or "none"
            raise ProfilerError(
                f"model {m!r} is not available at {self.cfg.url}: {_msg(e)}; models there: {known}"
            ) from None
        conf = conf.get("config", conf)
        max_bs = int(conf.get("max_batch_size", 0) or 0)
        inputs = []
        for i in meta.get("inputs", []):
            shape = [int(d) for d in i["shape"]]
            dims = tuple(shape[1:] if max_bs > 0 else shape)
            if any(d < 0 for d in dims):
                raise ProfilerError(
                    f"model {m!r} input {i['name']} has variable dims {list(dims)}; "
                    "the profiler needs fixed per-request shapes"
                )
            inputs.append(_Input(i["name"], i["datatype"], dims))
        if not inputs:
            raise ProfilerError(f"model {m!r} declares no inputs")
        return inputs, max_bs

    def compute_stats(self) -> dict[int, tuple[int, int]]:
        """batch size -> (count, total ns) of ``compute_infer`` so far."""
        try:
            st = self._json(self.client.get_inference_statistics, self.cfg.model, self.cfg.model_version)
        except Exception:  # noqa: BLE001  (statistics are optional: fall back to no overhead)
            return {}
        out: dict[int, tuple[int, int]] = {}
        for ms in st.get("model_stats", []):
            for b in ms.get("batch_stats", []):
                ci = b.get("compute_infer", {})
                n, ns = int(ci.get("count", 0)), int(ci.get("ns", 0))
                c0, ns0 = out.get(int(b["batch_size"]), (0, 0))
                out[int(b["batch_size"])] = (c0 + n, ns0 + ns)
        return out


def _msg(e: BaseException) -> str:
    m = getattr(e, "message", None)
    return (m() if callable(m) else m) or str(e)


_NP = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
    "FP32": np.float32, "FP64": np.float64,
}


def _data(inp: _Input, batch: int, batched: bool, rng: np.random.Generator) -> np.ndarray:
    shape = ((batch,) if batched else ()) + inp.dims
    if inp.datatype == "BYTES":
        return np.full(shape, b"x", dtype=np.object_)
    if inp.datatype not in _NP:
        raise ProfilerError(f"input {inp.name}: datatype {inp.datatype} is not supported by the profiler")
    dt = _NP[inp.datatype]
    if np.issubdtype(dt, np.floating):
        return rng.random(shape).astype(dt)
    return rng.integers(0, 2, size=shape).astype(dt)


# --------------------------------------------------------------------------- measuring


def _make_inputs(server: _Server, inputs: list[_Input], arrays: list[np.ndarray]) -> list[Any]:
    out = []
    for spec, a in zip(inputs, arrays, strict=True):
        x = server.mod.InferInput(spec.name, list(a.shape), spec.datatype)
        x.set_data_from_numpy(a)
        out.append(x)
    return out


def _infer_seconds(server: _Server, client: Any, reqs: list[Any]) -> float:
    cfg = server.cfg
    t = time.perf_counter()
    try:
        if cfg.protocol == "http":
            client.infer(cfg.model, reqs, model_version=cfg.model_version)
        else:
            client.infer(cfg.model, reqs, model_version=cfg.model_version, client_timeout=cfg.timeout_s)
    except Exception as e:  # noqa: BLE001  (tritonclient raises its own exception types)
        raise ProfilerError(f"inference on {cfg.model!r} failed: {_msg(e)}") from None
    return time.perf_counter() - t


def _interleaved(server: _Server, reqs: dict[int, list[Any]], n: int) -> dict[int, list[float]]:
    """``n`` sequential requests per batch size, batch sizes taking turns: a busy spell on
    the host then spreads over all batch sizes instead of skewing one of them."""
    lats: dict[int, list[float]] = {b: [] for b in reqs}
    for _ in range(n):
        for b, r in reqs.items():
            lats[b].append(_infer_seconds(server, server.client, r))
    return lats


def _concurrent(server: _Server, reqs: list[Any], n: int, concurrency: int) -> tuple[list[float], float]:
    """``n`` requests from ``concurrency`` clients at once; (latencies s, wall seconds)."""
    lats: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker(count: int) -> None:
        client = server.new_client()
        mine: list[float] = []
        try:
            mine = [_infer_seconds(server, client, reqs) for _ in range(count)]
        except ProfilerError as e:
            with lock:
                errors.append(str(e))
        finally:
            with contextlib.suppress(Exception):
                client.close()
        with lock:
            lats.extend(mine)

    per = [n // concurrency + (1 if i < n % concurrency else 0) for i in range(concurrency)]
    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in per if c]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise ProfilerError(errors[0])
    return lats, wall


def _halves_agree(lats: list[float], tolerance: float) -> bool:
    h = len(lats) // 2
    a, b = float(np.median(lats[:h])), float(np.median(lats[h:]))
    return abs(a - b) <= tolerance * max(a, b)


def _spread(medians: list[float]) -> float:
    return (max(medians) - min(medians)) / min(medians)


def measure_solo(server: _Server, reqs: dict[int, list[Any]]) -> dict[int, BatchStats]:
    """Concurrency-1 statistics per batch size (the profile's latency points)."""
    cfg = server.cfg
    if cfg.warmup:
        _interleaved(server, reqs, cfg.warmup)
    per_chunk = max(3, cfg.samples // cfg.chunks)
    lats: dict[int, list[float]] = {b: [] for b in reqs}
    medians: dict[int, list[float]] = {b: [] for b in reqs}
    overhead_ns: dict[int, list[float]] = {b: [] for b in reqs}
    todo = list(reqs)
    chunks = 0
    while todo:
        chunks += 1
        before = server.compute_stats()
        got = _interleaved(server, {b: reqs[b] for b in todo}, per_chunk)
        after = server.compute_stats()
        for b, ls in got.items():
            lats[b].extend(ls)
            medians[b].append(float(np.median(ls)))
            (n0, ns0), (n1, ns1) = before.get(b, (0, 0)), after.get(b, (0, 0))
            if n1 > n0:  # mean client latency minus mean compute_infer of this chunk
                overhead_ns[b].append(float(np.mean(ls)) * 1e9 - (ns1 - ns0) / (n1 - n0))
        # after the planned chunks, only batch sizes whose chunk medians disagree go on
        if chunks >= cfg.chunks:
            more = chunks < cfg.chunks + cfg.max_rounds - 1
            todo = [b for b in todo if more and _spread(medians[b]) > cfg.stability]
    result: dict[int, BatchStats] = {}
    for b in reqs:
        ls = lats[b]
        c50 = min(medians[b]) if cfg.estimator == "quietest" else float(np.percentile(ls, 50))
        c99 = max(float(np.percentile(ls, 99)), c50)
        overhead = max(0.0, float(np.mean(overhead_ns[b])) / 1e9) if overhead_ns[b] else 0.0
        shift = overhead if cfg.measure == "compute" else 0.0
        p50 = max(c50 - shift, 1e-6)
        result[b] = BatchStats(
            batch=b, concurrency=1, samples=len(ls), p50=p50, p99=max(c99 - shift, p50),
            client_p50=c50, client_p99=c99, throughput=b / float(np.mean(ls)), overhead=overhead,
            rounds=len(medians[b]), stable=_spread(medians[b]) <= cfg.stability,
        )
    return result


def measure_concurrent(server: _Server, reqs: list[Any], batch: int, concurrency: int) -> BatchStats:
    cfg = server.cfg
    if cfg.warmup:
        _concurrent(server, reqs, cfg.warmup, concurrency)
    lats, wall = _concurrent(server, reqs, cfg.samples, concurrency)
    c50, c99 = float(np.percentile(lats, 50)), float(np.percentile(lats, 99))
    return BatchStats(
        batch=batch, concurrency=concurrency, samples=len(lats), p50=c50, p99=c99, client_p50=c50,
        client_p99=c99, throughput=len(lats) * batch / wall, overhead=0.0, rounds=1,
        stable=_halves_agree(lats, cfg.stability),
    )


def monotone_points(points: list[LatencyPoint]) -> tuple[list[LatencyPoint], list[int]]:
    """Running maximum of p50 and p99 over increasing batch sizes; also the batches raised.
    A bigger batch never really finishes sooner: a dip is measurement noise, and the
    batcher's "largest batch within budget" search relies on latency growing with batch."""
    out: list[LatencyPoint] = []
    raised: list[int] = []
    for p in points:
        if out and (p.p50 < out[-1].p50 or p.p99 < out[-1].p99):
            raised.append(p.batch)
            p = LatencyPoint(p.batch, max(p.p50, out[-1].p50), max(p.p99, out[-1].p99))
        out.append(p)
    return out, raised


def default_batches(max_batch: int) -> list[int]:
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


def run_profiler(cfg: ProfilerConfig, log: Callable[[str], None] | None = None) -> ProfileResult:
    """Measure the model ``cfg`` names and build its :class:`Profile`."""
    server = _Server(cfg)
    try:
        return _run(server, log)
    finally:
        with contextlib.suppress(Exception):
            server.client.close()


def _run(server: _Server, log: Callable[[str], None] | None) -> ProfileResult:
    cfg = server.cfg
    inputs, max_bs = server.describe()
    batched = max_bs > 0
    batches = cfg.batches or (default_batches(max_bs) if batched else [1])
    if not batched and batches != [1]:
        raise ProfilerError(f"model {cfg.model!r} does not batch (max_batch_size 0): only batch 1 can be measured")
    if batched and batches[-1] > max_bs:
        raise ProfilerError(f"batch {batches[-1]} exceeds the model's max_batch_size ({max_bs})")
    rng = np.random.default_rng(cfg.seed)
    reqs = {b: _make_inputs(server, inputs, [_data(i, b, batched, rng) for i in inputs]) for b in batches}
    solo = measure_solo(server, reqs)
    stats = list(solo.values())
    for b in batches:
        for c in cfg.concurrency:
            if c > 1:
                stats.append(measure_concurrent(server, reqs[b], b, c))
    stats.sort(key=lambda s: (s.batch, s.concurrency))
    if log:
        for s in stats:
            log(f"batch {s.batch:>4} concurrency {s.concurrency:>3}: p50 {s.p50 * 1e3:.3f} ms  "
                f"p99 {s.p99 * 1e3:.3f} ms  {s.throughput:.1f} rows/s{'' if s.stable else '  (unstable)'}")
    variant = cfg.variant or cfg.model
    notes = [
        f"{cfg.samples} timed requests in {cfg.chunks} chunks after {cfg.warmup} warm-up per batch "
        f"size, one at a time, batch sizes interleaved; p50 = {cfg.estimator} chunk median; "
        f"latency = {cfg.measure}"
        + (" (client latency minus mean overhead from Triton compute_infer statistics)"
           if cfg.measure == "compute" else " (as seen by a tritonclient caller)"),
    ]
    points = [LatencyPoint(b, solo[b].p50, solo[b].p99) for b in sorted(solo)]
    if cfg.monotone:
        points, raised = monotone_points(points)
        if raised:
            notes.append(f"made non-decreasing in batch size: p50 or p99 raised at batch {raised}")
    unstable = [s.batch for s in solo.values() if not s.stable]
    if unstable:
        notes.append(f"chunk medians still spread > {cfg.stability:.0%} at batch {unstable}")
    for c in (c for c in cfg.concurrency if c > 1):
        tp = ", ".join(f"b{s.batch}: {s.throughput:.0f}/s p50 {s.client_p50 * 1e3:.2f}ms"
                       for s in stats if s.concurrency == c)
        notes.append(f"concurrency {c}: {tp}")
    profile = Profile(
        model=cfg.family or variant.split("-")[0],
        variant=variant,
        gpu=cfg.gpu,
        slice=cfg.slice,
        max_batch=max(batches) if batched else 1,
        points=tuple(points),
        memory_mb=cfg.memory_mb,
        accuracy=cfg.accuracy,
        mps_interference=cfg.mps_interference,
        provenance=Provenance(
            source=f"headrace profile {cfg.protocol}://{server.address} model {cfg.model}"
            + (f" version {cfg.model_version}" if cfg.model_version else ""),
            kind="measured",
            measured_batches=tuple(sorted(solo)),
            notes="; ".join(notes),
        ),
    )
    return ProfileResult(profile, stats)


def profile_model(out: str | Path | None = None, log: Callable[[str], None] | None = None,
                  **settings: Any) -> ProfileResult:
    """Validate ``settings`` (see :class:`ProfilerConfig`), measure, and write YAML to ``out``."""
    result = run_profiler(parse_config(**settings), log)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        save_profiles(out, [result.profile])
    return result


def parse_int_list(text: str, what: str) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4]; a clear error naming ``what`` otherwise."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ProfilerError(f"{what} must be comma-separated integers, got {text!r}") from None


__all__: Sequence[str] = (
    "BatchStats", "ProfileResult", "ProfilerConfig", "ProfilerError", "default_batches", "parse_config",
    "parse_int_list", "profile_model", "run_profiler",
)
