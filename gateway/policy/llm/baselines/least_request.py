"""Least outstanding requests, as Envoy's ``LEAST_REQUEST`` load balancer picks among equally
weighted hosts.

Follows envoyproxy/envoy, ``source/extensions/load_balancing_policies/least_request/
least_request_lb.cc`` (``unweightedHostPickFullScan`` / ``unweightedHostPickNChoices``, v1.35):
- ``FULL_SCAN`` (the default here): every host is compared on its active requests; the fewest
  wins, and hosts tied for the fewest are reservoir-sampled as the scan meets them (the k-th tie
  replaces the candidate when ``random() % k == 0``), so each tied host is equally likely;
- ``N_CHOICES`` (Envoy's own default, ``choice_count`` = 2): ``choice_count`` hosts drawn at random
  with replacement, the first kept unless a later one has strictly fewer. ``choice_count=2`` is
  Envoy's two-choice mode; :mod:`.pow2` is Ray Serve's variant of it.

A host's active requests are the requests this proxy sent it that have not finished: here a
replica's ``outstanding`` (routed, not yet finished). The vLLM production-stack router's
session-less fallback is not this: it picks the endpoint with the lowest recent QPS
(``_qps_routing``), so least-request follows Envoy.
"""

from __future__ import annotations

import random

from gateway.policy.llm.types import ReplicaView, RouterBase, TokenRequest

_RAND_MAX = (1 << 64) - 1  # Envoy's Random::RandomGenerator::random() is a uint64


class LeastRequest(RouterBase):
    name = "least-request"

    def __init__(self, seed: int = 0, choice_count: int | None = None) -> None:
        """``choice_count`` None: full scan; otherwise ``N_CHOICES`` with that many draws."""
        super().__init__()
        if choice_count is not None and choice_count < 1:
            raise ValueError(f"choice_count must be at least 1, got {choice_count}")
        self.choice_count = choice_count
        self.rng = random.Random(seed)

    def _random(self) -> int:
        return self.rng.randint(0, _RAND_MAX)

    def choose(self, request: TokenRequest, candidates: list[ReplicaView], now: float) -> ReplicaView:
        if self.choice_count is None:
            return self._full_scan(candidates)
        return self._n_choices(candidates, self.choice_count)

    def _full_scan(self, hosts: list[ReplicaView]) -> ReplicaView:
        best, tied = hosts[0], 1
        for host in hosts[1:]:
            if host.outstanding < best.outstanding:
                best, tied = host, 1
            elif host.outstanding == best.outstanding:
                tied += 1
                if self._random() % tied == 0:
                    best = host
        return best

    def _n_choices(self, hosts: list[ReplicaView], n: int) -> ReplicaView:
        best = hosts[self._random() % len(hosts)]
        for _ in range(n - 1):
            host = hosts[self._random() % len(hosts)]
            if host.outstanding < best.outstanding:
                best = host
        return best
