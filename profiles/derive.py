"""Derived profiles for slices and GPUs without published data, each saying how in its provenance.

A measured latency curve ``t(b)`` is split into a fixed part ``a`` (the intercept of the line
through its last two points, clamped to ``[0, t(first)]``) and a per-sample part ``t(b) - a``.
Only the per-sample part scales; the fixed part (launch overhead, framework floor) does not:

    t'(b) = max(floor, a + (t(b) - a) * r)

- Other slice of the same GPU: ``r = eff(source) / eff(target)`` with ``eff`` = compute slices,
  times 1.15 for a 3g slice of a 7-slice GPU (it holds 4/8 of memory and L2: MIGPerf's
  ResNet-50 and BERT latencies by slice, github.com/HuaizhengZhang/MIGProfiler), and for a whole GPU without MIG ``7 * SMs(gpu) / SMs(7g)`` (108/98 on an A100).
- Same slice geometry on another GPU: ``r = SMs(source slice) / SMs(target slice)`` (H100 from
  A100 by SM ratio; H200 equals H100, its extra memory bandwidth is ignored: conservative).
- ``floor`` is the source's latency at its first batch when the target is faster (the fixed
  floor does not shrink) and nothing when it is slower.
Memory, max batch, accuracy and MPS interference are kept from the source.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from profiles.catalogue import GPUS, HOST, WHOLE, GpuModel, gpu_model
from profiles.profile import LatencyPoint, Profile, ProfileSet, Provenance

THREE_G_BONUS = 1.15


def efficiency(gpu: GpuModel, slice_name: str) -> float:
    """Relative per-sample speed of a slice kind on one GPU (1g = 1)."""
    if slice_name == WHOLE:
        top = max(gpu.profiles, key=lambda p: p.compute)
        return gpu.compute_slices * gpu.sms / top.sms if top.sms else float(gpu.compute_slices)
    p = gpu.profile(slice_name)
    bonus = THREE_G_BONUS if (p.compute == 3 and gpu.compute_slices == 7) else 1.0
    return p.compute * bonus


def _fixed_part(pts: tuple[LatencyPoint, ...]) -> tuple[float, float]:
    """(fixed p50 seconds, fixed p99 seconds): intercepts of the last segment, clamped."""
    if len(pts) == 1:
        return 0.0, 0.0
    lo, hi = pts[-2], pts[-1]
    out = []
    for q in ("p50", "p99"):
        ylo, yhi = getattr(lo, q), getattr(hi, q)
        slope = (yhi - ylo) / (hi.batch - lo.batch)
        out.append(min(max(0.0, ylo - slope * lo.batch), getattr(pts[0], q)))
    return out[0], out[1]


_SCALED: dict[tuple[int, float], tuple[tuple[LatencyPoint, ...], tuple[LatencyPoint, ...]]] = {}
_SCALED_MAX = 1 << 16


def _scaled_points(points: tuple[LatencyPoint, ...], r: float) -> tuple[LatencyPoint, ...]:
    """``points`` with the per-sample part times ``r`` (memoised by the tuple's identity, so
    profiles derived from one curve share their points: a fleet's copies of a family do)."""
    hit = _SCALED.get((id(points), r))
    if hit is not None and hit[0] is points:
        return hit[1]
    a50, a99 = _fixed_part(points)
    f50, f99 = (points[0].p50, points[0].p99) if r < 1 else (0.0, 0.0)
    out = []
    for p in points:
        p50 = max(f50, a50 + (p.p50 - a50) * r)
        p99 = max(f99, a99 + (p.p99 - a99) * r, p50)
        out.append(LatencyPoint(p.batch, p50, p99))
    if len(_SCALED) >= _SCALED_MAX:
        _SCALED.clear()
    _SCALED[(id(points), r)] = (points, tuple(out))
    return _SCALED[(id(points), r)][1]


def scale(src: Profile, gpu: str, slice_name: str, r: float, how: str) -> Profile:
    """``src`` with its per-sample latency multiplied by ``r``, labelled (gpu, slice)."""
    a50, _ = _fixed_part(src.points)
    notes = (f"{how}; per-sample latency x{r:.4f}, fixed part {a50 * 1e3:.3g} ms kept"
             + (f", floor {src.points[0].p50 * 1e3:.3g} ms kept" if r < 1 else ""))
    origin = src.provenance.source if src.provenance.kind != "derived" else src.provenance.notes
    return replace(
        src, gpu=gpu, slice=slice_name, points=_scaled_points(src.points, r),
        provenance=Provenance(source=f"derived from {src.name} ({origin})", kind="derived", notes=notes,
                              accuracy_source=src.provenance.accuracy_source),
    )


def to_slice(src: Profile, slice_name: str) -> Profile:
    """Derive ``src`` (same GPU) on another slice kind by compute-slice scaling."""
    g = gpu_model(src.gpu)
    r = efficiency(g, src.slice) / efficiency(g, slice_name)
    return scale(src, src.gpu, slice_name, r,
                 f"compute scaling {src.slice} -> {slice_name} on {src.gpu} "
                 f"(eff {efficiency(g, src.slice):.3g} -> {efficiency(g, slice_name):.3g})")


def matching_slice(src_gpu: GpuModel, target: GpuModel, slice_name: str) -> str:
    """The slice kind on ``src_gpu`` with the same geometry as ``slice_name`` on ``target``."""
    if slice_name == WHOLE:
        return WHOLE
    t = target.profile(slice_name)
    same = [p for p in src_gpu.profiles if (p.compute, p.mem_slices) == (t.compute, t.mem_slices)]
    same = same or [p for p in src_gpu.profiles if p.compute == t.compute]
    return same[0].name if same else WHOLE


def to_gpu(src: Profile, gpu: str) -> Profile:
    """Derive ``src`` on the same slice geometry of another GPU by SM ratio."""
    s, t = gpu_model(src.gpu), gpu_model(gpu)
    # the target slice with the source's geometry
    names = [n for n in t.slice_names() if matching_slice(s, t, n) == src.slice]
    if not names:
        raise ValueError(f"{gpu} has no slice matching {src.slice} of {src.gpu}")
    out_slice = names[0]
    r = s.slice_sms(src.slice) / t.slice_sms(out_slice)
    return scale(src, gpu, out_slice, r,
                 f"SM ratio {src.gpu}/{src.slice} ({s.slice_sms(src.slice)} SMs) -> "
                 f"{gpu}/{out_slice} ({t.slice_sms(out_slice)} SMs)")


def _closest(candidates: list[Profile], gpu: GpuModel, slice_name: str) -> Profile:
    target = efficiency(gpu, slice_name)
    # prefer measured over derived, then the nearest efficiency
    return min(candidates, key=lambda p: (p.provenance.kind == "derived",
                                          abs(efficiency(gpu, p.slice) - target), p.slice))


def derive_one(known: ProfileSet, variant: str, gpu: str, slice_name: str) -> Profile:
    """A profile of ``variant`` on (gpu, slice): derived from the closest known one."""
    return _derive([p for p in known.find(variant=variant) if p.provenance.kind != "derived"],
                   variant, gpu, slice_name, {})


def _derive(measured: list[Profile], variant: str, gpu: str, slice_name: str,
            sources: dict[tuple[str, str], Profile]) -> Profile:
    """:func:`derive_one` from ``variant``'s measured profiles; ``sources`` memoises the
    profile carried over to each target GPU (one per (gpu, source slice), whatever the target
    slice)."""
    g = gpu_model(gpu)
    same_gpu = [p for p in measured if p.gpu == gpu]
    if same_gpu:
        return to_slice(_closest(same_gpu, g, slice_name), slice_name)
    others = [p for p in measured if p.gpu in GPUS and p.gpu != HOST]
    if not others:
        raise ValueError(f"no profile of {variant} to derive {variant}@{gpu}/{slice_name} from")
    # prefer a source GPU with the target's geometry, then the most SMs alike
    src_gpu = min({p.gpu for p in others},
                  key=lambda n: (GPUS[n].compute_slices != g.compute_slices, abs(GPUS[n].sms - g.sms), n))
    sg = gpu_model(src_gpu)
    src_slice = matching_slice(sg, g, slice_name)
    out = sources.get((gpu, src_slice))
    if out is None:
        base = [p for p in others if p.gpu == src_gpu]
        exact = [p for p in base if p.slice == src_slice]
        src = exact[0] if exact else to_slice(_closest(base, sg, src_slice), src_slice)
        out = sources[(gpu, src_slice)] = to_gpu(src, gpu)
    return out if out.slice == slice_name else to_slice(out, slice_name)


def with_derived(known: ProfileSet, gpus: tuple[str, ...] | None = None,
                 variants: Iterable[str] | None = None) -> ProfileSet:
    """``known`` plus a derived profile for every (variant, GPU, slice kind) it lacks: of every
    catalogue GPU, or only of ``gpus``; for every variant, or only ``variants`` (a plan derives
    just what its demand may use on its pool's GPUs)."""
    out = ProfileSet(known)
    # host profiles measure a CPU: nothing is derived from them, nor onto the host
    names = (sorted({p.variant for p in known if p.gpu != HOST}) if variants is None
             else sorted(set(variants)))
    targets = [(n, gpu_model(n).slice_names()) for n in (gpus or tuple(GPUS)) if n != HOST]
    canon: dict[tuple[LatencyPoint, ...], tuple[LatencyPoint, ...]] = {}
    for v in names:
        mine = [p for p in known.find(variant=v) if p.gpu != HOST]
        measured = [p for p in mine if p.provenance.kind != "derived"]
        if not measured:
            continue
        # equal curves (a fleet's copies of one family) share one points tuple, and so
        # everything derived from them
        measured = [p if canon.setdefault(p.points, p.points) is p.points else replace(p, points=canon[p.points])
                    for p in measured]
        have = {(p.gpu, p.slice) for p in mine}
        sources: dict[tuple[str, str], Profile] = {}
        for gname, slices in targets:
            for sname in slices:
                if (gname, sname) not in have:
                    out.add(_derive(measured, v, gname, sname, sources))
    return out
