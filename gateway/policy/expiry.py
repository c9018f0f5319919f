"""When queued requests expire, so that the scheduler answers them at once.

The deadline-aware policies expire a request once no replica can still finish it alone in
time (:func:`best_alone`, :func:`next_infeasible`; the rule is in
:mod:`gateway.policy.scheduler`). The batchers that are not deadline-aware (``take-all``,
``aimd``) expire only by queue timeouts (:func:`timed_out`, :func:`next_timeout`):

Triton's queue policy (``ModelQueuePolicy`` in triton-inference-server/common
``protobuf/model_config.proto``; applied by ``PriorityQueue::PolicyQueue`` in
triton-inference-server/core ``src/scheduler_utils.cc``) gives each queued request a timeout,
``default_timeout_microseconds`` or, with ``allow_timeout_override``, the request's own
``timeout`` parameter when that is smaller, and with ``timeout_action: REJECT`` rejects a request
still queued past it. ``queue_timeout_s`` is the default; ``request_timeouts`` makes a request's
own timeout count, which is its deadline: the load generator sends each request's SLO as its
``timeout`` (:func:`loadgen.payload.parameters`). Clipper's model queue drops a request whose
deadline has passed the same way (``ModelQueue::remove_tasks_with_elapsed_deadlines`` in
ucbrise/clipper ``src/libclipper/include/clipper/task_executor.hpp``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway.policy.edf import EdfQueue
from gateway.policy.replica import Replica


def timed_out(queue: EdfQueue, now: float, timeout: float | None, own: bool) -> list[int]:
    """Indices of the queued requests that have timed out at ``now``: queued longer than
    ``timeout`` seconds, or (``own``) at or past their own deadline, when no batch can answer
    them in time any more."""
    n = queue.index_after(now) if own else 0  # EDF order: the requests past their deadline lead
    if timeout is None:
        return list(range(n))
    return [i for i, r in enumerate(queue) if i < n or now - r.arrival > timeout]


def next_timeout(queues: tuple[EdfQueue, ...], timeout: float | None, own: bool, eps: float) -> float:
    """When the first queued request will time out (inf: none will). A request times out
    strictly after ``timeout`` (so ``eps`` past it) and at its deadline."""
    t = float("inf")
    for q in queues:
        if not len(q):
            continue
        if own and q[0].deadline < t:
            t = q[0].deadline
        if timeout is not None:
            oldest = min(r.arrival for r in q)
            if oldest + timeout + eps < t:
                t = oldest + timeout + eps
    return t


def best_alone(healthy: Sequence[Replica], now: float) -> Callable[[int], float]:
    """finish(size): earliest predicted finish of a lone request of ``size`` rows."""
    starts = [(r.start(now), r) for r in healthy]
    cache: dict[int, float] = {}

    def finish(size: int) -> float:
        if size not in cache:
            cache[size] = min((s + r.latency(size) for s, r in starts if r.info.max_batch >= size),
                              default=float("inf"))
        return cache[size]

    return finish


def next_infeasible(queues: tuple[EdfQueue, ...], healthy: Sequence[Replica], now: float, eps: float) -> float:
    """Earliest time a queued request turns infeasible if nothing else happens (deadline-aware
    policies): ``eps`` after the latest start of its run on the quickest replica that takes it."""
    best = float("inf")
    shortest: dict[int, float | None] = {}  # rows -> the quickest eligible replica's seconds
    for queue in queues:
        if not len(queue):
            continue
        longest = 0.0  # NOTE: loops, not max()/min() over generators: on every poll with a queue
        for rep in healthy:
            t = rep.latency(min(queue.max_size, rep.info.max_batch))
            if t > longest:
                longest = t
        for r in queue:
            d = r.deadline
            if d - longest >= best:
                break  # later deadlines cannot turn infeasible sooner
            size = r.size
            if size in shortest:
                t = shortest[size]
            else:
                t = None
                for rep in healthy:
                    if rep.info.max_batch >= size:
                        x = rep.latency(size)
                        if t is None or x < t:
                            t = x
                shortest[size] = t
            # NOTE: the latest start over replicas is the deadline less the shortest run
            # (subtraction is monotone, so this is exactly the max over replicas)
            last_start = now if t is None else d - t
            if last_start >= now and last_start + eps < best:
                best = last_start + eps
    return best
