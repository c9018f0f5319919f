"""The SGLang router's ``cache_aware`` policy (sgl-router, now sgl-model-gateway).

Follows sgl-project/sglang, ``sgl-router/src/policies/cache_aware.rs`` (``CacheAwarePolicy::
select_worker``, commit 026f853b) and ``sgl-router/src/policies/tree.rs`` (the multi-tenant
approximate radix tree, commit 4d40eec0), with the defaults of the launcher's ``RouterArgs`` (``sgl-model-gateway/bindings/python/src/
sglang_router/router_args.py``, commit 05e589ad): ``cache_threshold`` = 0.3, ``balance_abs_threshold`` = 64,
``balance_rel_threshold`` = 1.5, ``eviction_interval_secs`` = 60 (the older ``sgl-router`` launcher
used 120), ``max_tree_size`` = 2**26. (The Rust ``CacheAwareConfig::default`` holds other values,
0.5 / 32 / 1.1 / 30 / 10000, used only when the policy is built without the launcher.)

For each request:
1. the load of a worker is its count of requests the router sent it that have not finished
   (``Worker::load``: incremented when the cache-aware router dispatches, decremented when the
   response ends); here ``outstanding``;
2. the loads are *imbalanced* when ``max - min > balance_abs_threshold`` and
   ``max > min * balance_rel_threshold``: then the least-loaded worker takes the request (the first
   in worker order on a tie: Rust's ``min_by_key``);
3. otherwise the tree is searched for the longest prefix of the prompt any worker was sent; if the
   match rate (matched / prompt length) exceeds ``cache_threshold`` the worker holding that prefix
   takes it, else the worker whose tree is smallest (the most cache room);
4. either way the prompt is inserted under the chosen worker, and every ``eviction_interval_secs``
   each worker's tree is cut to ``max_tree_size`` by evicting its least recently used leaves.

Differences forced by the setting, and nothing else:
- The unit is prompt tokens in 16-token KV blocks, via the request's block hashes, not text
  characters: a node is a block (its hash names the whole prefix up to it), a tree's size is
  ``block_size`` tokens per block, and the match rate is ``matched blocks * block_size /
  prompt_len``. A prompt's last partial block is not in the tree. ``max_tree_size`` counts tokens.
- Ties the original leaves to DashMap iteration order (the tenant named by the deepest matched
  node, the smallest tree) are broken by a seeded random draw.
- Loads, matches and tree sizes are taken over the replicas that can take the request (the list of
  healthy workers the original routes among); a removed replica's tree is dropped
  (``remove_tenant``).
- The eviction thread's clock is ``now``: the first pass runs ``eviction_interval_secs`` after the
  first request, then every interval.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.policy.llm.types import ReplicaView, RouterBase, TokenRequest

Stamp = tuple[float, int]  # (now, sequence): access order within one instant


@dataclass(slots=True)
class _Node:
    """One worker's hold on one block of the tree."""

    parent: int | None  # the block before it; None: the root
    last: Stamp
    children: int = 0  # this worker's blocks that follow it


@dataclass(slots=True)
class _Tenant:
    """One worker's part of the multi-tenant tree (its nodes are path-closed: holding a block
    means holding every block before it, since inserts add whole paths and eviction takes leaves)."""

    block_size: int
    nodes: dict[int, _Node] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Tokens held (the original's ``tenant_char_count``)."""
        return len(self.nodes) * self.block_size

    def match(self, hashes: Sequence[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self.nodes:
                break
            n += 1
        return n

    def touch(self, hashes: Sequence[int], stamp: Stamp) -> None:
        for h in hashes:
            self.nodes[h].last = stamp

    def insert(self, hashes: Sequence[int], stamp: Stamp) -> None:
        parent: int | None = None
        for h in hashes:
            node = self.nodes.get(h)
            if node is None:
                self.nodes[h] = _Node(parent, stamp)
                if parent is not None:
                    self.nodes[parent].children += 1
            else:
                node.last = stamp
            parent = h

    def evict(self, max_size: int) -> None:
        """Least recently used leaves first, until at most ``max_size`` tokens are held; a parent
        whose last child goes becomes a leaf in turn (``evict_tenant_by_size``)."""
        if self.size <= max_size:
            return
        heap = [(n.last, h) for h, n in self.nodes.items() if n.children == 0]
        heapq.heapify(heap)
        while heap and self.size > max_size:
            _, h = heapq.heappop(heap)
            node = self.nodes.pop(h)
            if node.parent is not None:
                parent = self.nodes[node.parent]
                parent.children -= 1
                if parent.children == 0:
                    heapq.heappush(heap, (parent.last, node.parent))


class SglangCacheAware(RouterBase):
    name = "sglang"

    def __init__(self, seed: int = 0, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5, eviction_interval_secs: float = 60.0,
                 max_tree_size: int = 2 ** 26) -> None:
        super().__init__()
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        if balance_abs_threshold < 0 or balance_rel_threshold < 0:
            raise ValueError(f"balance thresholds must be non-negative, got {balance_abs_threshold} and "
                             f"{balance_rel_threshold}")
        if eviction_interval_secs < 0 or max_tree_size < 0:
            raise ValueError(f"eviction_interval_secs ({eviction_interval_secs}) and max_tree_size "
                             f"({max_tree_size}) must be non-negative")
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval = eviction_interval_secs  # 0: no eviction, as in the original
        self.max_tree_size = max_tree_size
        self.rng = random.Random(seed)
        self.trees: dict[str, _Tenant] = {}
        self.next_eviction: float | None = None
        self._seq = itertools.count()

    # ---- the fleet
    def remove_replica(self, replica_id: str) -> None:
        super().remove_replica(replica_id)
        self.trees.pop(replica_id, None)

    def tree(self, view: ReplicaView) -> _Tenant:
        t = self.trees.get(view.id)
        if t is None:
            t = self.trees[view.id] = _Tenant(view.spec.block_size)
        return t

    def _stamp(self, now: float) -> Stamp:
        return (now, next(self._seq))

    # ---- routing
    def imbalanced(self, candidates: list[ReplicaView]) -> bool:
        loads = [v.outstanding for v in candidates]
        hi, lo = max(loads), min(loads)
        return hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold

    def choose(self, request: TokenRequest, candidates: list[ReplicaView], now: float) -> ReplicaView:
        self._evict_due(now)
        if self.imbalanced(candidates):
            return min(candidates, key=lambda v: v.outstanding)
        hashes = request.hashes
        matches = [(self.tree(v).match(hashes), v) for v in candidates]
        best = max(m for m, _ in matches)
        rate = 0.0
        if best > 0 and request.prompt_len > 0:
            holder = self.rng.choice([v for m, v in matches if m == best])
            self.tree(holder).touch(hashes[:best], self._stamp(now))
            rate = best * holder.spec.block_size / request.prompt_len
            if rate > self.cache_threshold:
                return holder
        smallest = min(self.tree(v).size for v in candidates)
        return self.rng.choice([v for v in candidates if self.tree(v).size == smallest])

    def on_routed(self, request: TokenRequest, view: ReplicaView, now: float) -> None:
        self.tree(view).insert(request.hashes, self._stamp(now))

    def _evict_due(self, now: float) -> None:
        if self.eviction_interval <= 0:
            return
        if self.next_eviction is None:
            self.next_eviction = now + self.eviction_interval
            return
        if now < self.next_eviction:
            return
        for t in self.trees.values():
            t.evict(self.max_tree_size)
        while self.next_eviction <= now:
            self.next_eviction += self.eviction_interval
