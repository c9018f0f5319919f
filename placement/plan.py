"""The frozen ``Plan``: GPU -> layout -> slices -> MPS shares -> replicas, and its verifier.

``Plan.verify()`` re-derives everything from the catalogue and the profiles, trusting none of
the numbers the solver stored: placements legal and disjoint, memory, MPS shares and client
limits, variants allowed, and capacity >= demand x headroom per model. It raises
:class:`PlanError` naming the GPU, the slices and the rule of the first violation.

Replica floors: a demand's ``min_replicas`` (the deployment's ``replicas`` or its autoscaling
``min_replicas``) asks for that many replicas on as many distinct GPUs, and on as many distinct
nodes where the pool has them. A plan that cannot meet a floor carries a :class:`FloorShortfall`
saying so; :meth:`Plan.verify` refuses one that breaks a floor without saying so. A demand's
``min_count`` is a floor of another kind: that many replicas in all, on any GPUs (two MPS shares
of one slice count two), since each of the gateway's workers batches for replicas of its own.

Priority classes (AntMan's guaranteed / opportunistic split): guaranteed demand is planned
first, at its SLO with its headroom, and must be placed whole. Best-effort demand is planned at
its expected rate (no burst margin: the gateway sheds it first), fills the room guaranteed
replicas leave, and may be placed in part: a plan on an overfull pool carries a
:class:`Shortfall` per best-effort model it could not place whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from placement.reports import FloorShortfall, Shortfall
from placement.solve.capacity import fits_memory, replica_capacity
from profiles.catalogue import WHOLE, CatalogueError, Instance, gpu_model, overlap_reason
from profiles.profile import Profile, ProfileError, ProfileSet
from profiles.schema import Objective as VariantObjective

API_VERSION = "headrace.dev/v1"
Objective = Literal["gpus", "cost", "accuracy"]
EPS = 1e-9
ACCURACY_EPS = 1e-6  # a mean accuracy this close to a floor meets it (the LP's tolerance)
# req/s: the least capacity a demanded model is planned. Any replica that meets an SLO of at most
# 600 s serves more, so a model at rate 0 is planned exactly one replica and stays addressable
KEEP_SERVED = 1e-3


class PlanError(ValueError):
    """A plan breaks a rule. ``rule`` is a short code; the message names GPU, slices, rule."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule = rule


@dataclass(frozen=True)
class Demand:
    """What one served model needs (the solver's input, validated at the YAML edge)."""

    model: str  # the model family clients address (Profile.model)
    rate: float  # expected requests per second
    slo: float  # seconds
    variants: tuple[str, ...] = ()  # allowed variants; empty = every variant of the model
    accuracy_floor: float | None = None
    priority: Literal["guaranteed", "best-effort"] = "guaranteed"
    headroom: float = 1.0  # plan capacity >= rate x headroom
    objective: VariantObjective = "accuracy"  # the gateway's variant choice for its requests
    min_replicas: int = 1  # the floor: replicas on that many distinct GPUs (and nodes, where the pool has them)
    # at least this many replicas in all, on any GPUs (the operator sets it to its gateway's
    # worker count: each worker batches for its own replicas); only while served (count_floor)
    min_count: int = 0

    @property
    def guaranteed(self) -> bool:
        return self.priority == "guaranteed"

    @property
    def factor(self) -> float:
        """Planned capacity / expected rate: the headroom for guaranteed demand, 1 for
        best-effort (its bursts are shed, not planned for)."""
        return self.headroom if self.guaranteed else 1.0

    @property
    def required(self) -> float:
        """Planned capacity: rate x factor, at least :data:`KEEP_SERVED` (one replica at rate 0),
        except at rate 0 with ``min_replicas`` 0: nothing (scaled to zero; the gateway keeps
        the model addressable and asks for a replica on its first request)."""
        if self.rate <= 0 and self.min_replicas == 0:
            return 0.0
        return max(self.rate * self.factor, KEEP_SERVED)

    @property
    def count_floor(self) -> int:
        """Replicas the plan holds in all, on any GPUs: ``min_count`` while the demand is served
        (``required`` > 0), none when it is scaled to zero."""
        return self.min_count if self.required > 0 else 0

    @property
    def floored(self) -> bool:
        """A floor asks for more replicas than capacity alone places: ``min_replicas`` or
        :attr:`count_floor` above 1 (:mod:`placement.solve.floors`)."""
        return self.min_replicas > 1 or self.count_floor > 1

    def allows(self, p: Profile) -> bool:
        if p.model != self.model or (self.variants and p.variant not in self.variants):
            return False
        return self.accuracy_floor is None or (p.accuracy is not None and p.accuracy >= self.accuracy_floor)


@dataclass(frozen=True)
class GpuClass:
    """Interchangeable GPUs of one model with the same price and sharing permissions."""

    gpu: str
    ids: tuple[str, ...]
    cost_per_hour: float = 1.0
    mig: bool = True
    mps: bool = True

    @property
    def key(self) -> str:
        return f"{self.gpu}[mig={int(self.mig)},mps={int(self.mps)},${self.cost_per_hour:g}]"


@dataclass(frozen=True)
class Inventory:
    """The pool and what a plan on it optimises: the fewest GPUs, the least cost, or (``accuracy``)
    the highest rate-weighted mean accuracy within ``max_gpus`` / ``max_cost_per_hour``."""

    classes: tuple[GpuClass, ...]
    objective: Objective = "gpus"
    max_gpus: int | None = None  # accuracy: GPUs the plan may use (None: the pool)
    max_cost_per_hour: float | None = None  # accuracy: cost per hour the plan may reach (None: the pool's)
    mean_accuracy_floor: float | None = None  # every model's mean accuracy of answers >= this

    def by_id(self) -> dict[str, GpuClass]:
        return {i: c for c in self.classes for i in c.ids}

    @property
    def unit(self) -> Literal["gpus", "cost"]:
        """What a GPU spends: GPUs, or cost under ``cost`` (and under ``accuracy`` when the
        budget is a cost alone); the solver minimises it, second to accuracy under ``accuracy``."""
        if self.objective == "cost" or (self.objective == "accuracy" and self.max_cost_per_hour is not None
                                        and self.max_gpus is None):
            return "cost"
        return "gpus"

    @property
    def accuracy_aware(self) -> bool:
        """The plan's split of answers across variants matters (objective or floor)."""
        return self.objective == "accuracy" or self.mean_accuracy_floor is not None

    def weight(self, c: GpuClass) -> float:
        """What one GPU of class ``c`` costs in the pool's :attr:`unit`."""
        return 1.0 if self.unit == "gpus" else c.cost_per_hour


def fill_split(rate: float, variants: Sequence[tuple[str, float | None, float]]) -> dict[str, float]:
    """Requests per second each variant answers, ``(name, accuracy, capacity)`` in: the gateway's
    ``accuracy`` objective fills the most accurate variant to its capacity and overflows the rest
    to the next (unknown accuracy last). For fixed replicas no split is more accurate."""
    out: dict[str, float] = {}
    left = rate
    for name, _acc, cap in sorted(variants, key=lambda t: (t[1] is None, -(t[1] or 0.0), t[0])):
        out[name] = max(0.0, min(cap, left))
        left -= out[name]
    return out


def mean_accuracy(split: dict[str, float], accuracy: dict[str, float | None]) -> float | None:
    """Rate-weighted mean accuracy of a split (unknown accuracy counts 0); None if nothing is served."""
    total = sum(split.values())
    if total <= 0:
        return None
    return sum(r * (accuracy.get(v) or 0.0) for v, r in split.items()) / total


def has_known_accuracy(d: Demand, profiles: ProfileSet) -> bool:
    """Some allowed variant of ``d`` has a known accuracy; a model with none is exempt from the
    mean-accuracy floor and from the accuracy objective (its answers' accuracy is unknown)."""
    return any(p.accuracy is not None and d.allows(p) for p in profiles.find(model=d.model))


def drop_replica(gpus: list[GpuPlan], gi: int, si: int, ri: int) -> Replica:
    """Remove replica ``ri`` of slice ``si`` of ``gpus[gi]`` in place; a slice left empty goes,
    and so does a GPU left with none. Returns the replica removed."""
    g, s = gpus[gi], gpus[gi].slices[si]
    r = s.replicas[ri]
    slices = tuple(x for x in (replace(s, replicas=s.replicas[:ri] + s.replicas[ri + 1:]) if k == si else x
                               for k, x in enumerate(g.slices)) if x.replicas)
    if slices:
        gpus[gi] = replace(g, slices=slices)
    else:
        gpus.pop(gi)
    return r


def node_of(gpu_id: str) -> str:
    """The node a GPU id names (``<node>/gpu<i>``); an id without a node is a node of its own."""
    return gpu_id.rsplit("/", 1)[0] if "/" in gpu_id else gpu_id


@dataclass(frozen=True)
class Replica:
    """One Triton server (an MPS client when share < 1) serving one variant."""

    model: str
    variant: str
    share: float  # MPS active-thread fraction; 1 = the slice to itself
    max_batch: int
    capacity: float  # predicted req/s at the model's SLO (as the solver computed it)
    # what it serves beyond the variant: a digest of its artifact (uri, version, files) and
    # Triton settings; "" for built-in sources. A changed revision is a replacement, not a keep.
    revision: str = ""
    # the replica's id, once a diff has named it (:func:`placement.diff.replica_ids`); it stays
    # with the replica across re-plans, so a successor never takes its predecessor's name
    id: str = ""


@dataclass(frozen=True)
class SlicePlan:
    profile: str  # MIG profile name, or "gpu" for a whole GPU without MIG
    start: int | None  # placement start in memory slices (None for a whole GPU)
    mps: bool
    replicas: tuple[Replica, ...]

    @property
    def label(self) -> str:
        return WHOLE if self.start is None else f"{self.profile}@{self.start}"


@dataclass(frozen=True)
class GpuPlan:
    id: str
    gpu: str  # GPU model name
    mig: bool
    slices: tuple[SlicePlan, ...]

    @property
    def layout(self) -> str:
        return "+".join(s.label for s in self.slices) if self.mig else WHOLE


@dataclass(frozen=True)
class Plan:
    gpus: tuple[GpuPlan, ...]
    demands: tuple[Demand, ...]
    inventory: Inventory
    method: str = ""
    lower_bound: float = 0.0  # objective lower bound (LP relaxation + Lagrangian, see solver.lower_bound); 0 if unknown
    solve_seconds: float = 0.0
    profiles: ProfileSet = field(default_factory=ProfileSet, compare=False, repr=False)
    proven_bound: float = 0.0  # the MILP's own lower bound (its pricing's, or HiGHS's branch and bound); 0 if none
    accuracy_bound: float = 0.0  # objective accuracy: the MILP's upper bound on the mean accuracy; 0 if none
    shortfall: tuple[Shortfall, ...] = ()  # best-effort models an overfull pool could not place whole
    bound_seconds: float = 0.0  # of solve_seconds, computing lower_bound
    floors: tuple[FloorShortfall, ...] = ()  # replica floors not met in full (placement.solve.floors)

    @property
    def partial(self) -> bool:
        return bool(self.shortfall)

    # ------------------------------------------------------------------ summaries
    def used(self) -> tuple[GpuPlan, ...]:
        return tuple(g for g in self.gpus if any(s.replicas for s in g.slices))

    @property
    def gpu_count(self) -> int:
        return len(self.used())

    @property
    def cost_per_hour(self) -> float:
        by_id = self.inventory.by_id()
        return sum(by_id[g.id].cost_per_hour for g in self.used() if g.id in by_id)

    @property
    def objective(self) -> float:
        """What the plan spends in the pool's unit: GPUs or cost per hour."""
        return self.gpu_count if self.inventory.unit == "gpus" else self.cost_per_hour

    @property
    def gap(self) -> float:
        """Relative distance to the best bound (0 = provably optimal; inf if no bound is known):
        under ``accuracy`` from the MILP's upper bound on the mean accuracy down to the plan's,
        otherwise from the spend down to the best lower bound, LP or branch-and-bound."""
        if self.inventory.objective == "accuracy":
            mean = self.mean_accuracy()
            if mean is None:
                return 0.0
            if self.accuracy_bound <= 0 or mean <= 0:
                return float("inf")
            gap = self.accuracy_bound / mean - 1.0
            return gap if gap > ACCURACY_EPS else 0.0
        lb = max(self.lower_bound, self.proven_bound)
        if lb <= 0:
            return 0.0 if self.objective == 0 else float("inf")
        return self.objective / lb - 1.0

    def replicas(self) -> list[tuple[GpuPlan, SlicePlan, Replica]]:
        return [(g, s, r) for g in self.gpus for s in g.slices for r in s.replicas]

    def hosts(self, model: str) -> tuple[set[str], set[str]]:
        """The GPUs and the nodes holding a replica of ``model``."""
        gpus = {g.id for g, _, r in self.replicas() if r.model == model}
        return gpus, {node_of(i) for i in gpus}

    def count(self, model: str) -> int:
        """Replicas of ``model`` in all."""
        return sum(r.model == model for _, _, r in self.replicas())

    def capacities(self) -> dict[str, float]:
        """Planned requests per second of every model (0 for a model without replicas)."""
        out = {d.model: 0.0 for d in self.demands}
        for _, _, r in self.replicas():
            out[r.model] = out.get(r.model, 0.0) + r.capacity
        return out

    def capacity(self, model: str) -> float:
        return sum(r.capacity for _, _, r in self.replicas() if r.model == model)

    def headroom(self, model: str) -> float:
        d = next(d for d in self.demands if d.model == model)
        return self.capacity(model) / d.rate if d.rate > 0 else float("inf")

    def _accuracy_of(self) -> dict[str, float | None]:
        return {p.variant: p.accuracy for d in self.demands for p in self.profiles.find(model=d.model)}

    def splits(self) -> dict[str, dict[str, float]]:
        """Per model, requests per second each of its planned variants answers at the expected
        rate, as the gateway fills them (:func:`fill_split`)."""
        return self._splits(self._accuracy_of())

    def _splits(self, acc: dict[str, float | None]) -> dict[str, dict[str, float]]:
        cap: dict[str, dict[str, float]] = {d.model: {} for d in self.demands}
        for _, _, r in self.replicas():
            if r.model in cap:
                cap[r.model][r.variant] = cap[r.model].get(r.variant, 0.0) + r.capacity
        return {d.model: fill_split(d.rate, [(v, acc.get(v), c) for v, c in cap[d.model].items()])
                for d in self.demands}

    def split(self, model: str) -> dict[str, float]:
        return self.splits()[model]

    def mean_accuracies(self) -> dict[str, float | None]:
        """Per model, the predicted rate-weighted mean accuracy of its answers (unknown accuracy
        counts 0); None for a model with no allowed variant of known accuracy or no answers."""
        acc = self._accuracy_of()
        return self._mean_accuracies(acc, self._splits(acc))

    def _mean_accuracies(self, acc: dict[str, float | None], splits: dict[str, dict[str, float]]
                         ) -> dict[str, float | None]:
        return {d.model: mean_accuracy(splits[d.model], acc) if has_known_accuracy(d, self.profiles) else None
                for d in self.demands}

    def mean_accuracy(self, model: str | None = None) -> float | None:
        """One model's :meth:`mean_accuracies`, or (no model) the mean over every answer of the
        models that have one."""
        means = self.mean_accuracies()
        return means[model] if model is not None else self._overall_accuracy(means)

    def _overall_accuracy(self, means: dict[str, float | None]) -> float | None:
        """The mean over every answer of the models whose ``means`` is known."""
        rates = {d.model: d.rate for d in self.demands}
        den = sum(rates[m] for m, v in means.items() if v is not None)
        return sum(v * rates[m] for m, v in means.items() if v is not None) / den if den > 0 else None

    # ------------------------------------------------------------------ verification
    def violations(self) -> list[PlanError]:
        """Every rule the plan breaks, checked from the catalogue and profiles alone."""
        out: list[PlanError] = []
        by_id = self.inventory.by_id()
        seen: set[str] = set()
        demands = {d.model: d for d in self.demands}
        served: dict[str, float] = {m: 0.0 for m in demands}
        where: dict[str, list[str]] = {m: [] for m in demands}
        variant_caps: dict[str, dict[str, float]] = {m: {} for m in demands}
        for g in self.gpus:
            out += self._check_gpu(g, by_id, seen)
            try:
                gm = gpu_model(g.gpu)
            except CatalogueError as e:
                out.append(PlanError("inventory", f"GPU {g.id}: {e}"))
                continue
            for s in g.slices:
                out += self._check_slice(g, s, gm, demands, served, where, variant_caps)
        out += self._check_budget()
        out += self._check_floor(variant_caps)
        out += self._check_replica_floors()
        short = {s.model: s for s in self.shortfall}
        for m, d in demands.items():
            sf = short.get(m)
            if sf is not None and d.guaranteed:
                out.append(PlanError("capacity", f"model {m}: guaranteed demand is reported short "
                                                 f"({sf.unplaced:.1f} req/s); only best-effort may be"))
            left = sf.unplaced if sf is not None else 0.0
            if served[m] + left + EPS * max(1.0, d.required) < d.required:
                on = ", ".join(where[m]) or "no replicas"
                short_by = f", {left:.1f} req/s reported short" if sf is not None else ""
                out.append(PlanError(
                    "capacity",
                    f"model {m}: predicted capacity {served[m]:.1f} req/s < demand {d.rate:g} x "
                    f"{'headroom ' + format(d.headroom, 'g') if d.guaranteed else 'best-effort 1'} = "
                    f"{d.required:.1f} req/s at SLO {d.slo * 1e3:g} ms{short_by} ({on})"))
        return out

    def verify(self) -> None:
        """Raise :class:`PlanError` explaining the first violation; return None if legal."""
        v = self.violations()
        if v:
            raise v[0]

    def _check_gpu(self, g: GpuPlan, by_id: dict, seen: set[str]) -> list[PlanError]:
        out = []
        if g.id in seen:
            out.append(PlanError("inventory", f"GPU {g.id} appears twice in the plan"))
        seen.add(g.id)
        c = by_id.get(g.id)
        if c is None:
            return [*out, PlanError("inventory", f"GPU {g.id} is not in the pool")]
        if c.gpu != g.gpu:
            out.append(PlanError("inventory", f"GPU {g.id} is a {c.gpu} in the pool, not a {g.gpu}"))
        if g.mig and not c.mig:
            out.append(PlanError("mig-allowed", f"GPU {g.id}: layout {g.layout} uses MIG, which its pool forbids"))
        if any(s.mps for s in g.slices) and not c.mps:
            labels = ", ".join(s.label for s in g.slices if s.mps)
            out.append(PlanError("mps-allowed", f"GPU {g.id}: slices {labels} use MPS, which its pool forbids"))
        if not g.mig:
            if len(g.slices) != 1 or g.slices[0].profile != WHOLE:
                labels = ", ".join(s.label for s in g.slices)
                out.append(PlanError("placement", f"GPU {g.id}: without MIG a GPU is one slice 'gpu', got {labels}"))
            return out
        bad = [s.label for s in g.slices if s.start is None or s.profile == WHOLE]
        if bad:
            return [*out, PlanError("placement", f"GPU {g.id}: MIG slices {', '.join(bad)} need a profile and a start")]
        try:
            reason = overlap_reason(gpu_model(g.gpu), tuple(Instance(s.start, s.profile) for s in g.slices))
        except CatalogueError as e:
            reason = str(e)
        if reason:
            out.append(PlanError("placement", f"GPU {g.id} ({g.gpu}): slices {g.layout}: {reason}"))
        return out

    def _check_budget(self) -> list[PlanError]:
        inv, out = self.inventory, []
        if inv.max_gpus is not None and self.gpu_count > inv.max_gpus:
            out.append(PlanError("budget", f"plan uses {self.gpu_count} GPUs, more than max_gpus {inv.max_gpus}"))
        if inv.max_cost_per_hour is not None and self.cost_per_hour > inv.max_cost_per_hour + EPS:
            out.append(PlanError("budget", f"plan costs {self.cost_per_hour:g} per hour, more than "
                                           f"max_cost_per_hour {inv.max_cost_per_hour:g}"))
        return out

    def _check_floor(self, variant_caps: dict[str, dict[str, float]]) -> list[PlanError]:
        """Each model's mean accuracy, from capacities re-derived from the profiles, meets the
        floor (a best-effort model reported short and given nothing has no answers to check)."""
        floor, out = self.inventory.mean_accuracy_floor, []
        if floor is None:
            return out
        short = {s.model for s in self.shortfall}
        for d in self.demands:
            if d.rate <= 0 or not has_known_accuracy(d, self.profiles):
                continue
            acc = self._accuracy_of()
            split = fill_split(d.rate, [(v, acc.get(v), c) for v, c in variant_caps.get(d.model, {}).items()])
            mean = mean_accuracy(split, acc)
            if mean is None and d.model in short:
                continue
            mean = mean or 0.0
            if mean + ACCURACY_EPS < floor:
                shown = ", ".join(f"{v} {r:.0f} req/s" for v, r in split.items() if r > 0) or "nothing served"
                out.append(PlanError("accuracy", f"model {d.model}: predicted mean accuracy {mean:.4f} "
                                                 f"({shown}) < mean_accuracy_floor {floor:g}"))
        return out

    def _check_replica_floors(self) -> list[PlanError]:
        """Each floor is met (on distinct GPUs and nodes; in all), or its shortfall is reported as it is."""
        out, told = [], {(f.model, f.kind): f for f in self.floors}
        held: dict[str, set[str]] = {}  # model -> the GPUs holding it, and its replicas in all: one pass
        counts: dict[str, int] = {}
        for g, _, r in self.replicas():
            held.setdefault(r.model, set()).add(g.id)
            counts[r.model] = counts.get(r.model, 0) + 1
        for d in self.demands:
            gpus = held.get(d.model, set())
            nodes = {node_of(i) for i in gpus}
            f = told.get((d.model, "distinct"))
            if f is not None and (f.gpus, f.nodes) != (len(gpus), len(nodes)):
                out.append(PlanError("replicas", f"model {d.model}: floor reported on {f.gpus} GPUs of {f.nodes} "
                                                 f"nodes, the plan has {len(gpus)} of {len(nodes)}"))
            elif f is None and d.min_replicas > 1 and min(len(gpus), len(nodes)) < d.min_replicas:
                out.append(PlanError("replicas", f"model {d.model}: floor {d.min_replicas} replicas, placed on "
                                                 f"{len(gpus)} GPUs of {len(nodes)} nodes, not reported"))
            n, f = counts.get(d.model, 0), told.get((d.model, "count"))
            if f is not None and f.replicas != n:
                out.append(PlanError("replicas", f"model {d.model}: {f.floor} replicas in all reported placed "
                                                 f"{f.replicas}, the plan has {n}"))
            elif f is None and d.count_floor > 1 and n < d.count_floor:
                out.append(PlanError("replicas", f"model {d.model}: min_count {d.count_floor} replicas in all, "
                                                 f"placed {n}, not reported"))
        return out

    def _check_slice(self, g: GpuPlan, s: SlicePlan, gm, demands: dict[str, Demand],
                     served: dict[str, float], where: dict[str, list[str]],
                     variant_caps: dict[str, dict[str, float]]) -> list[PlanError]:
        out = []
        at = f"GPU {g.id} slice {s.label}"
        try:
            mem_gb = gm.slice_memory_gb(s.profile)
        except CatalogueError as e:
            return [PlanError("placement", f"{at}: {e}")]
        if not s.mps and len(s.replicas) > 1:
            out.append(PlanError("mps-share", f"{at}: {len(s.replicas)} replicas share the slice without MPS"))
        if not s.mps and any(r.share != 1.0 for r in s.replicas):
            out.append(PlanError("mps-share", f"{at}: shares below 100% need MPS"))
        total = sum(r.share for r in s.replicas)
        if total > 1.0 + EPS or any(r.share <= 0 for r in s.replicas):
            shares = " + ".join(f"{r.share:.0%}" for r in s.replicas)
            out.append(PlanError("mps-share", f"{at}: MPS shares {shares} = {total:.0%} exceed 100%"))
        limit = gm.mps_client_limit(s.profile)
        if s.mps and len(s.replicas) > limit:
            out.append(PlanError("mps-clients", f"{at}: {len(s.replicas)} MPS clients exceed the limit of {limit}"))
        mem = 0.0
        for r in s.replicas:
            d = demands.get(r.model)
            if d is None:
                out.append(PlanError("demand", f"{at}: replica of {r.model} which has no demand"))
                continue
            try:
                p = self.profiles.get(r.variant, g.gpu, s.profile)
            except ProfileError as e:
                out.append(PlanError("profile", f"{at}: {e}"))
                continue
            if not d.allows(p):
                out.append(PlanError("variant", f"{at}: variant {r.variant} is not allowed for {r.model} "
                                                f"(variants {list(d.variants) or 'any'}, accuracy floor {d.accuracy_floor})"))
            if r.max_batch > p.max_batch or r.max_batch < 1:
                out.append(PlanError("profile", f"{at}: max_batch ({r.max_batch}) outside 1..{p.max_batch} for {p.name}"))
                continue
            mem += p.memory_mb
            if s.mps and not fits_memory(p, gm, s.profile, r.share):
                out.append(PlanError("memory", f"{at}: {r.variant} needs {p.memory_mb:g} MB, more than its "
                                               f"{r.share:.0%} MPS share of {mem_gb:g} GiB"))
            cap = replica_capacity(p, d.slo, r.share, r.max_batch)
            if cap is not None:
                served[r.model] += cap.rate
                caps = variant_caps[r.model]
                caps[r.variant] = caps.get(r.variant, 0.0) + cap.rate
                where[r.model].append(f"{g.id} {s.label} {cap.rate:.0f} req/s")
            else:
                where[r.model].append(f"{g.id} {s.label} cannot meet the SLO")
        if mem > mem_gb * 1024.0 + EPS:
            out.append(PlanError("memory", f"{at}: replicas need {mem:g} MB, the slice has {mem_gb:g} GiB"))
        return out

    # ------------------------------------------------------------------ output
    def to_dict(self) -> dict:
        acc = self._accuracy_of()
        splits = self._splits(acc)
        means, caps = self._mean_accuracies(acc, splits), self.capacities()
        return {
            "apiVersion": API_VERSION,
            "kind": "Plan",
            "metadata": {"method": self.method},
            "spec": {"gpus": [
                {"id": g.id, "gpu": g.gpu, "mig": g.mig, "layout": g.layout, "slices": [
                    {"profile": s.profile, "start": s.start, "mps": s.mps, "replicas": [
                        {"model": r.model, "variant": r.variant, "share": r.share,
                         "max_batch": r.max_batch, "capacity_rps": round(r.capacity, 1),
                         **({"revision": r.revision} if r.revision else {}), **({"id": r.id} if r.id else {})}
                        for r in s.replicas]}
                    for s in g.slices]}
                for g in self.used()]},
            "status": {
                "gpus": self.gpu_count,
                "cost_per_hour": round(self.cost_per_hour, 4),
                "objective": self.inventory.objective,
                **({"max_gpus": self.inventory.max_gpus} if self.inventory.max_gpus is not None else {}),
                **({"max_cost_per_hour": self.inventory.max_cost_per_hour}
                   if self.inventory.max_cost_per_hour is not None else {}),
                **({"mean_accuracy_floor": self.inventory.mean_accuracy_floor}
                   if self.inventory.mean_accuracy_floor is not None else {}),
                "mean_accuracy": _round(self._overall_accuracy(means)),
                **({"accuracy_bound": round(self.accuracy_bound, 6)} if self.accuracy_bound > 0 else {}),
                "lower_bound": round(self.lower_bound, 4),
                "proven_bound": round(self.proven_bound, 4),
                "gap": None if self.gap == float("inf") else round(self.gap, 4),
                "solve_seconds": round(self.solve_seconds, 3),
                "bound_seconds": round(self.bound_seconds, 3),
                "partial": self.partial,
                "shortfall": [s.to_dict() for s in self.shortfall],
                "floors": [f.to_dict() for f in self.floors],
                "models": [{"model": d.model, "rate": d.rate, "slo_ms": d.slo * 1e3, "priority": d.priority,
                            "min_replicas": d.min_replicas, **({"min_count": d.min_count} if d.min_count else {}),
                            "capacity_rps": round(caps[d.model], 1),
                            # None at rate 0: no ratio (JSON has no infinity)
                            "headroom": round(caps[d.model] / d.rate, 3) if d.rate > 0 else None,
                            "mean_accuracy": _round(means[d.model]),
                            "split_rps": {v: round(r, 1) for v, r in splits[d.model].items()}}
                           for d in self.demands],
            },
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)
