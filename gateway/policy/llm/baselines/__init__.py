"""The generative-request routers in use elsewhere, each as its own documentation and code describe
it (defaults included), on headrace's :class:`~gateway.policy.llm.types.RouterBase` protocol.

:data:`BASELINES` maps a name to a constructor taking ``seed``; :func:`make` builds one by name.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from gateway.policy.llm.baselines.dynamo import Dynamo
from gateway.policy.llm.baselines.least_request import LeastRequest
from gateway.policy.llm.baselines.llmd import LlmD
from gateway.policy.llm.baselines.pow2 import PowerOfTwo
from gateway.policy.llm.baselines.round_robin import RoundRobin
from gateway.policy.llm.baselines.sglang import SglangCacheAware
from gateway.policy.llm.types import RouterBase

BASELINES: dict[str, Callable[..., RouterBase]] = {
    "round-robin": RoundRobin,
    "least-request": LeastRequest,
    "pow2": PowerOfTwo,
    "sglang": SglangCacheAware,
    "llm-d": LlmD,
    "llm-d-precise": partial(LlmD, precise=True),
    "dynamo": Dynamo,
    "dynamo-approx": partial(Dynamo, approximate=True),
}


def make(name: str, seed: int = 0) -> RouterBase:
    """A fresh baseline router by name; raises on an unknown name, listing the known ones."""
    try:
        factory = BASELINES[name]
    except KeyError:
        raise ValueError(f"unknown baseline router {name!r}: {', '.join(sorted(BASELINES))}") from None
    return factory(seed=seed)


__all__ = ["BASELINES", "Dynamo", "LeastRequest", "LlmD", "PowerOfTwo", "RoundRobin", "SglangCacheAware", "make"]
