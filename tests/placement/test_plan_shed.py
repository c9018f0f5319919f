"""A best-effort model a partial plan gives no replica at all: the rendered gateway config keeps
it with no replicas, and the gateway answers its requests with the no-replica refusal (503,
Retry-After, reason ``no_replica``), as while every replica of a model is down, never with the
unknown-model 404. A re-plan that places it again serves it."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.app import GatewayThread
from gateway.codec import Tensor
from gateway.config import parse_config, resolve
from gateway.errors import REASON_HEADER, ConfigError
from placement.apply.render import Endpoint, gateway_config
from placement.plan import Demand, Plan
from placement.solve.solver import solve
from profiles.schema import GatewaySettings, ListenConfig
from tests.gateway.test_gateway_driver import FakeReplica
from tests.placement.test_plan_priority import CAP, PS, pool, replicas


class Echo(FakeReplica):
    """A replica that answers ``y = x`` at once."""

    async def infer(self, variant: str, inputs: list[Tensor], timeout: float | None, *args: Any,
                    **kwargs: Any) -> list[Tensor]:
        self.calls.append((variant, inputs[0].shape[0]))
        return [Tensor("y", "FP32", list(inputs[0].shape), bytes(inputs[0].raw))]


def shedding_plan() -> Plan:
    """One GPU of seven 1g replicas: g (guaranteed) takes all seven, b (best-effort) none."""
    plan = solve([Demand("b", CAP, 0.1, priority="best-effort"), Demand("g", 6.5 * CAP, 0.1, headroom=1.0)],
                 PS, pool(1))
    plan.verify()
    assert replicas(plan, "g") == 7 and replicas(plan, "b") == 0
    assert [(s.model, s.placed) for s in plan.shortfall] == [("b", 0.0)]
    return plan


def endpoints(plan: Plan) -> list[Endpoint]:
    return [Endpoint(f"{g.id}/{s.label}#{i}", r.model, r.variant, g.id, s.label, r.share, r.max_batch, r.capacity,
                     f"fake:{8000 + i}", f"fake:{9000 + i}") for i, (g, s, r) in enumerate(plan.replicas())]


def post(gw: Any, model: str) -> tuple[int, dict[str, str], str]:
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}).encode()
    conn = http.client.HTTPConnection(gw.http_url, timeout=10)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", body)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
    finally:
        conn.close()


def test_the_rendered_config_keeps_a_shed_model_with_no_replicas(tmp_path: Path) -> None:
    plan = shedding_plan()
    cfg = gateway_config(plan, endpoints(plan), PS, tmp_path)
    by = {m.name: m for m in cfg.models}
    assert by["b"].replicas == [] and by["b"].priority == "best-effort"
    assert len(by["g"].replicas) == 7
    # NOTE: what is written as YAML (the fields render set) reads back as the same config
    again = parse_config(yaml.safe_load(yaml.safe_dump(cfg.model_dump(mode="json", exclude_unset=True))))
    assert again.model_dump() == cfg.model_dump()
    served = {m.name: m for m in resolve(again)}
    assert served["b"].replicas == () and len(served["g"].replicas) == 7


def test_a_model_placed_but_not_given_endpoints_is_left_out(tmp_path: Path) -> None:
    # NOTE: the operator renders one new replica at a time; models placed elsewhere in the
    # plan stay out of such a config, only models the plan sheds come with it
    plan = shedding_plan()
    cfg = gateway_config(plan, endpoints(plan)[:1], PS, tmp_path)
    assert [(m.name, len(m.replicas)) for m in cfg.models] == [("b", 0), ("g", 1)]


def test_replicas_must_still_be_a_list() -> None:
    with pytest.raises(ConfigError, match=r"models.0.replicas: Field required"):
        parse_config({"models": [{"name": "b"}]})


def test_the_gateway_refuses_a_shed_model_as_unavailable_not_unknown(tmp_path: Path) -> None:
    plan = shedding_plan()
    cfg = gateway_config(plan, endpoints(plan), PS, tmp_path,
                         GatewaySettings(listen=ListenConfig(http_port=0, grpc_port=0),
                                         scheduler={"no_replica_retry_after_s": 5.0}))
    fakes: dict[str, Echo] = {}

    def factory(_protocol: str, url: str) -> Echo:
        return fakes.setdefault(url, Echo(url))

    with GatewayThread(cfg, replica_factory=factory) as gw:
        status, headers, body = post(gw, "b")
        assert status == 503, body
        assert headers[REASON_HEADER.lower()] == "no_replica" and headers["retry-after"] == "5"
        assert "no healthy replica serves model 'b'" in body
        assert post(gw, "g")[0] == 200
        assert post(gw, "nope")[0] == 404  # an unknown model is still unknown


def test_a_shed_model_is_served_once_a_replica_is_added(tmp_path: Path) -> None:
    # a re-plan that places b again: the operator adds its replica to the running gateway
    plan = shedding_plan()
    cfg = gateway_config(plan, endpoints(plan), PS, tmp_path)
    fakes: dict[str, Echo] = {}

    def factory(_protocol: str, url: str) -> Echo:
        return fakes.setdefault(url, Echo(url))

    placed = solve([Demand("b", CAP, 0.1, priority="best-effort")], PS, pool(1))
    (ep,) = [Endpoint("n0/gpu0/b#0", r.model, r.variant, g.id, s.label, r.share, r.max_batch, r.capacity,
                      "fake:7000", "fake:7001") for g, s, r in placed.replicas()]
    thread = GatewayThread(cfg, replica_factory=factory)
    with thread as gw:
        assert post(gw, "b")[0] == 503
        (model,) = resolve(gateway_config(placed, [ep], PS, tmp_path / "p"))
        thread.call(gw.add_replica(model, model.replicas[0]), timeout=10)
        status, _, body = post(gw, "b")
        assert status == 200, body
        assert fakes["fake:7000"].calls == [("b", 1)]


def test_a_shed_model_is_in_every_gateway_of_a_partition(tmp_path: Path) -> None:
    from gateway.partition import partition

    plan = shedding_plan()
    p = partition(gateway_config(plan, endpoints(plan), PS, tmp_path), 3)
    assert p.owners["b"] == (0, 1, 2) and p.owners["g"] == (0, 1, 2)
    assert all([m.replicas for m in c.models if m.name == "b"] == [[]] for c in p.configs)


def test_a_shed_model_does_not_stop_one_host_workers(tmp_path: Path) -> None:
    from gateway.workers import local_partition

    plan = shedding_plan()
    p = local_partition(gateway_config(plan, endpoints(plan), PS, tmp_path), 2)
    assert p.everywhere()
