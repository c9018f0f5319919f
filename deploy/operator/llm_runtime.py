"""The engines of generative deployments as local processes: one ``headrace engine`` (the
emulated engine behind vLLM's OpenAI API) per LLM replica, each in its own process group, on a
free port, serving its variant's profile under the variant's name. Calls block: the controller
runs them in a worker thread.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deploy.operator.adopt import Foreign, started_of
from placement.apply.executors import ExecutorError
from placement.apply.render import file_name
from placement.llm import GPU_MEMORY_UTILIZATION, LlmReplica
from profiles.llm.profile import llm_profile_to_dict
from profiles.triton.process import stop_group
from profiles.triton.server import free_port


def health(url: str, timeout: float = 1.0) -> bool:
    """``GET /health`` on the engine at ``url`` answered 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def headrace() -> str:
    """The ``headrace`` console script of this interpreter's environment (else the one on PATH)."""
    beside = Path(sys.executable).with_name("headrace")
    found = str(beside) if beside.exists() else shutil.which("headrace")
    if found is None:
        raise ExecutorError(f"no headrace console script beside {sys.executable} or on PATH (pip install -e .)")
    return found


@dataclass
class _Engine:
    replica: LlmReplica
    argv: list[str]
    log: Path
    url: str
    proc: subprocess.Popen | None = None
    profile: Path | None = None  # the profile file it runs


class LlmEngines:
    """The running engines by replica id, under ``workdir`` (each one's profile and log)."""

    def __init__(self, workdir: Path, ready_timeout: float = 60.0) -> None:
        self.workdir = workdir
        self.ready_timeout = ready_timeout
        self.engines: dict[str, _Engine] = {}

    def start(self, r: LlmReplica) -> str:
        """Start ``r``'s engine and wait for its ``/health``; its URL."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        base = self.workdir / f"engine-{file_name(r.id)}"
        profile = base.with_suffix(".profile.yaml")
        profile.write_text(yaml.safe_dump(llm_profile_to_dict(r.profile), sort_keys=False))
        port = free_port()
        argv = [headrace(), "engine", "--profile", str(profile), "--port", str(port),
                "--served-model-name", r.variant, "--gpu-memory-utilization", str(GPU_MEMORY_UTILIZATION)]
        e = _Engine(r, argv, base.with_suffix(".log"), f"http://127.0.0.1:{port}", profile=profile.absolute())
        self.engines[r.id] = e
        self._launch(e)
        return e.url

    def _launch(self, e: _Engine) -> None:
        with open(e.log, "ab") as log:
            e.proc = subprocess.Popen(e.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if e.proc.poll() is not None:
                tail = e.log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
                raise ExecutorError(f"engine {e.replica.id} exited with code {e.proc.returncode}: {tail[0]}")
            if health(e.url):
                return
            time.sleep(0.1)
        stop_group(e.proc, grace=5.0)
        raise ExecutorError(f"engine {e.replica.id} not healthy after {self.ready_timeout:g}s; see {e.log}")

    def alive(self, replica_id: str) -> bool:
        e = self.engines.get(replica_id)
        return e is not None and e.proc is not None and e.proc.poll() is None

    def restart(self, replica_id: str) -> None:
        """Start a dead engine again, on the same port (the gateway keeps its URL)."""
        e = self.engines.get(replica_id)
        if e is None:
            raise ExecutorError(f"no LLM replica {replica_id!r} to restart")
        if e.proc is not None:
            stop_group(e.proc, grace=5.0)
        self._launch(e)

    def stop_replica(self, replica_id: str) -> None:
        e = self.engines.pop(replica_id, None)
        if e is not None and e.proc is not None:
            stop_group(e.proc, grace=5.0)

    def urls(self) -> dict[str, str]:
        return {rid: e.url for rid, e in self.engines.items()}

    def profiles(self) -> dict[str, str]:
        """The profile file each engine runs, by replica id (the gateway's routers read it)."""
        return {rid: str(e.profile) for rid, e in self.engines.items() if e.profile is not None}

    def processes(self) -> dict[str, dict[str, Any]]:
        """Every engine process: ``engine:<replica id>`` -> pid and start time, and what
        :meth:`adopt` needs to drive it again."""
        return {f"engine:{rid}": {"pid": e.proc.pid, "started": started_of(e.proc), "argv": e.argv, "log": str(e.log),
                                  "url": e.url, "profile": None if e.profile is None else str(e.profile)}
                for rid, e in self.engines.items() if e.proc is not None}

    def adopt(self, processes: dict[str, dict[str, Any]], replicas: dict[str, LlmReplica]) -> list[str]:
        """Take over the engines of ``processes`` (as :meth:`processes` wrote them) that
        ``replicas`` (by id) names, as they run; returns the names of those gone (kept, not
        running: :meth:`restart` starts one again on its port)."""
        gone = []
        for name, rec in processes.items():
            kind, _, rid = name.partition(":")
            if kind != "engine" or rid not in replicas:
                continue
            proc: Foreign | None = Foreign(rec["pid"], rec.get("started"))
            if proc.poll() is not None:  # type: ignore[union-attr]
                gone.append(name)
                proc = None
            self.engines[rid] = _Engine(replicas[rid], list(rec["argv"]), Path(rec["log"]), rec["url"],
                                        proc,  # type: ignore[arg-type]
                                        None if rec.get("profile") is None else Path(rec["profile"]))
        return gone

    def stop(self) -> None:
        for rid in list(self.engines):
            self.stop_replica(rid)

