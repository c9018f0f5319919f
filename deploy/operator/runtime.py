"""The controller's process runtime: it runs a plan's steps as processes and watches them.

:class:`ProcessRuntime` is the interface the controller uses; :class:`LocalRuntime` runs every
replica as a local Triton server (emulated GPUs for emulated variants, the host for the rest)
through :class:`placement.apply.emulated.Emulated`. The Ray mode plugs in its own. Calls block: the
controller runs them in a worker thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from deploy.operator.state import start_time
from placement.apply.emulated import Emulated
from placement.apply.executors import ExecutorError
from placement.apply.render import Endpoint
from placement.diff import Step
from profiles.profile import ProfileSet
from profiles.triton.sources import VariantSource


class ProcessRuntime(Protocol):
    def run(self, step: Step) -> Endpoint | None: ...
    def alive(self, replica_id: str) -> bool: ...
    def restart(self, replica_id: str) -> None: ...
    def endpoints(self) -> dict[str, Endpoint]: ...
    def processes(self) -> dict[str, dict[str, int | None]]: ...
    def stop(self) -> None: ...


class LocalRuntime:
    """Replicas as local Triton servers, each in its own process group, under ``workdir``."""

    def __init__(self, profiles: ProfileSet, workdir: Path,
                 sources: dict[tuple[str, str], VariantSource] | None = None, ready_timeout: float = 60.0) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.ex = Emulated(profiles, sources=dict(sources or {}), ready_timeout=ready_timeout, workdir=workdir)

    def set_profiles(self, profiles: ProfileSet, sources: dict[tuple[str, str], VariantSource]) -> None:
        """A new generation's profiles and sources (replicas started from now on use them)."""
        self.ex.profiles = profiles
        self.ex.sources = dict(sources)

    def run(self, step: Step) -> Endpoint | None:
        """Apply one step; a started replica's endpoint comes back once it is ready."""
        self.ex.run(step)
        return self.ex.endpoints.get(step.replica_id) if step.action == "start_replica" else None

    def alive(self, replica_id: str) -> bool:
        srv = self.ex.servers.get(replica_id)
        return srv is not None and srv.proc is not None and srv.proc.poll() is None

    def restart(self, replica_id: str) -> None:
        srv = self.ex.servers.get(replica_id)
        if srv is None:
            raise ExecutorError(f"no replica {replica_id!r} to restart")
        srv.restart()

    def endpoints(self) -> dict[str, Endpoint]:
        return dict(self.ex.endpoints)

    def processes(self) -> dict[str, dict[str, int | None]]:
        """Every process this runtime started: name -> pid and start time."""
        out: dict[str, dict[str, int | None]] = {}
        for rid, srv in self.ex.servers.items():
            if srv.pid is not None:
                out[f"triton:{rid}"] = {"pid": srv.pid, "started": start_time(srv.pid)}
        for gid, gpu in self.ex.gpus.items():
            if gpu.pid is not None:
                out[f"gpu:{gid}"] = {"pid": gpu.pid, "started": start_time(gpu.pid)}
        return out

    def stop(self) -> None:
        self.ex.stop()
