"""The run record every JSON report carries: the whole :class:`~loadgen.spec.LoadSpec` (every
option that shaped the run, defaults included), the files it read with their digests, the
headrace version and commit, and the host the load came from, so a run can be rebuilt and
compared with the one that made it::

    spec = LoadSpec.model_validate(report["run"]["spec"])
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from loadgen.spec import LoadSpec

ROOT = Path(__file__).resolve().parent.parent
SECRET_FIELDS = ("api_key",)  # recorded as whether they were set, never their value


@functools.cache
def headrace_version() -> dict[str, str | None]:
    """The installed package version and, in a git checkout, the commit (``+dirty`` when the
    working tree has changes)."""
    try:
        version: str | None = importlib.metadata.version("headrace")
    except importlib.metadata.PackageNotFoundError:
        version = None
    commit = None
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty=+dirty",
                              "--abbrev=12"], capture_output=True, text=True, timeout=5)  # fmt: skip
        if out.returncode == 0:
            commit = out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"version": version, "commit": commit}


def host_facts() -> dict[str, Any]:
    """What the load generator ran on: CPUs (all, and those this process may use), OS,
    machine and Python."""
    try:
        usable: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
    }


def _digest(path: Path) -> str | None:
    h = hashlib.sha256()
    try:
        if path.is_dir():  # an input directory: its files' names and bytes, in order
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                h.update(str(f.relative_to(path)).encode() + b"\0" + f.read_bytes())
        else:
            h.update(path.read_bytes())
    except OSError:
        return None
    return h.hexdigest()


def spec_record(spec: LoadSpec) -> dict[str, Any]:
    """Every field of the spec, as JSON; secrets only as whether they were set."""
    d = spec.model_dump(mode="json")
    for k in SECRET_FIELDS:
        if k in d:
            d[k] = None if d[k] is None else "<set>"
    if d.get("model_keys"):
        d["model_keys"] = [[m, "<set>"] for m, _ in d["model_keys"]]
    return d


def run_record(spec: LoadSpec, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record of one run (``extra``: settings outside the spec, e.g. a search's)."""
    files = {}
    for name in ("trace", "timestamps", "input_file", "input_dir", "ca_file", "client_cert"):
        v = getattr(spec, name, None)
        if v is not None:
            files[name] = {"path": str(v), "sha256": _digest(Path(v))}
    return {
        "spec": spec_record(spec),
        **(extra or {}),
        "files": files,
        "headrace": headrace_version(),
        "host": host_facts(),
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
