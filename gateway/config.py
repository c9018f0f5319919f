"""The gateway's config (``headrace serve --config FILE``; the models:
:mod:`profiles.gateway_config`) read and validated, its ``scheduler:`` settings included, then
resolved into what the gateway serves: :class:`ServedModel` with its replicas' profiles loaded
and TLS files read. Errors name the field and the value (:class:`~gateway.errors.ConfigError`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.backends.tls import load_backend_tls
from gateway.errors import ConfigError
from gateway.partition import replica_id
from gateway.policy.config import SchedulerConfig
from gateway.policy.types import Priority
from profiles.gateway_config import GatewayConfig
from profiles.profile import LatencyPoint, Profile, ProfileError, ProfileSet, load_profiles
from profiles.schema import format_error


def scheduler_config(doc: Any, where: str = "gateway config") -> SchedulerConfig:
    """The ``scheduler:`` settings, validated; :class:`ConfigError` names ``scheduler.<key>``."""
    try:
        return SchedulerConfig.model_validate(doc)
    except ValidationError as e:
        raise ConfigError(format_error(e, where, ("scheduler",))) from None


def parse_config(doc: Any, where: str = "gateway config", base_dir: Path | None = None) -> GatewayConfig:
    """The config validated, its ``scheduler:`` settings included; :class:`ConfigError`."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(doc).__name__}")
    try:
        cfg = GatewayConfig.model_validate(doc)
    except ValidationError as e:
        raise ConfigError(format_error(e, where)) from None
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
        raise ConfigError(format_error(e, where, ("listen",))) from None
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
    objective: str = "accuracy"  # which allowed variant a request takes (accuracy | cost | infaas)


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
            replicas.append(ServedReplica(replica_id(r), r.url, r.protocol, r.variant, prof,
                                         r.max_inflight, tls, r.price_per_hour))
        prio = Priority.GUARANTEED if m.priority == "guaranteed" else Priority.BEST_EFFORT
        out.append(ServedModel(m.name, m.slo_ms / 1e3, m.max_batch, prio, tuple(replicas), m.deadline_margin,
                               m.objective))
    return out
