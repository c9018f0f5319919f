"""Power of two choices, as Ray Serve's default request router does it.

Follows ray-project/ray, ``python/ray/serve/_private/request_router/pow_2_router.py``
(``PowerOfTwoChoicesRequestRouter.choose_replicas``) and ``request_router.py``
(``_select_from_candidate_replicas``, ``_choose_replicas_with_backoff``), as of commit 04287e4b:
- two distinct replicas are drawn uniformly (``i = randrange(n)``, ``j = randrange(n - 1)``,
  shifted past ``i``); with exactly two replicas both are taken, in a random order
  (``getrandbits(1)``); with one, that one;
- of the two, those whose queue is below ``max_ongoing_requests`` accept; the one with the
  shorter queue wins, the first drawn on a tie (the comparison is strict);
- when neither accepts, Ray draws again (with back-off), forever.

A replica's queue length is its number of ongoing requests, which Ray reads from the replica or
from its cache of what it sent (incremented on send, decremented when the request finishes):
here ``outstanding``. ``max_ongoing_requests`` defaults to Ray Serve LLM's value for LLM
deployments, ``DEFAULT_MAX_ONGOING_REQUESTS`` = 1e9 (``ray.llm._internal.serve`` constants;
plain Ray Serve deployments default to 5). Locality (same node, same zone), multiplexed models and
session affinity do not apply. Ray waits at the router when every replica is full; a baseline
never holds a request, so then the shorter of one draw takes it.
"""

from __future__ import annotations

import random

from gateway.policy.llm.types import ReplicaView, RouterBase, TokenRequest

RAY_SERVE_LLM_MAX_ONGOING_REQUESTS = int(1e9)


class PowerOfTwo(RouterBase):
    name = "pow2"

    def __init__(self, seed: int = 0, max_ongoing_requests: int = RAY_SERVE_LLM_MAX_ONGOING_REQUESTS) -> None:
        super().__init__()
        if max_ongoing_requests < 1:
            raise ValueError(f"max_ongoing_requests must be at least 1, got {max_ongoing_requests}")
        self.max_ongoing = max_ongoing_requests
        self.rng = random.Random(seed)

    def draw(self, candidates: list[ReplicaView]) -> list[ReplicaView]:
        """One round of ``choose_replicas``: the (at most) two replicas probed, in order."""
        n = len(candidates)
        if n == 1:
            return [candidates[0]]
        if n == 2:
            a, b = candidates
            return [a, b] if self.rng.getrandbits(1) else [b, a]
        i = self.rng.randrange(n)
        j = self.rng.randrange(n - 1)
        if j >= i:
            j += 1
        return [candidates[i], candidates[j]]

    def choose(self, request: TokenRequest, candidates: list[ReplicaView], now: float) -> ReplicaView:
        if all(v.outstanding >= self.max_ongoing for v in candidates):
            return min(self.draw(candidates), key=lambda v: v.outstanding)
        while True:
            best: ReplicaView | None = None
            for v in self.draw(candidates):
                if v.outstanding < self.max_ongoing and (best is None or v.outstanding < best.outstanding):
                    best = v
            if best is not None:
                return best
