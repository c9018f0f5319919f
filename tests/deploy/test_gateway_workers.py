"""The operator's gateway workers driven as one gateway (deploy/operator/gateway_workers.py):
every replica in exactly one worker, every worker holding each model through adds, drains
and rollouts, generative engines and counters over all of them, and a dead worker started
again with what it held. The workers here are fakes that record what they are told; the
live test is in test_controller_crash.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from deploy.operator.gateway_workers import (
    GatewayWorkers,
    adopt_workers,
    start_workers,
    worker_name,
)
from gateway.config import parse_config
from gateway.control import ControlError
from gateway.handle import Seen, first_replica
from profiles.gateway_config import GatewayConfig, LlmModelConfig, LlmReplicaConfig
from tests.gateway.test_control import PROFILE, gateway_doc


def rep(rid: str, variant: str = "v") -> dict[str, Any]:
    return {"url": f"fake:{abs(hash(rid)) % 60000 + 1}", "variant": variant, "profile": PROFILE, "id": rid}


def config(**models: list[str]) -> GatewayConfig:
    return parse_config(gateway_doc(*((name, [rep(r) for r in rids]) for name, rids in models.items())))


class Worker:
    """A gateway worker that records what it serves."""

    def __init__(self, cfg: GatewayConfig, name: str) -> None:
        self.name, self.up = name, True
        self.served: dict[str, str] = {r.id: m.name for m in cfg.models for r in m.replicas}  # type: ignore[misc]
        self.llm: dict[str, set[str]] = {}
        self.http_url, self.grpc_url = f"127.0.0.1:{cfg.listen.http_port}", f"127.0.0.1:{cfg.listen.grpc_port}"
        self.cfg = cfg
        self.cold: dict[str, float] = {}
        self.log: list[str] = []
        self.models = dict(self.served)
        self.stopped = False

    @property
    def record(self) -> dict[str, Any]:
        return {"pid": id(self), "started": 1.0}

    def alive(self) -> bool:
        return self.up

    async def add_replica(self, cfg: GatewayConfig, model: str) -> None:
        rid = first_replica(cfg, model).replicas[0].id
        assert rid not in self.served, f"{rid} added twice to {self.name}"
        self.served[rid] = model
        self.log.append(f"+{rid}")

    async def remove_replica(self, rid: str, timeout: float, keep_model: bool = False) -> bool:
        if rid in self.served:
            del self.served[rid]
            self.log.append(f"-{rid}")
            return True
        for reps in self.llm.values():
            if rid in reps:
                reps.discard(rid)
                return True
        raise ControlError(f"replica {rid!r} is not served", 404)

    async def replicas(self) -> dict[str, bool]:
        return dict.fromkeys(self.served, True)

    async def llm_replicas(self) -> dict[str, bool]:
        return {r: True for reps in self.llm.values() for r in reps}

    async def set_llm_model(self, model: LlmModelConfig) -> None:
        self.llm.setdefault(model.name, set())

    async def add_llm_replica(self, model: LlmModelConfig, replica: LlmReplicaConfig) -> None:
        self.llm.setdefault(model.name, set()).add(replica.id)

    async def drop_llm_model(self, name: str) -> None:
        self.llm.pop(name, None)

    async def counters(self) -> list[tuple[str, dict[str, str], float]]:
        return [("headrace_requests_total", {"model": m}, 10.0) for m in sorted(set(self.served.values()))]

    async def look(self) -> Seen:
        return Seen(await self.replicas(), await self.llm_replicas(), await self.counters())

    async def hold_cold(self, waits: dict[str, float], starter: Any) -> None:
        self.cold = dict(waits)

    async def stop(self, drain_timeout: float, wait: bool = True) -> None:
        self.stopped, self.up = True, False

    async def close(self) -> None:
        pass


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def start(cfg: GatewayConfig, name: str) -> Worker:
    return Worker(cfg, name)


def per_worker(gw: GatewayWorkers, model: str) -> list[list[str]]:
    return [sorted(r for r, m in w.served.items() if m == model) for w in gw.workers]  # type: ignore[union-attr]


def test_start_deals_every_replica_to_exactly_one_worker_on_shared_ports() -> None:
    async def body() -> None:
        gw = await start_workers(config(a=["a1", "a2", "a3"], b=["b1", "b2"]), 2, start)  # type: ignore[arg-type]
        assert [w.name for w in gw.workers] == ["gateway", "gateway-1"]  # type: ignore[union-attr]
        assert per_worker(gw, "a") == [["a1", "a3"], ["a2"]]
        assert per_worker(gw, "b") == [["b2"], ["b1"]]  # the lighter worker first
        ports = {(w.http_url, w.grpc_url) for w in gw.workers}  # type: ignore[union-attr]
        assert len(ports) == 1 and "127.0.0.1:0" not in next(iter(ports))  # one pair, picked once
        assert gw.records.keys() == {"gateway", "gateway-1"}
    run(body())


def test_a_rollout_never_leaves_a_worker_without_the_model() -> None:
    async def body() -> None:
        gw = await start_workers(config(a=["a1", "a2"]), 2, start)  # type: ignore[arg-type]
        seen: list[list[list[str]]] = []
        for old, new in (("a1", "a3"), ("a2", "a4"), ("a3", "a5"), ("a4", "a6")):  # one at a time, make before break
            await gw.add_replica(config(a=[new]), "a")
            seen.append(per_worker(gw, "a"))
            await gw.remove_replica(old, 1.0)
            seen.append(per_worker(gw, "a"))
        assert all(all(part for part in s) for s in seen), seen
        assert sorted(sum(per_worker(gw, "a"), [])) == ["a5", "a6"]
        assert not set(per_worker(gw, "a")[0]) & set(per_worker(gw, "a")[1])  # each in exactly one
    run(body())


def test_the_last_replica_of_a_worker_is_replaced_before_it_drains() -> None:
    async def body() -> None:
        gw = await start_workers(config(a=["a1", "a2"]), 2, start)  # type: ignore[arg-type]
        w0, w1 = gw.workers
        await gw.add_replica(config(a=["a3"]), "a")  # goes to worker 0 (tie: lowest index)
        assert per_worker(gw, "a") == [["a1", "a3"], ["a2"]]
        await gw.remove_replica("a2", 1.0)  # worker 1's only one: a3 moves there first
        assert per_worker(gw, "a") == [["a1"], ["a3"]]
        assert w1.log == ["+a3", "-a2"] and w0.log == ["+a3", "-a3"]  # type: ignore[union-attr]
        assert gw.worker_of("a3") == 1
    run(body())


def test_a_model_scaled_down_to_one_replica_is_left_where_it_is() -> None:
    async def body() -> None:
        gw = await start_workers(config(a=["a1", "a2"]), 2, start)  # type: ignore[arg-type]
        await gw.remove_replica("a2", 1.0)  # nothing to move: worker 1 answers a with no replica
        assert per_worker(gw, "a") == [["a1"], []]
    run(body())


def test_engines_cold_holds_and_counters_cover_every_worker() -> None:
    async def body() -> None:
        gw = await start_workers(config(a=["a1", "a2"]), 2, start)  # type: ignore[arg-type]
        model = LlmModelConfig(name="llm", slo_ttft_ms=500, replicas=[])
        await gw.set_llm_model(model)
        await gw.add_llm_replica(model, LlmReplicaConfig(id="e1", url="http://127.0.0.1:1"))
        assert all(w.llm == {"llm": {"e1"}} for w in gw.workers)  # type: ignore[union-attr]
        assert await gw.llm_replicas() == {"e1": True}
        assert await gw.remove_replica("e1", 1.0) is True
        assert all(w.llm == {"llm": set()} for w in gw.workers)  # type: ignore[union-attr]
        await gw.hold_cold({"b": 5.0}, lambda m: None)
        assert all(w.cold == {"b": 5.0} for w in gw.workers)  # type: ignore[union-attr]
        assert await gw.counters() == [("headrace_requests_total", {"model": "a"}, 20.0)]
        assert await gw.replicas() == {"a1": True, "a2": True}
        seen = await gw.look()
        assert (seen.replicas, seen.llm, seen.counters) == ({"a1": True, "a2": True}, {},
                                                             [("headrace_requests_total", {"model": "a"}, 20.0)])
    run(body())


def test_a_dead_worker_is_started_again_with_what_it_held_on_the_same_ports() -> None:
    async def body() -> None:
        cfg = config(a=["a1", "a2", "a3", "a4"], b=["b1", "b2"])
        gw = await start_workers(cfg, 2, start)  # type: ignore[arg-type]
        before = per_worker(gw, "a"), per_worker(gw, "b")
        ports = gw.workers[1].http_url  # type: ignore[union-attr]
        gw.workers[1].up = False  # type: ignore[union-attr]
        assert not gw.alive() and gw.dead() == [1]
        assert await gw.replicas() == {"a1": True, "a3": True, "b1": True}  # the live worker serves on
        assert await gw.heal(cfg) == [1]
        assert gw.alive() and (per_worker(gw, "a"), per_worker(gw, "b")) == before
        assert gw.workers[1].http_url == ports and gw.workers[1].name == "gateway-1"  # type: ignore[union-attr]
    run(body())


def test_adoption_keeps_each_replica_where_it_is_served_and_deals_out_the_dead_workers() -> None:
    async def body() -> None:
        cfg = config(a=["a1", "a2", "a3"])
        w0 = Worker(config(a=["a2"]), "gateway")
        gw = adopt_workers([w0, None], start)  # type: ignore[list-item, arg-type]
        assert gw.home == {"a2": 0} and gw.dead() == [1]
        gw.learn(cfg)
        assert await gw.heal(cfg) == [1]
        assert per_worker(gw, "a") == [["a2"], ["a1", "a3"]]  # what no live worker held
    run(body())


def test_worker_names_are_the_state_keys() -> None:
    assert [worker_name(i) for i in range(3)] == ["gateway", "gateway-1", "gateway-2"]


def test_a_worker_that_cannot_start_stops_the_ones_started() -> None:
    started: list[Worker] = []

    async def flaky(cfg: GatewayConfig, name: str) -> Worker:
        if name == "gateway-1":
            raise RuntimeError("the gateway process exited with code 2")
        started.append(w := Worker(cfg, name))
        return w

    with pytest.raises(RuntimeError, match="exited"):
        run(start_workers(config(a=["a1", "a2"]), 2, flaky))  # type: ignore[arg-type]
    assert [w.stopped for w in started] == [True]
