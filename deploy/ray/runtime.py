"""``RayRuntime``: the controller's process runtime on a Ray cluster.

Every planned GPU is an arbiter actor (:class:`GpuActor`, holding one unit of the node's GPU-model
resource) and every replica a :class:`TritonActor` beside it on the same pool node (see
:mod:`deploy.ray.resources`). A Triton actor starts ``tritonserver`` as a child in its own process
group on a repository written exactly as :class:`placement.apply.emulated.Emulated` writes it. When that
child dies the actor exits, and Ray restarts the actor (``max_restarts=-1``) on the same node: it
stops what is left of the old server (pid and start time must match) and starts a new one on the
same ports, so the gateway's replica comes back where it was; meanwhile the gateway fails over.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray

from deploy.operator.state import same_process, start_time
from deploy.ray.resources import node_of, node_resource, pinned, present_nodes
from placement.apply.emulated import Emulated
from placement.apply.executors import ExecutorError
from placement.apply.render import Endpoint
from placement.diff import Step
from profiles.profile import ProfileSet
from profiles.triton.server import TritonServer
from profiles.triton.sources import VariantSource

NAMESPACE = "headrace"


class _Arbiter:
    """A GPU arbiter another actor owns, as :class:`Emulated` sees its GPUs."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.pid = None

    def stop(self) -> None:
        """The owning actor stops it."""


def safe(name: str) -> str:
    return name.replace("/", "_").replace("@", "-").replace("#", "-").replace(":", "-")


def group_serves(pgid: int, repo: str) -> bool:
    """Whether process group ``pgid`` still has a member started on the repository ``repo``."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if int((d / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid and \
                    repo in (d / "cmdline").read_bytes().decode(errors="replace"):
                return True
        except (OSError, IndexError, ValueError):
            continue
    return False


class GpuActorImpl:
    """One emulated physical GPU: its arbiter process."""

    def __init__(self, gpu_id: str) -> None:
        from profiles.emulator import EmulatedGpu  # noqa: PLC0415

        self.gpu = EmulatedGpu(name=safe(gpu_id)).start()

    def info(self) -> dict[str, Any]:
        pid = self.gpu.pid
        return {"socket": self.gpu.socket_path, "pid": pid, "started": start_time(pid) if pid else None,
                "node": ray.get_runtime_context().get_node_id()}

    def stop(self) -> None:
        self.gpu.stop()


class TritonActorImpl:
    """One replica's Triton server, restarted on the same ports when Ray restarts the actor."""

    def __init__(self, what: tuple[Step, ProfileSet, dict[tuple[str, str], VariantSource]],
                 arbiter: str | None, workdir: str, ready_timeout: float = 60.0) -> None:
        step, profiles, sources = what
        rid = step.replica_id
        self.rid = rid
        self.stopping = False
        self.ex = Emulated(profiles, sources=dict(sources), ready_timeout=ready_timeout,
                           workdir=Path(workdir) / safe(rid))
        if arbiter is not None:
            self.ex.gpus[step.gpu] = _Arbiter(arbiter)
        record = self.ex.workdir / "actor.json"
        if ray.get_runtime_context().was_current_actor_reconstructed and record.exists():
            prev = json.loads(record.read_text())
            repo = self.ex.repo_dir(rid)
            if same_process(prev["pid"], prev["started"]) or group_serves(prev["pid"], str(repo)):
                # the old server (or its python stubs, when Ray ended only the server with the
                # actor) outlived the actor: its process group goes
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(prev["pid"], signal.SIGKILL)
            srv = TritonServer(repo, http_port=prev["http_port"], grpc_port=prev["grpc_port"],
                               metrics_port=prev["metrics_port"], ready_timeout=ready_timeout,
                               log_path=repo.with_suffix(".log"))
            srv.start()
            self.ex.servers[rid] = srv
            self.ex.endpoints[rid] = Endpoint(**prev["endpoint"])
            self.starts = prev["starts"] + 1
        else:
            shutil.rmtree(self.ex.workdir, ignore_errors=True)
            self.ex.workdir.mkdir(parents=True)
            self.ex.run(step)
            self.starts = 1
        srv = self.ex.servers[rid]
        record.write_text(json.dumps({
            "pid": srv.pid, "started": start_time(srv.pid), "http_port": srv.http_port, "grpc_port": srv.grpc_port,
            "metrics_port": srv.metrics_port, "endpoint": asdict(self.ex.endpoints[rid]), "starts": self.starts}))
        threading.Thread(target=self._watch, daemon=True, name="triton-watch").start()

    def _watch(self) -> None:
        srv = self.ex.servers[self.rid]
        while not self.stopping:
            if srv.proc is None or srv.proc.poll() is not None:
                if not self.stopping:
                    os._exit(1)  # Ray restarts the actor, and with it the server
                return
            time.sleep(0.2)

    def info(self) -> dict[str, Any]:
        srv = self.ex.servers[self.rid]
        return {"endpoint": self.ex.endpoints[self.rid], "pid": srv.pid, "started": start_time(srv.pid),
                "starts": self.starts, "node": ray.get_runtime_context().get_node_id()}

    def stop(self) -> None:
        self.stopping = True
        self.ex.stop()


GpuActor = ray.remote(GpuActorImpl)
TritonActor = ray.remote(TritonActorImpl)


class RayRuntime:
    """Replicas as Ray actors; what :class:`deploy.operator.runtime.ProcessRuntime` asks.

    ``alive`` answers from what a watcher thread last saw (it asks every actor each ``poll``
    seconds), so the controller's loop never waits on the cluster.
    """

    def __init__(self, profiles: ProfileSet, workdir: str | Path,
                 sources: dict[tuple[str, str], VariantSource] | None = None,
                 ready_timeout: float = 60.0, poll: float = 0.5) -> None:
        self.profiles = profiles
        self.sources = dict(sources or {})
        self.workdir = str(workdir)
        self.ready_timeout = ready_timeout
        self.poll = poll
        self.gpus: dict[str, Any] = {}  # gpu id -> GpuActor handle
        self.arbiters: dict[str, dict[str, Any]] = {}  # gpu id -> its info
        self.replicas: dict[str, Any] = {}  # replica id -> TritonActor handle
        self.steps: dict[str, Step] = {}
        self.args: dict[str, Any] = {}  # replica id -> its actor's arguments (an ObjectRef)
        self.infos: dict[str, dict[str, Any]] = {}
        self._alive: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._gpu_lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="ray-runtime-watch")
        self._watcher.start()

    def set_profiles(self, profiles: ProfileSet, sources: dict[tuple[str, str], VariantSource]) -> None:
        self.profiles = profiles
        self.sources = dict(sources)

    # ------------------------------------------------------------------ steps

    def _check_node(self, node: str) -> None:
        if node not in present_nodes(ray.nodes()):
            raise ExecutorError(f"no live Ray node offers {node_resource(node)!r}; start one with "
                                f"ray start --resources '{{\"{node_resource(node)}\": 1, \"<GPU model>\": <count>}}'")

    def _gpu(self, st: Step) -> str:
        with self._gpu_lock:  # replicas of one rollout wave start at once: one GPU actor each GPU
            return self._gpu_locked(st)

    def _gpu_locked(self, st: Step) -> str:
        if st.gpu not in self.gpus:
            node = node_of(st.gpu)
            self._check_node(node)
            actor = GpuActor.options(num_cpus=0, resources=pinned(node, {st.gpu_model: 1.0}),
                                     name=f"headrace-gpu:{st.gpu}", namespace=NAMESPACE).remote(st.gpu)
            try:
                self.arbiters[st.gpu] = ray.get(actor.info.remote(), timeout=self.ready_timeout)
            except Exception as e:
                ray.kill(actor, no_restart=True)
                raise ExecutorError(f"{st.describe()}: the GPU actor did not start ({st.gpu_model} free on "
                                    f"{node}?): {e}") from e
            self.gpus[st.gpu] = actor
        return self.arbiters[st.gpu]["socket"]

    def run(self, step: Step) -> Endpoint | None:
        if step.action == "start_replica":
            return self._start(step)
        if step.action == "stop_replica":
            self._stop_replica(step.replica_id)
        return None  # MIG and MPS set-up: the arbiter enforces slices and shares

    def _start(self, st: Step) -> Endpoint:
        assert st.replica is not None
        src = self.sources.get((st.replica.model, st.replica.variant), VariantSource())
        node = node_of(st.gpu)
        self._check_node(node)
        arbiter = self._gpu(st) if src.kind == "emulated" else None
        # NOTE: the runtime holds the constructor's arguments for the actor's life: Ray needs them
        # again each time it restarts the actor
        args = ray.put((st, self.profiles, self.sources))
        actor = TritonActor.options(num_cpus=0, resources=pinned(node), max_restarts=-1, max_task_retries=0,
                                    name=f"headrace-triton:{st.replica_id}", namespace=NAMESPACE).remote(
            args, arbiter, self.workdir, self.ready_timeout)
        try:
            info = ray.get(actor.info.remote(), timeout=self.ready_timeout + 30)
        except Exception as e:
            ray.kill(actor, no_restart=True)
            raise ExecutorError(f"{st.describe()}: {str(e).splitlines()[-1] if str(e) else e}") from e
        with self._lock:
            self.replicas[st.replica_id] = actor
            self.args[st.replica_id] = args
            self.steps[st.replica_id] = st
            self.infos[st.replica_id] = info
            self._alive[st.replica_id] = True
        return info["endpoint"]

    def forget(self, rid: str) -> None:
        """End a replica whose node has left (nothing there to stop)."""
        with self._lock:
            actor = self.replicas.pop(rid, None)
            for d in (self.steps, self.infos, self._alive, self.args):
                d.pop(rid, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)

    def _stop_replica(self, rid: str) -> None:
        with self._lock:
            actor = self.replicas.pop(rid, None)
            self.steps.pop(rid, None)
            self.args.pop(rid, None)
            self.infos.pop(rid, None)
            self._alive.pop(rid, None)
        if actor is None:
            return
        with contextlib.suppress(Exception):
            ray.get(actor.stop.remote(), timeout=30)
        ray.kill(actor, no_restart=True)

    # ------------------------------------------------------------------ watching

    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            with self._lock:
                actors = dict(self.replicas)
            refs = {rid: a.info.remote() for rid, a in actors.items()}
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=max(self.poll, 1.0))
            done = set(ready)
            for rid, ref in refs.items():
                ok = False
                if ref in done:
                    try:
                        info = ray.get(ref)
                        ok = True
                    except Exception:  # noqa: BLE001  (dead or restarting: not alive)
                        pass
                with self._lock:
                    if rid not in self.replicas:
                        continue
                    self._alive[rid] = ok
                    if ok:
                        self.infos[rid] = info
                if not ok:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref)

    def alive(self, replica_id: str) -> bool:
        with self._lock:
            return self._alive.get(replica_id, False)

    def restart(self, replica_id: str) -> None:
        """Ray restarts a dead Triton actor itself; this waits until it serves again."""
        with self._lock:
            actor = self.replicas.get(replica_id)
        if actor is None:
            raise ExecutorError(f"no replica {replica_id!r} to restart")
        deadline = time.monotonic() + self.ready_timeout + 30
        while time.monotonic() < deadline:
            try:
                info = ray.get(actor.info.remote(), timeout=max(1.0, deadline - time.monotonic()))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                time.sleep(0.2)
                continue
            with self._lock:
                self.infos[replica_id] = info
                self._alive[replica_id] = True
            return
        raise ExecutorError(f"{replica_id}: the Triton actor did not come back in {self.ready_timeout + 30:g} s")

    def actor(self, replica_id: str) -> Any:
        return self.replicas[replica_id]

    def endpoints(self) -> dict[str, Endpoint]:
        with self._lock:
            return {rid: info["endpoint"] for rid, info in self.infos.items()}

    def restarts(self) -> dict[str, int]:
        with self._lock:
            return {rid: info["starts"] - 1 for rid, info in self.infos.items()}

    def processes(self) -> dict[str, dict[str, int | None]]:
        """Every server this runtime runs: pid and start time (on its node), and Ray's restarts."""
        with self._lock:
            out: dict[str, dict[str, int | None]] = {
                f"triton:{rid}": {"pid": i["pid"], "started": i["started"], "restarts": i["starts"] - 1}
                for rid, i in self.infos.items()}
            out.update({f"gpu:{g}": {"pid": i["pid"], "started": i["started"]} for g, i in self.arbiters.items()})
        return out

    def stop(self) -> None:
        self._stop.set()
        for rid in list(self.replicas):
            self._stop_replica(rid)
        for gid in list(self.gpus):
            actor = self.gpus.pop(gid)
            self.arbiters.pop(gid, None)
            with contextlib.suppress(Exception):
                ray.get(actor.stop.remote(), timeout=30)
            ray.kill(actor, no_restart=True)
