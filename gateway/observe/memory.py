"""Memory a burst of large requests leaves behind is given back to the system.

glibc's malloc serves a large block (a request body, a decoded tensor) from its own mapping,
given back when freed, only below a threshold that it raises each time such a block is freed,
up to 32 MiB: after one burst of large bodies, later ones come from the heap, whose freed space
glibc keeps. One client's burst of 8 MiB bodies then leaves the gateway's RSS near its peak
for good. :func:`pin_large_blocks` fixes the threshold (``M_MMAP_THRESHOLD``, which also stops
its raising) so every block from 256 KiB up is mapped and unmapped, and the heap's free top
past 4 MiB is given back as it is freed (``M_TRIM_THRESHOLD``). The pieces a body arrives in
are smaller, and a burst of them leaves free pages inside the heap, below objects that live
on: :func:`trimmer` gives those back (``malloc_trim``) every few seconds, which costs well
under a millisecond on a heap with nothing to give back. Neither does anything where the C
library is not glibc.
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
LARGE_BLOCK = 256 << 10  # blocks from this size up get their own mapping
TRIM_THRESHOLD = 4 << 20  # free heap top past this is given back when freed


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
        _LIBC.malloc_trim(0)
        took = time.perf_counter() - t
        if took > 0.005:
            log.debug("malloc_trim took %.1f ms", took * 1e3)
