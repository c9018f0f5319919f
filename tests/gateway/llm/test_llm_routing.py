"""What a generative model's router is made of, and how the gateway drives it, without engines:
the config's router and flow control, a replica's spec from its profile, a request's tokens, band
and tenant, and the driver's handling of held, withdrawn and refused requests (on a small router)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.llm.api import LlmCall, OpenAiError, read_call
from gateway.llm.dispatch import ModelRouter
from gateway.llm.kvevents import SseLines, parse_batch
from gateway.llm.routing import (
    COMPLETION_MAX_TOKENS,
    ROUTERS,
    engine_model,
    find_llm_profile,
    flow_settings,
    make_router,
    read_ask,
    token_request,
)
from gateway.observe.metrics import GatewayMetrics
from gateway.policy.llm.baselines import BASELINES
from gateway.policy.llm.types import (
    Band,
    Decision,
    Refuse,
    ReplicaSpec,
    ReplicaView,
    Route,
    RouterBase,
    TokenRequest,
)
from profiles.emulator.llm_openai import read_generation
from profiles.emulator.llm_server import kv_event_dicts
from profiles.gateway_config import LlmReplicaConfig, LlmRoutingConfig
from profiles.llm.kv import ROOT_HASH, BlockRemoved, BlockStored, block_hashes
from profiles.profile import ProfileError
from profiles.schema import FlowControlSpec

TINY = Path(__file__).resolve().parents[3] / "profiles/llm/measured/tiny-llama-cpu.yaml"


def call(kind: str = "completion", **body: object) -> LlmCall:
    return read_call(kind, json.dumps({"model": "m", **body}).encode())  # type: ignore[arg-type]


# ---- the config's router

def test_every_router_the_config_names_is_made_fresh_by_name() -> None:
    # NOTE: the config's names and the routers that exist are the same set
    assert set(ROUTERS) == {"headrace", *BASELINES}
    for name in ROUTERS:
        a, b = make_router(LlmRoutingConfig(router=name)), make_router(LlmRoutingConfig(router=name))
        assert isinstance(a, RouterBase) and a is not b


def test_flow_control_settings_come_from_the_config_unset_limits_the_routers_own() -> None:
    default = flow_settings(FlowControlSpec()).queue_limit
    s = flow_settings(FlowControlSpec.model_validate({"queue": {"sheddable": 0}, "fairness": "none"}))
    assert s.queue_limit[Band.SHEDDABLE] == 0 and s.queue_limit[Band.CRITICAL] == default[Band.CRITICAL]
    assert not s.fairness and flow_settings(FlowControlSpec()).fairness
    router = make_router(LlmRoutingConfig(), FlowControlSpec.model_validate({"queue": {"standard": 3}}))
    assert router.settings.flow.queue_limit[Band.STANDARD] == 3  # type: ignore[attr-defined]


# ---- engines

def test_a_replicas_spec_comes_from_its_profile_at_its_memory_use() -> None:
    name = "llama-3.1-8b-instruct-bf16@H100-80GB/gpu"
    p = find_llm_profile(name)
    e = engine_model("r", LlmReplicaConfig(url="http://h:1", profile=name, gpu_memory_utilization=0.8,
                                           max_inflight=7))
    assert e.spec.step_time == p.step_time and e.spec.num_blocks == p.engine_config(0.8).num_blocks
    assert e.spec.frontend_s == p.frontend_s and e.spec.max_inflight == 7 and e.max_model_len == p.max_model_len
    from_file = engine_model("f", LlmReplicaConfig(url="http://h:1", profile=TINY.name), base_dir=TINY.parent)
    assert from_file.spec.step_time is not None and from_file.spec.num_blocks > 0
    bare = engine_model("b", LlmReplicaConfig(url="http://h:1"))
    assert bare.spec.step_time is None and bare.max_model_len is None
    with pytest.raises(ProfileError, match="known: .*" + name.replace("/", ".")):
        engine_model("x", LlmReplicaConfig(url="http://h:1", profile="no-such@GPU/gpu"))


# ---- requests

@pytest.mark.parametrize(("kind", "body"), [
    ("completion", {"prompt": "The quick brown fox, again and again. " * 20}),
    ("completion", {"prompt": ["one prompt in a list of words " * 10]}),
    ("completion", {"prompt": list(range(100, 180))}),
    ("chat", {"messages": [{"role": "system", "content": "be brief " * 20},
                           {"role": "user", "content": [{"type": "text", "text": "hello there " * 9}]}]}),
])
def test_a_prompts_blocks_are_those_the_emulated_engine_counts(kind: str, body: dict) -> None:
    ask = read_ask(call(kind, **body), {}, 1.0, 0.1, "guaranteed")
    req = token_request("r", call(kind, **body), ask)
    gen = read_generation(kind, {"model": "m", **body}, ("m",), 32000, 4096)  # type: ignore[arg-type]
    assert req.prompt_len == len(gen.prompt) and len(req.hashes) == len(gen.prompt) // 16
    assert list(req.hashes) == block_hashes(gen.prompt)


def test_max_tokens_is_the_bodys_else_vllms_default() -> None:
    ask = read_ask(call(prompt="x"), {}, 1.0, 0.1, "guaranteed")
    assert token_request("a", call(prompt="x", max_tokens=9), ask).max_tokens == 9
    assert token_request("b", call(prompt="x"), ask).max_tokens == COMPLETION_MAX_TOKENS
    chat = call("chat", messages=[{"role": "user", "content": "a b c"}], max_completion_tokens=5, max_tokens=50)
    assert token_request("c", chat, ask).max_tokens == 5
    rest = token_request("d", call("chat", messages=[{"role": "user", "content": "a b c"}]), ask, context=100)
    assert rest.max_tokens == 100 - rest.prompt_len


def test_band_and_tenant_come_from_headers_else_the_model_and_the_body() -> None:
    c = call(prompt="x", user="alice")
    ask = read_ask(c, {"x-slo-ttft-ms": "250"}, 1.0, 0.1, "best-effort")
    assert (ask.ttft_slo, ask.tpot_slo, ask.band, ask.tenant) == (0.25, 0.1, Band.SHEDDABLE, "alice")
    ask = read_ask(c, {"x-headrace-priority": "critical", "x-headrace-tenant": "bob"}, 1.0, 0.1, "best-effort")
    assert (ask.band, ask.tenant) == (Band.CRITICAL, "bob")
    assert read_ask(c, {"x-headrace-priority": "guaranteed"}, 1, 1, "best-effort").band is Band.STANDARD
    assert read_ask(call(prompt="x"), {}, 1.0, 0.1, "guaranteed").tenant == ""
    # NOTE: an API key's tenant and class stand over what the headers claim
    keyed = read_ask(c, {"x-headrace-priority": "critical", "x-headrace-tenant": "bob"}, 1, 1, "guaranteed",
                     "acme", "best-effort")
    assert (keyed.band, keyed.tenant) == (Band.SHEDDABLE, "acme")
    for bad in ("urgent", ""):
        with pytest.raises(OpenAiError, match="x-headrace-priority") as e:
            read_ask(c, {"x-headrace-priority": bad}, 1.0, 0.1, "guaranteed")
        assert e.value.status == 400


def test_kv_event_batches_read_back_as_the_engine_published_them() -> None:
    events = [BlockStored((1, 2), ROOT_HASH), BlockStored((3,), 2), BlockRemoved((7,)), BlockRemoved((8,))]
    wire = f"id: 4\ndata: {json.dumps({'seq': 4, 'ts': 0.0, 'events': kv_event_dicts(events, 16)})}\n\n".encode()
    lines = SseLines()
    assert lines.feed(b": subscribed\n\n" + wire[:20]) == []  # a comment, and half an event
    (payload,) = lines.feed(wire[20:])
    assert parse_batch(payload) == [BlockStored((1, 2, 3), ROOT_HASH), BlockRemoved((7, 8))]
    assert parse_batch(b"not json") == [] and parse_batch(b'{"events": [{"type": "BlockStored"}]}') == []


# ---- the driver, on a small router that holds

class Gate(RouterBase):
    """Routes to the replica with the fewest open; while every one is full, holds requests, first
    come first routed; refuses a held one at its TTFT deadline."""

    name = "gate"

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[str, TokenRequest] = {}

    def submit(self, request: TokenRequest, now: float) -> list[Decision]:
        request.arrival = now
        if self.held or all(v.full for v in self.replicas.values()):
            self.held[request.id] = request
            return []
        return [self.place(request, now)]

    def poll(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        for r in list(self.held.values()):
            if r.ttft_deadline <= now:
                del self.held[r.id]
                out.append(Refuse(r, "late", 2.5))
            elif any(not v.full for v in self.replicas.values()):
                del self.held[r.id]
                out.append(self.place(r, now))
        return out

    @property
    def wake(self) -> float | None:
        return min((r.ttft_deadline for r in self.held.values()), default=None)

    @property
    def queued(self) -> int:
        return len(self.held)

    def choose(self, request: TokenRequest, candidates: list[ReplicaView], now: float) -> ReplicaView:
        return min(candidates, key=lambda v: (v.outstanding, v.id))

    def on_finish(self, request_id: str, now: float) -> None:
        self.held.pop(request_id, None)
        super().on_finish(request_id, now)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def driver(clock: Clock, replicas: int = 1) -> tuple[ModelRouter, Gate, GatewayMetrics]:
    gate, metrics = Gate(), GatewayMetrics()
    mr = ModelRouter("m", gate, clock, metrics)
    for i in range(replicas):
        mr.add_replica(ReplicaSpec(f"r{i}", max_inflight=1))
    return mr, gate, metrics


def req(rid: str, ttft: float = 10.0) -> TokenRequest:
    return TokenRequest(rid, 32, 8, ttft_slo=ttft)


def metric(m: GatewayMetrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def test_a_held_request_is_routed_when_a_finish_frees_its_replica() -> None:
    async def run() -> None:
        clock = Clock()
        mr, gate, metrics = driver(clock)
        first = await mr.decide(req("a"))
        held = asyncio.ensure_future(mr.decide(req("b")))
        await asyncio.sleep(0)
        assert isinstance(first, Route) and not held.done() and gate.queued == 1
        assert metric(metrics, "headrace_llm_queued", model="m") == 1
        clock.t += 1.0
        mr.first_token("a")
        mr.finish("a")
        assert (await held) == Route(held.result().request, "r0") and gate.replicas["r0"].outstanding == 1
        assert metric(metrics, "headrace_llm_queued", model="m") == 0
        mr.close()

    asyncio.run(run())


def test_a_request_whose_client_leaves_while_held_is_withdrawn() -> None:
    async def run() -> None:
        clock = Clock()
        mr, gate, _ = driver(clock)
        await mr.decide(req("a"))
        held = asyncio.ensure_future(mr.decide(req("b")))
        await asyncio.sleep(0)
        held.cancel()
        with pytest.raises(asyncio.CancelledError):
            await held
        # NOTE: the router forgot it: freeing the replica routes nothing, and nothing waits
        assert gate.queued == 0 and not mr.waiting
        mr.finish("a")
        assert gate.replicas["r0"].outstanding == 0 and not gate.where
        mr.close()

    asyncio.run(run())


def test_a_held_request_is_refused_when_the_router_wakes_and_refusals_are_counted_by_reason() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        mr, gate, metrics = driver(loop.time)  # type: ignore[arg-type]  (the timer needs real time)
        await mr.decide(req("a"))
        d = await asyncio.wait_for(mr.decide(req("b", ttft=0.02)), 5.0)
        assert isinstance(d, Refuse) and d.reason == "late" and gate.queued == 0
        assert metric(metrics, "headrace_llm_refused_total", model="m", reason="late") == 1
        mr.close()

    asyncio.run(run())


def test_an_unreachable_replica_is_out_of_routing_until_it_answers_and_a_drained_one_stays_out() -> None:
    async def run() -> None:
        clock = Clock()
        mr, gate, _ = driver(clock, replicas=2)
        mr.set_available("r0", False)
        assert (await mr.decide(req("a"))) == Route(gate.replicas["r1"].open["a"].request, "r1")
        mr.set_available("r0", True)
        assert not gate.replicas["r0"].draining
        mr.drain_replica("r1")
        mr.set_available("r1", True)  # NOTE: a drain is for good
        assert gate.replicas["r1"].draining
        mr.close()

    asyncio.run(run())


def test_a_kv_event_stream_that_ends_is_subscribed_to_again() -> None:
    from aiohttp import web

    from gateway.llm.kvevents import follow

    subscriptions = 0

    async def kv_events(request: web.Request) -> web.StreamResponse:
        nonlocal subscriptions
        subscriptions += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        batch = {"seq": subscriptions, "events": [{"type": "BlockRemoved", "block_hashes": [subscriptions]}]}
        await resp.write(f"id: {subscriptions}\ndata: {json.dumps(batch)}\n\n".encode())
        return resp  # the stream ends, as when the engine drops a subscriber that fell behind

    async def run() -> list:
        app = web.Application()
        app.router.add_get("/v1/kv_events", kv_events)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        got: list = []
        task = asyncio.ensure_future(follow(f"http://127.0.0.1:{runner.addresses[0][1]}", got.extend, retry_s=0.01))
        try:
            while len(got) < 3:
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            await runner.cleanup()
        return got

    assert asyncio.run(asyncio.wait_for(run(), 10))[:3] == [BlockRemoved((1,)), BlockRemoved((2,)), BlockRemoved((3,))]
