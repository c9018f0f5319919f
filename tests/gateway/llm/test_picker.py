"""What the gateway keeps beside each model's router, on the replicas alone (no I/O): the engines'
load read from their metrics, which replicas the router may route to, and when a sheddable
request is shed."""

from __future__ import annotations

from gateway.llm.picker import LlmReplica, available, parse_load, saturated
from gateway.policy.llm.types import EngineLoad


def replica(rid: str, waiting: float = 0, **kw: object) -> LlmReplica:
    r = LlmReplica(rid, "llama", f"http://{rid}:1", "vllm", "llama", 8, EngineLoad(waiting))
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_unreachable_replicas_are_routed_to_only_when_none_answers() -> None:
    assert available([replica("a", reachable=False), replica("b")]) == {"a": False, "b": True}
    assert available([replica("a", reachable=False), replica("b", reachable=False)]) == {"a": True, "b": True}
    # NOTE: a drained replica is the router's own business: it is left out either way
    assert available([replica("a", draining=True), replica("b", reachable=False)]) == {"b": True}


def test_sheddable_requests_are_shed_only_while_every_engine_has_requests_waiting() -> None:
    assert saturated([replica("a", waiting=2), replica("b", waiting=1)])
    assert not saturated([replica("a", waiting=2), replica("b")])
    assert not saturated([replica("a", waiting=2, draining=True), replica("b")])
    assert not saturated([])


def test_load_is_read_from_vllm_metric_names() -> None:
    text = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 99.0
"""
    assert parse_load(text) == EngineLoad(waiting=3.0, running=3.0, kv_usage=0.25)
    assert parse_load("") == EngineLoad()
