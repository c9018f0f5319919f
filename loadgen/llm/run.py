"""One generative load run from a validated :class:`LlmLoadSpec`, and the goodput search: the
highest load at which a target share of requests (90% by default, as DistServe) meets both the
TTFT and the TPOT SLO.

A run's load is scaled by one factor: a trace replay's time compression (``rate_scale``), or a
synthetic workload's ``rate``. The search runs the workload at the ends of a factor range, then
bisects between the highest factor that passed and the lowest that failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from loadgen.llm.driver import APIS, Outcome, ProgressFn, Target, drive
from loadgen.llm.stats import summarize
from loadgen.llm.workload import (
    DEFAULT_VOCAB,
    SHARED_OUTPUT_LEN,
    SHARED_QUESTION_LEN,
    SHARED_SYSTEM_LEN,
    SHARED_TENANTS,
    TRACES,
    Workload,
    cap_context,
    parse_length,
    read_trace,
    shared_prefix,
    synthetic,
    window,
)
from loadgen.record import headrace_version, host_facts

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"  # ../shared/traces from the repository's root
WORKLOADS = (*TRACES, "poisson", "gamma", "shared-prefix")
SYNTHETIC_OUTPUT_LEN = "lognormal:200:0.8"


class LlmLoadSpec(BaseModel):
    """Everything that shapes one generative load run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(pattern=r"^https?://[^/\s]+$", description="http://HOST:PORT of the server")
    model: str = Field(min_length=1, description="model name to address")
    api: Literal["completions", "chat", "triton"] = Field("completions", description=f"one of {APIS}")
    workload: Literal["azure-llm", "mooncake", "poisson", "gamma", "shared-prefix"] = Field(
        "poisson", description="a shared trace to replay, synthetic arrivals, or llm-d's shared-prefix shape")
    traces_dir: Path = Field(DEFAULT_TRACES, description="folder holding the shared traces")
    start_s: float = Field(0.0, ge=0, description="trace replay: seconds into the trace the window starts")
    duration_s: float | None = Field(None, gt=0, description="seconds of replay (after scaling)")
    requests: int | None = Field(None, ge=1, description="send at most this many requests")
    rate_scale: float = Field(1.0, gt=0, description="trace replay: time compression (2: twice as fast)")
    rate: float = Field(1.0, gt=0, description="synthetic: mean requests per second")
    cv: float = Field(1.0, gt=0, description="gamma: coefficient of variation of the gaps")
    input_len: str = Field("lognormal:1024:0.8", description="synthetic: prompt length distribution")
    output_len: str | None = Field(
        None, description=f"synthetic: output length distribution ({SYNTHETIC_OUTPUT_LEN}; shared-prefix: "
                          f"{SHARED_OUTPUT_LEN})")
    tenants: int = Field(SHARED_TENANTS, ge=1, description="shared-prefix: tenants, one system prompt each")
    system_len: int = Field(SHARED_SYSTEM_LEN, ge=512, description="shared-prefix: system prompt tokens (x512)")
    question_len: int = Field(SHARED_QUESTION_LEN, ge=1, description="shared-prefix: question tokens")
    questions: int | None = Field(None, ge=1, description="shared-prefix: questions per tenant (None: one a request)")
    max_context: int | None = Field(None, ge=2, description="cap prompt + output at this many tokens")
    seed: int = Field(0, ge=0, description="seed of arrivals, lengths and prompt token ids")
    vocab_size: int = Field(DEFAULT_VOCAB, ge=17, description="prompt token ids lie in [16, vocab_size)")
    slo_ttft_ms: float | None = Field(None, gt=0, description="time-to-first-token SLO")
    slo_tpot_ms: float | None = Field(None, gt=0, description="time-per-output-token SLO")
    request_timeout_s: float = Field(600.0, gt=0, description="a request gives up after this long")
    priority_mix: dict[str, float] | None = Field(
        None, description="share of requests per priority band (critical, sheddable; the rest standard), sent "
                          "as x-headrace-priority; None: no header")

    def scaled(self, factor: float) -> LlmLoadSpec:
        """The same run with its load multiplied by ``factor``."""
        if self.workload in TRACES:
            return self.model_copy(update={"rate_scale": self.rate_scale * factor})
        return self.model_copy(update={"rate": self.rate * factor})

    @property
    def load(self) -> float:
        """The factor a search scales: the trace's rate scale, or the synthetic rate."""
        return self.rate_scale if self.workload in TRACES else self.rate


def build_workload(spec: LlmLoadSpec) -> Workload:
    """The requests of a run. Raises ValueError (TraceError included) on bad input."""
    if spec.workload in TRACES:
        if spec.duration_s is None and spec.requests is None:
            raise ValueError("a trace replay needs --duration or --requests (a window of the trace)")
        rows = window(read_trace(spec.workload, spec.traces_dir), spec.start_s, spec.duration_s,
                      spec.requests, spec.rate_scale)
    elif spec.workload == "shared-prefix":
        if spec.duration_s is None and spec.requests is None:
            raise ValueError("a synthetic workload needs --duration or --requests")
        rows = shared_prefix("poisson", spec.rate, spec.cv, spec.duration_s, spec.requests,
                             parse_length(spec.output_len or str(SHARED_OUTPUT_LEN), "output", spec.traces_dir),
                             spec.seed, spec.tenants, spec.system_len, spec.question_len, spec.questions)
    else:
        if spec.duration_s is None and spec.requests is None:
            raise ValueError("a synthetic workload needs --duration or --requests")
        rows = synthetic(spec.workload, spec.rate, spec.cv, spec.duration_s, spec.requests,
                         parse_length(spec.input_len, "input", spec.traces_dir),
                         parse_length(spec.output_len or SYNTHETIC_OUTPUT_LEN, "output", spec.traces_dir), spec.seed)
    return Workload(spec.workload, cap_context(rows, spec.max_context), spec.seed, spec.vocab_size)


def target_of(spec: LlmLoadSpec, api_key: str | None = None) -> Target:
    return Target(spec.url, spec.model, spec.api, spec.slo_ttft_ms, spec.slo_tpot_ms, api_key,
                  spec.request_timeout_s, spec.priority_mix)


@dataclass(frozen=True)
class LlmRun:
    spec: LlmLoadSpec
    outcomes: list[Outcome]
    summary: dict[str, Any]


async def run_llm_load(spec: LlmLoadSpec, api_key: str | None = None,
                       on_progress: ProgressFn | None = None, work: Workload | None = None) -> LlmRun:
    """Build the workload (unless given), drive it open loop, summarize."""
    work = work if work is not None else build_workload(spec)
    outcomes, elapsed = await drive(work, target_of(spec, api_key), on_progress)
    s = summarize(outcomes, elapsed, spec.slo_ttft_ms, spec.slo_tpot_ms)
    s["workload"] = spec.workload
    s["load"] = spec.load
    return LlmRun(spec, outcomes, s)


@dataclass(frozen=True)
class GoodputSearch:
    target: float  # share of requests that must meet both SLOs
    runs: list[LlmRun]  # in the order run
    best: LlmRun | None  # the highest load that passed

    def rows(self) -> list[dict[str, Any]]:
        return sorted((r.summary | {"passed": passes(r, self.target)} for r in self.runs), key=lambda s: s["load"])


def passes(run: LlmRun, target: float) -> bool:
    att = run.summary["attainment"]
    return att is not None and att >= target


async def find_max_goodput(spec: LlmLoadSpec, lo: float, hi: float, target: float = 0.9, steps: int = 3,
                           api_key: str | None = None, on_run: Any = None) -> GoodputSearch:
    """The highest load factor in [lo, hi] (times ``spec``'s own load) at which ``target`` of the
    requests meet both SLOs: both ends, then ``steps`` bisections."""
    if spec.slo_ttft_ms is None and spec.slo_tpot_ms is None:
        raise ValueError("a goodput search needs --slo-ttft-ms and/or --slo-tpot-ms")
    if not 0 < lo < hi:
        raise ValueError(f"search range {lo:g}:{hi:g}: want 0 < LO < HI")
    if not 0 < target <= 1:
        raise ValueError(f"target attainment {target:g}: want a share in (0, 1]")
    runs: list[LlmRun] = []

    async def at(factor: float) -> LlmRun:
        r = await run_llm_load(spec.scaled(factor), api_key)
        runs.append(r)
        if on_run is not None:
            on_run(r, passes(r, target))
        return r

    best = None
    low = await at(lo)
    if passes(low, target):
        best = low
        high = await at(hi)
        if passes(high, target):
            best = high
        else:
            good, bad = lo, hi
            for _ in range(steps):
                mid = (good + bad) / 2
                r = await at(mid)
                if passes(r, target):
                    good, best = mid, r
                else:
                    bad = mid
    return GoodputSearch(target, runs, best)


def run_record(spec: LlmLoadSpec, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings and provenance a JSON report carries."""
    return {"spec": spec.model_dump(mode="json"), **(extra or {}), "headrace": headrace_version(),
            "host": host_facts()}
