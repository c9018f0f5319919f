"""How much the driver holds for its clients: the inference requests it admitted and has not
answered yet (queued or in flight), by count and by input bytes, all clients together and per
client. Triton's ``max_queue_size``, done per tenant.

A client is whom the front door names: the tenant when the gateway has API keys, else the
client's address (HTTP: the connection's peer host; gRPC: the call's peer host); None
(internal callers) is counted only in the totals. A request's bytes are its input tensors' raw
bytes as decoded (the sum of ``len(raw)`` over its inputs): what the driver keeps alive for it
until it is answered, known without another pass over the data.

Past a bound a request is refused before it reaches the scheduler: :class:`Rejected` (429 /
RESOURCE_EXHAUSTED) with reason :data:`QUEUE_FULL` and a message naming the limit
(``limits.max_queued_requests``, ``limits.max_queued_bytes``,
``limits.max_client_queued_requests``, ``limits.max_client_queued_bytes``). A request larger
than a bytes bound on its own is refused the same way. Each admitted request is charged once
(:meth:`QueueBounds.admit`) and released once (:meth:`QueueBounds.release`), both O(1); a
client holding nothing has no entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import Rejected
from profiles.schema import LimitsSpec

QUEUE_FULL = "queue_full"  # the reject reason (x-headrace-reject-reason) of a request past a queue bound
RETRY_AFTER_S = 1.0  # the wait a refusal suggests: answers free room as they go out


@dataclass(slots=True)
class Held:
    """What one client (or everyone) holds: requests admitted and not yet answered, and their
    input bytes."""

    requests: int = 0
    bytes: int = 0


class QueueBounds:
    """The four bounds of :class:`~profiles.schema.LimitsSpec` on admitted requests, and what
    is held against them."""

    __slots__ = ("max_requests", "max_bytes", "max_client_requests", "max_client_bytes", "total", "clients")

    def __init__(self, max_requests: int, max_bytes: int, max_client_requests: int, max_client_bytes: int) -> None:
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.max_client_requests = max_client_requests
        self.max_client_bytes = max_client_bytes
        self.total = Held()
        self.clients: dict[str, Held] = {}

    @classmethod
    def of(cls, spec: LimitsSpec | None) -> QueueBounds:
        s = spec or LimitsSpec()
        return cls(s.max_queued_requests, s.max_queued_bytes, s.max_client_queued_requests,
                   s.max_client_queued_bytes)

    def admit(self, client: str | None, nbytes: int) -> None:
        """Charge one request of ``nbytes`` input bytes to ``client`` (and to the totals), or
        raise :class:`Rejected` (:data:`QUEUE_FULL`) charging nothing."""
        t = self.total
        if t.requests >= self.max_requests:
            raise _full(f"the gateway holds {t.requests} requests admitted and not yet answered "
                        f"(limits.max_queued_requests: {self.max_requests})")
        if t.bytes + nbytes > self.max_bytes:
            raise _full(f"the gateway holds {t.bytes} input bytes admitted and not yet answered; this request's "
                        f"{nbytes} would pass limits.max_queued_bytes ({self.max_bytes})")
        if client is not None:
            c = self.clients.get(client)
            if c is None:
                if nbytes > self.max_client_bytes:
                    raise _full(f"this request's {nbytes} input bytes pass limits.max_client_queued_bytes "
                                f"({self.max_client_bytes})")
                self.clients[client] = Held(1, nbytes)
            else:
                if c.requests >= self.max_client_requests:
                    raise _full(f"client '{client}' holds {c.requests} requests admitted and not yet answered "
                                f"(limits.max_client_queued_requests: {self.max_client_requests})")
                if c.bytes + nbytes > self.max_client_bytes:
                    raise _full(f"client '{client}' holds {c.bytes} input bytes admitted and not yet answered; "
                                f"this request's {nbytes} would pass limits.max_client_queued_bytes "
                                f"({self.max_client_bytes})")
                c.requests += 1
                c.bytes += nbytes
        t.requests += 1
        t.bytes += nbytes

    def release(self, client: str | None, nbytes: int) -> None:
        """One request ``admit`` charged is answered (or gone): its room is free again."""
        t = self.total
        t.requests -= 1
        t.bytes -= nbytes
        if client is not None:
            c = self.clients[client]
            if c.requests == 1:
                del self.clients[client]
            else:
                c.requests -= 1
                c.bytes -= nbytes

    def held(self, client: str | None = None) -> Held:
        """What ``client`` holds (None: everyone), as a copy."""
        h = self.total if client is None else self.clients.get(client, Held())
        return Held(h.requests, h.bytes)


def _full(message: str) -> Rejected:
    return Rejected(message, QUEUE_FULL, RETRY_AFTER_S)
