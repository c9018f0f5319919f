"""GPU model repositories for a replica on a real node: a variant's artifact served by ONNX
Runtime or TensorRT with its instances on the replica's device (``KIND_GPU``).

An artifact is either a model file (``.onnx`` for ONNX Runtime; ``.plan`` or ``.engine`` for
TensorRT) or a Triton model directory (``config.pbtxt`` and numbered versions). A file gets a
config written from :class:`profiles.triton.repository.ModelConfig` (tensors left to Triton's
auto-complete); a directory keeps its config, renamed to the variant, with its instance group
replaced. The server sees only its own device (``CUDA_VISIBLE_DEVICES``), so ``gpus`` is ``[0]``.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from profiles.triton.repository import ModelConfig
from profiles.triton.sources import SourceError, VariantSource, check_artifact, versions

# suffix -> (backend, platform, file name Triton looks for)
MODEL_FILES = {
    ".onnx": ("onnxruntime", "", "model.onnx"),
    ".plan": ("tensorrt", "tensorrt_plan", "model.plan"),
    ".engine": ("tensorrt", "tensorrt_plan", "model.plan"),
}


@dataclass(frozen=True)
class GpuModel:
    """What one replica's repository holds: its config text and the files copied into it
    (source path, destination relative to the model folder)."""

    variant: str
    config: str
    files: tuple[tuple[Path, str], ...]


def kind_gpu(config: str, gpus: tuple[int, ...] = (0,), count: int = 1) -> str:
    """``config`` with its ``instance_group`` replaced by one ``KIND_GPU`` group on ``gpus``."""
    group = f"instance_group [ {{ count: {count} kind: KIND_GPU gpus: [ {', '.join(map(str, gpus))} ] }} ]"
    m = re.search(r"(?m)^\s*instance_group\s*\[", config)
    if m is None:
        return config.rstrip("\n") + "\n" + group + "\n"
    depth, i = 0, m.end() - 1
    for i in range(m.end() - 1, len(config)):  # noqa: B007  (i is the closing bracket after the loop)
        depth += {"[": 1, "]": -1}.get(config[i], 0)
        if depth == 0:
            break
    else:
        raise SourceError("config.pbtxt: instance_group [ is never closed")
    return config[:m.start()] + "\n" + group + config[i + 1:]


def gpu_model(variant: str, src: VariantSource, max_batch: int, gpus: tuple[int, ...] = (0,)) -> GpuModel:
    """The repository entry serving ``variant`` from ``src`` on ``gpus`` (read, not written)."""
    if src.kind != "artifact":
        raise SourceError(f"variant {variant}: a GPU repository needs an artifact source, not {src.kind!r}")
    path = src.path()
    if path.is_file():
        if path.suffix not in MODEL_FILES:
            raise SourceError(f"variant {variant}: {path} is neither a model file ({', '.join(MODEL_FILES)}) "
                              "nor a Triton model directory")
        backend, platform, name = MODEL_FILES[path.suffix]
        cfg = ModelConfig(variant, (), (), max_batch_size=max_batch, backend=backend, platform=platform,
                          instance_kind="KIND_GPU", gpus=gpus)
        return GpuModel(variant, cfg.to_pbtxt(), ((path, f"1/{name}"),))
    d = check_artifact(variant, src)
    config = re.sub(r'(?m)^name:\s*"[^"]*"', f'name: "{variant}"', (d / "config.pbtxt").read_text())
    pick = src.version or versions(d)[-1]
    if src.version is not None and "version_policy" not in config:
        config += f"\nversion_policy: {{ specific: {{ versions: [{pick}] }} }}\n"
    files = tuple((p, p.name) for p in sorted(d.iterdir())
                  if p.name != "config.pbtxt" and not (p.name.isdigit() and int(p.name) != pick))
    return GpuModel(variant, kind_gpu(config, gpus), files)


def write_gpu_model(repo: Path, model: GpuModel) -> Path:
    """Write ``model`` into the repository folder ``repo``; returns the model's folder."""
    out = Path(repo) / model.variant
    out.mkdir(parents=True, exist_ok=True)
    for src, rel in model.files:
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dest)
    (out / "config.pbtxt").write_text(model.config)
    return out
