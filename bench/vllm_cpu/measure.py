"""The CPU engine's step time by the step's shape, measured from real vLLM serving the tiny Llama,
and fitted into an LlmProfile of the engine model's :class:`~profiles.llm.steptime.StepTime` form.

Four series, each request's prompt unique random token ids (no prefix-cache hit), sent to an
idle engine:
- prefill: one prompt of 16 to 2,040 tokens at a time; its TTFT is one prefill step (and the
  server's path in and out), its TPOT a decode step of one sequence at that context;
- decode: 1 to 128 requests of a 32-token prompt at once; once they have all started, every step
  decodes all of them, so their TPOT is the decode step at that batch;
- context: 8 requests at once of 256 to 1,536 tokens: the decode step's cost per KV token read;
- join: a prompt of 16 to 2,040 tokens sent while one request decodes: the gap in that
  request's tokens where the prompt's prefill ran beside its decode is the step with both. A lone
  prompt's TTFT holds the same prefill and the server's front end, so the two series together
  part the step's cost from the front end's.

The fit (least squares, every coefficient at least zero), per layer as the engine model reads
it: the token-wise work a line in the step's tokens, prefill attention by query-key pairs,
decode attention by KV tokens read, a fixed cost per step, one per sampled sequence and one per
step that holds a prefill; and, in a TTFT only, the front end: the time from a request's arrival
to its first step (the API server, the tokenizer, the hand-off to the engine core) and from the
step's end to the client, which is no step's. It becomes the profile's ``frontend_ms``, which the
engine model spends on each request's way in, beside the steps.

Run: ``python -m bench.vllm_cpu.measure`` (starts vLLM; about 10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import nnls

from bench.vllm_cpu import tiny_model
from bench.vllm_cpu.load import Send, Timing, quiet, run
from bench.vllm_cpu.server import KVCACHE_SPACE_GB, SERVED, Startup, read_startup, vllm_server
from profiles.llm.profile import LlmProfile, llm_profile_to_dict
from profiles.llm.steptime import StepShape, StepTime
from profiles.profile import Provenance

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "llm" / "measured" / "tiny-llama-cpu.yaml"
RAW = PROFILE.with_suffix(".measurements.json")  # what the fit read, beside the profile
PREFILL = (16, 64, 128, 256, 512, 1024, 1536, 2040)
DECODE = (1, 2, 4, 8, 16, 32, 64, 128)
CONTEXT = (256, 768, 1536)
JOIN = (16, 128, 512, 1024, 2040)
DECODE_PROMPT, DECODE_TOKENS, CONTEXT_BATCH, CONTEXT_TOKENS, PREFILL_TOKENS = 32, 48, 8, 32, 8
JOIN_TOKENS, JOIN_AT = 160, 0.3  # the decoding request's length; when the prompt is sent into it
REPEATS = 3
GIB = 1 << 30


def prompts(rng: random.Random, n: int, length: int) -> list[list[int]]:
    return [[rng.randrange(3, tiny_model.VOCAB) for _ in range(length)] for _ in range(n)]


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def measure(url: str, seed: int = 0, log=print) -> dict[str, Any]:  # noqa: ANN001
    """The three series against a ready server (raw per-request timings, in seconds)."""
    rng = random.Random(seed)
    out: dict[str, Any] = {"prefill": [], "decode": [], "context": [], "join": []}
    run(url, SERVED, [Send(0, p, 4) for p in prompts(rng, 4, 64)])  # warm the path
    for length in PREFILL:
        for _ in range(REPEATS):
            (t,) = run(url, SERVED, [Send(0, prompts(rng, 1, length)[0], PREFILL_TOKENS)])
            out["prefill"].append({"prompt": length, "ttft": t.ttft, "tpot": t.tpot})
        log(f"prefill {length:5d}: ttft {med([x['ttft'] for x in out['prefill'][-REPEATS:]]) * 1e3:7.2f} ms")
    for batch in DECODE:
        for _ in range(REPEATS):
            ts = run(url, SERVED, [Send(0, p, DECODE_TOKENS) for p in prompts(rng, batch, DECODE_PROMPT)])
            out["decode"].append(_batch(batch, DECODE_PROMPT, DECODE_TOKENS, ts))
        log(f"decode  {batch:5d}: tpot {med([x['tpot'] for x in out['decode'][-REPEATS:]]) * 1e3:7.2f} ms")
    for context in CONTEXT:
        for _ in range(REPEATS):
            ts = run(url, SERVED, [Send(0, p, CONTEXT_TOKENS) for p in prompts(rng, CONTEXT_BATCH, context)])
            out["context"].append(_batch(CONTEXT_BATCH, context, CONTEXT_TOKENS, ts))
        log(f"context {context:5d}: tpot {med([x['tpot'] for x in out['context'][-REPEATS:]]) * 1e3:7.2f} ms")
    for length in JOIN:
        for _ in range(REPEATS):
            bg, probe = prompts(rng, 1, DECODE_PROMPT)[0], prompts(rng, 1, length)[0]
            ts = run(url, SERVED, [Send(0, bg, JOIN_TOKENS), Send(JOIN_AT, probe, 2)])
            j = _join(length, ts[0], JOIN_AT + ts[1].ttft)
            if j is not None:
                out["join"].append(j)
        done = [x["gap"] for x in out["join"] if x["prompt"] == length]
        log(f"join    {length:5d}: step {med(done) * 1e3 if done else float('nan'):7.2f} ms")
    return out


def _join(length: int, bg: Timing, first: float) -> dict[str, Any] | None:
    """The step that ran a prompt's prefill beside a decoding request: the gap in that request's
    token times ending where the prompt's first token came (both tokens leave the same step);
    None when the decode had ended or tokens came merged."""
    times = bg.times
    k = next((i for i, t in enumerate(times) if t >= first - 1e-3), None)
    if k is None or k < 4 or k >= len(times) - 1:
        return None
    gap = times[k] - times[k - 1]
    # the API server sends a run of tokens at once when it falls behind: gaps of none are no step
    before = [g for g in (b - a for a, b in zip(times[:k - 1], times[1:k], strict=True)) if g > MERGED_S]
    if gap <= MERGED_S or not before:
        return None
    return {"prompt": length, "gap": gap, "decode": med(before), "context": DECODE_PROMPT + k}


def _batch(batch: int, prompt: int, tokens: int, ts: list[Timing]) -> dict[str, Any]:
    """A batch's decode step: each request's time per token once every request of the batch has
    its first token (the requests reach the engine one by one, so the first steps mix prefills
    in), the median over the batch."""
    started = max(t.times[0] for t in ts)
    tails, counts = [], []
    for t in ts:
        after = [x for x in t.times if x > started]
        if len(after) >= 4:
            tails.append((after[-1] - after[0]) / (len(after) - 1))
            counts.append(len(after))
    return {"batch": batch, "prompt": prompt, "tokens": tokens, "tpot": med(tails), "decoded": med(counts),
            "ttft": med([t.ttft for t in ts])}


# the fit

KNOTS = (8, 16, 32, 64, 128, 256, 512, 1024)  # where the token-wise work may bend upwards
TABLE = (1, *KNOTS, 2048, 8192)  # the linear table's points


def _features(shape: StepShape) -> list[float]:
    """Seconds = features . coefficients: a fixed cost a step, one a sampled sequence, the
    token-wise work per layer as a sum of hinges max(0, tokens - knot) (convex and increasing:
    flat while the step's tokens cost nothing more than its fixed work, steeper as they fill the
    core), prefill attention per query-key pair, decode attention per KV token read, and a fixed
    cost of a step that holds a prefill."""
    layers = tiny_model.LAYERS
    hinges = [layers * max(0, shape.tokens - k) for k in (0, *KNOTS)]
    return [1.0, shape.sampled, *hinges, layers * shape.prefill_work, layers * shape.kv_read,
            layers * float(shape.prefill_tokens > 0)]


def _row(shape: StepShape, series: str) -> list[float]:
    """A measurement's features: its step's, and the front end in a TTFT."""
    return [*_features(shape), float(series == "prefill")]


MERGED_S = 0.5e-3  # a time per token below this is a server that sent a run of tokens in one chunk


def observations(raw: dict[str, Any]) -> list[tuple[StepShape, float, str]]:
    """Each measured configuration as the step shape it times: (shape, median seconds over its
    repeats, series). A decode time below MERGED_S is left out: the API server fell behind and
    sent the tokens of several steps at once, so their times say nothing of the steps."""
    groups: dict[tuple[str, int, int], list[tuple[float, int]]] = {}  # (series, context, batch): (s, _)
    for p in raw["prefill"]:
        groups.setdefault(("prefill", p["prompt"], 0), []).append((p["ttft"], 0))
        if p["tpot"] and p["tpot"] > MERGED_S:
            groups.setdefault(("decode", p["prompt"] + PREFILL_TOKENS // 2, 1), []).append((p["tpot"], 0))
    for series in ("decode", "context"):
        for p in raw[series]:
            if p["tpot"] > MERGED_S:
                # the KV a decode reads: the prompt and, on average, the tokens before the timed ones
                # and half of those
                read = p["prompt"] + p["tokens"] - int(p["decoded"]) // 2
                groups.setdefault((series, p["prompt"], p["batch"]), []).append((p["tpot"], read - p["prompt"]))
    for p in raw.get("join", ()):
        groups.setdefault(("join", p["prompt"], 1), []).append((p["gap"], p["context"]))
    obs = []
    for (series, length, batch), times in groups.items():
        if series == "join":
            s = StepShape()
            s.add_prefill(0, length, True)
            s.add_decode(int(med([c for _, c in times])))  # the decoding request's context
            obs.append((s, med([t for t, _ in times]), series))
            continue
        s = StepShape()
        if series == "prefill":
            s.add_prefill(0, length, True)
        context = length + int(med([extra for _, extra in times]))
        for _ in range(batch):
            s.add_decode(context)
        obs.append((s, med([t for t, _ in times]), series))
    return obs


def fit(raw: dict[str, Any]) -> tuple[StepTime, float, dict[str, Any]]:
    """Non-negative least squares on relative error (each row over its measured value): the step
    time and the front end's seconds."""
    obs = observations(raw)
    a = np.array([_row(s, series) for s, _, series in obs])
    y = np.array([t for _, t, _ in obs])
    coef, _ = nnls(a / y[:, None], np.ones(len(y)))
    step_s, sample_s = float(coef[0]), float(coef[1])
    slopes = [float(c) for c in coef[2:3 + len(KNOTS)]]
    per_pair, per_kv, prefill_s, frontend_s = (float(c) for c in coef[3 + len(KNOTS):])

    def linear(x: int) -> float:
        return sum(w * max(0, x - k) for w, k in zip(slopes, (0, *KNOTS), strict=True))

    st = StepTime(layers=tiny_model.LAYERS, linear=tuple((x, linear(x)) for x in TABLE), prefill_attn_s=prefill_s,
                  prefill_attn_per_pair_s=per_pair, decode_attn_per_kv_s=per_kv, step_s=step_s, sample_s=sample_s)
    errs: dict[str, list[float]] = {}
    rows = []
    for s, t, series in obs:
        e = (st.seconds(s) + frontend_s * (series == "prefill")) / t - 1
        errs.setdefault(series, []).append(abs(e))
        rows.append({"series": series, "tokens": s.tokens, "decode_seqs": s.decode_seqs, "kv_read": s.kv_read,
                     "measured_ms": t * 1e3, "fitted_ms": t * (1 + e) * 1e3, "error": e})
    report = {"median_abs_error": {k: med(v) for k, v in errs.items()},
              "max_abs_error": {k: max(v) for k, v in errs.items()}, "rows": rows, "frontend_ms": frontend_s * 1e3}
    return st, frontend_s, report


def profile(st: StepTime, frontend_s: float, startup: Startup, when: str, load: float,
            report: dict[str, Any]) -> LlmProfile:
    """The tiny model on this host's CPU: KV as vLLM holds it (VLLM_CPU_KVCACHE_SPACE), served
    with ``--gpu-memory-utilization 1``, since the CPU engine's KV cache is a fixed space."""
    weights_gb = tiny_model.WEIGHTS_BYTES / 1e9
    kv_gb = KVCACHE_SPACE_GB * GIB / 1e9
    med_err = ", ".join(f"{k} {v:.1%}" for k, v in report["median_abs_error"].items())
    notes = (f"measured {when} on {platform.node() or 'this host'} ({os.cpu_count()} cores, {platform.processor() or platform.machine()}), "
             f"load average {load:.2f} at the start; vLLM {startup.version} (vllm-cpu) serving the tiny Llama of "
             f"bench/vllm_cpu/tiny_model.py with random weights (--load-format dummy), bf16, VLLM_CPU_KVCACHE_SPACE="
             f"{KVCACHE_SPACE_GB} ({startup.kv_tokens} KV tokens = {startup.kv_blocks} blocks of {startup.block_size}), "
             f"max_num_seqs {startup.setting('max_num_seqs')}, max_num_batched_tokens "
             f"{startup.setting('max_num_batched_tokens')}, prefix caching and chunked prefill on. Step time fitted by "
             f"bench/vllm_cpu/measure.py on client-side TTFT (prefill, with the front end), TPOT (decode by batch and "
             f"context) and the step a prefill shares with a decode (join); median fit error {med_err}. Serve with --gpu-memory-utilization 1 --block-size {startup.block_size} "
             f"--max-num-seqs {startup.setting('max_num_seqs')} --max-num-batched-tokens "
             f"{startup.setting('max_num_batched_tokens')}: the KV blocks then match vLLM's.")
    # a kilobyte over, less than a block: the sum in floating point must not round a block away
    p = LlmProfile(
        model="tiny-llama", variant="tiny-llama-bf16", gpu="CPU", slice="gpu", tp=1,
        memory_gb=round(weights_gb + kv_gb + 1e-6, 9), weights_gb=weights_gb, activation_gb=0.0,
        kv_bytes_per_token=tiny_model.KV_BYTES_PER_TOKEN, max_model_len=int(startup.setting("max_model_len") or 2048),
        step_time=st, frontend_s=frontend_s, provenance=Provenance(source=f"vLLM {startup.version} on CPU, measured", kind="measured",
                                            notes=notes))
    if p.kv_blocks(1.0, startup.block_size or 16) != startup.kv_blocks:
        raise SystemExit(f"the profile holds {p.kv_blocks(1.0, startup.block_size or 16)} KV blocks, vLLM "
                         f"{startup.kv_blocks}")
    return p


def write(p: LlmProfile, path: Path = PROFILE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# The tiny Llama on real vLLM on CPU: written by python -m bench.vllm_cpu.measure\n"
                    + yaml.safe_dump(llm_profile_to_dict(p), sort_keys=False))


def _save(raw: dict[str, Any], startup: Startup, when: str, load: float) -> None:
    RAW.parent.mkdir(parents=True, exist_ok=True)
    RAW.write_text(json.dumps({"measured_at": when, "load_average": load, "load_average_after": os.getloadavg()[0],
                               "vllm": {"version": startup.version, "kv_tokens": startup.kv_tokens,
                                        "args": {k: v for k, v in startup.args.items()
                                                 if k not in ("model", "model_tag", "host", "port")}},
                               "raw": raw}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refit", action="store_true", help="fit the raw measurements already in " + str(RAW))
    ap.add_argument("--max-load", type=float, default=2.5, help="wait for the 1-minute load average below this")
    ap.add_argument("--url", help="measure a vLLM server already running (with --log: its startup log)")
    ap.add_argument("--log", type=Path, help="the startup log of the server at --url")
    args = ap.parse_args(argv)
    if args.url:
        startup = read_startup(args.log.read_text())
        load = quiet(args.max_load)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        raw = measure(args.url)
        _save(raw, startup, when, load)
    elif args.refit:
        saved = json.loads(RAW.read_text())
        raw, startup = saved["raw"], Startup(saved["vllm"]["version"], saved["vllm"]["args"], saved["vllm"]["kv_tokens"])
        when, load = saved["measured_at"], saved["load_average"]
    else:
        log_path = ROOT / ".headrace" / "vllm_cpu" / "measure.log"
        with vllm_server(log_path) as server:
            startup = server.startup()
            load = quiet(args.max_load)
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            raw = measure(server.url)
        _save(raw, startup, when, load)
    st, frontend_s, report = fit(raw)
    p = profile(st, frontend_s, startup, when, load, report)
    write(p)
    print(f"wrote {PROFILE}; front end {frontend_s * 1e3:.2f} ms; median fit error " + ", ".join(f"{k} {v:.1%}" for k, v in report["median_abs_error"].items()))
    for r in report["rows"]:
        print(f"{r['series']:8s} tokens {r['tokens']:5d} seqs {r['decode_seqs']:4d} kv {r['kv_read']:7d} "
              f"measured {r['measured_ms']:8.2f} fitted {r['fitted_ms']:8.2f} {r['error']:+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
