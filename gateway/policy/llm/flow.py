"""Flow control for requests a router holds: priority bands, per-tenant fairness by Virtual
Token Counter, a bounded queue per band, and no wait past a request's TTFT deadline.

- **Bands** (critical, standard, sheddable): a band's requests go before any of a lower band's.
- **Fairness** within a band: the tenant with the least service so far goes first, as the Virtual
  Token Counter does it (Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024,
  Algorithm 2): each tenant has a counter of the tokens served to it, weighted
  ``input_weight`` per prompt token and ``output_weight`` per output token (the paper's w_p = 1,
  w_q = 2); a tenant whose queue was empty is lifted, when a request of it comes, to the least
  counter of the tenants with requests queued, so idling earns no credit. Here a request is
  charged when it is routed (its prompt and its ``max_tokens``), since the router does not see
  tokens one by one.
- Within a tenant: earliest TTFT deadline first (EDF).
- Each band's queue holds at most ``queue_limit[band]`` requests; past it a request is refused.

Sans-IO: the router decides when to look; this only orders and bounds what waits.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from gateway.policy.llm.types import Band, TokenRequest

DEFAULT_QUEUE = {Band.CRITICAL: 1024, Band.STANDARD: 1024, Band.SHEDDABLE: 256}


@dataclass(frozen=True)
class FlowSettings:
    queue_limit: Mapping[Band, int] = field(default_factory=lambda: dict(DEFAULT_QUEUE))
    fairness: bool = True  # VTC across tenants within a band; off: EDF across the band
    input_weight: float = 1.0
    output_weight: float = 2.0

    def __post_init__(self) -> None:
        for b in Band:
            if self.queue_limit.get(b, 0) < 0:
                raise ValueError(f"queue limit of band {b.name.lower()} must be at least 0")
        if self.input_weight < 0 or self.output_weight < 0:
            raise ValueError("VTC weights must be at least 0")


class _Tenant:
    __slots__ = ("heap", "counter")

    def __init__(self, counter: float) -> None:
        self.heap: list[tuple[float, int, TokenRequest]] = []  # (TTFT deadline, arrival order, request)
        self.counter = counter


class FlowQueue:
    """The requests held, per band and tenant."""

    def __init__(self, settings: FlowSettings | None = None) -> None:
        self.settings = settings or FlowSettings()
        self.bands: dict[Band, dict[str, _Tenant]] = {b: {} for b in Band}
        self.size: dict[Band, int] = dict.fromkeys(Band, 0)
        self.counters: dict[str, float] = {}  # VTC, per tenant (kept while the tenant is known)
        self.ids: dict[str, TokenRequest] = {}
        self._order = 0

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.ids

    def full(self, band: Band) -> bool:
        return self.size[band] >= self.settings.queue_limit.get(band, 0)

    def push(self, req: TokenRequest) -> bool:
        """Hold ``req``; False (nothing held) when its band's queue is full."""
        if self.full(req.band):
            return False
        tenants = self.bands[req.band]
        key = req.tenant if self.settings.fairness else ""
        t = tenants.get(key)
        if t is None:
            busy = [x.counter for x in tenants.values()]
            lift = min(busy) if busy else 0.0
            t = tenants[key] = _Tenant(max(self.counters.get(key, 0.0), lift))
        self._order += 1
        heapq.heappush(t.heap, (req.ttft_deadline, self._order, req))
        self.size[req.band] += 1
        self.ids[req.id] = req
        return True

    def order(self) -> Iterator[TokenRequest]:
        """Every held request, in the order they should go: band, then least-served tenant, then
        EDF; a snapshot, so the caller may remove as it goes."""
        for band in Band:
            tenants = self.bands[band]
            if not tenants:
                continue
            for key in sorted(tenants, key=lambda k: (tenants[k].counter, k)):
                for _, _, req in sorted(tenants[key].heap):
                    yield req

    def remove(self, req: TokenRequest) -> None:
        """Take a held request out (routed, refused or withdrawn)."""
        if self.ids.pop(req.id, None) is None:
            return
        tenants = self.bands[req.band]
        key = req.tenant if self.settings.fairness else ""
        t = tenants[key]
        t.heap = [e for e in t.heap if e[2] is not req]
        heapq.heapify(t.heap)
        self.size[req.band] -= 1
        if not t.heap:
            self.counters[key] = t.counter
            del tenants[key]

    def charge(self, req: TokenRequest) -> None:
        """Count a routed request's tokens to its tenant (VTC)."""
        key = req.tenant if self.settings.fairness else ""
        cost = self.settings.input_weight * req.prompt_len + self.settings.output_weight * req.max_tokens
        t = self.bands[req.band].get(key)
        if t is not None:
            t.counter += cost
        self.counters[key] = (t.counter if t is not None else self.counters.get(key, 0.0) + cost)

    def earliest(self) -> float | None:
        """The earliest TTFT deadline held."""
        return min((t.heap[0][0] for ts in self.bands.values() for t in ts.values()), default=None)
