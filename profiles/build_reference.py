"""Regenerate ``profiles/reference/*.yaml`` from published measurements.

Run ``python -m profiles.build_reference``. Every profile records its source, which batch
sizes were measured, and how the other points were obtained. Sources are listed in
``shared/reference/gpu-facts.md``: MIGPerf (A100 MIG, PyTorch), NVIDIA TensorRT demoBERT.
"""

from __future__ import annotations

from pathlib import Path

from profiles.profile import LatencyPoint, Profile, Provenance, save_profiles

OUT = Path(__file__).parent / "reference"
MIGPERF = "MIGPerf (HuaizhengZhang/MIGProfiler data), PyTorch eager"
TRT = "NVIDIA TensorRT demo/BERT README, average latency"

# ResNet-50 on A100-80GB MIG slices, t(b) = max(floor, a + c*b) ms. Measured by MIGPerf at
# batch 1, 64 and 256 (a and c fitted to those); floor = the measured batch-1 latency.
RESNET50_A100_80GB = {  # slice: (a ms, c ms/sample, floor ms, measured bs1/bs64/bs256 ms)
    "1g.10gb": (8.4, 2.346, 7.86, (7.86, 158.53, 609.06)),
    "2g.20gb": (4.9, 1.172, 5.85, (5.85, 79.90, 304.90)),
    "3g.40gb": (3.9, 0.661, 5.24, (5.24, 46.21, 173.09)),
    "7g.80gb": (2.6, 0.316, 5.21, (5.21, 23.07, 83.39)),
}

# BERT-base-multilingual, seq 64, A100-40GB MIG: latency flat at ~11 ms up to a batch size,
# bs256 measured; t(b) = max(11, a + c*b) with (a, c) fitted by the source data.
BERT_BASE_A100_40GB = {  # slice: (a, c, flat-until batch, bs256 ms)
    "1g.5gb": (2.7, 1.548, 8, 398.9),
    "2g.10gb": (2.9, 0.729, 16, 189.7),
    "3g.20gb": (1.4, 0.441, 16, 114.0),
    "7g.40gb": (0.1, 0.207, 32, 53.0),
}

# TensorRT demoBERT, whole GPU, FP16 and INT8 average ms at batch 1 / 8 / 32 / 128.
TRT_BERT = {  # (variant family, gpu): {precision: (b1, b8, b32, b128)}
    ("bert-base", "A100-40GB"): {"fp16": (0.67, 1.38, 4.10, 16.14), "int8": (0.58, 0.95, 2.27, 8.18)},
    ("bert-large", "A100-40GB"): {"fp16": (1.64, 4.51, 13.85, 51.61), "int8": (1.25, 2.71, 7.09, 25.45)},
    ("bert-large", "A30-24GB"): {"fp16": (2.14, 8.35, 29.14, 108.52), "int8": (1.75, 4.26, 13.97, 51.73)},
}

BATCHES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# p99/p50 for published single-number latencies. The sources report means of steady runs and
# no tail; headrace invents none (p99 = p50), so the batcher's prediction and the emulator's
# deterministic replay agree. A measured profile (headrace profile) carries its real p99.
TAIL = 1.0


def _fit_points(a: float, c: float, floor: float, max_batch: int) -> tuple[LatencyPoint, ...]:
    pts = []
    for b in BATCHES:
        if b > max_batch:
            break
        t = max(floor, a + c * b) / 1e3
        pts.append(LatencyPoint(b, t, t * TAIL))
    return tuple(pts)


def build() -> dict[str, list[Profile]]:
    files: dict[str, list[Profile]] = {}
    for sl, (a, c, floor, meas) in RESNET50_A100_80GB.items():
        files.setdefault("resnet50-a100-80gb.yaml", []).append(Profile(
            model="resnet50", variant="resnet50", gpu="A100-80GB", slice=sl, max_batch=256,
            points=_fit_points(a, c, floor, 256), memory_mb=2500.0, accuracy=0.7613,
            mps_interference=0.15,
            provenance=Provenance(
                MIGPERF, "fit", (1, 64, 256),
                f"t(b)=max({floor}, {a}+{c}*b) ms fitted to measured bs1/64/256 = {meas} ms; the fit "
                "is used at every batch size (at bs1 it gives a+c, above the measured floor). "
                "Accuracy: torchvision ResNet-50 v1 ImageNet top-1. Memory: estimate (weights + "
                "activations at bs256); MPS interference: midpoint of published 5-30%.",
            ),
        ))
    for sl, (a, c, flat, b256) in BERT_BASE_A100_40GB.items():
        files.setdefault("bert-base-a100-40gb.yaml", []).append(Profile(
            model="bert-base", variant="bert-base", gpu="A100-40GB", slice=sl, max_batch=256,
            points=_fit_points(a, c, 11.0, 256), memory_mb=1800.0, mps_interference=0.15,
            provenance=Provenance(
                MIGPERF + ", BERT-base-multilingual seq 64", "fit", (1, flat, 256),
                f"t(b)=max(11, {a}+{c}*b) ms: flat ~11 ms up to bs{flat}, measured bs256 {b256} ms. "
                "Memory: estimate.",
            ),
        ))
    for (family, gpu), precs in TRT_BERT.items():
        for prec, lat in precs.items():
            pts = tuple(LatencyPoint(b, t / 1e3, t * TAIL / 1e3) for b, t in zip((1, 8, 32, 128), lat, strict=True))
            files.setdefault(f"{family}-trt-{gpu.lower()}.yaml", []).append(Profile(
                model=family, variant=f"{family}-{prec}", gpu=gpu, slice="gpu", max_batch=128,
                points=pts, memory_mb=1400.0 if family == "bert-large" else 600.0,
                mps_interference=0.15,
                provenance=Provenance(
                    TRT + f", {family} seq {'128'} {prec.upper()}", "measured", (1, 8, 32, 128),
                    "linear interpolation between measured batch sizes; memory: estimate.",
                ),
            ))
    return files


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, profiles in build().items():
        save_profiles(OUT / name, profiles)
        print(f"wrote {OUT / name} ({len(profiles)} profiles)")


if __name__ == "__main__":
    main()
