"""The fleet study's second half: a static plan against plan-plus-autoscaling over a day of
the trace, GPU-hours against attainment, in the simulator.

A day of each model's trace shape is cut into epochs (48 of 30 minutes by default); epoch k
offers each model the mean rate of its shape over that half hour, scaled so the day's mean is
the model's deployment rate. Three fleets serve the day:

- ``static (mean)``: one plan for the deployment rates, all day;
- ``static (peak)``: one plan for each model's busiest epoch, all day (what a fleet without
  autoscaling must buy to hold its SLO);
- ``autoscaled``: the operator's own autoscaler (:func:`placement.autoscale.step`), fed each
  model's offered rate of the epoch before, re-plans the fleet when any model's band is left;
  epoch k runs on the plan that decision made, so a rise is served late by one epoch as it
  would be live.

Each epoch is simulated apart on its plan (``minute_s`` seconds of Gamma arrivals at the
epoch's rates, the first tenth unmeasured), every fleet the same way, and the epochs' counts
are added. GPU-hours are each epoch's planned GPUs times its half hour.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.fleet import Fleet
from gateway.policy.types import Priority
from loadgen.arrivals import AZURE_HEADER, read_azure_trace
from loadgen.sim.cli import SIM_TARGET
from loadgen.sim.fleet import SimFleet, plan_fleet
from loadgen.sim.run import SimOptions, run_sim
from loadgen.spec import LoadSpec
from placement import autoscale
from placement.problem import load
from placement.solve.solver import solve
from profiles.schema import AutoscalingSpec

SAMPLE = Path(__file__).parents[1] / "loadgen" / "data" / "azure_sample.csv"
SPEC = AutoscalingSpec(upscale_delay_s=0.0, downscale_delay_s=2.0, downscale_below=0.5,
                       target_utilization=0.7)  # times in epochs


def by_class(fleet: SimFleet, rec) -> dict[str, tuple[int, int]]:  # noqa: ANN001
    """(good, offered) of the guaranteed and the best-effort models."""
    out = {"guaranteed": (0, 0), "best_effort": (0, 0)}
    for model, series in rec.by_model().items():
        cls = "best_effort" if fleet.models[model].priority == Priority.BEST_EFFORT else "guaranteed"
        good, offered = out[cls]
        out[cls] = (good + series.good, offered + series.offered)
    return out


def epoch_rates(fleet: Fleet, epochs: int, seed: int) -> dict[str, np.ndarray]:
    """Each model's offered rate per epoch: its trace function's day, rolled by a seeded
    offset, averaged per epoch, mean = the deployment's rate."""
    funcs = read_azure_trace(SAMPLE)
    rng = np.random.default_rng(seed)
    out = {}
    for i, d in enumerate(fleet.deployments):
        day = funcs[i % len(funcs)].counts.astype(float)
        day = np.roll(day, -int(rng.integers(len(day))))
        blocks = day[: len(day) // epochs * epochs].reshape(epochs, -1).mean(axis=1)
        out[d["spec"]["model"]] = blocks / max(blocks.mean(), 1e-9) * d["spec"]["rate"]
    return out


def autoscaled_rates(rates: dict[str, np.ndarray], headroom: dict[str, float]) -> list[dict[str, float]]:
    """The deployment rate each epoch's plan is made for, as the operator sets it: the
    autoscaler sees the epoch before's offered rate; on an event the deployment's rate becomes
    the decision's rate over the headroom the planner adds back."""
    models = list(rates)
    epochs = len(next(iter(rates.values())))
    plan_rate = {m: float(rates[m][0]) for m in models}  # the day starts planned for its first epoch
    state = {m: autoscale.initial(plan_rate[m] * headroom[m], 0.0) for m in models}
    out = [dict(plan_rate)]
    for k in range(1, epochs):
        for m in models:
            decision, state[m] = autoscale.step(SPEC, state[m], float(rates[m][k - 1]), float(k))
            if decision.direction is not None:
                plan_rate[m] = decision.rate / headroom[m]
        out.append(dict(plan_rate))
    return out


def _epoch_trace(path: Path, models: list[str], rates: dict[str, float], seconds: float) -> None:
    rows = [",".join(["fleet", "day", m, "http", str(int(round(rates[m] * seconds)))]) for m in models]
    path.write_text("\n".join([",".join([*AZURE_HEADER, "1"]), *rows]) + "\n")


def day(fleet: Fleet, epochs: int, minute_s: float, cv: float, seed: int, processes: int,
        overrides: dict | None = None) -> dict:
    """GPU-hours and attainment of the three fleets over one day; see the module doc."""
    rates = epoch_rates(fleet, epochs, seed)
    models = list(rates)
    headroom = {d["spec"]["model"]: d["spec"].get("headroom", 1.1) for d in fleet.deployments}
    plans = {
        "static (mean)": [{m: float(rates[m].mean()) for m in models}] * epochs,
        "static (peak)": [{m: float(rates[m].max()) for m in models}] * epochs,
        "autoscaled": autoscaled_rates(rates, headroom),
    }
    hours = 24.0 / epochs
    out: dict = {"epochs": epochs, "epoch_hours": hours, "epoch_s": minute_s, "autoscale": SPEC.__dict__, "fleets": {}}
    with tempfile.TemporaryDirectory(prefix="headrace-fleet-day-") as tmp:
        root = Path(tmp)
        paths = fleet.write(root / "base")
        # the documents are read and their profiles derived once; each epoch re-plans their
        # demands at its rates (as a document with that rate would give them)
        inv, demands, profiles = load([str(paths["pool"]), str(paths["models"])], [str(paths["profiles"])])
        cache: dict[tuple, SimFleet] = {}
        for name, per_epoch in plans.items():
            offered = good = rejected = 0
            classes = {"guaranteed": [0, 0], "best_effort": [0, 0]}
            gpu_hours, gpus, replans = 0.0, [], 0
            for k in range(epochs):
                key = tuple(round(per_epoch[k][m], 1) for m in models)
                if key not in cache:
                    plan = solve([replace(d, rate=round(max(per_epoch[k][d.model], 0.1), 1)) for d in demands],
                                 profiles, inv, "greedy")
                    plan.verify()
                    cache[key] = plan_fleet(plan, profiles, overrides=overrides, source="fleet day")
                    replans += 1
                sim_fleet = cache[key]
                gpus.append(sim_fleet.plan["gpus"])  # type: ignore[index]
                gpu_hours += sim_fleet.plan["gpus"] * hours  # type: ignore[index]
                trace = root / "epoch.csv"
                _epoch_trace(trace, models, {m: float(rates[m][k]) for m in models}, minute_s)
                spec = LoadSpec(target=SIM_TARGET, arrival="trace", trace=trace, trace_models=tuple(models),
                                trace_cv=cv, time_scale=60.0 / minute_s, duration_s=minute_s * 0.9,
                                warmup_s=minute_s * 0.1, seed=seed + k, window_s=minute_s)
                summary, rec = run_sim(sim_fleet, spec, SimOptions(processes=processes))  # type: ignore[arg-type]
                for cls, (g, o) in by_class(sim_fleet, rec).items():  # type: ignore[arg-type]
                    classes[cls][0] += g
                    classes[cls][1] += o
                offered += summary["offered"]
                good += summary["good"]
                rejected += summary["rejected"]
            out["fleets"][name] = {
                "gpu_hours": round(gpu_hours, 2), "mean_gpus": round(float(np.mean(gpus)), 2),
                "max_gpus": int(max(gpus)), "min_gpus": int(min(gpus)), "plans": replans,
                "offered": offered, "attainment": good / offered if offered else math.nan,
                "rejected": rejected,
                "guaranteed_attainment": classes["guaranteed"][0] / max(classes["guaranteed"][1], 1),
                "best_effort_attainment": classes["best_effort"][0] / max(classes["best_effort"][1], 1),
            }
            print(f"{name}: {gpu_hours:.1f} GPU-hours, attainment {good / max(offered, 1):.4f}", flush=True)
    return out


def markdown(r: dict) -> list[str]:
    lines = [
        "## Static plan against plan-plus-autoscaling, over a day", "",
        f"The same generated models at rate scale {r.get('rate_scale', '?')} (so whole GPUs are a small "
        f"step of the fleet); a day of each model's trace shape in {r['epochs']} epochs of "
        f"{r['epoch_hours'] * 60:g} minutes, each simulated for {r.get('epoch_s', '?')} s on the plan in force "
        "for it. The autoscaler is the operator's "
        f"(`placement/autoscale.py`: up after {SPEC.upscale_delay_s:g} epochs above the plan, down after "
        f"{SPEC.downscale_delay_s:g} below {SPEC.downscale_below:g}x, re-planned at max/"
        f"{SPEC.target_utilization:g}), fed the epoch before's rates.", "",
        "| fleet | GPU-hours per day | GPUs (min-mean-max) | plans | attainment | guaranteed | best-effort "
        "| rejected |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, f in r["fleets"].items():
        lines.append(f"| {name} | {f['gpu_hours']:.1f} | {f['min_gpus']}-{f['mean_gpus']:g}-{f['max_gpus']} | "
                     f"{f['plans']} | {f['attainment']:.2%} | {f['guaranteed_attainment']:.2%} | "
                     f"{f['best_effort_attainment']:.2%} | {f['rejected']} |")
    return lines + [""]
