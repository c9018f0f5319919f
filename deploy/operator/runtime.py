"""The controller's process runtime: it runs a plan's steps as processes and watches them.

:class:`ProcessRuntime` is the interface the controller uses; :class:`LocalRuntime` runs every
replica as a local Triton server (emulated GPUs for emulated variants, the host for the rest)
through :class:`placement.apply.emulated.Emulated`. The Ray mode plugs in its own. Calls block: the
controller runs them in a worker thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from deploy.operator.adopt import (
    Foreign,
    endpoint_from_state,
    endpoint_to_state,
    path_or_none,
    started_of,
)
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
    def processes(self) -> dict[str, dict[str, Any]]: ...
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

    def processes(self) -> dict[str, dict[str, Any]]:
        """Every process this runtime runs: name -> pid and start time, and what
        :meth:`adopt` needs to drive it again (a replica's repository, ports and endpoint; an
        emulated GPU's socket)."""
        out: dict[str, dict[str, Any]] = {}
        for rid, srv in self.ex.servers.items():
            ep = self.ex.endpoints.get(rid)
            if srv.pid is not None and ep is not None:
                out[f"triton:{rid}"] = {
                    "pid": srv.pid, "started": started_of(srv.proc), "repository": str(srv.repository),
                    "ports": [srv.http_port, srv.grpc_port, srv.metrics_port],
                    "log": None if srv.log_path is None else str(srv.log_path),
                    "workdir": None if srv._workdir is None else str(srv._workdir),  # noqa: SLF001
                    "endpoint": endpoint_to_state(ep)}
        for gid, gpu in self.ex.gpus.items():
            if gpu.pid is not None:
                out[f"gpu:{gid}"] = {"pid": gpu.pid, "started": started_of(gpu.proc), "name": gpu.name,
                                     "socket": gpu.socket_path,
                                     "dir": None if gpu._dir is None else str(gpu._dir)}  # noqa: SLF001
        return out

    def adopt(self, processes: dict[str, dict[str, Any]]) -> list[str]:
        """Take over the replicas and emulated GPUs of ``processes`` (as :meth:`processes`
        wrote them) as they run; returns the names of those gone. A replica gone is kept, not
        running: :meth:`restart` starts it again on its ports."""
        from profiles.emulator import EmulatedGpu  # noqa: PLC0415
        from profiles.triton.server import TritonServer  # noqa: PLC0415

        gone = []
        for name, rec in processes.items():
            kind, _, key = name.partition(":")
            proc = Foreign(rec["pid"], rec.get("started"))
            if kind not in ("triton", "gpu"):
                continue
            if proc.poll() is not None:
                gone.append(name)
                if kind == "gpu":
                    continue
            if kind == "gpu":
                gpu = EmulatedGpu(rec["name"])
                gpu.proc, gpu.socket_path, gpu._dir = proc, rec["socket"], path_or_none(rec["dir"])  # noqa: SLF001
                self.ex.gpus[key] = gpu
            else:
                http, grpc, metrics = rec["ports"]
                srv = TritonServer(Path(rec["repository"]), http, grpc, metrics, log_path=path_or_none(rec["log"]),
                                   ready_timeout=self.ex.ready_timeout)
                if proc.poll() is None:
                    srv.proc, srv._workdir = proc, path_or_none(rec["workdir"])  # type: ignore[assignment]  # noqa: SLF001
                self.ex.servers[key] = srv
                self.ex.endpoints[key] = endpoint_from_state(rec["endpoint"])
        return gone

    def discard(self, replica_id: str) -> None:
        """Stop a replica no plan names (started by a rollout a previous controller left)."""
        self.ex.stop_replica(Step("stop_replica", "", "", replica_id=replica_id))

    def stop(self) -> None:
        self.ex.stop()
