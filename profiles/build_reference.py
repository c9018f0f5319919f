"""Regenerate ``profiles/reference/*.yaml`` from published measurements.

Run ``python -m profiles.build_reference``. Every profile records its source, which batch
sizes were measured, and how the other points were obtained. Sources are listed in
``shared/reference/gpu-facts.md``: MIGPerf (A100 MIG, PyTorch), NVIDIA TensorRT demoBERT.
Every profile's ``provenance.accuracy_source`` says where its accuracy comes from, or why it
is unknown (accuracy left empty rather than borrowed from another model or precision).
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

# The "imagenet" family: ResNet-50 and ViT-B/16, measured by MIGPerf on the same A100-80GB
# slices with the same harness (PyTorch eager, FP32, torchvision weights), mean ms at batch
# 1, 2, 4, ..., 256, and the most framebuffer used (MB, DCGM) over those runs.
MIGPERF_CV_DATA = ("HuaizhengZhang/MIGProfiler data/A100-80g/infer/cv/integrated_result.csv "
                   "@5462a7c1bf586a8121fa695a80d4cedb935d4425")
CV_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
IMAGENET_A100_80GB = {  # variant: {slice: (ms at CV_BATCHES, framebuffer MB)}
    "imagenet-resnet50": {
        "1g.10gb": ((7.86, 11.13, 16.43, 27.79, 46.67, 83.66, 158.53, 308.33, 609.06), 5666.2),
        "2g.20gb": ((5.85, 6.56, 8.38, 14.05, 23.57, 42.5, 79.9, 154.75, 304.9), 5762.0),
        "3g.40gb": ((5.24, 5.89, 6.45, 8.83, 14.15, 24.94, 46.21, 88.6, 173.09), 5826.0),
        "7g.80gb": ((5.21, 5.44, 5.7, 6.1, 7.72, 12.56, 23.07, 42.99, 83.39), 6056.0),
    },
    "imagenet-vit-b16": {
        "1g.10gb": ((21.91, 38.15, 75.89, 140.94, 277.26, 545.51, 1081.01, 2170.16, 4280.82), 4859.5),
        "2g.20gb": ((11.2, 20.24, 39.08, 70.72, 141.32, 276.05, 546.48, 1080.93, 2161.39), 4930.0),
        "3g.40gb": ((8.06, 13.83, 24.7, 48.38, 92.5, 182.78, 358.07, 710.12, 1407.83), 4994.0),
        "7g.80gb": ((5.38, 7.3, 12.02, 21.51, 42.06, 80.56, 157.88, 307.66, 606.27), 5198.8),
    },
}
TORCHVISION = "https://pytorch.org/vision/stable/models/generated/torchvision.models"
IMAGENET_ACCURACY = {  # variant: (ImageNet-1k top-1, where it is published)
    "imagenet-resnet50": (0.7613, f"torchvision resnet50 IMAGENET1K_V1 acc@1 76.130 ({TORCHVISION}.resnet50.html); "
                          "MIGPerf loads these weights (utils/model_hub.py)"),
    "imagenet-vit-b16": (0.81072, f"torchvision vit_b_16 IMAGENET1K_V1 (= DEFAULT) acc@1 81.072 "
                         f"({TORCHVISION}.vit_b_16.html); MIGPerf loads ViT_B_16_Weights.DEFAULT (utils/model_hub.py)"),
}

# Why the BERT variants carry no accuracy: nothing is published for these exact models.
BERT_MIGPERF_ACCURACY = (
    "unknown: MIGPerf times bert-base-multilingual-cased loaded with AutoModelForSequenceClassification "
    "and no fine-tuned head (MIGProfiler utils/model_hub.py, utils/common.py), a latency stand-in with no "
    "task accuracy; none is published for it"
)
TRT_BERT_ACCURACY = (
    "unknown: demoBERT (github.com/NVIDIA/TensorRT demo/BERT README, scripts/inference_benchmark.sh) times "
    "NGC bert_tf_ckpt_{family}_qa_squad2_amp_128_v19.03.1 (SQuAD v2.0, seq 128) with INT8 from 1-batch "
    "post-training calibration; neither the README nor the NGC model card publishes an F1 for these engines. "
    "The README's only F1 (90.89, SQuAD v1.1) is for the Megatron-Large sparse INT8-QAT engine at seq 384"
)

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


def fit_relative(batches: tuple[int, ...], ms: tuple[float, ...]) -> tuple[float, float]:
    """(a, c) of t(b) = a + c*b minimising the squared *relative* error over the measured
    points, so a 5 ms batch weighs as much as a 4 s one. Rounded: a to 0.01 ms, c to 1e-4."""
    # normal equations of min sum ((a + c*b - t) / t)^2
    w = [1 / t**2 for t in ms]
    s00 = sum(w)
    s01 = sum(wi * b for wi, b in zip(w, batches, strict=True))
    s11 = sum(wi * b * b for wi, b in zip(w, batches, strict=True))
    r0 = sum(wi * t for wi, t in zip(w, ms, strict=True))
    r1 = sum(wi * t * b for wi, t, b in zip(w, ms, batches, strict=True))
    det = s00 * s11 - s01 * s01
    a = (r0 * s11 - r1 * s01) / det
    c = (s00 * r1 - s01 * r0) / det
    return round(a, 2), round(c, 4)


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
                "Memory: estimate (weights + activations at bs256); MPS interference: midpoint of "
                "published 5-30%.",
                accuracy_source=IMAGENET_ACCURACY["imagenet-resnet50"][1],
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
                accuracy_source=BERT_MIGPERF_ACCURACY,
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
                    accuracy_source=TRT_BERT_ACCURACY.format(family=family.removeprefix("bert-")),
                ),
            ))
    for variant, slices in IMAGENET_A100_80GB.items():
        top1, acc_src = IMAGENET_ACCURACY[variant]
        for sl, (ms, fb_mb) in slices.items():
            a, c = fit_relative(CV_BATCHES, ms)
            floor = ms[0]
            worst = max(abs(max(floor, a + c * b) / t - 1) for b, t in zip(CV_BATCHES, ms, strict=True))
            files.setdefault("imagenet-a100-80gb.yaml", []).append(Profile(
                model="imagenet", variant=variant, gpu="A100-80GB", slice=sl, max_batch=256,
                points=_fit_points(a, c, floor, 256), memory_mb=fb_mb, accuracy=top1, mps_interference=0.15,
                provenance=Provenance(
                    f"{MIGPERF}, FP32; {MIGPERF_CV_DATA}", "fit", CV_BATCHES,
                    f"t(b)=max({floor}, {a}+{c}*b) ms, least squares in relative error over the measured "
                    f"ms {ms} (worst point off by {worst:.0%}); floor = measured bs1. Memory: the most "
                    "framebuffer used in those runs (DCGM, includes the CUDA context). MPS interference: "
                    "midpoint of published 5-30%.",
                    accuracy_source=acc_src,
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
