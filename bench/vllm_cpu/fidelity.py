"""The engine model against real vLLM on CPU: the same arrivals sent to vLLM serving the tiny
Llama and to the engine model with the profile measured from it
(``profiles/llm/measured/tiny-llama-cpu.yaml``, :mod:`bench.vllm_cpu.measure`), two ways: the
emulated engine live (``headrace engine``, timed by the same client) and the engine model alone in
virtual time (no server, no client: what the model predicts).

Workloads: Poisson arrivals (seeded), prompts of random token ids, every request ``max_tokens``
long with ``ignore_eos`` (both sides make the same number of tokens; token-id prompts, since the
tokenizers differ). Without shared prefixes every prompt is unique; with them, each prompt is one
of a few shared prefixes, whole KV blocks long, and a unique tail. Three loads, as fractions of
the engine model's capacity on the workload (its throughput with every request queued at once):
light, the knee, and overload.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.vllm_cpu import tiny_model
from bench.vllm_cpu.load import Send, Timing, quiet, run
from bench.vllm_cpu.measure import PROFILE
from bench.vllm_cpu.server import ENGINE_ARGS, SERVED, vllm_server
from profiles.llm.engine import Engine, LlmRequest
from profiles.llm.loop import EngineLoop, replay
from profiles.llm.profile import LlmProfile, load_llm_profiles

ROOT = Path(__file__).resolve().parents[2]
TARGET = 0.10  # |error| of TTFT and TPOT p50 and p90 (issue 27)
LOADS = {"light": 0.3, "knee": 0.8, "overload": 1.3}  # fractions of the model's capacity
REQUESTS = 120
MAX_TOKENS = 32
PLAIN_PROMPT = (32, 448)  # unique prompt lengths, uniform
SHARED_PREFIXES, PREFIX_LEN, TAIL = 4, 384, (32, 128)  # 3 blocks of 128 tokens, then a unique tail


def settings() -> dict[str, int]:
    """The CPU engine's settings as :data:`bench.vllm_cpu.server.ENGINE_ARGS` passes them."""
    args = dict(zip(ENGINE_ARGS[::2], ENGINE_ARGS[1::2], strict=True))
    return {k.removeprefix("--").replace("-", "_"): int(v) for k, v in args.items()}


def engine_flags() -> list[str]:
    """``headrace engine`` flags for the same engine: vLLM's settings, and all of the profile's
    memory for KV (the CPU engine's KV cache is a fixed space)."""
    return [*ENGINE_ARGS, "--gpu-memory-utilization", "1"]


@dataclass(frozen=True)
class Workload:
    name: str
    shared: bool
    sends: tuple[Send, ...]


def prompts(shared: bool, n: int, rng: random.Random) -> list[list[int]]:
    def ids(k: int) -> list[int]:
        return [rng.randrange(3, tiny_model.VOCAB) for _ in range(k)]

    if not shared:
        return [ids(rng.randint(*PLAIN_PROMPT)) for _ in range(n)]
    prefixes = [ids(PREFIX_LEN) for _ in range(SHARED_PREFIXES)]
    return [prefixes[rng.randrange(SHARED_PREFIXES)] + ids(rng.randint(*TAIL)) for _ in range(n)]


def workload(name: str, shared: bool, rate: float, seed: int, n: int = REQUESTS) -> Workload:
    rng = random.Random(seed)
    ps = prompts(shared, n, rng)
    at, sends = 0.0, []
    for p in ps:
        at += rng.expovariate(rate)
        sends.append(Send(at, p, MAX_TOKENS))
    return Workload(name, shared, tuple(sends))


def twin(w: Workload, seed: int) -> Workload:
    """``w`` with its token ids permuted: the same arrivals, lengths and prefix sharing, none of
    its blocks, so a server that ran ``w`` finds nothing of this in its prefix cache."""
    ids = list(range(3, tiny_model.VOCAB))
    perm = dict(zip(ids, random.Random(seed).sample(ids, len(ids)), strict=True))
    return dataclasses.replace(w, sends=tuple(dataclasses.replace(x, prompt=[perm[t] for t in x.prompt])
                                              for x in w.sends))


# the engine model in virtual time

def engine(profile: LlmProfile) -> Engine:
    s = settings()
    return Engine(profile.engine_config(1.0, **s), profile.step_time)


def simulate(profile: LlmProfile, sends: Sequence[Send]) -> list[Timing]:
    """The engine model alone: each request arriving at its time (and joining the scheduler the
    profile's front end later), steps back to back; a token's time is the end of the step that
    made it."""
    reqs = [(s.at, LlmRequest(str(i), tuple(s.prompt), s.max_tokens, seed=i)) for i, s in enumerate(sends)]
    times = replay(EngineLoop(engine(profile), profile.frontend_s), sorted(reqs, key=lambda x: x[0]))
    result = []
    for i, s in enumerate(sends):
        t = times[str(i)]
        n = len(t)
        result.append(Timing(ttft=t[0] - s.at, tpot=(t[-1] - t[0]) / (n - 1) if n > 1 else None, tokens=n,
                             cached=None, e2e=t[-1] - s.at, times=tuple(x - s.at for x in t)))
    return result


def capacity(profile: LlmProfile, shared: bool, seed: int) -> float:
    """Requests a second the model finishes with the whole workload queued at once."""
    sends = [Send(0.0, s.prompt, s.max_tokens) for s in workload("", shared, 1.0, seed).sends]
    return len(sends) / max(t.e2e for t in simulate(profile, sends))


# the emulated engine, live

class Emulated:
    """``headrace engine`` serving the measured profile on a free port."""

    def __init__(self, profile: Path = PROFILE) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "engine", "--profile", str(profile), "--port", "0",
             "--served-model-name", SERVED, *engine_flags()],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        m = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        if m is None:
            self.close()
            raise RuntimeError(f"headrace engine did not start: {line}")
        self.url = f"http://127.0.0.1:{m.group(1)}"
        self.banner = line.strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


# statistics

def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def summary(ts: Sequence[Timing]) -> dict[str, float]:
    ttft = [t.ttft for t in ts]
    tpot = [t.tpot for t in ts if t.tpot is not None]
    return {"ttft_p50_ms": pct(ttft, 0.5) * 1e3, "ttft_p90_ms": pct(ttft, 0.9) * 1e3,
            "tpot_p50_ms": pct(tpot, 0.5) * 1e3, "tpot_p90_ms": pct(tpot, 0.9) * 1e3,
            "e2e_mean_ms": statistics.fmean(t.e2e for t in ts) * 1e3}


METRICS = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms")


def errors(model: dict[str, float], real: dict[str, float]) -> dict[str, float]:
    return {k: model[k] / real[k] - 1 for k in METRICS}


def compare(seed: int = 7, max_load: float = 2.5, requests: int = REQUESTS,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every workload against vLLM, the emulated engine live, and the model in virtual time."""
    profile = load_llm_profiles(PROFILE)[0]
    workloads = []
    caps = {}
    for shared in (False, True):
        cap = caps[shared] = capacity(profile, shared, seed)
        for i, (name, frac) in enumerate(LOADS.items()):
            # each run its own prompts (and prefixes): no run finds another's in a server's cache
            workloads.append((frac * cap, workload(name, shared, frac * cap, seed + 10 * i + int(shared), requests)))
    warm = [Send(0, p, 4) for p in prompts(False, 4, random.Random(-1))]
    runs: list[dict[str, Any]] = []
    for rate, w in workloads:
        runs.append({"load": w.name, "shared_prefixes": w.shared, "rate_rps": rate, "requests": len(w.sends),
                     "model": summary(simulate(profile, w.sends))})
    log_path = ROOT / ".headrace" / "vllm_cpu" / "fidelity.log"
    loads: dict[str, list[float]] = {"vllm": [], "vllm_again": [], "emulated": []}
    with vllm_server(log_path) as server:
        startup = server.startup()
        quiet(max_load, log=log)
        for i, ((_, w), r) in enumerate(zip(workloads, runs, strict=True)):
            # NOTE: vLLM runs each workload twice (the second time its twin: the same arrivals and
            # sharing, other token ids): how far apart two runs of the same engine land is the
            # floor this host sets under any comparison
            for key, sends in (("vllm", w.sends), ("vllm_again", twin(w, seed + 1000 + i).sends)):
                loads[key].append(quiet(max_load, wait_s=120, log=log))
                run(server.url, SERVED, warm)
                r[key] = summary(run(server.url, SERVED, sends))
                log(f"{key:10s} {w.name:8s} shared={w.shared!s:5s} {r[key]}")
    emulated = Emulated()
    try:
        for (_, w), r in zip(workloads, runs, strict=True):
            loads["emulated"].append(quiet(max_load, wait_s=120, log=log))
            run(emulated.url, SERVED, warm)
            r["emulated"] = summary(run(emulated.url, SERVED, w.sends))
            log(f"emulated   {w.name:8s} shared={w.shared!s:5s} {r['emulated']}")
    finally:
        emulated.close()
    for r in runs:
        r["error_emulated"] = errors(r["emulated"], r["vllm"])
        r["error_model"] = errors(r["model"], r["vllm"])
        r["error_vllm_again"] = errors(r["vllm_again"], r["vllm"])
        r["within_10pct_emulated"] = all(abs(e) <= TARGET for e in r["error_emulated"].values())
        r["within_10pct_model"] = all(abs(e) <= TARGET for e in r["error_model"].values())
        r["within_10pct_vllm_again"] = all(abs(e) <= TARGET for e in r["error_vllm_again"].values())
        # within the host's floor: each error no larger than 10% or vLLM's own run-to-run gap there
        r["within_floor_emulated"] = all(abs(e) <= max(TARGET, abs(r["error_vllm_again"][m]))
                                         for m, e in r["error_emulated"].items())
    return {
        "runs": runs, "capacity_rps": {"plain": caps[False], "shared": caps[True]},
        "vllm": {"version": startup.version, "kv_tokens": startup.kv_tokens, "kv_blocks": startup.kv_blocks,
                 "args": {k: v for k, v in startup.args.items() if k not in ("model", "model_tag", "port", "host")}},
        "profile": str(PROFILE.relative_to(ROOT)), "profile_notes": profile.provenance.notes,
        "frontend_ms": profile.frontend_s * 1e3,
        "load_average": {k: [round(x, 2) for x in v] for k, v in loads.items()},
        "host": {"cores": os.cpu_count()}, "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": {"seed": seed, "requests": requests, "max_tokens": MAX_TOKENS, "loads": LOADS,
                     "plain_prompt": list(PLAIN_PROMPT), "shared_prefixes": SHARED_PREFIXES,
                     "prefix_len": PREFIX_LEN, "tail": list(TAIL), "target": TARGET},
        "accepted": all(r["within_10pct_emulated"] for r in runs),
    }


def markdown(v: dict[str, Any]) -> list[str]:
    ok = sum(r["within_10pct_emulated"] for r in v["runs"])
    again = sum(r["within_10pct_vllm_again"] for r in v["runs"])
    floor = sum(r["within_floor_emulated"] for r in v["runs"])
    s = v["settings"]
    lines = [
        "## Part 3: the engine model against real vLLM on CPU", "",
        f"Run at commit {v.get('commit')} in {v.get('elapsed_s', 0):.0f} s: "
        "`python -m bench.llm_engine_fidelity --part vllm` (after `bench/vllm_cpu/install.sh`).", "",
        f"vLLM {v['vllm']['version']} on this host's CPU ({v['host']['cores']} cores) serving the tiny Llama "
        f"(`bench/vllm_cpu`), KV {v['vllm']['kv_tokens']} tokens = {v['vllm']['kv_blocks']} blocks; the engine model "
        f"with the profile measured from it (`{v['profile']}`). {s['requests']} requests a run, Poisson (seed "
        f"{s['seed']}), {s['max_tokens']} tokens each (ignore_eos); plain prompts of {s['plain_prompt'][0]}-"
        f"{s['plain_prompt'][1]} unique token ids; shared: one of {s['shared_prefixes']} prefixes of "
        f"{s['prefix_len']} tokens and a unique tail of {s['tail'][0]}-{s['tail'][1]}. Loads as fractions of the "
        f"model's capacity ({v['capacity_rps']['plain']:.2f} req/s plain, {v['capacity_rps']['shared']:.2f} shared): "
        + ", ".join(f"{k} {f:g}" for k, f in s["loads"].items()) + ".", "",
        f"Emulated engine live within {TARGET:.0%} of vLLM on all four of TTFT and TPOT p50/p90: **{ok}/{len(v['runs'])}** "
        f"runs ({'met' if v['accepted'] else 'NOT met'}). vLLM against its own second run (the floor this host sets): "
        f"{again}/{len(v['runs'])} runs within {TARGET:.0%}. Emulated within the floor (each error at most "
        f"{TARGET:.0%} or vLLM's own gap there): {floor}/{len(v['runs'])}. Load average before each run: vLLM "
        f"{v['load_average']['vllm']}, vLLM again {v['load_average']['vllm_again']}, emulated "
        f"{v['load_average']['emulated']}.", "",
        "| load | shared | req/s | side | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | TPOT p90 ms |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in v["runs"]:
        for side, key, err in (("vLLM", "vllm", None), ("vLLM again", "vllm_again", "error_vllm_again"),
                               ("emulated", "emulated", "error_emulated"), ("model", "model", "error_model")):
            row = r[key]
            cells = [f"{row[m]:.1f}" + (f" ({r[err][m]:+.0%})" if err else "") for m in METRICS]
            lines.append(f"| {r['load']} | {'yes' if r['shared_prefixes'] else 'no'} | {r['rate_rps']:.2f} | {side} | "
                         + " | ".join(cells) + " |")
    lines += ["", "vLLM again: the same arrivals, lengths and prefix sharing with other token ids, on the same "
              "server; emulated: `headrace engine` live, timed by the same client; model: the engine model alone in "
              f"virtual time. The profile's front end ({v['frontend_ms']:.1f} ms a request, beside the steps) is fitted "
              "with its step time by `python -m bench.vllm_cpu.measure`. In brackets: the error against vLLM's first "
              "run."]
    return lines
