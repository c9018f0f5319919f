"""The ``Emulated`` executor: a plan served for real on emulated GPUs on this machine.

One :class:`profiles.emulator.EmulatedGpu` arbiter per planned GPU, one Triton server
(:class:`profiles.tritonserver.TritonServer`) per replica, each serving an emulated model that replays
its variant's profile on its slice (``slice_id`` = ``<gpu>/<slice>``) with the planned MPS share.
Every process is stopped by its PID / process group in :meth:`Emulated.stop`, also on failure.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from placement.diff import PlanDiff, Step, diff
from placement.executors import ExecutorError
from placement.plan import Plan
from profiles.profile import ProfileSet
from profiles.repository import DynamicBatching
from profiles.tritonserver import TritonServer


@dataclass(frozen=True)
class Endpoint:
    """Where one replica serves: the gateway's ReplicaInfo is built from this."""

    replica_id: str
    model: str
    variant: str  # the Triton model name on that server
    gpu: str
    slice: str
    share: float
    max_batch: int
    capacity: float
    http_url: str
    grpc_url: str


@dataclass
class Emulated:
    """Apply plans by starting emulated GPUs and Triton servers locally.

    ``triton_batching`` turns on Triton's dynamic batcher in each model, for clients that call
    Triton directly. It is off by default: the gateway forms the batches, and on this Triton
    build a batcher-enabled model answers some lone requests ~500 ms late (bench/gateway_slo).
    """

    profiles: ProfileSet
    triton_batching: bool = False
    ready_timeout: float = 60.0
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="headrace-plan-")))
    gpus: dict = field(default_factory=dict)  # gpu id -> EmulatedGpu
    servers: dict[str, TritonServer] = field(default_factory=dict)
    endpoints: dict[str, Endpoint] = field(default_factory=dict)

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

        if gpu_id not in self.gpus:
            self.gpus[gpu_id] = EmulatedGpu(name=gpu_id.replace("/", "-")).start()
        return self.gpus[gpu_id]

    def run(self, st: Step) -> None:
        if st.action == "start_replica":
            self._start(st)
        elif st.action == "stop_replica":
            srv = self.servers.pop(st.replica_id, None)
            self.endpoints.pop(st.replica_id, None)
            if srv is not None:
                srv.__exit__(None, None, None)
        # MIG and MPS set-up steps need nothing here: the arbiter enforces slices and shares

    def _start(self, st: Step) -> None:
        from profiles.emulator import write_emulated_model  # noqa: PLC0415

        s, r = st.slice, st.replica
        if s is None or r is None:
            raise ExecutorError(f"{st.describe()}: needs a slice and a replica")
        gpu = self._gpu(st.gpu)
        profile = self.profiles.get(r.variant, st.gpu_model, s.profile)
        repo = self.workdir / st.replica_id.replace("/", "_").replace("@", "-").replace("#", "-")
        repo.mkdir(parents=True, exist_ok=True)
        write_emulated_model(
            repo, r.variant, profile, slice_id=f"{st.gpu}/{s.label}",
            mode="mps" if s.mps else "timeslice", share=r.share, arbiter=gpu.socket_path,
            max_batch=r.max_batch, client=st.replica_id,
            dynamic_batching=DynamicBatching() if self.triton_batching else None,
        )
        srv = TritonServer(repo, ready_timeout=self.ready_timeout)
        srv.start()
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


def gateway_config(ex: Emulated, plan: Plan, http_port: int = 0, grpc_port: int = 0) -> dict:
    """A gateway config (``headrace serve`` YAML shape) routing every planned model to the
    replicas ``ex`` started. Each replica's latency profile is written beside its repository:
    the slice's profile, slowed by its MPS share and interference where it shares a slice."""
    from dataclasses import replace as _replace

    from placement.capacity import batch_latency
    from profiles.profile import LatencyPoint, save_profiles

    models = []
    for d in plan.demands:
        reps = []
        for e in ex.endpoints.values():
            if e.model != d.model:
                continue
            gpu_model = next(g.gpu for g in plan.gpus if g.id == e.gpu)
            p = ex.profiles.get(e.variant, gpu_model, e.slice.split("@")[0])
            if e.share < 1.0:
                pts = tuple(LatencyPoint(pt.batch, pt.p50 * batch_latency(p, pt.batch, e.share) / p.latency(pt.batch),
                                         batch_latency(p, pt.batch, e.share)) for pt in p.points)
                p = _replace(p, points=pts)
            path = ex.workdir / (e.replica_id.replace("/", "_").replace("@", "-").replace("#", "-") + ".profile.yaml")
            save_profiles(path, [p.with_max_batch(max(e.max_batch, 1)) if e.max_batch <= p.max_batch else p])
            reps.append({"url": e.http_url, "protocol": "http", "variant": e.variant, "profile": str(path), "id": e.replica_id})
        if reps:
            models.append({"name": d.model, "slo_ms": d.slo * 1e3, "priority": d.priority,
                           "max_batch": min(e.max_batch for e in ex.endpoints.values() if e.model == d.model),
                           "replicas": reps})
    return {"listen": {"host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port}, "models": models}
