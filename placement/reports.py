"""What a plan reports it could not do: a best-effort model placed short (:class:`Shortfall`)
and a replica floor not met in full (:class:`FloorShortfall`); :mod:`placement.plan` re-exports both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Shortfall:
    """A best-effort model an overfull pool could not place whole: the capacity it got, what
    is left over, and the GPUs that would place the rest (``(GPU model, count)``, cheapest
    first; each alone suffices, counted for this model alone)."""

    model: str
    required: float  # req/s the model is planned for (its rate)
    placed: float  # req/s of capacity the plan gives it
    gpus: tuple[tuple[str, int], ...] = ()

    @property
    def unplaced(self) -> float:
        return max(0.0, self.required - self.placed)

    def describe(self) -> str:
        more = " or ".join(f"{n} more {g}" for g, n in self.gpus) or "no GPU of the pool's kinds"
        return (f"best-effort model {self.model}: {self.placed:.0f} of {self.required:.0f} req/s placed, "
                f"{self.unplaced:.0f} req/s not ({more} would place it)")

    def to_dict(self) -> dict:
        return {"model": self.model, "required_rps": round(self.required, 1), "placed_rps": round(self.placed, 1),
                "unplaced_rps": round(self.unplaced, 1), "gpus_to_place": [{"gpu": g, "count": n} for g, n in self.gpus]}


@dataclass(frozen=True)
class FloorShortfall:
    """A replica floor the plan does not meet in full. ``kind`` ``distinct`` (``min_replicas``):
    the model's replicas stand on ``gpus`` distinct GPUs of ``nodes`` distinct nodes, fewer than
    its ``floor`` of one or the other, and ``why`` (``only 2 GPUs``, ``no room on the pool's
    other GPUs``, ``only 1 node``); ``met``: the GPUs are enough and only the spread over nodes
    falls short. ``kind`` ``count`` (``min_count``): ``replicas`` in all, fewer than ``floor``,
    never met (a gateway worker without a replica of the model cannot answer it)."""

    model: str
    floor: int
    gpus: int
    nodes: int
    why: str
    kind: Literal["distinct", "count"] = "distinct"
    replicas: int = 0  # count: the model's replicas in all

    @property
    def met(self) -> bool:
        return self.kind == "distinct" and self.gpus >= self.floor

    def describe(self) -> str:
        if self.kind == "count":
            return (f"model {self.model}: {self.floor} replicas in all (one per gateway worker), "
                    f"placed {self.replicas}: {self.why}")
        on = f" on {self.nodes} node{'s' if self.nodes != 1 else ''}" if self.met else ""
        return f"model {self.model}: floor {self.floor} replicas: {self.gpus} placed{on}, {self.why}"

    def to_dict(self) -> dict:
        count = {"kind": "count", "replicas": self.replicas} if self.kind == "count" else {}
        return {"model": self.model, "floor": self.floor, "gpus": self.gpus, "nodes": self.nodes,
                "met": self.met, "why": self.why, **count}
