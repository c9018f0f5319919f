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
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http.aio as aiohttpclient
import yaml

from bench.gateway_slo import wait_idle
from bench.output import write_results
from loadgen.run import run_load
from loadgen.spec import LoadSpec
from placement.capacity import replica_capacity
from profiles.emulator import write_emulated_model
from profiles.process import exit_on_sigterm, start_serve, stop_group
from profiles.profile import Profile, ProfileSet, save_profiles
from profiles.tritonserver import TritonServer, free_port

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


def write_repo(repo: Path, profs: dict[str, Profile]) -> None:
    """Four replicas, each an emulated 2g.20gb slice of its own (two per emulated GPU)."""
    for i, name in enumerate((f"{VIT}-a", f"{VIT}-b", f"{R50}-a", f"{R50}-b")):
        write_emulated_model(repo, name, profs[name.rsplit("-", 1)[0]], slice_id=f"gpu{i // 2}/{SLICE}@{2 * (i % 2)}")


def gateway_doc(http_port: int, triton_http: str, objective: str, replicas: tuple[str, ...],
                profile_files: dict[str, Path]) -> dict[str, Any]:
    return {"listen": {"http_port": http_port, "grpc_port": free_port()},
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


STEP = ((0.5, 10.0), (4.0, 10.0), (0.5, 10.0))  # (x ViT capacity, seconds): the load step
STEP_WINDOW_S = 1.0
CLIENT_LAG_S = 0.010  # a request the client sent later than this after its schedule: the client stalled


async def load_step(url: str, cap: float, profs: dict[str, Profile], phases=STEP) -> dict[str, Any]:
    """Open-loop Poisson arrivals from tritonclient's asyncio HTTP client at each phase's rate,
    latency counted from each request's scheduled send: per window, attainment (answered OK
    within the SLO) and mean accuracy of the answers."""
    client = aiohttpclient.InferenceServerClient(url, conn_limit=400)
    x = await one_row(client)
    rng = np.random.default_rng(11)
    sched: list[float] = []
    t0 = 0.0
    for load, seconds in phases:
        t = t0
        while True:
            t += rng.exponential(1 / (load * cap))
            if t >= t0 + seconds:
                break
            sched.append(t)
        t0 += seconds
    results: list[tuple[float, bool, str | None, float]] = []  # (scheduled, on time, variant, send lag)

    async def one(at: float, start: float) -> None:
        lag = time.monotonic() - start - at  # the client's own delay before sending
        try:
            r = await client.infer("imagenet", [x])
            variant = variant_of(r.get_response()["parameters"]["headrace_variant"])
            results.append((at, time.monotonic() - start - at <= SLO_MS / 1e3, variant, lag))
        except Exception:  # noqa: BLE001  (a refusal or error: answered, not on time)
            results.append((at, False, None, lag))

    start = time.monotonic()
    tasks = []
    for at in sched:
        delay = start + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(at, start)))
    await asyncio.gather(*tasks)
    await client.close()
    windows = []
    for w in range(int(t0 / STEP_WINDOW_S)):
        rs = [r for r in results if w * STEP_WINDOW_S <= r[0] < (w + 1) * STEP_WINDOW_S]
        served = [r[2] for r in rs if r[2] is not None]
        lags = sorted(r[3] for r in rs)
        windows.append({"t": w * STEP_WINDOW_S, "offered": len(rs),
                        "send_lag_p99_ms": lags[int(0.99 * (len(lags) - 1))] * 1e3 if lags else None,
                        "attainment": sum(r[1] for r in rs) / len(rs) if rs else None,
                        "mean_accuracy": sum(profs[v].accuracy for v in served) / len(served) if served else None})
    # a transition: up to two hysteresis windows (2 x the default dwell, 2 s) after each step
    edges, t = [], 0.0
    for _, seconds in phases[:-1]:
        t += seconds
        edges.append(t)
    steady = [r for r in results if not any(e <= r[0] < e + 4.0 for e in edges)]
    # requests the client itself sent late (it stalled: the machine's floor, not the gateway's)
    prompt = [r for r in steady if r[3] <= CLIENT_LAG_S]
    last = [r[2] for r in results if r[0] >= t0 - 3.0 and r[2] is not None]
    return {"phases": [{"load": load, "seconds": sec} for load, sec in phases], "requests": len(results),
            "windows": windows, "transition_s": 4.0,
            "steady_attainment": sum(r[1] for r in steady) / len(steady) if steady else None,
            "client_late": len(steady) - len(prompt), "client_lag_limit_ms": CLIENT_LAG_S * 1e3,
            "steady_attainment_sent_on_time": sum(r[1] for r in prompt) / len(prompt) if prompt else None,
            "final_mean_accuracy": sum(profs[v].accuracy for v in last) / len(last) if last else None}


async def run(duration: float, warmup: float, loads: tuple[float, ...]) -> dict[str, Any]:
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
    with TritonServer(work / "repo", ready_timeout=120) as triton:
        ports: dict[str, int] = {}
        procs = []
        try:
            for name, (objective, replicas) in SYSTEMS.items():
                hp = ports[name] = free_port()
                cfg = work / f"{name}.yaml"
                cfg.write_text(yaml.safe_dump(gateway_doc(hp, triton.http_url, objective, replicas, files)))
                procs.append(start_serve(cfg, f"127.0.0.1:{hp}", cfg.with_suffix(".log")))
            for hp in ports.values():  # warm every path once
                await point(f"http://127.0.0.1:{hp}", 10, 1.0, 0.5, 99)
            for load in loads:
                rate = load * cap.rate
                for name, hp in ports.items():
                    before = moves(hp)
                    r = await point(f"http://127.0.0.1:{hp}", rate, duration, warmup, 1)
                    after = moves(hp)
                    acc, cost, shares = score(r.pop("per_variant"), profs)
                    r.update(system=name, load=load, rate=rate, mean_accuracy=acc, cost_per_1000=cost,
                             shares=shares, moves={k: after[k] - before.get(k, 0.0) for k in after})
                    out["points"].append(r)
                    print(f"{name:18s} {load:3.1f}x {rate:6.1f}/s  attainment {r['attainment'] or 0:.4f}  "
                          f"accuracy {acc or 0:.4f}  $/1000 {cost or 0:.6f}  shares {shares}", flush=True)
                    r["idle_wait_s"] = await wait_idle(triton.http_url)
            low = loads[0] * cap.rate
            out["tritonclient_floor"] = await tritonclient_floor(
                f"127.0.0.1:{ports['headrace-cost']}", low, max(50, int(low * duration)), profs)
            await wait_idle(triton.http_url)
            out["load_step"] = await load_step(f"127.0.0.1:{ports['headrace-accuracy']}", cap.rate, profs)
        finally:
            for proc in procs:
                stop_group(proc)
    out["targets"] = targets(out)
    return out


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
        out["load_step"] = {"steady_attainment": step["steady_attainment"],
                            "steady_attainment_sent_on_time": step["steady_attainment_sent_on_time"],
                            "final_mean_accuracy": step["final_mean_accuracy"],
                            "met": (step["steady_attainment"] or 0) >= 0.99
                            and abs((step["final_mean_accuracy"] or 0) - top) < 1e-9}
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
        phases = " -> ".join(f"{p['load']:g}x for {p['seconds']:g} s" for p in st["phases"])
        lines += ["", f"Load step on `headrace-accuracy` (tritonclient aio HTTP, open loop, latency from the "
                  f"scheduled send): {phases}, {st['requests']} requests. Per {STEP_WINDOW_S:g} s window:", "",
                  "| t (s) | offered | attainment | mean accuracy | client send lag p99 (ms) |",
                  "|---|---|---|---|---|"]
        for w in st["windows"]:
            lines.append(f"| {w['t']:g} | {w['offered']} | {_f(w['attainment'], '.4f')} | "
                         f"{_f(w['mean_accuracy'], '.4f')} | {_f(w['send_lag_p99_ms'], '.1f')} |")
    t = res.get("targets", {})
    lines += ["", "Targets:"]
    if "at_2x" in t:
        a = t["at_2x"]
        lines.append(f"- at 2x, `headrace-accuracy` attainment {_f(a['attainment'], '.4f')} (>= 0.99) and mean "
                     f"accuracy {_f(a['mean_accuracy'], '.4f')} >= the best fixed variant holding the SLO there "
                     f"({_f(a['best_fixed_holding_slo'], '.4f')}): **{'met' if a['met'] else 'not met'}**")
    if "load_step" in t:
        s2 = t["load_step"]
        lines.append(f"- load step: attainment outside the {st['transition_s']:g} s after each step "
                     f"{_f(s2['steady_attainment'], '.4f')} (>= 0.99; "
                     f"{_f(s2['steady_attainment_sent_on_time'], '.4f')} over the requests the client itself sent "
                     f"within {st['client_lag_limit_ms']:g} ms of their schedule, {st['client_late']} were not), "
                     f"mean accuracy in the last 3 s "
                     f"{_f(s2['final_mean_accuracy'], '.4f')} (back to ViT-B/16's): **{'met' if s2['met'] else 'not met'}**")
    if "at_half_cost" in t:
        c = t["at_half_cost"]
        lines.append(f"- at 0.5x, `headrace-cost` costs {c['ratio_to_always_most_accurate']:.2f}x of always the "
                     f"most accurate (<= 0.6), with {c['tritonclient_below_floor']} answers below the floor: "
                     f"**{'met' if c['met'] else 'not met'}**")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=15.0, help="measured seconds per point")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--quick", action="store_true", help="loads 0.5x and 2x only, 5 s each (a smoke run)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    exit_on_sigterm()
    loads = (0.5, 2.0) if a.quick else LOADS
    res = asyncio.run(run(5.0 if a.quick else a.duration, a.warmup, loads))
    write_results(a.out, "variants", res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
