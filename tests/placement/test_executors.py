"""Apply paths for real nodes: instance ids from the driver, one script per node, GPU model
repositories, readiness and stopping. Drivers are scripted: a fake ``nvidia-smi`` on PATH that
numbers GPU instances by placement, and a fake NVML module with non-sequential ids."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import get_args

import pytest

from placement.apply.emulated import Emulated
from placement.apply.executors import STEP_HANDLERS, DryRun, ExecutorError, Nvml
from placement.apply.gpu_repository import gpu_model, kind_gpu
from placement.diff import Action, diff
from placement.plan import Demand, GpuClass, GpuPlan, Inventory, Plan, Replica, SlicePlan
from profiles.profile import LatencyPoint, Profile, ProfileSet
from profiles.triton.sources import VariantSource

# what a driver hands out: GPU-instance ids by placement start, never 1, 2, 3 in creation order
GI_BY_START = {0: 9, 2: 5, 4: 2, 6: 13}


def _profile(variant: str, slice_: str) -> Profile:
    pts = tuple(LatencyPoint(b, (2 + 0.5 * b) / 1e3, (2 + 0.5 * b) / 1e3) for b in (1, 64))
    return Profile(variant, variant, "A100-80GB", slice_, 64, pts, 1000.0, None, 0.1)


def _rep(variant: str, share: float = 1.0) -> Replica:
    return Replica(variant, variant, share, 8, 100.0)


def _plan(gpus: tuple[GpuPlan, ...]) -> Plan:
    variants = sorted({r.variant for g in gpus for s in g.slices for r in s.replicas})
    ps = ProfileSet([_profile(v, sl) for v in variants for sl in ("1g.10gb", "2g.20gb", "3g.40gb", "gpu")])
    ids = tuple(g.id for g in gpus)
    return Plan(gpus, tuple(Demand(v, 1.0, 0.1) for v in variants),
                Inventory((GpuClass("A100-80GB", ids),)), "hand", 0, 0, ps)


def two_node_plan() -> Plan:
    return _plan((
        GpuPlan("n0/gpu0", "A100-80GB", True, (SlicePlan("3g.40gb", 4, False, (_rep("a"),)),
                                               SlicePlan("1g.10gb", 0, True, (_rep("b", .5), _rep("c", .25))))),
        GpuPlan("n1/gpu0", "A100-80GB", True, (SlicePlan("2g.20gb", 2, False, (_rep("a"),)),)),
        GpuPlan("n1/gpu1", "A100-80GB", False, (SlicePlan("gpu", None, False, (_rep("b"),)),)),
    ))


# ------------------------------------------------------------------ dry-run scripts

FAKE_SMI = r'''#!/usr/bin/env python3
"""nvidia-smi as a MIG driver answers it: instance ids by placement, state in $SMI_STATE."""
import json, os, sys
state_path = os.environ["SMI_STATE"]
st = json.load(open(state_path)) if os.path.exists(state_path) else {"gis": []}
a = sys.argv[1:]
with open(os.environ["SMI_CALLS"], "a") as f:
    f.write(" ".join(a) + "\n")
def arg(flag):
    return a[a.index(flag) + 1]
GI_BY_START = {0: 9, 2: 5, 4: 2, 6: 13}
SIZE = {"1g.10gb": 1, "2g.20gb": 2, "3g.40gb": 4, "7g.80gb": 8}
if "--query-gpu=uuid" in a:
    print(f"GPU-fake-{arg('-i')}")
elif a[:1] == ["mig"] and "-cgi" in a:
    prof, start = arg("-cgi").split(":")
    gi = GI_BY_START[int(start)]
    st["gis"].append({"gpu": arg("-i"), "gi": gi, "prof": prof, "start": int(start)})
    print(f"Successfully created GPU instance ID {gi:2d} on GPU  {arg('-i')} using profile MIG {prof} (ID  9)")
    print(f"Successfully created compute instance ID  0 on GPU  {arg('-i')} GPU instance ID {gi:2d} "
          f"using profile MIG {prof} (ID  2)")
elif a[:1] == ["mig"] and "-lgi" in a:
    print("| GPU   Name             Profile  Instance   Placement  |")
    for g in st["gis"]:
        print(f"|   {g['gpu']}  MIG {g['prof']}   9   {g['gi']}   {g['start']}:{SIZE[g['prof']]}   |")
elif a[:1] == ["mig"] and "-lci" in a:
    for g in st["gis"]:
        if str(g["gi"]) == arg("-gi"):
            print(f"|   {g['gpu']}      {g['gi']}       MIG {g['prof']}   2   0   0:1   |")
elif a[:1] == ["mig"] and "-dgi" in a:
    st["gis"] = [g for g in st["gis"] if str(g["gi"]) != arg("-gi")]
json.dump(st, open(state_path, "w"))
'''

FAKE_TRITON = r'''#!/usr/bin/env bash
echo "$CUDA_VISIBLE_DEVICES $*" >> "$TRITON_CALLS"
exec sleep 60
'''

# ready once the server on the probed port has started, as a real probe is: the script's
# readiness wait is what orders a server's start before the script's end
FAKE_CURL = r'''#!/usr/bin/env bash
url="${@: -1}"; port="${url#http://127.0.0.1:}"; port="${port%%/*}"
grep -qE -- "--http-port[= ]$port( |$)" "$TRITON_CALLS" 2>/dev/null
'''


@pytest.fixture
def node(tmp_path: Path) -> dict[str, str]:
    """A node without GPUs whose nvidia-smi, tritonserver, curl and MPS control are scripted."""
    if not (shutil.which("bash") and shutil.which("setsid") and shutil.which("awk")):
        pytest.skip("needs bash, setsid and awk")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in {"nvidia-smi": FAKE_SMI, "tritonserver": FAKE_TRITON, "curl": FAKE_CURL,
                       "nvidia-cuda-mps-control": "#!/bin/sh\ncat >/dev/null 2>&1 || true\nexit 0\n"}.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SMI_STATE": str(tmp_path / "smi.json"),
            "SMI_CALLS": str(tmp_path / "smi.log"), "TRITON_CALLS": str(tmp_path / "triton.log")}


def _run(script: str, env: dict[str, str]) -> None:
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def _alive(pid: int) -> bool:
    """Running (a zombie whose parent script has exited counts as gone)."""
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_dry_run_script_takes_instance_ids_from_nvidia_smi_output(node, tmp_path):
    plan = _plan((GpuPlan("n0/gpu2", "A100-80GB", True, (SlicePlan("3g.40gb", 4, False, (_rep("a"),)),
                                                           SlicePlan("1g.10gb", 0, False, (_rep("b"),)))),))
    dry = DryRun(run_dir=str(tmp_path / "run"))
    dry.apply(plan)
    try:
        _run(dry.script(), node)
        stopped = int((tmp_path / "run" / "n0_gpu2_3g.40gb@4_a.pid").read_text())
        seen = Path(node["TRITON_CALLS"]).read_text().splitlines()
        # NOTE: the 3g slice at start 4 is instance 2 and the 1g at start 0 is 9, as the driver said
        assert [line.split()[0] for line in seen] == ["MIG-GPU-fake-2/9/0", "MIG-GPU-fake-2/2/0"]
        # a re-plan that drops the 3g slice, applied by a fresh executor, finds its id by placement
        after = _plan((GpuPlan("n0/gpu2", "A100-80GB", True, (SlicePlan("1g.10gb", 0, False, (_rep("b"),)),)),))
        again = DryRun(run_dir=str(tmp_path / "run"))
        again.apply(diff(plan, after))
        _run(again.script(), node)
        calls = Path(node["SMI_CALLS"]).read_text()
        assert "mig -i 2 -dci -gi 2 -ci 0" in calls and "mig -i 2 -dgi -gi 2" in calls
        assert [g["gi"] for g in json.loads(Path(node["SMI_STATE"]).read_text())["gis"]] == [9]
        # NOTE: the stopped server's whole process group is gone, the other one still runs
        assert not (tmp_path / "run" / "n0_gpu2_3g.40gb@4_a.pid").exists()
        assert not _alive(stopped)
        assert _alive(int((tmp_path / "run" / "n0_gpu2_1g.10gb@0_b.pid").read_text()))
    finally:
        for pid in (tmp_path / "run").glob("*.pid"):
            subprocess.run(["kill", "-KILL", "--", f"-{pid.read_text().strip()}"], capture_output=True)


def test_a_two_node_plan_yields_one_script_per_node_with_only_its_gpus():
    dry = DryRun()
    dry.apply(two_node_plan())
    scripts = dry.scripts()
    assert sorted(scripts) == ["n0", "n1"]
    assert "nvidia-smi -i 0 -mig 1" in scripts["n0"] and "3g.40gb:4" in scripts["n0"]
    assert "2g.20gb:2" not in scripts["n0"] and "n1_gpu" not in scripts["n0"]
    assert "2g.20gb:2" in scripts["n1"] and "n0_gpu" not in scripts["n1"]
    # NOTE: enabling MIG appears once per node that uses it, never once per GPU index repeated
    assert dry.script().count("nvidia-smi -i 0 -mig 1") == 2
    assert "# ---" in dry.script() and "node n1" in dry.script()
    # ports are per node: both nodes start at the base port
    assert "--http-port=8100" in scripts["n0"] and "--http-port=8100" in scripts["n1"]
    assert "headrace-stop-replica" not in dry.script()


def test_dry_run_writes_a_kind_gpu_repository_for_an_artifact(tmp_path):
    onnx = tmp_path / "a.onnx"
    onnx.write_bytes(b"onnx")
    plan = _plan((GpuPlan("n0/gpu0", "A100-80GB", False, (SlicePlan("gpu", None, False, (_rep("a"),)),)),))
    dry = DryRun(repo_root=str(tmp_path / "repos"), run_dir=str(tmp_path / "run"),
                 sources={"a": VariantSource("artifact", str(onnx))})
    dry.apply(plan)
    text = dry.script()
    assert f"cp -r {onnx} {tmp_path}/repos/n0_gpu0_gpu_a/a/1/model.onnx" in text
    assert 'backend: "onnxruntime"' in text and "kind: KIND_GPU gpus: [ 0 ]" in text


# ------------------------------------------------------------------ GPU model repositories


def test_gpu_repositories_from_a_model_file_and_from_a_triton_directory(tmp_path):
    plan_file = tmp_path / "m.plan"
    plan_file.write_bytes(b"engine")
    trt = gpu_model("bert_trt", VariantSource("artifact", str(plan_file)), 16)
    assert 'platform: "tensorrt_plan"' in trt.config and "backend" not in trt.config
    assert "max_batch_size: 16" in trt.config and trt.files == ((plan_file, "1/model.plan"),)
    d = tmp_path / "resnet"
    (d / "1").mkdir(parents=True)
    (d / "2").mkdir()
    (d / "config.pbtxt").write_text(textwrap.dedent('''\
        name: "resnet_onnx"
        backend: "onnxruntime"
        instance_group [ { count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "r" count: 1 } ] } } ]
        max_batch_size: 8
        '''))
    m = gpu_model("resnet50", VariantSource("artifact", str(d)), 8)
    assert 'name: "resnet50"' in m.config and "KIND_CPU" not in m.config and "max_batch_size: 8" in m.config
    assert m.config.count("instance_group") == 1 and "kind: KIND_GPU gpus: [ 0 ]" in m.config
    assert [rel for _, rel in m.files] == ["2"]  # the highest version only
    assert kind_gpu('name: "x"\n').endswith("instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]\n")


# ------------------------------------------------------------------ NVML


class ScriptedNvml:
    """pynvml as a driver answers: GPU-instance ids by placement (GI_BY_START), handles that
    are opaque objects, and a log of every call that names an instance."""

    NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_DISABLE = 1, 0
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
    NVML_GPU_INSTANCE_PROFILE_1_SLICE, NVML_GPU_INSTANCE_PROFILE_2_SLICE = 1, 2
    NVML_GPU_INSTANCE_PROFILE_3_SLICE, NVML_GPU_INSTANCE_PROFILE_7_SLICE = 3, 7
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 101, 102
    NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 103

    class c_nvmlGpuInstancePlacement_t:  # noqa: N801  (pynvml's name)
        start = size = 0

    class Handle:
        def __init__(self, dev: int, gi: int, start: int) -> None:
            self.dev, self.gi, self.start = dev, gi, start

    def __init__(self) -> None:
        self.gis: dict[tuple[int, int], ScriptedNvml.Handle] = {}
        self.calls: list[str] = []

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return i

    def nvmlDeviceSetMigMode(self, dev, mode):  # noqa: N802
        self.calls.append(f"mig {dev} {mode}")

    def nvmlDeviceGetGpuInstanceProfileInfo(self, dev, const):  # noqa: N802
        return type("Info", (), {"id": {1: 19, 2: 14, 3: 9, 7: 0}[const]})()

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, dev, pid, placement):  # noqa: N802
        h = self.Handle(dev, GI_BY_START[placement.start], placement.start)
        self.gis[(dev, h.gi)] = h
        self.calls.append(f"create gi {dev} profile {pid} at {placement.start} -> {h.gi}")
        return h

    def nvmlGpuInstanceGetInfo(self, gi):  # noqa: N802
        return type("Info", (), {"id": gi.gi, "placement": type("P", (), {"start": gi.start})()})()

    def nvmlDeviceGetGpuInstances(self, dev, pid):  # noqa: N802
        return [h for (d, _), h in self.gis.items() if d == dev]

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi, const, eng):  # noqa: N802
        return type("Info", (), {"id": const})()

    def nvmlGpuInstanceCreateComputeInstance(self, gi, pid):  # noqa: N802
        self.calls.append(f"create ci on gi {gi.gi}")
        return ("ci", gi.gi)

    def nvmlGpuInstanceGetComputeInstances(self, gi, pid):  # noqa: N802
        return [("ci", gi.gi)]

    def nvmlComputeInstanceDestroy(self, ci):  # noqa: N802
        self.calls.append(f"destroy ci on gi {ci[1]}")

    def nvmlGpuInstanceDestroy(self, gi):  # noqa: N802
        self.calls.append(f"destroy gi {gi.gi}")
        del self.gis[(gi.dev, gi.gi)]

    def nvmlDeviceGetMaxMigDeviceCount(self, dev):  # noqa: N802
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, dev, i):  # noqa: N802
        mine = sorted(gi for d, gi in self.gis if d == dev)
        if i >= len(mine):
            raise RuntimeError("not found")
        return ("mig", dev, mine[i])

    def nvmlDeviceGetGpuInstanceId(self, mig):  # noqa: N802
        return mig[2]

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return f"MIG-{h[1]}-{h[2]}" if isinstance(h, tuple) else f"GPU-{h}"


class Runner:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict]] = []

    def start(self, key, argv, env, stdin=""):
        self.events.append(("start", key, env))
        return 1

    def stop(self, key):
        self.events.append(("stop", key, {}))


def _one_gpu(slices: tuple[SlicePlan, ...]) -> Plan:
    return _plan((GpuPlan("n0/gpu1", "A100-80GB", True, slices),))


def test_nvml_uses_the_instance_ids_the_driver_returns(tmp_path):
    nv, runner = ScriptedNvml(), Runner()
    plan = _one_gpu((SlicePlan("3g.40gb", 4, False, (_rep("a"),)), SlicePlan("1g.10gb", 0, False, (_rep("b"),))))
    uuids = Nvml(nvml=nv, runner=runner, ready=lambda hp: True).apply(plan)
    assert nv.calls == ["mig 1 1", "create gi 1 profile 19 at 0 -> 9", "create ci on gi 9",
                        "create gi 1 profile 9 at 4 -> 2", "create ci on gi 2"]
    assert uuids == {("n0/gpu1", "1g.10gb@0"): "MIG-1-9", ("n0/gpu1", "3g.40gb@4"): "MIG-1-2"}
    envs = {k: e for what, k, e in runner.events if what == "start"}
    assert envs["n0/gpu1/3g.40gb@4/a"]["CUDA_VISIBLE_DEVICES"] == "MIG-1-2"
    # a fresh executor (the next re-plan) destroys the 3g slice it finds at placement 4
    after = _one_gpu((SlicePlan("1g.10gb", 0, False, (_rep("b"),)),))
    nv.calls.clear()
    Nvml(nvml=nv, runner=runner, ready=lambda hp: True).apply(diff(plan, after))
    assert nv.calls == ["destroy ci on gi 2", "destroy gi 2"]
    assert runner.events[-1] == ("stop", "n0/gpu1/3g.40gb@4/a", {})


def test_nvml_applies_only_its_node_and_refuses_a_plan_across_nodes():
    with pytest.raises(ExecutorError, match="spans nodes n0, n1"):
        Nvml(nvml=ScriptedNvml(), runner=Runner()).apply(two_node_plan())
    runner = Runner()
    Nvml(nvml=ScriptedNvml(), runner=runner, node="n1", ready=lambda hp: True).apply(two_node_plan())
    assert {k for _, k, _ in runner.events} == {"n1/gpu0/2g.20gb@2/a", "n1/gpu1/gpu/b"}


def test_nvml_writes_the_gpu_repository_waits_for_ready_and_stops_a_server_that_never_is(tmp_path):
    onnx = tmp_path / "a.onnx"
    onnx.write_bytes(b"onnx")
    plan = _one_gpu((SlicePlan("3g.40gb", 4, False, (_rep("a"),)),))
    now = [0.0]
    polls: list[str] = []

    def ready(hostport: str) -> bool:
        polls.append(hostport)
        return len(polls) >= 3

    ex = Nvml(nvml=ScriptedNvml(), runner=Runner(), repo_root=str(tmp_path / "repos"), ready=ready,
              clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
              sources={"a": VariantSource("artifact", str(onnx))})
    ex.apply(plan)
    cfg = (tmp_path / "repos" / "n0_gpu1_3g.40gb@4_a" / "a" / "config.pbtxt").read_text()
    assert "kind: KIND_GPU gpus: [ 0 ]" in cfg and 'backend: "onnxruntime"' in cfg
    assert (tmp_path / "repos" / "n0_gpu1_3g.40gb@4_a" / "a" / "1" / "model.onnx").read_bytes() == b"onnx"
    assert polls == ["127.0.0.1:8100"] * 3
    runner = Runner()
    never = Nvml(nvml=ScriptedNvml(), runner=runner, ready=lambda hp: False, ready_timeout=5.0,
                 clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    with pytest.raises(ExecutorError, match="not ready after 5 s; stopped it"):
        never.apply(plan)
    assert runner.events[-1][:2] == ("stop", "n0/gpu1/3g.40gb@4/a")


# ------------------------------------------------------------------ one dispatch of step kinds


def test_every_step_kind_has_a_handler_in_the_table_and_in_every_executor():
    assert set(STEP_HANDLERS) == set(get_args(Action))
    for executor in (DryRun, Nvml, Emulated):
        missing = [kind for kind, name in STEP_HANDLERS.items() if not callable(getattr(executor, name, None))]
        assert not missing, f"{executor.__name__} has no handler for {missing}"


def test_a_round_trip_through_every_step_kind_applies_on_dry_run_and_nvml(tmp_path):
    mig = _one_gpu((SlicePlan("1g.10gb", 0, True, (_rep("b", .5), _rep("c", .25))),))
    whole = _plan((GpuPlan("n0/gpu1", "A100-80GB", False, (SlicePlan("gpu", None, False, (_rep("b"),)),)),))
    steps = [*diff(None, mig).steps, *diff(mig, whole).steps]
    # NOTE: the two diffs walk every kind of step, so each executor applies each handler once at least
    assert {st.action for st in steps} == set(get_args(Action))
    dry = DryRun(run_dir=str(tmp_path / "run"))
    for st in steps:
        assert dry.commands_for(st), st.describe()
    nv, runner = ScriptedNvml(), Runner()
    ex = Nvml(nvml=nv, runner=runner, ready=lambda hp: True)
    for st in steps:
        ex.run(st)
    assert nv.calls[0] == "mig 1 1" and nv.calls[-1] == "mig 1 0"
    assert ("stop", "mps:n0/gpu1:1g.10gb@0", {}) in runner.events


def test_a_step_of_an_unknown_kind_is_refused_naming_the_known_ones():
    st = replace(diff(None, _one_gpu((SlicePlan("gpu", None, False, (_rep("b"),)),))).steps[0], action="reboot")
    with pytest.raises(ExecutorError, match="unknown step kind 'reboot'; known: enable_mig"):
        DryRun().commands_for(st)
