"""The planning problem as a command reads it: the GPU pool and the model deployments from YAML
documents, the solver flags, and the profiles the plan can use (the reference set, the digits
family's measured profiles, extra files, and derived profiles for unprofiled slices)."""

from __future__ import annotations

import argparse
import math

from pydantic import ValidationError

from placement.llm import choose, llm_profiles, place
from placement.plan import Demand, Inventory
from placement.solve.solver import METHODS, TIME_LIMIT
from placement.spec import (
    SpecError,
    check_profiles,
    classic,
    demand,
    inventory,
    profiles_for,
    single_pool,
)
from profiles.derive import with_derived
from profiles.digits.family import MEASURED_DIR
from profiles.profile import ProfileSet, Provenance
from profiles.schema import Documents, GpuPool, format_error, load_documents


def add_problem_args(p: argparse.ArgumentParser) -> None:
    """What a planning command reads: the documents, the solver and extra profiles (``plan``
    and ``render-k8s`` alike; :func:`load` reads them)."""
    p.add_argument("-f", "--file", action="append", required=True, metavar="YAML",
                   help="GpuPool / ModelDeployment YAML (repeatable)")
    p.add_argument("--method", choices=METHODS, default="greedy", help="solver (default greedy)")
    p.add_argument("--time-limit", type=_seconds, default=TIME_LIMIT,
                   help=f"MILP safety stop, seconds (default {TIME_LIMIT:g}; a work budget ends its search, "
                        "so the same input gives the same plan on any host)")
    p.add_argument("--profiles", action="append", default=[], metavar="PATH",
                   help="extra profile YAML files or folders (added to the reference set)")


def _seconds(text: str) -> float:
    """A time limit: a positive number of seconds (argparse reports anything else as an error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def load_profile_set(extra: list[str], derive: bool = True) -> ProfileSet:
    """The reference profiles plus ``extra`` files or folders, and (``derive``) a derived
    profile for every variant on every catalogue slice that lacks one."""
    ps = ProfileSet.reference()
    for path in extra:
        for prof in ProfileSet.load(path):
            ps.add(prof)
    return with_derived(ps) if derive else ps


def derive_for(docs: Documents, inv: Inventory, profiles: ProfileSet) -> ProfileSet:
    """``profiles`` plus derived ones only where the plan can use them: the variants the
    deployments allow, on the GPU models of the pool. Variants whose profiles differ only in
    their names (a fleet's copies of one family) are derived once, and the copies get those
    profiles under their own names."""
    variants = set()
    for md in docs.deployments:
        allowed = set(md.spec.variant_names())
        variants |= {p.variant for p in profiles.find(model=md.spec.model) if not allowed or p.variant in allowed}
    groups: dict[tuple, list[tuple[str, str]]] = {}
    for v in sorted(variants):
        mine = sorted(profiles.find(variant=v), key=lambda p: (p.gpu, p.slice))
        if not mine:
            continue
        key = tuple((p.gpu, p.slice, p.max_batch, p.points, p.memory_mb, p.accuracy, p.mps_interference,
                     p.provenance) for p in mine)
        groups.setdefault(key, []).append((mine[0].model, v))
    firsts = [members[0][1] for members in groups.values()]
    out = with_derived(profiles, gpus=tuple(sorted({c.gpu for c in inv.classes})), variants=firsts)
    for members in groups.values():
        first = members[0][1]
        derived = [p for p in out.find(variant=first) if p.key not in profiles]
        for model, v in members[1:]:
            theirs, mine = f"{first}@", f"{v}@"
            for p in derived:
                # its provenance names the profile it came from: the copy's own
                pv = p.provenance
                out.add(p.renamed(model, v, Provenance(pv.source.replace(theirs, mine, 1), pv.kind,
                                                       pv.measured_batches, pv.notes, pv.accuracy_source)))
    return out


OVERRIDES = ("objective", "max_gpus", "max_cost_per_hour", "mean_accuracy_floor")


def with_overrides(pool: GpuPool, args: argparse.Namespace | None) -> GpuPool:
    """The pool with the objective, budget and floor flags given on the command line, validated
    as the document's fields are (a bad value is one line naming the flag)."""
    given = {k: getattr(args, k) for k in OVERRIDES if args is not None and getattr(args, k, None) is not None}
    if not given:
        return pool
    flags = ", ".join(f"--{k.replace('_', '-')}" for k in given)
    if given.get("objective", "accuracy") != "accuracy":
        # another objective drops the document's budget (a budget flag with it is still an error)
        given = {"max_gpus": None, "max_cost_per_hour": None, **given}
    try:
        return GpuPool.model_validate({**pool.model_dump(), "spec": {**pool.spec.model_dump(), **given}})
    except ValidationError as e:
        raise SpecError(format_error(e, f"{flags} on GpuPool {pool.metadata.name}")) from None


def load(files: list[str], extra_profiles: list[str], args: argparse.Namespace | None = None,
         docs: Documents | None = None) -> tuple[Inventory, list[Demand], ProfileSet]:
    """Pool, demands and checked profiles from -f files (the pool's objective, budget and floor
    overridden by ``args``' flags; ``docs``: the files' documents when the caller has read them);
    every input error is a SpecError (or ProfileError / CatalogueError) naming where it is."""
    docs = load_documents(*files) if docs is None else docs
    pool = with_overrides(single_pool(docs, files), args)
    profiles = profiles_for(docs, load_profile_set(extra_profiles + [str(MEASURED_DIR)], derive=False))
    check_profiles(docs, profiles)
    inv = place(choose(docs.deployments, docs.origin, inventory(pool), llm_profiles(docs)), inventory(pool))[1]
    return inv, [demand(d) for d in classic(docs)], derive_for(docs, inv, profiles)
