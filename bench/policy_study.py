"""Batch-policy study in virtual time: which policy finishes the most requests within SLO?

Setup (issue 5): ResNet-50 on A100-80GB 1g.10gb, t(b) = 8.4 + 2.346·b ms (the reference
profile's p50, served deterministically; the policies predict with its p99, which the published
fit gives equal to p50; the fallback fit built without the YAML takes p99 2% higher),
max batch 32, SLO 100 ms, Poisson and Gamma(CV=4) arrivals, one replica. Every system is the
same EdfScheduler with a different registered policy, driven by loadgen.sim.simulator, so the
comparison is like for like and runs in one process. Beside them, the clairvoyant bound
(bench.policy_bound): the most any one-replica scheduler could finish on the same arrivals
if it knew them all in advance.

    .venv/bin/python -m bench.policy_study            # full study (~15 min on one core)
    .venv/bin/python -m bench.policy_study --quick    # 15 s of arrivals per point

Writes bench/results/policy_study.{json,md}. Results are virtual-time, hence exact for a seed
and independent of machine load.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

import numpy as np

from bench.output import write_results
from bench.policy_bound import clairvoyant_ok, served_latency
from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.types import ReplicaInfo
from loadgen.arrivals import make_process, times
from loadgen.sim.simulator import SimReplica, Simulator, make_requests
from profiles.profile import LatencyPoint, Profile, ProfileError, ProfileSet, Provenance

RATES = (150, 250, 300, 330, 350, 500, 1000)
BOUND = "clairvoyant bound"  # not a policy: the most any scheduler could finish (bench.policy_bound)
PLAN = "adaptive"  # the default batcher with admission plan
PROTECT = "adaptive admit-protect"  # the default batcher with every refusal made at arrival
BURST = "adaptive admit-burst"  # protect only while arrivals outrun capacity
SLO = 0.100
MAX_BATCH = 32
OUT = Path(__file__).parent / "results"


@cache
def study_profile() -> Profile:
    """The reference profile, or the same fit built in code if the YAML is not there (read once
    per process: every point of a study, and every task of a worker, uses the same one)."""
    try:
        return ProfileSet.reference().get("resnet50", "A100-80GB", "1g.10gb").with_max_batch(MAX_BATCH)
    except ProfileError:
        def t(b: int) -> float:
            return max(7.86, 8.4 + 2.346 * b) / 1e3
        pts = tuple(LatencyPoint(b, t(b), t(b) * 1.02) for b in (1, MAX_BATCH))
        return Profile("resnet50", "resnet50", "A100-80GB", "1g.10gb", MAX_BATCH, pts,
                       provenance=Provenance("MIGPerf fit t(b)=max(7.86, 8.4+2.346b) ms", "fit"))


@dataclass(frozen=True)
class System:
    label: str
    config: SchedulerConfig
    family: str  # systems of one family are tuning variants; the table keeps each family's best


# every system names its admission: the rows keep their meaning whatever SchedulerConfig()'s default
SYSTEMS = (
    System("triton default", SchedulerConfig(policy="take-all", admission="plan"), "triton default"),
    *(System(f"triton delay={d * 1e3:g}ms timeout={'-' if to is None else f'{to * 1e3:g}ms'}",
             SchedulerConfig(policy="take-all", admission="plan", max_queue_delay_s=d, queue_timeout_s=to),
             "triton tuned")
      for d, to in ((0.002, None), (0.005, None), (0.0, SLO), (0.005, SLO), (0.0, 0.05))),
    System("largest-prefix", SchedulerConfig(policy="largest-prefix", admission="plan"), "largest-prefix"),
    System("skip-heads", SchedulerConfig(policy="skip-heads", admission="plan"), "skip-heads"),
    System("adaptive", SchedulerConfig(policy="adaptive", admission="plan"), "adaptive"),
    System("adaptive +wait", SchedulerConfig(policy="adaptive", admission="plan", wait=True), "adaptive +wait"),
    System("adaptive admit-protect", SchedulerConfig(policy="adaptive", admission="protect"),
           "adaptive admit-protect"),
    System("adaptive admit-alone", SchedulerConfig(policy="adaptive", admission="alone"),
           "adaptive admit-alone"),
    System("adaptive admit-burst", SchedulerConfig(policy="adaptive", admission="burst"),
           "adaptive admit-burst"),
)
# the family whose config is SchedulerConfig()'s default
DEFAULT = next(s.family for s in SYSTEMS if s.config == SchedulerConfig())


def arrivals(arrival: str, rate: float, duration: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return times(make_process(arrival, rate, 4.0 if arrival == "gamma" else 1.0), duration, rng)


def bound_point(arrival: str, rate: float, duration: float, seed: int, profile: Profile) -> dict:
    """The clairvoyant bound on the same arrivals and the same (served) latencies."""
    ts = arrivals(arrival, rate, duration, seed)
    ok = clairvoyant_ok(ts.tolist(), served_latency(profile, MAX_BATCH), SLO, MAX_BATCH)
    return {"system": BOUND, "family": BOUND, "arrival": arrival, "rate": rate, "seed": seed,
            "offered": len(ts), "ok": ok, "attainment": ok / max(len(ts), 1), "goodput_rps": ok / duration}


def run_point(system: System, arrival: str, rate: float, duration: float, seed: int,
              profile: Profile) -> dict:
    ts = arrivals(arrival, rate, duration, seed)
    core = EdfScheduler(system.config)
    info = ReplicaInfo("r0", "resnet50", profile.variant, profile, MAX_BATCH)
    res = Simulator(core, [SimReplica(info)], service="p50").run(make_requests(ts, "resnet50", SLO))
    s = res.summary()
    s["goodput_rps"] = s["ok"] / duration  # per second of offered load
    return {"system": system.label, "family": system.family, "arrival": arrival, "rate": rate,
            "seed": seed, **s}


def max_rate_at(point: Callable[..., dict], target: float, duration: float, seeds: list[int],
                profile: Profile, lo: float = 150.0, hi: float = 383.0, tol: float = 2.0) -> float:
    """Highest Poisson rate (to ``tol``) whose attainment, averaged over seeds, is >= target;
    ``point(arrival, rate, duration, seed, profile)`` runs one point (a policy or the bound)."""
    def ok(rate: float) -> bool:
        att = [point("poisson", rate, duration, s, profile)["attainment"] for s in seeds]
        return float(np.mean(att)) >= target
    if not ok(lo):
        return 0.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return round(lo, 1)


def best_of_family(rows: list[dict]) -> dict[tuple[str, str, float], dict]:
    best: dict[tuple[str, str, float], dict] = {}
    for r in rows:
        k = (r["family"], r["arrival"], r["rate"])
        if k not in best or r["goodput_rps"] > best[k]["goodput_rps"]:
            best[k] = r
    return best


def markdown(result: dict) -> str:
    best = best_of_family(result["points"])
    fams = list(dict.fromkeys(s.family for s in SYSTEMS))
    if any(r["family"] == BOUND for r in result["points"]):
        fams.append(BOUND)
    lines = [
        "# Batch-policy study (virtual time)", "",
        f"ResNet-50 A100-80GB 1g.10gb, t(b)=8.4+2.346·b ms (p50, deterministic), max batch {MAX_BATCH}, "
        f"SLO {SLO * 1e3:g} ms, one replica; {result['duration_s']:g} s of arrivals per point, seed "
        f"{result['seeds'][0]}. Command: `{result['command']}`. \"triton tuned\" is the best of "
        f"{sum(1 for s in SYSTEMS if s.family == 'triton tuned')} max_queue_delay/queue-timeout settings per point.", "",
        "Attainment = answered within SLO / offered; goodput = answered within SLO per second; "
        "p50/p99 = latency of answered requests; rej = answered at once (429).", "",
    ]
    for arrival in ("poisson", "gamma"):
        lines += [f"## {arrival}{' CV=4' if arrival == 'gamma' else ''}", "",
                  "| rate | " + " | ".join(fams) + " |", "|---:|" + "---|" * len(fams)]
        for rate in RATES:
            cells = []
            for f in fams:
                r = best.get((f, arrival, float(rate)))
                if r is None:
                    cells.append("-")
                    continue
                if r["family"] == BOUND:
                    cells.append(f"{r['attainment'] * 100:.1f}% / {r['goodput_rps']:.0f}")
                    continue
                p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.0f}"
                rp99 = "" if r["reject_p99_ms"] is None else f" (p99 {r['reject_p99_ms']:.0f} ms)"
                cells.append(f"{r['attainment'] * 100:.1f}% / {r['goodput_rps']:.0f} / p99 {p99} / "
                             f"rej {r['rejected']}{rp99}")
            lines.append(f"| {rate} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["Cells: attainment / goodput req/s / p99 ms / rejections (p99 ms from arrival to the reject). "
              f"The {BOUND} (`bench/policy_bound.py`) is not a policy: it is the most requests any one-replica "
              "batch scheduler could finish in time on the same arrivals and latencies if it knew every arrival "
              "in advance (an exact dynamic programme), so no policy's cell can exceed it.", "",
              "## Highest Poisson rate at >= 99% attainment", "", "| system | req/s |", "|---|---:|"]
    lines += [f"| {k} | {v:g} |" for k, v in result["max_rate_99"].items()]
    b = best_of_family(result["points"])

    def att(f: str, arrival: str, rate: float) -> str:
        return f"{b[(f, arrival, rate)]['attainment'] * 100:.1f}%"

    def adm(f: str) -> str:
        return f"{(b[(f, 'gamma', 350.0)]['admitted_attainment'] or 0) * 100:.1f}%"

    lines += ["", "## Reading", "",
              f"- At 330 req/s Poisson: largest-prefix {att('largest-prefix', 'poisson', 330.0)}, Triton's "
              f"take-all {att('triton default', 'poisson', 330.0)}, skip-heads {att('skip-heads', 'poisson', 330.0)}, "
              f"adaptive {att(PLAN, 'poisson', 330.0)}: the largest-feasible-prefix rule starves throughput, "
              "skipping hopeless heads does not.",
              "- Waiting for a larger batch (adaptive +wait) never paid on this single-replica profile; it is "
              "off by default.",
              "- Admission 'protect' answers every reject at arrival (reject p99 ~0 ms instead of 60-90 ms) "
              "for about 1 point of attainment near capacity and 2-4% goodput under overload; 'alone' "
              "admits more and lets the batcher skip, best goodput under overload, latest rejects.",
              f"- Admitted requests on time at Gamma 350 (admitted = not refused at arrival): "
              f"{adm(PLAN)} with admission plan, {adm(PROTECT)} with protect, {adm(BURST)} with burst. "
              "Plan admits requests that a later burst makes the batcher skip (refused from the queue before "
              "their deadline); protect refuses at arrival instead, at the cost above; burst protects only "
              "while the last 50 ms of arrivals run above 1.5x capacity, so steady load is admitted as by plan.",
              f"- Default policy: {DEFAULT} (admission {SchedulerConfig().admission}, decided by "
              "`bench.admission_tradeoff`). Best on the study's criteria (99% rate, then "
              f"Gamma goodput): {result['chosen']}.", ""]
    if BOUND in result["max_rate_99"]:
        lines[-1:-1] = [
            f"- What knowing the future is worth: at 330 req/s Poisson the {BOUND} is "
            f"{att(BOUND, 'poisson', 330.0)} against {att(DEFAULT, 'poisson', 330.0)} for {DEFAULT}; it holds 99% up "
            f"to {result['max_rate_99'][BOUND]:g} req/s, {DEFAULT} to {result['max_rate_99'][DEFAULT]:g}. "
            f"99% at 330 allows losing 1% of requests, {_loss_ratio(b)} what the bound loses there "
            f"({100 - b[(BOUND, 'poisson', 330.0)]['attainment'] * 100:.2f}%).",
        ]
    for who in reported(result):
        lines += [f"## Targets for {who} (the live gateway's; here in zero-overhead virtual time)", ""]
        lines += [f"- {t['name']}: {t['value']} -> {'met' if t['met'] else 'NOT met'}"
                  for t in targets(result, who)]
        lines.append("")
    lines.append("")
    return "\n".join(lines)


def _loss_ratio(best: dict) -> str:
    bound_loss = 1 - best[(BOUND, "poisson", 330.0)]["attainment"]
    return "any multiple of" if bound_loss <= 0 else f"{0.01 / bound_loss:.1f}x"


def reported(result: dict) -> list[str]:
    """The families whose targets the study lists: the default, the study's pick, protect, burst."""
    return list(dict.fromkeys([DEFAULT, PLAN, result["chosen"], PROTECT, BURST]))


def targets(result: dict, chosen: str) -> list[dict]:
    best = best_of_family(result["points"])
    mine_g = best[(chosen, "gamma", 350.0)]
    tri_g = best[("triton default", "gamma", 350.0)]
    ratio = mine_g["goodput_rps"] / max(tri_g["goodput_rps"], 1e-9)
    peak = max(best[(chosen, "poisson", float(r))]["goodput_rps"] for r in RATES)
    at1000 = best[(chosen, "poisson", 1000.0)]["goodput_rps"]
    return [
        {"name": "Poisson rate at >= 99% attainment (>= 320, goal 330)",
         "value": result["max_rate_99"][chosen], "met": result["max_rate_99"][chosen] >= 320},
        {"name": "Gamma CV=4 350 req/s goodput vs triton default (>= 3.5x, goal 4x)",
         "value": f"{ratio:.2f}x ({mine_g['goodput_rps']:.0f} vs {tri_g['goodput_rps']:.0f})", "met": ratio >= 3.5},
        {"name": "Gamma CV=4 350 req/s admitted attainment (>= 99%; admitted = not refused at arrival)",
         "value": f"{(mine_g['admitted_attainment'] or 0) * 100:.2f}% (of the answers that carried a result: "
                  f"{(mine_g['answered_attainment'] or 0) * 100:.2f}%)",
         "met": (mine_g["admitted_attainment"] or 0) >= 0.99},
        {"name": "Poisson goodput at 1000 req/s within 5% of peak",
         "value": f"{at1000:.0f} vs peak {peak:.0f}", "met": at1000 >= 0.95 * peak},
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per point")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--search-seeds", type=int, default=2, help="seeds averaged in the 99%% search")
    ap.add_argument("--quick", action="store_true", help="15 s per point, one search seed")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--render", action="store_true", help="only re-render the markdown from the JSON in --out")
    args = ap.parse_args(argv)
    if args.render:
        result = json.loads((args.out / "policy_study.json").read_text())
        result["targets"] = {f: targets(result, f) for f in reported(result)}
        write_results(args.out, "policy_study", result, markdown(result))
        print(markdown(result))
        return 0
    if args.quick:
        args.duration, args.search_seeds = 15.0, 1
    profile = study_profile()
    t0 = time.perf_counter()
    points = []
    for arrival in ("poisson", "gamma"):
        for rate in RATES:
            for system in SYSTEMS:
                points.append(run_point(system, arrival, float(rate), args.duration, args.seed, profile))
            points.append(bound_point(arrival, float(rate), args.duration, args.seed, profile))
            print(f"{arrival} {rate} req/s done ({time.perf_counter() - t0:.0f} s)", flush=True)
    seeds = list(range(args.seed, args.seed + args.search_seeds))
    fam_rep = {}
    for s in SYSTEMS:
        fam_rep.setdefault(s.family, s)
    max99 = {f: max_rate_at(partial(run_point, s), 0.99, args.duration, seeds, profile) for f, s in fam_rep.items()
             if f != "triton tuned"}
    max99[BOUND] = max_rate_at(bound_point, 0.99, args.duration, seeds, profile)
    print(f"max rates: {max99} ({time.perf_counter() - t0:.0f} s)", flush=True)
    deadline_aware = [f for f in max99 if not f.startswith("triton") and f != BOUND]
    chosen = max(deadline_aware, key=lambda f: (max99[f], best_of_family(points)[(f, "gamma", 350.0)]["goodput_rps"]))
    result = {
        "command": "python -m bench.policy_study" + (" --quick" if args.quick else ""),
        "profile": profile.name, "slo_s": SLO, "max_batch": MAX_BATCH, "duration_s": args.duration,
        "seeds": seeds, "rates": list(RATES), "points": points, "max_rate_99": max99,
        "chosen": chosen, "wall_s": round(time.perf_counter() - t0, 1),
    }
    result["targets"] = {f: targets(result, f) for f in reported(result)}
    write_results(args.out, "policy_study", result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
