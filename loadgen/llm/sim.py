"""The token-level simulator: a fleet of LLM engines and one router, in virtual time.

Every engine is the engine model the emulated engines run (:class:`profiles.llm.engine.Engine`
driven by :class:`profiles.llm.loop.EngineLoop`, with its profile's step time, KV cache and front
end); the router is the same object the gateway drives (:class:`gateway.policy.llm.types.RouterBase`:
headrace's router or a baseline), on the same protocol:

- an arrival is offered to ``router.submit`` at its scheduled time; a :class:`Route` sends it to
  its engine ``hop_s`` later (the gateway-to-engine way, one way), a :class:`Refuse` is answered
  429 at once;
- each engine's ``/metrics`` is read every ``scrape_interval`` seconds (the router's own
  ``metrics_interval_s`` where it has one, as llm-d's 50 ms, else the gateway's default,
  :class:`gateway.llm.relay.LlmService`'s 0.5 s) from the engine's true state into
  ``router.on_load``; the KV events of each step go to ``router.on_kv_events``;
- a first token goes to ``router.on_first_token``, a finish to ``router.on_finish``, and after
  each such change ``router.poll`` runs, as it does at ``router.wake``.

One heap orders everything, entries ``(time, priority, seq, kind, payload)``: at one moment,
engines first, then deliveries, arrivals, the router's wake and the metrics reads. A request's
prompt is :meth:`~loadgen.llm.workload.Workload.prompt`, hashed once
(:func:`profiles.llm.kv.block_hashes`) for both the router and the engine.

The result is the live driver's :class:`~loadgen.llm.driver.Outcome` list (times from each
request's scheduled send; ``cached_tokens`` the engine's prefix hits), so
:func:`loadgen.llm.stats.summarize` reports a simulated run as ``headrace load llm`` reports a
live one. Inter-token gaps are kept only with ``itl=True``. The engines run ``fast_forward``:
steps that only decode are taken as runs (:mod:`profiles.llm.loop`); with a router that reads
KV events, every engine is brought up to the moment before each routing decision, so the
router has every event of the steps that ended by then, delivered at that moment.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from gateway.policy.llm.types import (
    METRICS_INTERVAL_S,
    Band,
    EngineLoad,
    Refuse,
    ReplicaSpec,
    Route,
    RouterBase,
    TokenRequest,
    band_of,
)
from loadgen.llm.driver import Outcome
from loadgen.llm.workload import BlockCache, Workload
from profiles.llm.engine import Engine, EngineConfig, LlmRequest, RequestTooLong, Seq
from profiles.llm.kv import BLOCK_SIZE, block_hashes
from profiles.llm.loop import EngineLoop, RunOutput
from profiles.llm.profile import LlmProfile

SCRAPE_INTERVAL_S = METRICS_INTERVAL_S  # the gateway's metrics read
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
BLOCK_CACHE = 65536  # Mooncake blocks kept to build prompts from (128 MB; a third of the trace's are reused)
IDLE_READS = 2  # metrics reads with nothing left to do but requests the router holds, then it ends

# heap priorities at one moment
_ENGINE, _DELIVER, _ARRIVE, _ROUTER, _SCRAPE = range(5)


@dataclass(frozen=True)
class EngineSpec:
    """One engine of the fleet: its profile and its scheduler and KV settings."""

    id: str
    profile: LlmProfile
    config: EngineConfig

    def replica(self) -> ReplicaSpec:
        """The engine as a router may know it."""
        c = self.config
        return ReplicaSpec(self.id, self.profile.step_time, c.num_blocks, c.block_size, c.max_num_seqs,
                           c.max_num_batched_tokens, self.profile.frontend_s)


def fleet(profile: LlmProfile, engines: int, gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
          **settings: object) -> list[EngineSpec]:
    """``engines`` identical engines of ``profile`` (``settings`` over vLLM's scheduler defaults)."""
    if engines < 1:
        raise ValueError(f"a fleet needs at least one engine, got {engines}")
    config = profile.engine_config(gpu_memory_utilization, **settings)
    return [EngineSpec(f"e{k}", profile, config) for k in range(engines)]


@dataclass(frozen=True)
class EngineStats:
    """One engine's counters at the end of a run."""

    id: str
    prefix_queries: int
    prefix_hits: int
    preemptions: int
    finished: int
    prompt_tokens: int
    generation_tokens: int
    steps: int  # steps taken one by one
    runs: int  # decode runs, and the steps they took
    run_steps: int

    @property
    def prefix_hit_rate(self) -> float | None:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else None


@dataclass
class SimResult:
    outcomes: list[Outcome]
    elapsed_s: float  # virtual: first scheduled send to the last answer
    engines: list[EngineStats]
    wall_s: float  # what the simulation took on this host
    events: int  # heap entries handled
    held_at_end: int = 0  # requests the router still held when nothing else was left

    def record(self) -> dict:
        """The ``sim`` section of a JSON report."""
        total_q = sum(e.prefix_queries for e in self.engines)
        return {
            "wall_s": self.wall_s, "events": self.events, "held_at_end": self.held_at_end,
            "prefix_hit_rate": sum(e.prefix_hits for e in self.engines) / total_q if total_q else None,
            "preemptions": sum(e.preemptions for e in self.engines),
            "engines": [{**e.__dict__, "prefix_hit_rate": e.prefix_hit_rate} for e in self.engines],
        }


@dataclass
class _Flight:
    """A request on its way: its prompt until it reaches an engine, then the engine's view."""

    request: TokenRequest
    prompt: list[int] | None
    engine: int = -1
    seq: Seq | None = None
    last: float = 0.0  # its last token's time (for inter-token gaps)


def _per_request(value: float | Sequence[float] | np.ndarray, n: int, name: str) -> np.ndarray:
    arr = np.broadcast_to(np.asarray(value, dtype=float), (n,))
    if not np.all(arr > 0):
        raise ValueError(f"{name} must be positive seconds")
    return arr


@dataclass
class _Sim:
    work: Workload
    specs: list[EngineSpec]
    router: RouterBase
    ttft: np.ndarray
    tpot: np.ndarray
    band: list[Band] | None
    tenant: Sequence[str] | None
    scrape_interval: float
    hop_s: float
    itl: bool
    fast_forward: bool
    heap: list = field(default_factory=list)
    seq: int = 0

    def __post_init__(self) -> None:
        # a router that keeps a KV index sees every event of the steps that ended before it decides;
        # for one that reads none, the engines keep none
        self.precise = type(self.router).on_kv_events is not RouterBase.on_kv_events
        self.loops = [EngineLoop(Engine(s.config if self.precise else replace(s.config, kv_events=False),
                                        s.profile.step_time), s.profile.frontend_s, self.fast_forward)
                      for s in self.specs]
        self.index = {s.id: k for k, s in enumerate(self.specs)}
        sizes = {s.config.block_size for s in self.specs}
        self.block_size = sizes.pop() if len(sizes) == 1 else BLOCK_SIZE  # what the router's hashes are of
        self.wakes: list[float | None] = [None] * len(self.loops)
        self.rows = self.work.rows
        self.outcomes = [Outcome(i, float(t), int(self.rows.input_len[i]), int(self.rows.output_len[i]),
                                 band=None if self.band is None else self.band[i].name.lower(),
                                 tenant=None if self.tenant is None else self.tenant[i])
                         for i, t in enumerate(self.rows.times)]
        self.flights: dict[str, _Flight] = {}
        self.router_wake: float | None = None
        self.blocks = BlockCache(self.work, BLOCK_CACHE)
        self.events = 0

    # ---- the heap

    def push(self, t: float, prio: int, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, prio, self.seq, kind, payload))

    def reschedule(self, k: int) -> None:
        w = self.loops[k].wake
        if w is not None and w != self.wakes[k]:
            self.push(w, _ENGINE, _ENGINE, k)
        self.wakes[k] = w

    def watch_router(self) -> None:
        w = self.router.wake
        if w is not None and w != self.router_wake:
            self.push(w, _ROUTER, _ROUTER, None)
        self.router_wake = w

    # ---- the run

    def run(self) -> int:
        for spec in self.specs:
            self.router.add_replica(spec.replica())
        n = len(self.outcomes)
        times = self.rows.times
        nxt = 0
        idle_reads = 0
        self.push(0.0, _SCRAPE, _SCRAPE, None)
        while self.heap or nxt < n:
            if nxt < n and (not self.heap or (float(times[nxt]), _ARRIVE) < self.heap[0][:2]):
                now = float(times[nxt])
                self.arrive(nxt, now)
                nxt += 1
                self.events += 1
                continue
            now, _, _, kind, payload = heapq.heappop(self.heap)
            self.events += 1
            if kind == _ENGINE:
                if self.wakes[payload] == now:
                    self.wakes[payload] = None
                    self.step(payload, now)
                    self.reschedule(payload)
            elif kind == _DELIVER:
                self.deliver(payload, now)
            elif kind == _ROUTER:
                if self.router_wake == now:
                    self.router_wake = None
                    self.decide(self.router.poll, now)
            else:
                self.scrape(now)
                # nothing left but requests the router holds: a few more reads, then it ends
                idle_reads = idle_reads + 1 if nxt >= n and not self.heap else 0
                if (nxt < n or self.flights) and idle_reads <= IDLE_READS:
                    self.push(now + self.scrape_interval, _SCRAPE, _SCRAPE, None)
        held = 0
        for rid, f in self.flights.items():  # what is left when nothing else can happen
            o = self.outcomes[int(rid)]
            if f.engine < 0:
                held += 1
                o.error = "never routed: the router still held it when the run ended"
            else:
                o.error = "never finished: its engine could not schedule it (KV cache too small)"
        return held

    def arrive(self, i: int, now: float) -> None:
        prompt = self.work.prompt(i, self.blocks)
        rows = self.rows
        req = TokenRequest(str(i), len(prompt), int(rows.output_len[i]), block_hashes(prompt, self.block_size),
                           float(self.ttft[i]), float(self.tpot[i]),
                           self.band[i] if self.band is not None else Band.STANDARD,
                           self.tenant[i] if self.tenant is not None else "")
        self.flights[req.id] = _Flight(req, prompt)
        self.decide(lambda t: self.router.submit(req, t), now)

    def decide(self, ask, now: float) -> None:  # noqa: ANN001  (a router call taking the time)
        """Bring the engines up to ``now`` for a router that reads KV events, ask the router,
        and carry out its decisions."""
        if self.precise and self.fast_forward:
            for k, lp in enumerate(self.loops):
                if lp.run is not None:
                    self.step(k, now)
                    self.reschedule(k)
        for d in ask(now):
            if isinstance(d, Route):
                k = self.index[d.replica]
                if self.hop_s > 0:
                    self.push(now + self.hop_s, _DELIVER, _DELIVER, (d.request.id, k))
                else:
                    self.deliver((d.request.id, k), now)
            elif isinstance(d, Refuse):
                o = self.outcomes[int(d.request.id)]
                o.status, o.error, o.e2e = 429, f"HTTP 429: {d.reason}", now - o.scheduled
                self.flights.pop(d.request.id, None)
        self.watch_router()

    def deliver(self, payload: tuple[str, int], now: float) -> None:
        rid, k = payload
        f = self.flights[rid]
        req = f.request
        lp = self.loops[k]
        try:
            hashes = req.hashes if lp.engine.config.block_size == self.block_size else ()
            lp.add(LlmRequest(rid, f.prompt, req.max_tokens, seed=int(rid), hashes=hashes), now)
        except (RequestTooLong, ValueError) as e:
            o = self.outcomes[int(rid)]
            o.status, o.error, o.e2e = 400, f"HTTP 400: {e}", now - o.scheduled
            del self.flights[rid]
            self.router.on_finish(rid, now)
            self.decide(self.router.poll, now)
            return
        f.engine, f.seq, f.prompt = k, lp.engine.seqs[rid], None
        self.outcomes[int(rid)].status = 200
        self.step(k, now)  # an idle engine starts a step now
        self.reschedule(k)

    def step(self, k: int, now: float) -> None:
        """Poll engine ``k`` at ``now`` and pass what it did to the router."""
        out = self.loops[k].poll(now)
        if out is None:
            return
        router = self.router
        if out.events:
            router.on_kv_events(self.specs[k].id, out.events, now)
        changed = bool(out.finished)
        if isinstance(out, RunOutput):
            if self.itl:
                for rid in out.ids:
                    f = self.flights[rid]
                    o = self.outcomes[int(rid)]
                    last = f.last
                    for t in out.ends:
                        o.itl.append(t - last)
                        last = t
                    f.last = last
        else:
            for rid, _ in out.tokens:
                f = self.flights[rid]
                o = self.outcomes[int(rid)]
                if o.ttft is None:
                    o.ttft = now - o.scheduled
                    router.on_first_token(rid, now)
                    changed = True
                elif self.itl:
                    o.itl.append(now - f.last)
                f.last = now
        for rid in out.finished:
            f = self.flights.pop(rid)
            o = self.outcomes[int(rid)]
            o.e2e = now - o.scheduled
            o.output_tokens = f.seq.output
            o.cached_tokens = f.seq.cached_tokens
            router.on_finish(rid, now)
        if changed:
            self.decide(router.poll, now)

    def scrape(self, now: float) -> None:
        router = self.router
        for spec, lp in zip(self.specs, self.loops, strict=True):
            e = lp.engine
            router.on_load(spec.id, EngineLoad(len(e.waiting), len(e.running), lp.kv_usage(now)), now)
        self.decide(router.poll, now)


def simulate(work: Workload, engines: Sequence[EngineSpec], router: RouterBase,
             slo_ttft_s: float | Sequence[float] | np.ndarray = 2.0,
             slo_tpot_s: float | Sequence[float] | np.ndarray = 0.05,
             band: Sequence[int | str | Band] | np.ndarray | None = None, tenant: Sequence[str] | None = None,
             scrape_interval: float | None = None, hop_s: float = 0.0, itl: bool = False,
             fast_forward: bool = True) -> SimResult:
    """Run ``work`` on ``engines`` behind ``router`` in virtual time. SLOs (seconds), bands (a
    :class:`Band`, its number or its name) and tenants are per request (a number is every
    request's); the router must be fresh. ``scrape_interval``: how often engines' metrics are
    read (default: the router's own ``metrics_interval_s``, else the gateway's)."""
    n = len(work)
    if scrape_interval is None:
        scrape_interval = router.metrics_interval_s or SCRAPE_INTERVAL_S
    if not scrape_interval > 0:
        raise ValueError(f"scrape_interval must be positive seconds, got {scrape_interval}")
    if hop_s < 0:
        raise ValueError(f"hop_s must be at least 0, got {hop_s}")
    if not engines:
        raise ValueError("a fleet needs at least one engine")
    ids = [e.id for e in engines]
    if len(set(ids)) != len(ids):
        raise ValueError(f"engine ids must differ: {ids}")
    for name, arr in (("band", band), ("tenant", tenant)):
        if arr is not None and len(arr) != n:
            raise ValueError(f"{name} has {len(arr)} entries for {n} requests")
    bands = None if band is None else [b if isinstance(b, Band) else band_of(b) if isinstance(b, str) else Band(int(b))
                                       for b in band]
    sim = _Sim(work, list(engines), router, _per_request(slo_ttft_s, n, "slo_ttft_s"),
               _per_request(slo_tpot_s, n, "slo_tpot_s"), bands, tenant, scrape_interval, hop_s, itl, fast_forward)
    t0 = time.perf_counter()
    held = sim.run()
    wall = time.perf_counter() - t0
    ends = [o.scheduled + o.e2e for o in sim.outcomes if o.e2e is not None]
    elapsed = max(ends, default=0.0)
    stats = []
    for spec, lp in zip(sim.specs, sim.loops, strict=True):
        c = lp.engine.counters
        stats.append(EngineStats(spec.id, c.prefix_queries, c.prefix_hits, c.preemptions, c.finished,
                                 c.prompt_tokens, c.generation_tokens, lp.steps, lp.runs, lp.run_steps))
    return SimResult(sim.outcomes, elapsed, stats, wall, sim.events, held)


def tenants_of(work: Workload) -> list[str] | None:
    """The workload's tenants as ``headrace load llm`` names them (``tenant-<group>``), None
    without tenants."""
    t = work.rows.tenant
    return None if t is None else [f"tenant-{g}" for g in t.tolist()]


