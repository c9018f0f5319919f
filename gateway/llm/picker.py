"""The engine replicas of generative models as the gateway knows them, and the load their
``/metrics`` report (``vllm:num_requests_waiting``, ``vllm:num_requests_running``,
``vllm:kv_cache_usage_perc``). Which replica takes a request is the model's router's to decide
(:mod:`gateway.llm.routing`); what the gateway keeps beside it is here: a replica whose metrics
do not answer is taken out of routing while another answers, and a sheddable request is shed
while every engine has requests waiting when the router has no flow control of its own.
Sans-IO.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.policy.llm.types import EngineLoad
from profiles.llm.metrics import KV_USAGE, RUNNING, WAITING


@dataclass(slots=True, eq=False)
class LlmReplica:
    """One engine of a generative model, as the gateway knows it."""

    id: str
    model: str  # the model clients address
    url: str  # http://host:port
    engine: str  # vllm | sglang | tgi | triton-openai | emulated | triton
    served: str  # the engine's model name (the variant in metrics)
    max_inflight: int
    load: EngineLoad = field(default_factory=EngineLoad)
    reachable: bool = True  # its latest metrics read answered
    draining: bool = False


def parse_load(text: str) -> EngineLoad:
    """The load gauges in a Prometheus text exposition (summed over their label sets; a
    gauge the engine does not publish reads 0)."""
    load = EngineLoad()
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name, _, rest = line.partition("{")
        if not rest:
            name, _, value = line.partition(" ")
        else:
            value = rest.rpartition("}")[2]
        try:
            v = float(value.split()[0])
        except (ValueError, IndexError):
            continue
        if name == WAITING:
            load.waiting += v
        elif name == RUNNING:
            load.running += v
        elif name == KV_USAGE:
            load.kv_usage = max(load.kv_usage, v)
    return load


def available(replicas: Iterable[LlmReplica]) -> dict[str, bool]:
    """Which replicas the router may route to: those not drained whose metrics answered lately;
    when none answered, all of them (an unreachable replica is tried only when no other can be)."""
    reps = [r for r in replicas if not r.draining]
    reachable = any(r.reachable for r in reps)
    return {r.id: r.reachable or not reachable for r in reps}


def saturated(replicas: Iterable[LlmReplica]) -> bool:
    """Every replica that takes requests has requests waiting at its engine: a sheddable request
    would only join a queue (routers without flow control of their own shed it instead)."""
    reps = [r for r in replicas if not r.draining]
    return bool(reps) and all(r.load.waiting > 0 for r in reps)
