"""Memory a burst of large requests leaves behind is given back to the system, without
making each large block cost page faults.

glibc's malloc serves a block from its own mapping, given back when freed, only above a
threshold that it raises each time such a block is freed, up to 32 MiB, and gives back the
heap's free top past a trim threshold. :func:`pin_large_blocks` fixes both (which also stops
the raising): blocks from 32 MiB up (a body near ``max_message_bytes``) get their own mapping,
and smaller ones (a request body of a few MiB, its pieces, a batch's inputs) come from the
heap, whose free space is kept up to 256 MiB. Mapping every block from 256 KiB up instead made
each 8 MiB body cost 2,048 page faults when joined and again when freed, which kept the event
loop busy (health probes waited 200-550 ms at the 99th percentile while one client sent 8 MiB
requests, 50-90 ms this way). What the heap keeps is given back by :func:`trimmer`
(``malloc_trim``, which also returns free pages inside the heap, below objects that live on)
every few seconds, in a thread; it costs well under a millisecond on a heap with nothing to give back.
Neither does anything where the C library is not glibc.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time

log = logging.getLogger("headrace.gateway")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
LARGE_BLOCK = 32 << 20  # blocks from this size up get their own mapping
TRIM_THRESHOLD = 256 << 20  # free heap top past this is given back when freed (the rest by trimmer)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt  # noqa: B018  (glibc has them; musl does not)
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def pin_large_blocks() -> bool:
    """Fix malloc's mapping and trim thresholds (see the module doc); True where it did."""
    if _LIBC is None:
        return False
    ok = bool(_LIBC.mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK)) and bool(_LIBC.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not ok:
        log.warning("mallopt refused the mapping thresholds: large request bodies may keep memory after they are freed")
    return ok



async def trimmer(period_s: float = 2.0) -> None:
    """Every ``period_s``, give the heap's free pages back to the system; runs until cancelled."""
    if _LIBC is None:
        return
    while True:
        await asyncio.sleep(period_s)
        t = time.perf_counter()
        # in a thread: returning a few hundred MiB takes tens of ms, which the loop does not wait
        # for (only a large allocation made meanwhile waits for the heap's lock)
        await asyncio.to_thread(_LIBC.malloc_trim, 0)
        took = time.perf_counter() - t
        if took > 0.005:
            log.debug("malloc_trim took %.1f ms", took * 1e3)
