"""Simulator fidelity: the same seeded arrivals through the live stack and through ``headrace sim``.

Live: ``headrace serve`` (default scheduler) in front of one CPU Triton whose models are
emulated GPUs (ResNet-50 on A100-80GB 1g.10gb, max batch 32, SLO 100 ms) behind one emulated
GPU's arbiter, driven open-loop by ``headrace load``'s own ``run_load``. Simulated: the same
gateway config read as ``headrace sim -f`` reads it (:func:`loadgen.sim.fleet.load_fleet`) and
the same :class:`~loadgen.spec.LoadSpec` (so the same seeded arrivals) through
:func:`loadgen.sim.run.run_sim`.

Cases (capacity = the planner's :func:`placement.solve.capacity.replica_capacity` at the SLO):

- one replica, Poisson and Gamma CV=4, at 50%, 90% and 110% of capacity;
- ``mig-pair``: two models on two MIG slices of one emulated GPU, each at 90%;
- ``mps-pair``: two models sharing one slice under MPS at half the slice each (the gateway and
  the simulator see the planner's rendered profile at that share), each at 90% (run last).

Each live case runs ``--repeats`` times (default 3) in the same run, all cases of one round
before the next, so the live stack's own spread is measured beside the difference. The
simulator's model of what a request costs beyond its profile is measured in the same run
from what the gateway itself learns: its ``headrace_replica_run_excess_seconds`` (how much
longer than its profile a batch holds the replica: Triton's and the arbiter's per-batch cost the
emulator does not cancel) becomes the simulated per-batch ``overhead`` of that layout's
replicas, and the rest of what lone requests at a low rate take beyond the profile
(``calibrate``: client, HTTP, the gateway's own path) is charged half each way between the
gateway and its replica (``transit``).

Target: each of p50, p99 and goodput within 10% of the live mean, attainment within 1 point,
or within the live spread (max - min of the repeats) where that is larger.

    flock /tmp/headrace-bench.lock .venv/bin/python -m bench.sim_fidelity [--duration 20] [--only mps-pair]

Writes bench/results/sim_fidelity.{json,md}; ``--only`` re-runs the named cases and keeps the
other cases of the existing result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.gateway_slo import wait_idle
from bench.host import cpu_times, steal_share
from bench.output import write_results
from deploy.gateway_process import start_serve
from loadgen.run import run_load
from loadgen.sim.fleet import load_fleet
from loadgen.sim.run import SimOptions, run_sim
from loadgen.spec import LoadSpec
from placement.apply.render import Endpoint, replica_profile
from placement.solve.capacity import replica_capacity
from profiles.emulator import EmulatedGpu, write_emulated_model
from profiles.profile import Profile, ProfileSet, save_profiles
from profiles.triton.process import exit_on_sigterm, stop_group
from profiles.triton.server import TritonServer, free_port

RESULTS = Path(__file__).parent / "results"
GPU, SLICE, SLO_MS, MAX_BATCH, MPS_SHARE = "A100-80GB", "1g.10gb", 100.0, 32, 0.5
REL_TOL, ATTAIN_TOL = 0.10, 0.01
METRICS = ("p50_ms", "p99_ms", "attainment", "goodput_rps")


@dataclass(frozen=True)
class Case:
    name: str
    layout: str  # "single", "mig" or "mps": which gateway serves it
    arrival: str
    load: float  # fraction of capacity, per model


CASES = (
    *(Case(f"{a}-{int(f * 100)}", "single", a, f) for a in ("poisson", "gamma") for f in (0.5, 0.9, 1.1)),
    Case("mig-pair", "mig", "poisson", 0.9),
    Case("mps-pair", "mps", "poisson", 0.9),
)
MODELS = {"single": ("resnet50",), "mig": ("a", "b"), "mps": ("a", "b")}


def slice_profile() -> Profile:
    return ProfileSet.reference().get("resnet50", GPU, SLICE).with_max_batch(MAX_BATCH)


def mps_profile() -> Profile:
    """What the planner predicts for a replica holding MPS_SHARE of the slice (render's own)."""
    e = Endpoint("x", "a", "resnet50", "gpu0", f"{SLICE}@0", MPS_SHARE, MAX_BATCH, 0.0, "x:1", "x:1")
    return replica_profile(ProfileSet.reference(), GPU, e)


def capacity(layout: str) -> float:
    """Requests per second one model of ``layout`` sustains at the SLO (the planner's rule)."""
    share = MPS_SHARE if layout == "mps" else 1.0
    cap = replica_capacity(slice_profile(), SLO_MS / 1e3, share)
    if cap is None:
        raise RuntimeError("the reference profile cannot meet the SLO")
    return cap.rate


def write_repo(repo: Path, arbiter: str) -> None:
    prof = slice_profile()
    common = {"arbiter": arbiter}
    write_emulated_model(repo, "single", prof, slice_id=f"gpu0/{SLICE}@0", **common)
    write_emulated_model(repo, "mig-a", prof, slice_id=f"gpu1/{SLICE}@0", client="mig-a", **common)
    write_emulated_model(repo, "mig-b", prof, slice_id=f"gpu1/{SLICE}@1", client="mig-b", **common)
    for m in ("a", "b"):
        write_emulated_model(repo, f"mps-{m}", prof, slice_id=f"gpu2/{SLICE}@0", mode="mps", share=MPS_SHARE,
                             client=f"mps-{m}", **common)


def gateway_config(layout: str, http_port: int, triton_http: str, profiles: dict[str, Path]) -> dict[str, Any]:
    """``headrace serve`` YAML for ``layout``; ``headrace sim -f`` reads the same file."""
    prof = profiles["mps" if layout == "mps" else "slice"]
    models = []
    for m in MODELS[layout]:
        variant = "single" if layout == "single" else f"{layout}-{m}"
        models.append({"name": m, "slo_ms": SLO_MS, "max_batch": MAX_BATCH, "replicas": [
            {"id": variant, "url": triton_http, "protocol": "http", "variant": variant, "profile": str(prof)}]})
    return {"listen": {"http_port": http_port, "grpc_port": free_port()}, "models": models}


def spec_of(case: Case, target: str, duration: float, warmup: float, seed: int) -> LoadSpec:
    models = MODELS[case.layout]
    rate = case.load * capacity(case.layout) * len(models)
    mix = ",".join(f"{m}:1" for m in models) if len(models) > 1 else None
    return LoadSpec(target=target, model=models[0] if mix is None else "", mix=mix, arrival=case.arrival,
                    rate=rate, cv=4.0 if case.arrival == "gamma" else 1.0, duration_s=duration,
                    warmup_s=warmup, slo_ms=SLO_MS, seed=seed, request_timeout_s=10.0)


def point(s: dict[str, Any]) -> dict[str, Any]:
    """The compared numbers of one summary (live or simulated)."""
    out = {"p50_ms": s["latency_ms"]["p50"], "p99_ms": s["latency_ms"]["p99"], "attainment": s["attainment"],
           "goodput_rps": s["goodput_rps"], "offered": s["offered"], "good": s["good"],
           "rejected": s["rejected"], "expired": s.get("expired", 0)}
    if len(s.get("per_model", {})) > 1:
        out["per_model"] = {m: {"p50_ms": v["latency_ms"]["p50"], "p99_ms": v["latency_ms"]["p99"],
                                "attainment": v["attainment"], "goodput_rps": v["goodput_rps"]}
                            for m, v in s["per_model"].items()}
    return out


def simulate(cfg_path: Path, spec: LoadSpec, opts: SimOptions) -> dict[str, Any]:
    fleet = load_fleet([cfg_path])
    summary, _ = run_sim(fleet, spec, opts)
    p = point(summary)
    p["mean_batch"] = summary["sim"]["mean_batch"]
    p["overhead_ms"], p["transit_ms"] = opts.overhead * 1e3, opts.transit * 1e3
    return p


def compare(live: list[dict[str, Any]], sim: dict[str, Any]) -> dict[str, Any]:
    """Per metric: live mean and spread, the simulated value, the difference, the tolerance
    (10% of the live mean, 1 point of attainment, or the spread where larger) and whether it holds."""
    out: dict[str, Any] = {}
    for k in METRICS:
        vals = [p[k] for p in live if p[k] is not None]
        if not vals or sim[k] is None:
            out[k] = {"live": None, "sim": sim[k], "pass": False}
            continue
        mean, spread = statistics.fmean(vals), max(vals) - min(vals)
        base = ATTAIN_TOL if k == "attainment" else REL_TOL * abs(mean)
        tol = max(base, spread)
        diff = sim[k] - mean
        out[k] = {"live": mean, "live_min": min(vals), "live_max": max(vals), "spread": spread, "sim": sim[k],
                  "diff": diff, "rel_diff": diff / mean if mean else None, "tolerance": tol,
                  "pass": abs(diff) <= tol}
    return out


async def calibrate(target: str, model: str, prof: Profile, n: int = 150) -> dict[str, float]:
    """Lone requests through the gateway at a low constant rate: their median latency beyond
    the profile's batch-of-one p50 is what the live stack adds to a request."""
    spec = LoadSpec(target=target, model=model, arrival="constant", rate=20.0, duration_s=n / 20.0,
                    warmup_s=1.0, slo_ms=SLO_MS, seed=5)
    s = (await run_load(spec)).summary
    p50 = s["latency_ms"]["p50"] / 1e3
    extra = max(0.0, p50 - prof.latency(1, "p50"))
    return {"lone_p50_ms": p50 * 1e3, "profile_b1_ms": prof.latency(1, "p50") * 1e3, "extra_ms": extra * 1e3}


def learned(http_target: str) -> dict[str, float]:
    """The gateway's learned per-replica terms, mean over its replicas (seconds)."""
    text = urllib.request.urlopen(f"{http_target}/metrics", timeout=10).read().decode()
    out: dict[str, list[float]] = {"run_excess": [], "overhead": []}
    for line in text.splitlines():
        for k in out:
            if line.startswith(f"headrace_replica_{k}_seconds{{"):
                out[k].append(float(line.rsplit(" ", 1)[1]))
    return {k: statistics.fmean(v) if v else 0.0 for k, v in out.items()}


async def run(cases: list[Case], duration: float, warmup: float, repeats: int, seed: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="hr-bench-simfid-"))
    profiles = {"slice": work / "slice.yaml", "mps": work / "mps.yaml"}
    save_profiles(profiles["slice"], [slice_profile()])
    save_profiles(profiles["mps"], [mps_profile()])
    # the single-replica gateway always runs: the overhead is calibrated on it
    layouts = sorted({"single", *(c.layout for c in cases)}, key=["single", "mig", "mps"].index)
    out: dict[str, Any] = {"cases": {}, "live_runs": {c.name: [] for c in cases}}
    with EmulatedGpu("simfid") as gpu:
        write_repo(work / "repo", gpu.socket_path)
        with TritonServer(work / "repo", ready_timeout=180) as triton:
            procs, cfgs, targets = [], {}, {}
            try:
                for layout in layouts:
                    hp = free_port()
                    cfgs[layout] = work / f"gateway-{layout}.yaml"
                    cfgs[layout].write_text(yaml.safe_dump(gateway_config(layout, hp, triton.http_url, profiles)))
                    procs.append(start_serve(cfgs[layout], f"127.0.0.1:{hp}", work / f"gateway-{layout}.log"))
                    targets[layout] = f"http://127.0.0.1:{hp}"
                for layout in layouts:  # warm every path once (connections, python stubs)
                    for m in MODELS[layout]:
                        await run_load(LoadSpec(target=targets[layout], model=m, rate=50, duration_s=1.0,
                                                warmup_s=0.5, seed=99))
                cal = await calibrate(targets[layouts[0]], MODELS[layouts[0]][0], slice_profile())
                out["calibration"] = cal
                for rnd in range(repeats):
                    for c in cases:
                        cpu0 = cpu_times()
                        res = await run_load(spec_of(c, targets[c.layout], duration, warmup, seed))
                        p = point(res.summary)
                        p["steal"] = steal_share(cpu0, cpu_times())
                        p["load_average"] = os.getloadavg()[0]
                        p["send_lag_p99_ms"] = res.summary["send_lag_ms"]["p99"]
                        out["live_runs"][c.name].append(p)
                        print(f"round {rnd + 1} {c.name:12s} live attainment {p['attainment'] or 0:.4f} goodput "
                              f"{p['goodput_rps']:.1f}/s p50 {p['p50_ms'] or 0:.1f} p99 {p['p99_ms'] or 0:.1f} ms",
                              flush=True)
                        p["idle_wait_s"] = await wait_idle(triton.http_url)
                        p["learned_ms"] = {k: v * 1e3 for k, v in learned(targets[c.layout]).items()}
                out["learned"] = {layout: learned(targets[layout]) for layout in layouts}
            finally:
                for proc in procs:
                    stop_group(proc)
    for c in cases:
        spec = spec_of(c, "http://sim:1", duration, warmup, seed)
        excess = max(0.0, out["learned"][c.layout]["run_excess"])
        transit = max(0.0, out["calibration"]["extra_ms"] / 1e3 - excess) / 2
        raw = simulate(cfgs[c.layout], spec, SimOptions())
        sim = simulate(cfgs[c.layout], spec, SimOptions(overhead=excess, transit=transit))
        live = out["live_runs"][c.name]
        out["cases"][c.name] = {"layout": c.layout, "arrival": c.arrival, "load": c.load,
                                "rate": spec.rate, "capacity_per_model": capacity(c.layout),
                                "sim": sim, "sim_profile_only": raw,
                                "compare": compare(live, sim), "compare_profile_only": compare(live, raw)}
    return out


def _fmt(k: str, v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.4f}" if k == "attainment" else f"{v:.1f}"


def _cell(k: str, c: dict[str, Any]) -> str:
    if c.get("live") is None:
        return f"- / {_fmt(k, c.get('sim'))} / - | no"
    d = f"{c['diff'] * 100:+.2f} pt" if k == "attainment" else f"{(c['rel_diff'] or 0) * 100:+.1f}%"
    tol = f"{c['tolerance'] * 100:.2f} pt" if k == "attainment" else f"{c['tolerance']:.1f}"
    return (f"{_fmt(k, c['live'])} ({_fmt(k, c['live_min'])}-{_fmt(k, c['live_max'])}) / {_fmt(k, c['sim'])} / "
            f"{d} (tol {tol}) | {'yes' if c['pass'] else '**no**'}")


def markdown(res: dict[str, Any]) -> str:
    cal = res["calibration"]
    met = sum(all(m["pass"] for m in c["compare"].values()) for c in res["cases"].values())
    lines = [
        "# Simulator fidelity: live stack vs `headrace sim`, same seeded arrivals",
        "",
        f"ResNet-50 on emulated A100-80GB {SLICE} (reference profile, max batch {MAX_BATCH}), SLO {SLO_MS:g} ms, "
        f"default scheduler; {res['duration_s']:g} s measured after {res['warmup_s']:g} s warm-up per point, "
        f"each live case {res['repeats']} times (rounds over all cases); {res['host']['cpus']} CPUs shared "
        f"with other work (load average {res['host']['load_average']:.2f} at the start).",
        f"Command: `flock /tmp/headrace-bench.lock .venv/bin/python -m bench.sim_fidelity` (commit {res['commit']}).",
        "",
        f"Measured overhead: lone requests through the gateway at 20 req/s answer in {cal['lone_p50_ms']:.2f} ms "
        f"(p50) against the profile's {cal['profile_b1_ms']:.2f} ms for a batch of one: the live stack adds "
        f"{cal['extra_ms']:.2f} ms. The gateways learned that a batch holds its replica "
        + ", ".join(f"{v['run_excess'] * 1e3:.2f} ms ({layout})" for layout, v in res["learned"].items())
        + " longer than its profile (Triton's and the arbiter's per-batch cost beyond what the emulator "
        "cancels; below zero, the emulator cancels a little more than that cost): the simulator runs each "
        "batch that much longer, never shorter than its profile (`headrace sim --overhead-ms`), and charges "
        "the rest of the lone requests' extra half each way between gateway and replica (`--transit-ms`); "
        "overhead / transit: "
        + ", ".join(f"{c['sim']['overhead_ms']:.2f} / {c['sim']['transit_ms']:.2f} ms ({n})"
                    for n, c in res["cases"].items() if n in ("poisson-50", "mig-pair", "mps-pair")) + ".",
        "",
        f"Target: p50, p99 and goodput within {REL_TOL:.0%} of the live mean, attainment within "
        f"{ATTAIN_TOL * 100:g} point, or within the live spread (max - min of the repeats) where larger. "
        f"**{met} of {len(res['cases'])} cases meet it on every point.**",
        "",
        *([f"Re-run on their own after the full run: {', '.join(res['rerun'])} (live and simulated, commit "
           f"{res['commit']}); the other cases are the full run's."] if res.get("rerun") else []),
        *([f"The re-run's own calibration ({res['calibration_rerun_discarded']['extra_ms']:.2f} ms) was taken on "
           "the MPS gateway, whose lone requests run at the MPS share, and is not used; the bench now always "
           "calibrates on the single-replica gateway."] if res.get("calibration_rerun_discarded") else []),
        "",
        "Each cell: live mean (min-max) / simulated / difference (tolerance) | within.",
        "",
        "| case | rate /s | p50 ms | ok | p99 ms | ok | attainment | ok | goodput /s | ok |",
        "|---|---:|---|---|---|---|---|---|---|---|",
    ]
    for name, c in res["cases"].items():
        cells = " | ".join(_cell(k, c["compare"][k]) for k in METRICS)
        lines.append(f"| {name} | {c['rate']:.0f} | {cells} |")
    lines += ["", "The simulator without the measured overhead (profile latencies only), for reference:", "",
              "| case | p50 ms | ok | p99 ms | ok | attainment | ok | goodput /s | ok |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, c in res["cases"].items():
        cells = " | ".join(_cell(k, c["compare_profile_only"][k]) for k in METRICS)
        lines.append(f"| {name} | {cells} |")
    lines += ["", "Live runs (attainment, goodput /s, p50/p99 ms, rejected/expired, client send lag p99 ms, "
              "CPU stolen, 1-minute load average at the end; the host's other work shows in the last two):", ""]
    for name, runs in res["live_runs"].items():
        for i, p in enumerate(runs):
            lines.append(f"- {name} #{i + 1}: {p['attainment'] or 0:.4f}, {p['goodput_rps']:.1f}, "
                         f"{p['p50_ms'] or 0:.1f}/{p['p99_ms'] or 0:.1f}, {p['rejected']}/{p['expired']}, "
                         f"{p.get('send_lag_p99_ms') or 0:.2f}, {p.get('steal', 0):.1%}, {p.get('load_average', 0):.1f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=20.0, help="measured seconds per point")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds per point")
    ap.add_argument("--repeats", type=int, default=3, help="live runs of each case")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", action="append", default=[], help="re-run only this case (repeatable); "
                    "the other cases of the existing result are kept")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    known = {c.name: c for c in CASES}
    unknown = [n for n in args.only if n not in known]
    if unknown:
        print(f"unknown case(s) {unknown}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    exit_on_sigterm()  # what it started is stopped on the way out
    cases = [known[n] for n in args.only] if args.only else list(CASES)
    t0 = time.monotonic()
    load0 = os.getloadavg()[0]
    res = asyncio.run(run(cases, args.duration, args.warmup, args.repeats, args.seed))
    from loadgen.record import headrace_version

    res.update(duration_s=args.duration, warmup_s=args.warmup, repeats=args.repeats, seed=args.seed,
               elapsed_s=time.monotonic() - t0, commit=headrace_version()["commit"],
               host={"cpus": os.cpu_count(), "python": platform.python_version(), "load_average": load0})
    old = Path(args.out) / "sim_fidelity.json"
    if args.only and old.exists():
        prev = json.loads(old.read_text())
        res["cases"] = {**prev["cases"], **res["cases"]}
        res["live_runs"] = {**prev["live_runs"], **res["live_runs"]}
        res["learned"] = {**prev.get("learned", {}), **res["learned"]}
        res["cases"] = {c.name: res["cases"][c.name] for c in CASES if c.name in res["cases"]}
        res["live_runs"] = {c.name: res["live_runs"][c.name] for c in CASES if c.name in res["live_runs"]}
        res["rerun"] = args.only
    write_results(args.out, "sim_fidelity", res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
