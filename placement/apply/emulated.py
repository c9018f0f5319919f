"""The ``Emulated`` executor: a plan served for real on emulated GPUs on this machine.

One :class:`profiles.emulator.EmulatedGpu` arbiter per planned GPU, one Triton server
(:class:`profiles.triton.server.TritonServer`) per replica, each serving an emulated model that replays
its variant's profile on its slice (``slice_id`` = ``<gpu>/<slice>``) with the planned MPS share.
Every process is stopped by its PID / process group in :meth:`Emulated.stop`, also on failure.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from placement.apply.executors import ExecutorError, apply_step
from placement.apply.render import Endpoint
from placement.diff import PlanDiff, Step, diff
from placement.plan import Plan
from profiles.profile import ProfileSet
from profiles.triton.repository import DynamicBatching
from profiles.triton.server import TritonError, TritonServer
from profiles.triton.sources import Placement, SourceError, VariantSource, write_replica_model


@dataclass
class Emulated:
    """Apply plans by starting emulated GPUs and Triton servers locally.

    ``triton_batching`` turns on Triton's dynamic batcher in each model, for clients that call
    Triton directly. It is off by default: the gateway forms the batches, and on this Triton
    build a batcher-enabled model answers some lone requests ~500 ms late (bench/gateway_slo).
    """

    profiles: ProfileSet
    sources: dict[tuple[str, str], VariantSource] = field(default_factory=dict)  # (model, variant); default emulated
    triton_batching: bool = False
    ready_timeout: float = 60.0
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="headrace-plan-")))
    gpus: dict = field(default_factory=dict)  # gpu id -> EmulatedGpu
    servers: dict[str, TritonServer] = field(default_factory=dict)
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    # replicas of one rollout wave start in threads at once: one arbiter per GPU all the same
    _gpu_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def apply(self, plan_or_diff: Plan | PlanDiff) -> list[Endpoint]:
        steps = (diff(None, plan_or_diff) if isinstance(plan_or_diff, Plan) else plan_or_diff).steps
        try:
            for st in steps:
                self.run(st)
        except BaseException:
            self.stop()
            raise
        return list(self.endpoints.values())

    def _gpu(self, gpu_id: str):
        from profiles.emulator import EmulatedGpu  # noqa: PLC0415  (only the emulated path needs it)

        with self._gpu_lock:
            if gpu_id not in self.gpus:
                self.gpus[gpu_id] = EmulatedGpu(name=gpu_id.replace("/", "-")).start()
            return self.gpus[gpu_id]

    def run(self, st: Step) -> None:
        """Apply one step (:data:`placement.apply.executors.STEP_HANDLERS`)."""
        apply_step(self, st)

    def _nothing(self, st: Step) -> None:
        """MIG and MPS set-up steps need nothing here: the arbiter enforces slices and shares."""

    enable_mig = disable_mig = create_slice = destroy_slice = start_mps = stop_mps = _nothing

    def stop_replica(self, st: Step) -> None:
        srv = self.servers.pop(st.replica_id, None)
        self.endpoints.pop(st.replica_id, None)
        if srv is not None:
            srv.__exit__(None, None, None)

    def repo_dir(self, replica_id: str) -> Path:
        return self.workdir / replica_id.replace("/", "_").replace("@", "-").replace("#", "-")

    def start_replica(self, st: Step) -> None:
        s, r = st.slice, st.replica
        if s is None or r is None:
            raise ExecutorError(f"{st.describe()}: needs a slice and a replica")
        src = self.sources.get((r.model, r.variant), VariantSource())
        profile = self.profiles.get(r.variant, st.gpu_model, s.profile)
        repo = self.repo_dir(st.replica_id)
        # a fresh repository: a replica of this id that ran before (a version rolled back and
        # forth) left its files, which the new model's must not mix with
        shutil.rmtree(repo, ignore_errors=True)
        repo.mkdir(parents=True)
        arbiter = self._gpu(st.gpu).socket_path if src.kind == "emulated" else None
        where = Placement(f"{st.gpu}/{s.label}", s.mps, r.share, arbiter, st.replica_id)
        try:
            write_replica_model(repo, r.variant, src, profile, where, r.max_batch,
                                DynamicBatching() if self.triton_batching else None)
            srv = TritonServer(repo, ready_timeout=self.ready_timeout, log_path=repo.with_suffix(".log"))
            srv.start()
        except (SourceError, TritonError, OSError) as e:
            raise ExecutorError(f"{st.describe()}: {e}") from e
        self.servers[st.replica_id] = srv
        self.endpoints[st.replica_id] = Endpoint(
            st.replica_id, r.model, r.variant, st.gpu, s.label, r.share, r.max_batch, r.capacity,
            srv.http_url, srv.grpc_url)

    def stop(self) -> None:
        """Stop every Triton server and arbiter this executor started (by PID)."""
        for rid in list(self.servers):
            srv = self.servers.pop(rid)
            try:
                srv.__exit__(None, None, None)
            except Exception:  # noqa: BLE001  (keep stopping the rest)
                pass
        self.endpoints.clear()
        for gid in list(self.gpus):
            self.gpus.pop(gid).stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Emulated:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
