"""headrace's token-level router: route each generative request to the replica where it is
predicted to meet both its TTFT and its TPOT SLO, hold it at the gateway while none is, and
refuse it as soon as it can no longer make its TTFT SLO.

Per request, for every replica that can take it:
- the prompt's cached prefix there, from the prefix index (:mod:`.prefix`): precise where the
  engine publishes KV events, else approximate from the routing history;
- its predicted TTFT and TPOT there (:mod:`.predict`): the prefill queue already sent, its own
  uncached tokens, the decode batch and the prefill rate, through the engine model's step time.
  A cache hit shortens the predicted prefill, and a long queue lengthens it, so prefix affinity
  and load balance are weighed in one unit, seconds, and a hot prefix does not pile onto one
  replica once its queue costs more than the hit saves;
- it is **feasible** where both predictions are within the request's SLOs (its TTFT deadline
  counts the time it has already waited; TPOT within ``tpot_margin`` of its SLO, since prefills
  routed after it will stretch the steps it decodes in). A sheddable request needs headroom
  (``sheddable_headroom`` of both SLOs) so that it only takes spare capacity.

The feasible replica with the least cost takes it: its SLO use (TTFT over the TTFT budget left,
TPOT over its SLO) plus the engine time its uncached prefill takes from the requests queued after
it (over the same budget), so that a cache hit is worth what it saves the fleet, not only what it
saves this request. With none feasible, the request is held in the flow-control queue (:mod:`.flow`: bands, VTC
fairness, EDF on the TTFT deadline, bounded per band), and every change a replica reports (a
first token, a finish) re-examines the queue in its order; within a band a request that cannot
go yet is passed over (up to ``scan`` of them), but no lower band's request goes while a higher
band's waits. A held request is refused (429) when
waiting longer would leave too little time for its own prefill on an idle replica, or at once
when the requests ahead of it would take longer to drain than its deadline allows (from the
fleet's recent finish rate). Sheddable requests are refused while any higher band waits.

A replica without an engine model (no profile) is scored by open requests less the prefix hit,
and held for only by ``max_inflight``.

Sans-IO: ``now`` comes in, decisions go out (:mod:`.types`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.policy.llm.flow import FlowQueue, FlowSettings
from gateway.policy.llm.predict import ReplicaModel
from gateway.policy.llm.prefix import PrefixIndex
from gateway.policy.llm.types import (
    Band,
    Decision,
    Refuse,
    ReplicaSpec,
    ReplicaView,
    RouterBase,
    TokenRequest,
)
from profiles.llm.kv import KvEvent

FINISH_TAU_S = 10.0  # the fleet's finish rate's averaging time


@dataclass(frozen=True)
class RouterSettings:
    flow: FlowSettings = field(default_factory=FlowSettings)
    sheddable_headroom: float = 0.5  # a sheddable request's predictions must be within this share of its SLOs
    # predicted TPOT must be within this share of the SLO: it is a mean over the request's life, and
    # prefills routed after it stretch its steps
    tpot_margin: float = 0.85
    scan: int = 16  # held requests examined past the first one that cannot go, per poll
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.sheddable_headroom <= 1 or not 0 < self.tpot_margin <= 1:
            raise ValueError("sheddable_headroom and tpot_margin must be in (0, 1]")
        if self.scan < 1:
            raise ValueError("scan must be at least 1")


class SloRouter(RouterBase):
    name = "headrace"

    def __init__(self, settings: RouterSettings | None = None) -> None:
        super().__init__()
        self.settings = settings or RouterSettings()
        self.flow = FlowQueue(self.settings.flow)
        self.index = PrefixIndex()
        self.models: dict[str, ReplicaModel] = {}
        self.precise: set[str] = set()  # replicas whose KV events feed the index
        self._expiry: list[tuple[float, str]] = []  # (latest moment to route it, request id)
        self._latest: dict[str, float] = {}
        self.finish_rate = 0.0
        self._finish_at = 0.0

    # ---- the fleet
    def add_replica(self, spec: ReplicaSpec) -> None:
        super().add_replica(spec)
        if spec.num_blocks:
            self.index.set_capacity(spec.id, spec.num_blocks)
        if spec.step_time is not None:
            self.models[spec.id] = ReplicaModel(spec, spec.step_time)

    def remove_replica(self, replica_id: str) -> None:
        super().remove_replica(replica_id)
        self.index.drop(replica_id)
        self.models.pop(replica_id, None)
        self.precise.discard(replica_id)

    # ---- requests
    @property
    def queued(self) -> int:
        return len(self.flow)

    @property
    def wake(self) -> float | None:
        while self._expiry and self._expiry[0][1] not in self.flow:
            heapq.heappop(self._expiry)
        return self._expiry[0][0] if self._expiry else None

    def submit(self, request: TokenRequest, now: float) -> list[Decision]:
        request.arrival = now
        if not self.replicas:
            return [Refuse(request, "no replica", 1.0)]
        if request.band is Band.SHEDDABLE and self._held_above(Band.SHEDDABLE):
            return [Refuse(request, "shed: higher-priority requests are waiting", self._retry(now))]
        if not self._ahead_of(request):
            d = self._try(request, now)
            if d is not None:
                return [d]
        return self._hold(request, now)

    def poll(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        while self._expiry and self._expiry[0][0] <= now:
            _, rid = heapq.heappop(self._expiry)
            req = self.flow.ids.get(rid)
            if req is not None:
                self._drop(req)
                out.append(Refuse(req, "TTFT SLO can no longer be met", self._retry(now)))
        if not self.flow:
            return out
        misses = 0
        blocked: Band | None = None  # the highest band with a request that cannot go yet
        for req in list(self.flow.order()):
            if blocked is not None and req.band > blocked:
                if req.band is not Band.SHEDDABLE:
                    break  # a lower band never takes the capacity a higher one waits for
                self._drop(req)
                out.append(Refuse(req, "shed: higher-priority requests are waiting", self._retry(now)))
                continue
            d = self._try(req, now)
            if d is None:
                blocked = req.band if blocked is None else blocked
                misses += 1
                if misses > self.settings.scan:
                    break
                continue
            self._drop(req)
            out.append(d)
        return out

    def withdraw(self, request_id: str) -> bool:
        """A held request whose client went away: forgotten (True), or not held (False)."""
        req = self.flow.ids.get(request_id)
        if req is None:
            return False
        self._drop(req)
        return True

    # ---- deciding
    def _held_above(self, band: Band) -> bool:
        return any(self.flow.size[b] for b in Band if b < band)

    def _ahead_of(self, req: TokenRequest) -> bool:
        return any(self.flow.size[b] for b in Band if b <= req.band)

    def _try(self, req: TokenRequest, now: float) -> Decision | None:
        """Route ``req`` now if some replica is feasible for it."""
        best = self._best(req, now)
        if best is None:
            return None
        view, uncached, work = best
        model = self.models.get(view.id)
        if model is not None:
            model.route(req, uncached, work, now)
        self.flow.charge(req)
        return self.routed(req, view, now)

    def _best(self, req: TokenRequest, now: float) -> tuple[ReplicaView, int, float] | None:
        cands = [v for v in self.replicas.values() if not v.full]
        if not cands:
            return None
        hits = self.index.match_all(req.hashes) if req.hashes else {}
        budget = req.ttft_deadline - now
        head = self.settings.sheddable_headroom if req.band is Band.SHEDDABLE else 1.0
        best, best_cost = None, math.inf
        fallback, fallback_key = None, None
        for v in cands:
            model = self.models.get(v.id)
            cached = hits.get(v.id, 0) * v.spec.block_size
            if model is None:
                key = (v.outstanding - cached / max(1, req.prompt_len), v.id)
                if fallback_key is None or key < fallback_key:
                    fallback, fallback_key = (v, req.prompt_len - cached, 0.0), key
                continue
            ttft, tpot, uncached, own = model.predict(req, cached, now)
            if ttft > budget * head or tpot > req.tpot_slo * head * self.settings.tpot_margin:
                continue
            # its SLO use, and the engine time it takes from the requests after it
            cost = (ttft + own) / max(budget, 1e-9) + tpot / req.tpot_slo
            if cost < best_cost:
                best, best_cost = (v, uncached, own), cost
        return best if best is not None else fallback

    def _hold(self, req: TokenRequest, now: float) -> list[Decision]:
        latest = self._latest_start(req)
        if latest <= now:
            return [Refuse(req, "TTFT SLO cannot be met", self._retry(now))]
        ahead = sum(self.flow.size[b] for b in Band if b <= req.band)
        if ahead and self.finish_rate > 0 and now + ahead / self.finish_rate > latest:
            return [Refuse(req, "TTFT SLO cannot be met: the queue ahead is too long",
                           self._retry(now, ahead / self.finish_rate))]
        if not self.flow.push(req):
            return [Refuse(req, f"{req.band.name.lower()} queue full", self._retry(now))]
        self._latest[req.id] = latest
        heapq.heappush(self._expiry, (latest, req.id))
        return []

    def _latest_start(self, req: TokenRequest) -> float:
        """The last moment routing ``req`` can still meet its TTFT: its deadline less its own
        prefill on the fastest idle replica (less the prompt's cached part there)."""
        own = math.inf
        hits = self.index.match_all(req.hashes) if req.hashes else {}
        for rid, m in self.models.items():
            cached = hits.get(rid, 0) * m.spec.block_size
            cached = min(cached, ((req.prompt_len - 1) // m.spec.block_size) * m.spec.block_size)
            own = min(own, m.spec.frontend_s + m.prefill_s(req.prompt_len - cached, cached, 0, 0.0))
        if own is math.inf:
            own = 0.0
        return req.ttft_deadline - own

    def _drop(self, req: TokenRequest) -> None:
        self.flow.remove(req)
        self._latest.pop(req.id, None)

    def _retry(self, now: float, wait: float | None = None) -> float:
        if wait is None:
            wait = len(self.flow) / self.finish_rate if self.finish_rate > 0 else 1.0
        return float(min(self.settings.max_retry_after_s, max(1.0, math.ceil(wait))))

    # ---- what replicas report
    def on_routed(self, request: TokenRequest, view: ReplicaView, now: float) -> None:
        if request.hashes:
            if view.id in self.precise:
                self.index.touch(view.id, request.hashes)
            else:
                self.index.add(view.id, request.hashes)

    def on_first_token(self, request_id: str, now: float) -> None:
        rid = self.where.get(request_id)
        super().on_first_token(request_id, now)
        model = self.models.get(rid) if rid is not None else None
        if model is not None:
            model.first_token(request_id, now)

    def on_finish(self, request_id: str, now: float) -> None:
        if self.withdraw(request_id):
            return
        rid = self.where.get(request_id)
        super().on_finish(request_id, now)
        if rid is None:
            return
        model = self.models.get(rid)
        if model is not None:
            model.finish(request_id, now)
        decay = math.exp(-(now - self._finish_at) / FINISH_TAU_S) if now > self._finish_at else 1.0
        self.finish_rate = self.finish_rate * decay + 1.0 / FINISH_TAU_S
        self._finish_at = max(self._finish_at, now)

    def on_kv_events(self, replica_id: str, events: Sequence[KvEvent], now: float) -> None:
        if replica_id not in self.replicas:
            return
        if replica_id not in self.precise:  # the engine's own events replace the routing history
            self.precise.add(replica_id)
            self.index.drop(replica_id)
            spec = self.replicas[replica_id].spec
            if spec.num_blocks:
                self.index.set_capacity(replica_id, spec.num_blocks)
        self.index.apply(replica_id, events)
