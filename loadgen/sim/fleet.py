"""What ``headrace sim`` simulates: the fleet of a gateway config (``headrace serve --config``),
of the operator's documents (``headrace up -f``: planned and rendered exactly as the operator
does), or of command-line flags, as one :class:`SimFleet`.

The operator's path reuses its functions: the documents are loaded and checked
(:func:`placement.problem.load`), planned (:func:`placement.solve.solver.solve`), and the plan rendered
into a gateway config (:func:`placement.apply.render.gateway_config`), which is then resolved as
``headrace serve`` resolves it (:func:`gateway.config.resolve`).
Each rendered replica's profile is its slice's profile already slowed by its MPS share, so a
simulated replica runs alone at the speed the planner predicted for it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.config import (
    ServedModel,
    ServedReplica,
    load_config,
    parse_config,
    resolve,
    scheduler_config,
)
from gateway.errors import ConfigError
from gateway.policy.config import SchedulerConfig
from gateway.policy.types import Priority, ReplicaInfo
from loadgen.sim.simulator import SimReplica
from profiles.profile import Profile
from profiles.schema import (
    KINDS,
    Documents,
    GatewaySettings,
    SpecError,
    add_documents,
    yaml_documents,
    yaml_files,
)


class FleetError(ValueError):
    """The fleet cannot be built; the message names the file, field and value."""


@dataclass(frozen=True)
class SimModel:
    """A served model as the gateway knows it: its SLO (seconds), the share of it kept outside
    the plan (deadline = arrival + slo * (1 - margin), as the gateway sets it) and its class."""

    name: str
    slo: float
    margin: float = 0.0
    priority: Priority = Priority.GUARANTEED


@dataclass(frozen=True)
class SimFleet:
    scheduler: SchedulerConfig
    models: dict[str, SimModel]
    replicas: tuple[SimReplica, ...]
    source: str  # what the fleet was read from
    files: tuple[str, ...] = ()
    plan: dict[str, Any] | None = field(default=None, compare=False)  # the operator's plan, when planned

    def groups(self) -> list[tuple[str, ...]]:
        """Models that share nothing (no replica, no slice), each group in fleet order: they
        can be simulated apart."""
        parent: dict[str, str] = {m: m for m in self.models}

        def root(m: str) -> str:
            while parent[m] != m:
                m = parent[m]
            return m

        by_slice: dict[str, str] = {}
        for r in self.replicas:
            m = r.info.model
            other = by_slice.setdefault(r.slice_key, m)
            a, b = root(m), root(other)
            if a != b:
                parent[b] = a
        out: dict[str, list[str]] = {}
        for m in self.models:
            out.setdefault(root(m), []).append(m)
        return [tuple(g) for g in out.values()]

    def subset(self, models: Sequence[str]) -> SimFleet:
        keep = set(models)
        return SimFleet(self.scheduler, {m: v for m, v in self.models.items() if m in keep},
                        tuple(r for r in self.replicas if r.info.model in keep), self.source, self.files,
                        self.plan)


def with_settings(base: Mapping[str, Any], overrides: Mapping[str, Any], where: str) -> SchedulerConfig:
    """``scheduler:`` settings with command-line overrides on top, validated whole."""
    return scheduler_config({**base, **overrides}, where)


def from_served(served: list[ServedModel], scheduler: SchedulerConfig, source: str,
                files: tuple[str, ...] = (), plan: dict[str, Any] | None = None) -> SimFleet:
    """The fleet of resolved gateway models: each replica as the gateway tells the core of it
    (batches capped by the model's max batch and the profile's)."""
    models, reps = {}, []
    for m in served:
        models[m.name] = SimModel(m.name, m.slo, m.margin, m.priority)
        for r in m.replicas:
            mb = min(m.max_batch, r.profile.max_batch)
            reps.append(SimReplica(ReplicaInfo(r.id, m.name, r.variant, r.profile, mb, r.max_inflight,
                                               r.price_per_hour, m.objective)))
    return SimFleet(scheduler, models, tuple(reps), source, files, plan)


def flag_fleet(profile: Profile, replicas: int, slo_s: float, scheduler: SchedulerConfig, *,
               max_inflight: int = 1, margin: float = 0.0) -> SimFleet:
    """``replicas`` identical replicas of ``profile``, each on its own slice, serving its model."""
    reps = tuple(ServedReplica(f"r{i}", f"sim:{i + 1}", "http", profile.variant, profile, max_inflight)
                 for i in range(replicas))
    served = ServedModel(profile.model, slo_s, profile.max_batch, Priority.GUARANTEED, reps, margin)
    return from_served([served], scheduler, f"{replicas} x {profile.name}")


def _parsed(files: Sequence[str]) -> dict[str, list[Any]] | None:
    """Each file's YAML documents, each file read and parsed once; None when one cannot be
    (the gateway config's loader then says what is wrong)."""
    try:
        return {f: yaml_documents(Path(f).read_text(), f) for f in files}
    except (OSError, SpecError):
        return None


def load_fleet(paths: Sequence[str | Path], overrides: Mapping[str, Any] | None = None,
               method: str = "greedy", profiles: Sequence[str | Path] = ()) -> SimFleet:
    """The fleet of ``paths``: operator documents (GpuPool, ModelDeployment, Gateway), planned
    and rendered as ``headrace up`` does, or one gateway config file. ``overrides``: scheduler
    settings on top of the file's; ``profiles``: profile files beyond the reference ones, as
    ``headrace plan --profiles`` takes them. Raises :class:`FleetError` (or the loaders' own
    errors)."""
    files = tuple(str(p) for p in yaml_files(list(paths)))
    if not files:
        raise FleetError(f"no YAML files in {[str(p) for p in paths]}")
    parsed = _parsed(files)
    if parsed is not None and any(isinstance(d, dict) and d.get("kind") in KINDS  # operator documents
                                  for raw in parsed.values() for d in raw):
        docs = Documents()
        for f, raw in parsed.items():
            add_documents(raw, f, docs, Path(f).parent.resolve())
        return _operator_fleet(files, docs, overrides or {}, method, tuple(str(p) for p in profiles))
    if len(files) != 1:
        raise FleetError(f"a gateway config is one file; got {list(files)} (operator documents need a kind)")
    if parsed is not None and len(parsed[files[0]]) == 1:
        cfg = parse_config(parsed[files[0]][0], files[0], Path(files[0]).parent)
    else:  # its loader says why the file is not one gateway config
        cfg = load_config(files[0])
    scheduler = with_settings(cfg.scheduler, overrides or {}, files[0])
    return from_served(resolve(cfg), scheduler, f"gateway config {files[0]}", files)


def _operator_fleet(files: tuple[str, ...], docs: Documents, overrides: Mapping[str, Any], method: str,
                    profiles: tuple[str, ...] = ()) -> SimFleet:
    from placement.problem import load
    from placement.solve.solver import solve

    inv, demands, profile_set = load(list(files), list(profiles), docs=docs)
    if len(docs.gateways) > 1:
        raise FleetError(f"{list(files)}: at most one Gateway document, found {len(docs.gateways)}")
    settings = docs.gateways[0].spec if docs.gateways else None
    plan = solve(demands, profile_set, inv, method, bound=method != "greedy")
    plan.verify()
    return plan_fleet(plan, profile_set, settings, overrides, "operator documents " + ", ".join(files), files)


def plan_fleet(plan: Any, profiles: Any, settings: GatewaySettings | None = None,
               overrides: Mapping[str, Any] | None = None, source: str = "plan",
               files: tuple[str, ...] = ()) -> SimFleet:
    """A :class:`placement.plan.Plan` rendered into the gateway's config as the operator renders
    it (``settings``: the Gateway spec), as the simulator runs it: every replica at the speed
    the planner predicted for it."""
    from placement.apply.render import Endpoint, gateway_config
    from placement.diff import replica_ids

    endpoints = []
    for g in plan.gpus:
        for s in g.slices:
            for r, rid in zip(s.replicas, replica_ids(g, s), strict=True):
                url = f"sim:{len(endpoints) + 1}"
                endpoints.append(Endpoint(rid, r.model, r.variant, g.id, s.label, r.share, r.max_batch,
                                          r.capacity, url, url))
    if not endpoints:
        raise FleetError(f"{source}: the plan places no replica")
    with tempfile.TemporaryDirectory(prefix="headrace-sim-") as tmp:
        cfg = gateway_config(plan, endpoints, profiles, Path(tmp), settings)
        try:
            scheduler_config(cfg.scheduler, "the rendered plan")
            served = resolve(cfg)
        except ConfigError as e:
            raise FleetError(str(e)) from None
    scheduler = with_settings(cfg.scheduler, overrides or {}, "Gateway spec")
    rates = {d.model: d.rate for d in plan.demands}
    summary = {"gpus": plan.gpu_count, "cost_per_hour": plan.cost_per_hour, "method": plan.method,
               "rates": rates, "replicas": [
                   {"id": e.replica_id, "model": e.model, "variant": e.variant, "slice": f"{e.gpu}/{e.slice}",
                    "share": e.share, "max_batch": e.max_batch, "capacity": round(e.capacity, 3)}
                   for e in endpoints]}
    return from_served(served, scheduler, source, files, summary)
