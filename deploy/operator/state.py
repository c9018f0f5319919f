"""Where the controller keeps what it must not forget: the documents of every generation, the
applied generation, the admin address and the processes it runs (pid + start time, so a pid the
kernel has since reused is never taken for ours).

:class:`StateStore` is the interface; :class:`DirStateStore` keeps it in a directory (the Ray
mode plugs in its own). Writes are atomic (write, flush to disk, then rename). ``state.json``
carries a SHA-256 of its own content (:data:`CHECKSUM`); a file that does not parse, is not the
shape :func:`check_state` expects, or does not match its checksum is refused with a
:class:`StateError` that names it and says how to proceed, never read as empty (a command would
then start a second controller beside the one the file records). A file without a checksum, as
written before there was one, is read when its shape is right, and gains one on the next write.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any, Protocol

STATE_ENV = "HEADRACE_STATE_DIR"
DEFAULT_STATE_DIR = ".headrace"
CHECKSUM = "checksum"  # state.json's own key: "sha256:" + the hex digest of the rest (canonical JSON)


class StateError(ValueError):
    """A state file that cannot be trusted; the message names it, says why and how to proceed."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"state file {path} is corrupt: {why}; nothing was started or stopped. Stop any "
                         f"controller still running on it (headrace down cannot find one now), then move the "
                         f"file away (mv {path} {path}.bad) and run headrace up again")
        self.path = path
        self.why = why


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
        f.flush()
        os.fsync(f.fileno())  # a crash after the rename never leaves an empty or short file
    tmp.replace(path)


def digest(state: dict[str, Any]) -> str:
    """The checksum of a state (without its :data:`CHECKSUM` key): SHA-256 of its canonical JSON."""
    body = json.dumps({k: v for k, v in state.items() if k != CHECKSUM}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


_INT = (int,)
_OPT_INT = (int, type(None))
_OPT_STR = (str, type(None))
_OPT_DICT = (dict, type(None))
# the keys the operator writes and the JSON types each may hold (other keys are kept as they are)
SHAPE: dict[str, tuple[type, ...]] = {
    "running": (bool,), "generation": _INT, "observed_generation": _INT, "history": (list,),
    "controller_pid": _OPT_INT, "controller_started": _OPT_INT, "admin_url": _OPT_STR, "token_file": _OPT_STR,
    "admin_tls_cert": _OPT_STR, "ray_address": _OPT_STR, "gateway": _OPT_DICT, "plan": _OPT_DICT,
    "processes": _OPT_DICT, CHECKSUM: (str,), "state_version": _OPT_INT, "fleet": _OPT_DICT, "fleets": _OPT_DICT,
    "generations": _OPT_DICT, "observed": _OPT_DICT, "rates": _OPT_DICT, "supervisor_pid": _OPT_INT,
    "supervisor_started": _OPT_INT,
}


def _type_name(v: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def check_state(data: object) -> str | None:
    """Why ``data`` (state.json, parsed) is not a state the operator wrote; None: it is."""
    if not isinstance(data, dict):
        return f"the top level is {_type_name(data)}, not an object"
    for key, types in SHAPE.items():
        v = data.get(key)
        if key in data and not (isinstance(v, types) and not (isinstance(v, bool) and bool not in types)):
            return f"{key} is {_type_name(v)} ({json.dumps(v)[:40]})"
    if not all(isinstance(g, int) and not isinstance(g, bool) for g in data.get("history") or []):
        return f"history holds something other than generation numbers ({json.dumps(data['history'])[:40]})"
    for name, p in (data.get("processes") or {}).items():
        if not (isinstance(p, dict) and isinstance(p.get("pid"), int) and p["pid"] > 0
                and isinstance(p.get("started"), _OPT_INT)):
            return f"processes.{name} is not a pid and start time ({json.dumps(p)[:40]})"
    return None


EVENTS_MAX_BYTES = 4 << 20


class DirStateStore:
    """The state in a directory: ``state.json``, ``generations/N.yaml``, ``events.jsonl``,
    ``token`` (0600), ``control-token`` (0600), ``run/`` (model repositories, logs),
    ``controller.log`` and ``gateway.log``."""

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

    @property
    def state_path(self) -> Path:
        return self.path / "state.json"

    def read(self) -> dict[str, Any]:
        """The state ({} when there is no state file yet). Raises :class:`StateError` when the
        file is unreadable, not JSON, not the state's shape, or does not match its checksum."""
        p = self.state_path
        try:
            text = p.read_text()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as e:
            raise self._corrupt(f"it cannot be read ({getattr(e, 'strerror', None) or e})") from None
        try:
            data = json.loads(text)
        except ValueError as e:
            why = "it is empty" if not text.strip() else f"it is not JSON ({e}; truncated?)"
            raise self._corrupt(why) from None
        why = check_state(data)
        if why is None and CHECKSUM in data and data[CHECKSUM] != digest(data):
            why = "its checksum does not match its content (edited by hand, or a torn write)"
        if why is not None:
            raise self._corrupt(why)
        data.pop(CHECKSUM, None)
        return data

    def _corrupt(self, why: str) -> StateError:
        return StateError(self.state_path, why)

    def write(self, state: dict[str, Any]) -> None:
        body = {k: v for k, v in state.items() if k != CHECKSUM}
        _atomic(self.state_path, json.dumps({**body, CHECKSUM: digest(body)}, indent=1, sort_keys=True))

    def save_generation(self, generation: int, documents: str) -> None:
        _atomic(self.path / "generations" / f"{generation}.yaml", documents)

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    def record_event(self, event: dict[str, Any]) -> None:
        """Append one event (RFC 3339 time, model, kind, message) to ``events.jsonl``; past
        ``EVENTS_MAX_BYTES`` the older half is dropped."""
        p = self.events_path
        with p.open("a") as f:
            f.write(json.dumps(event, sort_keys=True) + "\n")
        if p.stat().st_size > EVENTS_MAX_BYTES:
            lines = p.read_text().splitlines(keepends=True)
            _atomic(p, "".join(lines[len(lines) // 2:]))

    def events(self) -> list[dict[str, Any]]:
        """Every event recorded, oldest first (a line that does not parse is skipped)."""
        try:
            lines = self.events_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

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


def control_token(store: DirStateStore) -> Path:
    """The file holding the token of the gateway's control channel (made once, mode 0600): only
    the controller and the gateway it starts read it, apart from the admin token users hold."""
    p = store.path / "control-token"
    if not p.exists():
        _atomic(p, secrets.token_urlsafe(32) + "\n", 0o600)
    return p


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
