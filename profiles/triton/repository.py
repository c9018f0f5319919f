"""Write Triton model repositories: one folder per model with config.pbtxt and 1/model.py.

:class:`ModelConfig` is the subset of Triton's model_config.proto headrace writes; its
:meth:`ModelConfig.to_pbtxt` renders it. Python-backend models get their ``model.py`` copied
(or written) into version 1 and their settings passed as config ``parameters``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

# the directory holding headrace's packages: a python-backend model puts it on sys.path to import them
HEADRACE_ROOT = Path(__file__).resolve().parents[2]

TRITON_DTYPES = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64", "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64",
    "BF16": "TYPE_BF16", "BYTES": "TYPE_STRING",
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # KServe v2 datatype, e.g. FP32
    dims: tuple[int, ...]  # per-request dims, without the batch dimension
    optional: bool = False  # an input a request may leave out

    def to_pbtxt(self) -> str:
        if self.datatype not in TRITON_DTYPES:
            raise ValueError(f"tensor {self.name}: unknown datatype {self.datatype!r}; known: {sorted(TRITON_DTYPES)}")
        dims = ", ".join(str(d) for d in self.dims)
        optional = " optional: true" if self.optional else ""
        return f'{{ name: "{self.name}" data_type: {TRITON_DTYPES[self.datatype]} dims: [ {dims} ]{optional} }}'


@dataclass(frozen=True)
class DynamicBatching:
    """Triton's own dynamic batcher (the baseline headrace is measured against)."""

    max_queue_delay_us: int = 0
    preferred_batch_size: tuple[int, ...] = ()
    default_timeout_us: int = 0  # queue policy: reject requests queued longer than this
    timeout_action: str = "REJECT"
    allow_timeout_override: bool = True

    def to_pbtxt(self) -> str:
        parts = [f"max_queue_delay_microseconds: {self.max_queue_delay_us}"]
        if self.preferred_batch_size:
            parts.append("preferred_batch_size: [ " + ", ".join(map(str, self.preferred_batch_size)) + " ]")
        parts.append(
            "default_queue_policy { "
            f"timeout_action: {self.timeout_action} "
            f"default_timeout_microseconds: {self.default_timeout_us} "
            f"allow_timeout_override: {str(self.allow_timeout_override).lower()} }}"
        )
        return "dynamic_batching { " + " ".join(parts) + " }"


@dataclass(frozen=True)
class ModelConfig:
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = 0
    backend: str = "python"
    instance_count: int = 1
    dynamic_batching: DynamicBatching | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    instance_kind: str = "KIND_CPU"  # KIND_GPU: instances on the devices in ``gpus``
    gpus: tuple[int, ...] = ()  # device indices as the server sees them (KIND_GPU)
    platform: str = ""  # e.g. tensorrt_plan; written instead of ``backend`` when set
    decoupled: bool = False  # the model sends its responses itself, any number per request

    def to_pbtxt(self) -> str:
        gpus = f" gpus: [ {', '.join(map(str, self.gpus))} ]" if self.gpus else ""
        lines = [
            f'name: "{self.name}"',
            f'platform: "{self.platform}"' if self.platform else f'backend: "{self.backend}"',
            f"max_batch_size: {self.max_batch_size}",
            # an empty tensor list is left out: ONNX Runtime and TensorRT complete it from the model
            *(["input [ " + ", ".join(t.to_pbtxt() for t in self.inputs) + " ]"] if self.inputs else []),
            *(["output [ " + ", ".join(t.to_pbtxt() for t in self.outputs) + " ]"] if self.outputs else []),
            f"instance_group [ {{ count: {self.instance_count} kind: {self.instance_kind}{gpus} }} ]",
        ]
        if self.dynamic_batching is not None:
            lines.append(self.dynamic_batching.to_pbtxt())
        if self.decoupled:
            lines.append("model_transaction_policy { decoupled: true }")
        for k, v in self.parameters.items():
            lines.append(f'parameters {{ key: "{k}" value: {{ string_value: {json.dumps(str(v))} }} }}')
        return "\n".join(lines) + "\n"


def write_model(repo: Path, config: ModelConfig, model_py: Path | str, files: dict[str, bytes] | None = None) -> Path:
    """Write one model into ``repo``. ``model_py`` is a path to copy or the source text.
    ``files`` are extra files placed in the version folder (e.g. weights)."""
    repo = Path(repo)
    mdir = repo / config.name
    vdir = mdir / "1"
    vdir.mkdir(parents=True, exist_ok=True)
    (mdir / "config.pbtxt").write_text(config.to_pbtxt())
    if isinstance(model_py, Path):
        shutil.copy2(model_py, vdir / "model.py")
    else:
        (vdir / "model.py").write_text(model_py)
    for name, data in (files or {}).items():
        (vdir / name).write_bytes(data)
    return mdir
