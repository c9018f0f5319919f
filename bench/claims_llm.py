"""The generative-model claims of docs/benchmarks.md (:mod:`bench.claims` renders the page)."""

from __future__ import annotations

from typing import Any

from bench.claims_common import Claim, Results, by, pct


def llm_engine(r: Results) -> list[Claim]:
    d = r["llm_engine_fidelity"]
    held = d["heldout"]["summary"]["primary"]
    emu = d["emulated"]
    ttft = max(abs(x["ttft_ms"]["error_p50"]) for x in emu["summary"])
    tpot = max(abs(x["tpot_ms"]["error_p50"]) for x in emu["summary"])
    return [
        Claim("the LLM step time predicts published serving measurements no fit used",
              f"{held['n']} primary points (TensorRT-LLM throughput at fixed lengths, first-token latencies): "
              f"median absolute error {pct(held['median_abs_error'], 1)}, {held['within_15pct']} within 15%, "
              f"worst {pct(held['max_abs_error'], 0)} (70B decode-heavy runs predicted too fast)",
              ("llm_engine_fidelity/heldout",)),
        Claim("the emulated LLM engine, live, keeps its own model's timing",
              f"{len(emu['summary'])} (batch, context) points through `headrace engine` and the OpenAI API: TTFT "
              f"p50 within {pct(ttft, 1)}, TPOT p50 within {pct(tpot, 1)} of the engine model in virtual time "
              f"(median of {emu['summary'][0]['reps']} repetitions)",
              ("llm_engine_fidelity/emulated",)),
    ]


def llm_gateway(r: Results) -> list[Claim]:
    fd, tr = r["llm_frontdoor"], r["llm_traces"]
    short, long = by(fd["ttft"], prompt="100", via="gateway"), by(fd["ttft"], prompt="8k", via="gateway")
    gw, floor = fd["throughput"]["gateway"], fd["throughput"]["floor"]
    azure = [x for x in tr["rows"] if x["trace"] == "azure-llm"]
    best = max(azure, key=lambda x: x["goodput_rps"])
    moon = [x for x in tr["rows"] if x["trace"] == "mooncake"]
    return [
        Claim("the gateway relays generative streams cheaply",
              f"added TTFT p50 +{short['added_p50_ms']:.2f} ms (p99 +{short['added_p99_ms']:.2f} ms) over the engine "
              f"directly at concurrency 1 with a 100-token prompt and +{long['added_p50_ms']:.2f} ms with an 8k-token "
              f"one, where a bare TCP relay adds {by(fd['ttft'], prompt='100', via='floor')['added_p50_ms']:+.2f} / "
              f"{by(fd['ttft'], prompt='8k', via='floor')['added_p50_ms']:+.2f} ms; {gw['tokens_per_cpu_s']:,.0f} "
              f"relayed tokens per gateway CPU-second at one SSE event per token ({gw['cpu_us_per_token']:.1f} µs a "
              f"token; the bare relay {floor['cpu_us_per_token']:.1f} µs)", ("llm_frontdoor",)),
        Claim("`headrace load llm` measures goodput on real LLM traces",
              f"Azure LLM 2023 ({best['requests']} requests a run) on one emulated Llama-3.1-8B fp8 H100: goodput "
              f"(both SLOs, TTFT {best['slo_ttft_ms']:g} / TPOT {best['slo_tpot_ms']:g} ms) peaks at "
              f"{best['goodput_rps']:.1f} req/s at {best['offered_rps']:.0f} offered, then falls as attainment drops "
              f"({', '.join(pct(x['attainment'], 0) + ' at ' + format(x['offered_rps'], '.0f') for x in azure)}); "
              f"Mooncake, prompts built from its block hashes: the engine's prefix cache serves "
              f"{pct(moon[0]['prefix_cache_hit_rate'], 1)} of prompt tokens, of "
              f"{pct(moon[0]['window_reuse'], 1)} the window could reuse", ("llm_traces",)),
    ]


def vllm_gap(d: dict[str, Any]) -> str:
    runs = d["runs"]
    ok = sum(x["within_10pct_emulated"] for x in runs)
    again = sum(x["within_10pct_vllm_again"] for x in runs)
    floor = sum(x["within_floor_emulated"] for x in runs)
    worst = max(abs(e) for x in runs for e in x["error_emulated"].values())
    worst_again = max(abs(e) for x in runs for e in x["error_vllm_again"].values())
    return (f"**The engine model against real vLLM on CPU within 10%** is not met: TTFT and TPOT p50/p90 all "
            f"within 10% in {ok} of {len(runs)} runs (light, knee and overload, with and without shared prefixes), "
            f"worst {pct(worst, 0)}. The target is below this host's floor: vLLM against its own second run of the "
            f"same arrivals is within 10% in {again} of {len(runs)} runs (worst {pct(worst_again, 0)}); the emulated "
            f"engine is within that floor in {floor} of {len(runs)}. Beyond it the model misses overload: it runs "
            "slower than vLLM without shared prefixes and faster with them. The profile's front end (the API "
            f"server's {d['frontend_ms']:.1f} ms a request, beside the steps) is fitted with its step time.")


def frontdoor_gap(d: dict[str, Any]) -> list[str]:
    long, floor = by(d["ttft"], prompt="8k", via="gateway"), by(d["ttft"], prompt="8k", via="floor")
    if long["added_p50_ms"] <= d["targets"]["added_ttft_p50_ms"]:
        return []
    return [f"**The gateway's added TTFT within 1 ms p50 with an 8k-token prompt** is not met: "
            f"+{long['added_p50_ms']:.2f} ms (p99 +{long['added_p99_ms']:.2f} ms), where a bare TCP relay adds "
            f"+{floor['added_p50_ms']:.2f} ms: the gateway reads and checks the whole 8k-token body (JSON, the "
            "model, the limits) and tokenizes its text prompt to route it (its length and prefix blocks) before "
            "the engine sees its first byte; a prompt sent as token ids is not tokenized."]


def llm_routing(r: Results) -> list[Claim]:
    d, speed, live = r["llm_routing"], r["llm_sim_speed"], r["llm_routing_live"]
    v = {x["case"]: x for x in d["verdicts"]}
    parts = [f"{name}: headrace {x['headrace']:.1f} req/s, best baseline {x['best_baseline']} "
             f"{x['best_baseline_rate']:.1f} ({x['ratio']:.2f}x; bound {x['bound']:.1f} sustained)"
             for name, x in v.items()]
    over = []
    for name, c in d["cases"].items():
        o = c["overload"].get("headrace")
        m = c.get("priorities")
        if o and m:
            over.append(f"{name} {pct(o['share_of_peak'], 0)} of peak goodput; with 20% critical, 20% standard and 60% "
                        f"sheddable requests, critical {pct(m['critical_attainment_feasible'], 1)} within both SLOs "
                        f"(of those an idle engine serves in time; {pct(m['critical_attainment'], 1)} of all) while "
                        f"{pct(m['sheddable_refused'], 0)} of sheddable ones are refused")
    hour = {x["router"]: x for x in speed["rows"] if x["window_s"] is None and x["fast_forward"]}
    return [
        Claim("headrace's token-level router sustains a higher goodput rate than today's LLM routers",
              "highest rate with 90% of requests within both SLOs, every router on the same 8B H100 fleet and arrivals "
              "in the simulator: " + "; ".join(parts), ("llm_routing",)),
        Claim("past the knee headrace's router holds its goodput and keeps critical requests",
              "at 2x the best knee: " + "; ".join(over), ("llm_routing",)),
        Claim("the token-level simulator tracks the live stack's TPOT and goodput",
              f"{live['summary']['within_10pct']} of {live['summary']['compared']} live-against-simulated percentiles "
              f"within 10% ({live['summary']['within_floor']} counting the host's twin-run spread), TPOT and goodput "
              f"nearly all; same arrivals, every router, four emulated engines", ("llm_routing_live",)),
        Claim("the token-level simulator is fast",
              f"the Mooncake conversation hour ({speed['requests']:,} requests) on {speed['engines']} engines in "
              + ", ".join(f"{x['wall_s']:.0f} s with {name} ({x['cpu_s']:.0f} s of CPU)" for name, x in hour.items())
              + f"; target {speed['target_s']:.0f} s", ("llm_sim_speed",)),
    ]


def routing_gaps(r: Results) -> list[str]:
    """The routing targets the results do not meet, with the floor that stops each."""
    d, live = r["llm_routing"], r["llm_routing_live"]
    m = live["summary"]["by_metric"]
    out = [f"**The token-level simulator within 10% of the live stack** (four emulated engines behind `headrace serve`, "
           f"{len(live['settings']['routers'])} routers, light, knee, burst and overload points) holds for TPOT "
           f"(p50 {m['tpot_p50_ms'][0]}/{m['tpot_p50_ms'][1]}, p90 {m['tpot_p90_ms'][0]}/{m['tpot_p90_ms'][1]}) and "
           f"goodput ({m['goodput_rps'][0]}/{m['goodput_rps'][1]}), not for TTFT (p50 {m['ttft_p50_ms'][0]}/"
           f"{m['ttft_p50_ms'][1]}, p90 {m['ttft_p90_ms'][0]}/{m['ttft_p90_ms'][1]}): the simulator leaves out the "
           "client-gateway-engine path, which on this 2-core host costs tens of milliseconds a request (the "
           "engines' own TTFT agrees with the simulator's more closely; `llm_routing_live.md` splits where TTFT "
           "goes). The simulator has not been compared with vLLM on CPU behind the router."]
    sag = [(name, c["overload"]["headrace"]) for name, c in d["cases"].items()
           if c["overload"].get("headrace") and c["overload"]["headrace"]["share_of_peak"] < 0.95]
    if sag:
        out.append("**Goodput at 2x the knee >= 95% of peak** is not met on "
                   + ", ".join(f"{name} ({pct(o['share_of_peak'], 0)}: {o['goodput_rps']:.1f} req/s)" for name, o in sag)
                   + "; why is not yet measured. Every baseline there keeps 0-3% of its peak.")
    short = [(name, c["priorities"]) for name, c in d["cases"].items()
             if c.get("priorities") and c["priorities"]["critical_attainment_feasible"] < 0.99]
    if short:
        out.append("**Critical requests >= 99% within both SLOs at 2x the knee** is not met on "
                   + ", ".join(f"{name} ({pct(m['critical_attainment_feasible'], 1)} of those an idle engine serves "
                               f"in time)" for name, m in short)
                   + ": the misses are critical requests whose decode was stretched past the TPOT SLO by prefills "
                   "routed after them, or that waited for capacity until their TTFT could no longer be met; the "
                   "router cannot take back capacity a routed request holds (no preemption of sheddable work at the "
                   "engine).")
    for x in d["verdicts"]:
        if x["met"]:
            continue
        out.append(f"**headrace's goodput rate >= {x['target']:.1f}x the best baseline's on {x['case']}** is not met: "
                   f"{x['ratio']:.2f}x ({x['headrace']:.1f} against {x['best_baseline']}'s {x['best_baseline_rate']:.1f} "
                   f"req/s). The floor: the best baseline already reaches {pct(x['best_baseline_rate'] / x['bound'], 0)} "
                   f"of the fleet's sustained token-capacity bound ({x['bound']:.1f} req/s), so "
                   f"{x['target']:.1f}x would pass the bound.")
    return out
