"""Autoscaling policy: decides when a deployment's planned request rate should change.

Hysteresis: scale up when the observed rate stays above the planned rate for ``upscale_delay_s``,
down when it stays below ``planned x downscale_below`` for ``downscale_delay_s``. The new planned
rate is ``max observed / target_utilization``, which sits inside that band, so a steady load never flaps.
The settings are the deployment's ``autoscaling:`` (:class:`profiles.schema.AutoscalingSpec`).
An idle deployment scales down to a planned rate of 0, which the planner serves with one replica
(:data:`placement.plan.KEEP_SERVED`), or ``min_replicas`` on distinct GPUs, or none at
``min_replicas`` 0 (scale to zero: the gateway holds the next request and the operator starts a
replica for it, :mod:`gateway.coldstart`); the first observation above 0 starts an upscale run. Given the deployment's running ``replicas``, the policy never
scales down below its floor: a deployment already at ``min_replicas`` holds there quietly (a
re-plan could release nothing: the planner keeps a floor's replicas, :mod:`placement.solve.floors`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from profiles.schema import AutoscalingSpec

Direction = Literal["up", "down"]


@dataclass(frozen=True)
class AutoscaleState:
    """What the policy remembers about one deployment between calls to :func:`step`."""

    planned_rate: float
    """The rate the current plan was made for."""

    last_seen: float
    """``now`` of the latest observation (or of :func:`initial`). Time never goes back."""

    run: Direction | None = None
    """Which side of the band the observed rate has been on since ``run_since``. None = inside."""

    run_since: float | None = None
    """The first observation of the current run above (``up``) or below (``down``) the band."""

    run_max: float = 0.0
    """The largest rate observed during the current run (after its first ``window_s`` once
    there are observations from then: see :func:`step`)."""

    last_event: Direction | None = None
    """The direction of the latest scale event. None = no event yet."""

    last_event_at: float | None = None
    """When the latest scale event happened."""

    run_settled: bool = False
    """Whether ``run_max`` comes from observations at least ``window_s`` into the run."""


@dataclass(frozen=True)
class ScaleDecision:
    """What :func:`step` tells the operator. On ``up`` or ``down``, re-plan for ``rate``."""

    direction: Direction | None
    """``up`` or ``down`` to re-plan. None = keep the current plan."""

    rate: float
    """The new planned rate on an event. Otherwise the current planned rate."""

    reason: str
    """One line that quotes the numbers behind the decision."""

    min_replicas: int = 1
    """Passed on from the spec for the planner."""

    max_replicas: int | None = None
    """Passed on from the spec for the planner. None = unbounded."""


def initial(planned_rate: float, now: float) -> AutoscaleState:
    """The state of a deployment that has just been planned for ``planned_rate`` at ``now``."""
    if not (math.isfinite(planned_rate) and planned_rate >= 0):
        raise ValueError(f"planned_rate ({planned_rate}) must be a finite number >= 0")
    if not math.isfinite(now):
        raise ValueError(f"now ({now}) must be finite")
    return AutoscaleState(planned_rate=float(planned_rate), last_seen=float(now))


def _r(x: float) -> str:
    """A rate or time for a reason string: at most one decimal, no trailing zeros."""
    s = f"{x:.1f}"
    return s[:-2] if s.endswith(".0") else s


def step(spec: AutoscalingSpec, state: AutoscaleState, observed_rate: float, now: float, *,
         window_s: float = 0.0, replicas: int | None = None) -> tuple[ScaleDecision, AutoscaleState]:
    """Take one observation of a deployment's request rate at ``now``. Return the decision and the new state.

    ``window_s``: the observed rate is a mean over this many seconds, so a run's first
    ``window_s`` still mixes in the load from before it began: those observations count toward
    its max only until a later one comes (the new planned rate follows the level, not the
    transition). ``replicas``: how many replicas the deployment runs now (None: unknown); at or
    below ``min_replicas`` a downscale holds. The function is pure. The operator and the
    simulator both call it every few (real or virtual) seconds.
    """
    if not (math.isfinite(window_s) and window_s >= 0):
        raise ValueError(f"window_s ({window_s}) must be a finite number >= 0")
    if not (math.isfinite(observed_rate) and observed_rate >= 0):
        raise ValueError(f"observed_rate ({observed_rate}) must be a finite number >= 0")
    if not (math.isfinite(now) and now >= state.last_seen):
        raise ValueError(f"now ({now}) must be finite and not before the last observation ({state.last_seen})")

    planned = state.planned_rate
    down_at = planned * spec.downscale_below

    def hold(reason: str, new_state: AutoscaleState) -> tuple[ScaleDecision, AutoscaleState]:
        return ScaleDecision(None, planned, reason, spec.min_replicas, spec.max_replicas), new_state

    if observed_rate > planned:
        side: Direction = "up"
        delay, name = spec.upscale_delay_s, "upscale_delay_s"
        where = f"observed {_r(observed_rate)} req/s > planned {_r(planned)} req/s"
    elif observed_rate < down_at:
        side = "down"
        delay, name = spec.downscale_delay_s, "downscale_delay_s"
        where = (f"observed {_r(observed_rate)} req/s < {_r(down_at)} req/s "
                 f"(planned {_r(planned)} x downscale_below {spec.downscale_below:g})")
    else:
        return hold(
            f"observed {_r(observed_rate)} req/s within [{_r(down_at)}, {_r(planned)}] req/s",
            AutoscaleState(planned, now, last_event=state.last_event, last_event_at=state.last_event_at))

    # A run continues only while every observation stays on the same side of the band.
    if state.run == side and state.run_since is not None:
        since = state.run_since
        settled = now - since >= window_s
        if settled and not state.run_settled:
            run_max = observed_rate  # the first observation free of the load before the run
        else:
            run_max = max(state.run_max, observed_rate)
    else:
        since, run_max, settled = now, observed_rate, window_s <= 0
    running = AutoscaleState(planned, now, side, since, run_max, state.last_event, state.last_event_at,
                             run_settled=settled)
    elapsed = now - since
    if elapsed < delay:
        return hold(f"{where} for {elapsed:.1f} s of {_r(delay)} s ({name})", running)
    if side == "down" and replicas is not None and replicas <= spec.min_replicas:
        return hold(f"{where} for {elapsed:.1f} s, but the deployment is at its floor: {replicas} "
                    f"replica{'s' if replicas != 1 else ''} (min_replicas {spec.min_replicas})", running)

    if (state.last_event is not None and state.last_event != side and state.last_event_at is not None
            and now - state.last_event_at < spec.cooldown):
        return hold(f"{where} for {elapsed:.1f} s, but the last event ({state.last_event}) was "
                    f"{now - state.last_event_at:.1f} s ago (cooldown {_r(spec.cooldown)} s)", running)

    target = run_max / spec.target_utilization
    new_rate = max(target, spec.min_rate or 0.0)
    how = (f"max {_r(run_max)} / target_utilization {spec.target_utilization:g}"
           + (f", raised to min_rate {_r(new_rate)}" if new_rate > target else ""))
    if side == "down" and new_rate >= planned:
        return hold(f"{where} for {elapsed:.1f} s, but the planned rate is at min_rate "
                    f"{_r(spec.min_rate or 0.0)} req/s", running)

    decision = ScaleDecision(
        side, new_rate, f"{where} for {elapsed:.1f} s ({name} {_r(delay)}); "
        f"planning {_r(new_rate)} req/s = {how}", spec.min_replicas, spec.max_replicas)
    return decision, AutoscaleState(new_rate, now, last_event=side, last_event_at=now)
