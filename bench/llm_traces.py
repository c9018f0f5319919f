"""The shared LLM traces replayed by ``headrace load llm`` against the emulated engine.

Windows of both real traces in ``../shared/traces`` (Azure LLM inference 2023, conversation; and
Mooncake's conversation trace, whose prompts are built from its block hash ids so the engine's
prefix cache sees the trace's reuse) are sent open loop, streaming over ``/v1/completions`` with
token-id prompts, to ``headrace engine`` serving one reference profile. Each window is replayed
at a few time compressions (``rate_scale``) that bracket the engine's knee, each against a fresh
engine (an empty prefix cache). Per point: TTFT, TPOT and ITL percentiles, DistServe goodput
(requests per second meeting both SLOs) and attainment of each SLO, token throughput, and the
prefix-cache hit rate the engine reports on ``/metrics``
(``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total``).

    .venv/bin/python -m bench.llm_traces [--traces-dir ../shared/traces] [--quick]

Writes bench/results/llm_traces.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.host import cpu_times, steal_share
from bench.output import write_results
from loadgen.llm.run import DEFAULT_TRACES, LlmLoadSpec, build_workload, run_llm_load, run_record
from loadgen.llm.workload import BLOCK_TOKENS, Workload
from profiles.triton.process import stop_group

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PROFILE = "llama-3.1-8b-instruct-fp8@H100-80GB/gpu"
MODEL = "llama-3.1-8b-instruct-fp8"
# (trace, window start s into the trace, requests, time compressions, TTFT SLO ms, TPOT SLO ms)
PLAN: tuple[tuple[str, float, int, tuple[float, ...], float, float], ...] = (
    ("azure-llm", 600.0, 400, (2.0, 4.0, 6.0, 8.0), 500.0, 50.0),
    # long prompts: an 8192-token prefill chunk alone takes most of 200 ms on this profile, so
    # every decoding sequence sharing steps with prefills sees a TPOT near it
    ("mooncake", 600.0, 150, (0.25, 0.4, 0.7), 5000.0, 200.0),
)
QUICK_PLAN = (("azure-llm", 600.0, 60, (4.0,), 500.0, 50.0), ("mooncake", 600.0, 30, (0.4,), 5000.0, 200.0))


class Engine:
    """``headrace engine`` serving PROFILE on a free port, in its own process group."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "engine", "--profile", PROFILE, "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        m = re.search(r"(http://\S+)/v1 \((.*)\)", line)
        if m is None:
            stop_group(self.proc)
            raise RuntimeError(f"headrace engine did not start: {line}{self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.url, self.settings = m.group(1), m.group(2)

    def counters(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
                              "vllm:num_preemptions_total"):
                    out[s.name] = out.get(s.name, 0.0) + s.value
        return out

    def close(self) -> None:
        stop_group(self.proc, grace=10)


def window_reuse(work: Workload) -> float | None:
    """The share of the window's prompt tokens an unbounded prefix cache could serve: each prompt's
    leading blocks whose hash ids an earlier prompt of the window already sent (None without ids)."""
    if not work.rows.hash_ids:
        return None
    seen: set[int] = set()
    hit = 0
    for ids, size in zip(work.rows.hash_ids, work.rows.input_len, strict=True):
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        hit += min(k * BLOCK_TOKENS, int(size))
        seen.update(ids)
    return hit / int(work.rows.input_len.sum())


async def point(trace: str, start: float, requests: int, scale: float, slo_ttft: float, slo_tpot: float,
                traces_dir: Path) -> dict[str, Any]:
    spec = LlmLoadSpec(url="http://127.0.0.1:1", model=MODEL, workload=trace, traces_dir=traces_dir,  # type: ignore[arg-type]
                       start_s=start, requests=requests, rate_scale=scale, slo_ttft_ms=slo_ttft,
                       slo_tpot_ms=slo_tpot, request_timeout_s=300.0)
    work = build_workload(spec)
    engine = Engine()
    try:
        spec = spec.model_copy(update={"url": engine.url})
        host0, t0 = cpu_times(), time.monotonic()
        run = await run_llm_load(spec, work=work)
        wall = time.monotonic() - t0
        c = engine.counters()
    finally:
        engine.close()
    s = run.summary
    q = c.get("vllm:prefix_cache_queries_total", 0.0)
    return {
        "trace": trace, "rate_scale": scale, "requests": s["offered"], "ok": s["ok"], "errors": s["errors"],
        "offered_rps": s["offered_rps"], "elapsed_s": round(s["elapsed_s"], 2), "wall_s": round(wall, 2),
        "slo_ttft_ms": slo_ttft, "slo_tpot_ms": slo_tpot,
        "attainment": s["attainment"], "attainment_ttft": s["attainment_ttft"],
        "attainment_tpot": s["attainment_tpot"], "goodput_rps": s["goodput_rps"],
        "throughput_rps": s["throughput_rps"], "input_tokens_per_s": s["input_tokens_per_s"],
        "output_tokens_per_s": s["output_tokens_per_s"], "ttft_ms": s["ttft_ms"], "tpot_ms": s["tpot_ms"],
        "itl_ms": s["itl_ms"], "e2e_ms": s["e2e_ms"], "send_lag_ms": s["send_lag_ms"],
        "window_reuse": window_reuse(work),
        "prefix_cache_hit_rate": c.get("vllm:prefix_cache_hits_total", 0.0) / q if q else None,
        "preemptions": c.get("vllm:num_preemptions_total"), "engine": engine.settings,
        "steal": steal_share(host0, cpu_times()),
    }


async def run(plan: tuple, traces_dir: Path, log: Any = print) -> dict[str, Any]:
    rows = []
    for trace, start, requests, scales, slo_ttft, slo_tpot in plan:
        for scale in scales:
            r = await point(trace, start, requests, scale, slo_ttft, slo_tpot, traces_dir)
            log(f"{trace} x{scale:g}: {r['offered_rps']:.2f} req/s offered, both SLOs "
                f"{100 * r['attainment']:.1f}%, goodput {r['goodput_rps']:.2f}/s, TTFT p99 "
                f"{r['ttft_ms']['p99']:.0f} ms, TPOT p99 {r['tpot_ms']['p99']:.1f} ms, prefix hits "
                f"{100 * (r['prefix_cache_hit_rate'] or 0):.1f}% ({r['wall_s']:.0f} s)")
            rows.append(r)
    record = run_record(LlmLoadSpec(url="http://engine:0", model=MODEL))
    meta = {"profile": PROFILE, "plan": [list(p[:3]) + [list(p[3]), p[4], p[5]] for p in plan],
            "command": "python -m bench.llm_traces", "headrace": record["headrace"], "host": record["host"],
            "traces": {t: str(traces_dir / f) for t, f in (("azure-llm", "azure_llm_2023_conv.csv"),
                                                         ("mooncake", "mooncake_conversation.jsonl"))}}
    return {"rows": rows, "meta": meta}


def _n(v: float | None, spec: str = "{:.0f}") -> str:
    return "-" if v is None else spec.format(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        "# LLM trace replay: `headrace load llm` against the emulated engine",
        "",
        f"`{meta['command']}` at commit `{meta['headrace']['commit']}` on {meta['host']['cpu_count']} CPUs "
        f"({meta['host']['platform']}). Engine: `headrace engine --profile {meta['profile']}` "
        f"({result['rows'][0]['engine'] if result['rows'] else '-'}), a fresh one per row.",
        "",
        "Each row replays a window of a shared trace (from its start offset, the first N requests), "
        "time-compressed by the scale, open loop, streaming over `/v1/completions` with token-id prompts "
        "and exact output lengths. Times count from each request's scheduled send. Goodput is "
        "DistServe's: requests per second (over the run's wall time) meeting both the TTFT and the TPOT "
        "SLO; attainment is over the requests offered. Prefix hits: the engine's "
        "`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` over the row; window reuse: the "
        "share of the window's prompt tokens in leading blocks an earlier request of the window sent (what "
        "an unbounded cache could hit; Azure's prompts share nothing). Send lag p99 is the load "
        "generator's lateness: a high one means the host, not the engine, set the pace.",
        "",
        "| trace | scale | req | offered/s | TTFT p50 / p90 / p99 ms | TPOT p50 / p90 / p99 ms | ITL p99 ms "
        "| TTFT att. | TPOT att. | both | goodput/s | in tok/s | out tok/s | prefix hits (window reuse) "
        "| send lag p99 ms | steal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        t, p = r["ttft_ms"], r["tpot_ms"]
        lines.append(
            f"| {r['trace']} | x{r['rate_scale']:g} | {r['ok']}/{r['requests']} | {_n(r['offered_rps'], '{:.2f}')} "
            f"| {_n(t['p50'])} / {_n(t['p90'])} / {_n(t['p99'])} "
            f"| {_n(p['p50'], '{:.1f}')} / {_n(p['p90'], '{:.1f}')} / {_n(p['p99'], '{:.1f}')} "
            f"| {_n(r['itl_ms']['p99'], '{:.1f}')} | {_pct(r['attainment_ttft'])} | {_pct(r['attainment_tpot'])} "
            f"| {_pct(r['attainment'])} | {_n(r['goodput_rps'], '{:.2f}')} | {_n(r['input_tokens_per_s'])} "
            f"| {_n(r['output_tokens_per_s'])} | {_pct(r['prefix_cache_hit_rate'])} ({_pct(r['window_reuse'])}) "
            f"| {_n(r['send_lag_ms']['p99'], '{:.1f}')} | {_pct(r['steal'])} |")
    lines += ["", "SLOs (TTFT / TPOT ms): " + "; ".join(
        f"{p[0]} {p[4]:g} / {p[5]:g} (window from {p[1]:g} s, {p[2]} requests)" for p in meta["plan"]) + ".", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces-dir", type=Path, default=DEFAULT_TRACES, help="folder of the shared traces")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where llm_traces.{json,md} go")
    ap.add_argument("--quick", action="store_true", help="one short point per trace (a smoke run)")
    args = ap.parse_args(argv)
    result = asyncio.run(run(QUICK_PLAN if args.quick else PLAN, args.traces_dir))
    write_results(args.out, "llm_traces", result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
