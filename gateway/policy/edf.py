"""An earliest-deadline-first queue of requests: sorted by (deadline, arrival order)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

from gateway.policy.types import Request


class EdfQueue:
    """Requests in EDF order. Ties keep submit order. Indexing follows that order."""

    def __init__(self) -> None:
        self._keys: list[tuple[float, int]] = []
        self._items: list[Request] = []
        self._seq = 0
        self.rows = 0  # total rows queued
        self.max_size = 0  # at least the largest request queued (reset when emptied)
        self.keyed = 0  # requests queued with a batch key

    def push(self, request: Request) -> None:
        key = (request.deadline, self._seq)
        self._seq += 1
        i = bisect.bisect_right(self._keys, key)
        self._keys.insert(i, key)
        self._items.insert(i, request)
        self.rows += request.size
        self.max_size = max(self.max_size, request.size)
        if request.key is not None:
            self.keyed += 1

    def deadlines(self) -> list[float]:
        return [k[0] for k in self._keys]

    def index_after(self, deadline: float) -> int:
        """How many queued requests have a deadline at or before ``deadline`` (where a new
        request with that deadline goes in EDF order)."""
        return bisect.bisect_right(self._keys, (deadline, float("inf")))

    def rows_before(self, deadline: float) -> int:
        """Rows of queued requests whose deadline is at or before ``deadline``."""
        if self.rows == len(self._items):  # every request is one row
            return self.index_after(deadline)
        return sum(r.size for r in self._items[: self.index_after(deadline)])

    def remove_indices(self, indices: Iterable[int]) -> list[Request]:
        drop = set(indices)
        if not drop:
            return []
        if len(drop) == len(self._items) and max(drop) == len(self._items) - 1:
            return self.clear()  # all of it (a lone request, a whole-queue batch)
        taken = [self._items[i] for i in sorted(drop)]
        self._keys = [k for i, k in enumerate(self._keys) if i not in drop]
        self._items = [r for i, r in enumerate(self._items) if i not in drop]
        self.rows -= sum(r.size for r in taken)
        self.keyed -= sum(r.key is not None for r in taken)
        if not self._items:
            self.max_size = 0
        return taken

    def remove(self, request: Request) -> bool:
        """Take ``request`` out (by id); False when it is not queued here."""
        i = bisect.bisect_left(self._keys, (request.deadline, -1))
        while i < len(self._items) and self._keys[i][0] == request.deadline:
            if self._items[i].id == request.id:
                return bool(self.remove_indices((i,)))
            i += 1
        return False

    def clear(self) -> list[Request]:
        out = self._items
        self._keys, self._items, self.rows, self.max_size, self.keyed = [], [], 0, 0, 0
        return out

    def __getitem__(self, i: int) -> Request:
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._items)
