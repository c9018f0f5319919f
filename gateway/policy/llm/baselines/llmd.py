"""llm-d's inference scheduler with its default scorers: the Gateway API Inference Extension's
endpoint picker (EPP) as llm-d's "well-lit path" configures it.

Follows:
- llm-d/llm-d, ``guides/inference-scheduling/scheduler/inference-scheduling.values.yaml`` (image
  ``llm-d-inference-scheduler`` v0.5.0 over GIE v1.3.0): one scheduling profile of
  ``prefix-cache-scorer`` weight 3, ``queue-scorer`` weight 2, ``kv-cache-utilization-scorer``
  weight 2, and the ``max-score-picker``; ``guides/precise-prefix-cache-aware/gaie-kv-events/
  values.yaml``: the same weights with ``precise-prefix-cache-scorer`` (3) in place of the
  approximate one;
- kubernetes-sigs/gateway-api-inference-extension, ``pkg/epp/scheduling/framework/plugins/``:
  ``multi/prefix/plugin.go`` and ``indexer.go`` (the approximate prefix scorer, commits 00913f92
  and 01925288), ``scorer/queue.go``, ``scorer/kvcache_utilization.go`` and
  ``picker/max_score_picker.go`` (commit 02308be3);
- llm-d/llm-d-inference-scheduler, ``pkg/plugins/scorer/precise_prefix_cache.go`` and
  ``utils.go`` (``indexedScoresToNormalizedScoredPods``), with llm-d-kv-cache-manager's
  ``LongestPrefixScorer``.

A replica's score is the weighted sum of its scorers' scores (each in [0, 1]); the picker shuffles
the replicas and takes the highest (a uniformly random one among equals).

- **prefix-cache-scorer** (approximate): the prompt is cut into blocks, ``hashBlockSize`` = 64
  characters, at most ``maxPrefixBlocksToMatch`` = 256 of them, each hash chained to the one
  before; a first hash names the model. After routing, the chosen server's LRU (capacity
  ``lruCapacityPerServer`` = 31250 entries) takes all of them. Matching walks the hashes in order
  until no server holds one, counting for each server the hashes it holds; the score is that count
  over the number of hashes (model hash included); a prompt shorter than one block scores 0
  everywhere. The plugin's own comment derives 64 characters from vLLM's 16-token block at 4
  characters a token, so here one block is one of the request's 16-token block hashes: 256 blocks
  (4096 tokens) and 31250 blocks per server, as in the original; the model hash is one fixed key.
- **precise-prefix-cache-scorer** (``precise=True``): the index is built from the engines' KV
  events (:class:`~gateway.policy.llm.prefix.PrefixIndex`); a server's raw score is the number of
  consecutive leading blocks of the prompt it holds (servers holding none are absent), min-max
  normalised over the servers present (1.0 when all present are equal), absent servers 0.
- **queue-scorer**: the waiting queue from the engine's metrics (``vllm:num_requests_waiting``),
  ``(max - q) / (max - min)`` over the candidates, 1.0 when all are equal.
- **kv-cache-utilization-scorer**: ``1 - kv_usage`` from the engine's metrics.

The metrics are those of the driver's last scrape (``on_load``), as the EPP reads its own scrapes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from gateway.policy.llm.baselines.common import BlockIndex, min_max
from gateway.policy.llm.prefix import PrefixIndex
from gateway.policy.llm.types import ReplicaSpec, ReplicaView, RouterBase, TokenRequest
from profiles.llm.kv import ROOT_HASH, KvEvent

MAX_PREFIX_BLOCKS = 256
LRU_CAPACITY_PER_SERVER = 31250
MODEL_HASH = ROOT_HASH  # the first hash of every prompt: one model per router


class LlmD(RouterBase):
    name = "llm-d"
    # the endpoint picker refreshes every pod's metrics this often (EPP's --refresh-metrics-interval)
    metrics_interval_s = 0.05

    def __init__(self, seed: int = 0, precise: bool = False, prefix_weight: float = 3.0,
                 queue_weight: float = 2.0, kv_weight: float = 2.0,
                 max_prefix_blocks: int = MAX_PREFIX_BLOCKS,
                 lru_capacity_per_server: int = LRU_CAPACITY_PER_SERVER) -> None:
        super().__init__()
        if min(prefix_weight, queue_weight, kv_weight) < 0:
            raise ValueError(f"weights must be non-negative, got prefix {prefix_weight}, queue {queue_weight}, "
                             f"kv {kv_weight}")
        if max_prefix_blocks < 1:
            raise ValueError(f"max_prefix_blocks must be at least 1, got {max_prefix_blocks}")
        self.precise = precise
        if precise:
            self.name = "llm-d-precise"
        self.weights = (prefix_weight, queue_weight, kv_weight)
        self.max_prefix_blocks = max_prefix_blocks
        self.rng = random.Random(seed)
        self.approx = BlockIndex(capacity=lru_capacity_per_server)
        self.kv = PrefixIndex()

    # ---- the fleet
    def add_replica(self, spec: ReplicaSpec) -> None:
        super().add_replica(spec)
        if self.precise and spec.num_blocks > 0:
            self.kv.set_capacity(spec.id, spec.num_blocks)

    def remove_replica(self, replica_id: str) -> None:
        super().remove_replica(replica_id)
        self.approx.drop(replica_id)
        self.kv.drop(replica_id)

    def on_kv_events(self, replica_id: str, events: Sequence[KvEvent], now: float) -> None:
        if self.precise and replica_id in self.replicas:
            self.kv.apply(replica_id, events)

    # ---- scorers
    def prompt_hashes(self, request: TokenRequest) -> list[int]:
        """The approximate scorer's hashes: none for a prompt under one block, else the model hash
        then at most ``max_prefix_blocks`` blocks."""
        if not request.hashes:
            return []
        return [MODEL_HASH, *request.hashes[:self.max_prefix_blocks]]

    def approx_scores(self, request: TokenRequest, candidates: list[ReplicaView]) -> dict[str, float]:
        hashes = self.prompt_hashes(request)
        if not hashes:
            return dict.fromkeys((v.id for v in candidates), 0.0)
        held: dict[str, int] = {}
        for h in hashes:
            servers = self.approx.holders(h)
            if not servers:
                break
            for s in servers:
                held[s] = held.get(s, 0) + 1
        return {v.id: held.get(v.id, 0) / len(hashes) for v in candidates}

    def precise_scores(self, request: TokenRequest, candidates: list[ReplicaView]) -> dict[str, float]:
        present = {r: float(n) for r, n in self.kv.match_all(request.hashes).items() if r in self.replicas}
        norm = min_max(present)
        return {v.id: norm.get(v.id, 0.0) for v in candidates}

    def scores(self, request: TokenRequest, candidates: list[ReplicaView]) -> dict[str, float]:
        """Each candidate's weighted score."""
        prefix = self.precise_scores(request, candidates) if self.precise else self.approx_scores(request, candidates)
        queue = min_max({v.id: v.load.waiting for v in candidates}, lower_is_better=True)
        wp, wq, wk = self.weights
        return {v.id: wp * prefix[v.id] + wq * queue[v.id] + wk * (1.0 - v.load.kv_usage) for v in candidates}

    # ---- routing
    def choose(self, request: TokenRequest, candidates: list[ReplicaView], now: float) -> ReplicaView:
        scored = self.scores(request, candidates)
        best = max(scored.values())
        return self.rng.choice([v for v in candidates if scored[v.id] == best])

    def on_routed(self, request: TokenRequest, view: ReplicaView, now: float) -> None:
        if not self.precise:
            self.approx.add(view.id, self.prompt_hashes(request), now)
