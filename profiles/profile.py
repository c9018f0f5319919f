"""The profile model: one variant on one slice kind, and the one latency predictor.

Every component that needs to know how long a batch takes (batcher, admission, variant
selector, placement capacity model, simulator, emulated GPU) asks a :class:`Profile`.
Times are seconds (floats) inside; the YAML on disk speaks milliseconds for readability.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from profiles.catalogue import HOST, WHOLE
from profiles.schema import format_error

Quantile = Literal["p50", "p99"]

API_VERSION = "headrace.dev/v1"


class ProfileError(ValueError):
    """A profile file or value is invalid; the message names the field and the value."""


@dataclass(frozen=True)
class LatencyPoint:
    batch: int
    p50: float  # seconds
    p99: float  # seconds


@dataclass(frozen=True)
class Provenance:
    source: str
    kind: Literal["measured", "derived", "fit", "emulated"] = "measured"
    measured_batches: tuple[int, ...] = ()
    notes: str = ""
    accuracy_source: str = ""  # where Profile.accuracy comes from, or why it is unknown


@dataclass(frozen=True)
class Profile:
    """Latency by batch size of one model variant on one slice kind of one GPU model.

    ``slice`` is a MIG profile name (``1g.10gb``) or ``gpu`` for a whole GPU without MIG.
    """

    model: str
    variant: str
    gpu: str
    slice: str
    max_batch: int
    points: tuple[LatencyPoint, ...]
    memory_mb: float = 0.0
    accuracy: float | None = None
    mps_interference: float = 0.1
    provenance: Provenance = field(default_factory=lambda: Provenance("unknown"))

    def __post_init__(self) -> None:
        if not self.points:
            raise ProfileError(f"profile {self.key}: latency has no points")
        batches = [p.batch for p in self.points]
        if batches != sorted(set(batches)):
            raise ProfileError(f"profile {self.key}: batch sizes {batches} must be strictly increasing")
        for p in self.points:
            if p.batch < 1 or p.p50 <= 0 or p.p99 < p.p50 * (1 - 1e-9):  # float noise of scaled points
                raise ProfileError(
                    f"profile {self.key}: bad latency point batch={p.batch} p50={p.p50 * 1e3:g}ms "
                    f"p99={p.p99 * 1e3:g}ms (need batch>=1, 0<p50<=p99)"
                )
        if self.max_batch < 1:
            raise ProfileError(f"profile {self.key}: max_batch ({self.max_batch}) must be >= 1")

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.variant, self.gpu, self.slice)

    @property
    def name(self) -> str:
        return f"{self.variant}@{self.gpu}/{self.slice}"

    def latency(self, batch: int, quantile: Quantile = "p99") -> float:
        """Predicted seconds for one batch of ``batch`` requests, interpolated linearly
        between measured batch sizes and extrapolated from the last two beyond them."""
        if batch < 1:
            raise ProfileError(f"profile {self.name}: batch ({batch}) must be >= 1")
        if batch > self.max_batch:
            raise ProfileError(f"profile {self.name}: batch ({batch}) exceeds max_batch ({self.max_batch})")
        pts = self.points
        if len(pts) == 1:
            return getattr(pts[0], quantile) * (batch / pts[0].batch if batch > pts[0].batch else 1.0)
        i = bisect.bisect_left([p.batch for p in pts], batch)
        if i < len(pts) and pts[i].batch == batch:
            return getattr(pts[i], quantile)
        if i == 0:  # below the smallest measured batch: latency does not drop below it
            return getattr(pts[0], quantile)
        lo, hi = (pts[i - 1], pts[i]) if i < len(pts) else (pts[-2], pts[-1])
        ylo, yhi = getattr(lo, quantile), getattr(hi, quantile)
        return max(ylo, ylo + (yhi - ylo) * (batch - lo.batch) / (hi.batch - lo.batch))

    def latencies(self, top: int, quantile: Quantile = "p99") -> list[float]:
        """:meth:`latency` of every batch ``1..top`` at index ``b`` (index 0 unused), the same
        values in one pass over the points."""
        if top > self.max_batch:
            raise ProfileError(f"profile {self.name}: batch ({top}) exceeds max_batch ({self.max_batch})")
        pts = self.points
        ys = [getattr(p, quantile) for p in pts]
        if len(pts) == 1:
            return [0.0] + [ys[0] * (b / pts[0].batch if b > pts[0].batch else 1.0) for b in range(1, top + 1)]
        out = [0.0]
        i = 0  # the first point at or past b
        for b in range(1, top + 1):
            while i < len(pts) and pts[i].batch < b:
                i += 1
            if i < len(pts) and pts[i].batch == b:
                out.append(ys[i])
                continue
            if i == 0:
                out.append(ys[0])
                continue
            lo, hi = (i - 1, i) if i < len(pts) else (len(pts) - 2, len(pts) - 1)
            ylo, yhi = ys[lo], ys[hi]
            out.append(max(ylo, ylo + (yhi - ylo) * (b - pts[lo].batch) / (pts[hi].batch - pts[lo].batch)))
        return out

    def throughput(self, batch: int, quantile: Quantile = "p50") -> float:
        """Requests per second when a replica runs batches of ``batch`` back to back."""
        return batch / self.latency(batch, quantile)

    def best_batch_within(self, budget: float, quantile: Quantile = "p99") -> int:
        """Largest batch whose latency fits in ``budget`` seconds (0 if even 1 does not)."""
        best = 0
        for b in range(1, self.max_batch + 1):
            if self.latency(b, quantile) <= budget:
                best = b
            else:
                break
        return best

    def renamed(self, model: str, variant: str, provenance: Provenance | None = None) -> Profile:
        """This profile under another model and variant (a copy of the same curve, as a fleet's
        models copied from one family are), ``provenance`` replaced if given. The curve was
        checked when this profile was made, so the copy skips the checks: a fleet makes tens of
        thousands."""
        out = object.__new__(Profile)
        out.__dict__.update(self.__dict__, model=model, variant=variant,
                            provenance=self.provenance if provenance is None else provenance)
        return out

    def with_max_batch(self, max_batch: int) -> Profile:
        from dataclasses import replace

        return replace(self, max_batch=max_batch)


# --------------------------------------------------------------------------- YAML edge


class _PointModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch: int = Field(ge=1, description="batch size")
    p50: float = Field(gt=0, description="median latency of one batch, milliseconds")
    p99: float | None = Field(default=None, gt=0, description="p99 latency, milliseconds; defaults to p50")


class ProvenanceModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = Field(min_length=1, description="where the numbers come from")
    kind: Literal["measured", "derived", "fit", "emulated"] = "measured"
    measured_batches: list[int] = Field(default_factory=list)
    notes: str = ""
    accuracy_source: str = Field(
        default="", description="where spec.accuracy comes from (metric, data set, citation), or why it is unknown"
    )


class _SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, description="model family, e.g. resnet50")
    variant: str = Field(min_length=1, description="variant name, e.g. resnet50-fp16")
    gpu: str = Field(min_length=1, description="GPU model, e.g. A100-80GB")
    slice: str = Field(min_length=1, description="MIG profile (1g.10gb) or 'gpu' for a whole GPU")
    max_batch: int = Field(ge=1, le=4096, description="largest batch the variant accepts")
    memory_mb: float = Field(default=0.0, ge=0, description="device memory the variant needs")
    accuracy: float | None = Field(default=None, ge=0, le=1, description="top-1 accuracy in [0,1]")
    mps_interference: float = Field(
        default=0.1, ge=0, le=2, description="fractional slowdown when MPS co-tenants run at once"
    )
    latency_ms: list[_PointModel] = Field(min_length=1)
    provenance: ProvenanceModel

    @model_validator(mode="after")
    def _check(self) -> _SpecModel:
        batches = [p.batch for p in self.latency_ms]
        if batches != sorted(set(batches)):
            raise ValueError(f"latency_ms batch sizes {batches} must be strictly increasing")
        for p in self.latency_ms:
            if p.p99 is not None and p.p99 < p.p50:
                raise ValueError(f"latency_ms batch {p.batch}: p99 ({p.p99}) < p50 ({p.p50})")
        return self


class _ProfileDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    apiVersion: Literal["headrace.dev/v1"] = API_VERSION
    kind: Literal["Profile"] = "Profile"
    metadata: dict[str, str] = Field(default_factory=dict)
    spec: _SpecModel


def profile_from_dict(doc: dict, where: str = "profile",
                      curves: dict[tuple[LatencyPoint, ...], tuple[LatencyPoint, ...]] | None = None) -> Profile:
    """The Profile of one document; ``curves``: the points tuples read so far, by value, so that
    equal curves share one tuple (this one's is added)."""
    try:
        m = _ProfileDoc.model_validate(doc)
    except ValidationError as e:
        raise ProfileError(format_error(e, where)) from None
    s = m.spec
    points = tuple(LatencyPoint(p.batch, p.p50 / 1e3, (p.p99 if p.p99 is not None else p.p50) / 1e3)
                   for p in s.latency_ms)
    return Profile(
        model=s.model,
        variant=s.variant,
        gpu=s.gpu,
        slice=s.slice,
        max_batch=s.max_batch,
        points=points if curves is None else curves.setdefault(points, points),
        memory_mb=s.memory_mb,
        accuracy=s.accuracy,
        mps_interference=s.mps_interference,
        provenance=Provenance(
            s.provenance.source, s.provenance.kind, tuple(s.provenance.measured_batches), s.provenance.notes,
            s.provenance.accuracy_source,
        ),
    )


def profile_to_dict(p: Profile) -> dict:
    spec: dict = {
        "model": p.model,
        "variant": p.variant,
        "gpu": p.gpu,
        "slice": p.slice,
        "max_batch": p.max_batch,
        "memory_mb": p.memory_mb,
        "accuracy": p.accuracy,
        "mps_interference": p.mps_interference,
        "latency_ms": [
            {"batch": pt.batch, "p50": round(pt.p50 * 1e3, 4), "p99": round(pt.p99 * 1e3, 4)} for pt in p.points
        ],
        "provenance": {
            "source": p.provenance.source,
            "kind": p.provenance.kind,
            "measured_batches": list(p.provenance.measured_batches),
            "notes": p.provenance.notes,
            "accuracy_source": p.provenance.accuracy_source,
        },
    }
    if p.accuracy is None:
        del spec["accuracy"]
    if not p.provenance.accuracy_source:
        del spec["provenance"]["accuracy_source"]
    return {"apiVersion": API_VERSION, "kind": "Profile", "metadata": {"name": p.name}, "spec": spec}


_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where PyYAML has it
# tags of containers (a scalar under one is an error PyYAML reports)
_NOT_SCALAR = frozenset({"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq", "tag:yaml.org,2002:omap",
                         "tag:yaml.org,2002:pairs", "tag:yaml.org,2002:set"})
_NO_KEY, _IN_LIST = object(), object()  # an open mapping awaiting its next key; an open list


class _NotPlain(Exception):
    """A YAML stream holds more than plain mappings, lists and scalars."""


def _yaml_documents(text: str) -> list:
    """The documents of a YAML stream, as PyYAML's safe loader builds them (libyaml's parser
    where PyYAML has it, ~10x faster on a fleet's megabytes of profiles). Where every node is
    plain (no anchor, alias or explicit tag, scalar keys, no merge key) they are built straight
    from the parser's events, each distinct plain scalar resolved and built once; PyYAML would
    compose a node for each first, taking half again as long. Any other stream is PyYAML's to
    load, so the result is always its."""
    loader = _SAFE_LOADER(text)
    try:
        return _plain_documents(loader)
    except _NotPlain:
        return list(yaml.load_all(text, Loader=_SAFE_LOADER))
    finally:
        loader.dispose()


def _plain_documents(loader: yaml.SafeLoader) -> list:
    """:func:`_yaml_documents` from ``loader``'s events; :class:`_NotPlain` at a node that is not plain."""
    docs: list = []
    scalars: dict[str, object] = {}  # plain scalar -> its value (str, int, float, bool, None, date)
    open_: list[dict | list] = []  # the containers being built, innermost last
    keys: list[object] = []  # beside each: its pending key (_NO_KEY before one), _IN_LIST for a list
    constructors = loader.yaml_constructors
    while True:
        ev = loader.get_event()
        kind = type(ev)
        if kind is yaml.ScalarEvent:
            if ev.anchor is not None or ev.tag not in (None, "!"):
                raise _NotPlain
            value = ev.value
            if ev.implicit[0]:  # plain: the resolver's tag, as PyYAML's composer asks
                value = scalars.get(ev.value, _NO_KEY)
                if value is _NO_KEY:
                    tag = loader.resolve(yaml.ScalarNode, ev.value, ev.implicit)
                    build = constructors.get(tag)
                    if build is None or tag in _NOT_SCALAR:  # a merge key, or a tag PyYAML refuses
                        raise _NotPlain
                    value = scalars[ev.value] = build(loader, yaml.ScalarNode(tag, ev.value, ev.start_mark,
                                                                               ev.end_mark))
        elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
            if ev.anchor is not None or ev.tag is not None or (keys and keys[-1] is _NO_KEY):
                raise _NotPlain  # a container as a mapping's key, too
            mapping = kind is yaml.MappingStartEvent
            open_.append({} if mapping else [])
            keys.append(_NO_KEY if mapping else _IN_LIST)
            continue
        elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
            keys.pop()
            value = open_.pop()
        elif kind is yaml.AliasEvent:
            raise _NotPlain
        elif kind is yaml.StreamEndEvent:
            return docs
        else:  # stream start, document start and end
            continue
        if not open_:
            docs.append(value)
        elif keys[-1] is _IN_LIST:
            open_[-1].append(value)  # type: ignore[union-attr]
        elif keys[-1] is _NO_KEY:
            keys[-1] = value
        else:
            open_[-1][keys[-1]] = value  # type: ignore[call-overload]
            keys[-1] = _NO_KEY


class ProfileSet:
    """Profiles keyed by (variant, gpu, slice), indexed by model and by variant (a fleet's
    tens of thousands of profiles are searched by key, not scanned). Loading raises on
    duplicates."""

    def __init__(self, profiles: Iterable[Profile] = ()) -> None:
        self._by_key: dict[tuple[str, str, str], Profile] = {}
        self._by_model: dict[str, list[Profile]] = {}
        self._by_variant: dict[str, list[Profile]] = {}
        if isinstance(profiles, ProfileSet):  # a copy: its profiles were checked as it took them
            other = profiles
            self._by_key = dict(other._by_key)
            self._by_model = {k: list(v) for k, v in other._by_model.items()}
            self._by_variant = {k: list(v) for k, v in other._by_variant.items()}
            return
        for p in profiles:
            self.add(p)

    def add(self, p: Profile) -> None:
        if p.gpu == HOST and p.slice != WHOLE:
            # a host has one device; the profiler names its slice "cpu", the planner WHOLE
            p = replace(p, slice=WHOLE)
        key = p.key
        if key in self._by_key:
            raise ProfileError(f"duplicate profile {p.name}")
        self._by_key[key] = p
        self._by_model.setdefault(p.model, []).append(p)
        self._by_variant.setdefault(p.variant, []).append(p)

    def __contains__(self, key: tuple[str, str, str]) -> bool:
        """Whether a profile is stored under ``(variant, gpu, slice)``."""
        return key in self._by_key

    def get(self, variant: str, gpu: str, slice: str) -> Profile:
        try:
            return self._by_key[(variant, gpu, slice)]
        except KeyError:
            known = ", ".join(sorted(p.name for p in self._by_key.values())) or "none"
            raise ProfileError(f"no profile for {variant}@{gpu}/{slice}; known: {known}") from None

    def find(self, *, model: str | None = None, variant: str | None = None, gpu: str | None = None,
             slice: str | None = None) -> list[Profile]:
        """The profiles matching every filter given, in the order they were added."""
        if variant is not None and gpu is not None and slice is not None:
            p = self._by_key.get((variant, gpu, slice))
            return [p] if p is not None and (model is None or p.model == model) else []
        pool: Iterable[Profile] = (self._by_variant.get(variant, []) if variant is not None
                                   else self._by_model.get(model, []) if model is not None
                                   else self._by_key.values())
        return [
            p for p in pool
            if (model is None or p.model == model) and (variant is None or p.variant == variant)
            and (gpu is None or p.gpu == gpu) and (slice is None or p.slice == slice)
        ]

    def __iter__(self) -> Iterator[Profile]:
        return iter(self._by_key.values())

    def __len__(self) -> int:
        return len(self._by_key)

    @classmethod
    def load(cls, *paths: str | Path) -> ProfileSet:
        out = cls()
        for path in paths:
            path = Path(path)
            files = sorted([*path.glob("*.yaml"), *path.glob("*.json")]) if path.is_dir() else [path]
            for f in files:
                for p in load_profiles(f):
                    out.add(p)
        return out

    @classmethod
    def reference(cls) -> ProfileSet:
        return cls.load(Path(__file__).parent / "reference")


def load_profiles(path: str | Path) -> list[Profile]:
    """The Profile documents of one file: a YAML stream of them, or JSON (a ``.json`` file, or
    any file whose text starts with ``[`` or ``{``) holding one document or a list of them.
    JSON is read with :mod:`json`, about 20x faster than libyaml for a fleet's megabytes of
    profiles; YAML documents may also be lists of Profile documents (JSON text is YAML)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ProfileError(f"{path}: cannot read: {e.strerror}") from None
    docs = _json_documents(path, text)
    if docs is None:
        try:
            docs = [d for d in _yaml_documents(text) if d is not None]
        except yaml.YAMLError as e:
            raise ProfileError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    flat: list[tuple[str, object]] = []
    for i, d in enumerate(docs):
        if isinstance(d, list):
            flat += [(f"{path} document {i} item {k}", x) for k, x in enumerate(d)]
        else:
            flat.append((f"{path} document {i}", d))
    out = []
    # equal curves (a fleet's copies of one family) share one points tuple: the capacity
    # tables and derived profiles are memoised by its identity
    canon: dict[tuple[LatencyPoint, ...], tuple[LatencyPoint, ...]] = {}
    for where, d in flat:
        if not isinstance(d, dict):
            raise ProfileError(f"{where}: expected a mapping, got {type(d).__name__}")
        out.append(profile_from_dict(d, where=where, curves=canon))
    return out


def _json_documents(path: Path, text: str) -> list | None:
    """The documents of JSON ``text`` (a list is one document of many profiles), or None when
    the file is not JSON: its name does not end in ``.json`` and its text does not start like
    JSON, or (without the suffix) ``json`` cannot read it, so YAML gets to."""
    suffix = path.suffix.lower() == ".json"
    if not suffix and text.lstrip()[:1] not in ("[", "{"):
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if not suffix:
            return None  # YAML flow style, or a YAML error to report as such
        raise ProfileError(f"{path}: not valid JSON: line {e.lineno}, column {e.colno}: {e.msg}") from None
    return [data]


def save_profiles(path: str | Path, profiles: Iterable[Profile]) -> None:
    """Profile documents to ``path``: a JSON list when its name ends in ``.json``, else YAML."""
    path = Path(path)
    docs = [profile_to_dict(p) for p in profiles]
    if path.suffix.lower() == ".json":
        path.write_text(json.dumps(docs, indent=1) + "\n")
    else:
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
