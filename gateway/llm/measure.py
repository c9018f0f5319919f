"""What the gateway measures of a generative request as its client sees it: TTFT from the
request's arrival to its first content token written (a whole answer: to the answer), TPOT =
(last token - first token) / (output tokens - 1), the tokens from the engine's ``usage``, and
the meeting of its TTFT SLO, TPOT SLO and both; by model and variant (the engine's model name).
"""

from __future__ import annotations

import json

from gateway.llm.picker import LlmReplica
from gateway.observe.metrics import GatewayMetrics


def whole(m: GatewayMetrics, rep: LlmReplica, raw: bytes, ttft: float, ttft_slo: float) -> bytes:
    """Record a whole answer (its TTFT: the answer's); the answer, named as the client asked."""
    usage = None
    try:
        doc = json.loads(raw)
        usage = doc.get("usage")
        if rep.served != rep.model and doc.get("model") == rep.served:
            doc["model"] = rep.model
            raw = json.dumps(doc).encode()
    except (ValueError, AttributeError):
        pass
    record(m, rep, ttft, None, usage, ttft_slo, 0.0)
    return raw


def stream(m: GatewayMetrics, rep: LlmReplica, arrival: float, first: float, last: float, events: int,
           usage: dict | None, ttft_slo: float, tpot_slo: float) -> None:
    """Record a stream read to its end: ``first`` / ``last`` token times (0: none came),
    ``events`` content events after the first."""
    if not first:  # no token came (an empty answer, or an error event)
        record(m, rep, None, None, usage, ttft_slo, tpot_slo)
        return
    n = usage.get("completion_tokens", events + 1) if isinstance(usage, dict) else events + 1
    tpot = (last - first) / (n - 1) if isinstance(n, int) and n > 1 else None
    record(m, rep, first - arrival, tpot, usage, ttft_slo, tpot_slo)


def record(m: GatewayMetrics, rep: LlmReplica, ttft: float | None, tpot: float | None, usage: dict | None,
           ttft_slo: float, tpot_slo: float) -> None:
    model, variant = rep.model, rep.served
    m.of(m.llm_requests, model, variant).inc()
    if ttft is not None:
        m.of(m.llm_ttft, model, variant).observe(ttft)
    if tpot is not None:
        m.of(m.llm_tpot, model, variant).observe(tpot)
    ttft_met = ttft is not None and ttft <= ttft_slo
    tpot_met = tpot is None or tpot <= tpot_slo
    if ttft_met:
        m.of(m.llm_slo_met, model, variant, "ttft").inc()
    if tpot_met:
        m.of(m.llm_slo_met, model, variant, "tpot").inc()
    if ttft_met and tpot_met:
        m.of(m.llm_slo_met, model, variant, "both").inc()
    if isinstance(usage, dict):
        for kind, key in (("input", "prompt_tokens"), ("output", "completion_tokens")):
            v = usage.get(key)
            if isinstance(v, int) and v > 0:
                m.of(m.llm_tokens, model, variant, kind).inc(v)
