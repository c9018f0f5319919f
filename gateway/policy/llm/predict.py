"""Predicted TTFT and TPOT of a request on one engine replica, from the engine model's step time
(:class:`profiles.llm.steptime.StepTime`) and what the router has sent there.

Per replica the router keeps (:class:`ReplicaModel`):
- the prefill queue: the requests routed there whose first token has not come back, each with
  the engine time its prefill adds to the steps it rides in (its chunks' step times less the
  decodes those steps run anyway: several prefills share a step, so they do not queue whole
  steps). The engine prefills in arrival order, so a new request's prefill ends when the work
  queued before it and its own are done (``busy_until``), plus the decode part of each step its
  chunks and those ahead ride in; on an idle engine it starts after the server's front end. Each
  first token or finish re-anchors the queue at that moment on what is still prefilling, so it
  corrects itself from what the engine does;
- the decoding requests, their count and their mean context;
- the KV blocks the open requests will hold at their longest (their uncached prompt tokens and
  ``max_tokens``: a prefix found cached is shared with the requests that hold it);
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
    work: float  # engine seconds its prefill adds
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
        """(TTFT, TPOT, uncached tokens, the engine time its prefill adds) of ``req`` routed here
        now with ``cached`` prompt tokens found in the prefix cache. TTFT is ``inf`` when the
        engine could not start it now (its KV or its sequence limit is full)."""
        spec = self.spec
        cached = min(cached, ((req.prompt_len - 1) // spec.block_size) * spec.block_size)
        uncached = req.prompt_len - cached
        decoding = len(self.decoding)
        ctx = self.mean_context() or (req.prompt_len + req.max_tokens / 2)
        work = self.prefill_work_s(uncached, cached, decoding, ctx)
        ttft = max(spec.frontend_s, self.busy_until - now) + work
        if decoding:  # the step under way ends first; each step its prefill rides in carries the decodes
            t_dec = self.decode_step_s(decoding, ctx)
            room = max(1, spec.max_num_batched_tokens - decoding)
            ttft += t_dec / 2 + t_dec * -(-(self.queued_tokens + uncached) // room)
        need = -(-(uncached + req.max_tokens) // spec.block_size)  # a cached prefix's blocks are shared
        if decoding + len(self.prefilling) + 1 > spec.max_num_seqs or (
                spec.num_blocks and self.blocks + need > spec.num_blocks):
            ttft = math.inf
        ctx_after = (self.context_sum + req.prompt_len + req.max_tokens / 2) / (decoding + 1)
        stretch = 1.0 - (self.prefill_rate(now) + uncached / TAU_S) * self.c_tok
        decodes = decoding + len(self.prefilling) + 1
        tpot = self.decode_step_s(decodes, ctx_after) / stretch if stretch > 0.05 else math.inf
        return ttft, tpot, uncached, work

    def prefill_work_s(self, uncached: int, cached: int, decodes: int, context: float) -> float:
        """The engine time a prefill adds to the steps it rides in: its chunks' step times less
        the decodes those steps run anyway."""
        total = self.prefill_s(uncached, cached, decodes, context)
        if decodes:
            room = max(1, self.spec.max_num_batched_tokens - decodes)
            total -= self.decode_step_s(decodes, context) * -(-uncached // room)
        return max(total, 0.0)

    @property
    def queued_tokens(self) -> int:
        return sum(q.uncached for q in self.prefilling.values())

    def route(self, req: TokenRequest, uncached: int, work: float, now: float) -> None:
        blocks = -(-(uncached + req.max_tokens) // self.spec.block_size)
        self.prefilling[req.id] = Queued(work, uncached, blocks, req.prompt_len + req.max_tokens / 2)
        self.busy_until = max(self.busy_until, now + self.spec.frontend_s) + work
        self.blocks += blocks
        self.rate = self.prefill_rate(now) + uncached / TAU_S
        self.rate_at = max(self.rate_at, now)

    def _requeue(self, now: float) -> None:
        """The prefill queue re-anchored on what the engine did: what is still prefilling, from now."""
        self.busy_until = now + sum(q.work for q in self.prefilling.values())

    def first_token(self, request_id: str, now: float) -> None:
        q = self.prefilling.pop(request_id, None)
        if q is None:
            return
        self._requeue(now)
        self.decoding[request_id] = q
        self.context_sum += q.context

    def finish(self, request_id: str, now: float) -> None:
        q = self.prefilling.pop(request_id, None)
        if q is not None:
            self._requeue(now)
        else:
            q = self.decoding.pop(request_id, None)
            if q is None:
                return
            self.context_sum -= q.context
            if not self.decoding:
                self.context_sum = 0.0
        self.blocks -= q.blocks
