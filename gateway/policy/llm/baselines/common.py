"""Helpers more than one baseline router uses: min-max normalisation and an index of the blocks a
router takes each replica to hold from its own routing history.

:class:`BlockIndex` is the *approximate* index of llm-d's prefix-cache scorer (an LRU of block
hashes per server, with a query for every server holding one hash) and of Dynamo's
``--no-kv-events`` mode (blocks routed to a worker expire after a TTL, and the whole index is
pruned to a share of its cap, oldest first). The precise index, built from engine KV events, is
:class:`gateway.policy.llm.prefix.PrefixIndex`; it keeps neither a TTL nor a per-hash holder
query, which these two originals need.

Sans-IO: times are passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

_NOBODY: frozenset[str] = frozenset()


def min_max(scores: Mapping[str, float], *, lower_is_better: bool = False) -> dict[str, float]:
    """Scores scaled to [0, 1] by the spread of ``scores``: ``(s - min) / (max - min)``, or
    ``(max - s) / (max - min)`` when lower is better; every key scores 1.0 when all are equal
    (the Gateway API Inference Extension's queue scorer and llm-d's ``indexedScoresToNormalized``
    both give the neutral 1.0 there)."""
    if not scores:
        return {}
    lo, hi = min(scores.values()), max(scores.values())
    if hi == lo:
        return dict.fromkeys(scores, 1.0)
    span = hi - lo
    if lower_is_better:
        return {k: (hi - v) / span for k, v in scores.items()}
    return {k: (v - lo) / span for k, v in scores.items()}


class BlockIndex:
    """Per replica, the block hashes it is taken to hold, least recently routed first.

    - ``capacity``: at most this many blocks per replica; adding past it evicts that replica's
      least recently routed block (llm-d's ``lruCapacityPerServer``);
    - ``ttl``: a block not routed again within ``ttl`` seconds is forgotten (Dynamo's
      ``router_ttl_secs``); :meth:`expire` applies it;
    - ``max_total``: when the whole index holds more blocks, the oldest are dropped, across
      replicas, until it holds ``prune_to`` of it (Dynamo's ``router_max_tree_size`` and
      ``router_prune_target_ratio``).
    """

    def __init__(self, capacity: int | None = None, ttl: float | None = None,
                 max_total: int | None = None, prune_to: float = 0.8) -> None:
        for name, v in (("capacity", capacity), ("max_total", max_total)):
            if v is not None and v < 1:
                raise ValueError(f"{name} must be at least 1 block, got {v}")
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl must be positive seconds, got {ttl}")
        if not 0.0 < prune_to <= 1.0:
            raise ValueError(f"prune_to must be in (0, 1], got {prune_to}")
        self.capacity, self.ttl, self.max_total, self.prune_to = capacity, ttl, max_total, prune_to
        self.held: dict[str, OrderedDict[int, float]] = {}  # replica -> hash -> last routed at
        self.where: dict[int, set[str]] = {}  # hash -> replicas holding it
        self.total = 0

    def add(self, replica: str, hashes: Iterable[int], now: float) -> None:
        """``hashes`` were routed to ``replica`` at ``now``: held there, most recently used, in
        order (so a prompt's last block is its most recent)."""
        held = self.held.setdefault(replica, OrderedDict())
        for h in hashes:
            if h in held:
                held.move_to_end(h)
            else:
                self.where.setdefault(h, set()).add(replica)
                self.total += 1
            held[h] = now
            if self.capacity is not None and len(held) > self.capacity:
                self._pop_oldest(replica)
        if self.max_total is not None and self.total > self.max_total:
            self._prune(int(self.max_total * self.prune_to))

    def expire(self, now: float) -> None:
        """Forget every block last routed ``ttl`` or more seconds before ``now``."""
        if self.ttl is None:
            return
        for replica, held in self.held.items():
            while held and next(iter(held.values())) + self.ttl <= now:
                self._pop_oldest(replica)

    def holders(self, h: int) -> frozenset[str] | set[str]:
        return self.where.get(h, _NOBODY)

    def match(self, replica: str, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` held at ``replica``."""
        held = self.held.get(replica)
        if not held:
            return 0
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n

    def size(self, replica: str) -> int:
        held = self.held.get(replica)
        return len(held) if held else 0

    def drop(self, replica: str) -> None:
        for h in self.held.pop(replica, {}):
            self._unhold(h, replica)
            self.total -= 1

    def _pop_oldest(self, replica: str) -> None:
        h, _ = self.held[replica].popitem(last=False)
        self._unhold(h, replica)
        self.total -= 1

    def _unhold(self, h: int, replica: str) -> None:
        reps = self.where.get(h)
        if reps is not None:
            reps.discard(replica)
            if not reps:
                del self.where[h]

    def _prune(self, target: int) -> None:
        while self.total > target:
            oldest = min((next(iter(held.values())), r) for r, held in self.held.items() if held)
            self._pop_oldest(oldest[1])
