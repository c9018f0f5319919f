"""The vocabulary of token-level routing, and the accounting every router keeps.

A driver (the gateway, the simulator) calls, on one router:
- ``add_replica(spec)`` / ``remove_replica(id)`` as the fleet changes;
- ``submit(request, now)`` when a request arrives: the decisions it returns (this request routed
  or refused, or nothing while it is held) are carried out at once;
- ``poll(now)`` whenever ``wake`` has passed or a replica's state changed (a first token, a
  finish): held requests routed or refused;
- ``on_first_token``, ``on_finish`` (finished, failed or aborted), ``on_kv_events`` (an engine's
  published cache changes) and ``on_load`` (an engine's ``/metrics`` read) as they happen.

Sans-IO: ``now`` comes in, decisions go out as data. Times are float seconds on the driver's
clock; a request's SLOs are seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from profiles.llm.kv import KvEvent
from profiles.llm.steptime import StepTime
from profiles.schema import PRIORITY_BANDS

METRICS_INTERVAL_S = 0.5  # how often a driver reads each engine's /metrics unless its router wants otherwise


class Band(IntEnum):
    """Priority bands, as the Gateway API Inference Extension names them; sheddable requests are
    refused first. The KServe path's classes map onto them in one place: :func:`band_of`."""

    CRITICAL = 0
    STANDARD = 1
    SHEDDABLE = 2


BANDS = {b.name.lower(): b for b in Band}


def band_of(priority: str) -> Band:
    """The band of a priority class or band name: the KServe classes by the schema's one
    mapping (:data:`profiles.schema.PRIORITY_BANDS`: guaranteed is standard, best-effort
    sheddable); ``critical`` / ``standard`` / ``sheddable`` name themselves."""
    p = priority.lower().replace("_", "-")
    p = PRIORITY_BANDS.get(p, p)
    try:
        return BANDS[p]
    except KeyError:
        raise ValueError(f"unknown priority {priority!r}: guaranteed, best-effort, critical, standard or "
                         f"sheddable") from None


@dataclass(slots=True)
class TokenRequest:
    """One generative request as a router sees it."""

    id: str
    prompt_len: int  # prompt tokens
    max_tokens: int  # output tokens it asks for
    hashes: Sequence[int] = ()  # hashes of the prompt's full blocks (profiles.llm.kv.block_hashes)
    ttft_slo: float = 2.0  # seconds
    tpot_slo: float = 0.05
    band: Band = Band.STANDARD
    tenant: str = ""
    arrival: float = 0.0  # set by submit

    @property
    def ttft_deadline(self) -> float:
        return self.arrival + self.ttft_slo


@dataclass(slots=True, frozen=True)
class Route:
    request: TokenRequest
    replica: str


@dataclass(slots=True, frozen=True)
class Refuse:
    """Refused now: answered 429 with ``reason`` and ``Retry-After`` (seconds)."""

    request: TokenRequest
    reason: str
    retry_after: float = 1.0


Decision = Route | Refuse


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One engine replica: what a router may know of it without asking it. The engine model's
    numbers (step time, KV blocks, scheduler limits) come from the replica's LLM profile; a
    router that does not predict ignores them."""

    id: str
    step_time: StepTime | None = None
    num_blocks: int = 0  # KV blocks (0: unknown)
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    frontend_s: float = 0.0
    max_inflight: int = 1 << 30  # requests the gateway may have open at it


@dataclass(slots=True)
class EngineLoad:
    """What an engine's ``/metrics`` said at its last read (vLLM's gauges)."""

    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0  # fraction of KV blocks held


@dataclass(slots=True)
class Open:
    """A request the router routed and has not seen finish."""

    request: TokenRequest
    routed_at: float
    first_token_at: float | None = None


@dataclass(slots=True)
class ReplicaView:
    """A replica as a router knows it: its spec, what it routed there and has open, and the
    engine's last reported load."""

    spec: ReplicaSpec
    open: dict[str, Open] = field(default_factory=dict)
    load: EngineLoad = field(default_factory=EngineLoad)
    load_at: float | None = None  # when ``load`` was read
    draining: bool = False
    reachable: bool = True  # its engine answers (the driver's view); unreachable, it takes nothing new

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def outstanding(self) -> int:
        return len(self.open)

    @property
    def prefilling(self) -> int:
        """Open requests with no first token yet (queued or prefilling at the engine)."""
        return sum(1 for o in self.open.values() if o.first_token_at is None)

    @property
    def full(self) -> bool:
        return self.draining or not self.reachable or len(self.open) >= self.spec.max_inflight


class RouterBase:
    """The accounting every router keeps: the replicas, what each has open, their reported
    load. Subclasses decide in :meth:`choose` (and may hold requests: override :meth:`submit`,
    :meth:`poll` and :attr:`wake`). The base never holds: a request no replica can take (all
    draining or at ``max_inflight``) is refused."""

    name = "base"
    # how often this router wants each engine's /metrics read (seconds); None: the driver's default
    metrics_interval_s: float | None = None

    def __init__(self) -> None:
        self.replicas: dict[str, ReplicaView] = {}
        self.where: dict[str, str] = {}  # open request id -> replica id

    # ---- the fleet
    def add_replica(self, spec: ReplicaSpec) -> None:
        if spec.id in self.replicas:
            raise ValueError(f"replica {spec.id!r} is already routed to")
        self.replicas[spec.id] = ReplicaView(spec)

    def drain_replica(self, replica_id: str) -> None:
        self.replicas[replica_id].draining = True

    def set_reachable(self, replica_id: str, reachable: bool) -> None:
        """The driver's word on whether the replica's engine answers: an unreachable one takes
        nothing new until it answers again; its open requests finish as they would."""
        view = self.replicas.get(replica_id)
        if view is not None:
            view.reachable = reachable

    def remove_replica(self, replica_id: str) -> None:
        view = self.replicas.pop(replica_id)
        for rid in view.open:
            self.where.pop(rid, None)

    # ---- requests
    def submit(self, request: TokenRequest, now: float) -> list[Decision]:
        request.arrival = now
        return [self.place(request, now)]

    def poll(self, now: float) -> list[Decision]:
        return []

    @property
    def wake(self) -> float | None:
        return None

    @property
    def queued(self) -> int:
        return 0

    def place(self, request: TokenRequest, now: float) -> Decision:
        """Route ``request`` to :meth:`choose`'s replica now, or refuse it when none can take it."""
        candidates = [v for v in self.replicas.values() if not v.full]
        if not candidates:
            return Refuse(request, "no replica can take a request" if self.replicas else "no replica")
        view = self.choose(request, candidates, now)
        return self.routed(request, view, now)

    def routed(self, request: TokenRequest, view: ReplicaView, now: float) -> Route:
        view.open[request.id] = Open(request, now)
        self.where[request.id] = view.id
        self.on_routed(request, view, now)
        return Route(request, view.id)

    def choose(self, request: TokenRequest, candidates: list[ReplicaView], now: float) -> ReplicaView:
        raise NotImplementedError

    def on_routed(self, request: TokenRequest, view: ReplicaView, now: float) -> None:
        """Hook: a request was routed to ``view`` (update indexes)."""

    # ---- what the replicas report
    def on_first_token(self, request_id: str, now: float) -> None:
        rid = self.where.get(request_id)
        if rid is not None:
            o = self.replicas[rid].open.get(request_id)
            if o is not None and o.first_token_at is None:
                o.first_token_at = now

    def on_finish(self, request_id: str, now: float) -> None:
        """The request finished, failed or was aborted: it no longer loads its replica."""
        rid = self.where.pop(request_id, None)
        if rid is not None and rid in self.replicas:
            self.replicas[rid].open.pop(request_id, None)

    def on_kv_events(self, replica_id: str, events: Sequence[KvEvent], now: float) -> None:
        """An engine's published KV cache changes (routers without a precise index ignore them)."""

    def on_load(self, replica_id: str, load: EngineLoad, now: float) -> None:
        view = self.replicas.get(replica_id)
        if view is not None:
            view.load, view.load_at = load, now
