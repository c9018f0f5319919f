"""A seeded synthetic fleet: many models copied from the reference families on a mixed GPU pool.

Each model is a copy of one reference family (resnet50, bert-base, bert-large, imagenet) with
that family's measured profiles renamed to it (``resnet50-0042``, variant ``resnet50-0042``;
``bert-base-0007`` with variants ``bert-base-0007``, ``bert-base-fp16-0007``...). Its rate is
log-uniform in :data:`RATE_RANGE` times ``rate_scale``, its SLO a whole number of milliseconds
in :data:`SLO_RANGE_MS`, and :data:`BEST_EFFORT_SHARE` of the models are best-effort. The pool
mixes A100-40GB, A100-80GB, H100-80GB, H200-141GB and A30-24GB in equal numbers, eight GPUs to
a node (MIG and MPS allowed).

The fleet exists twice, the same: as operator documents (:meth:`Fleet.write` puts ``pool.yaml``,
``models.yaml`` and ``profiles.yaml`` in a folder, for ``headrace plan -f pool.yaml -f
models.yaml --profiles profiles.yaml``) and as the planner's input (:meth:`Fleet.problem`), both
built from the same documents. The simulator and the Ray benchmarks reuse it with their own
``rate_scale``.

    .venv/bin/python -m bench.fleet OUT_DIR [--models 1000] [--gpus 500] [--seed 17] [--rate-scale 1]
        [--profile-format yaml|json]
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import yaml

from placement.plan import Demand, Inventory
from profiles.profile import Profile, ProfileSet, profile_to_dict

FAMILIES = ("resnet50", "bert-base", "bert-large", "imagenet")
GPU_MIX = (("A100-40GB", 1.5), ("A100-80GB", 2.0), ("H100-80GB", 3.5), ("H200-141GB", 4.5), ("A30-24GB", 1.0))
GPUS_PER_NODE = 8
RATE_RANGE = (20.0, 3000.0)  # req/s, log-uniform
SLO_RANGE_MS = (50, 200)
BEST_EFFORT_SHARE = 0.2
SEED = 17
PROFILE_FORMATS = ("yaml", "json")  # how Fleet.write puts the profiles: a YAML stream, or one JSON list


@dataclass(frozen=True)
class Fleet:
    """The documents of one generated fleet (plain dicts, as YAML would hold them)."""

    pool: dict
    deployments: tuple[dict, ...]
    profiles: tuple[Profile, ...]

    def problem(self) -> tuple[list[Demand], ProfileSet, Inventory]:
        """What ``headrace plan`` hands the solver for these documents (before derivation)."""
        from placement.spec import demand, inventory
        from profiles.schema import GpuPool, ModelDeployment

        inv = inventory(GpuPool.model_validate(self.pool))
        return [demand(ModelDeployment.model_validate(d)) for d in self.deployments], ProfileSet(self.profiles), inv

    def write(self, folder: str | Path, profile_format: str = "yaml") -> dict[str, Path]:
        """``pool.yaml``, ``models.yaml`` and ``profiles.yaml`` (``profile_format`` "json":
        ``profiles.json``, one JSON list of the same documents) in ``folder``; their paths by name."""
        if profile_format not in PROFILE_FORMATS:
            raise ValueError(f"unknown profile format {profile_format!r}; known: {', '.join(PROFILE_FORMATS)}")
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"pool": out / "pool.yaml", "models": out / "models.yaml", "profiles": out / f"profiles.{profile_format}"}
        dump = yaml.CSafeDumper if hasattr(yaml, "CSafeDumper") else yaml.SafeDumper
        paths["pool"].write_text(yaml.dump(self.pool, Dumper=dump, sort_keys=False))
        paths["models"].write_text(yaml.dump_all(self.deployments, Dumper=dump, sort_keys=False))
        docs = [profile_to_dict(p) for p in self.profiles]
        if profile_format == "json":
            paths["profiles"].write_text(json.dumps(docs, separators=(",", ":")) + "\n")
        else:
            paths["profiles"].write_text(yaml.dump_all(docs, Dumper=dump, sort_keys=False))
        return paths


def families(base: ProfileSet | None = None) -> dict[str, list[Profile]]:
    """Each family's measured (not derived) profiles, from ``base`` or the reference set."""
    base = base if base is not None else ProfileSet.reference()
    out = {f: [p for p in base if p.model == f and p.provenance.kind != "derived"] for f in FAMILIES}
    missing = [f for f, ps in out.items() if not ps]
    if missing:
        raise ValueError(f"no measured profiles for families {missing}")
    return out


def generate(models: int = 1000, gpus: int = 500, seed: int = SEED, rate_scale: float = 1.0,
             base: ProfileSet | None = None) -> Fleet:
    """``models`` copies of the reference families on ``gpus`` GPUs of :data:`GPU_MIX`."""
    if models < 1 or gpus < 1 or rate_scale <= 0:
        raise ValueError(f"need models >= 1, gpus >= 1, rate_scale > 0 (got {models}, {gpus}, {rate_scale})")
    rng = np.random.default_rng(seed)
    fams = families(base)
    lo, hi = math.log(RATE_RANGE[0]), math.log(RATE_RANGE[1])
    deployments, profiles = [], []
    for i in range(models):
        fam = FAMILIES[int(rng.integers(len(FAMILIES)))]
        name = f"{fam}-{i:04d}"
        rate = round(math.exp(rng.uniform(lo, hi)) * rate_scale, 1)
        slo = int(rng.integers(SLO_RANGE_MS[0], SLO_RANGE_MS[1] + 1))
        best_effort = bool(rng.random() < BEST_EFFORT_SHARE)
        spec: dict = {"model": name, "rate": rate, "slo_ms": slo}
        if best_effort:
            spec["priority"] = "best-effort"
        deployments.append({"apiVersion": "headrace.dev/v1", "kind": "ModelDeployment",
                            "metadata": {"name": name}, "spec": spec})
        profiles += [replace(p, model=name, variant=f"{p.variant}-{i:04d}") for p in fams[fam]]
    return Fleet(_pool(gpus), tuple(deployments), tuple(profiles))


def _pool(gpus: int) -> dict:
    per = [gpus // len(GPU_MIX) + (1 if k < gpus % len(GPU_MIX) else 0) for k in range(len(GPU_MIX))]
    nodes = []
    for (model, cost), n in zip(GPU_MIX, per, strict=True):
        for k in range(0, n, GPUS_PER_NODE):
            nodes.append({"name": f"{model.lower()}-{k // GPUS_PER_NODE:03d}",
                          "gpus": [{"model": model, "count": min(GPUS_PER_NODE, n - k), "cost_per_hour": cost}]})
    return {"apiVersion": "headrace.dev/v1", "kind": "GpuPool", "metadata": {"name": "fleet"},
            "spec": {"objective": "gpus", "nodes": nodes}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=500)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--profile-format", choices=PROFILE_FORMATS, default="yaml",
                    help="profiles.yaml (a YAML stream) or profiles.json (one JSON list, read ~10x faster)")
    args = ap.parse_args(argv)
    paths = generate(args.models, args.gpus, args.seed, args.rate_scale).write(args.out, args.profile_format)
    print(" ".join(f"{k}={v}" for k, v in paths.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
