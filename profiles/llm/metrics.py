"""What an engine reports, named as vLLM names its Prometheus series: the one mapping from the
engine model's state to vLLM's gauges and counters, which every emulated engine publishes
(``headrace engine`` on its /metrics, the Triton model as Triton custom metrics)."""

from __future__ import annotations

from dataclasses import dataclass

from profiles.llm.engine import Engine

# the load gauges a router reads of an engine (vLLM's names)
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"


@dataclass(frozen=True, slots=True)
class Sample:
    name: str  # vLLM's series name; a counter's without the ``_total`` Prometheus adds
    doc: str
    counter: bool
    value: float
    labels: tuple[tuple[str, str], ...] = ()  # beyond the model's own labels


def samples(engine: Engine) -> list[Sample]:
    """The engine's series now, always in the same order (a front may pair them by position)."""
    c = engine.counters
    return [
        Sample(RUNNING, "Number of requests in model execution batches.", False,
               len(engine.running)),
        Sample(WAITING, "Number of requests waiting to be processed.", False,
               len(engine.waiting)),
        Sample(KV_USAGE, "KV-cache usage. 1 means 100 percent usage.", False, engine.pool.usage),
        Sample("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", True,
               c.prefix_queries),
        Sample("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", True,
               c.prefix_hits),
        Sample("vllm:num_preemptions", "Cumulative number of preemption from the engine.", True, c.preemptions),
        Sample("vllm:prompt_tokens", "Number of prefill tokens processed.", True, c.prompt_tokens),
        Sample("vllm:generation_tokens", "Number of generation tokens processed.", True, c.generation_tokens),
        Sample("vllm:request_success", "Count of successfully processed requests.", True, c.finished,
               (("finished_reason", "length"),)),
        Sample("vllm:request_success", "Count of successfully processed requests.", True, c.aborted,
               (("finished_reason", "abort"),)),
    ]
