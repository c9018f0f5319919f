"""Splitting one fleet over N gateways: every replica is in exactly one gateway, a model with
at least N replicas is served by every gateway in near-equal shares, a model with fewer is
served by as many gateways as it has replicas (the least loaded), and the split is the same
every time it is computed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.errors import ConfigError
from gateway.partition import Partition, partition, replica_id
from profiles.gateway_config import GatewayConfig

PROFILE = "resnet50@A100-80GB/1g.10gb"


def fleet(**replicas: int | list[str]) -> GatewayConfig:
    """A gateway config: each keyword a model with that many replicas (or those variants)."""
    port = 9000
    models = []
    for name, reps in replicas.items():
        variants = reps if isinstance(reps, list) else [name] * reps
        rs = []
        for v in variants:
            rs.append({"url": f"127.0.0.1:{port}", "variant": v, "profile": PROFILE})
            port += 1
        models.append({"name": name, "replicas": rs})
    return parse_config({"listen": {"http_port": 8000, "grpc_port": 8001}, "models": models})


def held(p: Partition, gateway: int) -> dict[str, list[str]]:
    return {m.name: [replica_id(r) for r in m.replicas] for m in p.configs[gateway].models}


def test_a_model_with_enough_replicas_is_split_over_every_gateway_in_equal_shares():
    p = partition(fleet(a=4, b=6), 2)
    assert p.owners == {"a": (0, 1), "b": (0, 1)} and p.everywhere()
    assert [len(held(p, i)["a"]) for i in (0, 1)] == [2, 2]
    assert [len(held(p, i)["b"]) for i in (0, 1)] == [3, 3]


def test_each_gateway_gets_the_same_mix_of_variants():
    p = partition(fleet(m=["small", "big", "small", "big"]), 2)
    for i in (0, 1):
        assert sorted(r.variant for r in p.configs[i].models[0].replicas) == ["big", "small"]


def test_a_model_with_fewer_replicas_than_gateways_lives_on_the_least_loaded_ones():
    p = partition(fleet(big=4, one=1, two=2), 3)
    assert p.owners["big"] == (0, 1, 2)
    assert [len(held(p, i)["big"]) for i in range(3)] == [2, 1, 1]  # the remainder on the first lightest
    assert p.owners["two"] == (1, 2)  # the two lightest after big
    assert p.owners["one"] == (0,)  # all tied at two: the lowest index
    assert not p.everywhere() and p.partial() == {"one": (0,), "two": (1, 2)}
    loads = [sum(len(r) for r in held(p, i).values()) for i in range(3)]
    assert max(loads) - min(loads) <= 1


def test_gateways_keep_the_fleet_settings_and_model_order():
    cfg = fleet(a=2, b=2)
    cfg.drain_timeout_s = 7.0
    p = partition(cfg, 2)
    for c in p.configs:
        assert c.drain_timeout_s == 7.0 and c.listen == cfg.listen
        assert [m.name for m in c.models] == ["a", "b"]
    assert cfg.models[0].replicas and len(cfg.models[0].replicas) == 2  # the input is not changed


def test_one_gateway_holds_the_whole_fleet():
    cfg = fleet(a=3, b=1)
    p = partition(cfg, 1)
    assert held(p, 0) == {m.name: [replica_id(r) for r in m.replicas] for m in cfg.models}


def test_impossible_counts_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"gateway count \(0\) must be at least 1"):
        partition(fleet(a=2), 0)
    with pytest.raises(ConfigError, match=r"gateway count \(3\) exceeds the fleet's replicas \(2\)"):
        partition(fleet(a=2), 3)


def test_verify_names_a_replica_held_by_two_gateways():
    cfg = fleet(a=2)
    good = partition(cfg, 2)
    both = Partition((cfg, cfg), good.owners)  # NOTE: the one thing the partition must never produce
    with pytest.raises(ConfigError, match=r"in several gateways \['a/a#1', 'a/a#2'\]"):
        both.verify(cfg)


@given(st.lists(st.integers(1, 9), min_size=1, max_size=6), st.integers(1, 12))
def test_every_replica_is_in_exactly_one_gateway(sizes: list[int], n: int):
    cfg = fleet(**{f"m{i}": k for i, k in enumerate(sizes)})
    if n > sum(sizes):
        with pytest.raises(ConfigError):
            partition(cfg, n)
        return
    p = partition(cfg, n)
    assert p == partition(cfg, n)  # deterministic: every host computes the same split
    seen: dict[str, int] = {}
    for i in range(n):
        assert p.configs[i].models, "no gateway is left empty"
        for name, ids in held(p, i).items():
            for rid in ids:
                # NOTE: a replica is never in two gateways (they would not see each other's batches)
                assert rid not in seen
                seen[rid] = i
            assert i in p.owners[name]
    assert len(seen) == sum(sizes)
    for name, k in zip((f"m{i}" for i in range(len(sizes))), sizes, strict=True):
        assert len(p.owners[name]) == min(k, n)
        shares = [len(held(p, i).get(name, [])) for i in p.owners[name]]
        assert max(shares) - min(shares) <= 1
