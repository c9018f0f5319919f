"""What the solver chooses from: candidates (a variant of a model on a slice kind of a GPU class
at an MPS share, with its capacity at the model's SLO) and the layouts a GPU class can take.

Capacities come from :class:`placement.solve.capacity.CurveCapacity`, memoised by latency curve: a
fleet's copies of a few families share a few curves, however many models it serves.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from placement.plan import Demand, GpuClass, Inventory
from placement.solve.capacity import Capacity, CurveCapacity, legal_shares
from profiles.catalogue import WHOLE, Layout, gpu_model, layouts
from profiles.profile import Profile, ProfileSet


class SolverError(ValueError):
    """No plan exists (or none was found in time); the message says which model or GPU class."""


class MilpTimeout(SolverError):
    """The MILP hit its time limit before finding any integer solution."""


@dataclass(frozen=True)
class Candidate:
    model: int  # index into demands
    profile: Profile
    cls: int  # index into inventory.classes
    slice: str
    share: float
    cap: Capacity
    gpu_fraction: float  # share x the slice's fraction of its GPU

    @property
    def accuracy(self) -> float:
        return self.profile.accuracy if self.profile.accuracy is not None else -1.0


@dataclass(frozen=True)
class Options:
    """What a solve may use (the baselines switch features off)."""

    mig: bool = True
    mps: bool = True
    whole: bool = True  # whole GPUs without MIG


DEFAULT = Options()


@dataclass(frozen=True)
class LayoutOption:
    layout: Layout  # () for a whole GPU
    counts: tuple[tuple[str, int], ...]  # slice kind -> count


@dataclass(frozen=True)
class Start:
    """A known plan as program values: replicas per candidate index, GPUs per layout option."""

    chosen: dict[int, int]
    layouts: dict[int, list[LayoutOption]]


def layout_options(c: GpuClass, opts: Options) -> list[LayoutOption]:
    """Distinct slice-count vectors a GPU of class c can take (one representative layout each)."""
    out: dict[tuple, LayoutOption] = {}
    if opts.whole or not (c.mig and opts.mig):
        out[((WHOLE, 1),)] = LayoutOption((), ((WHOLE, 1),))
    if c.mig and opts.mig:
        for lay in layouts(c.gpu, with_double_memory_1g=True):
            cnt: dict[str, int] = defaultdict(int)
            for inst in lay:
                cnt[inst.profile] += 1
            key = tuple(sorted(cnt.items()))
            out.setdefault(key, LayoutOption(lay, key))
    return list(out.values())


def _slice_kinds(c: GpuClass, opts: Options) -> tuple[str, ...]:
    g = gpu_model(c.gpu)
    kinds = [WHOLE] if opts.whole or not (c.mig and opts.mig) else []
    if c.mig and opts.mig:
        kinds += [p.name for p in g.profiles]
    return tuple(kinds)


def candidates(demands: Sequence[Demand], profiles: ProfileSet, inv: Inventory,
               opts: Options = DEFAULT) -> list[Candidate]:
    """Every useful (model, variant, class, slice kind, share), dominated ones pruned: per
    (model, class, slice, share) a variant is kept only if no kept one has both more capacity
    and at least its accuracy; then per (model, class, slice) a candidate is dropped when one
    of variant accuracy as good or better takes no more share and serves at least as much of
    the model's requirement (capacity beyond it serves nothing): it can never be the better
    pick. Candidates are built only for what survives both."""
    out: list[Candidate] = []
    curves = CurveCapacity()
    # by SLO, then curve (points, interference, max batch), then share: a capacity or None
    caps: dict[float, dict[tuple, dict[float, Capacity | None]]] = {}
    kinds = []  # per class: (class index, [(slice kind, memory MB, fraction, shares)])
    for ci, c in enumerate(inv.classes):
        g = gpu_model(c.gpu)
        kinds.append((ci, c.gpu, [(k, g.slice_memory_gb(k) * 1024.0, g.slice_fraction(k),
                                   legal_shares(g, k, c.mps and opts.mps)) for k in _slice_kinds(c, opts)]))
    for mi, d in enumerate(demands):
        req, slo = d.required, d.slo
        at_slo = caps.setdefault(slo, {})
        # per (GPU, slice kind): each allowed profile, its accuracy, memory and capacities by share
        by_slice: dict[tuple[str, str], list[tuple[Profile, float, float, dict[float, Capacity | None]]]] = \
            defaultdict(list)
        for p in profiles.find(model=d.model):
            if d.allows(p):
                by_slice[(p.gpu, p.slice)].append((p, p.accuracy if p.accuracy is not None else -1.0, p.memory_mb,
                                                   at_slo.setdefault((id(p.points), p.mps_interference,
                                                                      p.max_batch), {})))
        for ci, gpu, slices in kinds:
            for k, memory_mb, frac, shares in slices:
                profs = by_slice.get((gpu, k))
                if not profs:
                    continue
                kept: list[tuple[float, float, float, Profile, Capacity]] = []  # share, served, accuracy
                for share in shares:
                    room = memory_mb * share
                    # by capacity, then accuracy, both descending (ties in the profiles' order)
                    group: list[tuple[float, float, int, Profile, Capacity]] = []
                    for i, (p, acc, memory, by_share) in enumerate(profs):
                        if memory > room:
                            continue
                        cap = by_share.get(share, False)
                        if cap is False:
                            cap = by_share[share] = curves.capacity(p, slo, share)
                        if cap is not None:
                            group.append((-cap.rate, -acc, i, p, cap))
                    group.sort()
                    best_acc = -2.0
                    for _, neg_acc, _, p, cap in group:
                        if -neg_acc > best_acc:
                            kept.append((share, min(cap.rate, req), -neg_acc, p, cap))
                            best_acc = -neg_acc
                for share, rate, acc, p, cap in kept:
                    for s, r, a, _, _ in kept:
                        if s <= share and r >= rate and a >= acc and (s < share or r > rate or a > acc):
                            break  # dominated
                    else:
                        out.append(Candidate(mi, p, ci, k, share, cap, share * frac))
    return out


def check_coverable(demands: Sequence[Demand], cands: list[Candidate]) -> None:
    have = {c.model for c in cands}
    for mi, d in enumerate(demands):
        if mi not in have and d.required > 0:
            raise SolverError(
                f"model {d.model}: no allowed variant meets SLO {d.slo * 1e3:g} ms on any slice of the "
                f"pool (variants {list(d.variants) or 'any'}, accuracy floor {d.accuracy_floor})")


