"""An upper bound on the request rate a fleet of engines can serve a workload at: the rate at
which its token capacity is exhausted, from the engine model, with perfect balance and every
reusable prefix reused.

Per request, the least engine time it can cost:
- its prefill, of only the prompt tokens no earlier request of the workload had (a block first
  seen is computed once, fleet-wide, and every later prompt finds it cached), each token at the
  marginal cost of a full token-budget step (the step's fixed costs are paid by the decodes it
  carries), plus its attention work;
- its output tokens, each at ``T(d) / d``: the step time of the largest decode batch ``d`` whose
  step still meets the TPOT SLO, fits the KV cache, and is within ``max_num_seqs``. The KV cache
  holds each reused prefix once per engine (the workload's reused blocks spread evenly over the
  engines) and, per sequence, its own tokens (prompt less the reused prefix, and half its output).

For ``share`` of the requests to meet their SLOs, at least that share must be served, and the
cheapest way is to serve the cheapest ones: the fleet meets the share at most at
``engines * n / (sum of the cheapest share of the n costs)`` requests per second. Every router's
goodput rate is below it: it ignores TTFT queueing, the prefill steps that stretch decodes, and
imbalance. A run of finitely many requests may pass it by the work done after its last arrival:
:meth:`Bound.finite` bounds such a run.

Sans-IO and pure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loadgen.llm.workload import BLOCK_TOKENS, Workload
from profiles.llm.engine import EngineConfig
from profiles.llm.steptime import StepShape, StepTime


@dataclass(frozen=True)
class Bound:
    rate: float  # requests per second the fleet's token capacity allows
    prefill_s: float  # mean engine seconds per request of prefill
    decode_s: float  # mean engine seconds per request of decode
    batch: int  # the decode batch the bound assumes
    unique_share: float  # share of prompt tokens that must be computed
    share: float  # of the requests the bound serves (the cheapest)
    engines: int = 1
    cost_s: float = 0.0  # engine seconds per request of the workload, the served share's over all

    def finite(self, n: int, tail_s: float) -> float:
        """The bound for a run of ``n`` requests, whose served work may also run up to ``tail_s``
        after the last arrival (a request's TTFT SLO plus its decode at the TPOT SLO): with the
        arrivals spanning ``n / rate``, the work ``n * cost_s`` fits ``engines * (n / rate + tail_s)``."""
        spare = n * self.cost_s - self.engines * tail_s
        return self.engines * n / spare if spare > 0 else float("inf")

    def as_dict(self) -> dict[str, float | int]:
        return {"rate": self.rate, "prefill_s": self.prefill_s, "decode_s": self.decode_s, "batch": self.batch,
                "unique_share": self.unique_share, "share": self.share, "engines": self.engines,
                "cost_s": self.cost_s}


def unique_tokens(work: Workload, first_only: bool = True) -> np.ndarray:
    """Per request, the prompt tokens no earlier request had (``first_only``), or that no other
    request has at all (Mooncake-style hash ids: a leading run of ids another request has is
    shared; a workload without them shares nothing)."""
    ins = work.rows.input_len
    if not work.rows.hash_ids:
        return ins.copy()
    seen: set[int] = set()
    if not first_only:
        count: dict[int, int] = {}
        for ids in work.rows.hash_ids:
            for h in ids:
                count[h] = count.get(h, 0) + 1
        seen = {h for h, c in count.items() if c > 1}
    out = np.empty(len(ins), dtype=np.int64)
    for i, ids in enumerate(work.rows.hash_ids):
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        if first_only:
            seen.update(ids)
        out[i] = max(1, int(ins[i]) - min(k * BLOCK_TOKENS, int(ins[i]) - 1))
    return out


def _reused_blocks(work: Workload) -> float:
    """KV blocks (16 tokens) of the prompt prefixes more than one request uses."""
    count: dict[int, int] = {}
    for ids in work.rows.hash_ids:
        for h in ids:
            count[h] = count.get(h, 0) + 1
    return sum(1 for c in count.values() if c > 1) * BLOCK_TOKENS / 16


def _step(st: StepTime, prefill: int, decodes: int, context: float, work: float = 0.0) -> float:
    s = StepShape()
    if prefill:
        s.tokens += prefill
        s.prefill_tokens += prefill
        s.prefill_work += work
    if decodes:
        s.tokens += decodes
        s.decode_seqs += decodes
        s.kv_read += int(decodes * context)
        s.sampled += decodes
    return st.seconds(s)


def fleet_bound(work: Workload, st: StepTime, cfg: EngineConfig, engines: int, tpot_slo_s: float,
                share: float = 0.9) -> Bound:
    ins = work.rows.input_len.astype(np.float64)
    outs = work.rows.output_len.astype(np.float64)
    uniq = unique_tokens(work).astype(np.float64)
    b = cfg.max_num_batched_tokens
    per_token = (_step(st, b, 0, 0.0) - _step(st, 1, 0, 0.0)) / (b - 1)  # linear and per-step parts
    pair = st.layers * st.prefill_attn_per_pair_s
    cached = ins - uniq
    prefill = uniq * per_token + pair * uniq * (cached + uniq / 2)
    context = float(np.mean(ins + outs / 2)) if len(ins) else 1.0
    reused = (ins - unique_tokens(work, first_only=False)) if len(ins) else ins
    shared_blocks = _reused_blocks(work) / engines
    own_blocks = float(np.mean(ins - reused + outs / 2)) / cfg.block_size if len(ins) else 1.0
    room = max(cfg.num_blocks - shared_blocks, 0.1 * cfg.num_blocks)
    d_max = max(1, min(cfg.max_num_seqs, int(room / max(own_blocks, 1.0))))
    d = 1
    while d < d_max and _step(st, 0, d + 1, context) <= tpot_slo_s:
        d += 1
    per_out = _step(st, 0, d, context) / d
    decode = outs * per_out
    if not len(ins):
        return Bound(0.0, 0.0, 0.0, d, 0.0, share)
    keep = np.argsort(prefill + decode, kind="stable")[:max(1, int(np.ceil(share * len(ins))))]
    cost = float((prefill[keep] + decode[keep]).sum()) / len(ins)
    return Bound(engines / cost, float(np.mean(prefill[keep])), float(np.mean(decode[keep])), d,
                 float(uniq.sum() / max(1.0, ins.sum())), share, engines, cost)
