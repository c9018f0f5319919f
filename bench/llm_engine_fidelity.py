"""How faithful the LLM engine model is, in three parts, each run on its own (``--part``):

- ``heldout``: the step time fitted on Vidur's profiled operators (``profiles/llm/build_reference.py``),
  run through the engine model (:class:`profiles.llm.engine.Engine` in virtual time, driven by
  :class:`profiles.llm.loop.EngineLoop`) on the published workload of each serving measurement in
  ``profiles/llm/data/heldout.csv``, none of which any fit used: TensorRT-LLM's throughput at fixed
  input/output lengths (in-flight and static batching), batch-1 first-token latencies, and a few
  lower-confidence points. Acceptance (issue 27): median error at most 15% over the primary points.
- ``emulated``: the emulated OpenAI server, live, against its own model (TTFT and TPOT by batch and
  context, within 5%): :mod:`bench.llm_fidelity_emulated`. It starts ``headrace engine`` and first waits
  (up to 15 minutes) for the shared host's load to fall.
- ``vllm``: the engine model against real vLLM on CPU (TTFT and TPOT p50/p90 within 10% at three loads,
  with and without shared prefixes): :mod:`bench.vllm_cpu.fidelity`. Opt-in: it needs
  ``bench/vllm_cpu/install.sh`` (about 3.5 GB) and about 15 minutes on 2 cores.

How each published workload becomes an engine run (the engine is vLLM's scheduler; the published
engine's settings are carried over where it has one, and named where it differs):

- in-flight batching (TensorRT-LLM 0.10/0.11 overviews): every request queued at t=0, the published
  ``max_num_tokens`` as the token budget and ``max_batch_size`` as ``max_num_seqs``, KV blocks from the
  published fraction of the memory left after weights and activations (fp16 KV), prefix caching off
  (random prompts). Under ``guaranteed_no_evict`` (0.11) a request starts only with KV reserved for its
  whole length, so ``max_num_seqs`` is also capped at the KV blocks over one request's blocks;
  ``max_utilization`` (0.10) admits as vLLM does. Output tokens over the makespan.
- static batching (TensorRT-LLM 0.6.1, splitwise-sim): the batch's prompts in one step, then decode steps
  until all finish; KV for the whole batch (the published run held it). Throughput per GPU where the
  table gives it per GPU; prompt time is the first step, token time the mean decode step.
- a single request: its first step (first-token latency) or its mean decode step (light load).

Run ``python -m bench.llm_engine_fidelity --part heldout``; writes bench/results/llm_engine_fidelity.{json,md}
(a part's run keeps the other parts' results already there).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.llm_fidelity_emulated import markdown_emulated, run_emulated
from bench.output import write_results
from profiles.llm import build_reference as ref
from profiles.llm.engine import Engine, EngineConfig, LlmRequest
from profiles.llm.kv import BLOCK_SIZE
from profiles.llm.loop import EngineLoop

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "llm_engine_fidelity"
HELDOUT = ref.DATA / "heldout.csv"
TARGET = 0.15  # median relative error over the primary held-out points
LIGHT_LOAD = (202, 179)  # the vLLM blog's ShareGPT sample: mean input and output tokens
SOURCES = {  # source id: where the row was published
    "TRTLLM-0.11-perf-overview": "github.com/NVIDIA/TensorRT-LLM/blob/v0.11.0/docs/source/performance/perf-overview.md",
    "TRTLLM-0.10-perf-overview": "github.com/NVIDIA/TensorRT-LLM/blob/v0.10.0/docs/source/performance/perf-overview.md",
    "TRTLLM-0.6.1-performance": "github.com/NVIDIA/TensorRT-LLM/blob/v0.6.1/docs/source/performance.md",
    "splitwise-sim-perf_model": "github.com/Mutinifni/splitwise-sim/blob/378088013a54df6f2052c27ff5ae6ea7619c3ecc/"
                                "data/perf_model.csv",
    "vllm-blog-v0.6.0": "blog.vllm.ai/2024/09/05/perf-update.html",
    "vllm-issue-12315": "github.com/vllm-project/vllm/issues/12315",
}


def heldout_rows() -> list[dict[str, str]]:
    with HELDOUT.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def run_engine(engine: Engine, requests: list[LlmRequest]) -> tuple[float, list[float], int]:
    """Every request queued at t=0, run to the end in virtual time: (makespan s, each step's
    seconds, output tokens)."""
    loop = EngineLoop(engine)
    for r in requests:
        loop.add(r, 0.0)
    steps: list[float] = []
    tokens = 0
    now = 0.0
    loop.poll(now)
    while loop.wake is not None:
        steps.append(loop.ends_at - loop.started_at)
        now = loop.wake
        out = loop.poll(now)
        tokens += len(out.tokens) if out else 0
    return now, steps, tokens


def requests(n: int, isl: int, osl: int) -> list[LlmRequest]:
    prompt = tuple(range(1, isl + 1))  # prefix caching is off: the tokens do not matter
    return [LlmRequest(str(i), prompt, osl, seed=i) for i in range(n)]


def blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE)


def predict(row: dict[str, str]) -> tuple[float | None, dict[str, Any]]:
    """The engine model's value of one published point, and how it was run (None and why when the
    workload cannot be rebuilt)."""
    policy = row["policy"]
    if policy == "sharegpt":
        return None, {"why": "ShareGPT prompt and output lengths are not carried; no fixed workload to run"}
    model, gpu, tp = row["model"], row["gpu"], int(row["tp"])
    shape = ref.SHAPES[model]
    d = ref.step_time(model, gpu, tp)
    st = d.step_time
    isl, osl = (int(row["isl"]), int(row["osl"])) if row["isl"] else LIGHT_LOAD
    batch = int(row["batch"])
    seq_blocks = blocks_for(isl + osl)
    how: dict[str, Any] = {"step_time": d.kind, "isl": isl, "osl": osl}
    if policy.startswith("ifb"):
        budget = int(row["max_num_tokens"])
        free = ref.memory_gb(gpu, "gpu") - shape.weights_gb() / tp - ref.activation_gb(shape, tp, budget)
        blocks = int(float(row["kv_fraction"]) * free * 1e9 / (shape.kv_bytes_per_token / tp)) // BLOCK_SIZE
        seqs = min(batch, blocks // seq_blocks) if policy == "ifb-no-evict" else batch
        n = int(row["requests"])
    else:  # static or single: the batch's KV held throughout, its prompts in one step
        seqs, n, budget = batch, batch, batch * isl
        blocks = batch * seq_blocks
    cfg = EngineConfig(num_blocks=blocks, max_model_len=isl + osl, max_num_seqs=seqs,
                       max_num_batched_tokens=budget, prefix_caching=False, vocab_size=shape.vocab)
    how.update(requests=n, max_num_seqs=seqs, max_num_batched_tokens=budget, kv_blocks=blocks)
    makespan, steps, tokens = run_engine(Engine(cfg, st), requests(n, isl, osl))
    metric = row["metric"]
    if metric == "throughput":
        value = tokens / makespan
    elif metric == "throughput_per_gpu":
        value = tokens / makespan / tp
    elif metric in ("ttft", "prompt_time"):
        value = steps[0] * 1e3
    elif metric in ("tpot", "token_time"):
        value = statistics.fmean(steps[1:]) * 1e3
    else:
        return None, {"why": f"no engine quantity for metric {metric!r}"}
    how.update(steps=len(steps), makespan_s=round(makespan, 3))
    return value, how


def part_heldout(only_primary: bool = False, log: Callable[[str], None] = print) -> dict[str, Any]:
    points = []
    for i, row in enumerate(heldout_rows()):
        if only_primary and row["priority"] != "primary":
            continue
        t0 = time.monotonic()
        predicted, how = predict(row)
        value = float(row["value"])
        err = None if predicted is None else predicted / value - 1
        points.append({
            "row": i, "source": row["source"], "url": SOURCES[row["source"]], "model": row["model"], "gpu": row["gpu"],
            "tp": int(row["tp"]), "isl": row["isl"], "osl": row["osl"], "batch": row["batch"], "policy": row["policy"],
            "metric": row["metric"], "published": value, "predicted": predicted, "error": err,
            "priority": row["priority"], "confidence": row["confidence"], "note": row["note"], "run": how,
            "wall_s": round(time.monotonic() - t0, 2),
        })
        shown = "-" if err is None else f"{err:+.1%}"
        log(f"{row['source']:26s} {row['model']:11s} {row['gpu']:9s} tp{row['tp']} {row['isl']:>5s}/{row['osl']:<5s} "
            f"{row['metric']:18s} published {value:9.2f} predicted {predicted or float('nan'):9.2f} {shown}")
    return {"points": points, "summary": summarize(points), "fit": ref.fit_report(),
            "settings": {"cpu_step_ms": ref.CPU_STEP_MS, "sampler_ms": ref.SAMPLER_MS, "runtime_gb": ref.RUNTIME_GB,
                         "light_load_isl_osl": list(LIGHT_LOAD), "target_median_error": TARGET,
                         "block_size": BLOCK_SIZE}}


def summarize(points: list[dict]) -> dict[str, Any]:
    def stats(sel: list[dict]) -> dict[str, Any]:
        errs = sorted(abs(p["error"]) for p in sel if p["error"] is not None)
        signed = [p["error"] for p in sel if p["error"] is not None]
        if not errs:
            return {"n": 0}
        return {"n": len(errs), "median_abs_error": statistics.median(errs), "mean_signed_error": statistics.fmean(signed),
                "p90_abs_error": errs[min(len(errs) - 1, math.ceil(0.9 * len(errs)) - 1)], "max_abs_error": errs[-1],
                "within_15pct": sum(e <= 0.15 for e in errs)}

    groups: dict[str, list[dict]] = {}
    for p in points:
        groups.setdefault(f"{p['source']} / {p['metric']}", []).append(p)
    primary = stats([p for p in points if p["priority"] == "primary"])
    return {"primary": primary, "secondary": stats([p for p in points if p["priority"] == "secondary"]),
            "all": stats(points), "by_source": {k: stats(v) for k, v in groups.items()},
            "not_predicted": sum(p["predicted"] is None for p in points),
            "accepted": primary.get("n", 0) > 0 and primary["median_abs_error"] <= TARGET}


# Parts 2 and 3 are measured by their own functions, registered here when they exist:
# "emulated" (the emulated server, live, against its own model) and "vllm" (the engine model against
# real vLLM on CPU). Each takes the parsed arguments and returns its JSON part; its markdown renderer
# goes into RENDER.
def part_vllm(args: argparse.Namespace) -> dict[str, Any]:
    """The engine model against real vLLM on CPU (starts vLLM from ``.venv-vllm``)."""
    from bench.vllm_cpu import fidelity
    from bench.vllm_cpu.server import missing

    why = missing()
    if why is not None:
        raise SystemExit(f"--part vllm: {why}")
    return fidelity.compare()


def markdown_vllm(v: dict[str, Any]) -> list[str]:
    from bench.vllm_cpu import fidelity

    return fidelity.markdown(v)


PARTS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "heldout": lambda args: part_heldout(args.primary_only),
    "emulated": lambda args: run_emulated(),
    "vllm": part_vllm,
}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def markdown_heldout(h: dict[str, Any]) -> list[str]:
    s = h["summary"]
    p = s["primary"]
    verdict = "met" if s["accepted"] else "NOT met"
    lines = [
        "## Part 1: the fitted step time against held-out published serving measurements", "",
        f"Run at commit {h.get('commit')} in {h.get('elapsed_s', 0):.0f} s: "
        "`python -m bench.llm_engine_fidelity --part heldout`.", "",
        f"Primary points: {p['n']}, median |error| **{p['median_abs_error']:.1%}** (target <= {TARGET:.0%}: {verdict}), "
        f"mean signed error {p['mean_signed_error']:+.1%}, p90 {p['p90_abs_error']:.1%}, max {p['max_abs_error']:.1%}, "
        f"{p['within_15pct']}/{p['n']} within 15%.",
    ]
    if s["secondary"].get("n"):
        q = s["secondary"]
        lines.append(f"Secondary points (lower confidence or a second set from the same source): {q['n']}, median "
                     f"|error| {q['median_abs_error']:.1%}, mean signed {q['mean_signed_error']:+.1%}; "
                     f"{s['not_predicted']} not predicted (why in the table).")
    st = h["settings"]
    lines += [
        "", "Step time: Vidur's operators (microsoft/vidur, MIT) fitted per model, GPU and tensor-parallel degree "
        "(`profiles/llm/build_reference.py`); LM head from its weights; per-step CPU "
        f"{st['cpu_step_ms']} ms and sampler {st['sampler_ms']} ms a sequence (estimates). No held-out point was used "
        "by any fit or setting. A positive error is a prediction above the published value.", "",
        "| source | metric | n | median abs | mean signed | max abs |", "|---|---|---:|---:|---:|---:|",
    ]
    for k, v in s["by_source"].items():
        if v.get("n"):
            source, metric = k.split(" / ")
            lines.append(f"| {source} | {metric} | {v['n']} | {v['median_abs_error']:.1%} | "
                         f"{v['mean_signed_error']:+.1%} | {v['max_abs_error']:.1%} |")
    lines += ["", "Sources: " + "; ".join(f"{k}: https://{v}" for k, v in SOURCES.items()) + ".", "",
              "Every point (# = row of profiles/llm/data/heldout.csv; priority p = primary, s = secondary; step "
              "time fit/derived as its profile's provenance kind):", "",
              "| # | source | model | GPU | TP | in/out | batch | policy | metric | published | predicted | error | "
              "prio | step time |",
              "|---:|---|---|---|---:|---|---:|---|---|---:|---:|---:|---|---|"]
    for pt in h["points"]:
        pred = "-" if pt["predicted"] is None else f"{pt['predicted']:.2f}"
        why = pt["run"].get("why", pt["run"].get("step_time", ""))
        lines.append(
            f"| {pt['row']} | {pt['source']} | {pt['model']} | {pt['gpu']} | {pt['tp']} | "
            f"{pt['isl'] or '-'}/{pt['osl'] or '-'} | {pt['batch']} | {pt['policy']} | {pt['metric']} | "
            f"{pt['published']:g} | {pred} | {_pct(pt['error'])} | {pt['priority'][0]} | {why} |")
    worst = sorted((pt for pt in h["points"] if pt["error"] is not None and pt["priority"] == "primary"),
                   key=lambda pt: -abs(pt["error"]))[:5]
    lines += ["", "Worst primary points: " + "; ".join(
        f"#{pt['row']} {pt['model']} {pt['gpu']} tp{pt['tp']} {pt['isl']}/{pt['osl']} {pt['metric']} "
        f"{_pct(pt['error'])}" for pt in worst) + "."]
    fit = h["fit"]
    lin = fit["linear"]
    med = statistics.median(v["median"] for v in lin.values())
    worst_lin = max(lin.items(), key=lambda kv: kv[1]["max"])
    att = fit["attention"]
    lines += [
        "", "Fit errors on the data fitted (relative): token-wise tables, "
        f"{len(lin)} (model, GPU, TP): median of medians {med:.1%}, largest point error {worst_lin[1]['max']:.1%} "
        f"({worst_lin[0]}); attention prefill median {att['prefill']['median']:.1%} of the kernel "
        f"({att['prefill']['layer_median']:.1%} of the layer), decode {att['decode']['median']:.1%} "
        f"({att['decode']['layer_median']:.1%} of the layer); derived by heads: "
        + ", ".join(f"{k.replace(' (derived)', '')} {v['median']:.1%}" for k, v in att.items() if "derived" in k)
        + "; all-reduce line median " + ", ".join(f"{k} {v:.1%}" for k, v in fit["allreduce"].items()) + ".",
    ]
    return lines


RENDER: dict[str, Callable[[dict[str, Any]], list[str]]] = {"heldout": markdown_heldout, "emulated": markdown_emulated, "vllm": markdown_vllm}


def markdown(result: dict[str, Any]) -> str:
    lines = ["# LLM engine model fidelity", "",
             f"Commit {result.get('commit')}. Command: `{result.get('command')}`.", ""]
    for part, render in RENDER.items():
        if part in result:
            lines += render(result[part]) + [""]
    missing = [p for p in ("heldout", "emulated", "vllm") if p not in result]
    if missing:
        lines.append(f"Parts not in this result: {', '.join(missing)}.")
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", action="append", choices=["heldout", "emulated", "vllm"],
                    help="the part to run (repeatable; default heldout)")
    ap.add_argument("--primary-only", action="store_true", help="heldout: only the primary points")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    parts = args.part or ["heldout"]
    absent = [p for p in parts if p not in PARTS]
    if absent:
        print(f"part(s) {', '.join(absent)} not built yet; available: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    from loadgen.record import headrace_version

    commit = headrace_version()["commit"]
    fresh: dict[str, Any] = {}
    for part in parts:
        t0 = time.monotonic()
        fresh[part] = PARTS[part](args)
        fresh[part].update(elapsed_s=round(time.monotonic() - t0, 1), commit=commit)
    # the other parts' results are read when this run writes, not when it starts: a part that another
    # run wrote meanwhile is kept
    old = args.out / f"{NAME}.json"
    result: dict[str, Any] = json.loads(old.read_text()) if old.exists() else {}
    result.update(fresh)
    result["commit"] = commit
    result["command"] = "python -m bench.llm_engine_fidelity " + " ".join(f"--part {p}" for p in parts) + (
        " --primary-only" if args.primary_only else "")
    md = markdown(result)
    write_results(args.out, NAME, result, md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
