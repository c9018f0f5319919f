"""How fast ``headrace sim llm`` runs: the Mooncake conversation hour on 16 engines, on one core.

The case: the whole shared Mooncake conversation trace (``mooncake_conversation.jsonl``, one
hour, 12,031 requests, prompts of about 12k tokens built from its 512-token block hash ids) at its
own pace, on 16 engines of ``llama-3.1-8b-instruct-bf16@H100-80GB/gpu`` (vLLM's scheduler
defaults, utilisation 0.9), behind Envoy's least-request router (``least-request``, the
baselines') and, with ``--routers``, others. Each run is :func:`loadgen.llm.sim.simulate` in this
process, timed with ``time.perf_counter`` around the whole of it (prompts built and hashed, the
engines stepped, the router asked), with the engines' fast-forward on; ``--step`` also times the
same run stepping every engine step by step, on a window of the trace (``--step-window``, 300 s
by default), and checks that both give the same outcomes. The target is the hour in at most
5 minutes on this host.

Run it under the machine-wide bench lock::

    flock /tmp/headrace-bench.lock .venv/bin/python -m bench.llm_sim_speed
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path
from typing import Any

from bench.output import write_results

PROFILE = "llama-3.1-8b-instruct-bf16@H100-80GB/gpu"
ENGINES = 16
SLO_TTFT_MS, SLO_TPOT_MS = 2000.0, 100.0
TARGET_S = 300.0
OUT = Path(__file__).resolve().parent / "results"


def one(router: str, window_s: float | None, fast_forward: bool, traces_dir: Path) -> tuple[dict[str, Any], Any]:
    """One run: its timing and summary, and the simulator's result."""
    from loadgen.llm.run import LlmLoadSpec, build_workload
    from loadgen.llm.sim import fleet, simulate
    from loadgen.llm.sim_command import SIM_URL, find_profile, make_router
    from loadgen.llm.stats import summarize

    profile = find_profile(PROFILE)
    spec = LlmLoadSpec(url=SIM_URL, model=profile.name, workload="mooncake", traces_dir=traces_dir,
                       duration_s=window_s or 3600.0, slo_ttft_ms=SLO_TTFT_MS, slo_tpot_ms=SLO_TPOT_MS)
    work = build_workload(spec)
    cpu0 = time.process_time()
    res = simulate(work, fleet(profile, ENGINES), make_router(router, 0), SLO_TTFT_MS / 1e3, SLO_TPOT_MS / 1e3,
                   fast_forward=fast_forward)
    cpu = time.process_time() - cpu0
    s = summarize(res.outcomes, res.elapsed_s, SLO_TTFT_MS, SLO_TPOT_MS)
    row = {
        "router": router, "fast_forward": fast_forward, "window_s": window_s, "requests": len(work),
        "wall_s": res.wall_s, "cpu_s": cpu, "virtual_s": res.elapsed_s, "events": res.events,
        "steps": sum(e.steps for e in res.engines), "run_steps": sum(e.run_steps for e in res.engines),
        "runs": sum(e.runs for e in res.engines),
        "attainment": s["attainment"], "ttft_p50_ms": s["ttft_ms"]["p50"], "ttft_p99_ms": s["ttft_ms"]["p99"],
        "tpot_p50_ms": s["tpot_ms"]["p50"], "prefix_cache_hit_rate": s["prefix_cache_hit_rate"],
        "errors": s["errors"], "preemptions": sum(e.preemptions for e in res.engines),
    }
    return row, res


def render(doc: dict[str, Any]) -> str:
    lines = ["# headrace sim llm: speed", "",
             f"The Mooncake conversation hour ({doc['requests']} requests) on {ENGINES} x `{PROFILE}`, simulated in "
             f"one process on this host ({doc['host']['cpu_count']} CPUs, Python {doc['host']['python']}); "
             f"commit {doc['headrace'].get('commit')}. Target: the hour in at most {TARGET_S:.0f} s.", "",
             "| router | trace | fast-forward | wall s | CPU s | events | steps one by one | steps in runs | "
             "attainment | TTFT p50 ms | prefix hits |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        trace = "hour" if r["window_s"] is None else f"first {r['window_s']:g} s"
        hits = r["prefix_cache_hit_rate"]
        lines.append(f"| {r['router']} | {trace} | {'on' if r['fast_forward'] else 'off'} | {r['wall_s']:.1f} | "
                     f"{r['cpu_s']:.1f} | {r['events']} | {r['steps']} | {r['run_steps']} | "
                     f"{100 * (r['attainment'] or 0):.1f}% | {r['ttft_p50_ms']:.0f} | "
                     f"{'-' if hits is None else f'{100 * hits:.1f}%'} |")
    lines += ["", f"Peak memory of the process: {doc['max_rss_mb']:.0f} MB.", ""]
    for note in doc["notes"]:
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"


def main() -> None:
    from loadgen.llm.run import DEFAULT_TRACES
    from loadgen.record import headrace_version, host_facts

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routers", default="least-request", help="comma-separated routers to time on the hour")
    ap.add_argument("--step", action="store_true", help="also time stepping one by one on a window, and compare")
    ap.add_argument("--step-window", type=float, default=300.0, help="seconds of the trace for --step (300)")
    ap.add_argument("--traces-dir", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    rows, notes = [], []
    for router in [r for r in a.routers.split(",") if r]:
        row, _ = one(router, None, True, a.traces_dir)
        rows.append(row)
        verdict = "meets" if row["wall_s"] <= TARGET_S else "misses"
        notes.append(f"{router}: the hour in {row['wall_s']:.1f} s, {verdict} the {TARGET_S:.0f} s target")
        print(f"{router}: {row['wall_s']:.1f} s wall for the hour", flush=True)
    if a.step:
        router = rows[0]["router"] if rows else "least-request"
        ran, res_ff = one(router, a.step_window, True, a.traces_dir)
        stepped, res_st = one(router, a.step_window, False, a.traces_dir)
        rows += [ran, stepped]
        worst = max((abs(x.ttft - y.ttft) for x, y in zip(res_ff.outcomes, res_st.outcomes, strict=True)
                     if x.ttft is not None and y.ttft is not None), default=0.0)
        same = all((x.output_tokens, x.cached_tokens, x.error) == (y.output_tokens, y.cached_tokens, y.error)
                   for x, y in zip(res_ff.outcomes, res_st.outcomes, strict=True))
        notes.append(f"the first {a.step_window:g} s stepped one by one: {stepped['wall_s']:.1f} s against "
                     f"{ran['wall_s']:.1f} s fast-forwarded (x{stepped['wall_s'] / ran['wall_s']:.1f}); same tokens, "
                     f"prefix hits and errors: {same}; largest TTFT difference {worst:.1e} s")
    doc = {"profile": PROFILE, "engines": ENGINES, "slo_ttft_ms": SLO_TTFT_MS, "slo_tpot_ms": SLO_TPOT_MS,
           "target_s": TARGET_S, "requests": rows[0]["requests"] if rows else None, "rows": rows, "notes": notes,
           "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "headrace": headrace_version(),
           "host": host_facts()}
    write_results(a.out, "llm_sim_speed", doc, render(doc))


if __name__ == "__main__":
    main()
