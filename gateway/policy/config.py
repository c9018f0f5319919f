"""Scheduler configuration, validated at the edge (pydantic): every knob is bounded and says
what it does. Inside the core the validated object is only read."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class SchedulerConfig(BaseModel):
    """How the EDF scheduler forms batches, waits, admits and rejects."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str = Field(
        default="adaptive",
        min_length=1,
        description="batch-selection policy, a key of gateway.policy.batching.POLICIES",
    )
    quantile: Literal["p50", "p99"] = Field(
        default="p99", description="profile latency quantile used to predict batch completion"
    )
    admission: Literal["plan", "protect", "burst", "alone"] = Field(
        default="burst",
        description="deadline-aware policies reject at submit a request predicted to miss its "
        "deadline: 'plan' counts the rows queued ahead of it in EDF order (answers early), "
        "'protect' also refuses a request whose admission would push an admitted request past "
        "its deadline in that plan (rejects at arrival instead of skipping heads later); "
        "'burst' is 'plan', and 'protect' while the model's arrivals over the last "
        "burst_window_s exceed burst_factor times its replicas' capacity; "
        "'alone' only asks whether it could finish alone on the replica that starts first "
        "(leaves the choice to the batcher; more goodput under overload, later rejects)",
    )
    burst_window_s: float = Field(
        default=0.05, gt=0.0, le=1.0,
        description="admission 'burst': seconds of arrivals that tell a burst from steady load",
    )
    burst_factor: float = Field(
        default=1.5, gt=0.0, le=10.0,
        description="admission 'burst': arrivals over the window above this multiple of the "
        "replicas' capacity are a burst",
    )
    wait: bool = Field(
        default=False,
        description="let a free replica wait for a larger batch when the observed arrival rate "
        "needs it and the earliest deadline leaves slack (deadline-aware policies)",
    )
    headroom: float = Field(
        default=0.1,
        ge=0.0,
        le=2.0,
        description="fraction above the observed arrival rate the chosen batch size must sustain",
    )
    rate_window_s: float = Field(
        default=1.0, gt=0.0, le=60.0, description="seconds of submits the arrival-rate estimate looks back"
    )
    min_retry_after_s: float = Field(
        default=0.01, ge=0.0, le=60.0, description="least Retry-After given with an infeasible/shed reject"
    )
    no_replica_retry_after_s: float = Field(
        default=1.0, ge=0.0, le=600.0, description="Retry-After given when no healthy replica serves the model"
    )
    variant_dwell_s: float = Field(
        default=2.0, ge=0.0, le=600.0, description="least seconds between two variant-level moves"
    )
    learn_overhead: bool = Field(
        default=True,
        description="learn, per replica, from completions: how much longer than its profile a batch "
        "runs on the replica (from back-to-back completions) and how long its answers then take to "
        "come back (network, Triton, the driver's own loop); plan the replica's timeline with the "
        "first and deadlines with both",
    )
    overhead_quantile: float = Field(
        default=0.9, gt=0.0, lt=1.0,
        description="quantile of the observed answer delay the scheduler plans deadlines with",
    )
    overhead_step_s: float = Field(
        default=2e-4, gt=0.0, le=0.01,
        description="step of the online quantile estimate per completed batch (seconds)",
    )
    max_overhead_s: float = Field(
        default=0.05, ge=0.0, le=10.0, description="cap on the learned per-batch overhead (seconds)",
    )
    pipeline_lead_s: float = Field(
        default=0.003, ge=0.0, le=1.0,
        description="with max_inflight > 1: send a replica its next batch this long before the "
        "batch in flight is predicted to finish, so the round trip to Triton overlaps the "
        "running batch while the batch still forms from the latest arrivals",
    )
    max_queue_delay_s: float = Field(
        default=0.0,
        ge=0.0,
        le=10.0,
        description="triton policy only: wait up to this long after the oldest request arrives "
        "for a full batch (Triton's max_queue_delay_microseconds)",
    )
    queue_timeout_s: float | None = Field(
        default=None,
        gt=0.0,
        le=600.0,
        description="policies that are not deadline-aware (take-all, aimd): reject requests queued "
        "longer than this (Triton's queue policy default_timeout_microseconds with REJECT); None "
        "keeps them",
    )
    request_timeouts: bool = Field(
        default=False,
        description="policies that are not deadline-aware (take-all, aimd): also reject a queued "
        "request once its own timeout passes, which is its deadline (arrival plus SLO: the SLO is "
        "the timeout each request carries, as the load generator sends it to Triton). Triton's "
        "queue policy with timeout_action REJECT and allow_timeout_override true (there a request's "
        "timeout counts only below a nonzero default_timeout_microseconds: set one above every SLO); "
        "Clipper's model queue likewise drops a request whose deadline has passed",
    )

    @model_validator(mode="after")
    def _burst_within_rate_window(self) -> SchedulerConfig:
        # the burst is read from the arrivals the rate estimate keeps: its window at most
        if self.admission == "burst" and self.burst_window_s > self.rate_window_s:
            raise ValueError(f"burst_window_s ({self.burst_window_s}) must not exceed "
                             f"rate_window_s ({self.rate_window_s})")
        return self

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        from gateway.policy.batching import POLICIES

        if v not in POLICIES:
            raise ValueError(f"unknown policy {v!r}; known: {', '.join(sorted(POLICIES))}")
        return v
