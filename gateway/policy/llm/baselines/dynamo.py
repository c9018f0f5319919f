"""NVIDIA Dynamo's KV router: per worker, a cost of the prefill it would do and the KV blocks it
would hold, lowest wins.

Follows ai-dynamo/dynamo, ``lib/llm/src/kv_router/``: ``scheduler.rs`` (``DefaultWorkerSelector::
select_worker`` and ``softmax_sample``), the active-sequence tracker (``ActiveSequences``:
``potential_blocks_and_tokens``, ``new_tokens``, ``new_blocks``, ``mark_prefill_completed``) and
the KV router config defaults (``KvRouterConfig::default``): ``overlap_score_weight`` = 1.0,
``router_temperature`` = 0.0, ``use_kv_events`` = true, ``router_track_active_blocks`` = true,
``router_assume_kv_reuse`` = true, and, without KV events, ``router_ttl_secs`` = 120,
``router_max_tree_size`` = 2**20, ``router_prune_target_ratio`` = 0.8. The documented CLI flags
are ``--kv-overlap-score-weight`` (default 1), ``--router-temperature`` (default 0) and
``--no-kv-events`` (docs.nvidia.com/dynamo, "KV Cache Routing", v0.8.1).

For each worker:
- ``overlap``: the leading blocks of the prompt its KV index holds. By default the index is built
  from the engines' KV events (:class:`~gateway.policy.llm.prefix.PrefixIndex`); with
  ``approximate=True`` (Dynamo's ``--no-kv-events``) from the router's own decisions: the blocks
  of a prompt routed to a worker are taken to be cached there for ``router_ttl_secs`` (refreshed
  when routed again), the whole index pruned to ``router_prune_target_ratio`` of
  ``router_max_tree_size``, oldest first, when it grows past it;
- ``prefill blocks`` = (prompt tokens - overlap * block size + the uncached prompt tokens of the
  requests routed there that have not yet produced a first token) / block size;
- ``decode blocks`` = the distinct blocks of the requests routed there and not finished (shared
  blocks once) + this prompt's blocks not among them;
- ``logit = overlap_score_weight * prefill blocks + decode blocks``.

At temperature 0 the lowest logit wins (logits within 1e-5 of it tie; a tie goes to the worker whose
KV index holds fewer blocks, then to a seeded draw where the original takes HashMap order). Above 0 a worker
is drawn with probability softmax(-logit / (max - min) / temperature).

A request's blocks are the hashes of its prompt's full blocks; generated tokens are not counted
(``router_track_output_blocks`` is off by default). Dynamo's router queue (hold requests when every
worker is busy) is not reproduced: baselines never hold.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.policy.llm.baselines.common import BlockIndex
from gateway.policy.llm.prefix import PrefixIndex
from gateway.policy.llm.types import ReplicaSpec, ReplicaView, RouterBase, TokenRequest
from profiles.llm.kv import KvEvent

EPSILON = 1e-5  # scheduler.rs: logits this close to the lowest tie


@dataclass(slots=True)
class ActiveSequences:
    """What one worker has in flight, as the router tracks it."""

    seqs: dict[str, tuple[int, ...]] = field(default_factory=dict)  # request -> its blocks
    unique: dict[int, int] = field(default_factory=dict)  # block -> requests holding it
    prefill: dict[str, int] = field(default_factory=dict)  # request -> prompt tokens still to prefill
    active_tokens: int = 0

    @property
    def active_blocks(self) -> int:
        return len(self.unique)

    def new_blocks(self, blocks: Sequence[int]) -> int:
        return sum(1 for b in blocks if b not in self.unique)

    def add(self, request_id: str, blocks: Sequence[int], prefill_tokens: int) -> None:
        self.seqs[request_id] = tuple(blocks)
        for b in blocks:
            self.unique[b] = self.unique.get(b, 0) + 1
        self.prefill[request_id] = prefill_tokens
        self.active_tokens += prefill_tokens

    def prefill_done(self, request_id: str) -> None:
        self.active_tokens -= self.prefill.pop(request_id, 0)

    def free(self, request_id: str) -> None:
        self.prefill_done(request_id)
        for b in self.seqs.pop(request_id, ()):
            left = self.unique[b] - 1
            if left:
                self.unique[b] = left
            else:
                del self.unique[b]


class Dynamo(RouterBase):
    name = "dynamo"

    def __init__(self, seed: int = 0, overlap_score_weight: float = 1.0, router_temperature: float = 0.0,
                 approximate: bool = False, router_ttl_secs: float = 120.0,
                 router_max_tree_size: int = 2 ** 20, router_prune_target_ratio: float = 0.8) -> None:
        super().__init__()
        if overlap_score_weight < 0 or router_temperature < 0:
            raise ValueError(f"overlap_score_weight ({overlap_score_weight}) and router_temperature "
                             f"({router_temperature}) must be non-negative")
        self.overlap_weight = overlap_score_weight
        self.temperature = router_temperature
        self.approximate = approximate
        if approximate:
            self.name = "dynamo-approx"
        self.rng = random.Random(seed)
        self.kv = PrefixIndex()
        self.approx = BlockIndex(ttl=router_ttl_secs, max_total=router_max_tree_size,
                                 prune_to=router_prune_target_ratio)
        self.active: dict[str, ActiveSequences] = {}

    # ---- the fleet
    def add_replica(self, spec: ReplicaSpec) -> None:
        super().add_replica(spec)
        self.active[spec.id] = ActiveSequences()
        if not self.approximate and spec.num_blocks > 0:
            self.kv.set_capacity(spec.id, spec.num_blocks)

    def remove_replica(self, replica_id: str) -> None:
        super().remove_replica(replica_id)
        self.active.pop(replica_id, None)
        self.kv.drop(replica_id)
        self.approx.drop(replica_id)

    def on_kv_events(self, replica_id: str, events: Sequence[KvEvent], now: float) -> None:
        if not self.approximate and replica_id in self.replicas:
            self.kv.apply(replica_id, events)

    # ---- the cost
    def overlap(self, replica_id: str, hashes: Sequence[int]) -> int:
        if self.approximate:
            return self.approx.match(replica_id, hashes)
        return self.kv.match(replica_id, hashes)

    def tree_size(self, replica_id: str) -> int:
        return self.approx.size(replica_id) if self.approximate else self.kv.blocks(replica_id)

    def new_tokens(self, request: TokenRequest, view: ReplicaView, overlap: int) -> int:
        return max(request.prompt_len - overlap * view.spec.block_size, 0)

    def logits(self, request: TokenRequest, candidates: list[ReplicaView], now: float) -> dict[str, float]:
        """Each candidate's cost (lower is better)."""
        if self.approximate:
            self.approx.expire(now)
            overlaps = {v.id: self.approx.match(v.id, request.hashes) for v in candidates}
        else:
            held = self.kv.match_all(request.hashes)
            overlaps = {v.id: held.get(v.id, 0) for v in candidates}
        out = {}
        for v in candidates:
            seq = self.active[v.id]
            prefill_blocks = (self.new_tokens(request, v, overlaps[v.id]) + seq.active_tokens) / v.spec.block_size
            decode_blocks = seq.new_blocks(request.hashes) + seq.active_blocks
            out[v.id] = self.overlap_weight * prefill_blocks + decode_blocks
        return out

    # ---- routing
    def choose(self, request: TokenRequest, candidates: list[ReplicaView], now: float) -> ReplicaView:
        logits = self.logits(request, candidates, now)
        by_id = {v.id: v for v in candidates}
        if self.temperature > 0:
            return by_id[self.softmax_sample(logits)]
        lowest = min(logits.values())
        tied = [r for r, x in logits.items() if abs(x - lowest) < EPSILON]
        if len(tied) > 1:
            smallest = min(self.tree_size(r) for r in tied)
            tied = [r for r in tied if self.tree_size(r) == smallest]
        return by_id[self.rng.choice(tied)]

    def softmax_sample(self, logits: dict[str, float]) -> str:
        keys, values = list(logits), list(logits.values())
        lo, hi = min(values), max(values)
        if lo == hi:
            probs = [1.0 / len(keys)] * len(keys)
        else:
            scaled = [-v / (hi - lo) / self.temperature for v in values]
            top = max(scaled)
            exps = [math.exp(s - top) for s in scaled]
            total = sum(exps)
            probs = [e / total for e in exps]
        sample, cum = self.rng.random(), 0.0
        for k, p in zip(keys, probs, strict=True):
            cum += p
            if sample <= cum:
                return k
        return keys[-1]

    # ---- what the router tracks
    def on_routed(self, request: TokenRequest, view: ReplicaView, now: float) -> None:
        overlap = self.overlap(view.id, request.hashes)
        self.active[view.id].add(request.id, request.hashes, self.new_tokens(request, view, overlap))
        if self.approximate:
            self.approx.add(view.id, request.hashes, now)

    def on_first_token(self, request_id: str, now: float) -> None:
        super().on_first_token(request_id, now)
        rid = self.where.get(request_id)
        if rid is not None:
            self.active[rid].prefill_done(request_id)

    def on_finish(self, request_id: str, now: float) -> None:
        rid = self.where.get(request_id)
        super().on_finish(request_id, now)
        seq = self.active.get(rid) if rid is not None else None
        if seq is not None:
            seq.free(request_id)
