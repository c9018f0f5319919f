"""The planner's YAML edge: ``GpuPool`` and ``ModelDeployment`` documents, validated by pydantic.

Documents follow Kubernetes conventions (apiVersion, kind, metadata, spec). Errors name the
file, the document, the field and the value; cross-field errors quote the values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from placement.catalogue import GPUS
from placement.plan import Demand, GpuClass, Inventory

API_VERSION = "headrace.dev/v1"


class SpecError(ValueError):
    """An invalid pool or deployment document; the message names file, field and value."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Metadata(_Strict):
    name: str = Field(min_length=1, max_length=253, description="object name")
    labels: dict[str, str] = Field(default_factory=dict, description="free-form labels")


class GpuGroup(_Strict):
    model: str = Field(min_length=1, description=f"GPU model, one of {', '.join(GPUS)}")
    count: int = Field(ge=1, le=10_000, description="GPUs of this model on the node")
    cost_per_hour: float = Field(default=1.0, gt=0, le=10_000, description="price of one GPU-hour")
    mig: bool = Field(default=True, description="MIG partitioning allowed")
    mps: bool = Field(default=True, description="MPS sharing allowed (inside a whole GPU or a slice)")

    @model_validator(mode="after")
    def _known(self) -> GpuGroup:
        if self.model not in GPUS:
            raise ValueError(f"model ({self.model!r}) is not a known GPU; known: {', '.join(GPUS)}")
        return self


class Node(_Strict):
    name: str = Field(min_length=1, max_length=253, description="node name, the prefix of GPU ids")
    gpus: list[GpuGroup] = Field(min_length=1, max_length=64, description="GPU groups on the node")


class GpuPoolSpec(_Strict):
    nodes: list[Node] = Field(min_length=1, max_length=10_000, description="nodes and their GPUs")
    objective: Literal["gpus", "cost"] = Field(default="gpus", description="minimise GPUs or cost")
    emulate: bool = Field(default=False, description="serve on emulated GPUs (no hardware)")

    @model_validator(mode="after")
    def _unique(self) -> GpuPoolSpec:
        names = [n.name for n in self.nodes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"node names must be unique, got {dup} more than once")
        return self


class GpuPool(_Strict):
    apiVersion: Literal["headrace.dev/v1"] = API_VERSION
    kind: Literal["GpuPool"] = "GpuPool"
    metadata: Metadata
    spec: GpuPoolSpec

    def inventory(self) -> Inventory:
        """GPUs grouped into classes; ids are ``<node>/gpu<index>`` in node order."""
        classes: dict[tuple, list[str]] = {}
        for node in self.spec.nodes:
            i = 0
            for grp in node.gpus:
                key = (grp.model, grp.cost_per_hour, grp.mig, grp.mps)
                for _ in range(grp.count):
                    classes.setdefault(key, []).append(f"{node.name}/gpu{i}")
                    i += 1
        return Inventory(
            tuple(GpuClass(m, tuple(ids), cost, mig, mps) for (m, cost, mig, mps), ids in classes.items()),
            self.spec.objective,
        )


class ModelDeploymentSpec(_Strict):
    model: str = Field(min_length=1, description="model family (the profiles' `model`), e.g. resnet50")
    rate: float = Field(ge=0, le=1e7, description="expected requests per second")
    slo_ms: float = Field(gt=0, le=600_000, description="latency objective per request, ms")
    variants: list[str] = Field(default_factory=list, max_length=64,
                                description="allowed variants; empty means every profiled variant")
    accuracy_floor: float | None = Field(default=None, ge=0, le=1, description="least acceptable accuracy")
    priority: Literal["guaranteed", "best-effort"] = Field(default="guaranteed", description="priority class")
    headroom: float = Field(default=1.1, ge=1.0, le=10.0,
                            description="planned capacity / expected rate (burst margin)")


class ModelDeployment(_Strict):
    apiVersion: Literal["headrace.dev/v1"] = API_VERSION
    kind: Literal["ModelDeployment"] = "ModelDeployment"
    metadata: Metadata
    spec: ModelDeploymentSpec

    def demand(self) -> Demand:
        s = self.spec
        return Demand(s.model, s.rate, s.slo_ms / 1e3, tuple(s.variants), s.accuracy_floor, s.priority, s.headroom)


def _error(err: ValidationError, where: str) -> SpecError:
    parts = [f"{'.'.join(str(x) for x in e['loc']) or '(document)'}: {e['msg']} (got {e.get('input')!r})"
             for e in err.errors()]
    return SpecError(f"{where}: " + "; ".join(parts))


def load_documents(*paths: str | Path) -> tuple[list[GpuPool], list[ModelDeployment]]:
    """Read every GpuPool and ModelDeployment document of the given YAML files."""
    pools: list[GpuPool] = []
    deps: list[ModelDeployment] = []
    kinds = {"GpuPool": (GpuPool, pools), "ModelDeployment": (ModelDeployment, deps)}
    for path in paths:
        path = Path(path)
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except OSError as e:
            raise SpecError(f"{path}: cannot read: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise SpecError(f"{path}: not valid YAML: {e}") from None
        for i, d in enumerate(docs):
            where = f"{path} document {i}"
            if not isinstance(d, dict) or d.get("kind") not in kinds:
                got = d.get("kind") if isinstance(d, dict) else type(d).__name__
                raise SpecError(f"{where}: kind must be one of {', '.join(kinds)} (got {got!r})")
            cls, sink = kinds[d["kind"]]
            try:
                sink.append(cls.model_validate(d))
            except ValidationError as e:
                raise _error(e, where) from None
    return pools, deps


def load_problem(*paths: str | Path) -> tuple[Inventory, list[Demand], bool]:
    """(inventory, demands, emulate) from YAML files holding one GpuPool and deployments."""
    pools, deps = load_documents(*paths)
    if len(pools) != 1:
        raise SpecError(f"expected exactly one GpuPool document, found {len(pools)} in {[str(p) for p in paths]}")
    if not deps:
        raise SpecError(f"no ModelDeployment documents in {[str(p) for p in paths]}")
    models = [d.spec.model for d in deps]
    dup = sorted({m for m in models if models.count(m) > 1})
    if dup:
        raise SpecError(f"one ModelDeployment per model: {dup} appear more than once")
    return pools[0].inventory(), [d.demand() for d in deps], pools[0].spec.emulate
