"""The gateway's YAML config (``headrace serve --config FILE``), validated by pydantic.

Minimal shape::

    listen: {host: 127.0.0.1, http_port: 8000, grpc_port: 8001}
    models:
      - name: resnet50            # the name clients address
        slo_ms: 100
        max_batch: 32
        priority: guaranteed      # or best-effort
        replicas:
          - url: 127.0.0.1:9000   # a Triton server's HTTP endpoint
            protocol: http        # or grpc (then url is its gRPC endpoint)
            variant: resnet50     # the Triton model name on that server
            profile: resnet50@A100-80GB/1g.10gb   # reference profile, or a profile YAML path

Errors name the field and the value (:class:`ConfigError`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway.backends.tls import load_backend_tls
from gateway.errors import ConfigError
from gateway.policy.config import SchedulerConfig
from gateway.policy.types import Priority
from profiles.profile import LatencyPoint, Profile, ProfileError, ProfileSet, load_profiles
from profiles.schema import GatewaySettings


class TritonTlsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ca_file: str | None = Field(default=None, description="PEM CA bundle that signed Triton's certificate "
                                "(default: the system's CAs)")
    cert_file: str | None = Field(default=None, description="client certificate (PEM) for mutual TLS")
    key_file: str | None = Field(default=None, description="the client certificate's private key (PEM)")
    server_name: str | None = Field(default=None, min_length=1, description="name Triton's certificate is "
                                    "checked against (default: the url's host)")

    @model_validator(mode="after")
    def _pair(self) -> TritonTlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS needs both)")
        return self


class ReplicaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=3, description="host:port of the Triton server's endpoint for `protocol`")
    protocol: Literal["http", "grpc"] = Field(
        default="http",
        description="how the gateway talks to Triton: http (binary tensors, the leaner path) or grpc",
    )
    variant: str = Field(min_length=1, description="Triton model name of the variant on that server")
    profile: str = Field(
        min_length=1,
        description="latency profile: 'variant@gpu/slice' from the reference set, or a profile YAML path",
    )
    max_inflight: int = Field(
        default=2, ge=1, le=64,
        description="batches sent to the replica at once; it runs them one after another, so 2 "
        "keeps the next batch waiting at Triton while one runs (the round trip overlaps it; the "
        "scheduler's pipeline_lead_s says how early the next batch is formed)",
    )
    overhead_ms: float = Field(
        default=0.0, ge=0, le=10_000,
        description="time every batch takes beyond the profile (network, Triton, gateway), added to "
        "the profile's latencies the scheduler plans with",
    )
    id: str | None = Field(default=None, description="replica id (default: variant@url)")
    price_per_hour: float | None = Field(
        default=None, ge=0, le=1e6,
        description="what the replica's hardware costs per hour (its slice's share of its GPU's price); a "
        "variant's cost per answer is its profile's seconds per row at full batches times this price "
        "(the cost objective and cost caps need it; the operator fills it from the GpuPool)",
    )
    tls: TritonTlsConfig | None = Field(default=None, description="speak TLS to this Triton (gRPC: its "
                                        "--grpc-use-ssl endpoint; HTTP: a TLS proxy in front of it)")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.removeprefix("grpc://").removeprefix("http://")
        host, _, port = v.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"url {v!r} must be host:port")
        return v


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200, description="served model name clients address")
    slo_ms: float = Field(default=100.0, gt=0, le=3_600_000, description="default latency SLO, ms")
    max_batch: int = Field(default=32, ge=1, le=4096, description="largest batch the gateway forms")
    priority: Literal["guaranteed", "best-effort"] = Field(
        default="guaranteed", description="default priority class of the model's requests"
    )
    deadline_margin: float = Field(
        default=0.03, ge=0.0, le=0.5,
        description="fraction of each request's SLO kept outside the plan for what the gateway "
        "cannot see (client send, network, the answer's way back); batches aim at the rest",
    )
    objective: Literal["accuracy", "cost"] = Field(
        default="accuracy",
        description="which allowed variant a request takes: accuracy = the most accurate predicted to meet "
        "its deadline; cost = the cheapest that meets its accuracy floor and deadline (best-effort "
        "requests always take the cheapest)",
    )
    replicas: list[ReplicaConfig] = Field(
        description="where the model runs; none: the model is addressable and refused no_replica (503, "
        "Retry-After) until a replica is added, as a best-effort model a partial plan sheds",
    )


class GatewayConfig(GatewaySettings):
    """``headrace serve``'s YAML: the gateway settings (one definition, :mod:`profiles.schema`)
    and the models with their replicas. The operator renders it from a plan
    (:func:`placement.apply.render.gateway_config`)."""

    models: list[ModelConfig] = Field(min_length=1, description="served models")
    base_dir: Path | None = Field(default=None, exclude=True, description="resolves relative profile paths")

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        names = [m.name for m in self.models]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"model names must be unique; repeated: {sorted(dup)}")
        ids = [r.id or f"{r.variant}@{r.url}" for m in self.models for r in m.replicas]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"replica ids must be unique; repeated: {sorted(dup)}")
        return self


def _format(err: ValidationError, where: str, prefix: tuple[str, ...] = ()) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in (*prefix, *e["loc"])) or "(top)"
        msg = e["msg"].removeprefix("Value error, ")
        # a whole-object check quotes its values in its message
        quiet = e["type"] == "missing" or isinstance(e.get("input"), dict)
        parts.append(f"{loc}: {msg}" if quiet else f"{loc}: {msg} (got {e.get('input')!r})")
    return f"{where}: " + "; ".join(parts)


def scheduler_config(doc: Any, where: str = "gateway config") -> SchedulerConfig:
    """The ``scheduler:`` settings, validated; :class:`ConfigError` names ``scheduler.<key>``."""
    try:
        return SchedulerConfig.model_validate(doc)
    except ValidationError as e:
        raise ConfigError(_format(e, where, ("scheduler",))) from None


def parse_config(doc: Any, where: str = "gateway config", base_dir: Path | None = None) -> GatewayConfig:
    """The config validated, its ``scheduler:`` settings included; :class:`ConfigError`."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(doc).__name__}")
    try:
        cfg = GatewayConfig.model_validate(doc)
    except ValidationError as e:
        raise ConfigError(_format(e, where)) from None
    scheduler_config(cfg.scheduler, where)
    cfg.base_dir = base_dir
    return cfg


def with_ports(cfg: GatewayConfig, http_port: int | None = None, grpc_port: int | None = None,
               where: str = "command line") -> GatewayConfig:
    """``cfg`` listening on the ports given (None: as configured), each checked like the YAML's
    (0-65535); :class:`ConfigError` names the field and the value."""
    listen = cfg.listen.model_dump()
    for key, port in (("http_port", http_port), ("grpc_port", grpc_port)):
        if port is not None:
            listen[key] = port
    try:
        cfg.listen = type(cfg.listen).model_validate(listen)
    except ValidationError as e:
        raise ConfigError(_format(e, where, ("listen",))) from None
    return cfg


def load_config(path: str | Path) -> GatewayConfig:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    return parse_config(doc, str(path), path.parent)


# --------------------------------------------------------------------------- resolved form


@dataclass(frozen=True)
class ServedReplica:
    id: str
    url: str
    protocol: str  # http | grpc
    variant: str
    profile: Profile
    max_inflight: int
    tls: Any = None  # gateway.backends.tls.BackendTls: TLS to this replica's Triton (None: plain)
    price_per_hour: float | None = None  # its hardware's price (variant costs); None: unknown


@dataclass(frozen=True)
class ServedModel:
    name: str
    slo: float  # seconds
    max_batch: int
    priority: Priority
    replicas: tuple[ServedReplica, ...]
    margin: float = 0.0  # fraction of the SLO kept outside the plan
    objective: str = "accuracy"  # which allowed variant a request takes (accuracy | cost)


def resolve_profile(ref: str, max_batch: int, base_dir: Path | None = None,
                    reference: ProfileSet | None = None) -> Profile:
    """A profile from ``variant@gpu/slice`` (reference set) or a YAML file, capped at ``max_batch``."""
    path = Path(ref)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    if path.suffix in (".yaml", ".yml") or path.exists():
        profiles = load_profiles(path)
        if len(profiles) != 1:
            raise ProfileError(f"{path}: expected one profile, found {len(profiles)}")
        p = profiles[0]
    else:
        variant, at, rest = ref.partition("@")
        gpu, slash, slc = rest.partition("/")
        if not (at and slash and variant and gpu and slc):
            raise ProfileError(f"profile {ref!r} is neither 'variant@gpu/slice' nor an existing YAML file")
        p = (reference or ProfileSet.reference()).get(variant, gpu, slc)
    return p.with_max_batch(max_batch)


def with_overhead(p: Profile, seconds: float) -> Profile:
    """``p`` with ``seconds`` added to every latency point (what serving adds to the GPU time)."""
    points = tuple(LatencyPoint(x.batch, x.p50 + seconds, x.p99 + seconds) for x in p.points)
    return replace(p, points=points)


def resolve(cfg: GatewayConfig) -> list[ServedModel]:
    """Profiles loaded and ids assigned; raises :class:`ConfigError` naming the bad reference."""
    reference = ProfileSet.reference()
    out = []
    for i, m in enumerate(cfg.models):
        replicas = []
        for j, r in enumerate(m.replicas):
            try:
                prof = resolve_profile(r.profile, m.max_batch, cfg.base_dir, reference)
            except ProfileError as e:
                raise ConfigError(f"models.{i}.replicas.{j}.profile: {e}") from None
            if r.overhead_ms:
                prof = with_overhead(prof, r.overhead_ms / 1e3)
            tls = None
            if r.tls is not None:
                tls = load_backend_tls(r.tls.ca_file, r.tls.cert_file, r.tls.key_file, r.tls.server_name,
                                       f"models.{i}.replicas.{j}.tls", cfg.base_dir)
            replicas.append(ServedReplica(r.id or f"{r.variant}@{r.url}", r.url, r.protocol, r.variant, prof,
                                         r.max_inflight, tls, r.price_per_hour))
        prio = Priority.GUARANTEED if m.priority == "guaranteed" else Priority.BEST_EFFORT
        out.append(ServedModel(m.name, m.slo_ms / 1e3, m.max_batch, prio, tuple(replicas), m.deadline_margin,
                               m.objective))
    return out
