"""Placement solver benchmark: synthetic fleets of 10, 100 and 1,000 models on A100/H100 pools.

Every model is a copy of a reference family (resnet50, bert-base, bert-large) with all its
profiles (reference plus derived), a log-uniform rate and an SLO drawn from 50-200 ms. Compared:
greedy, MILP (HiGHS, time-limited), whole-GPU-per-model, MIG-only greedy (no MPS) and MPS-only
greedy (no MIG), against the solver's lower bound (the LP relaxation with rounding cuts, raised
by a Lagrangian bound that keeps replicas integer; the LP relaxation alone is shown too). Every
plan is verified. Ratios are within one run, so a noisy machine changes solve times, not GPU
counts. Other seeds of the 100-model fleet get a short check (bounds, greedy, MILP).

Fleet: the issue's generated fleet (:mod:`bench.fleet`, 1,000 models on 500 mixed GPUs, seed 17),
planned end to end by ``headrace plan`` in a child process (wall time, CPU time and peak RSS from
``wait4``, the load average beside them), greedy and MILP, with the GPUs against the plan's lower
bound. The MILP runs twice at its default limit, the second time beside a CPU-bound process this
benchmark starts and stops, and both plans are compared: the search stops on work, not time, so
they must be the same. Then the MILP plans the fleet on an overfull pool (cut to the GPUs the
greedy gives the guaranteed models alone) within its default limit. The floor of this machine is
measured in the same run: the interpreter starting ``headrace`` (imports alone) and libyaml
parsing the fleet's profile file.

Accuracy: fleets of copies of the imagenet family (ResNet-50 and ViT-B/16 on A100-80GB) planned
for the highest mean accuracy within budgets from the fewest GPUs that serve them to the fewest
that answer everything with ViT, and for the fewest GPUs under a mean-accuracy floor, MILP and
greedy, with solve times.

    .venv/bin/python -m bench.placement_solver [--sizes 10,100,1000] [--seed 1] [--other-seeds 2,3]
        [--accuracy-sizes 10,50] [--fleet 1000/500] [--fleet-milp-limit S] [--only-fleet]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import yaml

from bench.fleet import SEED as FLEET_SEED
from bench.fleet import Fleet, generate
from bench.output import write_results
from loadgen.record import headrace_version
from placement.plan import Demand, GpuClass, Inventory, Plan
from placement.solve.milp import EFFORT
from placement.solve.solver import (
    DEFAULT,
    TIME_LIMIT,
    Options,
    SolverError,
    candidates,
    lower_bound,
    solve,
)
from profiles.derive import with_derived
from profiles.profile import ProfileSet

OUT = Path(__file__).parent / "results"
FAMILIES = ("resnet50", "bert-base", "bert-large")
GPUS = (("A100-80GB", 2.0), ("H100-80GB", 3.5))
# dense enough that 1,000 models fill a good part of 500 GPUs (about 0.4 GPU per model)
RATE_RANGE = (50.0, 10000.0)
# a sparse fleet (small models, about 0.15 GPU each): rounding each model up to whole replicas
# costs relatively more, so the gap to the LP bound is larger there
SPARSE_RATE_RANGE = (20.0, 4000.0)
SLO_RANGE_MS = (50, 200)
MILP_LIMIT = {10: 10.0, 100: 30.0, 1000: 60.0}


def fleet(n: int, seed: int, base: ProfileSet, rates: tuple[float, float] = RATE_RANGE
          ) -> tuple[list[Demand], ProfileSet, Inventory]:
    rng = np.random.default_rng(seed)
    by_family = {f: [p for p in base if p.model == f and p.gpu in dict(GPUS)] for f in FAMILIES}
    demands, profs = [], []
    for i in range(n):
        fam = FAMILIES[int(rng.integers(len(FAMILIES)))]
        name = f"{fam}-{i:04d}"
        rate = float(math.exp(rng.uniform(*np.log(rates))))
        slo = int(rng.integers(SLO_RANGE_MS[0], SLO_RANGE_MS[1] + 1)) / 1e3
        demands.append(Demand(name, round(rate, 1), slo))
        profs += [replace(p, model=name, variant=f"{name}:{p.variant}") for p in by_family[fam]]
    return demands, ProfileSet(profs), pool(max(5, n // 4))  # n/2 GPUs: 500 for 1,000 models


def pool(per_class: int) -> Inventory:
    return Inventory(tuple(GpuClass(g, tuple(f"{g.lower()}-{k}/gpu0" for k in range(per_class)), cost)
                           for g, cost in GPUS))


def lower_bounds(demands: list[Demand], ps: ProfileSet, inv: Inventory) -> dict:
    """The LP relaxation (with rounding cuts) and the solver's lower bound, with their times."""
    cands = candidates(demands, ps, inv)
    t0 = time.perf_counter()
    lp = lower_bound(demands, inv, cands, Options(), lagrangian=False)
    t1 = time.perf_counter()
    lb = lower_bound(demands, inv, cands, Options())
    t2 = time.perf_counter()
    return {"lp_relaxation_gpus": lp, "lp_relaxation_s": round(t1 - t0, 3),
            "lower_bound_gpus": lb, "lower_bound_s": round(t2 - t1, 3)}


def other_seed(n: int, seed: int, base: ProfileSet) -> dict:
    """A short check of another fleet: both bounds, greedy and MILP (no baselines)."""
    demands, ps, inv = fleet(n, seed, base)
    row: dict = {"models": n, "seed": seed, **lower_bounds(demands, ps, inv)}
    for method in ("greedy", "milp"):
        t0 = time.perf_counter()
        plan = solve(demands, ps, inv, method, time_limit=MILP_LIMIT.get(n, 30.0), bound=False)
        row[f"{method}_s"] = round(time.perf_counter() - t0, 3)
        plan.verify()
        row[f"{method}_gpus"] = plan.gpu_count
        if method == "milp":
            row["milp_proven_bound_gpus"] = plan.proven_bound
    lb = row["lower_bound_gpus"]
    row["best_vs_bound"] = round(min(row["greedy_gpus"], row["milp_gpus"]) / lb, 4) if lb else None
    return row


def run_one(n: int, seed: int, base: ProfileSet, rates: tuple[float, float] = RATE_RANGE) -> dict:
    demands, ps, inv = fleet(n, seed, base, rates)
    runs: dict[str, Plan] = {}
    t: dict[str, float] = {}

    big = pool(2 * n)  # the baselines may need more GPUs than the planned pool holds

    def go(label: str, method: str, opts: Options = DEFAULT, **kw) -> None:
        t0 = time.perf_counter()
        runs[label] = solve(demands, ps, inv if opts == DEFAULT else big, method, options=opts, bound=False, **kw)
        t[label] = time.perf_counter() - t0
        runs[label].verify()

    go("greedy", "greedy")
    go("milp", "milp", time_limit=MILP_LIMIT.get(n, 30.0))
    go("whole-gpu-per-model", "greedy", Options(mig=False, mps=False))
    go("mig-only-greedy", "greedy", Options(mig=True, mps=False, whole=False))
    go("mps-only-greedy", "greedy", Options(mig=False, mps=True))
    bounds = lower_bounds(demands, ps, inv)
    lb = bounds["lower_bound_gpus"]
    best = min(runs["greedy"].gpu_count, runs["milp"].gpu_count)
    proven = runs["milp"].proven_bound
    row = {
        "models": n, "rates": list(rates), "milp_proven_bound_gpus": proven, "pool_gpus": sum(len(c.ids) for c in inv.classes),
        **bounds,
        "total_rate": round(sum(d.rate for d in demands), 1),
        "plans": {k: {"gpus": p.gpu_count, "method": p.method, "cost_per_hour": round(p.cost_per_hour, 2),
                      "solve_s": round(t[k], 3), "vs_bound": round(p.gpu_count / lb, 4) if lb else None}
                  for k, p in runs.items()},
        "best_vs_bound": round(best / lb, 4) if lb else None,
        "best_vs_proven": round(best / proven, 4) if proven else None,
        "greedy_saving_vs_mig_only": round(1 - runs["greedy"].gpu_count / runs["mig-only-greedy"].gpu_count, 4),
        "saving_vs_whole_gpu": round(1 - best / runs["whole-gpu-per-model"].gpu_count, 4),
        "saving_vs_mig_only": round(1 - best / runs["mig-only-greedy"].gpu_count, 4),
    }
    return row


FLEET_TARGET_S = 10.0
FLEET_TARGET_MB = 1024.0


def _child(cmd: list[str], out: Path) -> tuple[int, float, float, float]:
    """Run ``cmd`` with stdout to ``out``: (exit code, wall seconds, peak RSS in MB, CPU seconds)."""
    with out.open("wb") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {err.strip()[-500:]}")
    return proc.returncode, wall, usage.ru_maxrss / 1024.0, usage.ru_utime + usage.ru_stime


# (method, profile file format, beside a CPU-bound process)
# (method, profile file format, beside a CPU-bound process, --bound): the greedy computes its
# lower bound only when asked, so its time is measured without and its gap with
FLEET_RUNS = (("greedy", "yaml", False, False), ("greedy", "json", False, False), ("greedy", "yaml", False, True),
              ("milp", "json", False, False), ("milp", "json", True, False))


class CpuHog:
    """A CPU-bound child process for the span of a ``with`` block, stopped by its own pid."""

    def __enter__(self) -> CpuHog:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def _decided(doc: dict) -> dict:
    """A plan's YAML less its timings: what two runs of a deterministic solve must agree on."""
    return {**doc, "status": {k: v for k, v in doc["status"].items() if k not in ("solve_seconds", "bound_seconds")}}


def run_fleet(models: int, gpus: int, milp_limit: float | None) -> dict:
    """``headrace plan`` end to end on the generated fleet: greedy with the profiles as YAML
    and as JSON, the MILP with them as JSON twice (once beside a CPU-bound process); with the
    floor (imports, reading each file); then the MILP on the overfull pool."""
    limit_args = [] if milp_limit is None else ["--time-limit", f"{milp_limit:g}"]
    with tempfile.TemporaryDirectory(prefix="headrace-fleet-") as tmp:
        fleet_docs = generate(models, gpus, FLEET_SEED)
        paths = {fmt: fleet_docs.write(tmp, fmt) for fmt in ("yaml", "json")}
        py = [sys.executable, "-m"]
        floor: dict = {}
        _, floor["import_s"], floor["import_mb"], _ = _child(py + ["deploy.cli", "--help"], Path(tmp) / "help.txt")
        for fmt in ("yaml", "json"):
            parse = f"from profiles.profile import load_profiles; load_profiles({str(paths[fmt]['profiles'])!r})"
            _, floor[f"parse_{fmt}_s"], floor[f"parse_{fmt}_mb"], _ = _child([sys.executable, "-c", parse],
                                                                              Path(tmp) / "parse.txt")
        row: dict = {"models": models, "gpus": gpus, "seed": FLEET_SEED,
                     "milp_time_limit_s": TIME_LIMIT if milp_limit is None else milp_limit,
                     "milp_effort": asdict(EFFORT), "cpus": os.cpu_count(),
                     "floor": {k: round(v, 2) for k, v in floor.items()},
                     "profiles_mb": {fmt: round(paths[fmt]["profiles"].stat().st_size / 2**20, 1) for fmt in paths},
                     "plans": {}}
        decided = {}
        for method, fmt, hog, bound in FLEET_RUNS:
            p = paths[fmt]
            out = Path(tmp) / f"{method}-{fmt}-{hog}-{bound}.yaml"
            cmd = py + ["deploy.cli", "plan", "-f", str(p["pool"]), "-f", str(p["models"]), "--profiles",
                        str(p["profiles"]), "--method", method, *limit_args, "--output", "yaml",
                        *(["--bound"] if bound else [])]
            load = os.getloadavg()[0]
            if hog:
                with CpuHog():
                    _, wall, rss, cpu = _child(cmd, out)
            else:
                _, wall, rss, cpu = _child(cmd, out)
            doc = yaml.load(out.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            st = doc["status"]
            lb = st["lower_bound"]
            key = f"{method} ({fmt} profiles{', --bound' if bound else ''}{', beside a CPU-bound process' if hog else ''})"
            decided[key] = _decided(doc)
            row["plans"][key] = {"method_run": method, "profiles": fmt, "cpu_hog": hog, "bound": bound or method != "greedy",
                                 "wall_s": round(wall, 2),
                                 "cpu_s": round(cpu, 2), "load_avg_1m": round(load, 2),
                                 "peak_rss_mb": round(rss, 1), "gpus": st["gpus"], "lower_bound": lb,
                                 "proven_bound": st["proven_bound"], "method": doc["metadata"]["method"],
                                 "solve_s": st["solve_seconds"], "bound_s": st["bound_seconds"],
                                 "plan_s": round(st["solve_seconds"] - st["bound_seconds"], 3),
                                 "vs_bound": round(st["gpus"] / lb, 4) if lb else None,
                                 "partial": st.get("partial"), "short_models": len(st.get("shortfall") or [])}
            print(json.dumps({key: row["plans"][key]}), flush=True)
        milps = [k for k in decided if k.startswith("milp")]
        row["milp_runs_same_plan"] = all(decided[k] == decided[milps[0]] for k in milps)
        row["overfull"] = run_overfull(fleet_docs, milp_limit)
    return row


def run_overfull(fleet_docs: Fleet, milp_limit: float | None) -> dict:
    """The MILP on the fleet's pool cut to the GPUs the greedy gives its guaranteed models alone
    (in this process: the solve's own wall time against its limit)."""
    from bench.placement_sharing import cut_pool, per_class  # noqa: PLC0415  (imports the simulator)

    demands, ps, inv = fleet_docs.problem()
    ps = with_derived(ps, gpus=tuple(sorted({c.gpu for c in inv.classes})))
    pool = cut_pool(inv, per_class(solve([d for d in demands if d.guaranteed], ps, inv, "greedy", bound=False)))
    limit = TIME_LIMIT if milp_limit is None else milp_limit
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    plan = solve(demands, ps, pool, "milp", time_limit=limit)
    wall = time.perf_counter() - t0
    plan.verify()
    out = {"pool_gpus": sum(len(c.ids) for c in pool.classes), "time_limit_s": limit, "wall_s": round(wall, 2),
           "load_avg_1m": round(load, 2), "method": plan.method, "gpus": plan.gpu_count,
           "short_models": len(plan.shortfall), "unplaced_rps": round(sum(s.unplaced for s in plan.shortfall), 1),
           "within_limit": wall <= limit}
    print(json.dumps({"overfull": out}), flush=True)
    return out


def fleet_only_markdown(result: dict) -> str:
    """placement_solver_fleet.md: the generated fleet alone (``--only-fleet``)."""
    head = [f"`{result['meta']['command']}` at commit {result['commit']} on {result['meta']['machine']}."] \
        if result.get("commit") else []
    return "\n".join(["# Placement solver benchmark: the generated fleet", "", *head,
                      *fleet_markdown(result["fleet"])]) + "\n"


def fleet_markdown(row: dict | None) -> list[str]:
    if not row:
        return []
    f = row["floor"]
    mb = row["profiles_mb"]
    lines = ["", f"## The generated fleet: {row['models']:,} models on {row['gpus']} GPUs, `headrace plan` end to end", "",
             f"`bench.fleet` seed {row['seed']} (20% best-effort, headroom 1.1, A100-40GB/80GB, H100, H200, A30), "
             f"each plan a `headrace plan -f pool.yaml -f models.yaml --profiles PROFILES --output yaml` child "
             f"process, PROFILES the same profile documents written either as `profiles.yaml` (a YAML stream, "
             f"{mb['yaml']} MB, read by libyaml) or as `profiles.json` (one JSON list, {mb['json']} MB, read by "
             f"`json`; `headrace plan --profiles` takes either). Floor of this machine in the same run: starting "
             f"`headrace` (imports alone) {f['import_s']} s, {f['import_mb']:.0f} MB; reading and validating the "
             f"profile file: YAML {f['parse_yaml_s']} s ({f['parse_yaml_mb']:.0f} MB), JSON {f['parse_json_s']} s "
             f"({f['parse_json_mb']:.0f} MB). The MILP runs at its default limit, a safety stop of "
             f"{row['milp_time_limit_s']:g} s{_effort_text(row)}. Load average: the host's, 1 minute, when each "
             f"run started ({row.get('cpus', '?')} CPUs). Solve s "
             f"is the whole solve; plan s the solve less the lower bound's own time (the greedy's bound is "
             f"computed after its plan{', only with --bound' if any('bound' in p for p in row['plans'].values()) else ''}; "
             f"the MILP builds its master from the bound, so it is judged on the whole solve).", "",
             "| method (profile file) | wall s | CPU s | load avg | peak RSS MB | GPUs | lower bound | x lower bound "
             "| MILP proven bound | solve s (in the plan) | plan s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, p in row["plans"].items():
        lines.append(f"| {key} | {p['wall_s']} | {p.get('cpu_s', '-')} | {p.get('load_avg_1m', '-')} | "
                     f"{p['peak_rss_mb']:.0f} | {p['gpus']} | "
                     f"{p['lower_bound']:g} | {p['vs_bound'] or '-'} | {p['proven_bound']:g} | {p['solve_s']} | "
                     f"{p.get('plan_s', '-')} |")
    verdicts = []
    for key, p in row["plans"].items():
        if p["method_run"] == "greedy" and "bound" not in p:  # results from before --bound: one verdict
            ok = p["wall_s"] <= FLEET_TARGET_S and p["peak_rss_mb"] <= FLEET_TARGET_MB
            verdicts.append(f"{key} <= {FLEET_TARGET_S:g} s wall and <= {FLEET_TARGET_MB:g} MB: "
                            f"{'met' if ok else 'not met'} ({p['wall_s']} s, {p['peak_rss_mb']:.0f} MB), within "
                            f"1.10x the bound: {'met' if p['vs_bound'] and p['vs_bound'] <= 1.10 else 'not met'} "
                            f"({p['vs_bound']})")
        elif p["method_run"] == "greedy" and not p["bound"]:
            ok = p["wall_s"] <= FLEET_TARGET_S and p["peak_rss_mb"] <= FLEET_TARGET_MB
            verdicts.append(f"{key} <= {FLEET_TARGET_S:g} s wall and <= {FLEET_TARGET_MB:g} MB: "
                            f"{'met' if ok else 'not met'} ({p['wall_s']} s, {p['peak_rss_mb']:.0f} MB)")
        elif p["method_run"] == "greedy":
            verdicts.append(f"{key} within 1.10x the bound: "
                            f"{'met' if p['vs_bound'] and p['vs_bound'] <= 1.10 else 'not met'} ({p['vs_bound']})")
        else:
            ok = p["vs_bound"] and p["vs_bound"] <= 1.03 and p["solve_s"] <= 60.0
            verdicts.append(f"{key} <= 1.03x within 60 s: {'met' if ok else 'not met'} "
                            f"({p['vs_bound']}, the whole solve in {p['solve_s']} s)")
    if "milp_runs_same_plan" in row:
        gpus = sorted({p["gpus"] for p in row["plans"].values() if p["method_run"] == "milp"})
        verdicts.append(f"the MILP's runs (one beside a CPU-bound process) give the same GPU count: "
                        f"{'met' if len(gpus) == 1 else 'not met'} ({', '.join(map(str, gpus))} GPUs; the same plan: "
                        f"{'yes' if row['milp_runs_same_plan'] else 'no'})")
    over = row.get("overfull")
    if over:
        lines += ["", f"Overfull pool: the fleet on {over['pool_gpus']} GPUs (the greedy's for the guaranteed models "
                  f"alone), the MILP in this process: {over['gpus']} GPUs, {over['short_models']} best-effort models "
                  f"placed short ({over['unplaced_rps']:g} req/s unplaced), method `{over['method']}`, "
                  f"{over['wall_s']} s against its {over['time_limit_s']:g} s limit (load average "
                  f"{over['load_avg_1m']})."]
        verdicts.append(f"the overfull pool's MILP within its limit: {'met' if over['within_limit'] else 'not met'} "
                        f"({over['wall_s']} s of {over['time_limit_s']:g} s)")
    lines += ["", "Targets: " + "; ".join(verdicts) + "."]
    return lines


def _effort_text(row: dict) -> str:
    e = row.get("milp_effort")
    if not e:
        return ""
    return (f"; its search stops on work: at most {e['master_nodes']:,} HiGHS nodes per run of the integer "
            f"master, {e['program_nodes']:,} for the program, {e['tie_nodes']:,} per tie-break run")


ACCURACY_RATES = (50.0, 2000.0)
ACCURACY_LIMIT = 30.0


def accuracy_fleet(n: int, seed: int, base: ProfileSet) -> tuple[list[Demand], ProfileSet]:
    rng = np.random.default_rng(seed)
    family = [p for p in base if p.model == "imagenet" and p.gpu == "A100-80GB"]
    demands, profs = [], []
    for i in range(n):
        name = f"imagenet-{i:03d}"
        rate = float(math.exp(rng.uniform(*np.log(ACCURACY_RATES))))
        slo = int(rng.integers(100, 201)) / 1e3
        demands.append(Demand(name, round(rate, 1), slo, headroom=1.1))
        profs += [replace(p, model=name, variant=f"{name}:{p.variant}") for p in family]
    return demands, ProfileSet(profs)


def run_accuracy(n: int, seed: int, base: ProfileSet) -> dict:
    """Mean accuracy against budget (MILP and greedy), and the fewest GPUs under a mean floor."""
    demands, ps = accuracy_fleet(n, seed, base)
    gpus = GpuClass("A100-80GB", tuple(f"a100-{k}/gpu0" for k in range(4 * n)), 2.0)

    def go(method: str, **kw) -> tuple[Plan, float]:
        inv = Inventory((gpus,), **kw)
        t0 = time.perf_counter()
        plan = solve(demands, ps, inv, method, time_limit=ACCURACY_LIMIT, bound=False)
        secs = time.perf_counter() - t0
        plan.verify()
        return plan, secs

    fewest, t_fewest = go("milp")
    accurate, t_acc = go("milp", objective="accuracy")
    lo, hi = fewest.gpu_count, accurate.gpu_count
    budgets = sorted({lo, lo + (hi - lo) // 4, lo + (hi - lo) // 2, lo + 3 * (hi - lo) // 4, hi})
    points = []
    for b in budgets:
        row: dict = {"max_gpus": b}
        for method in ("milp", "greedy"):
            try:
                plan, secs = go(method, objective="accuracy", max_gpus=b)
            except SolverError as e:
                row[method] = {"gpus": None, "mean_accuracy": None, "gap": None, "solve_s": None, "error": str(e)}
                continue
            row[method] = {"gpus": plan.gpu_count, "mean_accuracy": round(plan.mean_accuracy() or 0.0, 5),
                           "gap": None if plan.gap == float("inf") else round(plan.gap, 6),
                           "method": plan.method, "solve_s": round(secs, 3)}
        points.append(row)
    floor = round((fewest.mean_accuracy() + accurate.mean_accuracy()) / 2, 4)
    floors: dict = {"mean_accuracy_floor": floor}
    for method in ("milp", "greedy"):
        plan, secs = go(method, mean_accuracy_floor=floor)
        floors[method] = {"gpus": plan.gpu_count, "mean_accuracy": round(plan.mean_accuracy() or 0.0, 5),
                          "proven_bound": plan.proven_bound, "method": plan.method, "solve_s": round(secs, 3)}
    return {"models": n, "seed": seed, "total_rate": round(sum(d.rate for d in demands), 1),
            "fewest_gpus": {"gpus": lo, "mean_accuracy": round(fewest.mean_accuracy() or 0.0, 5),
                            "solve_s": round(t_fewest, 3)},
            "most_accurate": {"gpus": hi, "mean_accuracy": round(accurate.mean_accuracy() or 0.0, 5),
                              "solve_s": round(t_acc, 3)},
            "budgets": points, "floor": floors}


def _cut(plan: dict) -> str:
    """``*`` after the seconds of a MILP solve the safety stop cut short."""
    return "*" if str(plan.get("method", "")).endswith("[time-limit]") else ""


def accuracy_markdown(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = ["", "## Accuracy within a budget", "",
             f"Copies of the imagenet family (ResNet-50 0.7613, ViT-B/16 0.81072 top-1, A100-80GB slices), rates "
             f"log-uniform {ACCURACY_RATES[0]:g}-{ACCURACY_RATES[1]:g} req/s, SLOs 100-200 ms, headroom 1.1. "
             "Mean accuracy: rate-weighted over every answer, each model's answers split as the gateway fills "
             f"its variants (most accurate first). MILP safety stop {ACCURACY_LIMIT:g} s per solve (* marks a solve "
             f"it cut short before its work budget ran out: that plan may differ between runs); every plan "
             "passed `Plan.verify()`.", "",
             "| models | max GPUs | MILP GPUs | MILP mean accuracy | MILP gap | MILP s | greedy GPUs "
             "| greedy mean accuracy | greedy s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['models']} | fewest (objective gpus) | {r['fewest_gpus']['gpus']} | "
                     f"{r['fewest_gpus']['mean_accuracy']} | | {r['fewest_gpus']['solve_s']} | | | |")
        for p in r["budgets"]:
            m, g = p["milp"], p["greedy"]
            greedy = (f"{g['gpus']} | {g['mean_accuracy']} | {g['solve_s']}" if g["gpus"] is not None
                      else "no plan within the budget | - | -")
            lines.append(f"| {r['models']} | {p['max_gpus']} | {m['gpus']} | {m['mean_accuracy']} | "
                         f"{m['gap'] if m['gap'] is not None else '-'} | {m['solve_s']}{_cut(m)} | {greedy} |")
    lines += ["", "Fewest GPUs with every model's mean accuracy at least the floor (halfway between the "
              "fewest-GPU plan's and the all-ViT plan's):", "",
              "| models | floor | MILP GPUs | MILP proven bound | MILP s | greedy GPUs | greedy s |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        f = r["floor"]
        lines.append(f"| {r['models']} | {f['mean_accuracy_floor']} | {f['milp']['gpus']} | "
                     f"{f['milp']['proven_bound']:g} | {f['milp']['solve_s']}{_cut(f['milp'])} | {f['greedy']['gpus']} | "
                     f"{f['greedy']['solve_s']} |")
    return lines


def markdown(rows: list[dict], meta: dict, others: list[dict] = (), accuracy: list[dict] = (),
             fleet_row: dict | None = None) -> str:
    commit = meta.get("commit")
    lines = [
        "# Placement solver benchmark", "",
        f"`{meta['command']}`{f' at commit {commit}' if commit else ''} on {meta['machine']}, seed {meta['seed']}. "
        "Rates log-uniform "
        f"{RATE_RANGE[0]:g}-{RATE_RANGE[1]:g} req/s (one sparse 100-model fleet at "
        f"{SPARSE_RATE_RANGE[0]:g}-{SPARSE_RATE_RANGE[1]:g}), SLOs {SLO_RANGE_MS[0]}-{SLO_RANGE_MS[1]} ms, pools of "
        "A100-80GB + H100-80GB (n/2 GPUs; baselines get 2n), objective: fewest GPUs. Every plan passed `Plan.verify()`.", "",
        "Lower bound: the solver's `lower_bound()`, the LP relaxation with rounding cuts raised by a Lagrangian "
        "bound that charges every model whole replicas (valid for every plan on the candidate grid). The LP "
        "relaxation alone is the row above it.", "",
        "| models | rates req/s | method | GPUs | $/h | x lower bound | solve s |", "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tag = f"{r['models']} | {r['rates'][0]:g}-{r['rates'][1]:g}"
        lines.append(f"| {tag} | LP relaxation (with rounding cuts) | {r['lp_relaxation_gpus']:g} | | | {r['lp_relaxation_s']} |")
        lines.append(f"| {tag} | lower bound (LP + Lagrangian) | {r['lower_bound_gpus']:g} | | 1.000 | {r['lower_bound_s']} |")
        lines.append(f"| {tag} | MILP proven bound | {r['milp_proven_bound_gpus']:g} | | | |")
        for k, p in r["plans"].items():
            name = k if "->" not in p.get("method", "") else f"{k} (no MILP solution in time: {p['method']})"
            lines.append(f"| {tag} | {name} | {p['gpus']} | {p['cost_per_hour']} | "
                         f"{p['vs_bound'] if p['vs_bound'] is not None else '-'} | {p['solve_s']} |")
    lines += ["", "| models | rates | best / lower bound | best / proven | fewer GPUs than whole-GPU-per-model "
              "| fewer than MIG-only greedy (best; greedy alone) |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['models']} | {r['rates'][0]:g}-{r['rates'][1]:g} | {r['best_vs_bound']} | "
                     f"{r['best_vs_proven']} | {r['saving_vs_whole_gpu']:.1%} | "
                     f"{r['saving_vs_mig_only']:.1%}; {r['greedy_saving_vs_mig_only']:.1%} |")
    if others:
        lines += ["", f"Other seeds ({RATE_RANGE[0]:g}-{RATE_RANGE[1]:g} req/s; GPUs, solve s in brackets):", "",
                  "| models | seed | LP relaxation | lower bound | MILP proven bound | greedy | milp | best / lower bound |",
                  "|---|---|---|---|---|---|---|---|"]
        for o in others:
            lines.append(f"| {o['models']} | {o['seed']} | {o['lp_relaxation_gpus']:g} ({o['lp_relaxation_s']}) | "
                         f"{o['lower_bound_gpus']:g} ({o['lower_bound_s']}) | {o['milp_proven_bound_gpus']:g} | "
                         f"{o['greedy_gpus']} ({o['greedy_s']}) | {o['milp_gpus']} ({o['milp_s']}) | {o['best_vs_bound']} |")
    lines += ["", "Targets: <= 1.03x the lower bound at 100 models; >= 25% fewer GPUs than whole-GPU-per-model "
              "and >= 10% fewer than MIG-only greedy; 1,000 models on 500 GPUs planned (greedy) in <= 10 s.", ""]
    lines += fleet_markdown(fleet_row)
    lines += accuracy_markdown(list(accuracy))
    return "\n".join(lines) + ("\n" if accuracy or fleet_row else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-sparse", action="store_true", help="skip the sparse 100-model fleet")
    ap.add_argument("--other-seeds", default="2,3", help="seeds of the short 100-model check ('' for none)")
    ap.add_argument("--accuracy-sizes", default="10,50", help="imagenet fleets planned for accuracy ('' for none)")
    ap.add_argument("--fleet", default="1000/500", help="MODELS/GPUS of the generated fleet ('' for none)")
    ap.add_argument("--fleet-milp-limit", type=float, default=None,
                    help="headrace plan --time-limit of the fleet's MILP runs (s; default: the planner's)")
    ap.add_argument("--only-fleet", action="store_true",
                    help="the generated fleet alone, into placement_solver_fleet.{json,md}")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    commit = headrace_version()["commit"]  # the tree it runs on, before anything else lands
    fleet_row = None
    if args.fleet:
        n_models, n_gpus = (int(x) for x in args.fleet.split("/"))
        fleet_row = run_fleet(n_models, n_gpus, args.fleet_milp_limit)
    if args.only_fleet:
        meta = {"command": "python -m bench.placement_solver " + " ".join(sys.argv[1:] if argv is None else argv),
                "machine": f"{platform.machine()} {platform.python_version()}"}
        result = {"commit": commit, "meta": meta, "fleet": fleet_row}
        text = fleet_only_markdown(result)
        write_results(args.out, "placement_solver_fleet", result, text)
        print(text)
        return 0
    base = with_derived(ProfileSet.reference())
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        row = run_one(n, args.seed, base)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if not args.no_sparse:
        rows.append(run_one(100, args.seed, base, SPARSE_RATE_RANGE))
        print(json.dumps(rows[-1]), flush=True)
    others = []
    for seed in (int(x) for x in args.other_seeds.split(",") if x):
        others.append(other_seed(100, seed, base))
        print(json.dumps(others[-1]), flush=True)
    accuracy = []
    for n in (int(x) for x in args.accuracy_sizes.split(",") if x):
        accuracy.append(run_accuracy(n, args.seed, base))
        print(json.dumps(accuracy[-1]), flush=True)
    meta = {"command": "python -m bench.placement_solver " + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": f"{platform.machine()} {platform.python_version()}", "seed": args.seed, "commit": commit,
            "other_seeds": [o["seed"] for o in others]}
    text = markdown(rows, meta, others, accuracy, fleet_row)
    write_results(args.out, "placement_solver", {"commit": commit, "meta": meta, "rows": rows, "other_seeds": others,
                                                 "accuracy": accuracy, "fleet": fleet_row}, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
