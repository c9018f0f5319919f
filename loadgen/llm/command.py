"""``headrace load llm``: open-loop streaming load on an OpenAI-compatible or Triton generate
endpoint, reporting TTFT / TPOT percentiles, token throughput and DistServe goodput."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loadgen.describe import validation_message
from loadgen.llm import report
from loadgen.llm.driver import TargetError, parse_mix
from loadgen.llm.run import (
    DEFAULT_TRACES,
    SYNTHETIC_OUTPUT_LEN,
    WORKLOADS,
    LlmLoadSpec,
    build_workload,
    find_max_goodput,
    run_llm_load,
    run_record,
)
from loadgen.llm.stats import per_request
from loadgen.llm.workload import (
    SHARED_OUTPUT_LEN,
    SHARED_QUESTION_LEN,
    SHARED_SYSTEM_LEN,
    SHARED_TENANTS,
)

DESCRIPTION = """\
Stream generative requests open loop (each sent at its scheduled time, whatever earlier answers
do) and measure, per request, the time to first token (TTFT), every inter-token gap, the time per
output token after the first (TPOT) and the end-to-end time, all from the scheduled send.

Goodput is DistServe's: requests per second that meet both --slo-ttft-ms and --slo-tpot-ms; a
refused or failed request meets neither. --find-max-goodput scales the load and bisects for the
highest load at which --target-attainment (90%) of the requests meet both.

Workloads: --trace azure-llm (Azure LLM inference 2023, conversation: distinct prompts) or
mooncake (Mooncake conversation: prompts built from the trace's 512-token block hash ids, so the
engine's prefix cache sees the trace's reuse), read from --traces-dir; or poisson / gamma
arrivals at --rate with --input-len / --output-len distributions. Prompts go as token ids
(--endpoint completions), so their lengths are exact on any tokenizer, or as text with one word per
token (--endpoint chat, --endpoint triton).
"""

EPILOG = """\
examples:
  # replay 2 minutes of the Mooncake trace 4x as fast against an OpenAI-compatible engine
  headrace load llm --url http://127.0.0.1:8000 --model llama-3.1-8b-instruct-bf16 \\
      --trace mooncake --duration 120 --rate-scale 4 --slo-ttft-ms 2000 --slo-tpot-ms 100 --out run1

  # Poisson arrivals with lognormal lengths, 30 s, over Triton's generate_stream
  headrace load llm --url http://127.0.0.1:8000 --model llm --endpoint triton --trace poisson \\
      --rate 4 --input-len lognormal:1024:0.8 --output-len uniform:50:300 --duration 30

  # the highest rate of the Azure trace at which 90% meet both SLOs
  headrace load llm --url http://127.0.0.1:8000 --model m --trace azure-llm --requests 300 \\
      --slo-ttft-ms 1000 --slo-tpot-ms 50 --find-max-goodput 1:16

Lengths: N, fixed:N, uniform:LO:HI, lognormal:MEDIAN:SIGMA, trace:azure-llm, trace:mooncake.
Exit codes: 0 done, 1 target unreachable, 2 bad arguments, 3 search found no passing load.
"""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("llm", help="generative load: streaming, TTFT/TPOT, goodput, trace replay",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("target")
    g.add_argument("--url", required=True, help="http://HOST:PORT of the server")
    g.add_argument("--model", required=True, help="model name to address")
    g.add_argument("--endpoint", choices=("completions", "chat", "triton"), default="completions",
                   help="/v1/completions (token-id prompts, default), /v1/chat/completions, or Triton's "
                        "/v2/models/MODEL/generate_stream")
    g.add_argument("--api-key-env", metavar="VAR", help="send 'Authorization: Bearer' with this variable's value")
    g.add_argument("--request-timeout", type=float, default=600.0, help="a request gives up after (s, 600)")

    add_workload_flags(p)

    g = p.add_argument_group("SLOs and search")
    g.add_argument("--slo-ttft-ms", type=float, help="time-to-first-token SLO (sent as x-slo-ttft-ms)")
    g.add_argument("--slo-tpot-ms", type=float, help="time-per-output-token SLO (sent as x-slo-tpot-ms)")
    g.add_argument("--priority-mix", metavar="BAND=SHARE,...",
                   help="send each request's priority band as x-headrace-priority, drawn with --seed: e.g. "
                        "critical=0.2,sheddable=0.5 (the rest standard)")
    g.add_argument("--find-max-goodput", metavar="LO:HI",
                   help="search load factors LO..HI (times --rate-scale or --rate) for the highest holding "
                        "--target-attainment of both SLOs")
    g.add_argument("--target-attainment", type=float, default=0.9, help="share meeting both SLOs (0.9)")
    g.add_argument("--bisect", type=int, default=3, help="search: bisections after both ends (3)")

    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, metavar="DIR",
                   help="write DIR/llm_load.json (summary, settings, every request) and DIR/*.png")
    g.add_argument("--quiet", action="store_true", help="one line instead of the table")
    p.set_defaults(func=main)


def add_workload_flags(p: argparse.ArgumentParser) -> None:
    """The workload flags, shared by ``headrace load llm`` and ``headrace sim llm``."""
    g = p.add_argument_group("workload")
    g.add_argument("--trace", choices=WORKLOADS, default="poisson",
                   help="a shared trace to replay, synthetic arrivals (default poisson), or llm-d's shared-prefix "
                        "shape (poisson arrivals)")
    g.add_argument("--traces-dir", type=Path, default=DEFAULT_TRACES,
                   help=f"folder of the shared traces (default {DEFAULT_TRACES})")
    g.add_argument("--start", type=float, default=0.0, help="trace: seconds into the trace the window starts")
    g.add_argument("--duration", type=float, help="seconds of replay (after --rate-scale)")
    g.add_argument("--requests", type=int, help="send at most this many requests")
    g.add_argument("--rate-scale", type=float, default=1.0, help="trace: time compression (2: twice as fast)")
    g.add_argument("--rate", type=float, default=1.0, help="poisson/gamma/shared-prefix: mean requests/s (1)")
    g.add_argument("--cv", type=float, default=1.0, help="gamma: coefficient of variation (1)")
    g.add_argument("--input-len", default="lognormal:1024:0.8", help="poisson/gamma: prompt tokens")
    g.add_argument("--output-len", help=f"poisson/gamma/shared-prefix: output tokens (default {SYNTHETIC_OUTPUT_LEN}; "
                                        f"shared-prefix {SHARED_OUTPUT_LEN}, llm-d's)")
    g.add_argument("--tenants", type=int, default=SHARED_TENANTS,
                   help=f"shared-prefix: tenants, each with its own system prompt ({SHARED_TENANTS})")
    g.add_argument("--system-len", type=int, default=SHARED_SYSTEM_LEN,
                   help=f"shared-prefix: system prompt tokens, whole 512-token blocks ({SHARED_SYSTEM_LEN})")
    g.add_argument("--question-len", type=int, default=SHARED_QUESTION_LEN,
                   help=f"shared-prefix: question tokens after it ({SHARED_QUESTION_LEN})")
    g.add_argument("--questions", type=int,
                   help="shared-prefix: questions per tenant, drawn uniformly (default: each request its own)")
    g.add_argument("--max-context", type=int, help="cap prompt + output tokens at the model's context")
    g.add_argument("--vocab-size", type=int, default=32000, help="prompt token ids lie in [16, N) (32000)")
    g.add_argument("--seed", type=int, default=0, help="seed of arrivals, lengths and prompts")


def workload_fields(a: argparse.Namespace) -> dict[str, Any]:
    """The :class:`LlmLoadSpec` fields the workload flags set."""
    return dict(
        workload=a.trace, traces_dir=a.traces_dir, start_s=a.start, duration_s=a.duration, requests=a.requests,
        rate_scale=a.rate_scale, rate=a.rate, cv=a.cv, input_len=a.input_len, output_len=a.output_len,
        max_context=a.max_context, seed=a.seed, tenants=a.tenants, system_len=a.system_len,
        question_len=a.question_len, questions=a.questions, vocab_size=a.vocab_size)


def spec_from_args(a: argparse.Namespace) -> LlmLoadSpec:
    return LlmLoadSpec(
        url=a.url.rstrip("/"), model=a.model, api=a.endpoint, slo_ttft_ms=a.slo_ttft_ms, slo_tpot_ms=a.slo_tpot_ms,
        request_timeout_s=a.request_timeout, priority_mix=parse_mix(a.priority_mix) if a.priority_mix else None,
        **workload_fields(a))


def _fail(msg: str, code: int) -> int:
    print(f"headrace load llm: error: {' '.join(msg.split())}", file=sys.stderr)
    return code


def _search_range(text: str) -> tuple[float, float]:
    lo, sep, hi = text.partition(":")
    try:
        return float(lo), float(hi)
    except ValueError:
        raise ValueError(f"--find-max-goodput {text!r}: want LO:HI, two numbers") from None


def main(a: argparse.Namespace) -> int:
    try:
        spec = spec_from_args(a)
        api_key = None
        if a.api_key_env:
            api_key = os.environ.get(a.api_key_env, "").strip()
            if not api_key:
                raise ValueError(f"--api-key-env {a.api_key_env}: the variable is not set or empty")
        if a.find_max_goodput:
            lo, hi = _search_range(a.find_max_goodput)
            if a.bisect < 0:
                raise ValueError(f"--bisect = {a.bisect}: need 0 or more")
            build_workload(spec)  # bad input shows before any load is sent
            return asyncio.run(_search(spec, a, api_key, lo, hi))
        return asyncio.run(_once(spec, a, api_key))
    except ValidationError as e:
        return _fail(validation_message(e), 2)
    except TargetError as e:
        return _fail(str(e), 1)
    except ValueError as e:
        return _fail(str(e), 2)


def _console() -> Console:
    return Console() if Console().is_terminal else Console(width=132)


async def _once(spec: LlmLoadSpec, a: argparse.Namespace, api_key: str | None) -> int:
    work = build_workload(spec)
    err = Console(stderr=True)
    if not a.quiet:
        err.print(f"sending {len(work)} requests over {work.span_s:.1f} s to {spec.url} ({spec.api})",
                  markup=False, highlight=False)
    if a.quiet or not err.is_terminal:
        run = await run_llm_load(spec, api_key, work=work)
    else:
        with Progress(TextColumn("[bold]load llm"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("sent {task.fields[sent]}"), TimeElapsedColumn(), console=err,
                      transient=True) as bar:
            task = bar.add_task("load", total=len(work), sent=0)
            run = await run_llm_load(spec, api_key, work=work, on_progress=lambda sent, done, total: bar.update(
                task, completed=done, sent=sent))
    console = _console()
    if a.quiet:
        console.print(report.compact(run.summary), markup=False, highlight=False)
    else:
        report.print_report(run.summary, console)
    if a.out:
        doc = {"summary": run.summary, "run": run_record(spec), "requests": per_request(run.outcomes)}
        report.to_json(doc, a.out / "llm_load.json")
        report.plot_cdf(run.outcomes, run.summary, a.out / "llm_load_cdf.png")
    return 0


async def _search(spec: LlmLoadSpec, a: argparse.Namespace, api_key: str | None, lo: float, hi: float) -> int:
    err = Console(stderr=True)

    def said(run: Any, ok: bool) -> None:
        if not a.quiet:
            err.print(f"load x{run.spec.load:g}: {report.compact(run.summary)} ({'pass' if ok else 'fail'})",
                      markup=False, highlight=False)

    res = await find_max_goodput(spec, lo, hi, a.target_attainment, a.bisect, api_key, said)
    rows = res.rows()
    console = _console()
    if not a.quiet:
        console.print(report.search_table(rows, res.target))
    if a.out:
        doc = {"best_load": None if res.best is None else res.best.spec.load,
               "best": None if res.best is None else res.best.summary, "target_attainment": res.target,
               "rows": rows, "run": run_record(spec, {"search": a.find_max_goodput, "bisect": a.bisect})}
        report.to_json(doc, a.out / "llm_search.json")
        report.plot_search(rows, res.target, a.out / "llm_search.png")
    if res.best is None:
        console.print(f"no load in {a.find_max_goodput} has {a.target_attainment:.0%} meeting both SLOs")
        return 3
    s = res.best.summary
    console.print(f"highest load with {res.target:.0%} meeting both SLOs: x{res.best.spec.load:g} "
                  f"({report.fmt(s['offered_rps'], '{:.2f}')} req/s offered, goodput {s['goodput_rps']:.2f} req/s)")
    return 0
