"""Where admitted requests go when their variant stops serving (its last replica is drained
or removed): by the rule a new request meets at submit, without admission's refusals.

A request moves to the first variant in :func:`gateway.policy.selector.candidate_order`
(respecting its constraints and its model's objective) whose plan finishes it by its deadline; when none does, to
the one predicted to finish it earliest, where it expires through the normal path. A request
no variant can take (accuracy floor, rows over every max batch) has no destination.

Pure: the caller passes the variants' plans and queues as functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from gateway.policy.selector import Level, VariantInfo, candidate_order
from gateway.policy.types import Objective, Priority, Request


def destination(request: Request, variants: Sequence[VariantInfo], level: Level,
                fits: Callable[[str], bool], plan: Callable[[str], float] | None,
                objective: Objective = "accuracy") -> str | None:
    """The variant ``request`` moves to, or None. ``fits(v)``: its rows fit a replica of ``v``;
    ``plan(v)``: its predicted finish if it joins ``v`` (None: the policy ignores deadlines,
    the first candidate that fits takes it)."""
    order = [v for v in candidate_order(variants, request.accuracy_floor, level, objective=objective,
                                        max_cost=request.max_cost, pin=request.variant,
                                        cheapest=request.priority == Priority.BEST_EFFORT) if fits(v)]
    if not order or plan is None:
        return order[0] if order else None
    best, earliest = order[0], float("inf")
    for v in order:
        finish = plan(v)
        if finish <= request.deadline:
            return v
        if finish < earliest:
            best, earliest = v, finish
    return best


def relocate(requests: Iterable[Request], variants: Sequence[VariantInfo], level: Level, *,
             fits: Callable[[str, Request], bool], plan: Callable[[str, Request], float] | None,
             push: Callable[[str, Request], None], objective: Objective = "accuracy") -> list[Request]:
    """``push`` each request, in the given order, to its :func:`destination` (so each plan
    counts the requests moved before it); return those without one."""
    left = []
    for r in requests:
        v = destination(r, variants, level, lambda v, r=r: fits(v, r),
                        None if plan is None else (lambda v, r=r: plan(v, r)), objective)
        if v is None:
            left.append(r)
        else:
            push(v, r)
    return left
