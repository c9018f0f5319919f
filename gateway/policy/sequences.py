"""Sequence (stateful) requests: where each sequence lives and what waits for it.

Triton's sequence batcher keeps a sequence's state in one model instance of one server, so
every request of a sequence (one ``sequence_id`` of one model) goes to the replica its first
request was bound to. The requests of one sequence go out one at a time, in arrival order
(the next one only when the one before it is answered), and each alone: a batch sent to
Triton is one request, so two requests in it would be one step of one sequence.

A binding is made at submit (:meth:`Sequences.bind`), dropped when its ``sequence_end``
request is submitted, when its replica is removed, or, past ``max_bound`` bindings, when it
has been idle ``idle_s`` (a client that never ended its sequence). A ``sequence_start``
request binds afresh.

Pure bookkeeping: the scheduler decides when a replica can take a request, and answers.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

from gateway.policy.types import Request

_Key = tuple[str, Hashable]  # (model, sequence id)


@dataclass(slots=True)
class _Binding:
    replica: str
    last: float  # when a request of the sequence was last submitted


class Sequences:
    def __init__(self, idle_s: float = 60.0, max_bound: int = 4096) -> None:
        self.idle_s = idle_s
        self.max_bound = max_bound
        self._bound: dict[_Key, _Binding] = {}
        self._per_replica: Counter[str] = Counter()  # sequences bound to each replica
        self._waiting: dict[str, deque[Request]] = {}  # replica id -> its requests, in arrival order
        self._running: set[_Key] = set()  # sequences with a request in flight
        self.queued = 0  # requests waiting, every replica together

    # ------------------------------------------------------------------ bindings

    def replica_of(self, r: Request) -> str | None:
        """The replica ``r``'s sequence is bound to (None: unbound, or ``r`` starts it anew)."""
        if r.sequence_start:
            return None
        b = self._bound.get((r.model, r.sequence))
        return b.replica if b is not None else None

    def least_bound(self, replicas: list[str]) -> str:
        """Of ``replicas`` (in the caller's order of preference), the one holding the fewest
        sequences: sequence state is spread like Triton spreads it over its sequence slots."""
        return min(replicas, key=lambda rid: self._per_replica[rid])

    def bind(self, r: Request, replica: str, now: float) -> None:
        """``r`` waits for ``replica`` from now on, and its sequence is bound there (until its
        end request is submitted)."""
        key = (r.model, r.sequence)
        old = self._bound.pop(key, None)
        if old is not None:
            self._per_replica[old.replica] -= 1
        if r.sequence_end:
            self._prune(now)
        else:
            if len(self._bound) >= self.max_bound:
                self._prune(now)
            self._bound[key] = _Binding(replica, now)
            self._per_replica[replica] += 1
        self._waiting.setdefault(replica, deque()).append(r)
        self.queued += 1

    def _prune(self, now: float) -> None:
        for key in [k for k, b in self._bound.items() if now - b.last > self.idle_s]:
            self._per_replica[self._bound.pop(key).replica] -= 1

    # ------------------------------------------------------------------ waiting requests

    def replicas_waited_on(self) -> list[str]:
        return [rid for rid, q in self._waiting.items() if q]

    def waiting(self, replica: str) -> Iterator[Request]:
        return iter(self._waiting.get(replica, ()))

    def next(self, replica: str) -> Request | None:
        """The request ``replica`` may run next: the earliest waiting one whose sequence has
        nothing in flight and no earlier request waiting."""
        seen: set[_Key] = set()
        for r in self._waiting.get(replica, ()):
            key = (r.model, r.sequence)
            if key not in self._running and key not in seen:
                return r
            seen.add(key)
        return None

    def take(self, replica: str, r: Request) -> None:
        """``r`` leaves the wait for ``replica``: sent (its sequence is running until
        :meth:`done`) or answered."""
        self._remove(replica, r)

    def started(self, r: Request) -> None:
        self._running.add((r.model, r.sequence))

    def done(self, r: Request) -> None:
        self._running.discard((r.model, r.sequence))

    def retry(self, replica: str, r: Request) -> None:
        """``r`` was sent and its batch failed: it waits again for ``replica``, first."""
        self._waiting.setdefault(replica, deque()).appendleft(r)
        self.queued += 1

    def cancel(self, r: Request) -> bool:
        """Take a waiting ``r`` out (False when it is not waiting)."""
        for rid, q in self._waiting.items():
            if r in q:
                self._remove(rid, r)
                return True
        return False

    def drop_waiting(self, replica: str) -> list[Request]:
        """Every request waiting for ``replica`` (its bindings stay: it may come back)."""
        q = self._waiting.pop(replica, None)
        out = list(q) if q else []
        self.queued -= len(out)
        return out

    def drop_replica(self, replica: str) -> list[Request]:
        """``replica`` is gone: its bindings go, and its waiting requests are returned."""
        for key in [k for k, b in self._bound.items() if b.replica == replica]:
            del self._bound[key]
        self._per_replica.pop(replica, None)
        return self.drop_waiting(replica)

    def _remove(self, replica: str, r: Request) -> None:
        q = self._waiting[replica]
        q.remove(r)
        self.queued -= 1
        if not q:
            del self._waiting[replica]
