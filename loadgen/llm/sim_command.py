"""``headrace sim llm``: a fleet of LLM engines behind one router, in virtual time
(:mod:`loadgen.llm.sim`), under the workloads ``headrace load llm`` sends, reported as it reports."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console

from gateway.policy.llm.routers import HEADRACE, make
from loadgen.arrivals import TraceError
from loadgen.describe import validation_message
from loadgen.llm import report
from loadgen.llm.command import add_workload_flags, workload_fields
from loadgen.llm.driver import parse_mix, priorities
from loadgen.llm.run import LlmLoadSpec, build_workload, run_record
from loadgen.llm.sim import GPU_MEMORY_UTILIZATION, SCRAPE_INTERVAL_S, fleet, simulate, tenants_of
from loadgen.llm.stats import summarize
from profiles.llm.engine import EngineConfig
from profiles.llm.profile import find_llm_profile
from profiles.profile import ProfileError

SIM_URL = "http://simulator:1"  # the load spec's target: nothing is sent

DESCRIPTION = """\
Simulate a fleet of LLM engines (continuous batching, paged KV cache and prefix cache, each step
timed by the profile) behind one token-level router, in virtual time: headrace's router or any
baseline, the same objects the gateway runs. Each engine's load is read every --scrape-interval
seconds as the gateway reads /metrics (by default at the router's own period); KV events reach the router as the engines publish them.

The report is headrace load llm's: TTFT, TPOT and end-to-end times from each request's scheduled
send, throughput, SLO attainment and DistServe goodput. --json writes that summary with a `sim`
section (wall time, per-engine prefix hits and preemptions) and the run's settings.
"""

EPILOG = """\
examples:
  # an hour of the Mooncake conversation trace on 16 H100s, Envoy's least-request
  headrace sim llm --profile llama-3.1-8b-instruct-bf16@H100-80GB/gpu --engines 16 \\
      --router least-request --trace mooncake --duration 3600 --slo-ttft-ms 2000 --slo-tpot-ms 100

  # llm-d's shared-prefix shape at 20 req/s on 8 engines, headrace's router
  headrace sim llm --profile llama-3.1-8b-instruct-bf16@H100-80GB/gpu --engines 8 --router headrace \\
      --trace shared-prefix --rate 20 --duration 120 --slo-ttft-ms 1000 --slo-tpot-ms 80 --json out.json

Exit codes: 0 done, 2 bad arguments.
"""


def _engine_default(name: str) -> Any:
    return next(f.default for f in fields(EngineConfig) if f.name == name)


class LlmSimSettings(BaseModel):
    """The fleet, the router and the simulator's own settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = Field(min_length=1, description="an LLM profile: reference name, unique variant, or YAML file")
    engines: int = Field(1, ge=1, le=4096, description="identical engines of the profile")
    router: str = Field(HEADRACE, min_length=1, description="headrace, or a baseline router's name")
    gpu_memory_utilization: float = Field(GPU_MEMORY_UTILIZATION, gt=0, le=1,
                                          description="share of device memory the engine takes (KV cache size)")
    max_num_seqs: int = Field(_engine_default("max_num_seqs"), ge=1, description="running requests per engine")
    max_num_batched_tokens: int = Field(_engine_default("max_num_batched_tokens"), ge=1,
                                        description="token budget of a step")
    scrape_interval_s: float | None = Field(None, gt=0, description="the /metrics read period (default: the "
                                            "router's own, else the gateway's)")
    hop_s: float = Field(0.0, ge=0, description="gateway to engine, one way")
    fast_forward: bool = Field(True, description="take decode-only steps as runs (same results, faster)")
    itl: bool = Field(False, description="keep every inter-token gap")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("llm", help="simulate LLM engines behind a token-level router in virtual time",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("fleet and router")
    g.add_argument("--profile", required=True,
                   help="LLM profile: a reference name (VARIANT@GPU/SLICE), a variant only one has, or a YAML file")
    g.add_argument("--engines", type=int, default=1, help="identical engines of the profile (1)")
    g.add_argument("--router", default=HEADRACE,
                   help="headrace (default) or a baseline: round-robin, least-request, pow2, sglang, llm-d, ...")
    g.add_argument("--gpu-memory-utilization", type=float, default=GPU_MEMORY_UTILIZATION,
                   help=f"the engines' share of device memory, which sizes the KV cache ({GPU_MEMORY_UTILIZATION})")
    g.add_argument("--max-num-seqs", type=int, default=_engine_default("max_num_seqs"),
                   help="running requests per engine (vLLM's default)")
    g.add_argument("--max-num-batched-tokens", type=int, default=_engine_default("max_num_batched_tokens"),
                   help="token budget of a step (vLLM's default)")
    g.add_argument("--scrape-interval", type=float, default=None,
                   help=f"seconds between reads of each engine's load (default: the router's own, as llm-d's "
                   f"0.05, else the gateway's {SCRAPE_INTERVAL_S})")
    g.add_argument("--hop-ms", type=float, default=0.0, help="gateway to engine, one way (0)")

    add_workload_flags(p)

    g = p.add_argument_group("SLOs and priorities (each request's, given to the router)")
    g.add_argument("--slo-ttft-ms", type=float, help="time-to-first-token SLO (the router's default without)")
    g.add_argument("--slo-tpot-ms", type=float, help="time-per-output-token SLO (the router's default without)")
    g.add_argument("--priority-mix", metavar="BAND=SHARE,...",
                   help="each request's priority band, drawn as headrace load llm draws it: e.g. "
                        "critical=0.2,sheddable=0.5 (the rest standard)")

    g = p.add_argument_group("simulation and output")
    g.add_argument("--no-fast-forward", action="store_true",
                   help="step every engine one step at a time (same results, slower)")
    g.add_argument("--itl", action="store_true", help="keep every inter-token gap (the ITL row)")
    g.add_argument("--json", type=Path, metavar="PATH", help="write the summary, a `sim` section and the settings")
    g.add_argument("--quiet", action="store_true", help="one line instead of the table")
    p.set_defaults(func=main)


def _fail(msg: str) -> int:
    print(f"headrace sim llm: error: {' '.join(msg.split())}", file=sys.stderr)
    return 2


def main(a: argparse.Namespace) -> int:
    try:
        settings = LlmSimSettings(
            profile=a.profile, engines=a.engines, router=a.router, gpu_memory_utilization=a.gpu_memory_utilization,
            max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
            scrape_interval_s=a.scrape_interval, hop_s=a.hop_ms / 1e3, fast_forward=not a.no_fast_forward, itl=a.itl)
        profile = find_llm_profile(settings.profile)
        spec = LlmLoadSpec(url=SIM_URL, model=profile.name, slo_ttft_ms=a.slo_ttft_ms, slo_tpot_ms=a.slo_tpot_ms,
                           priority_mix=parse_mix(a.priority_mix) if a.priority_mix else None, **workload_fields(a))
        engines = fleet(profile, settings.engines, settings.gpu_memory_utilization,
                        max_num_seqs=settings.max_num_seqs, max_num_batched_tokens=settings.max_num_batched_tokens)
        router = make(settings.router, spec.seed)
        work = build_workload(spec)
        slos: dict[str, Any] = {}
        if spec.slo_ttft_ms is not None:
            slos["slo_ttft_s"] = spec.slo_ttft_ms / 1e3
        if spec.slo_tpot_ms is not None:
            slos["slo_tpot_s"] = spec.slo_tpot_ms / 1e3
        bands = priorities(spec.priority_mix, len(work), work.seed) if spec.priority_mix else None
        result = simulate(work, engines, router, band=bands, tenant=tenants_of(work),
                          scrape_interval=settings.scrape_interval_s,
                          hop_s=settings.hop_s, itl=settings.itl, fast_forward=settings.fast_forward, **slos)
    except ValidationError as e:
        return _fail(validation_message(e))
    except (ValueError, ProfileError, TraceError, OSError) as e:
        return _fail(str(e))
    summary = summarize(result.outcomes, result.elapsed_s, spec.slo_ttft_ms, spec.slo_tpot_ms)
    summary["workload"] = spec.workload
    summary["load"] = spec.load
    console = Console() if Console().is_terminal else Console(width=132)
    if a.quiet:
        console.print(report.compact(summary), markup=False, highlight=False)
    else:
        report.print_report(summary, console)
        console.print(f"simulated {len(work)} requests on {settings.engines} x {profile.name} behind "
                      f"{settings.router} in {result.wall_s:.1f} s", markup=False, highlight=False)
    if a.json:
        sim = {**result.record(), "settings": settings.model_dump(mode="json"), "profile": profile.name}
        report.to_json({**summary, "sim": sim, "run": run_record(spec)}, a.json)
    return 0
