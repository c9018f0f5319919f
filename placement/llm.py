"""Generative deployments (``ModelDeployment.spec.llm``) sized and placed: each replica is one
engine serving one variant on one whole GPU of the pool, taken out of the inventory before the
classic planner places the rest (``headrace up`` and ``apply``, and ``headrace plan`` and ``sim``
on the same documents, so they plan the classic deployments on the same GPUs).

Two steps, both sans-IO (:func:`llm_profiles` reads the profiles they take):

- :func:`choose` (when the documents are validated): per deployment, the variant and GPU model,
  and how many replicas. The count is the deployment's ``llm.replicas``, else the fewest that keep
  90% of requests within both token SLOs (:func:`size`, the engine model in virtual time).
  The variant is the most accurate one whose replicas fit the GPUs left; none fitting is a
  :class:`SpecError` naming the deployment.
- :func:`place` (at each apply): those replicas on GPU ids. A replica the running plan already has
  (same model, variant and GPU) keeps its GPU. Otherwise GPUs without MIG come first, then the
  pool's last GPUs, so the MIG-capable GPUs stay with the classic planner.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from placement.plan import GpuClass, Inventory
from profiles.gateway_config import LlmModelConfig, LlmReplicaConfig
from profiles.llm.engine import Engine, LlmRequest
from profiles.llm.loop import EngineLoop, replay
from profiles.llm.profile import LlmProfile, load_llm_profiles
from profiles.profile import ProfileError
from profiles.schema import (
    Documents,
    LlmSpec,
    ModelDeployment,
    SpecError,
    TokenLengths,
    absolute_path,
)

GPU_MEMORY_UTILIZATION = 0.9  # the engines' --gpu-memory-utilization, and the KV cache sizing assumes
TARGET = 0.9  # the share of requests that must meet both SLOs
SIZING_REQUESTS = 300
IDLE_GAP_S = 1e6  # seconds between requests when sizing for rate 0: longer than any request takes
VOCAB_LOW = 16  # prompt token ids lie in [16, vocab), as the emulated tokenizer makes them


# --------------------------------------------------------------------------- sizing


def draw(lengths: TokenLengths, rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    """``n`` token counts of ``lengths``, each in [1, min(max, cap)]."""
    if lengths.dist == "fixed":
        out = np.full(n, lengths.mean)
    else:  # lognormal with the given mean: mu = ln(mean) - sigma^2 / 2
        out = rng.lognormal(math.log(lengths.mean) - lengths.sigma ** 2 / 2, lengths.sigma, n)
    top = min(lengths.max or cap, cap)
    return np.clip(np.rint(out), 1, top).astype(np.int64)


def attainment(profile: LlmProfile, llm: LlmSpec, rate: float, slo_ttft_s: float, seed: int = 0,
               requests: int = SIZING_REQUESTS) -> float:
    """The share of ``requests`` Poisson arrivals at ``rate`` req/s on one engine of ``profile``
    meeting both SLOs (TTFT within ``slo_ttft_s``, TPOT within ``llm.slo_tpot_ms``), run
    through the engine model in virtual time: each token arrives at the end of the step that
    made it. Prompts are distinct (no prefix sharing); lengths follow ``llm``'s distributions."""
    rng = np.random.default_rng(seed)
    config = profile.engine_config(GPU_MEMORY_UTILIZATION)
    ctx = config.max_model_len
    ins = draw(llm.input_tokens, rng, requests, ctx - 1)
    outs = np.minimum(draw(llm.output_tokens, rng, requests, ctx - 1), ctx - ins)
    # at rate 0 each request comes alone, long after the one before is answered
    arrivals = np.cumsum(rng.exponential(1.0 / rate, requests) if rate > 0 else np.full(requests, IDLE_GAP_S))
    sends = [(float(arrivals[k]), LlmRequest(str(k), tuple(rng.integers(VOCAB_LOW, config.vocab_size, int(ins[k])).tolist()),
                                            int(outs[k]), seed=k)) for k in range(requests)]
    times = replay(EngineLoop(Engine(config, profile.step_time), profile.frontend_s), sends)
    tpot_s = llm.slo_tpot_ms / 1e3
    met = 0
    for i in range(requests):
        t = times[str(i)]
        if not t:
            continue
        n = int(outs[i])
        tpot = (t[-1] - t[0]) / (n - 1) if n > 1 else 0.0
        met += t[0] - arrivals[i] <= slo_ttft_s and tpot <= tpot_s
    return met / requests


def size(profile: LlmProfile, llm: LlmSpec, rate: float, slo_ttft_s: float, limit: int,
         seed: int = 0) -> tuple[int, float] | None:
    """The fewest engines of ``profile`` (up to ``limit``) that keep :data:`TARGET` of requests
    within both SLOs when ``rate`` req/s split evenly among them (each a Poisson stream at
    ``rate / n``), with the attainment it predicts; None when ``limit`` engines do not.

    A first cut: one engine's attainment in virtual time on a few hundred seeded requests, no
    router, no prefix sharing; the token-level simulator's capacity search is to replace it."""
    for n in range(1, limit + 1):
        att = attainment(profile, llm, rate / n, slo_ttft_s, seed)
        if att >= TARGET:
            return n, att
    return None


# --------------------------------------------------------------------------- choosing


def llm_profiles(docs: Documents) -> list[LlmProfile]:
    """The reference LLM profiles, plus the LlmProfile files generative deployments' variants
    name (``profile``), which come first."""
    mine = [md for md in docs.deployments if md.spec.llm is not None]
    own: list[LlmProfile] = []
    for md in mine:
        root = docs.base_dir.get(id(md), Path.cwd())
        for i, v in enumerate(md.spec.variant_specs()):
            if v.profile is not None:
                try:
                    found = load_llm_profiles(absolute_path(v.profile, root))
                except (OSError, ProfileError) as e:
                    raise SpecError(f"{docs.origin(md)}: spec.variants.{i}.profile: {e} (got {v.profile!r})") from None
                own += [p for p in found if p.variant == v.name] or found
    return own + load_llm_profiles() if mine else []


@dataclass(frozen=True)
class LlmChoice:
    """What one generative deployment runs: ``count`` engines of ``profile``."""

    name: str  # the deployment's metadata.name
    model: str  # the name clients address
    profile: LlmProfile
    count: int
    predicted: float | None  # attainment the sizing predicts (None: the count was given)
    slo_ttft_ms: float
    slo_tpot_ms: float
    priority: str


def _order(inv: Inventory) -> list[tuple[str, GpuClass]]:
    """Every GPU of the pool, in the order an LLM replica takes them: MIG off first, then the
    pool's last GPUs first."""
    gpus = [(gid, c) for c in inv.classes for gid in c.ids]
    return [g for _, g in sorted(enumerate(gpus), key=lambda x: (x[1][1].mig, -x[0]))]


def _candidates(md: ModelDeployment, profiles: Sequence[LlmProfile], where: str) -> list[LlmProfile]:
    """The deployment's whole-GPU profiles: its variants' (else its model's), as accurate as its floor."""
    s = md.spec
    mine = [p for p in profiles if p.tp == 1 and p.slice == "gpu"]
    names = s.variant_names()
    if names:
        known = {p.variant for p in mine}
        for i, v in enumerate(names):
            if v not in known:
                raise SpecError(f"{where}: spec.variants.{i}: no whole-GPU LLM profile of variant {v!r}; "
                                f"known: {sorted(known)} (got {v!r})")
        mine = [p for p in mine if p.variant in names]
    else:
        mine = [p for p in mine if p.model == s.model]
        if not mine:
            have = sorted({p.model for p in profiles})
            raise SpecError(f"{where}: spec.model: no LLM profiles of model {s.model!r} and no variants listed; "
                            f"profiled: {have} (got {s.model!r})")
    if s.accuracy_floor is not None:
        mine = [p for p in mine if p.accuracy is not None and p.accuracy >= s.accuracy_floor]
        if not mine:
            raise SpecError(f"{where}: spec.accuracy_floor: no variant is at least {s.accuracy_floor:g} accurate "
                            f"(got {s.accuracy_floor:g})")
    return mine


def choose(deployments: Sequence[ModelDeployment], origin: Callable[[object], str], inv: Inventory,
           profiles: Sequence[LlmProfile]) -> list[LlmChoice]:
    """Each generative deployment's variant, GPU model and replica count, in document order, each
    taking its GPUs from what the ones before it left (see the module's docstring)."""
    free: dict[str, int] = {}
    for c in inv.classes:
        free[c.gpu] = free.get(c.gpu, 0) + len(c.ids)
    rank = {}  # GPU model -> the place of its first GPU in the order replicas take them
    for _, c in _order(inv):
        rank.setdefault(c.gpu, len(rank))
    out = []
    for md in deployments:
        s, llm, where = md.spec, md.spec.llm, origin(md)
        if llm is None:
            continue
        if llm.engine != "emulated":
            raise SpecError(f"{where}: spec.llm.engine: headrace up starts emulated engines only; a "
                            f"{llm.engine} engine is served by headrace serve's llm_models (got {llm.engine!r})")
        rate = s.rate * s.headroom
        tried = []
        mine = _candidates(md, profiles, where)  # most accurate first (unknown last), then the GPUs taken first
        for p in sorted(mine, key=lambda p: (-(p.accuracy if p.accuracy is not None else -1.0),
                                             rank.get(p.gpu, len(rank)))):
            have = free.get(p.gpu, 0)
            if have == 0:
                continue
            if llm.replicas is not None:
                fit = (llm.replicas, None) if llm.replicas <= have else None
            else:
                fit = size(p, llm, rate, s.slo_ms / 1e3, have)
            if fit is None:
                tried.append(f"{p.name} ({have} free)")
                continue
            free[p.gpu] -= fit[0]
            out.append(LlmChoice(md.metadata.name, s.model, p, fit[0], fit[1], s.slo_ms, llm.slo_tpot_ms, s.priority))
            break
        else:
            need = f"{llm.replicas} replicas" if llm.replicas else (
                f"{TARGET:.0%} of requests within TTFT {s.slo_ms:g} ms and TPOT {llm.slo_tpot_ms:g} ms at "
                f"{rate:g} req/s")
            raise SpecError(f"{where}: spec.llm: not enough free whole GPUs for {need}; tried "
                            f"{', '.join(tried) or 'no GPU of a profiled model is free'} (got {s.model!r})")
    return out


# --------------------------------------------------------------------------- placing


@dataclass(frozen=True)
class LlmReplica:
    """One engine: a variant of a deployment's model on one whole GPU."""

    id: str  # model/variant@gpu
    model: str
    profile: LlmProfile
    gpu: str  # the GPU's id in the pool

    @property
    def variant(self) -> str:
        return self.profile.variant


@dataclass(frozen=True)
class LlmPlan:
    choices: tuple[LlmChoice, ...] = ()
    replicas: tuple[LlmReplica, ...] = ()

    @property
    def gpus(self) -> set[str]:
        return {r.gpu for r in self.replicas}

    def of(self, model: str) -> list[LlmReplica]:
        return [r for r in self.replicas if r.model == model]


def place(choices: Sequence[LlmChoice], inv: Inventory, keep: LlmPlan | None = None,
          busy: frozenset[str] = frozenset()) -> tuple[LlmPlan, Inventory]:
    """The chosen replicas on GPU ids (``keep``: the running plan, whose matching replicas stay
    where they are; ``busy``: GPUs the running classic plan uses, taken last), and the
    inventory left for the classic planner."""
    order = sorted((gid for gid, _ in _order(inv)), key=lambda g: g in busy)
    model_of = {gid: c.gpu for gid, c in _order(inv)}
    taken: set[str] = set()
    out = []
    for ch in choices:
        kept = [r.gpu for r in (keep.of(ch.model) if keep else []) if r.variant == ch.profile.variant
                and model_of.get(r.gpu) == ch.profile.gpu]
        pool = kept + [g for g in order if g not in kept and model_of[g] == ch.profile.gpu]
        gpus = [g for g in pool if g not in taken][:ch.count]
        if len(gpus) < ch.count:  # choose() counted them: only a changed pool gets here
            raise SpecError(f"{ch.name}: {ch.count} {ch.profile.gpu} GPUs wanted, {len(gpus)} free")
        taken.update(gpus)
        out += [LlmReplica(f"{ch.model}/{ch.profile.variant}@{g}", ch.model, ch.profile, g) for g in gpus]
    left = tuple(replace(c, ids=tuple(i for i in c.ids if i not in taken)) for c in inv.classes)
    budget = inv.max_gpus
    if budget is not None and taken:
        if budget <= len(taken):
            raise SpecError(f"GpuPool spec.max_gpus ({budget}) leaves no GPU beside the {len(taken)} the LLM "
                            "replicas take")
        budget -= len(taken)
    return LlmPlan(tuple(choices), tuple(out)), replace(inv, classes=tuple(c for c in left if c.ids),
                                                        max_gpus=budget)


def llm_models(plan: LlmPlan, urls: dict[str, str], profiles: dict[str, str] | None = None) -> list[LlmModelConfig]:
    """The gateway's ``llm_models``: each deployment with its SLOs as defaults and the replicas in
    ``urls`` (replica id -> engine URL), each with the profile its engine runs (``profiles``:
    replica id -> the engine's profile file; else the profile's reference name)."""
    profiles = profiles or {}
    return [model_config(ch, [replica_config(r, urls[r.id], profiles.get(r.id)) for r in plan.of(ch.model)
                              if r.id in urls])
            for ch in plan.choices]


def model_config(ch: LlmChoice, replicas: list[LlmReplicaConfig]) -> LlmModelConfig:
    """The gateway's model of a generative deployment: its name, SLOs and priority as defaults."""
    return LlmModelConfig(name=ch.model, slo_ttft_ms=ch.slo_ttft_ms, slo_tpot_ms=ch.slo_tpot_ms,
                          priority=ch.priority, replicas=replicas)  # type: ignore[arg-type]


def replica_config(r: LlmReplica, url: str, profile: str | None = None) -> LlmReplicaConfig:
    """An engine of ``r`` at ``url``, which answers to the variant's name and runs ``profile``
    (a profile file; None: ``r``'s profile by its reference name) at the engines' memory use."""
    return LlmReplicaConfig(url=url, engine="emulated", model=r.variant, id=r.id, profile=profile or r.profile.name,
                            gpu_memory_utilization=GPU_MEMORY_UTILIZATION)
