"""Which engine replica takes a generative request, on the picker alone (no I/O)."""

from __future__ import annotations

from gateway.llm.picker import EngineLoad, LlmReplica, parse_load, pick


def replica(rid: str, outstanding: int = 0, waiting: float = 0, running: float = 0, kv: float = 0.0,
            **kw: object) -> LlmReplica:
    r = LlmReplica(rid, "llama", f"http://{rid}:1", "vllm", "llama", kw.pop("max_inflight", 8), outstanding,  # type: ignore[arg-type]
                   EngineLoad(waiting, running, kv))
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_fewest_outstanding_first_then_the_engines_own_load() -> None:
    assert pick([replica("a", 2), replica("b", 1)]).id == "b"  # type: ignore[union-attr]
    assert pick([replica("a", 1, waiting=3), replica("b", 1, waiting=1)]).id == "b"  # type: ignore[union-attr]
    assert pick([replica("a", 1, running=5), replica("b", 1, running=2)]).id == "b"  # type: ignore[union-attr]
    assert pick([replica("a", 0, kv=0.5), replica("b", 0, kv=0.1)]).id == "b"  # type: ignore[union-attr]


def test_draining_and_full_replicas_take_nothing_and_unreachable_ones_come_last() -> None:
    assert pick([replica("a", draining=True), replica("b", 8)]) is None  # b is at its max_inflight
    assert pick([replica("a", reachable=False), replica("b", 5)]).id == "b"  # type: ignore[union-attr]
    assert pick([replica("a", reachable=False)]).id == "a"  # type: ignore[union-attr]
    assert pick([]) is None


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


def test_best_effort_only_fills_spare_capacity() -> None:
    busy, spare = replica("busy", 0, waiting=2), replica("spare", 3)
    # NOTE: a guaranteed request goes where fewest are open; a best-effort one never joins a queue
    assert pick([busy, spare]).id == "busy"  # type: ignore[union-attr]
    assert pick([busy, spare], best_effort=True).id == "spare"  # type: ignore[union-attr]
    assert pick([busy], best_effort=True) is None
