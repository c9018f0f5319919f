"""Fleet study: headrace's batching against Triton's dynamic batcher and Clipper's AIMD
batcher, on the same planned fleet (equal GPUs), over a multi-model trace, in the simulator.

The baselines, each the same policy core with another batch policy (:mod:`gateway.policy`):

- Triton's dynamic batcher (``take-all``: what is queued up to max batch, no deadline checks)
  with ``max_queue_delay_microseconds`` 0 and 5000 (``max_queue_delay_s``) and its queue policy
  as a client sending each request's SLO as its ``timeout`` gets it: ``timeout_action: REJECT``,
  ``allow_timeout_override: true`` (``request_timeouts``; ``ModelQueuePolicy`` in
  triton-inference-server/common ``protobuf/model_config.proto``). A row without the queue
  policy shows what it adds.
- Clipper's adaptive batching (``aimd``; Crankshaw et al., NSDI 2017, §4.3): a per-replica
  batch cap grown by one row after each batch whose *measured* latency meets its SLO and cut by
  10% after one that does not; its queue drops requests past their deadline, as Clipper's
  (``request_timeouts``). Its delayed batching (a batch wait timeout) is not modelled. See
  :class:`gateway.policy.batching.Aimd` for what each constant follows.

The fleet comes from the fleet generator (:mod:`bench.fleet`, seeded), rates scaled down so
the run fits a few minutes of wall time; the operator's planner places it (greedy) and the
plan is rendered into the gateway config exactly as ``headrace up`` does
(:func:`loadgen.sim.fleet.load_fleet`). Every system runs on that one plan; only the batch
policy differs.

Arrivals: each model's per-minute rate follows one function of the bundled per-minute
trace (``loadgen/data/azure_sample.csv``, a *synthetic* trace in the Azure Functions 2019
format: diurnal shape, bursts, idle stretches), scaled so its mean is the model's planned
rate and started at a seeded minute so the models do not peak together; within a minute,
Gamma arrivals with ``--cv``. The trace is written in that format and replayed through the
load generator's own trace path, so ``headrace sim -f`` reproduces any row.

Run: ``python -m bench.fleet_study`` (writes bench/results/fleet_study.{json,md}).
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench import fleet_autoscale
from bench.fleet import SEED, generate
from bench.output import write_results
from loadgen.arrivals import AZURE_HEADER, read_azure_trace
from loadgen.sim.cli import SIM_TARGET
from loadgen.sim.fleet import SimFleet, load_fleet, with_settings
from loadgen.sim.run import SimOptions, run_sim
from loadgen.spec import LoadSpec

SAMPLE = Path(__file__).parents[1] / "loadgen" / "data" / "azure_sample.csv"
OUT = Path(__file__).parent / "results"

# name -> scheduler settings over the rendered Gateway's (the same plan for every one)
SYSTEMS: dict[str, dict] = {
    "headrace": {},
    "triton, no delay, queue policy": {"policy": "take-all", "max_queue_delay_s": 0.0, "request_timeouts": True},
    "triton, 5 ms delay, queue policy": {"policy": "take-all", "max_queue_delay_s": 0.005, "request_timeouts": True},
    "triton, no delay, no queue policy": {"policy": "take-all", "max_queue_delay_s": 0.0},
    "clipper aimd, measured latency": {"policy": "aimd", "request_timeouts": True},
}


def write_trace(fleet: SimFleet, path: Path, minutes: int, minute_s: float, seed: int) -> float:
    """A per-minute trace with one row per model (in fleet order): function ``i % 8`` of the
    sample, rolled by a seeded offset, scaled to the model's planned rate. Returns the
    offered mean rate (req/s)."""
    funcs = read_azure_trace(SAMPLE)
    rng = np.random.default_rng(seed)
    rates = (fleet.plan or {}).get("rates", {})
    rows, total = [], 0.0
    for i, model in enumerate(fleet.models):
        shape = np.roll(funcs[i % len(funcs)].counts.astype(float), -int(rng.integers(len(funcs[0].counts))))
        shape = shape[:minutes] / max(shape[:minutes].mean(), 1e-9)
        counts = np.rint(shape * rates[model] * minute_s).astype(np.int64)
        total += counts.sum() / (minutes * minute_s)
        rows.append(",".join(["fleet", "study", f"{model}", "http", *map(str, counts)]))
    header = ",".join([*AZURE_HEADER, *map(str, range(1, minutes + 1))])
    path.write_text("\n".join([header, *rows]) + "\n")
    return total


def _share(pair: tuple[int, int]) -> float | None:
    return pair[0] / pair[1] if pair[1] else None


def run(models: int, gpus: int, rate_scale: float, minutes: int, minute_s: float, cv: float, seed: int,
        processes: int, loads: tuple[float, ...]) -> dict:
    out: dict = {"config": {"models": models, "gpus_in_pool": gpus, "rate_scale": rate_scale, "minutes": minutes,
                            "minute_s": minute_s, "cv": cv, "seed": seed, "processes": processes,
                            "loads": list(loads), "host": platform.node(), "python": platform.python_version()},
                 "rows": []}
    with tempfile.TemporaryDirectory(prefix="headrace-fleet-study-") as tmp:
        folder = Path(tmp) / "fleet"
        written = generate(models, gpus, seed, rate_scale).write(folder)
        profiles = written["profiles"].rename(Path(tmp) / "profiles.yaml")  # not an operator document
        trace = Path(tmp) / "trace.csv"
        planned = load_fleet([folder], {}, profiles=[profiles])  # planned once: every system runs this plan
        out["offered_rps"] = round(write_trace(planned, trace, minutes, minute_s, seed), 1)
        out["plan"] = {"gpus": planned.plan["gpus"], "replicas": len(planned.replicas),
                       "cost_per_hour": round(planned.plan["cost_per_hour"], 2)}
        base = planned.scheduler.model_dump(exclude_unset=True)
        for name, overrides in SYSTEMS.items():
            # the same replicas; only the scheduler differs
            fleet = replace(planned, scheduler=with_settings(base, overrides, name))
            for load in loads:
                spec = LoadSpec(target=SIM_TARGET, arrival="trace", trace=trace, trace_models=tuple(fleet.models),
                                trace_cv=cv, rate_scale=load, time_scale=60.0 / minute_s,
                                duration_s=minutes * minute_s - minute_s, warmup_s=minute_s, seed=seed,
                                window_s=minute_s)
                t0 = time.perf_counter()
                summary, rec = run_sim(fleet, spec, SimOptions(processes=processes))
                wall = time.perf_counter() - t0
                classes = fleet_autoscale.by_class(fleet, rec)
                out["rows"].append({
                    "system": name, "load": load, "scheduler": overrides, "offered": summary["offered"],
                    "attainment": summary["attainment"], "goodput_rps": summary["goodput_rps"],
                    "guaranteed_attainment": _share(classes["guaranteed"]),
                    "best_effort_attainment": _share(classes["best_effort"]),
                    "p50_ms": summary["latency_ms"]["p50"], "p99_ms": summary["latency_ms"]["p99"],
                    "rejected": summary["rejected"], "expired": summary["expired"], "late": summary["sim"]["late"],
                    "mean_batch": summary["sim"]["mean_batch"], "wall_s": round(wall, 1),
                })
                print(f"{name} x{load:g}: attainment {summary['attainment']:.4f} goodput "
                      f"{summary['goodput_rps']:.0f} req/s ({wall:.0f} s wall)", flush=True)
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.2%}"


def markdown(r: dict) -> str:
    c = r["config"]
    gpu_hours = r["plan"]["gpus"] * c["minutes"] * c["minute_s"] / 3600
    lines = [
        "# Fleet study: batch policies on one planned fleet (simulator)", "",
        f"{c['models']} generated models (`bench/fleet.py`, seed {c['seed']}, rate scale {c['rate_scale']}), "
        f"planned by the greedy planner onto **{r['plan']['gpus']} GPUs** ({r['plan']['replicas']} replicas, "
        f"${r['plan']['cost_per_hour']}/h). Every system runs on that plan. Arrivals: "
        f"{c['minutes']} trace minutes of {c['minute_s']:g} s each (the first is warm-up), each model's rate "
        f"shaped by one function of the bundled synthetic Azure-format trace with mean = its planned rate, "
        f"Gamma CV {c['cv']:g} within a minute; {r['offered_rps']} req/s offered on average. Each request is "
        f"judged by its model's SLO (50-200 ms). GPU-hours per system: {gpu_hours:.2f} (equal by construction).",
        "", "Command: `python -m bench.fleet_study`.", "",
        "Load x1 offers the planned rates on average (their trace minutes peak above them); x1.25 and x1.5 "
        "offer more on the same GPUs.", "",
        "| load | system | attainment | guaranteed | best-effort | goodput req/s | p50 ms | p99 ms | refused "
        "| expired in queue | answered late | mean batch |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in sorted(r["rows"], key=lambda s: s["load"]):
        lines.append(f"| x{s['load']:g} | {s['system']} | {s['attainment']:.2%} | {_pct(s['guaranteed_attainment'])} | "
                     f"{_pct(s['best_effort_attainment'])} | {s['goodput_rps']:.0f} | "
                     f"{s['p50_ms']:.1f} | {s['p99_ms']:.1f} | {s['rejected']} | {s.get('expired', '-')} | {s['late']} | "
                     f"{s['mean_batch']:.1f} |")
    lines += ["", "Attainment = answered within SLO / offered. Triton's batcher with its queue policy rejects "
              "a queued request once its timeout (its SLO, as the load generator sends it) has passed "
              "(`timeout_action: REJECT`, `allow_timeout_override: true`); without it, it answers late "
              "whatever it starts too late. Clipper's AIMD sizes batches by their measured latency and "
              "drops what is queued past its deadline. Neither refuses at arrival: a request they start "
              "too late is answered late. headrace refuses at once what it predicts cannot make its "
              "deadline, so its clients can retry elsewhere.", ""]
    if "day" in r:
        lines += fleet_autoscale.markdown(r["day"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--gpus", type=int, default=200, help="GPUs in the pool (the plan uses fewer)")
    ap.add_argument("--rate-scale", type=float, default=0.05)
    ap.add_argument("--minutes", type=int, default=16, help="trace minutes (the first is warm-up)")
    ap.add_argument("--minute-s", type=float, default=10.0, help="seconds each trace minute lasts")
    ap.add_argument("--cv", type=float, default=2.0, help="Gamma CV of arrivals within a minute")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=48, help="epochs of the static-vs-autoscaled day (0: skip it)")
    ap.add_argument("--day-rate-scale", type=float, default=0.2,
                    help="the day's rate scale (larger than the batch study's: GPUs come in whole units)")
    ap.add_argument("--epoch-s", type=float, default=4.0, help="simulated seconds per epoch of the day")
    ap.add_argument("--loads", default="1,1.25,1.5", help="multiples of the planned rates, comma-separated")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    r = run(a.models, a.gpus, a.rate_scale, a.minutes, a.minute_s, a.cv, a.seed, a.processes,
            tuple(float(x) for x in a.loads.split(",")))
    if a.epochs:
        fleet = generate(a.models, a.gpus, a.seed, a.day_rate_scale)
        r["day"] = fleet_autoscale.day(fleet, a.epochs, a.epoch_s, a.cv, a.seed, a.processes)
        r["day"]["rate_scale"] = a.day_rate_scale
    write_results(a.out, "fleet_study", r, markdown(r))
    print(markdown(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
