"""Which replica's prefix cache holds how much of a prompt: one index over a fleet's replicas.

A prompt is named by the chained hashes of its full KV blocks (:func:`profiles.llm.kv.block_hashes`),
so a replica holding a block named ``h`` holds the whole prefix up to it. Two ways to fill it:
- **approximate**, from the routing history (:meth:`PrefixIndex.add`): a prompt routed to a
  replica is taken to be cached there, as the SGLang router's radix tree and llm-d's approximate
  prefix scorer take it;
- **precise**, from the engine's published KV events (:meth:`PrefixIndex.apply`): ``BlockStored``
  adds, ``BlockRemoved`` removes, as llm-d's precise prefix scorer and Dynamo's KV router index them.

Memory is bounded per replica by ``capacity`` blocks (the engine's KV blocks), and eviction mirrors
the engine's: least recently used first (an engine evicts its least recently freed cached block; a
prompt routed again refreshes its blocks). Lookups walk the prompt's hashes once for all replicas
(a bitmask of holders per hash), so a match costs the matched length, not replicas x length.

Sans-IO: plain data.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from profiles.llm.kv import BlockRemoved, BlockStored, KvEvent


class PrefixIndex:
    """Cached prefixes of every replica. ``capacity_blocks``: the default bound per replica;
    :meth:`set_capacity` sets one replica's."""

    def __init__(self, capacity_blocks: int = 1 << 20) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be at least 1, got {capacity_blocks}")
        self.default_capacity = capacity_blocks
        self.holders: dict[int, int] = {}  # block hash -> bitmask of replica slots holding it
        self.slot: dict[str, int] = {}  # replica -> slot
        self.names: dict[int, str] = {}  # slot -> replica
        self.lru: dict[str, OrderedDict[int, None]] = {}  # per replica, least recently used first
        self.capacity: dict[str, int] = {}

    # ---- replicas
    def _slot(self, replica: str) -> int:
        s = self.slot.get(replica)
        if s is None:
            s = next(i for i in range(len(self.slot) + 1) if i not in self.names)
            self.slot[replica], self.names[s] = s, replica
            self.lru[replica] = OrderedDict()
            self.capacity.setdefault(replica, self.default_capacity)
        return s

    def set_capacity(self, replica: str, blocks: int) -> None:
        if blocks < 1:
            raise ValueError(f"capacity must be at least 1 block, got {blocks}")
        self._slot(replica)
        self.capacity[replica] = blocks
        self._evict(replica)

    def drop(self, replica: str) -> None:
        """Forget a replica and everything it held."""
        s = self.slot.pop(replica, None)
        if s is None:
            return
        del self.names[s]
        bit = 1 << s
        for h in self.lru.pop(replica):
            self._unhold(h, bit)
        self.capacity.pop(replica, None)

    def blocks(self, replica: str) -> int:
        lru = self.lru.get(replica)
        return len(lru) if lru is not None else 0

    # ---- filling
    def add(self, replica: str, hashes: Sequence[int]) -> None:
        """Approximate: ``hashes`` (a routed prompt's blocks) are now cached at ``replica``, most
        recently used."""
        bit = 1 << self._slot(replica)
        lru = self.lru[replica]
        holders = self.holders
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                holders[h] = holders.get(h, 0) | bit
        self._evict(replica)

    def apply(self, replica: str, events: Sequence[KvEvent]) -> None:
        """Precise: the engine's KV events, in order."""
        bit = 1 << self._slot(replica)
        lru = self.lru[replica]
        for ev in events:
            if isinstance(ev, BlockStored):
                for h in ev.hashes:
                    if h in lru:
                        lru.move_to_end(h)
                    else:
                        lru[h] = None
                        self.holders[h] = self.holders.get(h, 0) | bit
            elif isinstance(ev, BlockRemoved):
                for h in ev.hashes:
                    if lru.pop(h, 0) is None:
                        self._unhold(h, bit)
        self._evict(replica)

    def touch(self, replica: str, hashes: Sequence[int]) -> None:
        """Precise: a prompt routed to ``replica`` uses the blocks of it the index holds there (an
        engine's cache hit takes them out of its eviction queue); the rest are left to the events."""
        lru = self.lru.get(replica)
        if lru is None:
            return
        for h in hashes:
            if h not in lru:
                break
            lru.move_to_end(h)

    def _evict(self, replica: str) -> None:
        lru, cap = self.lru[replica], self.capacity[replica]
        if len(lru) <= cap:
            return
        bit = 1 << self.slot[replica]
        while len(lru) > cap:
            h, _ = lru.popitem(last=False)
            self._unhold(h, bit)

    def _unhold(self, h: int, bit: int) -> None:
        m = self.holders.get(h, 0) & ~bit
        if m:
            self.holders[h] = m
        else:
            self.holders.pop(h, None)

    # ---- reading
    def match(self, replica: str, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` cached at ``replica``."""
        s = self.slot.get(replica)
        if s is None:
            return 0
        bit, n = 1 << s, 0
        for h in hashes:
            if not self.holders.get(h, 0) & bit:
                break
            n += 1
        return n

    def match_all(self, hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of ``hashes`` cached at each replica holding at least the first one."""
        out: dict[str, int] = {}
        alive = -1
        n = 0
        for h in hashes:
            m = self.holders.get(h, 0) & alive
            gone = alive & ~m if alive != -1 else 0
            if n and gone:
                self._record(out, gone, n)
            alive = m
            if not alive:
                return out
            n += 1
        if n:
            self._record(out, alive, n)
        return out

    def _record(self, out: dict[str, int], mask: int, n: int) -> None:
        while mask:
            low = mask & -mask
            name = self.names.get(low.bit_length() - 1)
            if name is not None:
                out[name] = n
            mask ^= low
