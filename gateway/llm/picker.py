"""Which engine replica takes a generative request: sans-IO (no clock, no I/O).

The engine batches continuously, so the gateway does not batch; it spreads requests. The
replica with the fewest requests the gateway has open at it takes the next one; ties go to
the one whose engine reports the least load (``vllm:num_requests_waiting``, then
``vllm:num_requests_running``, then ``vllm:kv_cache_usage_perc``, read from its ``/metrics``).
A replica being drained or at its ``max_inflight`` takes none; one whose metrics could not be
read lately is chosen only when no other can be. A best-effort request only fills spare
capacity: it goes to a replica whose engine has nothing waiting, else to none (it is shed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from profiles.llm.metrics import KV_USAGE, RUNNING, WAITING


@dataclass(slots=True)
class EngineLoad:
    """What an engine's ``/metrics`` said at its last read."""

    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0


@dataclass(slots=True, eq=False)
class LlmReplica:
    """One engine of a generative model, as the gateway knows it."""

    id: str
    model: str  # the model clients address
    url: str  # http://host:port
    engine: str  # vllm | sglang | tgi | triton-openai | emulated | triton
    served: str  # the engine's model name (the variant in metrics)
    max_inflight: int
    outstanding: int = 0  # requests the gateway has open at it
    load: EngineLoad = field(default_factory=EngineLoad)
    reachable: bool = True  # its latest metrics read answered
    draining: bool = False


def pick(replicas: Iterable[LlmReplica], best_effort: bool = False) -> LlmReplica | None:
    """The replica to send the next request to; None when none can take one."""
    best, best_key = None, None
    for r in replicas:
        if r.draining or r.outstanding >= r.max_inflight or (best_effort and r.load.waiting > 0):
            continue
        key = (not r.reachable, r.outstanding, r.load.waiting, r.load.running, r.load.kv_usage)
        if best_key is None or key < best_key:
            best, best_key = r, key
    return best


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
