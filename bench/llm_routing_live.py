"""Token-level routing, live: each router in the real gateway in front of emulated engines, the
same arrivals in the token-level simulator, and how far the simulator lands from the live run
(its **fidelity**), against the spread this host shows between two live runs of one point.

The fleet (a fresh one per router and point, so every engine's prefix cache starts empty): four
``headrace engine --profile llama-3.1-8b-instruct-bf16@H100-80GB/gpu`` processes and one
``headrace serve`` whose generated config serves one generative model over them (``engine:
emulated`` with ``profile:``, so headrace's router predicts and every router gets the engines'
KV events), ``llm_routing.router`` the router under test, each its own process group on a free
port, stopped by group on the way out (a failure, Ctrl-C and SIGTERM included).

The workload is llm-d's shared-prefix shape (:func:`loadgen.llm.workload.shared_prefix`; llm-d/llm-d,
guides/precise-prefix-cache-aware/benchmark-templates/guide.yaml: num_groups 150 on 8 engines,
system_prompt_len 6000 (6,144 here, whole 512-token blocks), question_len 1200, output_len 1000)
scaled to 4 engines: 75 tenants. Outputs are 200 tokens, not the guide's 1,000, so this 2-core
host can carry the token streams.
SLOs: TTFT 1 s, TPOT 50 ms; a request meets both or misses (a refused one misses). Requests go
through the real client path (:func:`loadgen.llm.run.run_llm_load`: token-id prompts over
``/v1/completions``, streamed, tenant in ``x-headrace-tenant``), open loop, times from each
request's scheduled send.

Rates come from the simulator first, in-process: every router under test swept over shares of the
fleet's bound (:mod:`loadgen.llm.bound`); its knee is the highest rate at which 90% of requests
meet both SLOs. Live points: light (0.5 x the lowest knee), the lowest knee, a burst (Gamma
arrivals, cv 4) at the lowest knee, and overload (1.2 x the highest knee: past every router's). For each router and point the
live summary (:func:`loadgen.llm.stats.summarize`; goodput = rate x attainment; prefix hits the
engines' ``vllm:prefix_cache_hits_total / queries_total`` summed over the four) and the simulator
on the same arrivals with a fresh router made the way the gateway makes it
(:func:`gateway.llm.routing.make_router`). Fidelity: the simulator's relative error against live on
TTFT p50/p90, TPOT p50/p90 and goodput, within 10% or not, and within the host's floor or not.

The host's floor, measured in the same run: three points each run live twice on fresh fleets (the
twins: the knee point with the router whose knee it is; the burst and the overload point each
with the router whose simulated goodput missed its live one most there), whose relative spread
per metric is what this host alone moves a number by (a row is held to its point's twin, the
light point to the narrowest); and per point the
CPU seconds of the engines, the gateway and the client against the host's two cores, steal, and
the client's send lag. Where TTFT goes: the engines' own mean TTFT (their
``vllm:time_to_first_token_seconds`` sum over count, from a request's arrival at the engine)
against the client's and the simulator's; the client's less the engines' is the path (client,
gateway, loopback), which the simulator does not model (its ``hop_s`` is 0).

    .venv/bin/python -m bench.llm_routing_live [--quick] [--routers a,b] [--requests N]

Writes bench/results/llm_routing_live.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.gateway_overhead import cpu_seconds
from bench.host import cpu_times, steal_share
from bench.output import write_results
from deploy.gateway_process import start_serve
from gateway.llm.routing import find_llm_profile, make_router
from gateway.policy.llm.baselines import BASELINES
from loadgen.llm.bound import fleet_bound
from loadgen.llm.driver import TargetError
from loadgen.llm.run import LlmLoadSpec, run_llm_load
from loadgen.llm.sim import fleet, simulate, tenants_of
from loadgen.llm.stats import summarize
from loadgen.llm.workload import (
    SHARED_QUESTION_LEN,
    SHARED_SYSTEM_LEN,
    SHARED_TENANTS,
    LengthDist,
    Workload,
    shared_prefix,
)
from loadgen.record import headrace_version, host_facts
from profiles.gateway_config import LlmRoutingConfig
from profiles.triton.process import exit_on_sigterm, stop_group
from profiles.triton.server import free_port

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PROFILE = "llama-3.1-8b-instruct-bf16@H100-80GB/gpu"
MODEL = "llama-8b"
ENGINES = 4
TENANTS = SHARED_TENANTS * ENGINES // 8  # llm-d's 150 tenants on 8 engines, on 4
OUTPUT_LEN = 200
TTFT_S, TPOT_S = 1.0, 0.05
TARGET = 0.9  # share of requests meeting both SLOs at a knee
FIDELITY = 0.10  # the simulator is within this relative error of live, or not
METRICS = ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms", "goodput_rps")
DIGITS = {"ttft_p50_ms": 0, "ttft_p90_ms": 0, "tpot_p50_ms": 1, "tpot_p90_ms": 1, "goodput_rps": 2}
ROUTERS = ("headrace", "least-request", "llm-d", "llm-d-precise", "dynamo")
ALL_ROUTERS = ("headrace", *BASELINES)
QUICK_ROUTERS = ("headrace", "least-request")
QUICK_RATE = 10.0  # req/s: below every router's knee in the simulator, light enough for a smoke run
KNEE_SHARES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5)  # of the fleet's bound
LIGHT, OVER = 0.5, 1.2  # light: of the lowest knee; overload: of the highest
BURST_CV = 4.0
REQUESTS = 400
QUICK_REQUESTS = 60
START_TIMEOUT_S = 60.0
SETTLE_S = 1.5  # after the gateway is ready: its metrics reads and KV subscriptions reach every engine
REQUEST_TIMEOUT_S = 180.0
TWINS = ("knee", "burst", "overload")  # the points run live twice
COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:num_preemptions_total",
            "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count")


@dataclass(frozen=True)
class Point:
    """One load: its label, mean rate, arrival process and size."""

    label: str
    rate: float
    arrival: str = "poisson"
    cv: float = 1.0
    requests: int = REQUESTS

    def work(self, seed: int = 0) -> Workload:
        rows = shared_prefix(self.arrival, self.rate, self.cv, None, self.requests, LengthDist("fixed", OUTPUT_LEN),
                             seed, TENANTS, SHARED_SYSTEM_LEN, SHARED_QUESTION_LEN)
        return Workload("shared-prefix", rows, seed)


# ---- the live fleet

class Fleet:
    """Four emulated engines and one gateway routing with ``router``, each in its own process
    group; a context manager that stops them all by group, whatever ends the block."""

    def __init__(self, router: str, work_dir: Path, engines: int = ENGINES) -> None:
        self.router, self.dir, self.n = router, work_dir, engines
        self.engines: list[subprocess.Popen] = []
        self.urls: list[str] = []
        self.gateway: subprocess.Popen | None = None
        self.url = ""
        self.engine_settings = ""

    def __enter__(self) -> Fleet:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        logs = []
        for k in range(self.n):
            log = self.dir / f"engine{k}.log"
            with open(log, "wb") as out:
                self.engines.append(subprocess.Popen(
                    [sys.executable, "-m", "deploy.cli", "engine", "--profile", PROFILE, "--port", "0",
                     "--served-model-name", MODEL],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT))
            logs.append(log)
        for proc, log in zip(self.engines, logs, strict=True):
            self.urls.append(self._engine_url(proc, log))
        port = free_port()
        cfg = {"listen": {"host": "127.0.0.1", "http_port": port, "grpc_port": free_port()},
               "llm_routing": {"router": self.router},
               "llm_models": [{"name": MODEL, "slo_ttft_ms": TTFT_S * 1e3, "slo_tpot_ms": TPOT_S * 1e3,
                               "replicas": [{"url": u, "engine": "emulated", "profile": PROFILE} for u in self.urls]}]}
        path = self.dir / "gateway.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.gateway = start_serve(path, f"127.0.0.1:{port}", self.dir / "gateway.log", timeout=START_TIMEOUT_S)
        self.url = f"http://127.0.0.1:{port}"
        time.sleep(SETTLE_S)

    def _engine_url(self, proc: subprocess.Popen, log: Path) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            m = re.search(r"(http://\S+)/v1 \((.*)\)", text)
            if m:
                self.engine_settings = m.group(2)
                return m.group(1)
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"headrace engine did not start: {log.read_text(errors='replace')[-2000:]}")

    def pids(self) -> dict[str, list[int]]:
        return {"engines": [p.pid for p in self.engines], "gateway": [self.gateway.pid] if self.gateway else []}

    def counters(self) -> dict[str, float]:
        """The engines' prefix-cache and preemption counters, summed."""
        out: dict[str, float] = {}
        for url in self.urls:
            with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
                text = r.read().decode()
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    if s.name in COUNTERS:
                        out[s.name] = out.get(s.name, 0.0) + s.value
        return out

    def close(self) -> None:
        if self.gateway is not None:
            stop_group(self.gateway, grace=10)
            self.gateway = None
        for p in self.engines:
            stop_group(p, grace=10)
        self.engines = []


def _cpu(pids: dict[str, list[int]]) -> dict[str, float]:
    out = {}
    for role, ps in pids.items():
        total = 0.0
        for pid in ps:
            try:
                total += cpu_seconds(pid)
            except OSError:
                pass
        out[role] = total
    return out


def _busy(before: tuple[int, ...] | None, after: tuple[int, ...] | None) -> float | None:
    """Share of all CPU time the host spent busy (not idle or waiting on I/O)."""
    if before is None or after is None or len(before) < 5:
        return None
    d = [b - a for a, b in zip(before[:8], after[:8], strict=False)]
    total = sum(d)
    return (total - d[3] - d[4]) / total if total > 0 else None


# ---- one point, live and simulated

def _row(s: dict[str, Any], rate: float, prefix_hit_rate: float | None) -> dict[str, Any]:
    att = s["attainment"]
    return {"attainment": att, "goodput_rps": rate * att if att is not None else None,
            "ttft_p50_ms": s["ttft_ms"]["p50"], "ttft_p90_ms": s["ttft_ms"]["p90"], "ttft_mean_ms": s["ttft_ms"]["mean"],
            "tpot_p50_ms": s["tpot_ms"]["p50"], "tpot_p90_ms": s["tpot_ms"]["p90"],
            "attainment_ttft": s["attainment_ttft"], "attainment_tpot": s["attainment_tpot"],
            "ok": s["ok"], "errors": s["errors"], "prefix_hit_rate": prefix_hit_rate}


def live_point(router: str, point: Point, work: Workload) -> dict[str, Any]:
    """``work`` sent to a fresh fleet routing with ``router``."""
    spec = LlmLoadSpec(url="http://127.0.0.1:1", model=MODEL, workload="shared-prefix", rate=point.rate, cv=point.cv,
                       requests=point.requests, output_len=str(OUTPUT_LEN), tenants=TENANTS,
                       slo_ttft_ms=TTFT_S * 1e3, slo_tpot_ms=TPOT_S * 1e3, request_timeout_s=REQUEST_TIMEOUT_S)
    with tempfile.TemporaryDirectory(prefix="hr-llm-routing-live-") as tmp, Fleet(router, Path(tmp)) as f:
        spec = spec.model_copy(update={"url": f.url})
        pids = f.pids()
        cpu0, host0, me0, t0 = _cpu(pids), cpu_times(), time.process_time(), time.monotonic()
        run = asyncio.run(run_llm_load(spec, work=work))
        wall = time.monotonic() - t0
        cpu1, host1, me1 = _cpu(pids), cpu_times(), time.process_time()
        c = f.counters()
        settings = f.engine_settings
    s = run.summary
    q = c.get("vllm:prefix_cache_queries_total", 0.0)
    row = _row(s, point.rate, c.get("vllm:prefix_cache_hits_total", 0.0) / q if q else None)
    cpu = {role: cpu1[role] - cpu0[role] for role in cpu0} | {"client": me1 - me0}
    ncpu = os.cpu_count() or 1
    firsts = c.get("vllm:time_to_first_token_seconds_count", 0.0)
    row |= {"refused": sum(1 for o in run.outcomes if o.status == 429),
            "engine_ttft_mean_ms": c.get("vllm:time_to_first_token_seconds_sum", 0.0) / firsts * 1e3 if firsts else None,
            "preemptions": c.get("vllm:num_preemptions_total"), "wall_s": wall, "elapsed_s": s["elapsed_s"],
            "send_lag_p99_ms": s["send_lag_ms"]["p99"], "cpu_s": cpu,
            "cpu_share": sum(cpu.values()) / (wall * ncpu), "host_busy": _busy(host0, host1),
            "steal": steal_share(host0, host1), "engine": settings}
    return row


def sim_point(router: str, point: Point, work: Workload) -> dict[str, Any]:
    """``work`` in the simulator, behind a fresh router made as the gateway makes it."""
    res = simulate(work, fleet(find_llm_profile(PROFILE), ENGINES), make_router(LlmRoutingConfig(router=router)),
                   TTFT_S, TPOT_S, tenant=tenants_of(work))
    s = summarize(res.outcomes, res.elapsed_s, TTFT_S * 1e3, TPOT_S * 1e3)
    rec = res.record()
    return _row(s, point.rate, rec["prefix_hit_rate"]) | {
        "refused": sum(1 for o in res.outcomes if o.status == 429), "preemptions": rec["preemptions"],
        "sim_wall_s": res.wall_s}


def rel_err(sim: float | None, live: float | None) -> float | None:
    """(sim - live) / live; None where either is missing or live is 0."""
    if sim is None or live is None or live == 0:
        return None
    return (sim - live) / live


def spread(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float | None]:
    """How far the second live run of a point lands from the first, per metric (|b - a| / a)."""
    out: dict[str, float | None] = {}
    for m in METRICS:
        e = rel_err(b.get(m), a.get(m))
        out[m] = None if e is None else abs(e)
    return out


def fidelity(sim: dict[str, Any], live: dict[str, Any], floor: dict[str, float | None] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in METRICS:
        e = rel_err(sim.get(m), live.get(m))
        f = (floor or {}).get(m)
        out[m] = {"sim": sim.get(m), "live": live.get(m), "rel_err": e,
                  "abs_err": None if e is None else sim[m] - live[m],
                  "within_10pct": None if e is None else abs(e) <= FIDELITY,
                  "within_floor": None if e is None or f is None else abs(e) <= max(f, FIDELITY)}
    return out


# ---- rates from the simulator

def sim_knees(routers: Sequence[str], requests: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Each router's knee in the simulator: the highest rate on a grid of shares of the fleet's
    bound at which TARGET of the requests meet both SLOs (the grid stops after two misses)."""
    p = find_llm_profile(PROFILE)
    bound = fleet_bound(Point("bound", 1.0, requests=requests).work(), p.step_time, p.engine_config(), ENGINES, TPOT_S)
    log(f"fleet bound {bound.rate:.2f} req/s")
    out: dict[str, Any] = {"bound": bound.as_dict(), "routers": {}}
    for name in routers:
        knee, misses, pts = 0.0, 0, []
        for share in KNEE_SHARES:
            pt = Point("sweep", round(share * bound.rate, 2), requests=requests)
            r = sim_point(name, pt, pt.work())
            pts.append({"rate": pt.rate, "attainment": r["attainment"]})
            if (r["attainment"] or 0) >= TARGET:
                knee, misses = pt.rate, 0
            else:
                misses += 1
                if misses == 2:
                    break
        log(f"  sim knee {name:14s} {knee:6.2f} req/s")
        out["routers"][name] = {"knee": knee, "points": pts}
    return out


def plan(knees: dict[str, Any], requests: int) -> list[Point]:
    ks = [v["knee"] for v in knees["routers"].values() if v["knee"] > 0]
    # no router passing anywhere on the grid: its lowest rate is the knee
    lo, hi = (min(ks), max(ks)) if ks else (KNEE_SHARES[0] * knees["bound"]["rate"],) * 2
    return [Point("light", round(LIGHT * lo, 2), requests=requests),
            Point("knee", lo, requests=requests),
            Point("burst", lo, "gamma", BURST_CV, requests),
            Point("overload", round(OVER * hi, 2), requests=requests)]


# ---- the run

def run(routers: Sequence[str], points: Sequence[Point] | None, requests: int, twin: bool,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    t_start = time.perf_counter()
    load0 = os.getloadavg()
    knees = None
    if points is None:
        knees = sim_knees(routers, requests, log)
        points = plan(knees, requests)
    log("points: " + ", ".join(f"{p.label} {p.rate:g}/s" + (f" (gamma cv {p.cv:g})" if p.arrival == "gamma" else "")
                               for p in points))
    rows: list[dict[str, Any]] = []
    for pt in points:
        work = pt.work()
        for name in routers:
            sim = sim_point(name, pt, work)
            try:
                live = live_point(name, pt, work)
            except (RuntimeError, OSError, TargetError) as e:  # a fleet that did not start: the row says why
                log(f"{pt.label:8s} {pt.rate:6.2f}/s {name:14s} live run failed: {e}")
                rows.append({"router": name, "point": asdict(pt), "sim": sim, "live": None, "error": str(e)})
                continue
            rows.append({"router": name, "point": asdict(pt), "sim": sim, "live": live})
            log(f"{pt.label:8s} {pt.rate:6.2f}/s {name:14s} live: att {_f(live['attainment'], 3)} TTFT p50/p90 "
                f"{_f(live['ttft_p50_ms'])}/{_f(live['ttft_p90_ms'])} TPOT p50/p90 {_f(live['tpot_p50_ms'], 1)}/"
                f"{_f(live['tpot_p90_ms'], 1)} hits {_f(live['prefix_hit_rate'], 2)} cpu {live['cpu_share']:.0%} | "
                f"sim: att {_f(sim['attainment'], 3)} TTFT {_f(sim['ttft_p50_ms'])}/{_f(sim['ttft_p90_ms'])} TPOT "
                f"{_f(sim['tpot_p50_ms'], 1)}/{_f(sim['tpot_p90_ms'], 1)} hits {_f(sim['prefix_hit_rate'], 2)}")
    twins = []
    for label in TWINS if twin else ():
        first = _twin_of(rows, knees, label)
        if first is None:
            continue
        pt = Point(**first["point"])
        again = live_point(first["router"], pt, pt.work())
        tw = {"router": first["router"], "point": first["point"], "first": first["live"], "second": again,
              "spread": spread(first["live"], again)}
        twins.append(tw)
        log(f"twin {first['router']} {pt.label} {pt.rate:g}/s: " + ", ".join(
            f"{m} {_pct(v)}" for m, v in tw["spread"].items()))
    return refresh({"date": time.strftime("%Y-%m-%d %H:%M"), "version": headrace_version(), "host": host_facts(),
            "load_avg_before": load0, "load_avg_after": os.getloadavg(), "cpus": os.cpu_count(),
            "settings": {"profile": PROFILE, "engines": ENGINES, "tenants": TENANTS, "system_len": SHARED_SYSTEM_LEN,
                         "question_len": SHARED_QUESTION_LEN, "output_len": OUTPUT_LEN, "slo_ttft_s": TTFT_S,
                         "slo_tpot_s": TPOT_S, "target": TARGET, "fidelity": FIDELITY, "requests": requests,
                         "routers": list(routers), "knee_shares": KNEE_SHARES, "light": LIGHT, "overload": OVER,
                         "burst_cv": BURST_CV},
            "knees": knees, "points": [asdict(p) for p in points], "rows": rows, "twins": twins,
            "wall_s": time.perf_counter() - t_start})


def refresh(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with every row's fidelity and the tally worked out from its numbers (the floor:
    the spread of its point's twin, else the narrowest of the twins', as a point without a twin
    is the light one, the quietest)."""
    twins = doc.get("twins") or []
    narrowest = {m: min((t["spread"][m] for t in twins if t["spread"][m] is not None), default=None)
                 for m in METRICS}
    for r in doc["rows"]:
        own = next((t["spread"] for t in twins if t["point"]["label"] == r["point"]["label"]), None)
        floor = own or (narrowest if twins else None)
        r["fidelity"] = fidelity(r["sim"], r["live"], floor) if r["live"] else None
    doc["summary"] = tally(doc["rows"])
    return doc


def _twin_of(rows: Sequence[dict[str, Any]], knees: dict[str, Any] | None, label: str) -> dict[str, Any] | None:
    """The row of point ``label`` to run again: at the knee, the router whose knee it is; else
    the row whose simulated goodput is furthest from its live one (the miss most in question).
    None where no such row ran live."""
    at = [r for r in rows if r["live"] and r["point"]["label"] == label]
    if not at:
        return None
    if label == "knee" and knees is not None:
        lowest = min(knees["routers"], key=lambda n: knees["routers"][n]["knee"] or float("inf"))
        return next((r for r in at if r["router"] == lowest), at[0])
    return max(at, key=lambda r: abs((r["sim"]["goodput_rps"] or 0.0) - (r["live"]["goodput_rps"] or 0.0)))


def tally(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How many (router, point, metric) comparisons land within 10%, and within the floor; and
    per metric, how many within 10% of how many."""
    n = w10 = wf = nf = 0
    by: dict[str, list[int]] = {m: [0, 0] for m in METRICS}
    for r in rows:
        for m, v in (r["fidelity"] or {}).items():
            if v["within_10pct"] is None:
                continue
            n += 1
            w10 += v["within_10pct"]
            by[m][0] += v["within_10pct"]
            by[m][1] += 1
            if v["within_floor"] is not None:
                nf += 1
                wf += v["within_floor"]
    return {"compared": n, "within_10pct": w10, "within_floor": wf if nf else None, "by_metric": by}


# ---- the report

def _f(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.0%}" if v < 0 else f"{v:.0%}"


def _err(v: dict[str, Any], digits: int) -> str:
    e = v["rel_err"]
    if e is None:
        return "-"
    mark = "" if v["within_10pct"] else (" (floor)" if v["within_floor"] else " ✗")
    return f"{e:+.0%} ({v['abs_err']:+.{digits}f}){mark}"


def markdown(doc: dict[str, Any]) -> str:
    st = doc["settings"]
    la, lb = doc["load_avg_before"], doc["load_avg_after"]
    lines = ["# Token-level routing, live: the gateway against the simulator", "",
             f"Measured {doc['date']} at `{doc['version'].get('commit')}` on {doc['cpus']} CPUs (load average "
             f"{la[0]:.2f} before, {lb[0]:.2f} after; {doc['wall_s'] / 60:.0f} min). {st['engines']} x "
             f"`headrace engine --profile {st['profile']}` behind `headrace serve`, a fresh fleet per row. llm-d's "
             f"shared prefix scaled to {st['engines']} engines: {st['tenants']} tenants x a {st['system_len']}-token "
             f"system prompt + a {st['question_len']}-token question, {st['output_len']} output tokens, "
             f"{st['requests']} requests per point; SLOs TTFT {st['slo_ttft_s'] * 1e3:.0f} ms, TPOT "
             f"{st['slo_tpot_s'] * 1e3:.0f} ms. Goodput = rate x attainment (both SLOs). Sim: the token-level "
             "simulator on the same arrivals, the router made as the gateway makes it.", ""]
    k = doc.get("knees")
    if k:
        lines += [f"Simulator knees ({st['target']:.0%} within both SLOs; fleet bound {k['bound']['rate']:.2f} "
                  "req/s): " + ", ".join(f"{n} {v['knee']:.2f}" for n, v in k["routers"].items()) + " req/s.", ""]
    lines += ["## Live and simulated", "",
              "| point | rate | router | attainment live / sim | goodput live / sim | TTFT p50 live / sim | "
              "TTFT p90 live / sim | TPOT p50 live / sim | TPOT p90 live / sim | prefix hits live / sim | "
              "refused live / sim | CPU: fleet + client / host busy | send lag p99 |",
              "|---|---:|---|---|---|---|---|---|---|---|---|---:|---:|"]
    for r in doc["rows"]:
        lv, sm, p = r["live"], r["sim"], r["point"]
        name = p["label"] + (f" (gamma cv {p['cv']:g})" if p["arrival"] == "gamma" else "")
        if lv is None:
            lines.append(f"| {name} | {p['rate']:.2f} | {r['router']} | live run failed: {r['error'][:200]} |")
            continue
        lines.append(
            f"| {name} | {p['rate']:.2f} | {r['router']} | {_f(lv['attainment'], 3)} / {_f(sm['attainment'], 3)} | "
            f"{_f(lv['goodput_rps'], 2)} / {_f(sm['goodput_rps'], 2)} | {_f(lv['ttft_p50_ms'])} / "
            f"{_f(sm['ttft_p50_ms'])} | {_f(lv['ttft_p90_ms'])} / {_f(sm['ttft_p90_ms'])} | "
            f"{_f(lv['tpot_p50_ms'], 1)} / {_f(sm['tpot_p50_ms'], 1)} | {_f(lv['tpot_p90_ms'], 1)} / "
            f"{_f(sm['tpot_p90_ms'], 1)} | {_f(lv['prefix_hit_rate'], 2)} / {_f(sm['prefix_hit_rate'], 2)} | "
            f"{lv['refused']} / {sm['refused']} | {lv['cpu_share']:.0%} / {_pct(lv.get('host_busy'))} | "
            f"{_f(lv['send_lag_p99_ms'], 1)} ms |")
    lines += ["", "CPU: the engines', the gateway's and the client's CPU seconds over the point's wall time and "
              "all the host's CPUs; host busy: the share of all the host's CPU time not idle (this run and whatever "
              "else the host ran).", "", "## Where TTFT goes", "",
              "Mean TTFT (ms): the client's, the engines' own (from a request's arrival at an engine), and the "
              "simulator's. Path = client - engines: the client, the gateway and loopback, none of it in the "
              "simulator, and the time a router holds a request (headrace's flow control), which the simulator "
              "has. Engines - sim: the engine model's share. Gateway CPU in cores (one process, so 1.0 is its "
              "ceiling).", "",
              "| point | router | client | engines | sim | path | engines - sim | gateway CPU |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        lv, sm = r["live"], r["sim"]
        if lv is None or lv.get("engine_ttft_mean_ms") is None:
            continue
        c, e, m = lv["ttft_mean_ms"], lv["engine_ttft_mean_ms"], sm["ttft_mean_ms"]
        gw = lv["cpu_s"]["gateway"] / lv["wall_s"] if lv["wall_s"] else None
        lines.append(f"| {r['point']['label']} | {r['router']} | {_f(c)} | {_f(e)} | {_f(m)} | "
                     f"{_f(None if c is None else c - e, 0)} | {_f(None if m is None else e - m, 0)} | {_f(gw, 2)} |")
    lines += ["", "## Fidelity: the simulator's relative error against live", "",
              f"(sim - live) / live, and in brackets sim - live (ms, or req/s for goodput); ✗ misses "
              f"{FIDELITY:.0%} and the host's floor, (floor) misses {FIDELITY:.0%} but lies within the twin "
              "runs' spread (its point's twin; the light point: the narrowest twin's).", "",
              "| point | router | TTFT p50 | TTFT p90 | TPOT p50 | TPOT p90 | goodput |", "|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        f = r["fidelity"]
        if f is None:
            continue
        lines.append(f"| {r['point']['label']} | {r['router']} | "
                     + " | ".join(_err(f[m], DIGITS[m]) for m in METRICS) + " |")
    t = doc["summary"]
    lines += ["", f"Within {FIDELITY:.0%}: **{t['compared'] and t['within_10pct']}/{t['compared']}** comparisons" + (
        f"; within 10% or the floor: **{t['within_floor']}/{t['compared']}**." if t["within_floor"] is not None
        else ".") + " Within 10% by metric: " + ", ".join(
        f"{m.removesuffix('_ms').removesuffix('_rps').replace('_', ' ')} {a}/{b}" for m, (a, b) in t["by_metric"].items())
        + ".", ""]
    twins = doc.get("twins") or []
    if twins:
        lines += ["## The host's floor: points run live twice", "",
                  "Two fresh fleets, the same arrivals; spread = |second - first| / first.", "",
                  "| point | router | run | TTFT p50 | TTFT p90 | TPOT p50 | TPOT p90 | goodput | CPU: fleet + client |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for tw in twins:
            a, b, where = tw["first"], tw["second"], f"{tw['point']['label']} ({tw['point']['rate']:.2f}/s)"
            lines += [f"| {where} | {tw['router']} | first | " + " | ".join(_f(a[m], 1) for m in METRICS)
                      + f" | {a['cpu_share']:.0%} |",
                      "| | | second | " + " | ".join(_f(b[m], 1) for m in METRICS) + f" | {b['cpu_share']:.0%} |",
                      "| | | spread | " + " | ".join(_pct(tw["spread"][m]) for m in METRICS) + " | |"]
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"{', '.join(QUICK_ROUTERS)} at {QUICK_RATE:g} req/s, {QUICK_REQUESTS} requests, no twins (a smoke run)")
    ap.add_argument("--routers", default=None, help=f"comma-separated (default {','.join(ROUTERS)}; 'all': "
                    f"{','.join(ALL_ROUTERS)})")
    ap.add_argument("--requests", type=int, default=None, help=f"requests per point (default {REQUESTS})")
    ap.add_argument("--no-twin", action="store_true", help="skip the twin runs (the host's floor)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--render", type=Path, default=None, metavar="JSON",
                    help="run nothing: work the fidelity out again from a results JSON and write both files")
    a = ap.parse_args(argv)
    if a.render is not None:
        doc = refresh(json.loads(a.render.read_text()))
        write_results(a.out, "llm_routing_live", doc, markdown(doc))
        print(markdown(doc))
        return 0
    text = a.routers or ",".join(QUICK_ROUTERS if a.quick else ROUTERS)
    routers = ALL_ROUTERS if text == "all" else tuple(r.strip() for r in text.split(",") if r.strip())
    unknown = [r for r in routers if r not in ALL_ROUTERS]
    if unknown:
        ap.error(f"unknown routers {unknown}; known: {', '.join(ALL_ROUTERS)}")
    requests = a.requests or (QUICK_REQUESTS if a.quick else REQUESTS)
    exit_on_sigterm()
    points = [Point("quick", QUICK_RATE, requests=requests)] if a.quick else None
    doc = run(routers, points, requests, twin=not (a.quick or a.no_twin))
    doc["quick"] = a.quick
    write_results(a.out, "llm_routing_live", doc, markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
