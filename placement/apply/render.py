"""A plan rendered into the gateway's configuration: the one function every apply path calls.

:func:`gateway_config` turns a plan, where each of its replicas serves (:class:`Endpoint`) and
the Gateway document's settings into the gateway's config
(:class:`~profiles.gateway_config.GatewayConfig`, what ``headrace serve`` reads). A model the
plan gives no replica (best-effort shed by a partial plan) is kept with no replicas: clients
address it and are refused ``no_replica`` (503, Retry-After), never 404. Each replica's latency
profile is its slice's profile, slowed by its MPS share and interference where it shares the
slice, as the planner predicted it; profiles are written as files into ``profile_dir`` and the
config points at them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from dataclasses import replace as _replace
from pathlib import Path

from placement.plan import Plan
from placement.solve.capacity import batch_latency
from profiles.catalogue import gpu_model as catalogue_model
from profiles.gateway_config import GatewayConfig, LlmModelConfig, ModelConfig, ReplicaConfig
from profiles.profile import LatencyPoint, Profile, ProfileSet, save_profiles
from profiles.schema import GatewaySettings, ListenConfig


@dataclass(frozen=True)
class Endpoint:
    """Where one replica serves: the gateway's ReplicaInfo is built from this."""

    replica_id: str
    model: str
    variant: str  # the Triton model name on that server
    gpu: str
    slice: str
    share: float
    max_batch: int
    capacity: float
    http_url: str
    grpc_url: str


def replica_profile(profiles: ProfileSet, gpu_model: str, e: Endpoint) -> Profile:
    """The latency the planner predicts for ``e``: its slice's profile at its share."""
    p = profiles.get(e.variant, gpu_model, e.slice.split("@")[0])
    if e.share < 1.0:
        pts = tuple(LatencyPoint(pt.batch, pt.p50 * batch_latency(p, pt.batch, e.share) / p.latency(pt.batch),
                                 batch_latency(p, pt.batch, e.share)) for pt in p.points)
        p = _replace(p, points=pts)
    return p.with_max_batch(max(e.max_batch, 1)) if e.max_batch <= p.max_batch else p


def file_name(replica_id: str) -> str:
    return replica_id.replace("/", "_").replace("@", "-").replace("#", "-")


@dataclass(frozen=True)
class _Gpu:
    model: str  # catalogue name, e.g. A100-80GB
    cost_per_hour: float


def _gpus(plan: Plan) -> dict[str, _Gpu]:
    """Every planned GPU's model and price, by id (looked up once per render)."""
    by_id = plan.inventory.by_id()
    return {g.id: _Gpu(g.gpu, by_id[g.id].cost_per_hour) for g in plan.gpus}


def price_per_hour(gpu: _Gpu, e: Endpoint) -> float:
    """What ``e``'s hardware costs per hour: its slice's share of its GPU (the larger of its
    compute and memory shares), times its MPS share, times the GPU's ``cost_per_hour``."""
    return gpu.cost_per_hour * catalogue_model(gpu.model).slice_fraction(e.slice.split("@")[0]) * e.share


def replica_config(gpu: _Gpu, e: Endpoint, profiles: ProfileSet, profile_dir: Path) -> ReplicaConfig:
    """One replica of the gateway config (``models[].replicas[]``), its profile written to disk."""
    path = profile_dir / (file_name(e.replica_id) + ".profile.yaml")
    save_profiles(path, [replica_profile(profiles, gpu.model, e)])
    return ReplicaConfig(url=e.http_url, protocol="http", variant=e.variant, profile=str(path), id=e.replica_id,
                         price_per_hour=round(price_per_hour(gpu, e), 6))


def gateway_config(plan: Plan, endpoints: Iterable[Endpoint], profiles: ProfileSet, profile_dir: Path,
                   settings: GatewaySettings | None = None,
                   llm_models: Sequence[LlmModelConfig] = ()) -> GatewayConfig:
    """The gateway config routing every planned model to its replicas' ``endpoints``, and
    every model the plan places no replica of to none (refused while it has none).
    ``settings``: the Gateway document's spec (listen, scheduler, ...; its admin API is not the
    gateway's); None: the defaults, listening on any free ports. ``llm_models``: the
    generative models served beside them, with their engines."""
    by_model: dict[str, list[Endpoint]] = {}
    for e in endpoints:
        by_model.setdefault(e.model, []).append(e)
    gpus = _gpus(plan)
    profile_dir.mkdir(parents=True, exist_ok=True)
    placed = {r.model for _, _, r in plan.replicas()}
    models = []
    for d in plan.demands:
        mine = by_model.get(d.model)
        if mine:
            models.append(ModelConfig(name=d.model, slo_ms=d.slo * 1e3, priority=d.priority, objective=d.objective,
                                      max_batch=min(e.max_batch for e in mine),
                                      replicas=[replica_config(gpus[e.gpu], e, profiles, profile_dir) for e in mine]))
        elif d.model not in placed:  # shed: addressable, refused no_replica until a re-plan places it
            models.append(ModelConfig(name=d.model, slo_ms=d.slo * 1e3, priority=d.priority, objective=d.objective,
                                      replicas=[]))
    if settings is None:
        settings = GatewaySettings(listen=ListenConfig(http_port=0, grpc_port=0))
    given = {k: getattr(settings, k) for k in settings.model_fields_set if k in GatewaySettings.model_fields}
    return GatewayConfig(**given, models=models, llm_models=list(llm_models))
