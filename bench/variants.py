"""Variant choice under load: attainment, floors met, mean accuracy and the cost the answers
measurably used, headrace's choice against fixed variants and INFaaS's choice, on the same
hardware, in the same run.

Setup: the image-classification family of the reference set (MIGPerf, PyTorch, A100-80GB):
``imagenet-vit-b16`` (top-1 0.8107) and ``imagenet-resnet50`` (0.7613), each slice a 2g.20gb
MIG slice of an emulated A100-80GB behind real Triton, max batch 32, SLO 100 ms, Poisson
arrivals at 0.5x, 1x, 2x and 4x the capacity of one ViT-B/16 slice at the SLO. Every request
carries its own accuracy floor, a mix no single cheap variant meets (:mod:`bench.variants_mix`).
Every system gets two slices ($1/GPU-hour, so a slice costs 2/7 $/h):

- ``headrace-accuracy``: one ViT-B/16 and one ResNet-50 slice, objective ``accuracy`` (the most
  accurate allowed variant predicted to meet each request's deadline; cheaper under overload);
- ``headrace-cost``: the same slices, objective ``cost`` (the cheapest variant meeting the
  request's accuracy floor and predicted to meet its deadline);
- ``infaas``: the same slices, objective ``infaas`` (INFaaS's choice: the cheapest variant meeting
  the floor and, by profile, the SLO that is not overloaded; no admission by prediction;
  ``gateway.policy.selector``);
- ``fixed-vit-b16``: two ViT-B/16 slices: always the most accurate;
- ``fixed-resnet50``: two ResNet-50 slices.

Cost is measured: Triton's busy seconds per model x the slice's price, per 1,000 answers.

    .venv/bin/python -m bench.variants [--duration 15] [--quick]

Writes bench/results/variants.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http.aio as aiohttpclient
import yaml

from bench.gateway_slo import wait_idle
from bench.output import git_commit, write_results
from bench.variants_mix import HIGH_FLOOR, HIGH_SHARE, LOW_FLOOR, busy_cost, floors, score
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
SYSTEMS = {  # name -> (objective, replicas as Triton model names)
    "headrace-accuracy": ("accuracy", (f"{VIT}-a", f"{R50}-a")),
    "headrace-cost": ("cost", (f"{VIT}-a", f"{R50}-a")),
    "infaas": ("infaas", (f"{VIT}-a", f"{R50}-a")),
    "fixed-vit-b16": ("accuracy", (f"{VIT}-a", f"{VIT}-b")),
    "fixed-resnet50": ("accuracy", (f"{R50}-a", f"{R50}-b")),
}


def profiles() -> dict[str, Profile]:
    ref = ProfileSet.reference()
    return {v: ref.get(v, GPU, SLICE).with_max_batch(MAX_BATCH) for v in (VIT, R50)}


def cost_per_answer(p: Profile) -> float:
    """The core's definition, the order the cost objective tries variants in (not what a point
    used): profile seconds per row at full batches x the slice's price."""
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


async def point(url: str, triton_http: str, rate: float, duration: float, warmup: float, seed: int,
                send_floors: bool) -> dict[str, Any]:
    """Poisson at ``rate`` for ``warmup + duration`` seconds from tritonclient's asyncio HTTP
    client, each request with its floor of the mix (sent only where ``send_floors``): what the
    client saw, and what each Triton model did (its statistics before and after)."""
    sched = schedule(rate, ((1.0, warmup + duration),), seed=seed)
    floor_of = floors(len(sched), seed + 1)
    params = [{"headrace_min_accuracy": f} for f in floor_of] if send_floors else None
    client = aiohttpclient.InferenceServerClient(url, conn_limit=400)
    try:
        x = await one_row(client)
        before = triton_stats(triton_http)
        sents = await drive(client, x, sched, f"{seed}-", params)
        after = triton_stats(triton_http)
    finally:
        await client.close()
    return {"sents": sents, "floors": floor_of, "triton": triton_delta(before, after)}


async def one_row(client: aiohttpclient.InferenceServerClient) -> aiohttpclient.InferInput:
    """One row of zeros for the ``imagenet`` model's input, shaped as its metadata says."""
    inp = (await client.get_model_metadata("imagenet"))["inputs"][0]
    shape = [1 if d == -1 else d for d in inp["shape"]]
    x = aiohttpclient.InferInput(inp["name"], shape, inp["datatype"])
    x.set_data_from_numpy(np.zeros(shape, np.float32))
    return x


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


def recorded_command(argv: list[str]) -> str:
    """The command as run, less ``--out`` (where the results go changes none of them)."""
    keep = [x for i, x in enumerate(argv) if x != "--out" and not x.startswith("--out=")
            and not (i and argv[i - 1] == "--out")]
    return " ".join([".venv/bin/python -m bench.variants", *keep])


async def run(duration: float, warmup: float, loads: tuple[float, ...], step_repeats: int,
              command: str = "") -> dict[str, Any]:
    profs = profiles()
    cap = replica_capacity(profs[VIT], SLO_MS / 1e3, max_batch=MAX_BATCH)
    assert cap is not None
    work = Path(tempfile.mkdtemp(prefix="hr-bench-variants-"))
    write_repo(work / "repo", profs)
    files = {}
    for v, p in profs.items():
        files[v] = work / f"{v}.yaml"
        save_profiles(files[v], [p])
    out: dict[str, Any] = {"commit": git_commit(), "command": command,
                           "slo_ms": SLO_MS, "duration_s": duration, "warmup_s": warmup, "gpu": GPU,
                           "slice": SLICE, "price_per_slice_hour": PRICE,
                           "floor_mix": {"high": HIGH_FLOOR, "low": LOW_FLOOR, "high_share": HIGH_SHARE,
                                         "sent_to": [n for n in SYSTEMS if not n.startswith("fixed-")]},
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
            for name, hp in ports.items():  # warm every path once
                await point(f"127.0.0.1:{hp}", triton.http_url, 10, 1.0, 0.0, 99, not name.startswith("fixed-"))
            accuracy = {m: profs[variant_of(m)].accuracy for m in TRITON_MODELS}
            for load in loads:
                rate = load * cap.rate
                for name, hp in ports.items():
                    if name.startswith("step-"):
                        continue
                    await wait_idle(triton.http_url)
                    before = moves(hp)
                    raw = await point(f"127.0.0.1:{hp}", triton.http_url, rate, duration, warmup, 1,
                                      not name.startswith("fixed-"))
                    r = score(raw["sents"], raw["floors"], warmup, accuracy, SLO_MS / 1e3,
                              {m: variant_of(m) for m in TRITON_MODELS})
                    used = busy_cost(raw["triton"], PRICE)
                    r.update(system=name, load=load, rate=rate, moves=moves_since(hp, before), triton=raw["triton"],
                             busy_s_total=used["busy_s_total"], rows=used["rows"],
                             cost_per_1000=used["cost_per_1000"], busy_slices=used["busy_s_total"] / (warmup + duration))
                    out["points"].append(r)
                    print(f"{name:18s} {load:3.1f}x {rate:6.1f}/s  attainment {r['attainment'] or 0:.4f}  "
                          f"misses {r['misses']} (high floor {r['high_floor_misses']})  accuracy {r['mean_accuracy'] or 0:.4f}  "
                          f"busy $/1000 {r['cost_per_1000'] or 0:.6f}  shares {r['shares']}", flush=True)
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
    # measured cost: where always-ViT holds the SLO and every floor, what the cost objective
    # uses per answer against it, and whether it holds them too
    loads = sorted({p["load"] for p in pts})
    rows = []
    for load in loads:
        hc, top = _pt(pts, "headrace-cost", load), _pt(pts, "fixed-vit-b16", load)
        if hc and top and (top["attainment"] or 0) >= 0.99 and hc["cost_per_1000"] and top["cost_per_1000"]:
            rows.append({"load": load, "ratio": hc["cost_per_1000"] / top["cost_per_1000"],
                         "attainment": hc["attainment"], "below_floor": hc["below_floor"],
                         "met": (hc["attainment"] or 0) >= 0.99 and hc["below_floor"] == 0
                         and hc["cost_per_1000"] / top["cost_per_1000"] <= 0.6})
    if rows:
        out["measured_cost"] = {"loads": rows, "met": all(r["met"] for r in rows)}
    versus = [{"load": load, **{f"{k}_{n}": p[k] for n in ("cost", "infaas")
                                if (p := _pt(pts, f"headrace-{n}" if n == "cost" else n, load))
                                for k in ("attainment", "cost_per_1000", "below_floor")}}
              for load in loads]
    if any("attainment_infaas" in v for v in versus):
        out["versus_infaas"] = versus
    return out


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "# Variant choice under load", "",
        f"Emulated A100-80GB {res['slice']} slices behind real Triton, max batch {MAX_BATCH}, SLO "
        f"{res['slo_ms']:g} ms, Poisson arrivals from tritonclient (aio HTTP, open loop, latency from the "
        f"scheduled send), {res['duration_s']:g} s measured per point after {res['warmup_s']:g} s of warm-up. "
        f"Load is a multiple of one ViT-B/16 slice's capacity at the SLO ({res['vit_capacity_rps']:.1f} req/s). "
        f"Every system has two slices at {res['price_per_slice_hour']:.4f} $/h each. Commit {res['commit']}.", ""]
    mix = res["floor_mix"]
    lines += [f"Floor mix: {mix['high_share']:.0%} of requests carry `headrace_min_accuracy={mix['high']:g}` "
              f"(only ViT-B/16 meets it), the rest `{mix['low']:g}` (ResNet-50 meets it too); the floors are sent "
              f"to {', '.join(f'`{n}`' for n in mix['sent_to'])}; a fixed system has no choice and is sent none. "
              "Every answer is checked against its own request's floor: one below it is a miss (`below floor`), "
              "counted apart from late ones. Attainment: answered within the SLO by a variant meeting the floor.", "",
              "Cost is measured: the seconds each Triton model spent computing batches (Triton's `compute_infer` "
              "statistics over the point, warm-up included: the emulated slice's busy time) x the slice's price, "
              "per 1,000 answers Triton gave over the same span. Idle slice time is not in it; every system "
              "holds the same two slices, so it saves money only where the idle time is given to other work. "
              "`busy slices`: busy slice-seconds per second (out of 2). The profile figure below is what the "
              "cost objective orders variants by (profile seconds per row at full batches x price), not a "
              "measurement.", "",
              "| variant | top-1 | profile $ per 1,000 at full batches | accuracy source |", "|---|---|---|---|"]
    for v, d in res["variants"].items():
        lines.append(f"| {v} | {d['accuracy']:.4f} | {d['cost_per_1000']:.6f} | {d['accuracy_source']} |")
    lines += ["", "| load | system | attainment | below floor | refused / late / error | mean accuracy | busy slices "
              "| measured $ per 1,000 | shares | level moves (down/up/late) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in res["points"]:
        shares = ", ".join(f"{k.removeprefix('imagenet-')} {v:.0%}" for k, v in sorted(p["shares"].items()))
        m, miss = p.get("moves", {}), p["misses"]
        lines.append(f"| {p['load']:.1f}x ({p['rate']:.0f}/s) | {p['system']} | {_f(p['attainment'], '.4f')} | "
                     f"{p['below_floor']} | {miss.get('refused', 0)} / {miss.get('late', 0)} / {miss.get('error', 0)} | "
                     f"{_f(p['mean_accuracy'], '.4f')} | {p['busy_slices']:.2f} | {_f(p['cost_per_1000'], '.6f')} | "
                     f"{shares} | {m.get('down', 0):.0f}/{m.get('up', 0):.0f}/{m.get('late', 0):.0f} |")
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
    if "measured_cost" in t:
        c = t["measured_cost"]
        each = "; ".join(f"{r['load']:g}x: {r['ratio']:.2f}x, attainment {_f(r['attainment'], '.4f')}, "
                         f"{r['below_floor']} below the floor" for r in c["loads"])
        lines.append(f"- where `fixed-vit-b16` holds the SLO and every floor, `headrace-cost`'s measured cost per "
                     f"answer against it (<= 0.6x, every floor met, >= 0.99 in SLO): {each}: "
                     f"**{'met' if c['met'] else 'not met'}**")
    elif res["points"]:
        lines.append("- measured cost: `fixed-vit-b16` holds the SLO at no load, so there is no comparison: **not met**")
    if "versus_infaas" in t:
        each = "; ".join(f"{v['load']:g}x: {_f(v.get('attainment_cost'), '.4f')} vs {_f(v.get('attainment_infaas'), '.4f')} "
                         f"in SLO, {_f(v.get('cost_per_1000_cost'), '.6f')} vs {_f(v.get('cost_per_1000_infaas'), '.6f')} $"
                         for v in t["versus_infaas"])
        lines.append(f"- `headrace-cost` against `infaas` (INFaaS's choice on the same slices; no target): {each}")
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
    res = asyncio.run(run(5.0 if a.quick else a.duration, a.warmup, loads, a.step_runs,
                          recorded_command(sys.argv[1:] if argv is None else argv)))
    write_results(a.out, "variants", res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
