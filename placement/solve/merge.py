"""Fewer, larger MPS clients where they serve more.

A solver may put several replicas of one variant on one MPS slice at small shares (eight 1/8
shares, say), where fewer replicas at larger shares serve more: a small share pays the MPS
interference on every batch and runs smaller batches. After either method, two replicas of one
variant at one share on one slice become one at twice the share whenever its capacity at the
model's SLO is more than theirs together, repeatedly (eight 1/8 can become one whole slice),
as long as the model keeps its ``min_count`` replicas in all. Capacity only grows, so every demand
the plan covered stays covered; the slices' shares and memory are unchanged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from placement.plan import Demand, GpuPlan, Replica, SlicePlan
from placement.solve.capacity import replica_capacity
from profiles.profile import ProfileSet


def merge_shares(gpus: Sequence[GpuPlan], demands: Sequence[Demand], profiles: ProfileSet
                 ) -> tuple[tuple[GpuPlan, ...], int]:
    """(the GPUs with same-variant MPS replicas merged where that serves more, merges made)."""
    by_model = {d.model: d for d in demands}
    count = Counter(r.model for g in gpus for s in g.slices for r in s.replicas)
    merges = 0
    out = []
    for g in gpus:
        slices = []
        for s in g.slices:
            if not s.mps or len(s.replicas) < 2:
                slices.append(s)
                continue
            reps, n = _merge_slice(list(s.replicas), g.gpu, s, by_model, count, profiles)
            merges += n
            slices.append(replace(s, replicas=tuple(reps)) if n else s)
        out.append(replace(g, slices=tuple(slices)) if slices != list(g.slices) else g)
    return tuple(out), merges


def _merge_slice(reps: list[Replica], gpu: str, s: SlicePlan, by_model: dict[str, Demand],
                 count: Counter, profiles: ProfileSet) -> tuple[list[Replica], int]:
    merges = 0
    while True:
        pair = _best_pair(reps, gpu, s, by_model, count, profiles)
        if pair is None:
            return reps, merges
        i, j, merged = pair
        reps = [*reps[:i], merged, *reps[i + 1:j], *reps[j + 1:]]
        count[merged.model] -= 1
        merges += 1


def _best_pair(reps: list[Replica], gpu: str, s: SlicePlan, by_model: dict[str, Demand], count: Counter,
               profiles: ProfileSet) -> tuple[int, int, Replica] | None:
    """The first pair (smallest share first) whose merge serves more, with the merged replica."""
    for i, a in sorted(enumerate(reps), key=lambda ir: ir[1].share):
        d = by_model.get(a.model)
        if d is None or 2 * a.share > 1.0 or count[a.model] - 1 < d.count_floor:
            continue
        for j in range(i + 1, len(reps)):
            b = reps[j]
            if (b.model, b.variant, b.share, b.revision) != (a.model, a.variant, a.share, a.revision):
                continue
            cap = replica_capacity(profiles.get(a.variant, gpu, s.profile), d.slo, 2 * a.share)
            if cap is not None and cap.rate > a.capacity + b.capacity:
                return i, j, replace(a, share=2 * a.share, max_batch=cap.max_batch, capacity=cap.rate)
    return None
