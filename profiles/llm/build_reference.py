"""Regenerate ``profiles/llm/reference/*.yaml`` from the published numbers in ``profiles/llm/data``.

Run ``python -m profiles.llm.build_reference``. The step time of each (model, device, tensor-parallel
degree) is assembled from Vidur's profiled operators (``microsoft/vidur``, MIT), as Vidur sums a step:

- the token-wise work of a layer (linear layers, norms, activation, rope) is the sum of Vidur's nine
  non-attention operators at each token count, fitted by a piecewise-linear curve on fixed knots
  (least squares on relative error) so the profile's table is short and keeps the measured shape;
- prefill and decode attention are lines in query-key pairs and KV tokens read, fitted on Vidur's
  Llama-3-8B A100 samples, weighted by the layer's whole time at that point (a point's error counts as
  much as it moves the step); other models and tensor-parallel degrees scale them by the query heads
  (prefill) and KV heads (decode) each GPU holds;
- the two all-reduces of a layer are a line in bytes fitted on Vidur's DGX measurements, plus Vidur's
  0.02 ms CPU launch cost each;
- Vidur counts neither the LM head nor the sampler nor the CPU: the LM head is estimated as that
  many layers' worth of the token-wise work (its weights over a layer's), the per-step CPU cost and
  the sampler are stated estimates. No published serving number is used: those are held out
  (``bench/llm_engine_fidelity.py``).

What Vidur lacks is derived with :meth:`StepTime.scaled` and labelled an estimate: Llama-3 on the H100
by the Llama-2 H100/A100 ratio at each token count; the H200 as an H100 with 4.8/3.35 the memory
bandwidth; MIG slices by their share of SMs and of memory bandwidth; fp8 and int4 by the bytes of
their weights (and, for fp8 on Hopper, its tensor cores). The kv-cache-save operator of Vidur's
attention table is left out: it reports up to 8.6 ms a layer to write 16,000 tokens' KV (64 MB),
three orders of magnitude above what the copy costs at memory speed.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import yaml

from profiles.catalogue import gpu_model
from profiles.llm.profile import REFERENCE, LlmProfile, llm_profile_to_dict
from profiles.llm.shape import LLAMA_SHAPES, LlamaShape
from profiles.llm.steptime import StepTime
from profiles.profile import Provenance

DATA = Path(__file__).parent / "data"
GIB = 2**30 / 1e9  # decimal GB in a GiB
VIDUR = "github.com/microsoft/vidur@7d47513363ec447a741ac5e47241580b47724fbf (MIT)"
VIDUR_FILES = {
    "linear": "data/profiling/compute/{gpu}/meta-llama/{model}/mlp.csv",
    "attention": "data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/attention.csv",
    "allreduce": "data/profiling/network/{gpu}_dgx/all_reduce.csv",
}
NCCL_LAUNCH_MS = 0.02  # Vidur's nccl_cpu_launch_overhead_ms, once per all-reduce
CPU_STEP_MS = 0.5  # estimate: scheduling, input preparation and launches not hidden behind the GPU
SAMPLER_MS = 0.001  # estimate: a few passes over one sequence's fp32 logits
TOKEN_BUDGET = 8192  # vLLM's max_num_batched_tokens: the activations' peak is at a full step
MAX_SEQS = 256  # vLLM's max_num_seqs: logits held at once
RUNTIME_GB = 1.0  # estimate: CUDA graphs, cuBLAS and NCCL workspaces, allocator slack
MIN_KV_TOKENS = 32768  # a MIG slice is offered a variant only when its KV holds at least this many tokens
BASE_KNOTS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


SHAPES = LLAMA_SHAPES
VIDUR_MODEL = {"llama3-8b": "Meta-Llama-3-8B", "llama3-70b": "Meta-Llama-3-70B", "llama2-7b": "Llama-2-7b-hf",
               "llama2-70b": "Llama-2-70b-hf"}  # each model's directory in Vidur's profiling data
VIDUR_GPU = {"A100-80GB": "a100", "H100-80GB": "h100"}
H200_MEMORY = 4.8 / 3.35  # H200 vs H100 SXM memory bandwidth (TB/s, NVIDIA datasheets); same SMs and clocks

# Weight formats: bits per weight of the layers' linear layers, and the speed-ups of the token-wise work
# (compute, memory) on Ampere and Hopper.
INT4_BITS = 4.125  # 4-bit weights plus an fp16 scale per group of 128
FORMATS: dict[str, dict] = {
    "bf16": {"bits": 16, "ampere": (1.0, 1.0), "hopper": (1.0, 1.0)},
    "fp8": {"bits": 8, "ampere": (1.0, 2.0), "hopper": (2.0, 2.0)},
    "int4": {"bits": INT4_BITS, "ampere": (1.0, 16 / INT4_BITS), "hopper": (1.0, 16 / INT4_BITS)},
}
FORMAT_NOTES = {
    "bf16": "",
    "fp8": "fp8 (W8A8, per-tensor scales): the token-wise work reads half the weight bytes (memory x2); on Hopper "
           "its fp8 tensor cores double the arithmetic (compute x2, the peak ratio: an upper bound), on the A100 "
           "(no fp8 tensor cores: weights widened to 16 bits) compute x1; attention, KV, LM head stay 16-bit. Estimate.",
    "int4": f"int4 (GPTQ W4A16, group 128): weight reads {16 / INT4_BITS:.2f}x smaller (memory x{16 / INT4_BITS:.2f}), "
            "arithmetic in 16 bits (compute x1), so the gain is at few tokens and none at many; attention, KV, "
            "LM head stay 16-bit. Estimate.",
}
MODELS = {  # shipped model: (shape, Hugging Face checkpoints by format)
    "llama-3.1-8b-instruct": ("llama3-8b", {
        "bf16": "meta-llama/Llama-3.1-8B-Instruct", "fp8": "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8",
        "int4": "neuralmagic/Meta-Llama-3.1-8B-Instruct-quantized.w4a16"}),
    "llama-3.1-70b-instruct": ("llama3-70b", {"fp8": "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8"}),
}
NM = "lm-evaluation-harness (Neural Magic fork, branch llama_3.1_instruct) on vLLM"
W4_CARD = "huggingface.co/neuralmagic/Meta-Llama-3.1-8B-Instruct-quantized.w4a16 (RedHatAI)"
ACCURACY = {  # (model, format): (MMLU 5-shot as a fraction, source)
    ("llama-3.1-8b-instruct", "bf16"): (0.683, f"MMLU 5-shot 68.3, mmlu_llama_3.1_instruct with chat template, {NM}: "
                                                f"the baseline column of {W4_CARD}"),
    ("llama-3.1-8b-instruct", "int4"): (0.669, f"MMLU 5-shot 66.9 (97.9% of 68.3), same harness and card: {W4_CARD}"),
    ("llama-3.1-8b-instruct", "fp8"): (0.6832, "MMLU 5-shot: huggingface.co/neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8 "
                                               f"(RedHatAI) reports 67.97 against its baseline 67.95 (100.03%, plain mmlu "
                                               f"task); that recovery on the 68.3 baseline of {W4_CARD} keeps one harness "
                                               "across the three variants: 68.32 (derived)"),
    ("llama-3.1-70b-instruct", "fp8"): (0.8373, "MMLU 5-shot 83.73 (99.88% of its baseline 83.83), "
                                                f"huggingface.co/neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8 (RedHatAI), {NM}"),
}
SHIPPED = (  # (model, format, tp, GPUs, MIG slices tried (geometry keys of profiles/catalogue.py))
    ("llama-3.1-8b-instruct", "bf16", 1, ("A100-80GB", "H100-80GB", "H200-141GB"), ("3g", "2g")),
    ("llama-3.1-8b-instruct", "fp8", 1, ("A100-80GB", "H100-80GB", "H200-141GB"), ("3g", "2g")),
    ("llama-3.1-8b-instruct", "int4", 1, ("A100-80GB", "H100-80GB", "H200-141GB"), ("3g", "2g")),
    ("llama-3.1-70b-instruct", "fp8", 2, ("A100-80GB", "H100-80GB", "H200-141GB"), ()),
    ("llama-3.1-70b-instruct", "fp8", 4, ("A100-80GB", "H100-80GB", "H200-141GB"), ()),
)


# the carried data


def _rows(name: str) -> list[dict[str, str]]:
    with (DATA / name).open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


@functools.cache
def vidur_linear(model: str, gpu: str, tp: int) -> tuple[tuple[int, float], ...]:
    """(tokens, ms per layer) of Vidur's token-wise operators, summed, for ``gpu`` 'a100' or 'h100'."""
    pts = tuple((int(r["num_tokens"]), float(r[f"tp{tp}_ms"])) for r in _rows("vidur_linear.csv")
                if r["model"] == model and r["gpu"] == gpu)
    if not pts:
        raise KeyError(f"Vidur has no token-wise profile of {model} on {gpu}")
    return pts


@functools.cache
def vidur_attention() -> tuple[tuple[str, int, str, int, int, int, float], ...]:
    """(model, tp, kind, chunk, kv, batch, ms) of the carried attention samples."""
    return tuple((r["model"], int(r["tp"]), r["kind"], int(r["chunk"]), int(r["kv"]), int(r["batch"]), float(r["ms"]))
                 for r in _rows("vidur_attention.csv"))


@functools.cache
def vidur_allreduce(gpu: str, tp: int) -> tuple[tuple[int, float], ...]:
    return tuple((int(r["size_bytes"]), float(r[f"tp{tp}_ms"])) for r in _rows("vidur_allreduce.csv")
                 if r["network"] == f"{gpu}_dgx")


# fits


def sig(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits: fitted numbers carry no more than the data do."""
    return float(f"{x:.{digits}g}")


def fit_line(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """(a, b) of y = a + b x by weighted least squares."""
    a = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (c0, c1), *_ = np.linalg.lstsq(a, y * w, rcond=None)
    return float(c0), float(c1)


def fit_table(points: tuple[tuple[int, float], ...], size: int = 60, tol: float = 0.02) -> tuple[tuple[int, float], ...]:
    """The table a profile carries: a piecewise-linear curve through knots, least squares on relative
    error, then one point at twice the last token count on a line fitted to the upper half of the
    points, so a step past the measured range grows at the compute-bound rate, not along the noise of
    the last segment. The knots start from powers of two and gain one where the curve misses a point
    most (a step where a GEMM tile or wave fills) until every point is within ``tol`` or the table
    holds ``size`` points."""
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    knots = sorted({k for k in BASE_KNOTS if k < x[-1]} | {int(x[-1])})
    while True:
        basis = np.stack([np.interp(x, knots, np.eye(len(knots))[i]) for i in range(len(knots))], axis=1)
        vals, *_ = np.linalg.lstsq(basis / y[:, None], np.ones_like(y), rcond=None)
        err = np.abs(basis @ vals / y - 1)
        if len(knots) >= size - 1 or err.max() < tol:
            break
        knots = sorted({*knots, next(int(x[i]) for i in np.argsort(-err) if int(x[i]) not in knots)})
    top = x >= x[-1] / 2
    a, b = fit_line(x[top], y[top], 1 / y[top])
    far = 2 * knots[-1]
    return (*((k, sig(float(v))) for k, v in zip(knots, vals, strict=True)), (far, sig(a + b * far)))


def table_errors(table: tuple[tuple[int, float], ...], points: tuple[tuple[int, float], ...]) -> dict[str, float]:
    """Median and largest relative error of ``table`` on the measured ``points``."""
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    e = np.abs(np.interp(x, [t[0] for t in table], [t[1] for t in table]) / y - 1)
    return {"median": float(np.median(e)), "p95": float(np.percentile(e, 95)), "max": float(e.max())}


def _interp(table: tuple[tuple[int, float], ...], x: np.ndarray | float) -> np.ndarray:
    return np.interp(x, [t[0] for t in table], [t[1] for t in table])


@dataclass(frozen=True)
class Attention:
    """Per-layer attention of Llama-3-8B on one A100 (32 query heads, 8 KV heads), ms."""

    prefill_ms: float
    prefill_per_pair_ms: float
    decode_ms: float
    decode_per_kv_ms: float
    errors: dict[str, dict[str, float]]  # relative to the attention time and to the layer's time


@functools.cache
def attention_fit() -> Attention:
    """Fit on the Llama-3-8B TP1 samples; a point's weight is one over the layer's whole time there
    (attention plus the token-wise work of its tokens), so the fit spends its accuracy where attention
    moves the step. The TP4 and Llama-2-7B samples, derived by heads, check it."""
    lin = fit_table(vidur_linear("llama3-8b", "a100", 1))
    rows = [r for r in vidur_attention() if r[0] == "llama3-8b" and r[1] == 1]
    pre = np.array([(c * (kv + c / 2), c, ms) for _, _, k, c, kv, _, ms in rows if k == "prefill"])
    dec = np.array([(b * kv, b, ms) for _, _, k, _, kv, b, ms in rows if k == "decode"])
    pa, pb = fit_line(pre[:, 0], pre[:, 2], 1 / (pre[:, 2] + _interp(lin, pre[:, 1])))
    da, db = fit_line(dec[:, 0], dec[:, 2], 1 / (dec[:, 2] + _interp(lin, dec[:, 1])))
    pa, pb, da, db = sig(pa), sig(pb), sig(da), sig(db)

    def errs(pred: np.ndarray, y: np.ndarray, tokens: np.ndarray) -> dict[str, float]:
        e, el = np.abs(pred / y - 1), np.abs(pred - y) / (y + _interp(lin, tokens))
        return {"median": float(np.median(e)), "p90": float(np.percentile(e, 90)),
                "layer_median": float(np.median(el)), "layer_p90": float(np.percentile(el, 90)), "n": len(y)}

    errors = {"prefill": errs(pa + pb * pre[:, 0], pre[:, 2], pre[:, 1]),
              "decode": errs(da + db * dec[:, 0], dec[:, 2], dec[:, 1])}
    for model, tp in (("llama3-8b", 4), ("llama2-7b", 1), ("llama2-7b", 2)):
        s = SHAPES[model]
        q, kvh = s.heads / tp / 32, s.kv_heads / tp / 8
        for kind in ("prefill", "decode"):
            got = [(c, kv, b, ms) for m, t, k, c, kv, b, ms in vidur_attention() if (m, t, k) == (model, tp, kind)]
            if got:
                y = np.array([g[3] for g in got])
                pred = np.array([pa + pb * q * c * (kv + c / 2) if kind == "prefill" else da + db * kvh * b * kv
                                 for c, kv, b, _ in got])
                e = np.abs(pred / y - 1)
                errors[f"{kind} {model} tp{tp} (derived)"] = {"median": float(np.median(e)), "n": len(y)}
    return Attention(pa, pb, da, db, errors)


@functools.cache
def allreduce_fit(gpu: str, tp: int) -> tuple[float, float, float]:
    """(ms, ms per byte, median relative error) of one all-reduce, least squares on relative error."""
    pts = np.array(vidur_allreduce(gpu, tp), float)
    a, b = fit_line(pts[:, 0], pts[:, 1], 1 / pts[:, 1])
    e = np.abs((a + b * pts[:, 0]) / pts[:, 1] - 1)
    return sig(a), sig(b), float(np.median(e))


@dataclass(frozen=True)
class Derivation:
    """A step time and what it rests on."""

    step_time: StepTime
    kind: str  # "fit" (every term fitted on measurements of this model and device) or "derived"
    notes: tuple[str, ...]


def with_lm_head(st: StepTime, s: LlamaShape) -> StepTime:
    """``st`` with its per-step and per-sample costs: the LM head as (its weights / a layer's) layers'
    worth of the 16-bit token-wise work (read once a step, computed per sampled sequence), the CPU and
    the sampler."""
    r = s.vocab * s.hidden / s.layer_params
    (x0, y0), (xn, yn) = st.linear[0], st.linear[-1]
    return replace(st, step_s=sig(CPU_STEP_MS / 1e3 + r * y0),
                   sample_s=sig(SAMPLER_MS / 1e3 + r * (yn - y0) / (xn - x0)))


LLAMA2_PARTNER = {"llama3-8b": "llama2-7b", "llama3-70b": "llama2-70b"}  # same hidden size, measured on the H100


@functools.cache
def h100_ratio(model: str, tp: int) -> tuple[dict[int, float], float, float]:
    """How much faster the H100 runs ``model``'s Llama-2 partner than the A100, from Vidur: the
    ratio of times at each token count, and the (compute, memory) speed-ups: the mean over 2048-4096
    tokens and over 1-16 tokens."""
    partner = LLAMA2_PARTNER.get(model, model)
    a, h = dict(vidur_linear(partner, "a100", tp)), dict(vidur_linear(partner, "h100", tp))
    ratio = {x: h[x] / a[x] for x in a}
    compute = 1 / float(np.mean([r for x, r in ratio.items() if 2048 <= x <= 4096]))
    memory = 1 / float(np.mean([r for x, r in ratio.items() if x <= 16]))
    return ratio, compute, memory


def h100_points(model: str, tp: int) -> tuple[tuple[int, float], ...]:
    """Vidur's A100 token-wise times of ``model`` times its Llama-2 partner's H100/A100 ratio at
    each token count both measured (the compute speed-up past the partner's last one)."""
    ratio, compute, _ = h100_ratio(model, tp)
    return tuple((x, y * ratio[x] if x in ratio else y / compute) for x, y in vidur_linear(model, "a100", tp))


@functools.cache
def step_time(model: str, gpu: str, tp: int = 1) -> Derivation:
    """The 16-bit step time of ``model`` (a key of SHAPES) on ``tp`` whole GPUs: A100-80GB or H100-80GB
    from Vidur (Llama-3 on the H100 by the Llama-2 ratio), H200-141GB from the H100."""
    s = SHAPES[model]
    if gpu == "H200-141GB":
        h = step_time(model, "H100-80GB", tp)
        st = with_lm_head(h.step_time.scaled(memory=H200_MEMORY), s)
        return Derivation(st, "derived", (*h.notes, f"H200: the H100 with {H200_MEMORY:.3f}x its memory bandwidth "
                                                    "(4.8 vs 3.35 TB/s), same compute and NVLink. Estimate."))
    vg = VIDUR_GPU[gpu]
    att = attention_fit()
    kind, notes = "fit", []
    try:
        table = fit_table(vidur_linear(model, vg, tp))
        err = table_errors(table, vidur_linear(model, vg, tp))
        notes.append(f"token-wise work: Vidur {VIDUR_MODEL[model]} {vg} tp{tp} operator sums, {len(table)} knots, error median "
                     f"{err['median']:.1%}, max {err['max']:.1%}")
    except KeyError:  # Llama-3 on the H100
        table = fit_table(h100_points(model, tp))
        kind = "derived"
        notes.append(f"token-wise work: Vidur {VIDUR_MODEL[model]} a100 tp{tp} times the {VIDUR_MODEL[LLAMA2_PARTNER[model]]} "
                     f"h100/a100 ratio at each token count (Vidur has no Llama-3 H100 profile), {len(table)} knots. "
                     "Estimate.")
    q, kvh = s.heads / tp / 32, s.kv_heads / tp / 8
    comp, mem = h100_ratio(model, tp)[1:] if vg == "h100" else (1.0, 1.0)
    if (model, vg, tp) == ("llama3-8b", "a100", 1):
        e = att.errors
        notes.append(f"attention: fitted on Vidur's samples, error median {e['prefill']['layer_median']:.1%} (prefill) "
                     f"and {e['decode']['layer_median']:.1%} (decode) of the layer's time")
    else:
        kind = "derived"
        notes.append(f"attention: the Llama-3-8B A100 fit scaled by heads per GPU (query x{q:g}, KV x{kvh:g})"
                     + (f" and the H100's Llama-2 speed-up (compute x{comp:.2f}, memory x{mem:.2f})" if mem > 1 else "")
                     + ". Estimate.")
    ar_ms = ar_tok_ns = 0.0
    if tp > 1:
        a, b, e = allreduce_fit(vg, tp)
        ar_ms, ar_tok_ns = 2 * (a + NCCL_LAUNCH_MS), 2 * b * s.hidden * 2 * 1e6
        notes.append(f"all-reduce: Vidur {vg}_dgx tp{tp}, line in bytes (median error {e:.1%}) + "
                     f"{NCCL_LAUNCH_MS} ms launch, twice a layer")
    st = StepTime(
        layers=s.layers, linear=tuple((x, y / 1e3) for x, y in table),
        prefill_attn_s=att.prefill_ms / comp / 1e3, prefill_attn_per_pair_s=sig(att.prefill_per_pair_ms * q / comp) / 1e3,
        decode_attn_s=att.decode_ms / mem / 1e3, decode_attn_per_kv_s=sig(att.decode_per_kv_ms * kvh / mem) / 1e3,
        allreduce_s=sig(ar_ms) / 1e3, allreduce_per_token_s=sig(ar_tok_ns) / 1e9,
    )
    return Derivation(with_lm_head(st, s), kind, tuple(notes))


def on_slice(d: Derivation, model: str, gpu: str, slice_name: str) -> Derivation:
    """A whole-GPU step time on a MIG slice: compute by its share of SMs, memory bandwidth by its
    share of memory slices."""
    g = gpu_model(gpu)
    p = g.profile(slice_name)
    c, m = p.sms / g.sms, p.mem_slices / g.mem_slices
    st = with_lm_head(d.step_time.scaled(compute=c, memory=m), SHAPES[model])
    return Derivation(st, "derived", (*d.notes, f"MIG {slice_name}: compute x{c:.3f} ({p.sms}/{g.sms} SMs), memory "
                                                f"bandwidth x{m:.3f} ({p.mem_slices}/{g.mem_slices} memory slices). Estimate."))


def in_format(d: Derivation, fmt: str, gpu: str) -> Derivation:
    """A 16-bit step time with its token-wise work in another weight format; attention, the LM head
    and the per-step costs stay 16-bit."""
    if fmt == "bf16":
        return d
    c, m = FORMATS[fmt]["ampere" if gpu.startswith("A100") else "hopper"]
    b = d.step_time
    st = replace(b.scaled(compute=c, memory=m), prefill_attn_s=b.prefill_attn_s,
                 prefill_attn_per_pair_s=b.prefill_attn_per_pair_s, decode_attn_s=b.decode_attn_s,
                 decode_attn_per_kv_s=b.decode_attn_per_kv_s, step_s=b.step_s, sample_s=b.sample_s)
    return Derivation(st, "derived", (*d.notes, FORMAT_NOTES[fmt]))


def activation_gb(s: LlamaShape, tp: int = 1, tokens: int = TOKEN_BUDGET, seqs: int = MAX_SEQS) -> float:
    """Peak activations of one device, an estimate: a full step's gate/up and activation outputs
    (16-bit), the fp32 logits of ``seqs`` sequences, and RUNTIME_GB of runtime buffers."""
    mlp = tokens * 3 * s.intermediate / tp * 2
    logits = seqs * s.vocab * 4
    return round(RUNTIME_GB + (mlp + logits) / 1e9, 2)


def memory_gb(gpu: str, slice_name: str) -> float:
    """Decimal GB of a GPU or slice (the catalogue's GiB)."""
    return round(gpu_model(gpu).slice_memory_gb(slice_name) * GIB, 2)


# the profiles


def profile(model: str, fmt: str, gpu: str, slice_name: str, tp: int) -> LlmProfile:
    key, _ = MODELS[model]
    s = SHAPES[key]
    d = step_time(key, gpu, tp)
    if slice_name != "gpu":
        d = on_slice(d, key, gpu, slice_name)
    d = in_format(d, fmt, gpu)
    acc, acc_src = ACCURACY[(model, fmt)]
    p = LlmProfile(
        model=model, variant=f"{model}-{fmt}", gpu=gpu, slice=slice_name, tp=tp, memory_gb=memory_gb(gpu, slice_name),
        weights_gb=weights_gb(s, fmt), activation_gb=activation_gb(s, tp),
        kv_bytes_per_token=s.kv_bytes_per_token, max_model_len=s.max_len, step_time=d.step_time, accuracy=acc,
    )
    kv_tokens = p.kv_blocks() * 16
    p = replace(p, max_model_len=min(s.max_len, kv_tokens // 1024 * 1024))
    src = (f"Vidur profiling data, {VIDUR}: {VIDUR_FILES['linear'].format(gpu='a100', model=VIDUR_MODEL[key])}"
           + (f" and the Llama-2 {VIDUR_FILES['linear'].format(gpu='{a100,h100}', model='...')}" if gpu != "A100-80GB" else "")
           + f", {VIDUR_FILES['attention']}" + (f", {VIDUR_FILES['allreduce'].format(gpu='{a100,h100}')}" if tp > 1 else "")
           + "; carried in profiles/llm/data")
    notes = [*d.notes,
             f"LM head: {s.vocab * s.hidden / s.layer_params:.2f} layers' worth of 16-bit token-wise work; per-step "
             f"CPU {CPU_STEP_MS} ms and sampler {SAMPLER_MS} ms a sequence. Estimate.",
             f"weights: {MODELS[model][1][fmt]}, from the shapes ({FORMATS[fmt]['bits']} bits a weight in the layers' linear "
             f"layers, 16 in the embeddings and LM head); activations: {RUNTIME_GB} GB runtime, the MLP outputs of "
             f"a step of {TOKEN_BUDGET} tokens and {MAX_SEQS} sequences' fp32 logits. Estimate.",
             f"memory: {gpu_model(gpu).slice_memory_gb(slice_name)} GiB (profiles/catalogue.py); max_model_len: the "
             f"model's {s.max_len} or what the KV cache holds at utilisation 0.9 ({kv_tokens} tokens)"]
    text = " ".join(n if n.endswith(".") else n + "." for n in notes)
    return replace(p, provenance=Provenance(src, d.kind, (), text, acc_src))  # type: ignore[arg-type]


def build() -> dict[str, list[LlmProfile]]:
    """Every shipped profile, by file name."""
    files: dict[str, list[LlmProfile]] = {}
    for model, fmt, tp, gpus, slices in SHIPPED:
        for gpu in gpus:
            name = f"{model}-{gpu.lower()}.yaml"
            files.setdefault(name, []).append(profile(model, fmt, gpu, "gpu", tp))
            g = gpu_model(gpu)
            for key in slices:
                slice_name = next(p.name for p in g.profiles if p.name.startswith(key + "."))
                p = profile(model, fmt, gpu, slice_name, tp)
                if p.kv_blocks() * 16 >= MIN_KV_TOKENS:
                    files[name].append(p)
    for docs in files.values():
        docs.sort(key=lambda p: (p.variant, p.tp, p.slice != "gpu", p.slice))
    return files


def write(out: Path = REFERENCE) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, profiles in build().items():
        path = out / name
        path.write_text(yaml.safe_dump_all([llm_profile_to_dict(p) for p in profiles], sort_keys=False, width=120, default_flow_style=None))
        paths.append(path)
    return paths


def fit_report() -> dict[str, object]:
    """The fits' errors on the data they were fitted on, and the checks of what was derived."""
    tables = {}
    for model in SHAPES:
        for gpu in ("a100", "h100"):
            for tp in (1, 2, 4, 8):
                try:
                    pts = vidur_linear(model, gpu, tp)
                except KeyError:
                    continue
                table = fit_table(pts)
                tables[f"{model} {gpu} tp{tp}"] = {"knots": len(table), **table_errors(table, pts)}
    att = attention_fit()
    return {"linear": tables, "attention": att.errors,
            "allreduce": {f"{g} tp{tp}": allreduce_fit(g, tp)[2] for g in ("a100", "h100") for tp in (2, 4, 8)},
            "h100_speedup": {f"{m} tp{tp}": dict(zip(("compute", "memory"), h100_ratio(m, tp)[1:], strict=True))
                             for m, tp in (("llama2-7b", 1), ("llama2-70b", 2), ("llama2-70b", 4))}}


def main() -> None:
    for path in write():
        print(f"wrote {path}")


if __name__ == "__main__":
    main()


def weights_gb(s: LlamaShape, fmt: str = "bf16") -> float:
    """The checkpoint's weights in a format of FORMATS."""
    return s.weights_gb(FORMATS[fmt]["bits"])
