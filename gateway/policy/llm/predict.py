"""Predicted TTFT and TPOT of a request on one engine replica, from the engine model's step time
(:class:`profiles.llm.steptime.StepTime`) and what the router has sent there.

Per replica the router keeps (:class:`ReplicaModel`):
- the prefill queue: the requests routed there whose first token has not come back, each with
  the time its prefill is predicted to end. The engine prefills in arrival order, so a new
  request's prefill starts when the last one's ends (``busy_until``) or, on an idle engine, after
  the server's front end; when a first token comes back, the requests queued behind it move by
  the prediction's error, so the queue corrects itself from what the engine does;
- the decoding requests, their count and their mean context;
- the KV blocks the open requests will hold at their longest (prompt + ``max_tokens``);
- the rate of prefill tokens sent there lately (an exponential average over ``tau`` seconds).

A prefill of ``n`` uncached tokens after ``c`` cached ones runs in chunks of the token budget
less one token per decoding sequence (chunked prefill shares each step with the decodes); its
time is the step time of each chunk's shape. A decoding step with ``d`` sequences takes
``T(d)``; prefill tokens sent at ``rho`` per second, each costing ``c_tok`` of step time, stretch
it to ``T(d) / (1 - rho * c_tok)``, which is the predicted TPOT (a second holds ``N`` steps with
``N T(d) + rho c_tok = 1``).

Sans-IO: plain arithmetic on the router's accounting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gateway.policy.llm.types import ReplicaSpec, TokenRequest
from profiles.llm.steptime import StepShape, StepTime

TAU_S = 5.0  # the prefill rate's averaging time


@dataclass(slots=True)
class Queued:
    ends: float  # predicted end of its prefill (its first token)
    uncached: int
    blocks: int  # KV blocks it holds at its longest
    context: float  # mean context while it decodes


@dataclass(slots=True)
class ReplicaModel:
    spec: ReplicaSpec
    step: StepTime
    prefilling: dict[str, Queued] = field(default_factory=dict)  # in routing order
    decoding: dict[str, Queued] = field(default_factory=dict)
    busy_until: float = 0.0
    blocks: int = 0
    context_sum: float = 0.0  # over decoding requests
    rate: float = 0.0  # prefill tokens per second, averaged
    rate_at: float = 0.0
    c_tok: float = 0.0  # step time per prefill token, at the token budget

    def __post_init__(self) -> None:
        b = self.spec.max_num_batched_tokens
        self.c_tok = max(0.0, (self._chunk_s(b, 0, 0.0) - self._chunk_s(1, 0, 0.0)) / max(1, b - 1))

    # ---- the engine model
    def _chunk_s(self, n: int, decodes: int, context: float, work: float | None = None) -> float:
        s = StepShape()
        if n:
            s.tokens += n
            s.prefill_tokens += n
            s.prefill_work += n * n / 2 if work is None else work
        if decodes:
            s.tokens += decodes
            s.decode_seqs += decodes
            s.kv_read += int(decodes * context)
            s.sampled += decodes
        return self.step.seconds(s)

    def prefill_s(self, uncached: int, cached: int, decodes: int, context: float) -> float:
        """Time to prefill ``uncached`` tokens after ``cached`` ones beside ``decodes`` decoding
        sequences of mean ``context``."""
        room = max(1, self.spec.max_num_batched_tokens - decodes)
        total, done = 0.0, 0
        while done < uncached:
            n = min(room, uncached - done)
            total += self._chunk_s(n, decodes, context, n * (cached + done + n / 2))
            done += n
        return total

    def decode_step_s(self, decodes: int, context: float) -> float:
        return self._chunk_s(0, max(1, decodes), context)

    # ---- accounting
    def prefill_rate(self, now: float) -> float:
        return self.rate * math.exp(-(now - self.rate_at) / TAU_S) if now > self.rate_at else self.rate

    def mean_context(self) -> float:
        n = len(self.decoding)
        return self.context_sum / n if n else 0.0

    def predict(self, req: TokenRequest, cached: int, now: float) -> tuple[float, float, int, float]:
        """(TTFT, TPOT, uncached tokens, its own prefill's seconds) of ``req`` routed here now
        with ``cached`` prompt tokens found in the prefix cache. TTFT is ``inf`` when the engine
        could not start it now (its KV or its sequence limit is full)."""
        spec = self.spec
        cached = min(cached, ((req.prompt_len - 1) // spec.block_size) * spec.block_size)
        uncached = req.prompt_len - cached
        decodes = len(self.decoding) + len(self.prefilling)
        ctx = self.mean_context() or (req.prompt_len + req.max_tokens / 2)
        start = max(now + spec.frontend_s, self.busy_until)
        own = self.prefill_s(uncached, cached, len(self.decoding), ctx)
        ttft = start - now + own
        need = -(-(req.prompt_len + req.max_tokens) // spec.block_size)
        if decodes + 1 > spec.max_num_seqs or (spec.num_blocks and self.blocks + need > spec.num_blocks):
            ttft = math.inf
        ctx_after = (self.context_sum + req.prompt_len + req.max_tokens / 2) / (len(self.decoding) + 1)
        stretch = 1.0 - (self.prefill_rate(now) + uncached / TAU_S) * self.c_tok
        tpot = self.decode_step_s(decodes + 1, ctx_after) / stretch if stretch > 0.05 else math.inf
        return ttft, tpot, uncached, own

    def route(self, req: TokenRequest, uncached: int, ttft: float, now: float) -> None:
        blocks = -(-(req.prompt_len + req.max_tokens) // self.spec.block_size)
        q = Queued(now + ttft, uncached, blocks, req.prompt_len + req.max_tokens / 2)
        self.prefilling[req.id] = q
        self.busy_until = max(self.busy_until, q.ends)
        self.blocks += blocks
        self.rate = self.prefill_rate(now) + uncached / TAU_S
        self.rate_at = max(self.rate_at, now)

    def first_token(self, request_id: str, now: float) -> None:
        q = self.prefilling.pop(request_id, None)
        if q is None:
            return
        error = now - q.ends
        for other in self.prefilling.values():
            if other.ends >= q.ends:  # queued behind it: moves by its error
                other.ends = max(now, other.ends + error)
        self.busy_until = max((o.ends for o in self.prefilling.values()), default=now)
        self.decoding[request_id] = q
        self.context_sum += q.context

    def finish(self, request_id: str, now: float) -> None:
        q = self.prefilling.pop(request_id, None)
        if q is not None:
            self.busy_until = max((o.ends for o in self.prefilling.values()), default=min(self.busy_until, now))
        else:
            q = self.decoding.pop(request_id, None)
            if q is None:
                return
            self.context_sum -= q.context
            if not self.decoding:
                self.context_sum = 0.0
        self.blocks -= q.blocks
