"""Where a variant's model comes from, and writing it into one replica's Triton repository.

Three sources: ``emulated`` (a python-backend model replaying the variant's profile on its
emulated slice), ``digits`` (the built-in MLP family, trained here on scikit-learn's digits),
and ``artifact`` (a Triton model directory of the user's: ONNX, TensorRT, Python, ...).
"""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from profiles.profile import Profile
from profiles.triton.repository import DynamicBatching

SourceKind = Literal["emulated", "digits", "artifact"]


class SourceError(ValueError):
    """A variant's model cannot be written; the message names the variant and the path."""


@dataclass(frozen=True)
class VariantSource:
    kind: SourceKind = "emulated"
    uri: str | None = None  # artifact: a Triton model directory (path or file://)
    version: int | None = None  # artifact: the version folder to serve (None: the highest)
    base_dir: Path | None = None  # resolves a relative uri (the YAML file's folder)

    def path(self) -> Path:
        if self.uri is None:
            raise SourceError("an artifact source needs a uri")
        p = Path(self.uri.removeprefix("file://"))
        return p if p.is_absolute() or self.base_dir is None else self.base_dir / p


@dataclass(frozen=True)
class Placement:
    """Where one replica runs, as the emulated GPU needs to know it."""

    slice_id: str  # <gpu>/<slice label>: replicas on one slice id share it
    mps: bool
    share: float
    arbiter: str | None  # the emulated GPU's socket (None: no emulated GPU, e.g. the host)
    client: str  # MPS client id


def versions(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def check_artifact(variant: str, src: VariantSource) -> Path:
    """The artifact's directory, checked: it holds config.pbtxt and the version asked for."""
    d = src.path()
    if not (d / "config.pbtxt").is_file():
        raise SourceError(f"variant {variant}: {d} is not a Triton model directory (no config.pbtxt)")
    have = versions(d)
    if not have:
        raise SourceError(f"variant {variant}: {d} has no numbered version folder")
    if src.version is not None and src.version not in have:
        raise SourceError(f"variant {variant}: {d} has no version {src.version}; versions: {have}")
    return d


_DIGESTS: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> sha256: a file read once


def _file_digest(p: Path) -> str:
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        with p.open("rb") as f:
            _DIGESTS[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return _DIGESTS[key]


def revision(variant: str, src: VariantSource) -> str:
    """What a replica of ``variant`` serves, as a digest: for an artifact, its directory,
    the version served and the SHA-256 of every file a replica copies (config.pbtxt, that
    version's folder, the files beside them); "" for the built-in sources, whose models are
    the profile's and the code's. A changed digest is a new revision: a rolling replacement."""
    if src.kind != "artifact":
        return ""
    d = check_artifact(variant, src)
    pick = src.version or versions(d)[-1]
    h = hashlib.sha256(f"{d.resolve()}\0{pick}\0".encode())
    for p in sorted(d.rglob("*")):
        rel = p.relative_to(d)
        top = rel.parts[0]
        if p.is_dir() or (top.isdigit() and (d / top).is_dir() and int(top) != pick):
            continue
        h.update(f"{rel.as_posix()}\0{_file_digest(p)}\0".encode())
    return h.hexdigest()[:16]


def write_replica_model(repo: Path, variant: str, src: VariantSource, profile: Profile, where: Placement,
                        max_batch: int, dynamic_batching: DynamicBatching | None = None) -> None:
    """Write ``variant`` into the Triton model repository ``repo`` of one replica
    (``dynamic_batching``: Triton's own batcher in an emulated model, for clients that call
    Triton directly)."""
    if src.kind == "emulated":
        from profiles.emulator import write_emulated_model  # noqa: PLC0415

        write_emulated_model(repo, variant, profile, slice_id=where.slice_id,
                             mode="mps" if where.mps else "timeslice", share=where.share,
                             arbiter=where.arbiter, max_batch=max_batch, client=where.client,
                             dynamic_batching=dynamic_batching)
    elif src.kind == "digits":
        from profiles.digits.family import write_digits_models  # noqa: PLC0415

        write_digits_models(repo, [variant], max_batch=min(max_batch, 4096))
    else:
        d = check_artifact(variant, src)
        out = repo / variant
        out.mkdir(parents=True, exist_ok=True)
        config = (d / "config.pbtxt").read_text()
        # Triton requires the config's name to match the folder: serve it under the variant name
        config = re.sub(r'(?m)^name:\s*"[^"]*"', f'name: "{variant}"', config)
        pick = src.version or versions(d)[-1]
        if src.version is not None and "version_policy" not in config:
            config += f"\nversion_policy: {{ specific: {{ versions: [{pick}] }} }}\n"
        (out / "config.pbtxt").write_text(config)
        for p in d.iterdir():
            if p.name == "config.pbtxt" or (p.name.isdigit() and p.is_dir() and int(p.name) != pick):
                continue
            (shutil.copytree if p.is_dir() else shutil.copy2)(p, out / p.name)
