"""The paged KV cache of one engine: fixed-size blocks, reference counts, and the prefix cache.

As vLLM's v1 KV cache manager keeps it:
- a request's KV lives in blocks of ``block_size`` tokens (16);
- a block full of known tokens is named by a hash of its tokens and of the block before it,
  so two prompts that share a prefix share its blocks (the prefix cache);
- a block no request holds stays cached, in a free queue ordered least recently freed first:
  allocation takes from the head, evicting the cached block there, and a cache hit takes a block
  back out of the queue;
- every change to the cache is an event (stored, removed) that the engine publishes, as vLLM's
  KV events do, so a router can index the cache exactly.

Sans-IO: plain data and counters, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

BLOCK_SIZE = 16
ROOT_HASH = 0x9E3779B97F4A7C15  # the parent of every prompt's first block


def block_hashes(tokens: Sequence[int], block_size: int = BLOCK_SIZE, parent: int = ROOT_HASH) -> list[int]:
    """The hashes of the full blocks of ``tokens``, each chained to the one before it (the first
    to ``parent``). Tuples of ints hash the same in every process, so a router computes the
    names the engine publishes."""
    out = []
    for i in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[i:i + block_size])))
        out.append(parent)
    return out


@dataclass(slots=True, frozen=True)
class BlockStored:
    """Blocks now cached, in prompt order: ``hashes[0]`` follows the block named ``parent``."""

    hashes: tuple[int, ...]
    parent: int


@dataclass(slots=True, frozen=True)
class BlockRemoved:
    hashes: tuple[int, ...]


KvEvent = BlockStored | BlockRemoved


class BlockPool:
    """``num_blocks`` blocks of KV. ``caching`` off: a freed block forgets its tokens at once.
    ``publish`` off: no events are kept (for a driver that reads none)."""

    def __init__(self, num_blocks: int, block_size: int = BLOCK_SIZE, caching: bool = True,
                 publish: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"a KV cache needs at least one block (num_blocks {num_blocks})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.publish = publish
        self.refs = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # block hash -> block
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # head: evicted first
        self.events: list[KvEvent] = []

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take: unreferenced ones, cached or not."""
        return len(self.free)

    @property
    def usage(self) -> float:
        """The share of blocks some request holds (vLLM's ``kv_cache_usage_perc``, as a fraction)."""
        return 1.0 - len(self.free) / self.num_blocks

    def lookup(self, hashes: Sequence[int], limit: int) -> list[int]:
        """The cached blocks of the longest prefix of ``hashes``, at most ``limit`` of them; nothing
        is taken until :meth:`take`."""
        blocks: list[int] = []
        if self.caching:
            for h in hashes[:limit]:
                b = self.cached.get(h)
                if b is None:
                    break
                blocks.append(b)
        return blocks

    def take(self, blocks: Sequence[int]) -> None:
        """Hold each of ``blocks`` once more (cache hits leave the free queue)."""
        for b in blocks:
            if self.refs[b] == 0:
                del self.free[b]
            self.refs[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """``n`` fresh blocks, held once, from the head of the free queue (evicting what they
        cached); None, and nothing taken, when fewer than ``n`` are free."""
        if n > len(self.free):
            return None
        out = []
        pop, hash_of, cached, refs, publish = self.free.popitem, self.hash_of, self.cached, self.refs, self.publish
        for _ in range(n):
            b = pop(last=False)[0]
            h = hash_of[b]
            if h is not None:
                del cached[h]
                hash_of[b] = None
                if publish:
                    self.events.append(BlockRemoved((h,)))
            refs[b] = 1
            out.append(b)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one hold on each block. The last block goes to the free queue first, so a
        request's tail is evicted before its prefix, which other requests are likelier to share."""
        refs, free = self.refs, self.free
        for b in reversed(blocks):
            refs[b] -= 1
            if refs[b] == 0:
                if not self.caching and self.hash_of[b] is not None:
                    self.hash_of[b] = None
                free[b] = None

    def commit(self, blocks: Sequence[int], hashes: Sequence[int], parent: int) -> None:
        """Name full blocks by their hashes (``hashes[i]`` for ``blocks[i]``; ``parent`` is the hash
        before ``hashes[0]``) so later prompts find them. A hash already cached keeps its first
        block, and this one stays private to its request."""
        if not self.caching:
            return
        cached, hash_of, publish = self.cached, self.hash_of, self.publish
        for b, h in zip(blocks, hashes, strict=True):
            if h not in cached and hash_of[b] is None:
                cached[h] = b
                hash_of[b] = h
                if publish:
                    self.events.append(BlockStored((h,), parent))
            parent = h

    def drain(self) -> list[KvEvent]:
        out, self.events = self.events, []
        return out
