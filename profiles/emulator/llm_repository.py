"""Write the emulated LLM engine into a Triton model repository: a decoupled python-backend model
(``llm_triton_model.py``) that serves one :class:`~profiles.llm.profile.LlmProfile`.

Its tensors are the ones Triton's LLM backends (vLLM's, TensorRT-LLM's) take, so Triton's
``generate`` / ``generate_stream`` endpoints and gRPC ``ModelStreamInfer`` reach it as they reach
a real engine: ``text_input`` (BYTES), and optionally ``max_tokens`` (INT32), ``stream``,
``ignore_eos`` and ``exclude_input_in_output`` (BOOL) and ``seed`` (UINT64); it answers
``text_output`` (BYTES). The profile is written beside the model as ``profile.yaml``; the engine
it runs (KV blocks, token budget, sequences) as config ``parameters``, so config.pbtxt shows it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import yaml

from profiles.llm.engine import EngineConfig
from profiles.llm.profile import LlmProfile, llm_profile_to_dict
from profiles.profile import ProfileError
from profiles.triton.repository import HEADRACE_ROOT, ModelConfig, TensorSpec, write_model

MODEL_PY = Path(__file__).with_name("llm_triton_model.py")
PROFILE_FILE = "profile.yaml"
DEFAULT_MAX_TOKENS = 16  # what vLLM samples when a request names no max_tokens

INPUTS = (
    TensorSpec("text_input", "BYTES", (1,)),
    TensorSpec("max_tokens", "INT32", (1,), optional=True),
    TensorSpec("stream", "BOOL", (1,), optional=True),
    TensorSpec("seed", "UINT64", (1,), optional=True),
    TensorSpec("ignore_eos", "BOOL", (1,), optional=True),
    TensorSpec("exclude_input_in_output", "BOOL", (1,), optional=True),
)
OUTPUTS = (TensorSpec("text_output", "BYTES", (-1,)),)


def engine_params(config: EngineConfig) -> dict[str, str]:
    """An engine's settings as Triton config parameters (read back by :func:`engine_config_from_params`)."""
    out = {}
    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        out[f.name] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out


def engine_config_from_params(params: Mapping[str, str]) -> EngineConfig:
    """The engine whose settings :func:`engine_params` wrote (ValueError naming a bad or missing one)."""
    values: dict[str, int | bool] = {}
    for f in dataclasses.fields(EngineConfig):
        if f.name not in params:
            raise ValueError(f"engine parameter {f.name!r} is missing")
        raw = params[f.name]
        if f.type == "bool":
            if raw not in ("true", "false"):
                raise ValueError(f"engine parameter {f.name!r} must be true or false, got {raw!r}")
            values[f.name] = raw == "true"
        else:
            try:
                values[f.name] = int(raw)
            except ValueError:
                raise ValueError(f"engine parameter {f.name!r} must be an integer, got {raw!r}") from None
    return EngineConfig(**values)  # type: ignore[arg-type]


def write_llm_model(
    repo: str | Path,
    name: str,
    profile: LlmProfile,
    *,
    gpu_memory_utilization: float = 0.9,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    headrace_root: str | Path = HEADRACE_ROOT,
    **settings: int | bool,
) -> Path:
    """Write model ``name``: one emulated engine serving ``profile``, its KV cache what the
    profile's memory holds at ``gpu_memory_utilization``, ``settings`` (EngineConfig fields:
    ``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``, ``prefix_caching``,
    ``chunked_prefill``, ...) over vLLM's defaults. ``headrace_root`` is put on the python
    backend's import path. Returns the model folder; ProfileError when the engine cannot be built.
    """
    where = f"emulated LLM model {name} ({profile.name})"
    if not 0 < gpu_memory_utilization <= 1:
        raise ProfileError(f"{where}: gpu_memory_utilization ({gpu_memory_utilization}) must be in (0, 1]")
    if default_max_tokens < 1:
        raise ProfileError(f"{where}: default_max_tokens ({default_max_tokens}) must be at least 1")
    known = {f.name for f in dataclasses.fields(EngineConfig)} - {"num_blocks"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ProfileError(f"{where}: unknown engine settings {unknown}; known: {sorted(known)}")
    try:
        config = profile.engine_config(gpu_memory_utilization, **settings)
    except ProfileError:
        raise
    except ValueError as e:  # EngineConfig's own checks
        raise ProfileError(f"{where}: {e}") from None
    if config.max_model_len > profile.max_model_len:
        raise ProfileError(f"{where}: max_model_len ({config.max_model_len}) exceeds the profile's "
                           f"({profile.max_model_len})")
    params = {**engine_params(config), "default_max_tokens": str(default_max_tokens),
              "headrace_root": str(headrace_root)}
    cfg = ModelConfig(name=name, inputs=INPUTS, outputs=OUTPUTS, max_batch_size=0, parameters=params,
                      decoupled=True)
    doc = yaml.safe_dump(llm_profile_to_dict(profile), sort_keys=False).encode()
    return write_model(Path(repo), cfg, MODEL_PY, files={PROFILE_FILE: doc})
