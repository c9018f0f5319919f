"""Replica counts and layouts made concrete: GPUs with slices at explicit placements, MPS shares
packed first-fit decreasing."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from placement.plan import Demand, GpuPlan, Inventory, Replica, SlicePlan
from placement.solve.candidates import Candidate, LayoutOption, SolverError
from profiles.catalogue import WHOLE, Instance
from profiles.profile import ProfileSet


def pack(demands: Sequence[Demand], inv: Inventory, profiles: ProfileSet,
         chosen: dict[int, int], cands: list[Candidate],
         gpu_layouts: dict[int, list[LayoutOption]]) -> tuple[GpuPlan, ...]:
    """Turn replica counts (candidate index -> count) and layouts per class into GPUs with
    slices at explicit placements, MPS shares packed first-fit decreasing."""
    gpus: list[GpuPlan] = []
    for ci, c in enumerate(inv.classes):
        opts = gpu_layouts.get(ci, [])
        if len(opts) > len(c.ids):
            raise SolverError(f"class {c.key}: plan needs {len(opts)} GPUs, the pool has {len(c.ids)}")
        # bins: every slice of every GPU of this class, grouped by kind
        bins: dict[str, list[list]] = defaultdict(list)  # kind -> [gpu_idx, instance, fill, replicas]
        for gi, lo in enumerate(opts):
            insts = lo.layout or (Instance(-1, WHOLE),)
            for inst in insts:
                bins[inst.profile].append([gi, inst, 0.0, []])
        items = sorted(((cands[j], n) for j, n in chosen.items() if cands[j].cls == ci and n > 0),
                       key=lambda t: (-t[0].share, demands[t[0].model].model, t[0].profile.variant))
        for cand, n in items:
            for _ in range(n):
                slot = next((b for b in bins[cand.slice] if b[2] + cand.share <= 1.0 + 1e-9), None)
                if slot is None:
                    raise SolverError(f"class {c.key}: no room left on a {cand.slice} slice for "
                                      f"{cand.profile.variant} at {cand.share:.0%}")
                slot[2] += cand.share
                slot[3].append(Replica(demands[cand.model].model, cand.profile.variant, cand.share,
                                       cand.cap.max_batch, cand.cap.rate))
        per_gpu: dict[int, list[SlicePlan]] = defaultdict(list)
        for kind_bins in bins.values():
            for gi, inst, _fill, reps in kind_bins:
                if reps:
                    mps = len(reps) > 1 or reps[0].share < 1.0
                    start = None if inst.profile == WHOLE else inst.start
                    per_gpu[gi].append(SlicePlan(inst.profile, start, mps, tuple(reps)))
        for gi, lo in enumerate(opts):
            if per_gpu.get(gi):
                sl = tuple(sorted(per_gpu[gi], key=lambda s: (s.start or 0)))
                gpus.append(GpuPlan(c.ids[gi], c.gpu, bool(lo.layout), sl))
    return tuple(gpus)
