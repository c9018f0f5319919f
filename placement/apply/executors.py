"""Executors apply a Plan or a PlanDiff: ``DryRun`` writes one shell script per node,
``Nvml`` configures the GPUs of one node through nvidia-ml-py (the Triton/MPS processes through
an injected runner), ``placement.apply.emulated.Emulated`` serves the plan on emulated GPUs and
``placement.apply.kubernetes`` renders it for ``kubectl apply``.

All of them walk the same steps (:mod:`placement.diff`), in order: make before break. GPU ids
are ``<node>/gpu<N>``; each node's steps touch only its own GPUs.

MIG: GPU-instance and compute-instance ids are the driver's. It hands them out by placement,
not in creation order, so the executors read them from what the driver returns (NVML's instance
info; ``nvidia-smi mig -cgi ... -C`` output or ``-lgi`` listing in a script), never assume them.

MPS: one control daemon per device (whole GPU or MIG slice) with its own pipe and log
directories; each client (one Triton server per replica) gets those directories, its
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and a device-memory cap proportional to its share.

Replicas: a variant with an artifact source gets a GPU model repository written for it
(:mod:`placement.apply.gpu_repository`); the server starts in its own process group, is waited for on
``/v2/health/ready`` and is stopped by that group.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from placement.apply.gpu_repository import gpu_model, write_gpu_model
from placement.diff import Action, PlanDiff, Step, diff
from placement.plan import Plan, SlicePlan
from profiles.catalogue import gpu_model as catalogue_gpu
from profiles.triton.process import http_ready, stop_group
from profiles.triton.server import triton_argv
from profiles.triton.sources import SourceError, VariantSource

MPS_ROOT = "/tmp/headrace-mps"
RUN_DIR = "/run/headrace"  # pid files and logs of the servers a script starts


class ExecutorError(RuntimeError):
    """A step could not be applied; the message names the step."""


def _word(w: str) -> str:
    """A shell word: ``$VAR`` / ``$(...)`` expand (double quotes), anything else is quoted."""
    if "$" in w:
        return '"' + w.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return shlex.quote(w)


@dataclass(frozen=True)
class Command:
    """One line of a node's script. ``capture``: a shell variable set from the output, passed
    through the awk program ``parse`` first. ``background``: run in a session of its own with
    output to ``<background>.log`` and the session id in ``<background>.pid``. ``script``:
    shell text written as it is (waits and fallbacks that argv cannot say)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    stdin: str = ""
    capture: str = ""
    parse: str = ""
    background: str = ""
    parse_vars: tuple[tuple[str, str], ...] = ()  # awk -v name=value (shell variables expand)
    script: str = ""  # shell text used as it is, instead of argv

    def shell(self) -> str:
        if self.script:
            return self.script
        env = " ".join(f"{k}={_word(v)}" for k, v in self.env)
        cmd = " ".join(_word(a) for a in self.argv)
        if self.background:
            log, pid = shlex.quote(f"{self.background}.log"), shlex.quote(f"{self.background}.pid")
            cmd = f"setsid {cmd} >{log} 2>&1 </dev/null & echo $! >{pid}"
        line = " ".join(x for x in (env, cmd) if x)
        if "\n" in self.stdin:
            return f"{line} <<'HEADRACE_EOF'\n{self.stdin.rstrip(chr(10))}\nHEADRACE_EOF"
        if self.stdin:
            line = f"echo {shlex.quote(self.stdin)} | {line}"
        if self.capture:
            awk = " ".join(["awk", *(f"-v {k}={_word(v)}" for k, v in self.parse_vars), shlex.quote(self.parse)])
            piped = f"{line} | {awk}" if self.parse else line
            line = f"{self.capture}=$({piped})"
        return line


def node_of(gpu_id: str) -> str:
    """``node0/gpu3`` -> ``node0`` (a bare ``gpu3`` is on ``localhost``)."""
    return gpu_id.rsplit("/", 1)[0] if "/" in gpu_id else "localhost"


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
        g = catalogue_gpu(step.gpu_model)
        mem_mb = int(g.slice_memory_gb(step.slice.profile) * 1024 * step.replica.share)
        env |= {
            "CUDA_MPS_PIPE_DIRECTORY": pipe,
            "CUDA_MPS_LOG_DIRECTORY": log,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": f"{step.replica.share * 100:g}",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={mem_mb}M",
        }
    return env


def replica_dir(replica_id: str) -> str:
    return replica_id.replace("/", "_")


def replica_argv(replica_id: str, http_port: int, grpc_port: int, repo_root: str) -> tuple[str, ...]:
    """Triton for one replica on a node: :func:`profiles.triton.server.triton_argv`, listening on
    every address (the gateway reaches it over the network)."""
    return tuple(triton_argv(f"{repo_root}/{replica_dir(replica_id)}", http_port, grpc_port, 0,
                             address="0.0.0.0"))


class Executor(Protocol):
    def apply(self, plan_or_diff: Plan | PlanDiff) -> Any: ...


# every step kind and the executor method that applies it: DryRun, Nvml and Emulated each have
# one method per entry and dispatch through apply_step, so a new kind is added here (and to
# placement.diff.Action) and each executor then lacks just its method
STEP_HANDLERS: dict[Action, str] = {
    "enable_mig": "enable_mig",
    "create_slice": "create_slice",
    "start_mps": "start_mps",
    "start_replica": "start_replica",
    "stop_replica": "stop_replica",
    "stop_mps": "stop_mps",
    "destroy_slice": "destroy_slice",
    "disable_mig": "disable_mig",
}


def apply_step(executor: object, st: Step) -> Any:
    """Apply ``st`` with ``executor``'s method for its kind (:data:`STEP_HANDLERS`)."""
    name = STEP_HANDLERS.get(st.action)
    if name is None:
        raise ExecutorError(f"{st.describe()}: unknown step kind {st.action!r}; known: {', '.join(STEP_HANDLERS)}")
    return getattr(executor, name)(st)


def _slice_of(st: Step) -> SlicePlan:
    if st.slice is None:
        raise ExecutorError(f"{st.describe()}: this step needs a slice")
    return st.slice


def _steps(x: Plan | PlanDiff) -> tuple[Step, ...]:
    return (diff(None, x) if isinstance(x, Plan) else x).steps


def _source(sources: Mapping[str, VariantSource], st: Step) -> VariantSource | None:
    return sources.get(st.replica.variant) if st.replica is not None else None


# awk programs reading nvidia-smi output (the ids are the driver's, whatever order it uses)
CREATED_GI = '/created GPU instance ID/ {for (i = 1; i < NF; i++) if ($i == "ID") {print $(i+1); exit}}'
CREATED_CI = '/created compute instance ID/ {for (i = 1; i < NF; i++) if ($i == "ID") {print $(i+1); exit}}'


def listed_gi(gpu: int, start: int, size: int) -> str:
    """awk over ``nvidia-smi mig -lgi``: the instance id of the GPU instance placed at start:size."""
    return f'$2 == "{gpu}" && $3 == "MIG" && $7 == "{start}:{size}" {{print $6}}'


def listed_ci(gpu: int) -> str:
    """awk over ``nvidia-smi mig -lci``: the first compute instance of GPU instance ``gi``."""
    return f'$2 == "{gpu}" && $3 == gi {{print $7; exit}}'


def stop_script(run: str) -> str:
    """Stop the process group whose id is in ``<run>.pid``: TERM, up to 30 s, then KILL."""
    pid = shlex.quote(f"{run}.pid")
    return (f'PGID=$(cat {pid}); kill -TERM -- -"$PGID" 2>/dev/null || true; '
            f"timeout 30 sh -c 'while kill -0 -- -\"$1\" 2>/dev/null; do sleep 0.5; done' _ \"$PGID\" "
            f'|| kill -KILL -- -"$PGID" 2>/dev/null || true; rm -f {pid}')


def ready_script(run: str, port: int, timeout: float) -> str:
    """Wait until the server on ``port`` is ready; if it is not within ``timeout`` seconds, stop
    its process group and fail the script."""
    url = f"http://127.0.0.1:{port}/v2/health/ready"
    return (f"timeout {timeout:g} sh -c 'until curl -fsS -o /dev/null {url}; do sleep 1; done' "
            f'|| {{ echo "{run}: not ready after {timeout:g} s, see {run}.log" >&2; '
            f"{stop_script(run)}; exit 1; }}")


@dataclass
class DryRun:
    """Writes the exact commands a plan needs, one script per node, without running any.

    GPU-instance ids are parsed from ``nvidia-smi mig -cgi <profile>:<start> -C`` output into
    shell variables (``GI_<gpu>_<start>``, ``CI_<gpu>_<start>``); a slice the script did not
    create (a re-plan) is looked up by its placement in ``nvidia-smi mig -lgi``. A server on a
    MIG slice sees ``MIG-<GPU-UUID>/<GI>/<CI>``. Variants in ``sources`` get their GPU model
    repository written by the script; the others are expected under ``repo_root`` already.
    Servers get ports from ``base_port`` upward, two per server, per node; each is waited for
    on ``/v2/health/ready`` (``ready_timeout`` seconds) and stopped by its process group.
    """

    repo_root: str = "/var/lib/headrace/repos"
    base_port: int = 8100
    sources: Mapping[str, VariantSource] = field(default_factory=dict)
    ready_timeout: float = 300.0
    run_dir: str = RUN_DIR
    by_node: dict[str, list[Command]] = field(default_factory=dict)
    _vars: dict[str, set[str]] = field(default_factory=dict)
    _ports: dict[str, int] = field(default_factory=dict)
    _next_port: dict[str, int] = field(default_factory=dict)

    @property
    def commands(self) -> list[Command]:
        return [c for cmds in self.by_node.values() for c in cmds]

    def apply(self, plan_or_diff: Plan | PlanDiff) -> list[Command]:
        """Record every step's commands in its node's script; returns the new ones, in step order."""
        out: list[Command] = []
        for st in _steps(plan_or_diff):
            cmds = self.commands_for(st)
            self.by_node.setdefault(node_of(st.gpu), []).extend(cmds)
            out += cmds
        return out

    def scripts(self) -> dict[str, str]:
        """One bash script per node, each touching only that node's GPUs."""
        return {node: "#!/usr/bin/env bash\nset -euo pipefail\n" + f"mkdir -p {shlex.quote(self.run_dir)}\n"
                + "\n".join(c.shell() for c in cmds) + "\n" for node, cmds in self.by_node.items()}

    def script(self) -> str:
        """The one node's script, or every node's under a ``# node <name>`` header."""
        scripts = self.scripts()
        if len(scripts) == 1:
            return next(iter(scripts.values()))
        return "".join(f"# ---------------------------------------------------------------- node {n}\n{s}"
                       for n, s in scripts.items())

    # ------------------------------------------------------------------ ids on the node
    def _have(self, st: Step, name: str) -> bool:
        return name in self._vars.setdefault(node_of(st.gpu), set())

    def _define(self, st: Step, name: str) -> None:
        self._vars.setdefault(node_of(st.gpu), set()).add(name)

    def _gpu_uuid(self, st: Step) -> tuple[list[Command], str]:
        i = gpu_index(st.gpu)
        var = f"GPU_{i}"
        if self._have(st, var):
            return [], var
        self._define(st, var)
        return [Command(("nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", str(i)),
                        capture=var)], var

    def _instance_ids(self, st: Step, s: SlicePlan) -> tuple[list[Command], str, str]:
        """Commands defining ``GI_<gpu>_<start>`` / ``CI_..`` from the driver's listing, unless
        this script already has them (it created the slice)."""
        i = gpu_index(st.gpu)
        gi, ci = f"GI_{i}_{s.start}", f"CI_{i}_{s.start}"
        if self._have(st, gi):
            return [], gi, ci
        size = catalogue_gpu(st.gpu_model).profile(s.profile).mem_slices
        self._define(st, gi)
        self._define(st, ci)
        smi = ("nvidia-smi", "mig", "-i", str(i))
        return [Command((*smi, "-lgi"), capture=gi, parse=listed_gi(i, s.start or 0, size)),
                Command((*smi, "-lci", "-gi", f"${gi}"), capture=ci, parse=listed_ci(i), parse_vars=(("gi", f"${gi}"),)),
                Command(("test", "-n", f"${gi}"))], gi, ci

    def device(self, st: Step) -> tuple[list[Command], str]:
        """Commands that resolve the device a server on ``st``'s slice uses, and its name."""
        pre, uuid = self._gpu_uuid(st)
        if st.slice is None or st.slice.start is None:
            return pre, f"${uuid}"
        more, gi, ci = self._instance_ids(st, st.slice)
        return pre + more, f"MIG-${uuid}/${gi}/${ci}"

    # ------------------------------------------------------------------ steps
    def commands_for(self, st: Step) -> list[Command]:
        """The commands that apply ``st`` on its node."""
        return apply_step(self, st)

    def enable_mig(self, st: Step) -> list[Command]:
        return [Command(("nvidia-smi", "-i", str(gpu_index(st.gpu)), "-mig", "1"))]

    def disable_mig(self, st: Step) -> list[Command]:
        return [Command(("nvidia-smi", "-i", str(gpu_index(st.gpu)), "-mig", "0"))]

    def create_slice(self, st: Step) -> list[Command]:
        i, s = str(gpu_index(st.gpu)), _slice_of(st)
        gi, ci = f"GI_{i}_{s.start}", f"CI_{i}_{s.start}"
        self._define(st, gi)
        self._define(st, ci)
        out = f"CREATED_{i}_{s.start}"
        return [Command(("nvidia-smi", "mig", "-i", i, "-cgi", f"{s.profile}:{s.start}", "-C"), capture=out),
                Command(("echo", f"${out}"), capture=gi, parse=CREATED_GI),
                Command(("echo", f"${out}"), capture=ci, parse=CREATED_CI),
                Command(("test", "-n", f"${gi}"))]

    def destroy_slice(self, st: Step) -> list[Command]:
        smi = ("nvidia-smi", "mig", "-i", str(gpu_index(st.gpu)))
        pre, gi, ci = self._instance_ids(st, _slice_of(st))
        self._vars[node_of(st.gpu)] -= {gi, ci}
        return pre + [Command((*smi, "-dci", "-gi", f"${gi}", "-ci", f"${ci}")),
                      Command((*smi, "-dgi", "-gi", f"${gi}"))]

    def start_mps(self, st: Step) -> list[Command]:
        pipe, log = mps_dirs(st.gpu, _slice_of(st))
        pre, dev = self.device(st)
        env = (("CUDA_VISIBLE_DEVICES", dev), ("CUDA_MPS_PIPE_DIRECTORY", pipe), ("CUDA_MPS_LOG_DIRECTORY", log))
        return pre + [Command(("mkdir", "-p", pipe, log)), Command(("nvidia-cuda-mps-control", "-d"), env)]

    def stop_mps(self, st: Step) -> list[Command]:
        pipe, log = mps_dirs(st.gpu, _slice_of(st))
        env = (("CUDA_MPS_PIPE_DIRECTORY", pipe), ("CUDA_MPS_LOG_DIRECTORY", log))
        return [Command(("nvidia-cuda-mps-control",), env, stdin="quit")]

    def stop_replica(self, st: Step) -> list[Command]:
        return [Command((), script=stop_script(f"{self.run_dir}/{replica_dir(st.replica_id)}"))]

    def start_replica(self, st: Step) -> list[Command]:
        node = node_of(st.gpu)
        if st.replica_id not in self._ports:
            self._ports[st.replica_id] = self._next_port.get(node, self.base_port)
            self._next_port[node] = self._ports[st.replica_id] + 2
        port = self._ports[st.replica_id]
        pre, dev = self.device(st)
        out = list(pre)
        src = _source(self.sources, st)
        if src is not None and st.replica is not None:
            repo = f"{self.repo_root}/{replica_dir(st.replica_id)}"
            try:
                m = gpu_model(st.replica.variant, src, st.replica.max_batch)
            except SourceError as e:
                raise ExecutorError(f"{st.describe()}: {e}") from e
            mdir = f"{repo}/{m.variant}"
            dirs = sorted({f"{mdir}/{rel}".rsplit("/", 1)[0] for _, rel in m.files} | {mdir})
            out.append(Command(("mkdir", "-p", *dirs)))
            out += [Command(("cp", "-r", str(p), f"{mdir}/{rel}")) for p, rel in m.files]
            out.append(Command(("tee", f"{mdir}/config.pbtxt"), stdin=m.config))
        env = tuple(client_env(st, dev).items())
        run = f"{self.run_dir}/{replica_dir(st.replica_id)}"
        return out + [Command(replica_argv(st.replica_id, port, port + 1, self.repo_root), env, background=run),
                      Command((), script=ready_script(run, port, self.ready_timeout))]


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
        if p is not None:
            stop_group(p, grace=10.0)


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
    """Configures the GPUs of one node through NVML (profile ids read at run time, explicit
    placements, instance ids as the driver returns them) and starts MPS daemons and Triton
    servers through ``runner``. ``nvml`` is the pynvml module or any object with the same
    functions (tests pass a fake that enforces MIG rules and numbers instances its own way).

    ``node``: the node whose steps this executor applies (None: the plan must be on one node).
    Variants in ``sources`` get a GPU model repository under ``repo_root``; every server is
    polled with ``ready`` (``host:port`` -> ready?) until ``ready_timeout`` on ``clock``, and
    stopped by its process group if it is not ready in time."""

    nvml: Any = None
    runner: ProcessRunner = field(default_factory=SubprocessRunner)
    repo_root: str = "/var/lib/headrace/repos"
    base_port: int = 8100
    load: Callable[[], Any] = _load_pynvml
    node: str | None = None
    sources: Mapping[str, VariantSource] = field(default_factory=dict)
    ready: Callable[[str], bool] = http_ready
    ready_timeout: float = 300.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    instances: dict[tuple[str, str], tuple[Any, tuple[Any, ...]]] = field(default_factory=dict)  # (gpu, slice) -> (GI, CIs)
    uuids: dict[tuple[str, str], str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def _n(self) -> Any:
        if self.nvml is None:
            self.nvml = self.load()
        return self.nvml

    def _dev(self, gpu: str) -> Any:
        return self._n().nvmlDeviceGetHandleByIndex(gpu_index(gpu))

    def mine(self, steps: tuple[Step, ...]) -> list[Step]:
        """The steps of this executor's node."""
        nodes = sorted({node_of(st.gpu) for st in steps})
        if self.node is None and len(nodes) > 1:
            raise ExecutorError(f"the plan spans nodes {', '.join(nodes)}; an Nvml executor applies one "
                                "node's steps: give it node=<name> on each node")
        return [st for st in steps if self.node is None or node_of(st.gpu) == self.node]

    def apply(self, plan_or_diff: Plan | PlanDiff) -> dict[tuple[str, str], str]:
        self._n()
        for st in self.mine(_steps(plan_or_diff)):
            try:
                self.run(st)
            except ExecutorError:
                raise
            except Exception as e:  # NVML raises its own NVMLError types
                raise ExecutorError(f"{st.describe()}: {type(e).__name__}: {e}") from e
            self.log.append(st.describe())
        return dict(self.uuids)

    def run(self, st: Step) -> None:
        """Apply one step (:data:`STEP_HANDLERS`)."""
        apply_step(self, st)

    def enable_mig(self, st: Step) -> None:
        self._n().nvmlDeviceSetMigMode(self._dev(st.gpu), self._n().NVML_DEVICE_MIG_ENABLE)

    def disable_mig(self, st: Step) -> None:
        self._n().nvmlDeviceSetMigMode(self._dev(st.gpu), self._n().NVML_DEVICE_MIG_DISABLE)

    def create_slice(self, st: Step) -> None:
        n, s = self._n(), _slice_of(st)
        key = (st.gpu, s.label)
        dev = self._dev(st.gpu)
        prof = catalogue_gpu(st.gpu_model).profile(s.profile)
        info = n.nvmlDeviceGetGpuInstanceProfileInfo(dev, getattr(n, prof.nvml_profile))
        placement = n.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = s.start, prof.mem_slices
        gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(dev, info.id, placement)
        cih = n.nvmlGpuInstanceCreateComputeInstance(gi, self._ci_profile(gi, prof.compute).id)
        self.instances[key] = (gi, (cih,))
        # the driver numbers instances by placement: ask it which id this one got
        self.uuids[key] = self._mig_uuid(dev, n.nvmlGpuInstanceGetInfo(gi).id)

    def destroy_slice(self, st: Step) -> None:
        n, s = self._n(), _slice_of(st)
        key = (st.gpu, s.label)
        gi, cih = self.instances.pop(key, None) or self._find(st, s)
        self.uuids.pop(key, None)
        for c in cih:
            n.nvmlComputeInstanceDestroy(c)
        n.nvmlGpuInstanceDestroy(gi)

    def _ci_profile(self, gi: Any, compute: int) -> Any:
        n = self._n()
        return n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, getattr(n, f"NVML_COMPUTE_INSTANCE_PROFILE_{compute}_SLICE"), n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)

    def _find(self, st: Step, s: SlicePlan) -> tuple[Any, tuple[Any, ...]]:
        """A GPU instance this executor did not create (a re-plan), found by its placement,
        with its compute instances."""
        n = self._n()
        dev = self._dev(st.gpu)
        prof = catalogue_gpu(st.gpu_model).profile(s.profile)
        info = n.nvmlDeviceGetGpuInstanceProfileInfo(dev, getattr(n, prof.nvml_profile))
        for gi in n.nvmlDeviceGetGpuInstances(dev, info.id):
            if n.nvmlGpuInstanceGetInfo(gi).placement.start == s.start:
                return gi, tuple(n.nvmlGpuInstanceGetComputeInstances(gi, self._ci_profile(gi, prof.compute).id))
        raise ExecutorError(f"{st.describe()}: no {s.profile} GPU instance at placement {s.start} on {st.gpu}")

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
        if st.slice is not None and st.slice.start is not None:  # a slice created before this executor
            gi, _ = self._find(st, st.slice)
            self.uuids[key] = self._mig_uuid(self._dev(st.gpu), self._n().nvmlGpuInstanceGetInfo(gi).id)
            return self.uuids[key]
        uuid = self._n().nvmlDeviceGetUUID(self._dev(st.gpu))
        return uuid.decode() if isinstance(uuid, bytes) else uuid

    def start_mps(self, st: Step) -> None:
        s = _slice_of(st)
        pipe, log = mps_dirs(st.gpu, s)
        Path(pipe).mkdir(parents=True, exist_ok=True)
        Path(log).mkdir(parents=True, exist_ok=True)
        self.runner.start(f"mps:{st.gpu}:{s.label}", ("nvidia-cuda-mps-control", "-d"), {
            "CUDA_VISIBLE_DEVICES": self._device(st, (st.gpu, s.label)), "CUDA_MPS_PIPE_DIRECTORY": pipe,
            "CUDA_MPS_LOG_DIRECTORY": log})

    def stop_mps(self, st: Step) -> None:
        s = _slice_of(st)
        pipe, log = mps_dirs(st.gpu, s)
        mps_key = f"mps:{st.gpu}:{s.label}"
        self.runner.start(mps_key + ":quit", ("nvidia-cuda-mps-control",),
                          {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log}, stdin="quit")
        self.runner.stop(mps_key)

    def stop_replica(self, st: Step) -> None:
        self.runner.stop(st.replica_id)

    def start_replica(self, st: Step) -> None:
        key = (st.gpu, _slice_of(st).label)
        port = self.ports.setdefault(st.replica_id, self.base_port + 2 * len(self.ports))
        src = _source(self.sources, st)
        if src is not None and st.replica is not None:
            try:
                write_gpu_model(Path(self.repo_root) / replica_dir(st.replica_id),
                                gpu_model(st.replica.variant, src, st.replica.max_batch))
            except (SourceError, OSError) as e:
                raise ExecutorError(f"{st.describe()}: {e}") from e
        self.runner.start(st.replica_id, replica_argv(st.replica_id, port, port + 1, self.repo_root),
                          client_env(st, self._device(st, key)))
        deadline = self.clock() + self.ready_timeout
        while not self.ready(f"127.0.0.1:{port}"):
            if self.clock() >= deadline:
                self.runner.stop(st.replica_id)
                raise ExecutorError(f"{st.describe()}: Triton on port {port} not ready after "
                                    f"{self.ready_timeout:g} s; stopped it")
            self.sleep(0.5)


EXECUTORS = ("dry-run", "emulated", "nvml")
