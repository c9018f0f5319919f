"""The GPU catalogue: MIG profiles, their legal placements, valid layouts and MPS limits.

Every GPU model names its public source (:attr:`GpuModel.source`); a profile whose GiB or SMs
are not in that source says so (:attr:`MigProfile.derived`) and is computed from the GPU's
memory and the H100/A100 geometry. Profile names change with drivers (3g.39gb on some 535/545
drivers); the NVML profile constant is the stable key. Placements are in memory slices (``nvidia-smi mig -lgipp`` prints ``{starts}:size``): 1/8 of
memory on A100/H100/H200 and 1/4 on A30. A layout is a set of (profile, start) instances whose
memory ranges do not overlap and whose compute slices fit the GPU.

MPS client limits: 48 clients per device on Volta and newer (MPS docs). On a MIG slice the docs
only say "fewer"; headrace assumes the limit scales with the slice's share of compute,
``floor(48 * compute_slices / gpu_compute_slices)`` (1g of an A100: 6, 3g: 20, 7g: 48).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

MPS_CLIENTS_PER_DEVICE = 48
WHOLE = "gpu"  # slice name of a whole GPU without MIG
HOST = "cpu"  # the host pseudo-GPU: CPU-served models (its one slice is WHOLE; profiles say "cpu")
HOST_CLIENTS = 8  # processes the planner co-locates on one host


class CatalogueError(ValueError):
    """An unknown GPU model or MIG profile; the message lists the known ones."""


@dataclass(frozen=True)
class MigProfile:
    name: str  # e.g. 3g.40gb
    compute: int  # compute slices (g)
    mem_slices: int  # memory slices it occupies (placement size)
    memory_gb: float  # GiB usable
    max_count: int  # instances of this profile per GPU
    starts: tuple[int, ...]  # legal placement starts, in memory slices
    sms: int = 0
    nvml_profile: str = ""  # NVML_GPU_INSTANCE_PROFILE_* constant naming this profile
    derived: bool = False  # memory_gb/sms derived rather than published

    def span(self, start: int) -> range:
        return range(start, start + self.mem_slices)


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_gb: float
    sms: int
    compute_slices: int
    mem_slices: int
    profiles: tuple[MigProfile, ...]
    source: str = ""  # the public document or page the profile table comes from

    def profile(self, name: str) -> MigProfile:
        for p in self.profiles:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.profiles)
        raise CatalogueError(f"{self.name} has no MIG profile {name!r}; known: {known}")

    def slice_memory_gb(self, slice_name: str) -> float:
        return self.memory_gb if slice_name == WHOLE else self.profile(slice_name).memory_gb

    def slice_compute(self, slice_name: str) -> int:
        return self.compute_slices if slice_name == WHOLE else self.profile(slice_name).compute

    def slice_sms(self, slice_name: str) -> int:
        return self.sms if slice_name == WHOLE else self.profile(slice_name).sms

    def slice_fraction(self, slice_name: str) -> float:
        """Share of the GPU a slice uses: the larger of its compute and memory shares."""
        if slice_name == WHOLE:
            return 1.0
        p = self.profile(slice_name)
        return max(p.compute / self.compute_slices, p.mem_slices / self.mem_slices)

    def mps_client_limit(self, slice_name: str) -> int:
        """Most MPS clients on one device (whole GPU) or one MIG slice (see module doc)."""
        if self.name == HOST:
            return HOST_CLIENTS
        if slice_name == WHOLE:
            return MPS_CLIENTS_PER_DEVICE
        return max(1, MPS_CLIENTS_PER_DEVICE * self.profile(slice_name).compute // self.compute_slices)

    def slice_names(self) -> tuple[str, ...]:
        return (WHOLE, *(p.name for p in self.profiles))


def _p(name: str, g: int, mem: int, gb: float, count: int, starts: tuple[int, ...], sms: int,
       nvml: str, derived: bool = False) -> MigProfile:
    return MigProfile(name, g, mem, gb, count, starts, sms, nvml, derived)


_ALL7 = (0, 1, 2, 3, 4, 5, 6)
_EVEN = (0, 2, 4, 6)


def _seven_slice_gpu(name: str, gb: float, sms: int, sizes: dict[str, tuple[str, float, int]],
                     derived: frozenset[str] = frozenset(), source: str = "") -> GpuModel:
    """A100/H100/H200 geometry: 7 compute slices, 8 memory slices, same placement table.
    ``sizes`` maps a geometry key to (profile name, GiB, SMs)."""
    geo = {  # key: (compute, mem slices, max count, starts, NVML constant)
        "1g": (1, 1, 7, _ALL7, "NVML_GPU_INSTANCE_PROFILE_1_SLICE"),
        "1g2": (1, 2, 4, _EVEN, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2"),
        "2g": (2, 2, 3, (0, 2, 4), "NVML_GPU_INSTANCE_PROFILE_2_SLICE"),
        "3g": (3, 4, 2, (0, 4), "NVML_GPU_INSTANCE_PROFILE_3_SLICE"),
        "4g": (4, 4, 1, (0,), "NVML_GPU_INSTANCE_PROFILE_4_SLICE"),
        "7g": (7, 8, 1, (0,), "NVML_GPU_INSTANCE_PROFILE_7_SLICE"),
    }
    profiles = tuple(
        _p(sizes[k][0], g, mem, sizes[k][1], count, starts, sizes[k][2], nvml, k in derived)
        for k, (g, mem, count, starts, nvml) in geo.items()
    )
    return GpuModel(name, gb, sms, 7, 8, profiles, source)


MIG_GUIDE = "NVIDIA MIG User Guide, Supported MIG Profiles (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html)"
ALL = frozenset({"1g", "1g2", "2g", "3g", "4g", "7g"})

GPUS: dict[str, GpuModel] = {
    g.name: g
    for g in (
        _seven_slice_gpu("A100-40GB", 40.0, 108, {
            "1g": ("1g.5gb", 4.75, 14), "1g2": ("1g.10gb", 9.75, 14), "2g": ("2g.10gb", 9.75, 28),
            "3g": ("3g.20gb", 19.62, 42), "4g": ("4g.20gb", 19.62, 56), "7g": ("7g.40gb", 39.38, 98)},
            source=MIG_GUIDE + ", A100-SXM4-40GB table"),
        _seven_slice_gpu("A100-80GB", 80.0, 108, {
            "1g": ("1g.10gb", 9.5, 14), "1g2": ("1g.20gb", 19.5, 14), "2g": ("2g.20gb", 19.5, 28),
            "3g": ("3g.40gb", 39.25, 42), "4g": ("4g.40gb", 39.25, 56), "7g": ("7g.80gb", 78.75, 98)},
            derived=frozenset({"1g2", "2g", "3g", "4g", "7g"}),  # GiB doubled from 40GB
            source=MIG_GUIDE + " (A100-SXM4-80GB names); 1g.10gb 9.50 GiB from public `nvidia-smi mig -lgip` output"),
        _seven_slice_gpu("H100-80GB", 80.0, 132, {
            "1g": ("1g.10gb", 9.75, 16), "1g2": ("1g.20gb", 19.62, 26), "2g": ("2g.20gb", 19.62, 32),
            "3g": ("3g.40gb", 39.5, 60), "4g": ("4g.40gb", 39.5, 64), "7g": ("7g.80gb", 79.25, 132)},
            source=MIG_GUIDE + ", H100-SXM5-80GB table"),
        _seven_slice_gpu("H100-NVL", 94.0, 132, {
            "1g": ("1g.12gb", 10.75, 16), "1g2": ("1g.24gb", 21.62, 26), "2g": ("2g.24gb", 21.62, 32),
            "3g": ("3g.47gb", 46.38, 60), "4g": ("4g.47gb", 46.38, 64), "7g": ("7g.94gb", 93.0, 132)},
            derived=frozenset({"3g", "4g", "7g"}),  # GiB: 4/8 and 8/8 of memory; SMs as on H100 SXM
            source="`nvidia-smi mig -lgip` on H100 NVL, NVIDIA/gpu-operator pull request #903 "
                   "(github.com/NVIDIA/gpu-operator/pull/903); profile names: " + MIG_GUIDE),
        _seven_slice_gpu("H200-141GB", 141.0, 132, {
            "1g": ("1g.18gb", 16.0, 16), "1g2": ("1g.35gb", 32.25, 26), "2g": ("2g.35gb", 32.25, 32),
            "3g": ("3g.71gb", 69.5, 60), "4g": ("4g.71gb", 69.5, 64), "7g": ("7g.141gb", 140.0, 132)},
            source="`nvidia-smi mig -lgip` on H200, NVIDIA/mig-parted issue #120 "
                   "(github.com/NVIDIA/mig-parted/issues/120)"),
        _seven_slice_gpu("B200", 180.0, 148, {
            "1g": ("1g.23gb", 22.5, 21), "1g2": ("1g.45gb", 45.0, 21), "2g": ("2g.45gb", 45.0, 42),
            "3g": ("3g.90gb", 90.0, 63), "4g": ("4g.90gb", 90.0, 84), "7g": ("7g.180gb", 180.0, 148)},
            derived=ALL,  # names published; GiB = name's memory fraction of 180 GB, SMs floor(148 x g / 7)
            source=MIG_GUIDE + " (B200, 180GB, 7 instances); profile names as the GPU operator's "
                   "mig-parted configs list them (1g.23gb ... 7g.180gb)"),
        GpuModel("A30-24GB", 24.0, 56, 4, 4, (
            _p("1g.6gb", 1, 1, 5.81, 4, (0, 1, 2, 3), 14, "NVML_GPU_INSTANCE_PROFILE_1_SLICE"),
            _p("2g.12gb", 2, 2, 11.69, 2, (0, 2), 28, "NVML_GPU_INSTANCE_PROFILE_2_SLICE"),
            _p("4g.24gb", 4, 4, 23.5, 1, (0,), 56, "NVML_GPU_INSTANCE_PROFILE_4_SLICE"),
        ), MIG_GUIDE + ", A30-24GB table"),
        # the host: no MIG; "MPS" on it means co-located server processes sharing its cores
        GpuModel(HOST, 64.0, 0, 1, 1, (), "the host's cores (no MIG): a pseudo-GPU for CPU-served models"),
    )
}

# the two-memory-slice 1g profile of each 7-slice GPU (1g.10gb on A100-40GB, 1g.20gb on 80GB...)
DOUBLE_MEMORY_1G = {
    name: next(p.name for p in g.profiles if p.compute == 1 and p.mem_slices == 2)
    for name, g in GPUS.items() if g.compute_slices == 7
}


def gpu_model(name: str) -> GpuModel:
    try:
        return GPUS[name]
    except KeyError:
        raise CatalogueError(f"unknown GPU model {name!r}; known: {', '.join(GPUS)}") from None


@dataclass(frozen=True, order=True)
class Instance:
    """One MIG GPU instance: a profile at a placement start (memory slice index)."""

    start: int
    profile: str


Layout = tuple[Instance, ...]  # sorted by start


def overlap_reason(gpu: GpuModel, instances: tuple[Instance, ...]) -> str | None:
    """Why a set of instances is not a legal layout on ``gpu`` (None if it is legal)."""
    used: dict[int, Instance] = {}
    counts: dict[str, int] = {}
    compute = 0
    for inst in instances:
        try:
            p = gpu.profile(inst.profile)
        except CatalogueError as e:
            return str(e)
        if inst.start not in p.starts:
            return (f"{p.name}@{inst.start} is not a legal placement (legal starts: "
                    f"{{{','.join(map(str, p.starts))}}}:{p.mem_slices})")
        for m in p.span(inst.start):
            if m in used:
                o = used[m]
                return f"{p.name}@{inst.start} overlaps {o.profile}@{o.start} on memory slice {m}"
            used[m] = inst
        counts[p.name] = counts.get(p.name, 0) + 1
        if counts[p.name] > p.max_count:
            return f"{counts[p.name]} instances of {p.name} exceed its maximum of {p.max_count}"
        compute += p.compute
    if compute > gpu.compute_slices:
        return f"compute slices add up to {compute}, more than the {gpu.compute_slices} of a {gpu.name}"
    return None


@cache
def layouts(gpu_name: str, with_double_memory_1g: bool = False, maximal: bool = True) -> tuple[Layout, ...]:
    """Every legal layout of ``gpu_name`` (only the maximal ones by default: no further
    instance fits). The two-memory-slice 1g profile is left out unless asked for."""
    gpu = gpu_model(gpu_name)
    skip = set() if with_double_memory_1g else {DOUBLE_MEMORY_1G.get(gpu_name)}
    cands = sorted(
        (Instance(s, p.name) for p in gpu.profiles if p.name not in skip for s in p.starts),
        key=lambda i: (i.start, i.profile),
    )
    out: list[Layout] = []

    def fits(cur: tuple[Instance, ...], c: Instance) -> bool:
        return overlap_reason(gpu, (*cur, c)) is None

    def rec(i: int, cur: tuple[Instance, ...]) -> None:
        if i == len(cands):
            if cur and (not maximal or not any(fits(cur, c) for c in cands if c not in cur)):
                out.append(tuple(sorted(cur)))
            return
        c = cands[i]
        if fits(cur, c):
            rec(i + 1, (*cur, c))
        rec(i + 1, cur)

    rec(0, ())
    return tuple(sorted(set(out)))


def layout_counts(gpu_name: str, layout: Layout) -> dict[str, int]:
    out: dict[str, int] = {}
    for inst in layout:
        out[inst.profile] = out.get(inst.profile, 0) + 1
    return out


def layout_name(layout: Layout) -> str:
    return "+".join(f"{i.profile}@{i.start}" for i in layout) if layout else WHOLE
