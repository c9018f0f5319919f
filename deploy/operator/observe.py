"""What the controller reads of the gateway: per model, counters sampled over time, and from
them the observed request rate and the attainment over a window (e.g. the last minute). A
generative model's answer is within its deadline when it meets both its TTFT and TPOT SLOs."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gateway.handle import Sample

COUNTERS = {"headrace_goodput_total": "good", "headrace_deadline_missed_total": "missed",
            "headrace_rejections_total": "rejected", "headrace_failures_total": "failed",
            "headrace_llm_refused_total": "rejected"}
# a generative model's answers: those meeting both token SLOs are good, the rest missed
LLM_ANSWERED, LLM_MET = "headrace_llm_requests_total", "headrace_llm_slo_met_total"


@dataclass(frozen=True)
class Totals:
    good: float = 0.0  # answered within the deadline
    missed: float = 0.0  # answered late
    rejected: float = 0.0  # refused early (429)
    failed: float = 0.0  # errors after admission

    @property
    def answered(self) -> float:
        return self.good + self.missed + self.rejected + self.failed

    def __sub__(self, o: Totals) -> Totals:
        return Totals(self.good - o.good, self.missed - o.missed, self.rejected - o.rejected, self.failed - o.failed)


def read_totals(samples: list[Sample]) -> dict[str, Totals]:
    """The gateway's counters (:meth:`gateway.handle.GatewayHandle.counters`) by model."""
    acc: dict[str, dict[str, float]] = {}
    for name, labels, value in samples:
        field = COUNTERS.get(name)
        if name == LLM_ANSWERED:
            field = "missed"
        elif name == LLM_MET and labels.get("slo") == "both":
            d = acc.setdefault(labels.get("model", ""), {})
            d["missed"] = d.get("missed", 0.0) - value
            field = "good"
        if field is not None:
            d = acc.setdefault(labels.get("model", ""), {})
            d[field] = d.get(field, 0.0) + value
    return {m: Totals(**d) for m, d in acc.items()}


@dataclass(frozen=True)
class Window:
    rate: float  # requests answered per second (every outcome counts: it is the offered load)
    attainment: float | None  # answered within the deadline / answered (None: nothing answered)
    totals: Totals
    seconds: float


class Observer:
    """Samples of the gateway's counters, kept for ``horizon`` seconds; ``now`` comes in."""

    def __init__(self, horizon: float = 120.0) -> None:
        self.horizon = horizon
        self._samples: deque[tuple[float, dict[str, Totals]]] = deque()

    def sample(self, samples: list[Sample], now: float) -> None:
        self._samples.append((now, read_totals(samples)))
        while self._samples and now - self._samples[0][0] > self.horizon:
            self._samples.popleft()

    def window(self, model: str, seconds: float, now: float) -> Window:
        """Rate and attainment of ``model`` over the last ``seconds`` (or what is sampled)."""
        if len(self._samples) < 2:
            return Window(0.0, None, Totals(), 0.0)
        last_t, last = self._samples[-1]
        first_t, first = self._samples[0]
        for t, s in self._samples:
            if now - t <= seconds:
                first_t, first = t, s
                break
        d = last.get(model, Totals()) - first.get(model, Totals())
        span = last_t - first_t
        if span <= 0:
            return Window(0.0, None, d, 0.0)
        return Window(d.answered / span, d.good / d.answered if d.answered else None, d, span)
