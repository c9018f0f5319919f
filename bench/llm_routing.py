"""Token-level routing: headrace's router against the routers in use today, on the same fleet,
the same arrivals and the same fixed variant (llama-3.1-8b-instruct bf16 on H100-80GB engines).

Routers: headrace (:class:`gateway.policy.llm.router.SloRouter`) and every baseline of
:mod:`gateway.policy.llm.baselines` (round-robin, least-request, Ray Serve's power of two,
SGLang's cache-aware router, llm-d's scorer mix with approximate and precise prefix scoring,
Dynamo's KV router with KV events and without). Workloads and SLOs, fixed by the issue:

| workload | engines | TTFT SLO | TPOT SLO |
|---|---|---|---|
| Mooncake conversation trace (shared prefixes) | 16 | 2 s | 50 ms |
| llm-d's shared prefix: 150 tenants x a 6k-token system prompt + a 1.2k-token question, 1,000 output tokens | 8 | 1 s | 50 ms |
| Azure LLM 2023 conversation trace (no prefix information) | 8 | 500 ms | 50 ms |

Each router is swept in the token-level simulator (:mod:`loadgen.llm.sim`) from light load up,
in shares of the fleet's upper bound (:mod:`loadgen.llm.bound`): a light point, then from half
the bound up by 1.25x while it passes (down by 0.8x while it fails), then one bisection between
its last passing and first failing rate: a goodput rate is known to within 12%. Its **goodput rate** is the highest
rate at which 90% of requests meet both SLOs (a refused request is a miss). Then every router
runs at 2x the best knee: its goodput there against its peak, and headrace with a priority mix
(critical / standard / sheddable) for the bands' attainment.

    .venv/bin/python -m bench.llm_routing [--quick] [--only WORKLOAD] [--routers a,b]

Writes bench/results/llm_routing.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.output import write_results
from gateway.policy.llm.predict import ReplicaModel
from gateway.policy.llm.routers import NAMES, make
from gateway.policy.llm.types import Band, RouterBase
from loadgen.llm.bound import fleet_bound
from loadgen.llm.sim import fleet, simulate, tenants_of
from loadgen.llm.stats import summarize
from loadgen.llm.workload import LengthDist, TraceRows, Workload, read_trace, shared_prefix, window
from loadgen.record import headrace_version
from profiles.llm.profile import LlmProfile, find_llm_profile

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TRACES = ROOT.parent / "shared" / "traces"
PROFILE = "llama-3.1-8b-instruct-bf16@H100-80GB/gpu"
TARGET = 0.9  # share of requests meeting both SLOs
ROUTERS = ("headrace", "round-robin", "least-request", "pow2", "sglang", "llm-d", "llm-d-precise", "dynamo",
           "dynamo-approx")
BISECTIONS = 1
LIGHT, START, MAX_SHARE = 0.1, 0.5, 2.0  # shares of the bound: the light point, the search's start, its end
# critical and standard together 0.8 of the knee at 2x it: room for both once sheddable is refused
MIX = {Band.CRITICAL: 0.2, Band.STANDARD: 0.2, Band.SHEDDABLE: 0.6}


@dataclass(frozen=True)
class Case:
    name: str
    engines: int
    ttft_s: float
    tpot_s: float
    requests: int  # per point: the same requests at every rate, spanning many request lengths at the knee
    note: str

    def work(self, rate: float, seed: int = 0) -> Workload:
        """The case's requests arriving at ``rate`` per second on average."""
        n = self.requests
        if self.name == "shared-prefix":
            rows = shared_prefix("poisson", rate, 1.0, None, n, LengthDist("fixed", 1000), seed)
            return Workload(self.name, rows, seed)
        rows = _trace(self.name)
        base = window(rows, START_S[self.name], requests=n)
        scale = rate / (len(base) / max(float(base.times[-1]), 1e-9))
        return Workload(self.name, window(rows, START_S[self.name], requests=n, rate_scale=scale), seed)


START_S = {"mooncake": 600.0, "azure-llm": 600.0}
_TRACES: dict[str, TraceRows] = {}


def _trace(kind: str) -> TraceRows:
    if kind not in _TRACES:
        _TRACES[kind] = read_trace(kind, TRACES)
    return _TRACES[kind]


CASES = (
    Case("mooncake", 16, 2.0, 0.05, 2000, "Mooncake conversation trace, shared prefixes"),
    Case("shared-prefix", 8, 1.0, 0.05, 2000, "llm-d shared prefix: 150 tenants x 6k system prompt + 1.2k question, "
         "1,000 output tokens"),
    Case("azure-llm", 8, 0.5, 0.05, 4000, "Azure LLM 2023 conversation trace, no prefix information"),
)
QUICK = 300  # requests per point in a smoke run


def profile() -> LlmProfile:
    return find_llm_profile(PROFILE)  # the reference profiles, read once


def router_of(name: str, seed: int = 0) -> RouterBase:
    return make(name, seed)


def run_point(case: Case, name: str, rate: float, bands: np.ndarray | None = None) -> dict[str, Any]:
    work = case.work(rate)
    res = simulate(work, fleet(profile(), case.engines), router_of(name), case.ttft_s, case.tpot_s,
                   band=bands, tenant=tenants_of(work))
    s = summarize(res.outcomes, res.elapsed_s, case.ttft_s * 1e3, case.tpot_s * 1e3)
    row = {"router": name, "rate": rate, "attainment": s["attainment"], "goodput_rps": rate * s["attainment"],
           "ttft_p50_ms": s["ttft_ms"]["p50"], "ttft_p90_ms": s["ttft_ms"]["p90"],
           "tpot_p50_ms": s["tpot_ms"]["p50"], "tpot_p90_ms": s["tpot_ms"]["p90"],
           "refused": sum(1 for o in res.outcomes if o.status == 429), "errors": s["errors"],
           "prefix_hit_rate": res.record()["prefix_hit_rate"], "preemptions": res.record()["preemptions"],
           "sim_wall_s": res.wall_s}
    if bands is not None:
        alone = feasible_alone(case, work)
        for b in Band:
            for suffix, keep in (("", None), ("_feasible", alone)):
                sel = [o for i, (o, x) in enumerate(zip(res.outcomes, bands, strict=True))
                       if x == b and (keep is None or keep[i])]
                met = summarize(sel, res.elapsed_s, case.ttft_s * 1e3, case.tpot_s * 1e3)["attainment"] if sel else None
                row[f"{b.name.lower()}_attainment{suffix}"] = met
            sel = [o for o, x in zip(res.outcomes, bands, strict=True) if x == b]
            row[f"{b.name.lower()}_refused"] = sum(1 for o in sel if o.status == 429) / len(sel) if sel else None
    return row


def feasible_alone(case: Case, work: Workload) -> np.ndarray:
    """Per request, whether an idle engine could meet its TTFT SLO with nothing cached: a request
    that fails it misses whatever any router does."""
    spec = fleet(profile(), 1)[0].replica()
    model = ReplicaModel(spec, spec.step_time)  # type: ignore[arg-type]
    return np.array([spec.frontend_s + model.prefill_s(int(n), 0, 0, 0.0) <= case.ttft_s
                     for n in work.rows.input_len])


def sweep(case: Case, name: str, bound: float, log: Callable[[str], None]) -> dict[str, Any]:
    """The router's goodput rate: a light point, then from half the bound up by 1.25x while it
    passes (down by 0.8x while it fails), then BISECTIONS between its last passing and first
    failing rate."""
    points: list[dict[str, Any]] = []

    def at(rate: float, how: str = "") -> bool:
        p = run_point(case, name, rate)
        points.append(p)
        log(f"  {case.name:13s} {name:14s} {rate:7.2f}/s attainment {p['attainment']:.3f} {how}")
        return p["attainment"] >= TARGET

    at(LIGHT * bound, "(light)")
    rate = START * bound
    ok, bad = (rate, None) if at(rate) else (None, rate)
    while ok is not None and bad is None and rate < MAX_SHARE * bound:
        rate *= 1.25
        if at(rate):
            ok = rate
        else:
            bad = rate
    while ok is None and rate > LIGHT * bound:
        rate *= 0.8
        if at(rate):
            ok = rate
        else:
            bad = rate
    if ok is not None and bad is not None:
        for _ in range(BISECTIONS):
            mid = (ok + bad) / 2
            if at(mid, "(bisect)"):
                ok = mid
            else:
                bad = mid
    good = ok or 0.0
    points.sort(key=lambda p: p["rate"])
    knee = next((p for p in points if p["rate"] == good), None)
    return {"router": name, "goodput_rate": good, "first_fail": bad,
            "peak_goodput_rps": max(p["goodput_rps"] or 0 for p in points), "at_knee": knee, "points": points}


def _sweep_job(args: tuple[Case, str, float]) -> dict[str, Any]:
    return sweep(*args, log=lambda m: print(m, flush=True))


def _point_job(args: tuple[Case, str, float, np.ndarray | None]) -> dict[str, Any]:
    return run_point(*args)


def bounds(case: Case) -> dict[str, Any]:
    """The fleet's bound for the case: sustained, and for a run of its ``requests`` (whose work may
    go on a TTFT SLO plus a mean decode at the TPOT SLO past the last arrival)."""
    p = profile()
    work = case.work(1.0)
    b = fleet_bound(work, p.step_time, p.engine_config(), case.engines, case.tpot_s, TARGET)
    tail = case.ttft_s + float(work.rows.output_len.mean()) * case.tpot_s
    return {**b.as_dict(), "run_rate": b.finite(case.requests, tail), "tail_s": tail}


def run_case(case: Case, routers: tuple[str, ...], log: Callable[[str], None], jobs: int = 2) -> dict[str, Any]:
    bound = bounds(case)
    log(f"{case.name}: {case.engines} engines, bound {bound['rate']:.2f} req/s sustained, "
        f"{bound['run_rate']:.2f} for this run")
    with ProcessPoolExecutor(jobs) as pool:
        results = dict(zip(routers, pool.map(_sweep_job, [(case, name, bound["rate"]) for name in routers]),
                           strict=True))
        knee = max(r["goodput_rate"] for r in results.values())
        rng = np.random.default_rng(7)
        bands = rng.choice([int(b) for b in MIX], size=case.requests, p=list(MIX.values()))
        jobs_at = [(case, name, 2 * knee, None) for name in routers]
        if "headrace" in routers:
            jobs_at.append((case, "headrace", 2 * knee, bands))
        at2 = list(pool.map(_point_job, jobs_at))
    over = {}
    for name, pt in zip(routers, at2, strict=False):
        over[name] = {**pt, "share_of_peak": (pt["goodput_rps"] or 0) / max(results[name]["peak_goodput_rps"], 1e-9)}
        log(f"  {name:14s} at 2x knee {2 * knee:.2f}/s goodput {pt['goodput_rps']:.2f} "
            f"({over[name]['share_of_peak']:.2f} of peak)")
    mixed = at2[-1] if "headrace" in routers else None
    if mixed is not None:
        log(f"  headrace with priorities at 2x knee: critical {mixed['critical_attainment']:.3f}, sheddable refused "
            f"{mixed['sheddable_refused']:.2f}")
    return {"case": case.__dict__, "bound": bound, "knee": knee, "routers": results, "overload": over,
            "priorities": mixed}


def _point_at(sweep: dict[str, Any], rate: float) -> dict[str, Any] | None:
    return next((p for p in sweep["points"] if abs(p["rate"] - rate) < 1e-6 * rate), None)


def rerun(doc: dict[str, Any], routers: tuple[str, ...], jobs: int) -> None:
    """Sweep ``routers`` again on every case of ``doc`` (the others' sweeps kept), then run every
    router at 2x the new knee and headrace's priority mix there."""
    cases = {name: Case(**c["case"]) for name, c in doc["cases"].items()}
    for name, c in doc["cases"].items():
        c["bound"] = bounds(cases[name])
    with ProcessPoolExecutor(jobs) as pool:
        todo = [(name, r) for name in cases for r in routers]
        done = pool.map(_sweep_job, [(cases[n], r, doc["cases"][n]["bound"]["rate"]) for n, r in todo])
        for (name, r), res in zip(todo, done, strict=True):
            doc["cases"][name]["routers"][r] = res
        points = []
        for name, c in doc["cases"].items():
            c["knee"] = max(x["goodput_rate"] for x in c["routers"].values())
            bands = np.random.default_rng(7).choice([int(b) for b in MIX], size=cases[name].requests,
                                                    p=list(MIX.values()))
            points += [(cases[name], r, 2 * c["knee"], None) for r in c["routers"]]
            points.append((cases[name], "headrace", 2 * c["knee"], bands))
        rows = list(pool.map(_point_job, points))
    for (case, r, _, bands), pt in zip(points, rows, strict=True):
        c = doc["cases"][case.name]
        if bands is not None:
            c["priorities"] = pt
        else:
            c["overload"][r] = {**pt, "share_of_peak": (pt["goodput_rps"] or 0)
                                / max(c["routers"][r]["peak_goodput_rps"], 1e-9)}


def verdicts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, c in doc["cases"].items():
        rs = c["routers"]
        if "headrace" not in rs:
            continue
        base = {k: v["goodput_rate"] for k, v in rs.items() if k != "headrace"}
        best = max(base, key=base.get) if base else None
        ratio = rs["headrace"]["goodput_rate"] / base[best] if best and base[best] else math.inf
        need = 1.0 if name == "azure-llm" else 1.3
        v = {"case": name, "headrace": rs["headrace"]["goodput_rate"], "best_baseline": best,
             "best_baseline_rate": base.get(best), "ratio": ratio, "target": need, "met": ratio >= need,
             "bound": c["bound"]["rate"], "run_bound": c["bound"]["run_rate"]}
        if best:  # at the one rate every router ran: START of the bound
            mid = START * c["bound"]["rate"]
            h, b = _point_at(rs["headrace"], mid), _point_at(rs[best], mid)
            if h and b:
                v["at_half_bound"] = {"rate": mid, "ttft_p90_ms": {"headrace": h["ttft_p90_ms"], best: b["ttft_p90_ms"]},
                                      "prefix_hit_rate": {"headrace": h["prefix_hit_rate"], best: b["prefix_hit_rate"]}}
        out.append(v)
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = ["# Token-level routing: goodput rate against today's routers", "",
             f"Measured {doc['date']} at {doc['version'].get('commit')}, in the token-level simulator; "
             f"profile {PROFILE}; {TARGET:.0%} of requests within both SLOs; a refused request is a miss."
             + (f" Then {doc['rerun']['routers']}'s sweeps, every router's 2x-knee point and the priority mix ran "
                f"again at {doc['rerun']['version'].get('commit')}." if doc.get("rerun") else ""), ""]
    for name, c in doc["cases"].items():
        case = c["case"]
        lines += [f"## {name}: {case['note']}", "",
                  f"{case['engines']} engines, TTFT SLO {case['ttft_s'] * 1e3:.0f} ms, TPOT SLO "
                  f"{case['tpot_s'] * 1e3:.0f} ms, the same {case['requests']} requests at every rate. Upper bound "
                  f"(token capacity with perfect balance and reuse, serving the cheapest {TARGET:.0%}): "
                  f"**{c['bound']['rate']:.2f} req/s** sustained; {c['bound']['run_rate']:.2f} req/s for a run of "
                  f"{case['requests']} requests, whose work may go on {c['bound']['tail_s']:.0f} s past the last "
                  f"arrival.", "",
                  "| router | goodput rate (req/s) | share of bound | TTFT p50 / p90 (ms) | TPOT p50 / p90 (ms) | "
                  "prefix hits | at 2x knee: goodput, share of peak |", "|---|---|---|---|---|---|---|"]
        for r, v in c["routers"].items():
            k = v["at_knee"] or {}
            o = c["overload"].get(r, {})
            lines.append(f"| {r} | {v['goodput_rate']:.2f} | {v['goodput_rate'] / c['bound']['rate']:.0%} | "
                         f"{_n(k.get('ttft_p50_ms'))} / {_n(k.get('ttft_p90_ms'))} | {_n(k.get('tpot_p50_ms'))} / "
                         f"{_n(k.get('tpot_p90_ms'))} | {_pct(k.get('prefix_hit_rate'))} | "
                         f"{_n(o.get('goodput_rps'), 2)} req/s, {_pct(o.get('share_of_peak'))} |")
        m = c.get("priorities")
        if m:
            lines += ["", f"headrace at 2x the knee ({m['rate']:.2f} req/s) with 20% critical, 20% standard, 60% "
                      f"sheddable: critical within both SLOs {_pct(m['critical_attainment'], 1)} "
                      f"({_pct(m.get('critical_attainment_feasible'), 1)} of those an idle engine could serve in time), "
                      f"standard {_pct(m['standard_attainment'])}, sheddable {_pct(m['sheddable_attainment'])} "
                      f"(refused {_pct(m['sheddable_refused'])})."]
        lines.append("")
    lines += ["## Verdicts", "", "Goodput rates in req/s; the bound sustained, then for a run of the case's requests.", "",
              "| workload | headrace | best baseline | ratio | target | met | bound |",
              "|---|---|---|---|---|---|---|"]
    for v in doc["verdicts"]:
        lines.append(f"| {v['case']} | {v['headrace']:.2f} | {v['best_baseline']} {_n(v['best_baseline_rate'], 2)} | "
                     f"{v['ratio']:.2f}x | {v['target']:.1f}x | {'yes' if v['met'] else 'no'} | {v['bound']:.2f}, "
                     f"{v['run_bound']:.2f} |")
    for v in doc["verdicts"]:
        h = v.get("at_half_bound")
        if h:
            b = v["best_baseline"]
            lines.append(f"\n{v['case']} at {h['rate']:.2f} req/s (half the bound, a rate every router ran): TTFT p90 "
                         f"headrace {_n(h['ttft_p90_ms']['headrace'])} ms against {b} {_n(h['ttft_p90_ms'][b])} ms; "
                         f"prefix-cache hits {_pct(h['prefix_hit_rate']['headrace'])} against "
                         f"{_pct(h['prefix_hit_rate'][b])}.")
    return "\n".join(lines) + "\n"


def _n(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _pct(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests per point (a smoke run)")
    ap.add_argument("--only", choices=[c.name for c in CASES], action="append")
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--jobs", type=int, default=2, help="simulations run at once (processes)")
    ap.add_argument("--render", action="store_true", help="recompute the bounds and the page from the last results")
    ap.add_argument("--rerun", metavar="ROUTERS",
                    help="sweep these routers again into the last results, then every router at the new 2x knee")
    ap.add_argument("--priorities", action="store_true",
                    help="run again only headrace's priority mix at 2x each case's knee, into the last results")
    a = ap.parse_args(argv)
    routers = tuple(r.strip() for r in a.routers.split(",") if r.strip())
    unknown = [r for r in routers if r not in NAMES]
    if unknown:
        ap.error(f"unknown routers {unknown}")
    if a.rerun:
        doc = json.loads((a.out / "llm_routing.json").read_text())
        rerun(doc, tuple(r.strip() for r in a.rerun.split(",") if r.strip()), a.jobs)
        doc["rerun"] = {"routers": a.rerun, "version": headrace_version(), "date": time.strftime("%Y-%m-%d")}
        doc["verdicts"] = verdicts(doc)
        write_results(a.out, "llm_routing", doc, markdown(doc))
        print(markdown(doc))
        return 0
    if a.render or a.priorities:
        doc = json.loads((a.out / "llm_routing.json").read_text())
        if a.priorities:
            for c in doc["cases"].values():
                case = Case(**c["case"])
                bands = np.random.default_rng(7).choice([int(b) for b in MIX], size=case.requests, p=list(MIX.values()))
                c["priorities"] = run_point(case, "headrace", 2 * c["knee"], bands)
                print(f"{case.name}: critical {c['priorities']['critical_attainment_feasible']:.3f} of those an idle "
                      f"engine could serve", flush=True)
        for c in doc["cases"].values():
            c["bound"] = bounds(Case(**c["case"]))
        doc["verdicts"] = verdicts(doc)
        write_results(a.out, "llm_routing", doc, markdown(doc))
        print(markdown(doc))
        return 0
    t0 = time.perf_counter()
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "version": headrace_version(), "profile": PROFILE,
                           "target": TARGET, "search": {"light": LIGHT, "start": START, "max": MAX_SHARE}, "quick": a.quick, "cases": {}}
    for case in CASES:
        if a.only and case.name not in a.only:
            continue
        if a.quick:
            case = Case(case.name, case.engines, case.ttft_s, case.tpot_s, QUICK, case.note)
        doc["cases"][case.name] = run_case(case, routers, print, a.jobs)
    doc["verdicts"] = verdicts(doc)
    doc["wall_s"] = time.perf_counter() - t0
    write_results(a.out, "llm_routing", doc, markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
