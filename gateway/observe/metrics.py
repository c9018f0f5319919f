"""Prometheus metrics of the gateway (prefix ``headrace_``, base units, histograms by model).

Goodput is ``rate(headrace_goodput_total[1m])``: successful answers within their deadline.
Triton has no deadline notion, so met/missed, early rejections and the batch sizes the
gateway forms are exported here. Generative models (``headrace_llm_*``, by model and variant,
the variant being the engine's model name) add TTFT and TPOT as the client sees them and the
requests meeting each token SLO and both: attainment is ``met / requests``. Each gateway owns its registry (no global state).
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
    0.75, 1.0, 2.0, 5.0, 10.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256)
TTFT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0,
)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
REFUSAL_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        self.latency = Histogram(
            "headrace_request_duration_seconds", "End-to-end time from arrival to answer, successful requests",
            ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram(
            "headrace_queue_duration_seconds", "Time from arrival until the request's batch was dispatched",
            ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram(
            "headrace_batch_size", "Rows per batch sent to a replica", ["model", "variant"],
            buckets=BATCH_BUCKETS, registry=r)
        self.batch_duration = Histogram(
            "headrace_batch_duration_seconds", "Time a replica took to answer one batch",
            ["model", "variant"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_late = Histogram(
            "headrace_batch_late_seconds", "How much later than its predicted finish a batch came back "
            "(0 when on time): how far the replica strays from its profile",
            ["model", "variant"], buckets=LATENCY_BUCKETS, registry=r)
        self.loop_lag = Histogram(
            "headrace_event_loop_lag_seconds", "How late the gateway's event loop runs a 50 ms timer "
            "(CPU starvation shows here first)", buckets=LATENCY_BUCKETS, registry=r)
        self.goodput = Counter(
            "headrace_goodput", "Successful answers within their deadline (rate() of it is goodput)",
            ["model"], registry=r)
        self.missed = Counter(
            "headrace_deadline_missed", "Successful answers that came after their deadline",
            ["model"], registry=r)
        self.rejections = Counter(
            "headrace_rejections", "Requests answered early without running (429/RESOURCE_EXHAUSTED)",
            ["model", "reason"], registry=r)
        self.refusal_wait = Histogram(
            "headrace_refusal_wait_seconds", "Time from reading a request to refusing it at arrival "
            "(admission): how long a client waits for a 429 inside the gateway", ["model"],
            buckets=REFUSAL_BUCKETS, registry=r)
        self.cancelled = Counter(
            "headrace_cancelled", "Queued requests their clients gave up on (never sent to a replica)",
            ["model"], registry=r)
        self.failures = Counter(
            "headrace_failures", "Requests answered with an error after admission (backend failure)",
            ["model"], registry=r)
        self.by_variant = Counter(
            "headrace_variant_requests", "Successful answers by the variant that served them",
            ["model", "variant"], registry=r)
        self.inflight = Gauge(
            "headrace_replica_inflight_batches", "Batches running on a replica", ["model", "replica"],
            registry=r)
        self.overhead = Gauge(
            "headrace_replica_overhead_seconds", "Time from a batch's end on the replica to its answers "
            "at the gateway (network, Triton, the gateway's loop), as the scheduler has learned it and "
            "plans with; read at scrape", ["model", "replica"], registry=r)
        self.run_excess = Gauge(
            "headrace_replica_run_excess_seconds", "How much longer than its profile a batch runs on the "
            "replica (negative: shorter), learned from back-to-back completions; read at scrape",
            ["model", "replica"], registry=r)
        self.tenant_requests = Counter(
            "headrace_tenant_requests", "Requests by tenant and answer (HTTP status or gRPC code name); "
            "calls without a valid key count as tenant 'unauthenticated'. Only when tenants are configured",
            ["tenant", "code"], registry=r)
        self.level = Gauge(
            "headrace_variant_level", "How many of the model's most accurate variants its requests skip "
            "first under sustained overload (0: the most accurate is preferred); read at scrape",
            ["model"], registry=r)
        self.variant_moves = Gauge(
            "headrace_variant_moves", "Since start: level moves to cheaper variants (down), back (up), and "
            "queued requests moved to another variant that could still make their deadline (late); "
            "read at scrape", ["model", "kind"], registry=r)
        self.healthy = Gauge(
            "headrace_replica_healthy", "1 when the replica passes its ready probe", ["model", "replica"],
            registry=r)

        self.llm_ttft = Histogram(
            "headrace_llm_ttft_seconds", "Time from a generative request's arrival to its first token written "
            "to the client (a whole answer: to the answer)", ["model", "variant"], buckets=TTFT_BUCKETS, registry=r)
        self.llm_tpot = Histogram(
            "headrace_llm_tpot_seconds", "Time per output token after the first, as the client receives "
            "them: (last token - first token) / (output tokens - 1)", ["model", "variant"],
            buckets=TPOT_BUCKETS, registry=r)
        self.llm_requests = Counter(
            "headrace_llm_requests", "Generative requests answered by an engine, whole or streamed to the end",
            ["model", "variant"], registry=r)
        self.llm_slo_met = Counter(
            "headrace_llm_slo_met", "Generative requests meeting their TTFT SLO (slo=ttft), their TPOT SLO "
            "(tpot) and both (both); attainment is this over headrace_llm_requests_total",
            ["model", "variant", "slo"], registry=r)
        self.llm_tokens = Counter(
            "headrace_llm_tokens", "Tokens of generative requests, prompt (kind=input) and generated (output)",
            ["model", "variant", "kind"], registry=r)
        self.llm_aborted = Counter(
            "headrace_llm_aborted", "Generative requests aborted at the engine before their end: the client "
            "went away (reason=disconnect), stopped reading (write_timeout), the replica left (removed) or the "
            "engine broke off (engine)",
            ["model", "reason"], registry=r)
        self.llm_refused = Counter(
            "headrace_llm_refused", "Generative requests their router refused (429, the reason as the "
            "x-headrace-reject-reason header gives it)", ["model", "reason"], registry=r)
        self.llm_queued = Gauge(
            "headrace_llm_queued", "Generative requests the router holds at the gateway, waiting for an engine",
            ["model"], registry=r)

    def of(self, metric: Any, *labels: str) -> Any:
        """The labelled child of ``metric``, cached (``labels()`` takes a lock and builds a key)."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def forget(self, model: str, replica: str) -> None:
        """Drop every series of a removed replica, and their cached children (a scrape shows
        only replicas served)."""
        for metric in (self.inflight, self.overhead, self.run_excess, self.healthy):  # by replica
            with contextlib.suppress(KeyError):  # older prometheus_client raise for a missing one
                metric.remove(model, replica)
            self._children.pop((id(metric), (model, replica)), None)

    def render(self) -> bytes:
        return generate_latest(self.registry)
