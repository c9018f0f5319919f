"""How long one engine step takes: the one step-time predictor of an LLM engine.

A step runs every scheduled token through the model once. Its time is assembled as Vidur
assembles it from profiled operators (``microsoft/vidur``, ``execution_time_predictor``), per
transformer layer, times the layers, plus what runs once per step:

- the linear layers, norms, activation and rope, a function of the step's tokens (prefill chunk
  tokens plus one per decoding sequence), interpolated in a measured table;
- prefill attention, linear in the attention work: for a chunk of ``n`` new tokens over ``c``
  already computed ones, ``n * (c + n / 2)`` query-key pairs (causal within the chunk);
- decode attention, linear in the KV tokens the decoding sequences read;
- tensor-parallel all-reduces (two a layer), linear in the step's tokens;
- a fixed cost per step (scheduling, input preparation, sampling) and one per sampled sequence
  (the LM head and the sampler).

Sans-IO and pure: numbers in, seconds out.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass


@dataclass(slots=True)
class StepShape:
    """What one step computes, summed over its scheduled requests: the step time's inputs."""

    tokens: int = 0  # every token the step runs (prefill chunk tokens + one per decoding sequence)
    prefill_tokens: int = 0
    prefill_work: float = 0.0  # sum over prefill chunks of n * (computed + n / 2)
    decode_seqs: int = 0
    kv_read: int = 0  # KV tokens the decoding sequences attend to
    sampled: int = 0  # sequences that produce a token this step

    def add_prefill(self, computed: int, n: int, samples: bool) -> None:
        self.tokens += n
        self.prefill_tokens += n
        self.prefill_work += n * (computed + n / 2)
        self.sampled += samples

    def add_decode(self, context: int) -> None:
        self.tokens += 1
        self.decode_seqs += 1
        self.kv_read += context
        self.sampled += 1


@dataclass(frozen=True, slots=True)
class StepTime:
    """Step time of one model on one device (GPU, MIG slice or tensor-parallel group), in seconds.

    ``linear`` is a table of (tokens, seconds per layer), read by linear interpolation and
    extended past its last point along its last segment. Attention and communication terms are
    per layer; ``step_s`` and ``sample_s`` once per step and per sampled sequence."""

    layers: int
    linear: tuple[tuple[int, float], ...]
    prefill_attn_s: float = 0.0  # per layer, fixed when a step holds a prefill chunk
    prefill_attn_per_pair_s: float = 0.0  # per layer, per query-key pair of prefill attention
    decode_attn_s: float = 0.0  # per layer, fixed when a step holds decoding sequences
    decode_attn_per_kv_s: float = 0.0  # per layer, per KV token read
    allreduce_s: float = 0.0  # per layer: both all-reduces' fixed cost (0 without tensor parallelism)
    allreduce_per_token_s: float = 0.0
    step_s: float = 0.0
    sample_s: float = 0.0

    def __post_init__(self) -> None:
        xs = [x for x, _ in self.linear]
        if len(xs) < 2 or xs != sorted(set(xs)) or xs[0] < 1:
            raise ValueError(f"the linear table needs two or more increasing token counts from 1 (got {xs[:5]}...)")
        if self.layers < 1:
            raise ValueError(f"layers ({self.layers}) must be at least 1")

    def linear_s(self, tokens: int) -> float:
        """Seconds per layer of the token-wise work (linear layers, norms, activation, rope)."""
        t = self.linear
        i = bisect_right(t, (tokens, float("inf"))) - 1
        i = min(max(i, 0), len(t) - 2)
        (x0, y0), (x1, y1) = t[i], t[i + 1]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)

    def seconds(self, s: StepShape) -> float:
        if s.tokens == 0:
            return 0.0
        per_layer = self.linear_s(s.tokens)
        if s.prefill_tokens:
            per_layer += self.prefill_attn_s + self.prefill_attn_per_pair_s * s.prefill_work
        if s.decode_seqs:
            per_layer += self.decode_attn_s + self.decode_attn_per_kv_s * s.kv_read
        per_layer += self.allreduce_s + self.allreduce_per_token_s * s.tokens
        return self.layers * per_layer + self.step_s + self.sample_s * s.sampled

    def scaled(self, compute: float = 1.0, memory: float = 1.0, fixed: float = 1.0) -> StepTime:
        """This model on a device ``compute`` times as fast at arithmetic and ``memory`` times at
        reading memory (a MIG slice, another GPU, a smaller weight format), the per-step costs
        ``fixed`` times. The token-wise work is read as a roofline: reading the weights (the
        table's one-token time) or computing (the per-token time of its last point), whichever
        binds at a token count. Each table point moves by the ratio of the scaled roofline to the
        original, so the table keeps its measured shape: a format with smaller weights but no
        faster arithmetic gains at few tokens and not at many. Prefill attention scales with
        compute, decode attention with memory."""
        (_, y0), (xn, yn) = self.linear[0], self.linear[-1]
        per_token = yn / xn

        def moved(x: int, y: float) -> float:
            roof = max(y0, per_token * x)
            return y * max(y0 / memory, per_token * x / compute) / roof if roof > 0 else y

        return StepTime(
            layers=self.layers, linear=tuple((x, moved(x, y)) for x, y in self.linear),
            prefill_attn_s=self.prefill_attn_s / compute, prefill_attn_per_pair_s=self.prefill_attn_per_pair_s / compute,
            decode_attn_s=self.decode_attn_s / memory, decode_attn_per_kv_s=self.decode_attn_per_kv_s / memory,
            allreduce_s=self.allreduce_s, allreduce_per_token_s=self.allreduce_per_token_s,
            step_s=self.step_s * fixed, sample_s=self.sample_s * fixed,
        )
