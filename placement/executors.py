"""Executors apply a Plan or a PlanDiff: ``DryRun`` records the commands, ``Nvml`` configures
real GPUs through nvidia-ml-py (the Triton/MPS processes through an injected runner), and
``placement.emulated.Emulated`` serves the plan on emulated GPUs.

All of them walk the same steps (:mod:`placement.diff`), in order: make before break.
MPS: one control daemon per device (whole GPU or MIG slice) with its own pipe and log
directories; each client (one Triton server per replica) gets those directories, its
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and a device-memory cap proportional to its share.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from placement.diff import PlanDiff, Step, diff
from placement.plan import Plan, SlicePlan
from profiles.catalogue import gpu_model
from profiles.tritonserver import triton_argv

MPS_ROOT = "/tmp/headrace-mps"


class ExecutorError(RuntimeError):
    """A step could not be applied; the message names the step."""


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    stdin: str = ""

    def shell(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env)
        cmd = " ".join(self.argv)
        pre = f"echo {self.stdin} | " if self.stdin else ""
        return " ".join(x for x in (env, pre + cmd) if x)


def gpu_index(gpu_id: str) -> int:
    """``node0/gpu3`` -> 3 (the index nvidia-smi/NVML use on that node)."""
    tail = gpu_id.rsplit("/", 1)[-1]
    digits = "".join(ch for ch in tail if ch.isdigit())
    if not digits:
        raise ExecutorError(f"GPU id {gpu_id!r} does not end in an index (expected <node>/gpu<N>)")
    return int(digits)


def mps_dirs(gpu_id: str, s: SlicePlan) -> tuple[str, str]:
    base = f"{MPS_ROOT}/{gpu_id.replace('/', '-')}-{s.label.replace('@', '-')}"
    return f"{base}/pipe", f"{base}/log"


def client_env(step: Step, device: str) -> dict[str, str]:
    """Environment of one Triton server: its device and, under MPS, its share."""
    if step.slice is None or step.replica is None:
        raise ExecutorError(f"{step.describe()}: a replica step needs a slice and a replica")
    env = {"CUDA_VISIBLE_DEVICES": device}
    if step.slice.mps:
        pipe, log = mps_dirs(step.gpu, step.slice)
        g = gpu_model(step.gpu_model)
        mem_mb = int(g.slice_memory_gb(step.slice.profile) * 1024 * step.replica.share)
        env |= {
            "CUDA_MPS_PIPE_DIRECTORY": pipe,
            "CUDA_MPS_LOG_DIRECTORY": log,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": f"{step.replica.share * 100:g}",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={mem_mb}M",
        }
    return env


def replica_argv(replica_id: str, http_port: int, grpc_port: int, repo_root: str) -> tuple[str, ...]:
    """Triton for one replica on a node: :func:`profiles.tritonserver.triton_argv`, listening on
    every address (the gateway reaches it over the network)."""
    return tuple(triton_argv(f"{repo_root}/{replica_id.replace('/', '_')}", http_port, grpc_port, 0,
                             address="0.0.0.0"))


class Executor(Protocol):
    def apply(self, plan_or_diff: Plan | PlanDiff) -> Any: ...


def _slice_of(st: Step) -> SlicePlan:
    if st.slice is None:
        raise ExecutorError(f"{st.describe()}: this step needs a slice")
    return st.slice


def _steps(x: Plan | PlanDiff) -> tuple[Step, ...]:
    return (diff(None, x) if isinstance(x, Plan) else x).steps


@dataclass
class DryRun:
    """Records the exact commands a plan needs, without running any.

    GPU-instance ids are numbered per GPU in creation order, as a freshly reset GPU hands them
    out; MIG UUIDs are placeholders ``MIG-<gpu>-<slice>`` (the Nvml executor reads real ones).
    Triton servers get ports from ``base_port`` upward, two per server.
    """

    repo_root: str = "/var/lib/headrace/repos"
    base_port: int = 8100
    commands: list[Command] = field(default_factory=list)
    _gi: dict[tuple[str, str], int] = field(default_factory=dict)
    _next_gi: dict[str, int] = field(default_factory=dict)
    _ports: dict[str, int] = field(default_factory=dict)

    def device(self, step: Step) -> str:
        if step.slice is None or step.slice.start is None:
            return f"GPU-{step.gpu.replace('/', '-')}"
        return f"MIG-{step.gpu.replace('/', '-')}-{step.slice.label.replace('@', '-')}"

    def apply(self, plan_or_diff: Plan | PlanDiff) -> list[Command]:
        start = len(self.commands)
        for st in _steps(plan_or_diff):
            self.commands += self.commands_for(st)
        return self.commands[start:]

    def commands_for(self, st: Step) -> list[Command]:
        i = str(gpu_index(st.gpu))
        smi = ("nvidia-smi", "mig", "-i", i)
        if st.action == "enable_mig":
            return [Command(("nvidia-smi", "-i", i, "-mig", "1"))]
        if st.action == "disable_mig":
            return [Command(("nvidia-smi", "-i", i, "-mig", "0"))]
        s = _slice_of(st)
        if st.action == "create_slice":
            gi = self._next_gi.get(st.gpu, 1)
            self._next_gi[st.gpu] = gi + 1
            self._gi[(st.gpu, s.label)] = gi
            return [Command((*smi, "-cgi", f"{s.profile}:{s.start}")),
                    Command((*smi, "-gi", str(gi), "-cci"))]
        if st.action == "destroy_slice":
            gi = str(self._gi.pop((st.gpu, s.label), 0))
            return [Command((*smi, "-dci", "-gi", gi)), Command((*smi, "-dgi", "-gi", gi))]
        pipe, log = mps_dirs(st.gpu, s)
        mps_env = (("CUDA_VISIBLE_DEVICES", self.device(st)), ("CUDA_MPS_PIPE_DIRECTORY", pipe),
                   ("CUDA_MPS_LOG_DIRECTORY", log))
        if st.action == "start_mps":
            return [Command(("mkdir", "-p", pipe, log)), Command(("nvidia-cuda-mps-control", "-d"), mps_env)]
        if st.action == "stop_mps":
            return [Command(("nvidia-cuda-mps-control",), mps_env[1:], stdin="quit")]
        if st.action == "start_replica":
            port = self._ports.setdefault(st.replica_id, self.base_port + 2 * len(self._ports))
            env = tuple(client_env(st, self.device(st)).items())
            return [Command(replica_argv(st.replica_id, port, port + 1, self.repo_root), env)]
        if st.action == "stop_replica":
            return [Command(("headrace-stop-replica", st.replica_id))]
        raise ExecutorError(f"unknown step {st.action}")

    def script(self) -> str:
        return "\n".join(c.shell() for c in self.commands) + "\n"


# --------------------------------------------------------------------------- NVML


class ProcessRunner(Protocol):
    def start(self, key: str, argv: tuple[str, ...], env: dict[str, str], stdin: str = "") -> int: ...
    def stop(self, key: str) -> None: ...


@dataclass
class SubprocessRunner:
    """Starts each process in its own group and stops it by that group's id."""

    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, key: str, argv: tuple[str, ...], env: dict[str, str], stdin: str = "") -> int:
        p = subprocess.Popen(argv, env={**os.environ, **env}, start_new_session=True,
                             stdin=subprocess.PIPE if stdin else None, text=True)
        if stdin:
            p.communicate(stdin + "\n", timeout=30)
        self.procs[key] = p
        return p.pid

    def stop(self, key: str) -> None:
        p = self.procs.pop(key, None)
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _load_pynvml() -> Any:
    try:
        import pynvml  # noqa: PLC0415  (only where a GPU is present)
    except ImportError as e:
        raise ExecutorError("the nvml executor needs nvidia-ml-py: pip install nvidia-ml-py") from e
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001  (NVMLError subclasses vary by failure)
        raise ExecutorError(f"NVML did not initialise (no NVIDIA driver or GPU here?): {e}") from e
    return pynvml


@dataclass
class Nvml:
    """Configures real GPUs through NVML (profile ids read at run time, explicit placements)
    and starts MPS daemons and Triton servers through ``runner``. ``nvml`` is the pynvml
    module or any object with the same functions (tests pass a fake that enforces MIG rules)."""

    nvml: Any = None
    runner: ProcessRunner = field(default_factory=SubprocessRunner)
    repo_root: str = "/var/lib/headrace/repos"
    base_port: int = 8100
    load: Callable[[], Any] = _load_pynvml
    instances: dict[tuple[str, str], Any] = field(default_factory=dict)  # (gpu, slice) -> (GI, CI)
    uuids: dict[tuple[str, str], str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def _n(self) -> Any:
        if self.nvml is None:
            self.nvml = self.load()
        return self.nvml

    def _dev(self, gpu: str) -> Any:
        return self._n().nvmlDeviceGetHandleByIndex(gpu_index(gpu))

    def apply(self, plan_or_diff: Plan | PlanDiff) -> dict[tuple[str, str], str]:
        self._n()
        for st in _steps(plan_or_diff):
            try:
                self.run(st)
            except ExecutorError:
                raise
            except Exception as e:  # NVML raises its own NVMLError types
                raise ExecutorError(f"{st.describe()}: {type(e).__name__}: {e}") from e
            self.log.append(st.describe())
        return dict(self.uuids)

    def run(self, st: Step) -> None:
        n = self._n()
        if st.action in ("enable_mig", "disable_mig"):
            mode = n.NVML_DEVICE_MIG_ENABLE if st.action == "enable_mig" else n.NVML_DEVICE_MIG_DISABLE
            n.nvmlDeviceSetMigMode(self._dev(st.gpu), mode)
            return
        s = _slice_of(st)
        key = (st.gpu, s.label)
        if st.action == "create_slice":
            dev = self._dev(st.gpu)
            prof = gpu_model(st.gpu_model).profile(s.profile)
            info = n.nvmlDeviceGetGpuInstanceProfileInfo(dev, getattr(n, prof.nvml_profile))
            placement = n.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = s.start, prof.mem_slices
            gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(dev, info.id, placement)
            ci_const = getattr(n, f"NVML_COMPUTE_INSTANCE_PROFILE_{prof.compute}_SLICE")
            ci = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, ci_const, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            cih = n.nvmlGpuInstanceCreateComputeInstance(gi, ci.id)
            self.instances[key] = (gi, cih)
            self.uuids[key] = self._mig_uuid(dev, n.nvmlGpuInstanceGetInfo(gi).id)
        elif st.action == "destroy_slice":
            gi, cih = self.instances.pop(key)
            self.uuids.pop(key, None)
            n.nvmlComputeInstanceDestroy(cih)
            n.nvmlGpuInstanceDestroy(gi)
        elif st.action in ("start_mps", "stop_mps", "start_replica", "stop_replica"):
            self._process(st, key)

    def _mig_uuid(self, dev: Any, gi_id: int) -> str:
        n = self._n()
        for i in range(n.nvmlDeviceGetMaxMigDeviceCount(dev)):
            try:
                mig = n.nvmlDeviceGetMigDeviceHandleByIndex(dev, i)
            except Exception:  # noqa: BLE001  (NVML reports empty indices as errors)
                continue
            if n.nvmlDeviceGetGpuInstanceId(mig) == gi_id:
                uuid = n.nvmlDeviceGetUUID(mig)
                return uuid.decode() if isinstance(uuid, bytes) else uuid
        raise ExecutorError(f"no MIG device for GPU instance {gi_id}")

    def _device(self, st: Step, key: tuple[str, str]) -> str:
        if key in self.uuids:
            return self.uuids[key]
        uuid = self._n().nvmlDeviceGetUUID(self._dev(st.gpu))
        return uuid.decode() if isinstance(uuid, bytes) else uuid

    def _process(self, st: Step, key: tuple[str, str]) -> None:
        s = _slice_of(st)
        pipe, log = mps_dirs(st.gpu, s)
        mps_key = f"mps:{st.gpu}:{s.label}"
        if st.action == "start_mps":
            Path(pipe).mkdir(parents=True, exist_ok=True)
            Path(log).mkdir(parents=True, exist_ok=True)
            self.runner.start(mps_key, ("nvidia-cuda-mps-control", "-d"), {
                "CUDA_VISIBLE_DEVICES": self._device(st, key), "CUDA_MPS_PIPE_DIRECTORY": pipe,
                "CUDA_MPS_LOG_DIRECTORY": log})
        elif st.action == "stop_mps":
            self.runner.start(mps_key + ":quit", ("nvidia-cuda-mps-control",),
                              {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log}, stdin="quit")
            self.runner.stop(mps_key)
        elif st.action == "start_replica":
            port = self.base_port + 2 * len([k for k in self.log if k.startswith("start_replica")])
            self.runner.start(st.replica_id, replica_argv(st.replica_id, port, port + 1, self.repo_root),
                              client_env(st, self._device(st, key)))
        else:
            self.runner.stop(st.replica_id)


EXECUTORS = ("dry-run", "emulated", "nvml")
