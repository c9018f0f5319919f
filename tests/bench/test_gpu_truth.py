"""bench.gpu_truth where no GPU is: one line and exit 2 without torch, the device named as the
catalogue names it, every measured point set beside its reference profile, and the report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_truth import catalogue_gpu, compare, main, markdown, table
from profiles.llm.profile import load_llm_profiles
from profiles.llm.steptime import StepShape
from profiles.profile import ProfileSet

ROOT = Path(__file__).resolve().parents[2]


def test_without_torch_it_says_so_in_one_line_and_exits_2() -> None:
    # NOTE: a None in sys.modules makes `import torch` fail, as on a machine without it
    code = "import sys; sys.modules['torch'] = None; from bench.gpu_truth import main; raise SystemExit(main([]))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("gpu_truth: PyTorch is not installed")


@pytest.mark.parametrize(("name", "memory_gb", "expected"), [
    ("NVIDIA H100 80GB HBM3", 79.6, ("H100-80GB", "gpu")),
    ("NVIDIA H100 NVL", 93.6, ("H100-NVL", "gpu")),
    ("NVIDIA H200", 143.8, ("H200-141GB", "gpu")),
    ("NVIDIA A100-SXM4-80GB", 85.1, ("A100-80GB", "gpu")),
    ("NVIDIA A100-SXM4-40GB", 42.4, ("A100-40GB", "gpu")),
    ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 42.0, ("A100-80GB", "3g.40gb")),
    ("Tesla T4", 15.8, (None, "gpu")),
])
def test_a_device_name_is_read_as_the_catalogue_names_it(name: str, memory_gb: float, expected: tuple) -> None:
    assert catalogue_gpu(name, memory_gb) == expected


def fabricated_rows() -> list[dict]:
    return [
        {"part": "vision", "model": "resnet50", "batch": 8, "measured_ms": 20.0, "reps": 20},
        {"part": "vision", "model": "vit-b16", "batch": 1, "measured_ms": 6.0, "reps": 20},
        {"part": "prefill", "model": "llama-3-8b-shape", "batch": 1, "tokens": 2048, "context": 0,
         "measured_ms": 150.0, "reps": 20},
        {"part": "decode", "model": "llama-3-8b-shape", "batch": 32, "tokens": 32, "context": 1024,
         "measured_ms": 12.0, "eager_ms": 20.0, "reps": 20},
    ]


def test_each_point_is_set_beside_the_profile_of_its_gpu() -> None:
    rows = compare(fabricated_rows(), "A100-80GB", "gpu")
    resnet = ProfileSet.reference().get("imagenet-resnet50", "A100-80GB", "7g.80gb")
    # NOTE: a whole A100 is read against its full-size MIG slice, the nearest profiled device
    assert rows[0]["profile"] == resnet.name
    assert rows[0]["profile_ms"] == pytest.approx(resnet.latency(8, "p50") * 1e3)
    assert rows[0]["ratio"] == pytest.approx(20.0 / rows[0]["profile_ms"])
    llm = next(p for p in load_llm_profiles() if p.name == "llama-3.1-8b-instruct-bf16@A100-80GB/gpu")
    prefill, decode = StepShape(), StepShape()
    prefill.add_prefill(0, 2048, True)
    for _ in range(32):
        decode.add_decode(1025)
    assert rows[2]["profile"] == llm.name
    assert rows[2]["profile_ms"] == pytest.approx(llm.step_time.seconds(prefill) * 1e3)
    assert rows[3]["profile_ms"] == pytest.approx(llm.step_time.seconds(decode) * 1e3)


def test_a_gpu_without_a_profile_says_so() -> None:
    rows = compare(fabricated_rows(), "H100-80GB", "gpu")
    assert rows[0]["profile"] is None and rows[0]["ratio"] is None
    assert "no imagenet-resnet50 profile for H100-80GB/7g.80gb" in rows[0]["why"]
    assert rows[2]["profile"] == "llama-3.1-8b-instruct-bf16@H100-80GB/gpu"
    unknown = compare(fabricated_rows(), None, "gpu")
    assert all(r["profile"] is None and r["why"] == "GPU not in the catalogue" for r in unknown)


def test_the_report_is_one_table_with_every_point() -> None:
    result = {
        "device": {"name": "NVIDIA A100-SXM4-80GB", "gpu": "A100-80GB", "slice": "gpu", "memory_gb": 85.1,
                   "capability": "8.0", "torch": "2.5.1", "cuda": "12.4", "cudnn": 90100,
                   "tf32": {"cudnn": True, "matmul": False}},
        "plan": "quick",
        "settings": {"vision_batches": [8], "prefill": [2048], "decode_batches": [32], "context": 1024,
                     "warmup": 3, "reps": 10, "budget_s": 120.0, "vision": "FP32 eager",
                     "vision_source": {"resnet50": "plain torch"},
                     "llm": {"layers_timed": 16, "layers": 32, "dtype": "bfloat16", "cuda_graph": True,
                             "scaled": "16 of 32 layers timed"},
                     "profile_cpu_step_ms": 0.5},
        "rows": compare(fabricated_rows(), "A100-80GB", "gpu"),
        "skipped": ["vit-b16 batch 32"], "elapsed_s": 99.0, "commit": "abc", "command": "python -m bench.gpu_truth",
    }
    md = markdown(result)
    assert "\n".join(table(result)) in md
    assert len(table(result)) == 2 + 4
    assert "16 of 32 layers timed" in md and "vit-b16 batch 32" in md
    assert "(eager 20.00)" in md


@pytest.mark.slow
def test_every_code_path_runs_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    assert main(["--cpu-check"]) == 0
    out = capsys.readouterr().out
    assert "| decode | llama-3-8b-shape | batch 2, context 64 |" in out
