"""Write an emulated-GPU model into a Triton model repository."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml

from profiles.emulator.overhead import DEFAULT_OVERHEAD, Overhead
from profiles.profile import Profile, ProfileError, profile_to_dict
from profiles.triton.repository import DynamicBatching, ModelConfig, TensorSpec, write_model

MODEL_PY = Path(__file__).with_name("triton_model.py")

DEFAULT_INPUT = TensorSpec("INPUT0", "FP32", (16,))
DEFAULT_OUTPUT = TensorSpec("OUTPUT0", "FP32", (16,))


def write_emulated_model(
    repo: str | Path,
    name: str,
    profile: Profile,
    *,
    slice_id: str,
    mode: Literal["timeslice", "mps"] = "timeslice",
    share: float = 1.0,
    arbiter: str | None = None,
    max_batch: int | None = None,
    dynamic_batching: DynamicBatching | None = None,
    instance_count: int = 1,
    client: str | None = None,
    input: TensorSpec = DEFAULT_INPUT,
    output: TensorSpec = DEFAULT_OUTPUT,
    interference: float | None = None,
    jitter: bool = False,
    seed: int = 0,
    overhead: Overhead | None = None,
) -> Path:
    """Write model ``name`` replaying ``profile`` on emulated slice ``slice_id``.

    ``slice_id`` names one slice of one emulated GPU (e.g. ``gpu0/1g.10gb@0``): jobs on different
    slice ids never interfere. ``mode``/``share`` say how tenants of one slice share it
    (:mod:`profiles.sharing`); ``client`` is the MPS client id (default ``name``).
    ``arbiter`` is the socket of an :class:`~profiles.emulator.EmulatedGpu` (``None``: the slice
    stands alone and the model sleeps locally). ``interference`` defaults to the profile's
    ``mps_interference``. ``jitter`` draws seeded batch times between p50 and p99 (default:
    always p50). ``overhead`` (default :data:`DEFAULT_OVERHEAD`): each batch ends that much early
    to cancel Triton's own cost (``Overhead.none()`` turns that off).
    Returns the model folder.
    """
    mb = profile.max_batch if max_batch is None else max_batch
    where = f"emulated model {name} ({profile.name})"
    if mb < 1:
        raise ProfileError(f"{where}: max_batch ({mb}) must be >= 1")
    if mb > profile.max_batch:
        raise ProfileError(
            f"{where}: max_batch ({mb}) exceeds profile max ({profile.max_batch}) "
            f"for {profile.variant} on {profile.slice}"
        )
    if mode not in ("timeslice", "mps"):
        raise ProfileError(f"{where}: mode must be 'timeslice' or 'mps', got {mode!r}")
    if not 0 < share <= 1:
        raise ProfileError(f"{where}: share ({share}) must be in (0, 1]")
    if mode == "timeslice" and share != 1.0:
        raise ProfileError(f"{where}: share ({share}) needs mode 'mps'; time-slicing has no shares")
    if instance_count < 1:
        raise ProfileError(f"{where}: instance_count ({instance_count}) must be >= 1")
    if input.dims != output.dims:
        raise ProfileError(
            f"{where}: input dims {input.dims} and output dims {output.dims} must match "
            "(the model answers OUTPUT = INPUT + 1)"
        )
    if not slice_id:
        raise ProfileError(f"{where}: slice_id must not be empty")
    inter = profile.mps_interference if interference is None else interference
    if not 0 <= inter <= 10:
        raise ProfileError(f"{where}: interference ({inter}) must be in [0, 10]")
    params = {
        "slice_id": slice_id,
        "client": client or name,
        "mode": mode,
        "share": repr(float(share)),
        "interference": repr(float(inter)),
        "arbiter": arbiter or "",
        "jitter": "true" if jitter else "false",
        "seed": str(int(seed)),
        **(overhead or DEFAULT_OVERHEAD).to_params(),
    }
    cfg = ModelConfig(
        name=name, inputs=(input,), outputs=(output,), max_batch_size=mb,
        instance_count=instance_count, dynamic_batching=dynamic_batching, parameters=params,
    )
    doc = yaml.safe_dump(profile_to_dict(profile), sort_keys=False).encode()
    return write_model(Path(repo), cfg, MODEL_PY, files={"profile.yaml": doc})
