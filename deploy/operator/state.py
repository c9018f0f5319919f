"""Where the controller keeps what it must not forget: the documents of every generation, the
applied generation, the admin address and the processes it runs (pid + start time, so a pid the
kernel has since reused is never taken for ours).

:class:`StateStore` is the interface; :class:`DirStateStore` keeps it in a directory (the Ray
mode plugs in its own). Writes are atomic (write, then rename).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Protocol

STATE_ENV = "HEADRACE_STATE_DIR"
DEFAULT_STATE_DIR = ".headrace"


class StateStore(Protocol):
    @property
    def run_dir(self) -> Path: ...  # where a runtime keeps model repositories and logs
    def read(self) -> dict[str, Any]: ...
    def write(self, state: dict[str, Any]) -> None: ...
    def save_generation(self, generation: int, documents: str) -> None: ...
    def generation(self, generation: int) -> str: ...
    def token(self, token_file: str | None = None, env: str = "HEADRACE_ADMIN_TOKEN") -> str: ...


def _atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


class DirStateStore:
    """The state in a directory: ``state.json``, ``generations/N.yaml``, ``token`` (0600),
    ``run/`` (model repositories, logs) and ``controller.log``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).resolve()
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "generations").mkdir(exist_ok=True)

    @classmethod
    def default(cls, path: str | Path | None = None) -> DirStateStore:
        return cls(path or os.environ.get(STATE_ENV) or DEFAULT_STATE_DIR)

    @property
    def run_dir(self) -> Path:
        return self.path / "run"

    @property
    def log_path(self) -> Path:
        return self.path / "controller.log"

    def read(self) -> dict[str, Any]:
        p = self.path / "state.json"
        if not p.exists():
            return {}
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return {}

    def write(self, state: dict[str, Any]) -> None:
        _atomic(self.path / "state.json", json.dumps(state, indent=1, sort_keys=True))

    def save_generation(self, generation: int, documents: str) -> None:
        _atomic(self.path / "generations" / f"{generation}.yaml", documents)

    def generation(self, generation: int) -> str:
        return (self.path / "generations" / f"{generation}.yaml").read_text()

    def token(self, token_file: str | None = None, env: str = "HEADRACE_ADMIN_TOKEN") -> str:
        """The admin token: from ``env`` if set, else ``token_file``, else the store's own
        ``token`` file (made with a fresh random token, mode 0600)."""
        if os.environ.get(env):
            return os.environ[env].strip()
        p = Path(token_file) if token_file else self.path / "token"
        if not p.exists():
            if token_file:
                raise FileNotFoundError(f"admin token file {p} does not exist")
            _atomic(p, secrets.token_urlsafe(32) + "\n", 0o600)
        return p.read_text().strip()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # exited, not yet reaped by its parent
        return None
    return int(fields[19])


def same_process(pid: int, started: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``started``."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)
