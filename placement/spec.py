"""From the operator's documents (:mod:`profiles.schema`) to the planner's input.

``GpuPool`` -> :class:`Inventory`, ``ModelDeployment`` -> :class:`Demand`, and the checks that
need the profiles: every deployment's model and variants are profiled, and every profile names
a GPU and slice of the catalogue. Errors name the file, the document, the field and the value.
"""

from __future__ import annotations

from pathlib import Path

from placement.plan import Demand, GpuClass, Inventory
from profiles.catalogue import CatalogueError, gpu_model
from profiles.profile import Profile, ProfileError, ProfileSet, load_profiles
from profiles.schema import (
    Documents,
    GpuPool,
    ModelDeployment,
    SpecError,
    absolute_path,
    load_documents,
)

__all__ = ["SpecError", "check_profiles", "classic", "demand", "inventory", "load_problem", "profiles_for",
           "replica_floor"]


def inventory(pool: GpuPool) -> Inventory:
    """GPUs grouped into classes; ids are ``<node>/gpu<index>`` in node order."""
    classes: dict[tuple, list[str]] = {}
    for node in pool.spec.nodes:
        i = 0
        for grp in node.gpus:
            key = (grp.model, grp.cost_per_hour, grp.mig, grp.mps)
            for _ in range(grp.count):
                classes.setdefault(key, []).append(f"{node.name}/gpu{i}")
                i += 1
    return Inventory(
        tuple(GpuClass(m, tuple(ids), cost, mig, mps) for (m, cost, mig, mps), ids in classes.items()),
        pool.spec.objective,
        pool.spec.max_gpus,
        pool.spec.max_cost_per_hour,
        pool.spec.mean_accuracy_floor,
    )


def demand(md: ModelDeployment) -> Demand:
    s = md.spec
    return Demand(s.model, s.rate, s.slo_ms / 1e3, s.variant_names(), s.accuracy_floor, s.priority, s.headroom,
                  s.objective, replica_floor(md))


def replica_floor(md: ModelDeployment) -> int:
    """The replicas a deployment asks for on distinct GPUs: the larger of ``spec.replicas`` and
    ``spec.autoscaling.min_replicas`` (KServe's ``minReplicas``, default 1; 0 asks for none)."""
    s = md.spec
    auto = s.autoscaling.min_replicas if s.autoscaling is not None else 1
    return max(s.replicas or 0, auto)


def profiles_for(docs: Documents, base: ProfileSet) -> ProfileSet:
    """``base`` plus the profile files the deployments name (a variant's ``profile``)."""
    out = ProfileSet(list(base))
    for md in classic(docs):
        root = docs.base_dir.get(id(md), Path.cwd())
        for i, v in enumerate(md.spec.variant_specs()):
            if v.profile is None:
                continue
            path = Path(absolute_path(v.profile, root))
            where = f"{docs.origin(md)}: spec.variants.{i}.profile"
            try:
                loaded = list(ProfileSet(load_profiles(path)))  # normalised: a host's slice is WHOLE
            except (OSError, ProfileError) as e:
                raise SpecError(f"{where}: {e} (got {v.profile!r})") from None
            for j, p in enumerate(loaded):
                bad = _off_catalogue(p)
                if bad:
                    raise SpecError(f"{where}: {path} document {j}: {bad}")
                if p.key not in out:
                    out.add(p)
    return out


def _off_catalogue(p: Profile) -> str | None:
    """``spec.gpu`` / ``spec.slice: <why> (got <value>)`` when ``p`` is not on a catalogue slice."""
    try:
        g = gpu_model(p.gpu)
    except CatalogueError as e:
        return f"spec.gpu: {e} (got {p.gpu!r})"
    try:
        g.slice_fraction(p.slice)
    except CatalogueError as e:
        return f"spec.slice: {e} (got {p.slice!r})"
    return None


def check_profiles(docs: Documents, profiles: ProfileSet) -> None:
    """Every profile names a catalogue GPU and slice; every deployment's model and variants
    have profiles. Raises :class:`SpecError` naming the first offender."""
    for p in profiles:
        bad = _off_catalogue(p)
        if bad:
            raise SpecError(f"profile {p.name}: {bad}")
    for md in classic(docs):
        s = md.spec
        mine = profiles.find(model=s.model)
        where = docs.origin(md)
        if not mine:
            known = sorted({p.model for p in profiles})
            raise SpecError(f"{where}: spec.model: no profiles for model {s.model!r}; profiled: {known} "
                            f"(got {s.model!r})")
        have = {p.variant for p in mine}
        for i, name in enumerate(s.variant_names()):
            if name not in have:
                raise SpecError(f"{where}: spec.variants.{i}: model {s.model!r} has no variant {name!r}; "
                                f"profiled: {sorted(have)} (got {name!r})")


def load_problem(*paths: str | Path) -> tuple[Inventory, list[Demand], bool]:
    """(inventory, demands, emulate) from YAML files holding one GpuPool and deployments."""
    docs = load_documents(*paths)
    pool = single_pool(docs, paths)
    return inventory(pool), [demand(d) for d in classic(docs)], pool.spec.emulate


def classic(docs: Documents) -> list[ModelDeployment]:
    """The deployments the planner places (a generative one, ``spec.llm``, takes whole GPUs
    before it: :mod:`placement.llm`)."""
    return [md for md in docs.deployments if md.spec.llm is None]


def single_pool(docs: Documents, paths: tuple[str | Path, ...] | list[str | Path]) -> GpuPool:
    """The one GpuPool of ``docs``; also checks there is at least one deployment, one per model."""
    names = [str(p) for p in paths]
    if len(docs.pools) != 1:
        raise SpecError(f"expected exactly one GpuPool document, found {len(docs.pools)} in {names}")
    if not docs.deployments:
        raise SpecError(f"no ModelDeployment documents in {names}")
    models = [d.spec.model for d in docs.deployments]
    dup = sorted({m for m in models if models.count(m) > 1})
    if dup:
        again = next(d for i, d in enumerate(docs.deployments) if d.spec.model in models[:i])
        first = next(d for d in docs.deployments if d.spec.model == again.spec.model)
        raise SpecError(f"{docs.origin(again)}: spec.model: one ModelDeployment per model; "
                        f"{again.spec.model!r} is also in {docs.origin(first)} (got {again.spec.model!r})")
    return docs.pools[0]

