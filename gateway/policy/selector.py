"""Variant selection: which variant's queue a request joins.

A served model may run several variants (e.g. a large and a small ResNet) on its replicas.
A request may constrain them: a least accuracy, a highest cost per answer, or a pin to one
variant; the variants that honour every constraint are *allowed*, and no other ever serves it.
Among the allowed variants the request tries, in the order of its model's *objective*, each
until one is predicted to meet its deadline given that variant's queue:

- ``accuracy``: most accurate first; what its queue cannot finish in time goes to the next
  variant (admission spills over, and a queued request that turns late moves), so the
  accurate variant runs full and the rest overflows. Only when the model's arrivals exceed
  what all its variants together sustain does its *level* move down (cheaper variants first:
  where variants share hardware, cheaper answers free it sooner), and it moves back when the
  rate falls below that capacity by more than the rate estimate's own noise (three standard
  deviations of a Poisson count over the estimator's window), at most once per dwell time.
- ``cost``: cheapest per answer first (INFaaS's objective), so a floor is met at least cost.
- ``infaas``: a baseline, INFaaS's variant choice (Romero et al., "INFaaS: Automated Model-less
  Inference Serving", USENIX ATC'21; its released query frontend, ``gpar_lat_acc_search``), not
  headrace's: of the variants that meet the request's accuracy floor and whose profiled latency
  meets its latency objective, the cheapest that is not overloaded; when every one is
  overloaded, the cheapest still (INFaaS serves on an overloaded variant and asks its
  autoscaler for more). Overloaded is a load signal per window, as INFaaS's worker monitor
  marks a variant each second: the variant's arrival rate over the rate window exceeds what
  its replicas sustain at full batches. No admission by prediction and no moving a queued
  request (:func:`infaas_pick`); batching is the gateway's.

Under ``accuracy`` a request takes a variant with fallbacks after it only if it is predicted
to finish there with time to spare for a fallback: the least time its fallbacks need to answer
it alone (:func:`fallback_spare`, from their replicas' latency). The accurate variant runs full,
so the last requests it admits are predicted to finish right at the deadline; with the spare
they finish that much sooner, so a plan that slips while they queue still leaves time to move
them (dispatch time), and their answers do not land at the edge of the deadline, where any
delay the gateway cannot see (the client's send, the network) makes them late. A request no
variant takes with its spare takes the first that meets the deadline at all (:func:`choose`),
so the spare never refuses one.

Best-effort requests always try the cheapest first, whatever the objective. A variant of
unknown accuracy never meets a floor; one of unknown cost never meets a cap and comes last
in cost order.

Pure functions; the level is state in, state out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.policy.types import Objective, Request


@dataclass(frozen=True, slots=True)
class VariantInfo:
    name: str
    accuracy: float | None  # None: unknown, never meets an accuracy floor
    capacity: float  # requests per second its healthy replicas sustain at full batches
    cost: float | None = None  # price of one answer (see ReplicaInfo.price_per_hour); None: unknown


@dataclass(frozen=True, slots=True)
class Level:
    """How many of the most accurate variants a model currently skips first."""

    skip: int = 0
    since: float = float("-inf")  # when it last changed


def by_accuracy(variants: Sequence[VariantInfo]) -> list[VariantInfo]:
    """Most accurate first; unknown accuracy last; ties by name for determinism."""
    return sorted(variants, key=lambda v: (v.accuracy is None, -(v.accuracy or 0.0), v.name))


def by_cost(variants: Sequence[VariantInfo]) -> list[VariantInfo]:
    """Cheapest first; unknown cost last; ties go to the more accurate, then by name."""
    return sorted(variants, key=lambda v: (v.cost is None, v.cost or 0.0, v.accuracy is None,
                                           -(v.accuracy or 0.0), v.name))


def allows(v: VariantInfo, floor: float | None, max_cost: float | None, pin: str | None) -> bool:
    """``v`` honours a request's accuracy floor, cost cap and pin."""
    return ((floor is None or (v.accuracy is not None and v.accuracy >= floor))
            and (max_cost is None or (v.cost is not None and v.cost <= max_cost))
            and (pin is None or v.name == pin))


def candidate_order(variants: Sequence[VariantInfo], floor: float | None, level: Level, *,
                    objective: Objective = "accuracy", max_cost: float | None = None, pin: str | None = None,
                    cheapest: bool = False) -> list[str]:
    """The allowed variants (:func:`allows`), in the order a request tries them: cheapest
    first under the ``cost`` and ``infaas`` objectives or with ``cheapest`` (best-effort); else
    from the level's preferred variant down to cheaper ones, then the more accurate ones it skipped."""
    ok = [v for v in variants if allows(v, floor, max_cost, pin)]
    if cheapest or objective != "accuracy":
        return [v.name for v in by_cost(ok)]
    ok = by_accuracy(ok)
    skip = min(level.skip, max(0, len(ok) - 1))
    return [v.name for v in ok[skip:] + ok[:skip][::-1]]


def fallback_spare(order: Sequence[str], alone: Callable[[str], float], *, objective: Objective = "accuracy",
                   cheapest: bool = False) -> list[float]:
    """Per variant of ``order`` (a request's candidates), the seconds it must finish the request
    before its deadline: under ``accuracy``, the least ``alone(w)`` (a lone request's predicted
    time on w's quickest replica) over the variants after it, 0 for the last; 0 for every
    variant under ``cost`` or with ``cheapest`` (those take the first feasible one as it is)."""
    out = [0.0] * len(order)
    if cheapest or objective != "accuracy":
        return out
    least = float("inf")
    for i in range(len(order) - 1, 0, -1):
        least = min(least, alone(order[i]))
        out[i - 1] = least
    return out


def choose(order: Sequence[str], plan: Callable[[str], tuple[float, bool]], deadline: float,
           spare: Sequence[float]) -> tuple[str | None, float]:
    """Admission's pick among ``order``: the first variant predicted to finish the request its
    ``spare`` seconds before ``deadline``, else the first predicted to finish by ``deadline``,
    else None; with that variant's predicted finish (None: the earliest of any).
    ``plan(v)``: the predicted finish on ``v``, and whether admission's other rules take it there."""
    first, earliest = None, float("inf")
    for v, s in zip(order, spare, strict=True):
        finish, ok = plan(v)
        if ok and finish <= deadline:
            if finish <= deadline - s:
                return v, finish
            if first is None:
                first = (v, finish)
        earliest = min(earliest, finish)
    return first if first is not None else (None, earliest)


def infaas_pick(order: Sequence[str], alone: Callable[[str], float], rate: Callable[[str], float],
                capacity: Callable[[str], float], slo: float) -> str | None:
    """INFaaS's pick among ``order`` (the allowed variants, cheapest first): the first whose
    ``alone(v)`` (a lone request's profiled time) is within ``slo`` and whose arrival ``rate(v)``
    is below its ``capacity(v)`` at full batches; else the first within ``slo``; else None.
    INFaaS checks a GPU variant's latency at its own max batch (each of its variants is built
    for one); here every variant runs the model's max batch, so the request's own size counts."""
    meets = [v for v in order if alone(v) <= slo]
    return next((v for v in meets if rate(v) < capacity(v)), meets[0] if meets else None)


def next_level(level: Level, variants: Sequence[VariantInfo], rate: float, now: float, *,
               window: float, dwell: float) -> Level:
    """Move down one variant while the model's arrival ``rate`` (estimated over ``window``
    seconds) exceeds the capacity of all its variants together; move back up one when it is
    below that capacity by more than three standard deviations of a Poisson rate estimate;
    at most one move per ``dwell`` seconds."""
    ordered = by_accuracy(variants)
    if len(ordered) < 2 or now - level.since < dwell:
        return level
    skip = min(level.skip, len(ordered) - 1)
    total = sum(v.capacity for v in ordered)
    if skip < len(ordered) - 1 and rate > total:
        return Level(skip + 1, now)
    if skip > 0 and rate < total - 3.0 * math.sqrt(max(rate, 0.0) / window):
        return Level(skip - 1, now)
    return level


def describe_constraints(r: Request) -> str:
    """The request's constraints in words (a refusal's message)."""
    parts = [f"accuracy floor {r.accuracy_floor:g}" if r.accuracy_floor is not None else "",
             f"cost cap {r.max_cost:g}" if r.max_cost is not None else "",
             f"pin to variant {r.variant!r}" if r.variant is not None else ""]
    return ", ".join(p for p in parts if p) or "the request"
