"""How headrace names Ray custom resources, and which GpuPool nodes a Ray cluster offers.

A Ray node that serves GpuPool node ``<name>`` is started with

* ``"headrace-node:<name>": 1`` — which pool node it is (every actor placed on that node asks
  for a small fraction of it, so it lands there and nowhere else);
* ``"<GPU model>": <count>`` — whole GPUs of that model on it, e.g. ``"A100-80GB": 2``. One
  emulated GPU's arbiter actor holds one unit for as long as the GPU is planned.

For example: ``ray start --address HEAD --resources '{"headrace-node:n1": 1, "A100-80GB": 2}'``.
"""

from __future__ import annotations

from typing import Any

NODE_PREFIX = "headrace-node:"
PIN = 0.001  # the share of a node resource each pinned actor asks for
HEAD = "node:__internal_head__"  # Ray's resource of the head node: the controller and its state live there


def node_resource(node: str) -> str:
    return f"{NODE_PREFIX}{node}"


def node_of(gpu_id: str) -> str:
    """The pool node of a planned GPU id (``<node>/gpu<i>``)."""
    return gpu_id.split("/", 1)[0]


def pinned(node: str, extra: dict[str, float] | None = None) -> dict[str, float]:
    """The custom resources of an actor that must run on pool node ``node``."""
    return {node_resource(node): PIN, **(extra or {})}


def node_resources(node: str, gpus: dict[str, int]) -> dict[str, float]:
    """What a Ray node serving pool node ``node`` with ``gpus`` (model -> count) offers."""
    return {node_resource(node): 1.0, **{m: float(n) for m, n in gpus.items()}}


def present_nodes(ray_nodes: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Pool node name -> the GPU resources its live Ray node offers (from ``ray.nodes()``)."""
    out: dict[str, dict[str, float]] = {}
    for n in ray_nodes:
        if not n.get("Alive"):
            continue
        res = n.get("Resources") or {}
        for key in res:
            if key.startswith(NODE_PREFIX):
                out[key[len(NODE_PREFIX):]] = {k: v for k, v in res.items()
                                               if k not in ("CPU", "GPU", "memory", "object_store_memory")
                                               and not k.startswith(("node:", NODE_PREFIX))}
    return out
