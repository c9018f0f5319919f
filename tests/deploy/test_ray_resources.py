"""The Ray mode's naming: which pool nodes a cluster offers (from ``ray.nodes()``), and the pool
cut down to them before planning. No cluster needed."""

from __future__ import annotations

import pytest
import yaml

from deploy.ray.resources import node_resources, pinned, present_nodes
from tests.operator_harness import deployment
from tests.ray_harness import ray_pool


def ray_node(alive: bool = True, **resources: float) -> dict:
    return {"Alive": alive, "Resources": {"CPU": 2.0, "memory": 1e9, "node:10.0.0.1": 1.0, **resources}}


def test_present_nodes_are_the_live_ray_nodes_offering_a_headrace_node_resource() -> None:
    nodes = [ray_node(**node_resources("n1", {"A100-80GB": 2})),
             ray_node(alive=False, **node_resources("n2", {"A100-80GB": 2})),
             ray_node()]  # a plain Ray node serves no pool node
    assert present_nodes(nodes) == {"n1": {"A100-80GB": 2.0}}


def test_an_actor_is_pinned_by_a_small_share_of_its_nodes_resource() -> None:
    assert pinned("n1", {"A100-80GB": 1.0}) == {"headrace-node:n1": 0.001, "A100-80GB": 1.0}


def test_the_pool_is_cut_to_the_present_nodes_and_none_left_is_one_clear_error() -> None:
    pytest.importorskip("ray")
    from deploy.operator.controller import ApplyError
    from deploy.operator.desired import base_profiles, prepare
    from deploy.ray.controller import on_nodes

    want = prepare(yaml.safe_dump_all([ray_pool(), deployment("resnet50", 3500, 100)]), base_profiles())
    assert on_nodes(want, {"n1", "n2"}) is want
    cut = on_nodes(want, {"n1"})
    assert [n.name for n in cut.docs.pools[0].spec.nodes] == ["n1"]
    assert [n.name for n in want.docs.pools[0].spec.nodes] == ["n2", "n1"]  # the documents stay whole
    with pytest.raises(ApplyError, match=r"none of pool 'ray'.s nodes \['n2', 'n1'\] is in the Ray cluster"):
        on_nodes(want, {"other"})
