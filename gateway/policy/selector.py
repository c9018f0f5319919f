"""Variant selection: which variant's queue a request joins.

A served model may run several variants (e.g. a large and a small ResNet) on its replicas.
Among the variants whose accuracy meets the request's floor, the request joins the most
accurate one predicted to meet its deadline given that variant's queue. Under sustained
overload the model's *level* moves down to cheaper variants first, and moves back when load
falls, with hysteresis (two thresholds and a dwell time) so it does not flap.

Pure functions; the level is state in, state out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class VariantInfo:
    name: str
    accuracy: float | None  # None: unknown, never meets an accuracy floor
    capacity: float  # requests per second its healthy replicas sustain at full batches


@dataclass(frozen=True, slots=True)
class Level:
    """How many of the most accurate variants a model currently skips first."""

    skip: int = 0
    since: float = float("-inf")  # when it last changed


def by_accuracy(variants: Sequence[VariantInfo]) -> list[VariantInfo]:
    """Most accurate first; unknown accuracy last; ties by name for determinism."""
    return sorted(variants, key=lambda v: (v.accuracy is None, -(v.accuracy or 0.0), v.name))


def candidate_order(variants: Sequence[VariantInfo], floor: float | None, level: Level) -> list[str]:
    """Variants to try, in order, for a request with accuracy ``floor``: from the level's
    preferred variant down to cheaper ones, then the more accurate ones it skipped."""
    ok = [v for v in by_accuracy(variants)
          if floor is None or (v.accuracy is not None and v.accuracy >= floor)]
    skip = min(level.skip, max(0, len(ok) - 1))
    return [v.name for v in ok[skip:] + ok[:skip][::-1]]


def next_level(level: Level, variants: Sequence[VariantInfo], rate: float, now: float, *,
               high: float, low: float, dwell: float) -> Level:
    """Move down one variant when the model's arrival rate exceeds ``high`` of the preferred
    variant's capacity; move back up one when it falls below ``low`` of the capacity of the
    next more accurate variant; at most one move per ``dwell`` seconds."""
    ordered = by_accuracy(variants)
    if len(ordered) < 2 or now - level.since < dwell:
        return level
    skip = min(level.skip, len(ordered) - 1)
    if skip < len(ordered) - 1 and rate > high * ordered[skip].capacity and rate > 0:
        return Level(skip + 1, now)
    if skip > 0 and rate < low * ordered[skip - 1].capacity:
        return Level(skip - 1, now)
    return level
