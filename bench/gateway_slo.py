"""SLO attainment and goodput: headrace vs Triton's own dynamic batcher, same run.

Setup: emulated ResNet-50 on A100-80GB 1g.10gb, t(b) = max(7.86, 8.4 + 2.346 b) ms, max batch
32, SLO 100 ms (sent as Triton's ``timeout`` parameter by the load generator). Open-loop
Poisson and Gamma(CV=4) arrivals. Systems, all on one CPU Triton with one emulated model each:

- ``headrace``: ``headrace serve`` (default EDF scheduler) in front of a model without Triton's
  dynamic batcher (each gateway batch is one Triton request);
- ``headrace-protect``: the same with ``admission: protect``: a request is refused at arrival
  rather than admitted and later skipped, so every refusal comes at once and admitted requests
  keep their deadlines, for a little attainment near capacity;
- ``headrace-burst``: ``admission: burst``, which is ``plan`` under steady load and
  ``protect`` while the last 50 ms of arrivals run above 1.5x the replica's capacity;
- ``triton-default``: Triton's dynamic batcher with default settings;
- ``triton-tuned``: the best of a few ``max_queue_delay_microseconds`` / queue-policy timeout
  settings, chosen in a short tuning phase at the decisive points (Poisson 330, Gamma 350).

    .venv/bin/python -m bench.gateway_slo [--quick] [--duration 20]

Writes bench/results/gateway_slo.{json,md}. Points run system after system for each rate,
so background noise spreads over all systems alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from bench.gateway_overhead import start_gateway
from bench.host import cpu_times, steal_share
from bench.output import write_results
from loadgen.run import run_load
from loadgen.spec import LoadSpec
from profiles.emulator import write_emulated_model
from profiles.profile import ProfileSet, save_profiles
from profiles.triton.process import exit_on_sigterm, stop_group
from profiles.triton.repository import DynamicBatching
from profiles.triton.server import TritonServer, free_port

RESULTS = Path(__file__).parent / "results"
SLO_MS = 100.0
GATEWAYS = {  # system -> (scheduler config, what it is)
    "headrace": ({}, "the default: admission plan, the batcher may skip heads"),
    "headrace-protect": ({"admission": "protect"}, "admission protect: every refusal at arrival"),
    "headrace-burst": ({"admission": "burst"}, "admission burst: protect only while arrivals outrun capacity"),
}
POISSON_RATES = (150, 250, 300, 320, 330, 350, 500, 1000)
GAMMA_RATES = (150, 250, 300, 350, 500, 1000)
# name -> Triton dynamic batching. NOTE: the delay-only candidates queue with no timeout at all:
# Triton takes a request's own timeout only below a nonzero default_timeout_microseconds
# (PriorityQueue::PolicyQueue::Enqueue in triton-inference-server/core src/scheduler_utils.cc),
# and theirs is 0; the -queue candidates reject past a fixed queue timeout
TUNING = {
    "delay2ms": DynamicBatching(max_queue_delay_us=2000),
    "delay5ms": DynamicBatching(max_queue_delay_us=5000),
    "delay2ms-queue60ms": DynamicBatching(max_queue_delay_us=2000, default_timeout_us=60000,
                                          allow_timeout_override=False),
    "delay5ms-queue50ms": DynamicBatching(max_queue_delay_us=5000, default_timeout_us=50000,
                                          allow_timeout_override=False),
}


def gateway_counters(http_port: int) -> dict[str, float]:
    """The gateway's rejection counters by reason, and its event-loop lag sum/count."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("headrace_rejections_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[f"rejected_{reason}"] = out.get(f"rejected_{reason}", 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith(("headrace_event_loop_lag_seconds_sum", "headrace_event_loop_lag_seconds_count")):
            out[line.split(" ", 1)[0].removeprefix("headrace_event_loop_")] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("headrace_refusal_wait_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[f"refusal_le_{le}"] = out.get(f"refusal_le_{le}", 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def refusal_wait(g: dict[str, float]) -> tuple[float, float] | None:
    """From a point's refusal-wait bucket counts: the share refused within 5 ms of being read,
    and the smallest bucket bound (ms) that holds 99% of them; None without refusals."""
    bounds = sorted((float(k.removeprefix("refusal_le_")), v) for k, v in g.items()
                    if k.startswith("refusal_le_") and not k.endswith("+Inf"))
    total = g.get("refusal_le_+Inf", 0.0)
    if total <= 0:
        return None
    within5 = next((v for b, v in bounds if b == 0.005), 0.0) / total
    p99 = next((b * 1e3 for b, v in bounds if v >= 0.99 * total), float("inf"))
    return within5, p99


async def wait_idle(triton_http: str, timeout: float = 60.0) -> float:
    """Wait until Triton has finished what earlier points left queued (an overloaded batcher
    keeps executing its backlog after the client gives up), so no point inherits another's
    CPU load. Returns the seconds waited."""
    import asyncio

    def executions() -> int:
        doc = json.loads(urllib.request.urlopen(f"http://{triton_http}/v2/models/stats", timeout=10).read())
        return sum(int(m.get("execution_count", 0)) for m in doc.get("model_stats", []))

    t0 = time.monotonic()
    last = executions()
    while time.monotonic() - t0 < timeout:
        await asyncio.sleep(0.5)
        now = executions()
        if now == last:
            break
        last = now
    return time.monotonic() - t0


def reference_profile():
    return ProfileSet.reference().get("resnet50", "A100-80GB", "1g.10gb").with_max_batch(32)


def write_repo(repo: Path) -> None:
    prof = reference_profile()
    # the gateway forms the batches; behind it Triton runs each one as it comes (no batcher):
    # Triton's idle dynamic batcher sometimes sleeps ~500 ms on a lone request (see TESTBED_NOTE)
    # each system on an emulated GPU of its own (its own arbiter process)
    for i, name in enumerate(GATEWAYS):
        write_emulated_model(repo, f"{name}-gw", prof, slice_id=f"gpu{2 + i}/1g.10gb@0")
    write_emulated_model(repo, "resnet50-default", prof, slice_id="gpu0/1g.10gb@2",
                         dynamic_batching=DynamicBatching())
    for i, (name, db) in enumerate(TUNING.items()):
        write_emulated_model(repo, f"resnet50-{name}", prof, slice_id=f"gpu1/1g.10gb@{2 * i}",
                             dynamic_batching=db)


def gateway_config(http_port: int, triton_http: str, variant: str, profile_path: Path,
                   scheduler: dict[str, Any]) -> dict[str, Any]:
    """``headrace serve`` YAML: model resnet50 (SLO_MS, max batch 32) on one Triton variant."""
    return {
        "listen": {"http_port": http_port, "grpc_port": free_port()}, "scheduler": scheduler,
        "models": [{"name": "resnet50", "slo_ms": SLO_MS, "max_batch": 32, "replicas": [
            {"url": triton_http, "protocol": "http", "variant": variant, "profile": str(profile_path)}]}],
    }


async def point(target: str, model: str, arrival: str, rate: float, duration: float, warmup: float,
                seed: int, slo_ms: float = SLO_MS) -> dict[str, Any]:
    spec = LoadSpec(target=target, model=model, arrival=arrival, rate=rate,
                    cv=4.0 if arrival == "gamma" else 1.0, duration_s=duration, warmup_s=warmup,
                    slo_ms=slo_ms, seed=seed, request_timeout_s=10.0)
    res = await run_load(spec)
    s = res.summary
    return {
        "offered_rps": s["offered_rps"], "attainment": s["attainment"], "goodput_rps": s["goodput_rps"],
        "throughput_rps": s["throughput_rps"], "p50_ms": s["latency_ms"]["p50"],
        "p99_ms": s["latency_ms"]["p99"], "rejected": s["rejected"], "expired": s["expired"],
        "offered": s["offered"], "ok": s["ok"], "good": s["good"],
        "reject_latency_p99_ms": s["reject_latency_p99_ms"],
        "reject_latency_from_send_p99_ms": s["reject_latency_from_send_p99_ms"], "errors": s["error_count"],
        "fell_behind": s["fell_behind"], "send_lag_p99_ms": s["send_lag_ms"]["p99"],
    }


async def run(duration: float, warmup: float, quick: bool) -> dict[str, Any]:

    work = Path(tempfile.mkdtemp(prefix="hr-bench-slo-"))
    write_repo(work / "repo")
    save_profiles(work / "resnet50.yaml", [reference_profile()])
    out: dict[str, Any] = {"slo_ms": SLO_MS, "duration_s": duration, "warmup_s": warmup,
                           "machine": platform.node(), "cpus": os.cpu_count(), "points": [], "tuning": {}}
    with TritonServer(work / "repo", ready_timeout=120) as triton:
        ports: dict[str, int] = {}
        procs = []
        try:
            for name, (scheduler, _) in GATEWAYS.items():
                hp = ports[name] = free_port()
                (work / f"{name}.yaml").write_text(yaml.safe_dump(gateway_config(
                    hp, triton.http_url, f"{name}-gw", work / "resnet50.yaml", scheduler)))
                procs.append(start_gateway(work / f"{name}.yaml", hp, None))
            tdirect = f"http://{triton.http_url}"
            systems = {**{name: (f"http://127.0.0.1:{hp}", "resnet50") for name, hp in ports.items()},
                       "triton-default": (tdirect, "resnet50-default")}
            # warm every path once (connections, python stubs)
            for target, model in [*systems.values(), *((tdirect, f"resnet50-{n}") for n in TUNING)]:
                await point(target, model, "poisson", 50, 1.0, 0.5, 99)
            tune_points = [("poisson", 330), ("gamma", 350)]
            tune_dur = max(3.0, duration / 3)
            for name in TUNING:
                score = 0.0
                for arrival, rate in tune_points:
                    r = await point(tdirect, f"resnet50-{name}", arrival, rate, tune_dur, warmup, 7)
                    out["tuning"][f"{name}/{arrival}/{rate}"] = r
                    score += r["goodput_rps"]
                out["tuning"][name] = score
            best = max(TUNING, key=lambda n: out["tuning"][n])
            out["triton_tuned"] = {"name": best, "config": TUNING[best].to_pbtxt()}
            systems["triton-tuned"] = (tdirect, f"resnet50-{best}")
            for arrival, rates in (("poisson", POISSON_RATES), ("gamma", GAMMA_RATES)):
                for rate in rates:
                    for sysname, (target, model) in systems.items():
                        before = gateway_counters(ports[sysname]) if sysname in ports else {}
                        cpu0 = cpu_times()
                        r = await point(target, model, arrival, rate, duration, warmup, 1)
                        r.update(system=sysname, arrival=arrival, rate=rate, steal=steal_share(cpu0, cpu_times()))
                        if sysname in ports:  # the gateway's own view: why it rejected
                            after = gateway_counters(ports[sysname])
                            r["gateway"] = {k: after[k] - before.get(k, 0.0) for k in after}
                        out["points"].append(r)
                        print(f"{sysname:15s} {arrival:8s} {rate:5d}/s  attainment {r['attainment'] or 0:.4f}  "
                              f"goodput {r['goodput_rps']:.0f}/s  p99 {r['p99_ms'] or 0:.1f} ms  "
                              f"rejected {r['rejected']}", flush=True)
                        r["idle_wait_s"] = await wait_idle(triton.http_url)
        finally:
            for proc in procs:
                stop_group(proc)
    out["load_average"] = os.getloadavg()
    out["verdicts"] = {name: verdict(out["points"], name) for name in GATEWAYS}
    return out


def _get(points: list[dict], system: str, arrival: str, rate: int) -> dict | None:
    for p in points:
        if (p["system"], p["arrival"], p["rate"]) == (system, arrival, rate):
            return p
    return None


def verdict(points: list[dict], who: str) -> dict[str, Any]:
    """The issue's targets for gateway system ``who``."""
    v: dict[str, Any] = {}
    ok99 = [p["rate"] for p in points if p["system"] == who and p["arrival"] == "poisson"
            and (p["attainment"] or 0) >= 0.99]
    v["poisson_max_rate_at_99pct"] = max(ok99) if ok99 else None
    v["poisson_320_at_99pct"] = bool(ok99) and max(ok99) >= 320
    h, t = _get(points, who, "gamma", 350), _get(points, "triton-default", "gamma", 350)
    if h and t:
        v["gamma350_goodput"] = {"gateway": h["goodput_rps"], "triton-default": t["goodput_rps"]}
        # a baseline that collapsed to no goodput at all makes the ratio unbounded, not a number
        v["gamma350_goodput_ratio_vs_triton_default"] = (
            h["goodput_rps"] / t["goodput_rps"] if t["goodput_rps"] >= 1.0 else None)
        v["gamma350_ratio_ge_3_5"] = h["goodput_rps"] >= 3.5 * t["goodput_rps"]
        if h.get("ok"):  # of the answers with a result, and of all requests not refused at arrival
            v["gamma350_answered_on_time"] = h["good"] / h["ok"]
            v["gamma350_admitted_on_time"] = h["good"] / max(h["offered"] - h["rejected"], 1)
    for arrival in ("poisson", "gamma"):
        hs = sorted((p for p in points if p["system"] == who and p["arrival"] == arrival),
                    key=lambda p: p["rate"])
        if hs:
            peak_i = max(range(len(hs)), key=lambda i: hs[i]["goodput_rps"])
            after = [p["goodput_rps"] / hs[peak_i]["goodput_rps"] for p in hs[peak_i:]]
            v[f"{arrival}_goodput_min_after_peak_frac"] = min(after)
            v[f"{arrival}_goodput_within_5pct_of_peak"] = min(after) >= 0.95
    rl = [p["reject_latency_p99_ms"] for p in points if p["system"] == who and p["reject_latency_p99_ms"]]
    v["headrace_reject_latency_p99_ms_max"] = max(rl) if rl else None
    v["reject_within_5ms"] = (max(rl) <= 5.0) if rl else None
    rs = [p["reject_latency_from_send_p99_ms"] for p in points
          if p["system"] == who and p.get("reject_latency_from_send_p99_ms")]
    v["headrace_reject_from_send_p99_ms_max"] = max(rs) if rs else None
    gw = [w for p in points if p["system"] == who and (w := refusal_wait(p.get("gateway") or {}))]
    if gw:
        v["gateway_refusals_within_5ms_min"] = min(w[0] for w in gw)
        v["gateway_refusal_p99_le_ms_max"] = max(w[1] for w in gw)
    return v


def _gamma_ratio(v: dict[str, Any]) -> str:
    g = v.get("gamma350_goodput")
    if not g:
        return "not measured"
    r = v.get("gamma350_goodput_ratio_vs_triton_default")
    if r is None:
        return (f"**{g['gateway']:.1f}/s** vs Triton default {g['triton-default']:.1f}/s "
                "(the default batcher collapsed: unbounded ratio)")
    return f"**{r:.2f}x** Triton default ({g['gateway']:.1f}/s vs {g['triton-default']:.1f}/s)"


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _on_time(p: dict[str, Any]) -> str:
    return f"{p['good'] / p['ok']:.4f}" if p.get("ok") else "-"


def _reasons(p: dict[str, Any]) -> str:
    """The gateway's own two columns (empty for the Triton rows)."""
    g = p.get("gateway")
    if not g:
        return " | "
    at_arrival = g.get("rejected_infeasible", 0) + g.get("rejected_shed", 0) + g.get("rejected_no_replica", 0)
    lag = 1e3 * g.get("lag_seconds_sum", 0) / max(g.get("lag_seconds_count", 0), 1)
    w = refusal_wait(g)
    refused = f"{w[0]:.1%} / <= {w[1]:g}" if w else "-"
    return f"{at_arrival:.0f} / {g.get('rejected_expired', 0):.0f} / {lag:.2f} | {refused}"


TESTBED_NOTE = (
    "Testbed caveat (measured here, Triton 2.51 CPU build): with `dynamic_batching` enabled, a model "
    "fed one request at a time answers 4-35% of them ~500 ms late (tritonclient HTTP or gRPC, plain "
    "time.sleep or spinning python models alike); the same model without the batcher never does. "
    "Triton's batcher idles in 500 ms waits and sometimes misses the wake-up. Under many concurrent "
    "clients its queue rarely idles, so the Triton rows suffer little; headrace therefore serves a "
    "model without Triton's batcher (the gateway forms the batches). `rejected` counts refusals at "
    "arrival (admission; their latency is the reject p99); `expired` counts requests the gateway "
    "had queued and answered 429 once no replica could finish them in time (before their deadline, "
    "counted as misses), as the client sees them by the `x-headrace-reject-reason` header. "
    "Latencies count from each request's scheduled send time (no coordinated omission), so the "
    "load generator's own send lag, which shares the 2 CPUs, is part of every latency: its p99 "
    "is in its own column, as is the share of all CPU time the hypervisor stole during the point "
    "(`/proc/stat`; a few percent already shows as late answers). Between points the bench waits until Triton has executed what earlier "
    "points left queued."
)


def _targets(name: str, v: dict[str, Any]) -> list[str]:
    return [
        f"### {name} ({GATEWAYS[name][1]})",
        "",
        f"- Poisson: highest tested rate at >= 99% attainment: **{v.get('poisson_max_rate_at_99pct')} req/s** "
        f"(target >= 320: {'met' if v.get('poisson_320_at_99pct') else 'NOT met'})",
        f"- Gamma CV=4 at 350 req/s: goodput {_gamma_ratio(v)} "
        f"(target >= 3.5x: {'met' if v.get('gamma350_ratio_ge_3_5') else 'NOT met'})",
        f"- Overload: goodput at rates past the peak stays >= "
        f"{v.get('poisson_goodput_min_after_peak_frac', 0):.1%} (Poisson) / "
        f"{v.get('gamma_goodput_min_after_peak_frac', 0):.1%} (Gamma) of the peak (target 95%)",
        f"- Rejections at arrival answered within **{v.get('headrace_reject_latency_p99_ms_max') or 0:.2f} ms** p99, worst point "
        f"(target 5 ms: {'met' if v.get('reject_within_5ms') else 'NOT met' if v.get('reject_within_5ms') is False else 'no rejections'}), "
        "as the client measures them from each request's scheduled send time; from the moment the client "
        f"actually sent them: {v.get('headrace_reject_from_send_p99_ms_max') or 0:.2f} ms p99 at the worst point. "
        "Inside the gateway, from "
        f"reading a request to refusing it: {v.get('gateway_refusals_within_5ms_min', 0):.1%} within 5 ms at the "
        f"worst point, p99 <= {v.get('gateway_refusal_p99_le_ms_max', 0):g} ms (histogram bucket bound)",
        f"- Gamma CV=4 at 350 req/s, requests answered with a result that came within the SLO: "
        f"**{v.get('gamma350_answered_on_time', 0):.2%}**; counting the queued-then-expired 429s as admitted too: "
        f"{v.get('gamma350_admitted_on_time', 0):.2%} (target: admitted >= 99%)",
        "",
    ]


def markdown(res: dict[str, Any]) -> str:
    lines = [
        "# SLO attainment and goodput: headrace vs Triton's dynamic batcher",
        "",
        f"Emulated ResNet-50 on A100-80GB 1g.10gb (t(b) = max(7.86, 8.4 + 2.346 b) ms, max batch 32), "
        f"SLO {res['slo_ms']:g} ms sent as Triton's `timeout`; open loop, {res['duration_s']:g} s measured "
        f"after {res['warmup_s']:g} s warm-up per point; {res['cpus']} CPUs shared with other work "
        f"(load average at the end: {', '.join(f'{x:.1f}' for x in res['load_average'])}).",
        f"triton-tuned = `{res['triton_tuned']['name']}`: `{res['triton_tuned']['config']}`",
        "Command: `.venv/bin/python -m bench.gateway_slo`",
        "",
        TESTBED_NOTE,
        "",
        "## Targets",
        "",
        *(line for name in res["verdicts"] for line in _targets(name, res["verdicts"][name])),
        "",
        "## All points",
        "",
        "| arrival | rate /s | system | attainment | goodput /s | on time of answered | p50 ms | p99 ms | rejected | reject p99 ms (from scheduled / from sent) | expired | errors | client send lag p99 ms | CPU stolen by the hypervisor | gateway: at arrival / expired in queue / loop lag ms | gateway: refused within 5 ms of read / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in res["points"]:
        lines.append(
            f"| {p['arrival']} | {p['rate']} | {p['system']} | {(p['attainment'] or 0):.4f} | {p['goodput_rps']:.1f} | "
            f"{_on_time(p)} | "
            f"{p['p50_ms'] or 0:.1f} | {p['p99_ms'] or 0:.1f} | {p['rejected']} | "
            f"{p['reject_latency_p99_ms'] or 0:.2f} / {p.get('reject_latency_from_send_p99_ms') or 0:.2f} | "
            f"{p.get('expired', 0)} | {p['errors']} | "
            f"{p.get('send_lag_p99_ms') or 0:.2f} | {_share(p.get('steal'))} | "
            f"{_reasons(p)} |"
        )
    lines += ["", "## Triton tuning phase (goodput /s summed over Poisson 330 and Gamma 350)", ""]
    for k, val in res["tuning"].items():
        if not isinstance(val, dict):
            lines.append(f"- `{k}`: {val:.1f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import asyncio

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=20.0, help="measured seconds per point")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds per point")
    ap.add_argument("--quick", action="store_true", help="6 s points (a smoke run, noisier)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    exit_on_sigterm()  # what it started is stopped on the way out
    duration = 6.0 if args.quick else args.duration
    warmup = 1.0 if args.quick else args.warmup
    t0 = time.monotonic()
    res = asyncio.run(run(duration, warmup, args.quick))
    res["elapsed_s"] = time.monotonic() - t0
    write_results(args.out, "gateway_slo", res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
