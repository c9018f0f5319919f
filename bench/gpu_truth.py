"""What a real NVIDIA GPU does, against the reference profiles that stand for it.

With PyTorch on the GPU, random weights (the work depends on the shapes, not the values):

- ResNet-50 and ViT-B/16 latency at batch 1 to 32, FP32 eager at 224 x 224, PyTorch's default
  math settings (the reference profiles are MIGPerf's PyTorch eager FP32 runs), against the
  classic reference profile of the same GPU and slice (a whole GPU reads its full-size MIG slice,
  the nearest profiled device);
- the prefill step (one sequence of N tokens) and the decode step (B sequences at context C, one
  token each, replayed as a CUDA graph as vLLM replays its decode steps; the eager time is kept
  too) of a Llama-3-8B-shaped stack in bf16, against the step time of the
  ``llama-3.1-8b-instruct-bf16`` LLM profile of that GPU for the same step shape. The profile's
  time includes a per-step CPU estimate (``profiles/llm/build_reference.py``'s CPU_STEP_MS) that
  a bare forward pass does not spend.

Timing: CUDA events around each call, warm-up first, the median of the repetitions. When the
GPU's free memory cannot hold every layer with the KV cache, fewer layers are timed and the step
is scaled: the head alone (embeddings, final norm, LM head) is timed too, and the layers' share
is multiplied by the full count over those timed; the table says so.

The whole run stays within ``--budget-s`` (default 270 s; ``--quick`` 120 s with fewer points);
a point that would start past it is listed as skipped. Where the GPU has no reference profile,
its rows say so. Without torch, or without a CUDA device, it prints one line and exits 2.

Run ``python -m bench.gpu_truth [--quick]``; writes bench/results/gpu_truth.{json,md}.
``--cpu-check`` runs every code path on the CPU with small shapes and writes nothing.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "gpu_truth"
BUDGET_S = 270.0  # the whole run, model building included
QUICK_BUDGET_S = 120.0
VISION = ("resnet50", "vit-b16")
VISION_VARIANTS = {"resnet50": "imagenet-resnet50", "vit-b16": "imagenet-vit-b16"}
LLM_VARIANT = "llama-3.1-8b-instruct-bf16"
LLM_SHAPE = "llama3-8b"  # a key of profiles.llm.shape.LLAMA_SHAPES (Llama-3-8B and 3.1-8B share it)
MEMORY_MARGIN_GB = 6.0  # activations, CUDA graphs' pools, the allocator's slack
PLANS = {  # points and repetitions of a run
    "full": {"vision_batches": (1, 2, 4, 8, 16, 32), "prefill": (512, 2048), "decode_batches": (1, 4, 16, 32, 64),
             "context": 1024, "warmup": 5, "reps": 20, "budget_s": BUDGET_S},
    "quick": {"vision_batches": (1, 8, 32), "prefill": (512, 2048), "decode_batches": (1, 16, 64),
              "context": 1024, "warmup": 3, "reps": 10, "budget_s": QUICK_BUDGET_S},
    "cpu-check": {"vision_batches": (1,), "prefill": (32,), "decode_batches": (1, 2), "context": 64,
                  "warmup": 0, "reps": 1, "budget_s": 240.0},
}


class Unavailable(Exception):
    """Nothing can be measured here: one line says why."""


# the device and its profiles


def catalogue_gpu(device_name: str, memory_gb: float) -> tuple[str | None, str]:
    """The GPU model of ``profiles/catalogue.py`` a CUDA device name stands for (None if none), and
    its slice: the MIG profile in the name of a MIG device, else the whole GPU."""
    from profiles.catalogue import WHOLE

    mig = re.search(r"MIG\s+(\d+g\.\d+gb)", device_name, re.IGNORECASE)
    slice_name = mig.group(1).lower() if mig else WHOLE
    name = device_name.upper()
    if "H200" in name:
        gpu = "H200-141GB"
    elif "H100" in name:
        gpu = "H100-NVL" if "NVL" in name else "H100-80GB"
    elif "A100" in name:
        gpu = "A100-80GB" if "80GB" in name or memory_gb > 45 else "A100-40GB"
    elif "A30" in name:
        gpu = "A30-24GB"
    elif "B200" in name:
        gpu = "B200"
    else:
        gpu = None
    return gpu, slice_name


def full_slice(gpu: str) -> str:
    """The MIG profile that spans a whole GPU (7g.80gb on an A100-80GB)."""
    from profiles.catalogue import gpu_model

    return max(gpu_model(gpu).profiles, key=lambda p: (p.compute, p.mem_slices)).name


def compare(rows: list[dict[str, Any]], gpu: str | None, slice_name: str) -> list[dict[str, Any]]:
    """Each measured row with the reference profile's value for the same point: ``profile``
    (its name, or None with ``why``), ``profile_ms``, ``profile_kind`` and ``ratio`` (measured over
    profile)."""
    from profiles.catalogue import WHOLE
    from profiles.llm.profile import load_llm_profiles
    from profiles.llm.steptime import StepShape
    from profiles.profile import ProfileSet

    classic = ProfileSet.reference()
    llm = {(p.variant, p.gpu, p.slice, p.tp): p for p in load_llm_profiles()}
    out = []
    for row in rows:
        r = dict(row, profile=None, profile_ms=None, profile_kind=None, ratio=None)
        if gpu is None:
            r["why"] = "GPU not in the catalogue"
        elif r["part"] == "vision":
            sl = full_slice(gpu) if slice_name == WHOLE else slice_name
            found = classic.find(variant=VISION_VARIANTS[r["model"]], gpu=gpu, slice=sl)
            if found:
                p = found[0]
                r.update(profile=p.name, profile_ms=p.latency(r["batch"], "p50") * 1e3,
                         profile_kind=p.provenance.kind)
            else:
                r["why"] = f"no {VISION_VARIANTS[r['model']]} profile for {gpu}/{sl}"
        else:
            p = llm.get((LLM_VARIANT, gpu, slice_name, 1))
            if p is None:
                r["why"] = f"no {LLM_VARIANT} profile for {gpu}/{slice_name}"
            else:
                shape = StepShape()
                if r["part"] == "prefill":
                    shape.add_prefill(0, r["tokens"], True)
                else:
                    for _ in range(r["batch"]):
                        shape.add_decode(r["context"] + 1)
                r.update(profile=p.name, profile_ms=p.step_time.seconds(shape) * 1e3, profile_kind=p.provenance.kind)
        if r["profile_ms"] and r.get("measured_ms") is not None:
            r["ratio"] = r["measured_ms"] / r["profile_ms"]
        out.append(r)
    return out


# measuring


def _load_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise Unavailable("PyTorch is not installed here; nothing measured (this bench needs torch with CUDA "
                          "on an NVIDIA GPU)") from None
    return torch


class Timer:
    """Median milliseconds of a call: CUDA events on a GPU, the wall clock on the CPU; stops
    repeating at the deadline."""

    def __init__(self, torch: Any, device: Any, warmup: int, reps: int, deadline: float) -> None:
        self.torch, self.cuda = torch, device.type == "cuda"
        self.warmup, self.reps, self.deadline = warmup, reps, deadline

    def __call__(self, fn: Callable[[], object]) -> tuple[float, int]:
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.reps):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            if time.monotonic() > self.deadline:
                break
        return statistics.median(times), len(times)


def measure_vision(torch: Any, device: Any, plan: dict, timer: Timer, deadline: float,
                   skipped: list[str]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    from bench.gpu_models import vision_model

    rows, sources = [], {}
    for name in VISION:
        model, sources[name] = vision_model(name)
        model = model.to(device).eval()
        for b in plan["vision_batches"]:
            if time.monotonic() > deadline:
                skipped.append(f"{name} batch {b}")
                continue
            x = torch.randn(b, 3, 224, 224, device=device)
            with torch.inference_mode():
                ms, n = timer(lambda m=model, x=x: m(x))
            rows.append({"part": "vision", "model": name, "batch": b, "measured_ms": ms, "reps": n})
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, sources


def llm_layers(shape: Any, free_bytes: int, max_seqs: int, max_len: int) -> int:
    """The most layers of ``shape`` whose weights and KV cache fit ``free_bytes`` with the margin."""
    head = 2 * 2 * shape.vocab * shape.hidden
    per_layer = 2 * shape.layer_params + max_seqs * max_len * shape.kv_bytes_per_token // shape.layers
    room = free_bytes - head - MEMORY_MARGIN_GB * 1e9
    return max(0, min(shape.layers, int(room // per_layer)))


def _graphed(torch: Any, model: Any, tokens: Any, start: int) -> Callable[[], object]:
    """The decode step captured as a CUDA graph (its replay), else the eager call."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            model.step(tokens, start)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model.step(tokens, start)
    return graph.replay


def measure_llm(torch: Any, device: Any, shape: Any, plan: dict, timer: Timer, deadline: float,
                skipped: list[str], layers: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Prefill and decode steps of ``shape``, every layer of it when memory allows (else ``layers``
    and the head alone, scaled)."""
    from bench.gpu_models import Llama

    ctx, seqs = plan["context"], max(plan["decode_batches"])
    max_len = max(max(plan["prefill"]), ctx + 1)
    if layers is None:
        free = torch.cuda.mem_get_info()[0] if device.type == "cuda" else 1 << 60
        layers = llm_layers(shape, free, seqs, max_len)
    if layers < 1:
        skipped.append("LLM steps: one layer and its KV cache do not fit the free memory")
        return [], {"layers_timed": 0}
    info: dict[str, Any] = {"layers_timed": layers, "layers": shape.layers, "context": ctx, "dtype": "bfloat16",
                            "cuda_graph": device.type == "cuda"}
    torch.manual_seed(0)

    def points(model: Any, graphs: bool) -> dict[tuple, tuple[float, float | None, int]]:
        got: dict[tuple, tuple[float, float | None, int]] = {}
        with torch.inference_mode():
            for n in plan["prefill"]:
                if time.monotonic() > deadline:
                    continue
                tokens = torch.randint(0, shape.vocab, (1, n), device=device)
                ms, reps = timer(lambda t=tokens: model.step(t, 0))
                got[("prefill", n)] = (ms, None, reps)
            for b in plan["decode_batches"]:
                if time.monotonic() > deadline:
                    continue
                tokens = torch.randint(0, shape.vocab, (b, 1), device=device)
                eager, reps = timer(lambda t=tokens: model.step(t, ctx))
                ms = eager
                if graphs:
                    try:
                        ms, reps = timer(_graphed(torch, model, tokens, ctx))
                    except RuntimeError as e:  # capture refused: the eager time stands, and says so
                        info["cuda_graph"] = f"capture failed ({' '.join(str(e).split())[:120]}); eager times"
                got[("decode", b)] = (ms, eager, reps)
        return got

    def build(n_layers: int) -> Any:
        return Llama(shape, n_layers, seqs, max_len, device).eval()

    model = build(layers)
    timed = points(model, device.type == "cuda" and info["cuda_graph"] is True)
    del model
    head: dict[tuple, tuple[float, float | None, int]] = {}
    if layers < shape.layers and time.monotonic() < deadline:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        model = build(0)
        head = points(model, device.type == "cuda" and info["cuda_graph"] is True)
        del model
        info["scaled"] = f"{layers} of {shape.layers} layers timed; step = head + layers' share x {shape.layers}/{layers}"
    if device.type == "cuda":
        torch.cuda.empty_cache()

    def scaled(key: tuple, i: int) -> float | None:
        value = timed[key][i]
        if value is None or layers == shape.layers:
            return value
        if key not in head or head[key][i] is None:
            return None
        return head[key][i] + (value - head[key][i]) * shape.layers / layers

    rows = []
    for kind, values in (("prefill", plan["prefill"]), ("decode", plan["decode_batches"])):
        for v in values:
            key = (kind, v)
            if key not in timed or scaled(key, 0) is None:
                skipped.append(f"{kind} {'tokens' if kind == 'prefill' else 'batch'} {v}")
                continue
            row = {"part": kind, "model": "llama-3-8b-shape", "measured_ms": scaled(key, 0), "reps": timed[key][2]}
            if kind == "prefill":
                row.update(batch=1, tokens=v, context=0)
            else:
                row.update(batch=v, tokens=v, context=ctx, eager_ms=scaled(key, 1))
            rows.append(row)
    return rows, info


def run(plan_name: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure every point of the plan and compare it; Unavailable where nothing can be measured."""
    t0 = time.monotonic()
    plan = PLANS[plan_name]
    deadline = t0 + plan["budget_s"]
    torch = _load_torch()
    cpu = plan_name == "cpu-check"
    if not cpu and not torch.cuda.is_available():
        raise Unavailable(f"torch {torch.__version__} sees no CUDA device; nothing measured (this bench needs an "
                          "NVIDIA GPU)")
    from profiles.llm.shape import LLAMA_SHAPES, LlamaShape

    device = torch.device("cpu" if cpu else "cuda")
    if cpu:
        name, memory_gb, capability = "cpu", 0.0, None
        shape, layers = LlamaShape(layers=4, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=1000,
                                   head_dim=64), 2
    else:
        props = torch.cuda.get_device_properties(0)
        name, memory_gb, capability = props.name, props.total_memory / 1e9, f"{props.major}.{props.minor}"
        shape, layers = LLAMA_SHAPES[LLM_SHAPE], None
    gpu, slice_name = catalogue_gpu(name, memory_gb)
    device_info = {
        "name": name, "gpu": gpu, "slice": slice_name, "memory_gb": round(memory_gb, 1), "capability": capability,
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "tf32": {"cudnn": torch.backends.cudnn.allow_tf32, "matmul": torch.backends.cuda.matmul.allow_tf32},
    }
    log(f"{name} ({gpu or 'not in the catalogue'}/{slice_name}), torch {torch.__version__}, plan {plan_name}")
    timer = Timer(torch, device, plan["warmup"], plan["reps"], deadline)
    skipped: list[str] = []
    vision, sources = measure_vision(torch, device, plan, timer, deadline, skipped)
    log(f"vision done at {time.monotonic() - t0:.0f} s")
    llm, llm_info = measure_llm(torch, device, shape, plan, timer, deadline, skipped, layers)
    log(f"LLM done at {time.monotonic() - t0:.0f} s")
    from profiles.llm.build_reference import CPU_STEP_MS

    return {
        "device": device_info, "plan": plan_name,
        "settings": {**{k: list(v) if isinstance(v, tuple) else v for k, v in plan.items()},
                     "vision": "FP32 eager, 224 x 224, inference_mode", "vision_source": sources,
                     "llm": llm_info, "llm_shape": asdict(shape),
                     "profile_cpu_step_ms": CPU_STEP_MS},
        "rows": compare(vision + llm, gpu, slice_name),
        "skipped": skipped, "elapsed_s": round(time.monotonic() - t0, 1),
    }


# the report


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _point(r: dict[str, Any]) -> str:
    if r["part"] == "vision":
        return f"batch {r['batch']}"
    if r["part"] == "prefill":
        return f"{r['tokens']} tokens"
    return f"batch {r['batch']}, context {r['context']}"


def table(result: dict[str, Any]) -> list[str]:
    lines = ["| part | model | point | measured ms | profile ms | measured / profile | profile |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in result["rows"]:
        prof = f"{r['profile']} ({r['profile_kind']})" if r["profile"] else f"none: {r.get('why', '')}"
        extra = f" (eager {r['eager_ms']:.2f})" if r.get("eager_ms") is not None else ""
        lines.append(f"| {r['part']} | {r['model']} | {_point(r)} | {_f(r['measured_ms'])}{extra} | "
                     f"{_f(r['profile_ms'])} | {_f(r['ratio'], '{:.2f}x')} | {prof} |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    d, st = result["device"], result["settings"]
    llm = st["llm"]
    ratios = {part: [r["ratio"] for r in result["rows"] if r["part"] == part and r["ratio"] is not None]
              for part in ("vision", "prefill", "decode")}
    summary = "; ".join(f"{part} median {statistics.median(v):.2f}x over {len(v)} points" for part, v in ratios.items()
                        if v) or "no point has a profile to compare with"
    lines = [
        "# A real GPU against the reference profiles", "",
        f"Commit {result.get('commit')}. Command: `{result.get('command')}`. {result['elapsed_s']} s.", "",
        f"Device: {d['name']} ({d['gpu'] or 'not in the catalogue'}, slice {d['slice']}, {d['memory_gb']} GB, "
        f"compute capability {d['capability']}); torch {d['torch']}, CUDA {d['cuda']}, cuDNN {d['cudnn']}; "
        f"TF32 cuDNN {d['tf32']['cudnn']}, matmul {d['tf32']['matmul']}.", "",
        f"Vision: {st['vision']}, models from {', '.join(f'{k}: {v}' for k, v in st['vision_source'].items())}. "
        f"LLM: a Llama-3-8B-shaped stack in {llm.get('dtype')}, random weights, {llm.get('layers_timed')} of "
        f"{llm.get('layers')} layers timed" + (f" ({llm['scaled']})" if llm.get("scaled") else "")
        + f"; decode at context {st['context']}, CUDA graph: {llm.get('cuda_graph')}. The LLM profile's step "
        f"includes a per-step CPU estimate of {st['profile_cpu_step_ms']} ms. Medians of up to {st['reps']} "
        f"repetitions after {st['warmup']} warm-up calls.", "",
        f"Measured over profile: {summary}.", "",
        *table(result),
    ]
    if result["skipped"]:
        lines += ["", f"Skipped (time budget {st['budget_s']:.0f} s or memory): {', '.join(result['skipped'])}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help=f"fewer points, within {QUICK_BUDGET_S:.0f} s")
    mode.add_argument("--cpu-check", action="store_true",
                      help="run every code path on the CPU with small shapes; writes nothing")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    plan = "cpu-check" if args.cpu_check else "quick" if args.quick else "full"
    try:
        result = run(plan, log=lambda s: print(s, file=sys.stderr))
    except Unavailable as e:
        print(f"gpu_truth: {e}", file=sys.stderr)
        return 2
    if plan == "cpu-check":
        print("\n".join(table(result)))
        return 0
    from bench.output import write_results
    from loadgen.record import headrace_version

    result["commit"] = headrace_version()["commit"]
    result["command"] = "python -m bench.gpu_truth" + (" --quick" if args.quick else "")
    md = markdown(result)
    write_results(args.out, NAME, result, md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
