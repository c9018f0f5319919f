"""Guaranteed and best-effort placement (AntMan's split): GPUs saved at equal guaranteed attainment.

"Without the split" is the planner as it was before priority classes reached the plan: every
model planned alike, at its SLO with its headroom (here: every deployment marked guaranteed).
"With the split", guaranteed demand is placed first with its headroom and best-effort at its
expected rate, in what is left. Both on the seeded fleet of :mod:`bench.fleet` (20% of models
best-effort, headroom 1.1):

1. Planner, 1,000 models on 500 GPUs: GPUs of each plan (greedy, and the MILP within its
   limit). Then pools cut down to the GPUs the guaranteed demand alone takes, and between that
   and the full plan: with the split the plan is partial (every guaranteed model placed whole,
   best-effort placed in part, its shortfall reported); without it there is no plan at all.
2. Simulator (the gateway's own core in virtual time, :mod:`loadgen.sim.run`), a smaller fleet
   of the same generator: each plan rendered into the gateway's config as the operator does, and
   fed every model's expected rate (Poisson, and Gamma cv 2 for bursts) to measure attainment by
   class: guaranteed attainment must be equal, what the split gives up is best-effort's.

    .venv/bin/python -m bench.placement_sharing [--models 1000 --gpus 500] [--milp-limit 60]
        [--sim-models 40 --sim-gpus 20 --sim-rate-scale 0.1 --sim-duration 60]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.fleet import SEED, generate
from bench.output import git_commit, write_results
from loadgen.sim.fleet import plan_fleet
from loadgen.sim.run import SimOptions, run_sim
from loadgen.spec import LoadSpec
from placement.plan import Demand, GpuClass, Inventory, Plan
from placement.solve.solver import SolverError, solve
from profiles.derive import with_derived
from profiles.profile import ProfileSet

OUT = Path(__file__).parent / "results"
CUT_STEPS = (0.0, 0.5)  # pools: guaranteed-only GPUs + this fraction of the way to the full plan's


def no_split(demands: list[Demand]) -> list[Demand]:
    """Every model planned alike: the plan before priority classes reached the planner."""
    return [replace(d, priority="guaranteed") for d in demands]


def problem(models: int, gpus: int, seed: int, rate_scale: float = 1.0
            ) -> tuple[list[Demand], ProfileSet, Inventory]:
    """The fleet's demands, its profiles with what the plan may derive, and its pool."""
    demands, ps, inv = generate(models, gpus, seed, rate_scale).problem()
    return demands, with_derived(ps, gpus=tuple(sorted({c.gpu for c in inv.classes}))), inv


def timed(demands: list[Demand], ps: ProfileSet, inv: Inventory, method: str, limit: float) -> tuple[Plan, float]:
    t0 = time.perf_counter()
    plan = solve(demands, ps, inv, method, time_limit=limit, bound=False)
    plan.verify()
    return plan, time.perf_counter() - t0


def cut_pool(inv: Inventory, keep: dict[str, int]) -> Inventory:
    """``inv`` with only the first ``keep[class key]`` GPUs of each class."""
    return replace(inv, classes=tuple(GpuClass(c.gpu, c.ids[:keep.get(c.key, 0)], c.cost_per_hour, c.mig, c.mps)
                                      for c in inv.classes if keep.get(c.key, 0) > 0))


def per_class(plan: Plan) -> dict[str, int]:
    by_id = plan.inventory.by_id()
    out: dict[str, int] = {}
    for g in plan.used():
        out[by_id[g.id].key] = out.get(by_id[g.id].key, 0) + 1
    return out


def placed(plan: Plan) -> dict[str, float]:
    """Best-effort and guaranteed req/s the plan places, against what they ask for."""
    short = {s.model: s.unplaced for s in plan.shortfall}
    out = {"guaranteed_rps": 0.0, "guaranteed_placed_rps": 0.0, "best_effort_rps": 0.0, "best_effort_placed_rps": 0.0}
    for d in plan.demands:
        k = "guaranteed" if d.guaranteed else "best_effort"
        out[f"{k}_rps"] += d.rate
        out[f"{k}_placed_rps"] += d.rate * (1.0 - short.get(d.model, 0.0) / d.required if d.required else 1.0)
    return {k: round(v, 1) for k, v in out.items()}


def planner_section(models: int, gpus: int, seed: int, milp_limit: float) -> dict:
    demands, ps, inv = problem(models, gpus, seed)
    rows: dict = {}
    for method in ("greedy", "milp"):
        base, t_base = timed(no_split(demands), ps, inv, method, milp_limit)
        split, t_split = timed(demands, ps, inv, method, milp_limit)
        rows[method] = {"without_split": {"gpus": base.gpu_count, "cost_per_hour": round(base.cost_per_hour, 2),
                                          "solve_s": round(t_base, 2), "method": base.method},
                        "with_split": {"gpus": split.gpu_count, "cost_per_hour": round(split.cost_per_hour, 2),
                                       "solve_s": round(t_split, 2), "method": split.method},
                        "gpus_saved": base.gpu_count - split.gpu_count,
                        "saved_fraction": round(1 - split.gpu_count / base.gpu_count, 4)}
    # overfull pools: the GPUs the guaranteed demand alone takes, and part of the way up
    guaranteed_only, _ = timed([d for d in demands if d.guaranteed], ps, inv, "greedy", milp_limit)
    full, _ = timed(demands, ps, inv, "greedy", milp_limit)
    lo, hi = per_class(guaranteed_only), per_class(full)
    cuts = []
    for step in CUT_STEPS:
        keep = {k: lo.get(k, 0) + round(step * (hi.get(k, 0) - lo.get(k, 0))) for k in set(lo) | set(hi)}
        pool = cut_pool(inv, keep)
        row: dict = {"step": step, "pool_gpus": sum(keep.values())}
        try:
            timed(no_split(demands), ps, pool, "greedy", milp_limit)
            row["without_split"] = "planned"
        except SolverError as e:
            row["without_split"] = f"no plan: {e}"
        plan, secs = timed(demands, ps, pool, "greedy", milp_limit)
        row.update({"gpus": plan.gpu_count, "solve_s": round(secs, 2), "partial": plan.partial,
                    "short_models": len(plan.shortfall), **placed(plan),
                    "example_shortfall": plan.shortfall[0].describe() if plan.shortfall else None})
        cuts.append(row)
    n_be = sum(not d.guaranteed for d in demands)
    return {"models": models, "pool_gpus": gpus, "seed": seed, "best_effort_models": n_be,
            "guaranteed_only_gpus": guaranteed_only.gpu_count, "methods": rows, "overfull": cuts}


def sim_fleet(plan: Plan, profiles: ProfileSet):  # noqa: ANN201  (loadgen's SimFleet)
    """The plan as the simulator runs it (rendered as the operator renders it)."""
    return plan_fleet(plan, profiles)


def attainment(plan: Plan, profiles: ProfileSet, arrival: str, duration: float, seed: int) -> dict:
    """Every model fed its expected rate; good answers / offered requests by class. A model the
    plan does not place at all is counted as offered and never answered."""
    fleet = sim_fleet(plan, profiles)
    served = [d for d in plan.demands if d.model in fleet.models]
    total = sum(d.rate for d in served)
    spec = LoadSpec(target="http://sim:1", mix=",".join(f"{d.model}:{d.rate}" for d in served), arrival=arrival,
                    rate=total, cv=2.0, duration_s=duration, warmup_s=5.0, seed=seed)
    t0 = time.perf_counter()
    _, rec = run_sim(fleet, spec, SimOptions())
    wall = time.perf_counter() - t0
    series = rec.by_model()
    out: dict = {"sim_wall_s": round(wall, 1)}
    for cls in ("guaranteed", "best-effort"):
        mine = [d for d in plan.demands if d.priority == cls]
        offered = sum(series[d.model].offered for d in mine if d.model in series)
        good = sum(series[d.model].good for d in mine if d.model in series)
        offered += sum(round(d.rate * duration) for d in mine if d.model not in fleet.models)
        worst = min((series[d.model].good / series[d.model].offered for d in mine
                     if d.model in series and series[d.model].offered), default=None)
        key = cls.replace("-", "_")
        out[key] = {"offered": offered, "good": good, "attainment": round(good / offered, 5) if offered else None,
                    "worst_model": None if worst is None else round(worst, 4)}
    return out


def sim_section(models: int, gpus: int, seed: int, rate_scale: float, duration: float) -> dict:
    demands, ps, inv = problem(models, gpus, seed, rate_scale)
    base, _ = timed(no_split(demands), ps, inv, "greedy", 10.0)
    split, _ = timed(demands, ps, inv, "greedy", 10.0)
    guaranteed_only, _ = timed([d for d in demands if d.guaranteed], ps, inv, "greedy", 10.0)
    overfull, _ = timed(demands, ps, cut_pool(inv, per_class(guaranteed_only)), "greedy", 10.0)
    # the plan without the split serves best-effort models as best-effort all the same: the
    # gateway's classes are the deployments', only the planning differs
    base = replace(base, demands=tuple(demands))
    plans = {"without_split": base, "with_split": split, "with_split_guaranteed_only_pool": overfull}
    out: dict = {"models": models, "pool_gpus": gpus, "seed": seed, "rate_scale": rate_scale,
                 "duration_s": duration, "total_rate": round(sum(d.rate for d in demands), 1),
                 "best_effort_models": sum(not d.guaranteed for d in demands), "plans": {}}
    for name, plan in plans.items():
        row: dict = {"gpus": plan.gpu_count, "partial": plan.partial, **placed(plan)}
        for arrival in ("poisson", "gamma"):
            row[arrival] = attainment(plan, ps, arrival, duration, seed)
        out["plans"][name] = row
        print(json.dumps({name: row}), flush=True)
    return out


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _attained(a: dict) -> str:
    """``98.50% (0.9712)``: a class's attainment and its worst model's, "-" for a class with no
    requests (a fleet without best-effort models)."""
    if a["attainment"] is None:
        return "- (no requests)"
    return f"{a['attainment']:.2%} ({a['worst_model']})"


def markdown(planner: dict, sim: dict, meta: dict) -> str:
    lines = ["# Guaranteed and best-effort placement: GPUs saved at equal guaranteed attainment", "",
             f"`{meta['command']}`{' at commit ' + meta['commit'] if meta.get('commit') else ''} on {meta['machine']}. Fleet: `bench.fleet` seed {planner['seed']} "
             f"({planner['models']} models, {planner['best_effort_models']} best-effort, headroom 1.1, on "
             f"{planner['pool_gpus']} GPUs). Without the split: every model planned as guaranteed (the planner "
             "before priority classes reached it). With it: guaranteed first with its headroom, best-effort at "
             "its rate in what is left. Every plan passed `Plan.verify()`.", "",
             "## Planner", "",
             "| method | GPUs without split | GPUs with split | saved | $/h without | $/h with | solve s (without / with) |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for method, r in planner["methods"].items():
        a, b = r["without_split"], r["with_split"]
        lines.append(f"| {method} ({b['method']}) | {a['gpus']} | {b['gpus']} | {r['gpus_saved']} "
                     f"({r['saved_fraction']:.1%}) | {a['cost_per_hour']} | {b['cost_per_hour']} | "
                     f"{a['solve_s']} / {b['solve_s']} |")
    lines += ["", f"Overfull pools (greedy): the GPUs the guaranteed demand alone takes "
                  f"({planner['guaranteed_only_gpus']}), and halfway from there to the full plan's, per GPU kind.", "",
              "| pool GPUs | without split | with split: GPUs | guaranteed placed | best-effort placed "
              "| best-effort models short |", "|---:|---|---:|---|---|---:|"]
    for c in planner["overfull"]:
        without = "planned" if c["without_split"] == "planned" else "no plan (" + c["without_split"][9:80] + "...)"
        lines.append(f"| {c['pool_gpus']} | {without} | {c['gpus']} | {c['guaranteed_placed_rps']:g} of "
                     f"{c['guaranteed_rps']:g} req/s | {c['best_effort_placed_rps']:g} of {c['best_effort_rps']:g} "
                     f"req/s ({_share(c['best_effort_placed_rps'], c['best_effort_rps'])}) | {c['short_models']} |")
    ex = next((c["example_shortfall"] for c in planner["overfull"] if c["example_shortfall"]), None)
    if ex:
        lines += ["", f"A shortfall as the plan reports it: \"{ex}\"."]
    lines += ["", "## Attainment in the simulator", "",
              f"`bench.fleet` seed {sim['seed']}, {sim['models']} models ({sim['best_effort_models']} best-effort) at "
              f"rate scale {sim['rate_scale']:g} ({sim['total_rate']:g} req/s in all) on up to {sim['pool_gpus']} GPUs; "
              f"each plan rendered into the gateway config as the operator does and run in virtual time for "
              f"{sim['duration_s']:g} s (after 5 s warm-up) with every model at its expected rate. Attainment: "
              "answers within the SLO / requests offered (a model left without replicas counts as offered, "
              "never answered).", "",
              "| plan | GPUs | arrivals | guaranteed attainment (worst model) | best-effort attainment (worst model) |",
              "|---|---:|---|---|---|"]
    for name, r in sim["plans"].items():
        for arrival in ("poisson", "gamma"):
            a = r[arrival]
            g, b = a["guaranteed"], a["best_effort"]
            lines.append(f"| {name.replace('_', ' ')} | {r['gpus']} | {arrival if arrival == 'poisson' else 'gamma cv 2'} "
                         f"| {_attained(g)} | {_attained(b)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=500)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--milp-limit", type=float, default=60.0)
    ap.add_argument("--sim-models", type=int, default=40)
    ap.add_argument("--sim-gpus", type=int, default=20)
    ap.add_argument("--sim-rate-scale", type=float, default=0.1)
    ap.add_argument("--sim-duration", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    planner = planner_section(args.models, args.gpus, args.seed, args.milp_limit)
    print(json.dumps(planner), flush=True)
    sim = sim_section(args.sim_models, args.sim_gpus, args.seed, args.sim_rate_scale, args.sim_duration)
    meta = {"command": "python -m bench.placement_sharing " + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": f"{platform.machine()} {platform.python_version()}", "commit": git_commit()}
    text = markdown(planner, sim, meta)
    write_results(args.out, "placement_sharing", {"meta": meta, "planner": planner, "sim": sim}, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
