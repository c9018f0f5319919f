"""The emulated engine, live, against its own model: TTFT and TPOT by batch and context.

``headrace engine`` serves an LLM profile in real time (a child process, as a user starts it). For
each point (batch B, context C) a client sends B concurrent streaming ``/v1/completions`` requests,
each a prompt of C token ids (distinct, so no prefix is shared) and a fixed ``max_tokens``, and
stamps every token as it arrives: TTFT from its send, TPOT over the tokens after the first. The
prediction runs the same arrivals (the client's send times) through the engine model
(:class:`profiles.llm.engine.Engine`, driven by :class:`profiles.llm.loop.EngineLoop` in virtual
time), with the same profile file and engine settings, read back and checked against what the
server printed.

A lead request (one token, a prompt of ``LEAD_TOKENS``) is sent first and holds the engine for
one step while the B requests arrive, so they start together in both runs however the client
spreads its sends; its arrival is replayed too, and its own first token is kept (``lead_ms``): it
shows how late the server delivers while it is taking in a batch (the engine's steps keep their
times: a step starts when the one before it ended, however late the server wakes).

The machine's floor is measured in the same run: the same points against a profile whose steps
take a nanosecond, so what is left is the client's and the server's time per request and per
token. A profile's times are reproducible where they are well above it.

The host is shared: the run waits (in steps of 60 s, up to ``max_wait_s``) for the 1-minute load to
fall below ``quiet_load``, and records the load and the CPU time stolen at every point.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.host import cpu_times, steal_share
from profiles.llm.engine import Engine, EngineConfig, LlmRequest
from profiles.llm.loop import EngineLoop
from profiles.llm.profile import LlmProfile, llm_profile_to_dict, load_llm_profiles
from profiles.llm.steptime import StepTime

ROOT = Path(__file__).resolve().parent.parent
PROFILE = "llama-3.1-8b-instruct-bf16@A100-80GB/3g.40gb"  # decode steps of 23-47 ms, prefill 95 ms per 512 tokens
POINTS = ((1, 256), (1, 2048), (4, 1024), (16, 256), (16, 1024), (64, 256))  # (batch, context)
MAX_TOKENS = 32
LEAD_TOKENS = 512  # the lead request's prompt: one prefill step of about 95 ms on PROFILE
LEAD_GAP_S = 0.015  # between the lead's send and the batch's
SETTINGS = {"max_num_seqs": 256, "max_num_batched_tokens": 8192}  # vLLM's defaults, given explicitly
UTILISATION = 0.9
VOCAB = 32000  # EngineConfig's default vocabulary: prompt ids are drawn below it
TARGET = 0.05
READY_S = 60.0


# the engine model in virtual time


def replay(config: EngineConfig, step_time: StepTime, arrivals: list[tuple[float, LlmRequest]]) -> dict[str, list[float]]:
    """Each request's token times when ``arrivals`` (time, request), sorted by time, come to one
    engine in virtual time: a token is stamped with the end of the step that made it, as the
    emulated server stamps it. A request arriving as a step ends waits for the next."""
    loop = EngineLoop(Engine(config, step_time))
    times: dict[str, list[float]] = {r.id: [] for _, r in arrivals}
    i, n = 0, len(arrivals)
    while i < n or loop.wake is not None:
        wake = loop.wake
        if i < n and (wake is None or arrivals[i][0] < wake):
            now = arrivals[i][0]
            loop.add(arrivals[i][1], now)
            i += 1
        else:
            now = wake
        ended = loop.ends_at
        out = loop.poll(now)
        if out is not None:
            for rid, _ in out.tokens:
                times[rid].append(ended)
    return times


# the server and the client


class Server:
    """``headrace engine`` on a free port, in a child process of its own."""

    def __init__(self, profile_file: Path, served: str) -> None:
        cmd = [sys.executable, "-m", "deploy.cli", "engine", "--profile", str(profile_file), "--port", "0",
               "--served-model-name", served, "--gpu-memory-utilization", str(UTILISATION)]
        for key, value in SETTINGS.items():
            cmd += [f"--{key.replace('_', '-')}", str(value)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + READY_S
        self.banner = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("emulated engine"):
                self.banner = line.strip()
                break
        m = re.search(r"on (http://\S+)/v1 \(KV blocks (\d+) of (\d+) tokens, max_model_len (\d+), max_num_seqs (\d+), "
                      r"max_num_batched_tokens (\d+)\)", self.banner)
        if m is None:
            self.stop()
            raise RuntimeError(f"headrace engine did not start: {self.banner or 'no banner'}")
        self.url = m.group(1)
        self.printed = tuple(int(x) for x in m.groups()[1:])  # blocks, block size, max_model_len, seqs, budget

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


async def _stream(session: Any, url: str, body: bytes, out: dict[str, Any]) -> None:
    """One streamed completion: its send time and each token's arrival (perf_counter seconds)."""
    out["send"] = time.perf_counter()
    tokens: list[float] = out["tokens"]
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        async for line in resp.content:
            if line.startswith(b"data: "):
                if line.startswith(b"data: [DONE]"):
                    break
                tokens.append(time.perf_counter())


def _body(model: str, prompt: list[int], max_tokens: int) -> bytes:
    return json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True}).encode()


async def _one_point(url: str, model: str, lead: list[int], prompts: list[list[int]], max_tokens: int,
                     session: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The lead, then the batch: every request's send time and token times."""
    target = url + "/v1/completions"
    lead_out: dict[str, Any] = {"tokens": []}
    lead_task = asyncio.create_task(_stream(session, target, _body(model, lead, 1), lead_out))
    await asyncio.sleep(LEAD_GAP_S)
    outs = [{"tokens": []} for _ in prompts]
    bodies = [_body(model, p, max_tokens) for p in prompts]
    tasks = [asyncio.create_task(_stream(session, target, b, o)) for b, o in zip(bodies, outs, strict=True)]
    await asyncio.gather(lead_task, *tasks)
    return lead_out, outs


def _prompts(rng: random.Random, batch: int, context: int) -> list[list[int]]:
    return [[rng.randrange(16, VOCAB) for _ in range(context)] for _ in range(batch)]


def _p(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _measure(profile_file: Path, profile: LlmProfile, points: tuple[tuple[int, int], ...], reps: int, seed: int,
             log: Callable[[str], None]) -> dict[str, Any]:
    """Every point against one server: measured and predicted times of each request."""
    from aiohttp import ClientSession, ClientTimeout, TCPConnector

    config = profile.engine_config(UTILISATION, prefix_caching=True, chunked_prefill=True, **SETTINGS)
    expected = (config.num_blocks, config.block_size, config.max_model_len, config.max_num_seqs,
                config.max_num_batched_tokens)
    server = Server(profile_file, profile.variant)
    rng = random.Random(seed)
    try:
        if server.printed != expected:
            raise RuntimeError(f"the server runs {server.printed}, the model {expected} (blocks, block size, "
                               "max_model_len, max_num_seqs, max_num_batched_tokens)")

        async def go() -> list[dict[str, Any]]:
            out = []
            async with ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=300)) as s:
                # a first point makes the connections and warms both processes; it is not kept
                await _one_point(server.url, profile.variant, _prompts(rng, 1, LEAD_TOKENS)[0],
                                 _prompts(rng, max(b for b, _ in points), 16), 4, s)
                for rep in range(reps):
                    for batch, context in points:
                        load, before = os.getloadavg()[0], cpu_times()
                        lead = _prompts(rng, 1, LEAD_TOKENS)[0]
                        prompts = _prompts(rng, batch, context)
                        lead_out, outs = await _one_point(server.url, profile.variant, lead, prompts, MAX_TOKENS, s)
                        out.append(_compare(config, profile.step_time, lead, lead_out, prompts, outs, batch, context,
                                            rep, load, steal_share(before, cpu_times())))
                        p = out[-1]
                        log(f"  B={batch:3d} C={context:5d} rep {rep}: TTFT p50 {p['ttft_ms']['measured_p50']:8.2f} "
                            f"vs {p['ttft_ms']['predicted_p50']:8.2f} ms, TPOT p50 {p['tpot_ms']['measured_p50']:7.3f} "
                            f"vs {p['tpot_ms']['predicted_p50']:7.3f} ms, load {load:.2f}")
            return out

        return {"engine": dict(zip(("kv_blocks", "block_size", "max_model_len", "max_num_seqs",
                                    "max_num_batched_tokens"), expected, strict=True)),
                "banner": server.banner, "points": asyncio.run(go())}
    finally:
        server.stop()


def _compare(config: EngineConfig, step_time: StepTime, lead: list[int], lead_out: dict, prompts: list[list[int]],
             outs: list[dict], batch: int, context: int, rep: int, load: float, steal: float | None) -> dict[str, Any]:
    """One point's requests, measured and replayed with the same send times."""
    t0 = lead_out["send"]
    arrivals = [(0.0, LlmRequest("lead", lead, 1))] + [
        (o["send"] - t0, LlmRequest(str(i), p, MAX_TOKENS, seed=i)) for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
    arrivals.sort(key=lambda a: a[0])
    predicted = replay(config, step_time, arrivals)
    rows = []
    for i, o in enumerate(outs):
        m = [t - t0 for t in o["tokens"]]
        p = predicted[str(i)]
        if len(m) != MAX_TOKENS or len(p) != MAX_TOKENS:
            raise RuntimeError(f"request {i} of B={batch} C={context}: {len(m)} tokens streamed, {len(p)} predicted")
        sent = o["send"] - t0
        rows.append({"ttft": (m[0] - sent, p[0] - sent), "tpot": ((m[-1] - m[0]) / (len(m) - 1), (p[-1] - p[0]) / (len(p) - 1))})

    def stat(key: str) -> dict[str, float]:
        meas, pred = [r[key][0] * 1e3 for r in rows], [r[key][1] * 1e3 for r in rows]
        errs = [abs(a / b - 1) for a, b in zip(meas, pred, strict=True) if b > 0]
        return {"measured_p50": _p(meas, 0.5), "predicted_p50": _p(pred, 0.5), "measured_p90": _p(meas, 0.9),
                "predicted_p90": _p(pred, 0.9), "error_p50": _p(meas, 0.5) / _p(pred, 0.5) - 1 if _p(pred, 0.5) else None,
                "request_error_median": statistics.median(errs) if errs else None,
                "request_error_max": max(errs) if errs else None}

    return {"batch": batch, "context": context, "rep": rep, "load_1min": round(load, 2),
            "steal": None if steal is None else round(steal, 4), "send_spread_ms": (arrivals[-1][0] - arrivals[1][0]) * 1e3,
            "lead_ms": {"measured": (lead_out["tokens"][0] - t0) * 1e3, "predicted": predicted["lead"][0] * 1e3},
            "ttft_ms": stat("ttft"), "tpot_ms": stat("tpot")}


# the run


def floor_profile() -> LlmProfile:
    """A profile whose every step takes a nanosecond, with the reference profile's memory (so the
    same KV cache): what is measured against it is the client's and the server's own time."""
    ref = next(p for p in load_llm_profiles() if p.name == PROFILE)
    from dataclasses import replace

    from profiles.profile import Provenance

    return replace(ref, variant="floor", step_time=StepTime(layers=1, linear=((1, 1e-9), (8192, 1e-9))),
                   provenance=Provenance("a step time of 1 ns: the host's floor"))


def wait_for_quiet(quiet_load: float, max_wait_s: float, log: Callable[[str], None]) -> dict[str, Any]:
    start = os.getloadavg()[0]
    waited = 0.0
    while os.getloadavg()[0] >= quiet_load and waited < max_wait_s:
        log(f"1-minute load {os.getloadavg()[0]:.2f} >= {quiet_load}: waiting 60 s ({waited:.0f} s so far)")
        time.sleep(60)
        waited += 60
    now = os.getloadavg()[0]
    return {"load_at_start": round(start, 2), "waited_s": waited, "load_when_measured": round(now, 2),
            "quiet_load": quiet_load, "quiet": now < quiet_load, "cores": os.cpu_count()}


def _aggregate(points: list[dict[str, Any]], pts: tuple[tuple[int, int], ...]) -> list[dict[str, Any]]:
    """Each (batch, context) over its repetitions: the median of the repetitions' p50s and errors."""
    out = []
    for b, c in pts:
        sel = [p for p in points if p["batch"] == b and p["context"] == c]
        row: dict[str, Any] = {"batch": b, "context": c, "reps": len(sel),
                               "load_1min_max": max(p["load_1min"] for p in sel)}
        for key in ("ttft_ms", "tpot_ms"):
            row[key] = {k: statistics.median(p[key][k] for p in sel)
                        for k in ("measured_p50", "predicted_p50", "error_p50") if all(p[key][k] is not None for p in sel)}
            row[key]["worst_rep_error"] = max((p[key]["error_p50"] for p in sel), key=abs)
        out.append(row)
    return out


def run_emulated(points: tuple[tuple[int, int], ...] = POINTS, reps: int = 3, seed: int = 0, quiet_load: float = 3.0,
                 max_wait_s: float = 900.0, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The emulated engine against its own model, and the host's floor, at every point."""
    t0 = time.monotonic()
    host = wait_for_quiet(quiet_load, max_wait_s, log)
    profile = next(p for p in load_llm_profiles() if p.name == PROFILE)
    with tempfile.TemporaryDirectory(prefix="headrace-emulated-") as tmp:
        files = {}
        for name, prof in (("model", profile), ("floor", floor_profile())):
            files[name] = Path(tmp) / f"{name}.yaml"
            files[name].write_text(yaml.safe_dump(llm_profile_to_dict(prof), sort_keys=False))
        # the prediction reads the profile back from the file the server reads
        model_profile, floor = (load_llm_profiles(files[n])[0] for n in ("model", "floor"))
        log(f"emulated engine with {PROFILE}")
        model = _measure(files["model"], model_profile, points, reps, seed, log)
        log("the floor: the same points with steps of 1 ns")
        floor_run = _measure(files["floor"], floor, points, 1, seed + 1, log)
    host["load_at_end"] = round(os.getloadavg()[0], 2)
    summary = _aggregate(model["points"], points)
    errors = [abs(r[k]["error_p50"]) for r in summary for k in ("ttft_ms", "tpot_ms")]
    return {
        "profile": PROFILE, "profile_kind": profile.provenance.kind, "engine": model["engine"], "banner": model["banner"],
        "settings": {"points": [list(p) for p in points], "reps": reps, "max_tokens": MAX_TOKENS,
                     "lead_tokens": LEAD_TOKENS, "lead_gap_ms": LEAD_GAP_S * 1e3, "gpu_memory_utilization": UTILISATION,
                     **SETTINGS, "seed": seed, "target": TARGET, "client": "aiohttp, /v1/completions, token-id prompts"},
        "host": host, "points": model["points"], "summary": summary,
        "floor": [{"batch": p["batch"], "context": p["context"], "ttft_ms_p50": p["ttft_ms"]["measured_p50"],
                   "tpot_ms_p50": p["tpot_ms"]["measured_p50"], "ttft_ms_p90": p["ttft_ms"]["measured_p90"],
                   "tpot_ms_p90": p["tpot_ms"]["measured_p90"], "load_1min": p["load_1min"]} for p in floor_run["points"]],
        "max_abs_error_p50": max(errors), "accepted": max(errors) <= TARGET,
        "elapsed_s": round(time.monotonic() - t0, 1),
    }


def markdown_emulated(e: dict[str, Any]) -> list[str]:
    h, st, eng = e["host"], e["settings"], e["engine"]
    verdict = "met" if e["accepted"] else "NOT met"
    lines = [
        "## Part 2: the emulated engine, live, against its own model", "",
        f"`headrace engine --profile {e['profile']}` ({e['profile_kind']} profile; KV blocks {eng['kv_blocks']}, "
        f"max_num_seqs {eng['max_num_seqs']}, max_num_batched_tokens {eng['max_num_batched_tokens']}, prefix caching "
        f"and chunked prefill on) against the engine model run on the same arrivals in virtual time. Each point: "
        f"a lead request ({st['lead_tokens']}-token prompt, one token), then {st['lead_gap_ms']:.0f} ms later B "
        f"concurrent streams of C-token prompts and {st['max_tokens']} tokens each ({st['client']}); "
        f"{st['reps']} repetitions. Largest |error| of a point's p50 (median over repetitions): "
        f"**{e['max_abs_error_p50']:.1%}** (target <= {st['target']:.0%}: {verdict}).", "",
        f"Host: {h['cores']} cores, shared; 1-minute load {h['load_at_start']} at the start, waited {h['waited_s']:.0f} s "
        f"for it to fall below {h['quiet_load']} ({'it did' if h['quiet'] else 'it did not'}: "
        f"{h['load_when_measured']} when measuring began, {h['load_at_end']} at the end); each point's load is in the "
        "JSON.", "",
        "| B | C | TTFT p50 measured ms | predicted | error | worst rep | TPOT p50 measured ms | predicted | error | "
        "worst rep | load max |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in e["summary"]:
        t, p = r["ttft_ms"], r["tpot_ms"]
        lines.append(f"| {r['batch']} | {r['context']} | {t['measured_p50']:.1f} | {t['predicted_p50']:.1f} | "
                     f"{t['error_p50']:+.1%} | {t['worst_rep_error']:+.1%} | {p['measured_p50']:.2f} | "
                     f"{p['predicted_p50']:.2f} | {p['error_p50']:+.1%} | {p['worst_rep_error']:+.1%} | "
                     f"{r['load_1min_max']:.2f} |")
    lines += ["", "TTFT counts from each request's send, so it carries the host's own time (the floor, below): the "
              "server reading the lead and waking to start its step, on a shared host. TPOT counts between tokens "
              "the engine stamps a step apart, so it does not. The lead's own first token, late while the server "
              "takes in a batch, is in the JSON (`lead_ms`).", "",
              "The host's floor: the same points against a profile whose steps take 1 ns (what is left is the "
              "client's and the server's time):", "",
              "| B | C | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | TPOT p90 ms |", "|---:|---:|---:|---:|---:|---:|"]
    for r in e["floor"]:
        lines.append(f"| {r['batch']} | {r['context']} | {r['ttft_ms_p50']:.2f} | {r['ttft_ms_p90']:.2f} | "
                     f"{r['tpot_ms_p50']:.3f} | {r['tpot_ms_p90']:.3f} |")
    return lines
