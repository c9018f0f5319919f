"""Builders for the Ray tests: a local two-node Ray cluster whose nodes emulate pool nodes with two
A100-80GB each, and the operator's documents for it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

NODE_GPUS = {"A100-80GB": 2}


def ray_pool(nodes: tuple[str, ...] = ("n2", "n1"), gpus: int = 2) -> dict[str, Any]:
    """Whole GPUs (no MIG, no MPS): a replica per GPU, so a plan's replicas are easy to count."""
    return {"apiVersion": "headrace.dev/v1", "kind": "GpuPool", "metadata": {"name": "ray"},
            "spec": {"emulate": True, "runtime": "ray",
                     "nodes": [{"name": n, "gpus": [{"model": "A100-80GB", "count": gpus, "mig": False,
                                                     "mps": False}]} for n in nodes]}}


@dataclass
class LocalCluster:
    cluster: Any
    workers: dict[str, Any]  # pool node name -> its Ray node (the head is n1)

    @property
    def address(self) -> str:
        return self.cluster.address

    def remove(self, name: str) -> None:
        self.cluster.remove_node(self.workers.pop(name))

    def add(self, name: str) -> None:
        from deploy.ray.resources import node_resources  # noqa: PLC0415

        self.workers[name] = self.cluster.add_node(num_cpus=1, resources=node_resources(name, NODE_GPUS))


@contextlib.contextmanager
def local_cluster(tmp: Path) -> Iterator[LocalCluster]:
    """Head node = pool node n1, one worker node = n2; always shut down."""
    import ray  # noqa: PLC0415
    from ray.cluster_utils import Cluster  # noqa: PLC0415

    from deploy.ray.resources import node_resources  # noqa: PLC0415
    from deploy.ray.runtime import NAMESPACE  # noqa: PLC0415

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": node_resources("n1", NODE_GPUS), "include_dashboard": False,
        "object_store_memory": 100 << 20})
    try:
        lc = LocalCluster(cluster, {})
        lc.add("n2")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
        yield lc
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        cluster.shutdown()


def write(path: Path, *docs: dict[str, Any]) -> Path:
    from tests.operator_harness import GATEWAY  # noqa: PLC0415

    path.write_text(yaml.safe_dump_all([*docs, GATEWAY], sort_keys=False))
    return path
