"""Variant choice under load: attainment, goodput, mean accuracy and cost per 1,000 answers,
headrace's choice against fixed variants, on the same hardware, in the same run.

Setup: the image-classification family of the reference set (MIGPerf, PyTorch, A100-80GB):
``imagenet-vit-b16`` (top-1 0.8107) and ``imagenet-resnet50`` (0.7613), each slice a 2g.20gb
MIG slice of an emulated A100-80GB behind real Triton, max batch 32, SLO 100 ms, Poisson
arrivals at 0.5x, 1x, 2x and 4x the capacity of one ViT-B/16 slice at the SLO. Every system
gets two slices ($1/GPU-hour, so a slice costs 2/7 $/h):

- ``headrace-accuracy``: one ViT-B/16 and one ResNet-50 slice, objective ``accuracy`` (the most
  accurate variant predicted to meet each request's deadline; cheaper under overload);
- ``headrace-cost``: the same slices, objective ``cost`` (the cheapest variant meeting the
  request's accuracy floor and deadline);
- ``fixed-vit-b16``: two ViT-B/16 slices: always the most accurate;
- ``fixed-resnet50``: two ResNet-50 slices.

Load comes from ``headrace load``; at 0.5x the cost objective is also driven by tritonclient
(the client users run) with every request carrying ``headrace_min_accuracy``, and every answer
is checked against the floor.

    .venv/bin/python -m bench.variants [--duration 15] [--quick]

Writes bench/results/variants.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http.aio as aiohttpclient
import yaml

from bench.gateway_slo import wait_idle
from bench.output import write_results
from bench.variants_step import (
    CLIENT_LAG_S,
    STEP,
    STEP_WINDOW_S,
    TRANSITION_S,
    drive,
    read_access_log,
    schedule,
    summarise,
    triton_delta,
    triton_stats,
)
from deploy.gateway_process import start_serve
from loadgen.run import run_load
from loadgen.spec import LoadSpec
from placement.solve.capacity import replica_capacity
from profiles.emulator import write_emulated_model
from profiles.profile import Profile, ProfileSet, save_profiles
from profiles.triton.process import exit_on_sigterm, stop_group
from profiles.triton.server import TritonServer, free_port

RESULTS = Path(__file__).parent / "results"
SLO_MS = 100.0
MAX_BATCH = 32
GPU, SLICE = "A100-80GB", "2g.20gb"
PRICE = 2.0 / 7  # $/h of one 2g.20gb slice (2 of 7 compute slices) of a $1/h A100-80GB
VIT, R50 = "imagenet-vit-b16", "imagenet-resnet50"
LOADS = (0.5, 1.0, 2.0, 4.0)
FLOOR = 0.76  # the cost objective's accuracy floor: ResNet-50 (0.7613) meets it
SYSTEMS = {  # name -> (objective, replicas as Triton model names)
    "headrace-accuracy": ("accuracy", (f"{VIT}-a", f"{R50}-a")),
    "headrace-cost": ("cost", (f"{VIT}-a", f"{R50}-a")),
    "fixed-vit-b16": ("accuracy", (f"{VIT}-a", f"{VIT}-b")),
    "fixed-resnet50": ("accuracy", (f"{R50}-a", f"{R50}-b")),
}


def profiles() -> dict[str, Profile]:
    ref = ProfileSet.reference()
    return {v: ref.get(v, GPU, SLICE).with_max_batch(MAX_BATCH) for v in (VIT, R50)}


def cost_per_answer(p: Profile) -> float:
    """The core's definition: profile seconds per row at full batches x the slice's price."""
    return p.latency(MAX_BATCH) / MAX_BATCH * PRICE / 3600


TRITON_MODELS = (f"{VIT}-a", f"{VIT}-b", f"{R50}-a", f"{R50}-b")


def write_repo(repo: Path, profs: dict[str, Profile]) -> None:
    """Four replicas, each an emulated 2g.20gb slice of its own (two per emulated GPU)."""
    for i, name in enumerate(TRITON_MODELS):
        write_emulated_model(repo, name, profs[name.rsplit("-", 1)[0]], slice_id=f"gpu{i // 2}/{SLICE}@{2 * (i % 2)}")


def gateway_doc(http_port: int, triton_http: str, objective: str, replicas: tuple[str, ...],
                profile_files: dict[str, Path], access_log: Path | None = None) -> dict[str, Any]:
    log = {"access_log": {"enabled": True, "path": str(access_log)}} if access_log else {}
    return {"listen": {"http_port": http_port, "grpc_port": free_port()}, **log,
            "models": [{"name": "imagenet", "slo_ms": SLO_MS, "max_batch": MAX_BATCH, "objective": objective,
                        "replicas": [{"url": triton_http, "variant": r, "price_per_hour": PRICE, "id": r,
                                      "profile": str(profile_files[r.rsplit("-", 1)[0]])} for r in replicas]}]}


def variant_of(triton_model: str) -> str:
    return triton_model.rsplit("-", 1)[0]


def moves(http_port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("headrace_variant_moves{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = float(line.rsplit(" ", 1)[1])
    return out


def moves_since(http_port: int, before: dict[str, float]) -> dict[str, float]:
    """The gateway's variant moves by kind since ``before`` (a :func:`moves` reading)."""
    return {k: v - before.get(k, 0.0) for k, v in moves(http_port).items()}


def score(per_variant: list[dict[str, Any]], profs: dict[str, Profile]) -> tuple[float | None, float | None, dict]:
    """Mean accuracy and cost per 1,000 answers of the answered requests, and the shares."""
    counts = {variant_of(d["variant"]): d["ok"] for d in per_variant if d["variant"] != "-" and d["ok"]}
    total = sum(counts.values())
    if not total:
        return None, None, {}
    acc = sum(n * profs[v].accuracy for v, n in counts.items()) / total
    cost = sum(n * cost_per_answer(profs[v]) for v, n in counts.items()) / total * 1000
    return acc, cost, {v: n / total for v, n in counts.items()}


async def point(target: str, rate: float, duration: float, warmup: float, seed: int) -> dict[str, Any]:
    spec = LoadSpec(target=target, model="imagenet", arrival="poisson", rate=rate, duration_s=duration,
                    warmup_s=warmup, slo_ms=SLO_MS, seed=seed, request_timeout_s=10.0)
    s = (await run_load(spec)).summary
    return {"offered_rps": s["offered_rps"], "attainment": s["attainment"], "goodput_rps": s["goodput_rps"],
            "p99_ms": s["latency_ms"]["p99"], "rejected": s["rejected"], "errors": s["error_count"],
            "offered": s["offered"], "ok": s["ok"], "per_variant": s["per_variant"]}


async def one_row(client: aiohttpclient.InferenceServerClient) -> aiohttpclient.InferInput:
    """One row of zeros for the ``imagenet`` model's input, shaped as its metadata says."""
    inp = (await client.get_model_metadata("imagenet"))["inputs"][0]
    shape = [1 if d == -1 else d for d in inp["shape"]]
    x = aiohttpclient.InferInput(inp["name"], shape, inp["datatype"])
    x.set_data_from_numpy(np.zeros(shape, np.float32))
    return x


async def tritonclient_floor(url: str, rate: float, n: int, profs: dict[str, Profile]) -> dict[str, Any]:
    """``n`` requests at ``rate`` (Poisson) from tritonclient's asyncio HTTP client, each with
    ``headrace_min_accuracy``: which variants answered, and whether each met the floor."""
    client = aiohttpclient.InferenceServerClient(url)
    x = await one_row(client)
    rng = np.random.default_rng(3)
    variants: dict[str, int] = {}
    errors = 0

    async def one() -> None:
        nonlocal errors
        try:
            r = await client.infer("imagenet", [x], parameters={"headrace_min_accuracy": FLOOR})
            v = variant_of(r.get_response()["parameters"]["headrace_variant"])
            variants[v] = variants.get(v, 0) + 1
        except Exception:  # noqa: BLE001  (counted: every request is answered or counted)
            errors += 1

    tasks = []
    t = time.monotonic()
    for _ in range(n):
        t += rng.exponential(1 / rate)
        await asyncio.sleep(max(0.0, t - time.monotonic()))
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    await client.close()
    answered = sum(variants.values())
    below = sum(k for v, k in variants.items() if profs[v].accuracy < FLOOR)
    cost = sum(k * cost_per_answer(profs[v]) for v, k in variants.items()) / max(1, answered) * 1000
    return {"requests": n, "answered": answered, "errors": errors, "variants": variants,
            "below_floor": below, "cost_per_1000": cost}


STEP_SYSTEMS = ("headrace-accuracy", "fixed-resnet50")  # headrace, and the floor: no choice, ample capacity


async def step_run(url: str, triton_http: str, sched: list[float], prefix: str) -> dict[str, Any]:
    """One pass of the load step at the gateway on ``url`` (host:port): what the client saw,
    Triton's work and the gateway's variant moves over it."""
    await wait_idle(triton_http)
    client = aiohttpclient.InferenceServerClient(url, conn_limit=400)
    try:
        x = await one_row(client)
        port = int(url.rsplit(":", 1)[1])
        before, moved = triton_stats(triton_http), moves(port)
        sents = await drive(client, x, sched, prefix)
        moved = moves_since(port, moved)
        after = triton_stats(triton_http)
    finally:
        await client.close()
    return {"sents": sents, "triton": triton_delta(before, after), "moves": moved}


async def run(duration: float, warmup: float, loads: tuple[float, ...], step_repeats: int) -> dict[str, Any]:
    profs = profiles()
    cap = replica_capacity(profs[VIT], SLO_MS / 1e3, max_batch=MAX_BATCH)
    assert cap is not None
    work = Path(tempfile.mkdtemp(prefix="hr-bench-variants-"))
    write_repo(work / "repo", profs)
    files = {}
    for v, p in profs.items():
        files[v] = work / f"{v}.yaml"
        save_profiles(files[v], [p])
    out: dict[str, Any] = {"slo_ms": SLO_MS, "duration_s": duration, "warmup_s": warmup, "gpu": GPU,
                           "slice": SLICE, "price_per_slice_hour": PRICE, "floor": FLOOR,
                           "vit_capacity_rps": cap.rate, "machine": platform.node(), "cpus": os.cpu_count(),
                           "variants": {v: {"accuracy": p.accuracy, "cost_per_1000": cost_per_answer(p) * 1000,
                                            "accuracy_source": p.provenance.accuracy_source}
                                        for v, p in profs.items()},
                           "points": []}
    # the load step's gateways are their own, with access logs (the points' run without)
    systems = {name: SYSTEMS[name] for name in SYSTEMS if loads} | {
        f"step-{name}": SYSTEMS[name] for name in STEP_SYSTEMS if step_repeats}
    runs: list[tuple[str, int, dict[str, Any]]] = []
    sched = schedule(cap.rate, STEP, seed=11)
    with TritonServer(work / "repo", ready_timeout=120) as triton:
        ports: dict[str, int] = {}
        procs = []
        try:
            for name, (objective, replicas) in systems.items():
                hp = ports[name] = free_port()
                cfg = work / f"{name}.yaml"
                log = work / f"{name}.access.jsonl" if name.startswith("step-") else None
                cfg.write_text(yaml.safe_dump(gateway_doc(hp, triton.http_url, objective, replicas, files, log)))
                procs.append(start_serve(cfg, f"127.0.0.1:{hp}", cfg.with_suffix(".log")))
            for hp in ports.values():  # warm every path once
                await point(f"http://127.0.0.1:{hp}", 10, 1.0, 0.5, 99)
            for load in loads:
                rate = load * cap.rate
                for name, hp in ports.items():
                    if name.startswith("step-"):
                        continue
                    before = moves(hp)
                    r = await point(f"http://127.0.0.1:{hp}", rate, duration, warmup, 1)
                    moved = moves_since(hp, before)
                    acc, cost, shares = score(r.pop("per_variant"), profs)
                    r.update(system=name, load=load, rate=rate, mean_accuracy=acc, cost_per_1000=cost,
                             shares=shares, moves=moved)
                    out["points"].append(r)
                    print(f"{name:18s} {load:3.1f}x {rate:6.1f}/s  attainment {r['attainment'] or 0:.4f}  "
                          f"accuracy {acc or 0:.4f}  $/1000 {cost or 0:.6f}  shares {shares}", flush=True)
                    r["idle_wait_s"] = await wait_idle(triton.http_url)
            if loads:
                low = loads[0] * cap.rate
                out["tritonclient_floor"] = await tritonclient_floor(
                    f"127.0.0.1:{ports['headrace-cost']}", low, max(50, int(low * duration)), profs)
            for rep in range(step_repeats):  # interleaved, the first system alternating: drift hits both alike
                for name in STEP_SYSTEMS[::1 if rep % 2 == 0 else -1]:
                    r = await step_run(f"127.0.0.1:{ports[f'step-{name}']}", triton.http_url, sched, f"{rep}-")
                    runs.append((name, rep, r))
                    print(f"load step {name:18s} run {rep}: {len(r['sents'])} requests", flush=True)
        finally:
            for proc in procs:
                stop_group(proc)  # NOTE: stopping a gateway flushes its access log
    if runs:
        out["load_step"] = step_results(runs, work, {m: profs[variant_of(m)].accuracy for m in TRITON_MODELS})
    out["targets"] = targets(out)
    return out


def step_results(runs: list[tuple[str, int, dict[str, Any]]], work: Path,
                 accuracy: dict[str, float]) -> dict[str, Any]:
    """Each run summarised with its access log, and each system's runs pooled."""
    out: dict[str, Any] = {"phases": [{"load": load, "seconds": sec} for load, sec in STEP],
                           "transition_s": TRANSITION_S, "client_lag_limit_ms": CLIENT_LAG_S * 1e3,
                           "window_s": STEP_WINDOW_S, "systems": {}}
    for name in STEP_SYSTEMS:
        mine = [(rep, r) for n, rep, r in runs if n == name]
        logs = [read_access_log(work / f"step-{name}.access.jsonl", f"{rep}-") for rep, _ in mine]
        each = []
        for (rep, r), log in zip(mine, logs, strict=True):
            s = summarise(r["sents"], log, STEP, accuracy, SLO_MS / 1e3)
            each.append(s | {"run": rep, "triton": r["triton"], "moves": r["moves"]})
        out["systems"][name] = {"runs": each, "pooled": pool(each)}
    return out


def pool(each: list[dict[str, Any]]) -> dict[str, Any]:
    """Attainment over all runs' steady requests (weighted by requests), the worst run's, and
    misses summed."""
    def weighted(key: str, n_key: str) -> float | None:
        pairs = [(r[key], r[n_key]) for r in each if r[key] is not None]
        n = sum(k for _, k in pairs)
        return sum(a * k for a, k in pairs) / n if n else None

    misses: Counter = Counter()
    for r in each:
        misses.update(r["steady_misses"])
    return {"runs": len(each), "steady_attainment": weighted("steady_attainment", "steady_requests"),
            "steady_attainment_sent_on_time": weighted("steady_attainment_sent_on_time", "steady_prompt"),
            "worst_run_steady_attainment": min((r["steady_attainment"] or 0 for r in each), default=None),
            "steady_misses": dict(misses), "client_late": sum(r["client_late"] for r in each),
            "final_mean_accuracy": min((r["final_mean_accuracy"] or 0 for r in each), default=None)}


def _pt(points: list[dict], system: str, load: float) -> dict | None:
    return next((p for p in points if p["system"] == system and p["load"] == load), None)


def targets(res: dict[str, Any]) -> dict[str, Any]:
    pts = res["points"]
    out: dict[str, Any] = {}
    hr = _pt(pts, "headrace-accuracy", 2.0)
    if hr is not None:
        holding = [p for s in ("fixed-vit-b16", "fixed-resnet50") if (p := _pt(pts, s, 2.0))
                   and (p["attainment"] or 0) >= 0.99]
        best_fixed = max((p["mean_accuracy"] or 0 for p in holding), default=None)
        out["at_2x"] = {"attainment": hr["attainment"], "mean_accuracy": hr["mean_accuracy"],
                        "best_fixed_holding_slo": best_fixed,
                        "met": (hr["attainment"] or 0) >= 0.99 and (best_fixed is None or
                                                                   (hr["mean_accuracy"] or 0) >= best_fixed)}
    step = res.get("load_step")
    if step:
        top = res["variants"][VIT]["accuracy"]
        hr, fl = (step["systems"][n]["pooled"] for n in STEP_SYSTEMS)
        back = hr["final_mean_accuracy"] is not None and abs(hr["final_mean_accuracy"] - top) < 1e-9
        gap = (fl["steady_attainment"] or 0) - (hr["steady_attainment"] or 0)
        out["load_step"] = {"steady_attainment": hr["steady_attainment"],
                            "steady_attainment_sent_on_time": hr["steady_attainment_sent_on_time"],
                            "final_mean_accuracy": hr["final_mean_accuracy"],
                            "floor_steady_attainment": fl["steady_attainment"], "cost_of_choice": gap,
                            "met": (hr["steady_attainment"] or 0) >= 0.99 and back,
                            # variant choice itself loses at most the 1% the target allows
                            "met_against_floor": gap <= 0.01 and back}
    cost, top = _pt(pts, "headrace-cost", 0.5), _pt(pts, "fixed-vit-b16", 0.5)
    tc = res.get("tritonclient_floor")
    if cost and top and cost["cost_per_1000"] and top["cost_per_1000"]:
        ratio = cost["cost_per_1000"] / top["cost_per_1000"]
        out["at_half_cost"] = {"ratio_to_always_most_accurate": ratio,
                               "tritonclient_below_floor": None if tc is None else tc["below_floor"],
                               "met": ratio <= 0.6 and (tc is None or tc["below_floor"] == 0)}
    return out


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "# Variant choice under load", "",
        f"Emulated A100-80GB {res['slice']} slices behind real Triton, max batch {MAX_BATCH}, SLO "
        f"{res['slo_ms']:g} ms, Poisson arrivals, {res['duration_s']:g} s measured per point (`headrace load`). "
        f"Load is a multiple of one ViT-B/16 slice's capacity at the SLO ({res['vit_capacity_rps']:.1f} req/s). "
        f"Every system has two slices at {res['price_per_slice_hour']:.4f} $/h each.", "",
        "| variant | top-1 | $ per 1,000 answers | accuracy source |", "|---|---|---|---|"]
    for v, d in res["variants"].items():
        lines.append(f"| {v} | {d['accuracy']:.4f} | {d['cost_per_1000']:.6f} | {d['accuracy_source']} |")
    lines += ["", "| load | system | attainment | goodput req/s | mean accuracy | $ per 1,000 | shares | "
              "level moves (down/up/late) |", "|---|---|---|---|---|---|---|---|"]
    for p in res["points"]:
        shares = ", ".join(f"{k.removeprefix('imagenet-')} {v:.0%}" for k, v in sorted(p["shares"].items()))
        m = p.get("moves", {})
        lines.append(f"| {p['load']:.1f}x ({p['rate']:.0f}/s) | {p['system']} | {_f(p['attainment'], '.4f')} | "
                     f"{p['goodput_rps']:.1f} | {_f(p['mean_accuracy'], '.4f')} | {_f(p['cost_per_1000'], '.6f')} | "
                     f"{shares} | {m.get('down', 0):.0f}/{m.get('up', 0):.0f}/{m.get('late', 0):.0f} |")
    tc = res.get("tritonclient_floor")
    if tc:
        lines += ["", f"tritonclient (aio HTTP), `headrace-cost` at 0.5x, every request with "
                  f"`headrace_min_accuracy={res['floor']}`: {tc['answered']}/{tc['requests']} answered, "
                  f"{tc['errors']} errors, variants {tc['variants']}, {tc['below_floor']} below the floor, "
                  f"{tc['cost_per_1000']:.6f} $ per 1,000."]
    st = res.get("load_step")
    if st:
        lines += step_markdown(st)
    t = res.get("targets", {})
    lines += ["", "Targets:"]
    if "at_2x" in t:
        a = t["at_2x"]
        lines.append(f"- at 2x, `headrace-accuracy` attainment {_f(a['attainment'], '.4f')} (>= 0.99) and mean "
                     f"accuracy {_f(a['mean_accuracy'], '.4f')} >= the best fixed variant holding the SLO there "
                     f"({_f(a['best_fixed_holding_slo'], '.4f')}): **{'met' if a['met'] else 'not met'}**")
    if "load_step" in t:
        s2 = t["load_step"]
        verdict = "met" if s2["met"] else "not met"
        floor_verdict = "met" if s2["met_against_floor"] else "not met"
        lines.append(f"- load step: `headrace-accuracy`'s attainment outside the {st['transition_s']:g} s after "
                     f"each step {_f(s2['steady_attainment'], '.4f')} over all runs (>= 0.99: **{verdict}**; "
                     f"{_f(s2['steady_attainment_sent_on_time'], '.4f')} over the requests the client sent within "
                     f"{st['client_lag_limit_ms']:g} ms of their schedule). The floor, the same step and client on "
                     f"two ResNet-50 slices with no variant choice: {_f(s2['floor_steady_attainment'], '.4f')}; "
                     f"variant choice costs {_f(s2['cost_of_choice'] * 100, '.2f')} points of attainment "
                     f"(<= 1 point: **{floor_verdict}**). Mean accuracy in the last 3 s "
                     f"{_f(s2['final_mean_accuracy'], '.4f')} (back to ViT-B/16's)")
    if "at_half_cost" in t:
        c = t["at_half_cost"]
        lines.append(f"- at 0.5x, `headrace-cost` costs {c['ratio_to_always_most_accurate']:.2f}x of always the "
                     f"most accurate (<= 0.6), with {c['tritonclient_below_floor']} answers below the floor: "
                     f"**{'met' if c['met'] else 'not met'}**")
    return "\n".join(lines) + "\n"


def step_markdown(st: dict[str, Any]) -> list[str]:
    phases = " -> ".join(f"{p['load']:g}x for {p['seconds']:g} s" for p in st["phases"])
    systems = st["systems"]
    names = list(systems)
    n_runs = max(len(v["runs"]) for v in systems.values())
    first = next(iter(systems.values()))["runs"][0]
    lines = ["", "## Load step", "",
             f"tritonclient aio HTTP, open loop, latency from the scheduled send: {phases} "
             f"({first['requests']} requests, one schedule), {n_runs} runs per system, interleaved. "
             f"`{names[0]}` (ViT-B/16 + ResNet-50 slices, objective accuracy) against the floor `{names[1]}` "
             "(two ResNet-50 slices: no variant choice, ample capacity at 4x), each on its own gateway with "
             "the access log on, so every miss is placed: `refused` (the gateway said 429/503), `late in "
             "gateway` (its own time from reading the request to answering it passed the SLO), `late outside` "
             "(the gateway answered within the SLO and the client saw it late: its send lag, loopback, "
             "parsing), `error`.", "",
             "| system | run | attainment outside transitions | sent on time | refused / late in gateway / "
             "late outside / error | sent > 10 ms late | level moves (down/up/late) |",
             "|---|---|---|---|---|---|---|"]
    def row(name: str, run: str, r: dict[str, Any], attainment: str, moved: str) -> str:
        m = r["steady_misses"]
        return (f"| {name} | {run} | {attainment} | {_f(r['steady_attainment_sent_on_time'], '.4f')} | "
                f"{m.get('refused', 0)} / {m.get('late_in_gateway', 0)} / {m.get('late_outside', 0)} / "
                f"{m.get('error', 0)} | {r['client_late']} | {moved}{' ' if moved else ''}|")

    for name, d in systems.items():
        for r in d["runs"]:
            mv = r["moves"]
            lines.append(row(name, str(r["run"]), r, _f(r["steady_attainment"], ".4f"),
                             f"{mv.get('down', 0):.0f}/{mv.get('up', 0):.0f}/{mv.get('late', 0):.0f}"))
        lines.append(row(name, "all", d["pooled"], f"**{_f(d['pooled']['steady_attainment'], '.4f')}**", ""))
    lines += ["", "At 4x outside the transition, by Triton model that served it (refusals under `-`): "
              "requests, misses, the gateway's own time and the client's, p50 / p99 (ms):", "",
              "| system | run | served by | requests | misses | gateway ms | client ms |", "|---|---|---|---|---|---|---|"]
    for name, d in systems.items():
        for r in d["runs"]:
            for v, x in sorted(r["high_by_variant"].items()):
                miss = ", ".join(f"{k} {n}" for k, n in sorted(x["misses"].items())) or "0"
                lines.append(f"| {name} | {r['run']} | {v} | {x['requests']} | {miss} | "
                             f"{_f(x['gateway_ms_p50'], '.1f')} / {_f(x['gateway_ms_p99'], '.1f')} | "
                             f"{_f(x['client_ms_p50'], '.1f')} / {_f(x['client_ms_p99'], '.1f')} |")
    lines += ["", "Triton's own statistics over each run (per Triton model: executions, rows per execution, "
              "queue and compute ms per execution):", "",
              "| system | run | Triton model | executions | rows / execution | queue ms | compute ms |",
              "|---|---|---|---|---|---|---|"]
    for name, d in systems.items():
        for r in d["runs"]:
            for model, x in sorted(r["triton"].items()):
                lines.append(f"| {name} | {r['run']} | {model} | {x['executions']:.0f} | {x['rows_per_batch']:.2f} | "
                             f"{x['queue_ms_per_batch']:.2f} | {x['compute_ms_per_batch']:.1f} |")
    lines += ["", f"Per {st['window_s']:g} s window, each run's attainment (`{names[0]}` | `{names[1]}`), "
              f"`{names[0]}`'s mean accuracy (first run) and the worst client send lag p99 of any run:", "",
              f"| t (s) | offered | {names[0]} | {names[1]} | mean accuracy | send lag p99 (ms) |",
              "|---|---|---|---|---|---|"]
    for k, w in enumerate(first["windows"]):
        cols = [" ".join(_f(r["windows"][k]["attainment"], ".3f") for r in systems[n]["runs"]) for n in names]
        lag = max((r["windows"][k]["send_lag_p99_ms"] or 0.0) for d in systems.values() for r in d["runs"])
        lines.append(f"| {w['t']:g} | {w['offered']} | {cols[0]} | {cols[1]} | {_f(w['mean_accuracy'], '.4f')} | "
                     f"{lag:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=15.0, help="measured seconds per point")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--quick", action="store_true", help="loads 0.5x and 2x only, 5 s each (a smoke run)")
    ap.add_argument("--step-runs", type=int, default=3,
                    help="runs of the load step per system (headrace and the floor, interleaved); 0: none")
    ap.add_argument("--only-step", action="store_true", help="the load step alone, no load points")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    if a.step_runs < 0 or (a.only_step and a.step_runs == 0):
        ap.error(f"--step-runs ({a.step_runs}) must be >= 0, and >= 1 with --only-step")
    exit_on_sigterm()
    loads = () if a.only_step else (0.5, 2.0) if a.quick else LOADS
    res = asyncio.run(run(5.0 if a.quick else a.duration, a.warmup, loads, a.step_runs))
    write_results(a.out, "variants", res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
