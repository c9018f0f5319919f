"""What a load test does, validated at the edge: :class:`LoadSpec` (pydantic).

The CLI and in-process callers (benchmarks) build one ``LoadSpec`` and hand it to
``loadgen.run.run_load``. Cross-field errors quote the values.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from loadgen import arrivals
from profiles.schema import RequestSloMs

DATATYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}


class InputSpec(BaseModel):
    """One input tensor to synthesize (seeded random values)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="input tensor name, as the model declares it")
    shape: tuple[int, ...] = Field(
        min_length=1, max_length=8, description="tensor shape; -1 dims are sent as 1"
    )
    datatype: str = Field(default="FP32", description="KServe v2 datatype, e.g. FP32, INT64")

    @field_validator("datatype")
    @classmethod
    def _known_datatype(cls, v: str) -> str:
        v = v.upper()
        if v not in DATATYPES:
            raise ValueError(f"unknown datatype {v!r}; known: {', '.join(DATATYPES)}")
        return v

    @field_validator("shape")
    @classmethod
    def _dims(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(d == 0 or d < -1 for d in v):
            raise ValueError(f"shape {list(v)} has a dim that is 0 or below -1")
        if int(np.prod([max(d, 1) for d in v])) > 64_000_000:
            raise ValueError(f"shape {list(v)} exceeds 64M elements")
        return v


def parse_target(url: str) -> tuple[str, str, int]:
    """``http://host:port``, ``https://host:port`` (HTTP over TLS) or ``grpc://host:port``
    -> (scheme: http or grpc, host, port)."""
    if "://" not in url:
        raise ValueError(f"target {url!r} needs a scheme: http://host:port or grpc://host:port")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "grpc"):
        raise ValueError(
            f"target {url!r}: scheme must be http, https or grpc, not {parts.scheme!r}"
        )
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"target {url!r}: bad port") from None
    if not parts.hostname:
        raise ValueError(f"target {url!r}: missing host")
    if parts.path not in ("", "/"):
        raise ValueError(f"target {url!r}: give only scheme://host:port, no path")
    default = {"http": 8000, "https": 443, "grpc": 8001}[parts.scheme]
    return parts.scheme.replace("https", "http"), parts.hostname, port or default


class LoadSpec(BaseModel):
    """One load test. Open loop sends at scheduled times and measures latency from them;
    closed loop keeps ``concurrency`` requests in flight."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field(description="http://host:port or grpc://host:port (KServe v2)")
    model: str = Field(default="", description="model to address (unless mix or trace names it)")
    mix: str | None = Field(
        default=None, description="weighted models, e.g. 'resnet:3,bert:1' (overrides model)"
    )
    mode: Literal["open", "closed"] = Field(default="open", description="open or closed loop")
    arrival: Literal["constant", "poisson", "gamma", "trace", "timestamps"] = Field(
        default="poisson", description="arrival process of the open loop"
    )
    rate: float = Field(default=100.0, gt=0, le=1e7, description="mean requests per second")
    cv: float = Field(
        default=4.0, gt=0, le=100,
        description="gamma coefficient of variation (4: the bursty case headrace's benchmarks and "
        "the simulator use; 1 would be Poisson)",
    )
    trace_cv: float = Field(
        default=1.0, gt=0, le=100,
        description="coefficient of variation of arrivals within each trace minute (1: Poisson)",
    )
    trace: Path | None = Field(
        default=None, description="per-minute CSV in the Azure Functions 2019 format"
    )
    trace_models: tuple[str, ...] = Field(
        default=(), description="models the trace's functions map onto, round-robin"
    )
    time_scale: float = Field(default=60.0, gt=0, le=1e6, description="trace minutes per second")
    rate_scale: float = Field(default=1.0, gt=0, le=1e6, description="multiplies trace counts")
    trace_start_minute: int = Field(default=0, ge=0, le=100_000, description="first trace minute")
    trace_top: int | None = Field(
        default=None, ge=1, le=10_000_000,
        description="replay only the N most invoked functions, dealt onto trace_models by rank",
    )
    trace_sample: int | None = Field(
        default=None, ge=1, le=10_000_000,
        description="replay N functions drawn with trace_seed, dealt onto trace_models by rank",
    )
    trace_seed: int = Field(default=0, ge=0, le=2**63 - 1, description="seed of trace_sample's draw")
    timestamps: Path | None = Field(default=None, description="file of send times (s), one a line")
    intervals_us: bool = Field(default=False, description="timestamps file holds gaps in µs")
    duration_s: float = Field(default=10.0, gt=0, le=7 * 86400, description="measured seconds")
    requests: int | None = Field(
        default=None, ge=1, le=10**9, description="measure this many requests instead"
    )
    warmup_s: float = Field(default=1.0, ge=0, le=3600, description="unmeasured warm-up seconds")
    slo_ms: RequestSloMs | None = Field(
        default=None, description="per-request SLO; sent as Triton timeout (µs)"
    )
    send_timeout: bool = Field(default=True, description="send the SLO as the timeout parameter")
    priority: int | None = Field(
        default=None, ge=0, le=2**31, description="Triton priority (1 = highest, 0 = default)"
    )
    inputs: tuple[InputSpec, ...] | None = Field(
        default=None, description="inputs to synthesize; default: read the model's metadata"
    )
    input_file: Path | None = Field(
        default=None, description="JSON file with real v2 inputs ({'inputs': [...]})"
    )
    input_dir: Path | None = Field(
        default=None,
        description="folder of .npy (the model's one input) or .npz (inputs by name) files, one "
        "request each, sent in turn in file-name order",
    )
    dataset: Literal["digits"] | None = Field(
        default=None,
        description="send the rows of a data set in turn: 'digits' is the held-out split the "
        "digits family is scored on (--batch rows per request)",
    )
    batch: int = Field(default=1, ge=1, le=65536, description="size sent for -1 (batch) dims")
    protocol: Literal["binary", "json"] = Field(
        default="binary", description="HTTP tensor encoding"
    )
    http_client: Literal["raw", "aiohttp"] = Field(
        default="raw", description="HTTP client: raw asyncio keep-alive pool, or aiohttp"
    )
    concurrency: int = Field(default=8, ge=1, le=100_000, description="closed-loop in flight")
    connections: int = Field(
        default=64, ge=1, le=10_000, description="HTTP connections per process (gRPC: one channel)"
    )
    processes: int = Field(default=1, ge=1, le=256, description="worker processes")
    seed: int = Field(default=0, ge=0, description="seed of arrivals and payloads")
    request_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, description="client gives up (error 'timeout') after this"
    )
    realtime: bool = Field(
        default=False,
        description="send under SCHED_RR priority 1 (root or CAP_SYS_NICE): on a busy host a "
        "woken sender otherwise waits for a scheduler tick (ms of send lag)",
    )
    window_s: float = Field(default=1.0, gt=0, le=3600, description="timeline window")
    tls: bool = Field(
        default=False, description="speak TLS (HTTPS, or a secure gRPC channel); https:// implies it"
    )
    ca_file: Path | None = Field(
        default=None, description="PEM CA bundle the server's certificate must chain to "
        "(default: the system's trust store)",
    )
    client_cert: Path | None = Field(
        default=None, description="PEM client certificate for mutual TLS (with client_key)"
    )
    client_key: Path | None = Field(default=None, description="PEM key of client_cert")
    api_key: str | None = Field(
        default=None, min_length=1, description="sent as 'Authorization: Bearer KEY' (HTTP "
        "header, gRPC metadata) on every request",
    )
    model_keys: tuple[tuple[str, str], ...] = Field(
        default=(), description="(model, key) pairs: a key per model or mix entry, over api_key"
    )
    lag_warn_ms: float = Field(
        default=1.0, gt=0, le=60_000, description="warn when p99 send lag exceeds this"
    )

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        parse_target(v)
        return v.rstrip("/")

    @model_validator(mode="after")
    def _cross(self) -> LoadSpec:
        if self.mix:
            arrivals.parse_mix(self.mix)
        if self.arrival == "trace":
            if self.trace is None:
                raise ValueError("arrival 'trace' needs trace (an Azure Functions 2019 CSV)")
            if not self.trace_models and not self.model and not self.mix:
                raise ValueError("arrival 'trace' needs trace_models (or model) to map onto")
            if self.trace_top is not None and self.trace_sample is not None:
                raise ValueError("trace_top and trace_sample: choose one")
        elif self.trace_top is not None or self.trace_sample is not None:
            raise ValueError("trace_top and trace_sample need arrival 'trace'")
        elif self.arrival == "timestamps" and self.timestamps is None:
            raise ValueError("arrival 'timestamps' needs a timestamps file")
        if not (self.model or self.mix or self.trace_models):
            raise ValueError("name a model (model, mix or trace_models)")
        if self.mode == "closed" and self.arrival in ("trace", "timestamps"):
            raise ValueError(f"closed loop ignores arrivals; arrival {self.arrival!r} needs open")
        given = [n for n in ("inputs", "input_file", "input_dir", "dataset")
                 if getattr(self, n) is not None]  # fmt: skip
        if len(given) > 1:
            raise ValueError(f"give one of inputs, input_file, input_dir and dataset, not {given}")
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("mutual TLS needs both client_cert and client_key")
        if (self.ca_file or self.client_cert) and not self.secure:
            raise ValueError("ca_file and client_cert need tls (or an https:// target)")
        unknown = sorted({m for m, _ in self.model_keys} - set(self.models))
        if unknown:
            raise ValueError(f"model_keys name {unknown}, not among the models {list(self.models)}")
        if self.mode == "closed" and self.concurrency < self.processes:
            raise ValueError(
                f"concurrency ({self.concurrency}) is below processes ({self.processes})"
            )
        return self

    @property
    def scheme(self) -> str:
        return parse_target(self.target)[0]

    @property
    def secure(self) -> bool:
        """TLS on, by the flag or an https:// target."""
        return self.tls or self.target.startswith("https://")

    def key_for(self, model: str) -> str | None:
        """The API key requests for ``model`` carry: its own, else ``api_key``."""
        return dict(self.model_keys).get(model, self.api_key)

    @property
    def models(self) -> tuple[str, ...]:
        if self.arrival == "trace":
            return self.trace_models or (
                tuple(m for m, _ in arrivals.parse_mix(self.mix)) if self.mix else (self.model,)
            )
        if self.mix:
            return tuple(m for m, _ in arrivals.parse_mix(self.mix))
        return (self.model,)

    def trace_replay(self) -> arrivals.AzureReplay:
        """The trace replay ``arrival: trace`` runs: which functions, onto which models
        (:meth:`~loadgen.arrivals.AzureReplay.table`), over the minutes the run covers."""
        funcs = _trace_functions(self.trace)  # type: ignore[arg-type]
        minutes = int(np.ceil((self.warmup_s + self.duration_s) * self.time_scale / 60.0)) + 1
        return arrivals.AzureReplay(
            funcs, self.models, time_scale=self.time_scale, rate_scale=self.rate_scale,
            cv=self.trace_cv, start_minute=self.trace_start_minute, minutes=minutes,
            top=self.trace_top, sample=self.trace_sample, seed=self.trace_seed,
        )

    def schedule(self) -> arrivals.Schedule:
        """The whole open-loop schedule: warm-up then measured period."""
        rng = np.random.default_rng(self.seed)
        if self.arrival == "trace":
            sched = self.trace_replay().schedule(rng)
            return sched if self.requests else sched.window(0.0, self.warmup_s + self.duration_s)
        if self.arrival == "timestamps":
            t = arrivals.read_timestamps(self.timestamps, self.intervals_us)  # type: ignore[arg-type]
            idx = self._pick_models(len(t), rng)
            sched = arrivals.Schedule(t, idx, self.models)
            return sched if self.requests else sched.window(0.0, self.warmup_s + self.duration_s)
        proc = arrivals.make_process(self.arrival, self.rate, self.cv)
        if self.requests:
            horizon = self.warmup_s + 1.2 * self.requests / self.rate + 10.0
        else:
            horizon = self.warmup_s + self.duration_s
        if self.mix:
            sched = arrivals.Mix(proc, arrivals.parse_mix(self.mix)).schedule(horizon, rng)
        else:
            sched = arrivals.single(self.model, proc, horizon, rng)
        return sched

    def _pick_models(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if not self.mix:
            return np.zeros(n, dtype=np.int32)
        w = np.array([w for _, w in arrivals.parse_mix(self.mix)])
        return rng.choice(len(w), size=n, p=w / w.sum()).astype(np.int32)

    def measured(self, sched: arrivals.Schedule) -> tuple[arrivals.Schedule, float]:
        """The schedule cut to warm-up + measured part, and the measured duration (s)."""
        if self.requests:
            warm = sched.window(0.0, self.warmup_s)
            rest = sched.window(self.warmup_s, np.inf).first(self.requests)
            cut = sched.first(len(warm) + len(rest))
            end = float(rest.times[-1]) if len(rest) else self.warmup_s
            if len(rest) > 1:  # the measured span, extended by one mean gap
                end += (end - float(rest.times[0])) / (len(rest) - 1)
            return cut, max(end - self.warmup_s, 1e-6)
        return sched, self.duration_s


def _trace_functions(path: Path) -> tuple[arrivals.AzureFunction, ...]:
    """The trace file's functions, read once while the file stays as it is (a run prints the
    mapping, then builds its schedule: the real Azure file is read once, not twice)."""
    try:
        st = Path(path).stat()
    except OSError:
        return tuple(arrivals.read_azure_trace(path))  # says why, naming the file
    return _read_trace(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _read_trace(path: str, mtime_ns: int, size: int) -> tuple[arrivals.AzureFunction, ...]:
    return tuple(arrivals.read_azure_trace(path))
