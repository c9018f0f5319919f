"""LLM profiles: one variant of a model on one device (a GPU, a MIG slice, or ``tp`` GPUs with
tensor parallelism), with its step time, its memory and its accuracy, each number with its
provenance. Read from YAML documents of kind ``LlmProfile``, as classic profiles are.

The KV cache an engine gets is what the device's memory holds after the weights and the
activations, at vLLM's ``gpu_memory_utilization``: :meth:`LlmProfile.engine_config`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from profiles.llm.engine import EngineConfig
from profiles.llm.kv import BLOCK_SIZE
from profiles.llm.steptime import StepTime
from profiles.profile import (
    API_VERSION,
    ProfileError,
    Provenance,
    ProvenanceModel,
)
from profiles.schema import format_error

REFERENCE = Path(__file__).parent / "reference"
GB = 1e9


@dataclass(frozen=True)
class LlmProfile:
    model: str  # the model, e.g. llama-3.1-8b-instruct
    variant: str  # one way of serving it, e.g. llama-3.1-8b-instruct-fp8
    gpu: str
    slice: str  # a MIG profile (3g.40gb) or "gpu"
    tp: int  # tensor-parallel degree: GPUs (or slices) the replica spans
    memory_gb: float  # device memory of one GPU or slice
    weights_gb: float  # the whole model's weights, split over tp devices
    activation_gb: float  # peak activation memory of one device at the token budget
    kv_bytes_per_token: int  # the whole model's KV per token, split over tp devices
    max_model_len: int
    step_time: StepTime
    accuracy: float | None = None
    provenance: Provenance = Provenance("unknown")
    frontend_s: float = 0.0  # a request's way in through the server's front end, beside the steps

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.variant, self.gpu, self.slice, self.tp)

    @property
    def name(self) -> str:
        return f"{self.variant}@{self.gpu}/{self.slice}" + (f"/tp{self.tp}" if self.tp > 1 else "")

    def kv_blocks(self, gpu_memory_utilization: float = 0.9, block_size: int = BLOCK_SIZE) -> int:
        """KV blocks one replica holds: per device, memory at the utilisation less its share of
        the weights and its activations, over its share of a block."""
        free = self.memory_gb * gpu_memory_utilization - self.weights_gb / self.tp - self.activation_gb
        per_block = block_size * self.kv_bytes_per_token / self.tp
        return max(0, int(free * GB // per_block))

    def engine_config(self, gpu_memory_utilization: float = 0.9, **settings: object) -> EngineConfig:
        """The engine this profile serves, with ``settings`` over vLLM's defaults; ProfileError
        when the weights leave no room for one block of KV."""
        blocks = self.kv_blocks(gpu_memory_utilization, int(settings.get("block_size", BLOCK_SIZE)))
        if blocks < 1:
            raise ProfileError(f"{self.name}: {self.weights_gb / self.tp:g} GB of weights and {self.activation_gb:g} GB "
                               f"of activations leave no KV cache in {self.memory_gb:g} GB at utilisation "
                               f"{gpu_memory_utilization:g}")
        settings.setdefault("max_model_len", self.max_model_len)
        return EngineConfig(num_blocks=blocks, **settings)  # type: ignore[arg-type]


class _StepTimeModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    layers: int = Field(ge=1, description="transformer layers")
    linear_ms: list[tuple[int, float]] = Field(
        min_length=2, description="(tokens in the step, ms per layer) of the token-wise work: linear layers, norms, "
                                  "activation, rope")
    prefill_attn_ms: float = Field(default=0.0, ge=0, description="per layer, when a step holds prefill")
    prefill_attn_per_pair_ns: float = Field(default=0.0, ge=0,
                                            description="per layer, per query-key pair of prefill attention")
    decode_attn_ms: float = Field(default=0.0, ge=0, description="per layer, when a step holds decoding sequences")
    decode_attn_per_kv_ns: float = Field(default=0.0, ge=0, description="per layer, per KV token a decode reads")
    allreduce_ms: float = Field(default=0.0, ge=0, description="per layer, both all-reduces (tensor parallelism)")
    allreduce_per_token_ns: float = Field(default=0.0, ge=0)
    step_ms: float = Field(default=0.0, ge=0, description="per step: scheduling, inputs, launch")
    sample_ms: float = Field(default=0.0, ge=0, description="per sampled sequence: LM head and sampler")

    def to_step_time(self) -> StepTime:
        return StepTime(
            layers=self.layers, linear=tuple((int(x), y / 1e3) for x, y in self.linear_ms),
            prefill_attn_s=self.prefill_attn_ms / 1e3, prefill_attn_per_pair_s=self.prefill_attn_per_pair_ns / 1e9,
            decode_attn_s=self.decode_attn_ms / 1e3, decode_attn_per_kv_s=self.decode_attn_per_kv_ns / 1e9,
            allreduce_s=self.allreduce_ms / 1e3, allreduce_per_token_s=self.allreduce_per_token_ns / 1e9,
            step_s=self.step_ms / 1e3, sample_s=self.sample_ms / 1e3,
        )


class _LlmSpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    variant: str = Field(min_length=1)
    gpu: str = Field(min_length=1, description="GPU model, e.g. H100-80GB, or CPU for a host")
    slice: str = Field(default="gpu", min_length=1, description="MIG profile (3g.40gb) or 'gpu'")
    tp: int = Field(default=1, ge=1, le=64, description="tensor-parallel degree")
    memory_gb: float = Field(gt=0, description="memory of one GPU or slice")
    weights_gb: float = Field(gt=0, description="the whole model's weights")
    activation_gb: float = Field(default=0.0, ge=0, description="peak activations of one device")
    kv_bytes_per_token: int = Field(ge=1, description="2 x layers x KV heads x head dim x bytes")
    max_model_len: int = Field(ge=1)
    accuracy: float | None = Field(default=None, ge=0, le=1)
    frontend_ms: float = Field(
        default=0.0, ge=0, description="a request's time in the server's front end (HTTP, tokenizer, the hand-off to the "
                                       "engine core) before the scheduler sees it, spent beside the steps")
    step_time: _StepTimeModel
    provenance: ProvenanceModel

    @model_validator(mode="after")
    def _check(self) -> _LlmSpecModel:
        xs = [x for x, _ in self.step_time.linear_ms]
        if xs != sorted(set(xs)) or xs[0] < 1:
            raise ValueError(f"step_time.linear_ms token counts {xs[:6]}... must increase from 1")
        return self


class _LlmDoc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    apiVersion: Literal["headrace.dev/v1"] = API_VERSION
    kind: Literal["LlmProfile"] = "LlmProfile"
    metadata: dict[str, str] = Field(default_factory=dict)
    spec: _LlmSpecModel


def llm_profile_from_dict(doc: dict, where: str = "LLM profile") -> LlmProfile:
    try:
        s = _LlmDoc.model_validate(doc).spec
    except ValidationError as e:
        raise ProfileError(format_error(e, where)) from None
    p = s.provenance
    return LlmProfile(
        model=s.model, variant=s.variant, gpu=s.gpu, slice=s.slice, tp=s.tp, memory_gb=s.memory_gb,
        weights_gb=s.weights_gb, activation_gb=s.activation_gb, kv_bytes_per_token=s.kv_bytes_per_token,
        max_model_len=s.max_model_len, step_time=s.step_time.to_step_time(), accuracy=s.accuracy,
        frontend_s=s.frontend_ms / 1e3,
        provenance=Provenance(p.source, p.kind, tuple(p.measured_batches), p.notes, p.accuracy_source),
    )


def llm_profile_to_dict(p: LlmProfile) -> dict:
    st = p.step_time
    spec = {
        "model": p.model, "variant": p.variant, "gpu": p.gpu, "slice": p.slice, "tp": p.tp,
        "memory_gb": p.memory_gb, "weights_gb": p.weights_gb, "activation_gb": p.activation_gb,
        "kv_bytes_per_token": p.kv_bytes_per_token, "max_model_len": p.max_model_len, "accuracy": p.accuracy,
        "step_time": {
            "layers": st.layers, "linear_ms": [[x, round(y * 1e3, 6)] for x, y in st.linear],
            "prefill_attn_ms": round(st.prefill_attn_s * 1e3, 6),
            "prefill_attn_per_pair_ns": round(st.prefill_attn_per_pair_s * 1e9, 9),
            "decode_attn_ms": round(st.decode_attn_s * 1e3, 6),
            "decode_attn_per_kv_ns": round(st.decode_attn_per_kv_s * 1e9, 9),
            "allreduce_ms": round(st.allreduce_s * 1e3, 6),
            "allreduce_per_token_ns": round(st.allreduce_per_token_s * 1e9, 9),
            "step_ms": round(st.step_s * 1e3, 6), "sample_ms": round(st.sample_s * 1e3, 6),
        },
        "provenance": {"source": p.provenance.source, "kind": p.provenance.kind, "notes": p.provenance.notes,
                       "accuracy_source": p.provenance.accuracy_source},
    }
    if p.accuracy is None:
        del spec["accuracy"]
    if p.frontend_s:
        spec["frontend_ms"] = round(p.frontend_s * 1e3, 6)
    return {"apiVersion": API_VERSION, "kind": "LlmProfile", "metadata": {"name": p.name}, "spec": spec}


def load_llm_profiles(*paths: str | Path) -> list[LlmProfile]:
    """The LlmProfile documents of YAML files and directories of them (the shipped reference
    profiles without an argument)."""
    out = []
    for path in paths or (REFERENCE,):
        path = Path(path)
        for f in sorted(path.glob("*.yaml")) if path.is_dir() else [path]:
            try:
                docs = [d for d in yaml.safe_load_all(f.read_text()) if d is not None]
            except (OSError, yaml.YAMLError) as e:
                raise ProfileError(f"{f}: cannot read: {' '.join(str(e).split())}") from None
            out += [llm_profile_from_dict(d, f"{f} document {i}") for i, d in enumerate(docs)]
    return out


@functools.cache
def reference_llm_profiles() -> tuple[LlmProfile, ...]:
    """The shipped reference profiles, read once."""
    return tuple(load_llm_profiles()) if REFERENCE.is_dir() else ()


def find_llm_profile(ref: str, base_dir: Path | None = None) -> LlmProfile:
    """The LLM profile ``ref`` names: a YAML file holding one LlmProfile (relative to
    ``base_dir``), else a reference profile's name (``variant@gpu/slice[/tpN]``) or a variant only
    one reference profile has; ProfileError naming the candidates otherwise."""
    path = Path(ref)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    if path.is_file():
        found = load_llm_profiles(path)
        if len(found) != 1:
            raise ProfileError(f"{path} holds {len(found)} LLM profiles; name one of them: "
                               + ", ".join(p.name for p in found))
        return found[0]
    known = reference_llm_profiles()
    match = [p for p in known if p.name == ref] or [p for p in known if p.variant == ref]
    if len(match) == 1:
        return match[0]
    if match:
        raise ProfileError(f"{ref!r} is served on several devices; name one: {', '.join(p.name for p in match)}")
    raise ProfileError(f"no LLM profile file or reference profile named {ref!r}; known: "
                       f"{', '.join(p.name for p in known) or 'none'}")
