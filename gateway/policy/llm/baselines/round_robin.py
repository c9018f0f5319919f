"""Round-robin, as the vLLM production-stack router's ``roundrobin`` routing logic does it.

Follows vllm-project/production-stack, ``src/vllm_router/routers/routing_logic.py``
(``RoundRobinRouter``, as of commit 008a23bd): the endpoints it is handed are sorted by URL, and
request number ``k`` goes to ``sorted[k % len(sorted)]``; the counter counts every request and is
never reset, so when the set of endpoints changes the cycle shifts rather than restarts (the
source notes it is then not "perfectly" round-robin). There are no parameters.

Here the endpoints are the replicas that can take a request, sorted by replica id.
"""

from __future__ import annotations

from gateway.policy.llm.types import ReplicaView, RouterBase, TokenRequest


class RoundRobin(RouterBase):
    name = "round-robin"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.req_id = 0  # requests routed so far (seed unused: the original is not random)

    def choose(self, request: TokenRequest, candidates: list[ReplicaView], now: float) -> ReplicaView:
        ordered = sorted(candidates, key=lambda v: v.id)
        chosen = ordered[self.req_id % len(ordered)]
        self.req_id += 1
        return chosen
