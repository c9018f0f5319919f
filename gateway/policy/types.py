"""The vocabulary shared by the policy core and its drivers (gateway and simulator).

Drivers call, on one :class:`SchedulerCore`:
- ``submit(request, now)`` when a request arrives (may reject at once);
- ``poll(now)`` after any event, which returns batches to dispatch now, requests to answer
  now (rejected or expired), and when to poll again if nothing else happens;
- ``on_complete(batch, now, retry=())`` when a dispatched batch finishes (``retry``: requests
  of a failed batch that should be tried again on another replica while their deadline allows);
- ``add_replica``, ``drain_replica`` and ``remove_replica`` to change the fleet while serving:
  drain first (no new batch goes there), wait until ``replicas()`` shows nothing in flight on
  it, then remove (what it hands back, the driver answers);
- ``queued``, ``level`` and ``variant_moves`` to read what it holds (the gateway skips a poll
  when nothing is queued and exports the level and moves as metrics).
Everything is plain data; times are float seconds on the driver's monotonic clock. The
records made per request, batch and poll (``Request``, ``Batch``, ``Reject``, ``Decision``) are
slots dataclasses that nobody changes once built, not frozen ones: a frozen dataclass sets each
field through ``object.__setattr__``, which makes it about 6x slower to build (2.55 µs against
0.43 µs for nine fields on this project's CI host), and a simulation builds several per request.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Protocol

from profiles.profile import Profile
from profiles.schema import Objective


class Priority(IntEnum):
    """Priority class. Triton's ``priority`` parameter 1 (highest) and 0 (default) map to
    GUARANTEED; 2 and above map to BEST_EFFORT (opportunistic, shed first)."""

    GUARANTEED = 0
    BEST_EFFORT = 1


@dataclass(slots=True)
class Request:
    id: int  # unique per driver
    model: str  # the served model name clients address
    arrival: float  # seconds
    deadline: float  # absolute seconds
    priority: Priority = Priority.GUARANTEED
    size: int = 1  # rows along the batch dimension this request carries
    accuracy_floor: float | None = None  # variant selection: least acceptable accuracy
    max_cost: float | None = None  # variant selection: highest acceptable price of its answer
    variant: str | None = None  # variant selection: only this variant
    # what Triton must see alike for requests to share a batch (forwarded parameters,
    # requested outputs, version); None: nothing beyond the tensors (the common case)
    key: Hashable | None = None
    replicas: frozenset[str] | None = None  # only these replicas may serve it (None: any)
    sequence: Hashable | None = None  # a sequence id: sticks to one replica, runs alone, in order
    sequence_start: bool = False  # starts (or restarts) its sequence
    sequence_end: bool = False  # its sequence's last request


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """A place a batch can run: one model variant on one Triton server on one slice."""

    id: str
    model: str  # served model name
    variant: str  # variant name (the Triton model name on that server)
    profile: Profile  # latency predictor for this variant on this replica's slice
    max_batch: int
    max_inflight: int = 1  # batches the replica runs at once
    # what the replica's hardware costs per hour (its slice's share of its GPU's price, or of
    # the host's): a variant's cost per answer is its profile's seconds per row at full batches
    # times this price; None: unknown
    price_per_hour: float | None = None
    objective: Objective = "accuracy"  # the order its variants are tried in (gateway.policy.selector)


@dataclass(slots=True)
class Batch:
    replica: str
    variant: str
    requests: tuple[Request, ...]
    dispatched: float
    predicted_finish: float

    @property
    def rows(self) -> int:
        n = 0  # NOTE: a loop, not sum() over a generator: read several times per batch
        for r in self.requests:
            n += r.size
        return n


class RejectReason(StrEnum):
    """Why a request was answered without running. Each member is its value's string wherever
    it is read: metrics labels, the reason header, JSON reports, and the records' repr that the
    identity digests hash (hence ``__repr__``)."""

    INFEASIBLE = "infeasible"  # cannot finish in time even alone on the best replica
    EXPIRED = "expired"  # became infeasible while queued
    SHED = "shed"  # best-effort work shed to protect guaranteed traffic
    NO_REPLICA = "no_replica"  # no healthy replica serves the model
    FAILED = "failed"  # its batch failed and no retry can still make the deadline

    __repr__ = str.__repr__


@dataclass(slots=True)
class Reject:
    request: Request
    reason: RejectReason
    retry_after: float  # seconds the client should wait before retrying
    message: str = ""


@dataclass(slots=True)
class Decision:
    batches: tuple[Batch, ...] = ()
    rejects: tuple[Reject, ...] = ()
    wakeup: float | None = None  # poll again at this time if no other event comes first


@dataclass(frozen=True, slots=True)
class ReplicaState:
    info: ReplicaInfo
    healthy: bool = True
    inflight: tuple[Batch, ...] = field(default=())
    overhead: float = 0.0  # learned seconds from a batch's end on the replica to its answers
    run_excess: float = 0.0  # learned seconds a batch runs on the replica beyond its profile
    draining: bool = False  # takes no new batch; idle once ``inflight`` is empty


class SchedulerCore(Protocol):
    def add_replica(self, info: ReplicaInfo, now: float) -> None: ...
    def drain_replica(self, replica_id: str, now: float) -> None: ...
    def remove_replica(self, replica_id: str, now: float) -> tuple[Request, ...]: ...
    def set_healthy(self, replica_id: str, healthy: bool, now: float) -> None: ...
    def submit(self, request: Request, now: float) -> Reject | None: ...
    def cancel(self, request_id: int, now: float) -> bool: ...
    def poll(self, now: float) -> Decision: ...
    def on_complete(self, batch: Batch, now: float, retry: tuple[Request, ...] = ()) -> None: ...
    def replicas(self) -> tuple[ReplicaState, ...]: ...
    def queued(self, model: str | None = None) -> int: ...
    def level(self, model: str) -> int: ...
    def variant_moves(self, model: str) -> tuple[int, int, int]: ...
