"""``headrace load``: drive a KServe v2 target (the gateway, Triton, any v2 server) with open-
or closed-loop load and report SLO attainment, goodput and latency percentiles."""

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

from loadgen import report
from loadgen.arrivals import TraceError
from loadgen.clients import LoadError
from loadgen.describe import validation_message
from loadgen.live import LiveWindow
from loadgen.llm import command as llm_command
from loadgen.payload import PayloadError
from loadgen.record import run_record
from loadgen.run import LoadResult, run_load
from loadgen.spec import InputSpec, LoadSpec
from loadgen.sweep import find_max_rate, parse_range, sweep_rates

DESCRIPTION = """\
Load-test a KServe v2 endpoint with per-request deadlines and report what an SLO cares about.

Open loop (default) sends every request at its scheduled time, whatever the server does, and
measures latency from that scheduled time (as wrk2 does), so a stall shows up in every request
that should have been sent during it. Closed loop (--mode closed) keeps --concurrency requests
in flight, like perf_analyzer --concurrency-range or Locust; it hides stalls (coordinated
omission) and is for throughput, not SLO numbers.

Each request carries its SLO as Triton's `timeout` parameter (µs) and --priority as
`priority`. SLO attainment = answered OK within the SLO / offered; goodput = the same per
second. 429 / RESOURCE_EXHAUSTED answers (and 503 / UNAVAILABLE with headrace's reject reason)
count as rejections, other failures as errors by kind.
"""

EPILOG = """\
examples:
  # 500 req/s of bursty (gamma, cv 4) traffic for 30 s against Triton over gRPC, SLO 100 ms
  headrace load --target grpc://127.0.0.1:8001 --model resnet50 --rate 500 \\
      --duration 30 --arrival gamma --cv 4 --slo-ms 100

  # two models 3:1, report to JSON/CSV and plots
  headrace load --target http://127.0.0.1:8000 --mix resnet50:3,bert:1 --rate 200 \\
      --slo-ms 150 --json out.json --csv out.csv --plot out

  # replay a per-minute trace in the Azure Functions 2019 format, a trace minute per second;
  # the bundled azure_sample.csv is SYNTHETIC (loadgen/data/make_azure_sample.py: seeded
  # diurnal shape, bursts, idle stretches), not the real data set: give the real CSV for that
  headrace load --target http://127.0.0.1:8000 --arrival trace \\
      --trace loadgen/data/azure_sample.csv --trace-models resnet50,bert --time-scale 60

  # sweep rates, then find the highest rate holding 99% within SLO
  headrace load --target http://127.0.0.1:8000 --model m --slo-ms 50 --rate-range 100:1000:100
  headrace load --target http://127.0.0.1:8000 --model m --slo-ms 50 --find-max-rate \\
      --search-range 50:2000 --target-attainment 0.99

Inputs come from the model's metadata (-1 dims sent as --batch), one fixed payload per
model, unless --input or --input-file say otherwise; --input-dir and --dataset send a data
set's payloads in turn. Send lag (how late each send was against its schedule) is
reported: a high p50 means the generator cannot keep up (add --processes); a high p99 with a
low p50 means a busy host delayed it at times (--realtime sends under SCHED_RR).
Exit codes: 0 done, 1 target unreachable or unusable, 2 bad arguments, 3 search found no rate.
"""

def parse_input(text: str) -> InputSpec:
    """``NAME:SHAPE[:DTYPE]`` with SHAPE like ``-1x4`` or ``1,3,224,224``."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise argparse.ArgumentTypeError(f"bad --input {text!r}: want NAME:SHAPE[:DTYPE]")
    try:
        shape = tuple(int(d) for d in parts[1].replace("x", ",").split(",") if d)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape in --input {text!r}") from None
    try:
        return InputSpec(
            name=parts[0], shape=shape, datatype=parts[2] if len(parts) == 3 else "FP32"
        )
    except ValidationError as e:
        raise argparse.ArgumentTypeError(f"bad --input {text!r}: {validation_message(e)}") from None


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "load",
        help="load-test a v2 endpoint: open/closed loop, SLO attainment, goodput",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("target")
    g.add_argument("--target",
                   help="http://HOST:PORT, https://HOST:PORT or grpc://HOST:PORT (required)")  # fmt: skip
    g.add_argument("--model", default="", help="model name to address")
    g.add_argument("--mix", help="weighted models instead of --model, e.g. resnet50:3,bert:1")

    g = p.add_argument_group("load shape")
    g.add_argument("--mode", choices=("open", "closed"), default="open",
                   help="open loop at --rate (default) or closed loop at --concurrency")  # fmt: skip
    g.add_argument("--rate", type=float, default=100.0, help="mean requests/s (default 100)")
    g.add_argument("--arrival", default="poisson",
                   choices=("constant", "poisson", "gamma", "trace", "timestamps"),
                   help="arrival process (default poisson)")  # fmt: skip
    g.add_argument("--cv", type=float, default=4.0,
                   help="gamma coefficient of variation (default 4, as headrace sim; 1 is Poisson)")  # fmt: skip
    g.add_argument("--concurrency", type=int, default=8, help="closed loop: requests in flight")
    g.add_argument("--duration", type=float, default=10.0, help="measured seconds (default 10)")
    g.add_argument("--requests", type=int, help="measure this many requests instead of --duration")
    g.add_argument("--warmup", type=float, default=1.0, help="unmeasured warm-up seconds (1)")
    g.add_argument("--seed", type=int, default=0, help="seed of arrivals and payloads")

    g = p.add_argument_group("traces")
    g.add_argument("--trace", type=Path,
                   help="per-minute CSV in the Azure Functions 2019 format (the bundled "
                        "loadgen/data/azure_sample.csv is synthetic, not the real trace)")
    g.add_argument("--trace-cv", type=float, default=1.0,
                   help="coefficient of variation within each trace minute (default 1: Poisson)")  # fmt: skip
    g.add_argument("--trace-models", default="", help="models the functions map to, comma list")
    g.add_argument("--time-scale", type=float, default=60.0,
                   help="trace minutes per second of replay (default 60: a minute per second)")  # fmt: skip
    g.add_argument("--rate-scale", type=float, default=1.0, help="multiply trace counts")
    g.add_argument("--trace-start-minute", type=int, default=0, help="first trace minute")
    g.add_argument("--trace-top", type=int, metavar="N",
                   help="replay only the N most invoked functions, dealt onto --trace-models by rank")
    g.add_argument("--trace-sample", type=int, metavar="N",
                   help="replay N functions drawn with --trace-seed, dealt onto --trace-models by rank")
    g.add_argument("--trace-seed", type=int, default=0, help="seed of --trace-sample's draw")
    g.add_argument("--timestamps", type=Path, help="file of send times in seconds, one a line")
    g.add_argument("--intervals-us", action="store_true",
                   help="--timestamps holds gaps in µs (perf_analyzer --request-intervals)")  # fmt: skip

    g = p.add_argument_group("requests")
    g.add_argument("--slo-ms", type=float, help="per-request SLO in ms (sent as timeout)")
    g.add_argument("--no-timeout-param", action="store_true",
                   help="measure against --slo-ms but do not send it as Triton's timeout")  # fmt: skip
    g.add_argument("--priority", type=int, help="Triton priority parameter (1 = highest)")
    g.add_argument("--input", action="append", type=parse_input, metavar="NAME:SHAPE[:DTYPE]",
                   help="input to synthesize, repeatable, e.g. INPUT0:-1x4:FP32")  # fmt: skip
    g.add_argument("--input-file", type=Path, help="JSON with real v2 inputs {'inputs': [...]}")
    g.add_argument("--input-dir", type=Path, metavar="DIR",
                   help="one request per .npy (the model's only input) or .npz (inputs by name) "
                        "file, sent in turn in file-name order")
    g.add_argument("--dataset", choices=("digits",),
                   help="send a data set's rows in turn; digits: the held-out split the digits "
                        "family is scored on (--batch rows per request)")  # fmt: skip
    g.add_argument("--batch", type=int, default=1, help="size sent for -1 dims (1)")
    g.add_argument("--protocol", choices=("binary", "json"), default="binary",
                   help="HTTP tensor encoding (default binary)")  # fmt: skip
    g.add_argument("--http-client", choices=("raw", "aiohttp"), default="raw",
                   help="raw keep-alive asyncio pool (fastest, default) or aiohttp")  # fmt: skip
    g.add_argument("--connections", type=int, default=64, help="HTTP connections per process")
    g.add_argument("--request-timeout", type=float, default=30.0, help="client gives up after")
    g.add_argument("--realtime", action="store_true",
                   help="send under SCHED_RR (root/CAP_SYS_NICE) so a busy host does not delay "
                        "sends by a scheduler tick; leaves other work 5%% of each second")  # fmt: skip
    g.add_argument("--processes", type=int, default=1,
                   help="worker processes sharing the schedule (when one falls behind)")  # fmt: skip

    g = p.add_argument_group("security (a gateway with TLS and API keys)")
    g.add_argument("--ssl", action="store_true",
                   help="speak TLS: HTTPS, or a secure gRPC channel (https:// targets imply it)")
    g.add_argument("--ca-file", type=Path, help="PEM CA the server's certificate must chain to "
                   "(default: the system's trust store)")
    g.add_argument("--client-cert", type=Path, help="PEM client certificate, for mutual TLS")
    g.add_argument("--client-key", type=Path, help="PEM key of --client-cert")
    g.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY' (HTTP header, gRPC "
                   "metadata); visible to other local users in the process list: prefer "
                   "--api-key-env")
    g.add_argument("--api-key-env", metavar="VAR", help="read the API key from this variable")
    g.add_argument("--model-key", action="append", default=[], metavar="MODEL=VAR",
                   help="a key per model or mix entry, read from variable VAR (repeatable)")  # fmt: skip

    g = p.add_argument_group("sweeps")
    g.add_argument("--rate-range", help="open-loop rates START:END[:STEP], one run each")
    g.add_argument("--find-max-rate", action="store_true",
                   help="search the highest rate holding --target-attainment")  # fmt: skip
    g.add_argument("--search-range", default="10:1000", help="LO:HI for --find-max-rate")
    g.add_argument("--target-attainment", type=float, default=0.99, help="e.g. 0.99")
    g.add_argument("--stability", type=float, default=10.0,
                   help="%% the last 3 windows may differ in throughput and p50 (10)")
    g.add_argument("--trials", type=int, default=3,
                   help="search: trials per rate; a rate passes when most of them do (3)")
    g.add_argument("--window-tolerance", type=float, default=5.0, metavar="POINTS",
                   help="search: percentage points a window may fall below the target (5)")  # fmt: skip

    g = p.add_argument_group("output")
    g.add_argument("--window", type=float, help="timeline / measurement window s (1; search 5)")
    g.add_argument("--json", type=Path, help="write the summary (or sweep) as JSON")
    g.add_argument("--csv", type=Path, help="write perf_analyzer-style CSV")
    g.add_argument("--plot", type=Path, metavar="PREFIX",
                   help="write PREFIX_cdf.png and PREFIX_timeline.png (sweeps: PREFIX_sweep.png)")  # fmt: skip
    g.add_argument("--lag-warn-ms", type=float, default=1.0, help="warn above this p99 send lag")
    g.add_argument("--quiet", action="store_true", help="no progress bar or table: one line")
    p.set_defaults(func=main)
    llm_command.register(p.add_subparsers(title="generative load", dest="load_kind", metavar="llm"))


def _env(var: str, option: str) -> str:
    value = os.environ.get(var)
    if not value:
        raise ValueError(f"{option} {var}: the variable is not set or empty")
    return value.strip()


def api_keys(a: argparse.Namespace) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """(--api-key or the value of --api-key-env, (model, key) from each --model-key)."""
    if a.api_key and a.api_key_env:
        raise ValueError("give --api-key or --api-key-env, not both")
    key = _env(a.api_key_env, "--api-key-env") if a.api_key_env else a.api_key
    pairs = []
    for item in a.model_key:
        model, sep, var = item.partition("=")
        if not sep or not model or not var:
            raise ValueError(f"--model-key {item!r}: want MODEL=VAR (VAR holds the key)")
        pairs.append((model, _env(var, f"--model-key {model}=")))
    return key, tuple(pairs)


def spec_from_args(a: argparse.Namespace) -> LoadSpec:
    api_key, model_keys = api_keys(a)
    fields: dict[str, Any] = dict(
        target=a.target, model=a.model, mix=a.mix, mode=a.mode, arrival=a.arrival, rate=a.rate,
        cv=a.cv, trace_cv=a.trace_cv, trace=a.trace,
        trace_models=tuple(m for m in a.trace_models.split(",") if m),
        time_scale=a.time_scale, rate_scale=a.rate_scale,
        trace_start_minute=a.trace_start_minute, timestamps=a.timestamps,
        trace_top=a.trace_top, trace_sample=a.trace_sample, trace_seed=a.trace_seed,
        intervals_us=a.intervals_us, duration_s=a.duration, requests=a.requests,
        warmup_s=a.warmup, slo_ms=a.slo_ms, send_timeout=not a.no_timeout_param,
        priority=a.priority, inputs=tuple(a.input) if a.input else None,
        input_file=a.input_file, input_dir=a.input_dir, dataset=a.dataset, batch=a.batch, protocol=a.protocol,
        http_client=a.http_client, concurrency=a.concurrency, connections=a.connections,
        processes=a.processes, seed=a.seed, request_timeout_s=a.request_timeout,
        lag_warn_ms=a.lag_warn_ms, realtime=a.realtime, tls=a.ssl, ca_file=a.ca_file,
        client_cert=a.client_cert, client_key=a.client_key, api_key=api_key,
        model_keys=model_keys,
    )  # fmt: skip
    if a.window is not None:
        fields["window_s"] = a.window
    return LoadSpec(**fields)


def _fail(msg: str, code: int) -> int:
    print(f"headrace load: error: {msg}", file=sys.stderr)
    return code


def main(a: argparse.Namespace) -> int:
    if not a.target:
        return _fail("the following arguments are required: --target", 2)
    try:
        spec = spec_from_args(a)
        if a.find_max_rate and a.rate_range:
            raise ValueError("give --rate-range or --find-max-rate, not both")
        if (a.find_max_rate or a.rate_range) and spec.mode != "open":
            raise ValueError("rate sweeps need --mode open")
        if a.find_max_rate and spec.slo_ms is None:
            raise ValueError("--find-max-rate needs --slo-ms: attainment is measured against it")
        if a.find_max_rate and a.trials < 1:
            raise ValueError(f"--trials = {a.trials}: need at least 1")
        return asyncio.run(_run(spec, a))
    except ValidationError as e:
        return _fail(validation_message(e), 2)
    except (TraceError, PayloadError) as e:
        return _fail(str(e), 2)
    except LoadError as e:
        return _fail(str(e), 1)
    except ValueError as e:
        return _fail(str(e), 2)


async def _run(spec: LoadSpec, a: argparse.Namespace) -> int:
    console = Console() if Console().is_terminal else Console(width=132)
    err = Console(stderr=True)
    if spec.arrival == "trace" and not a.quiet:
        for line in report.trace_mapping(spec.trace_replay().table()):
            err.print(line, markup=False, highlight=False)
    if a.find_max_rate:
        lo, hi = parse_range(a.search_range)[0], float(a.search_range.split(":")[1])
        res = await find_max_rate(
            spec, lo, hi, target=a.target_attainment, window_s=a.window or 5.0,
            tolerance=a.stability / 100.0, trials=a.trials,
            window_tolerance=a.window_tolerance / 100.0,
            on_trial=None if a.quiet else lambda s: err.print(
                f"rate {s['rate']:.1f}/s trial {s['trial']}: {report.compact(s)} "
                f"({'pass' if s['passed'] else 'fail: ' + s['reason']})",
                markup=False, highlight=False,
            ),
        )  # fmt: skip
        for v in res.rates:
            for t in v.trials:
                t["rate_verdict"] = f"{'pass' if v.passed else 'fail'} {v.row()['trials_passed']}/{len(v.trials)}"
        rows = sorted(res.trials, key=lambda s: (s["rate"], s["trial"]))
        if not a.quiet:
            console.print(report.sweep_table(rows, "headrace load: max-rate search"))
        search = {"search_range": a.search_range, "target_attainment": a.target_attainment,
                  "trials": a.trials, "window_tolerance_points": a.window_tolerance,
                  "stability_percent": a.stability, "window_s": a.window or 5.0}  # fmt: skip
        doc = {"best_rate": res.best_rate, "target_attainment": res.target,
               "rates": sorted((v.row() for v in res.rates), key=lambda r: r["rate"]),
               "trials": rows, "run": run_record(spec, {"search": search})}  # fmt: skip
        _write(rows, a, doc=doc, target=a.target_attainment)
        if res.best_rate is None:
            console.print(f"no rate in {a.search_range} holds {a.target_attainment:.2%} attainment")
            return 3
        console.print(
            f"highest rate holding {a.target_attainment:.2%} attainment in most of {a.trials} "
            f"trials: {res.best_rate:.1f}/s"
        )
        return 0
    if a.rate_range:
        results = await sweep_rates(
            spec, parse_range(a.rate_range),
            on_result=None if a.quiet else lambda r: err.print(
                f"rate {r.spec.rate:g}/s: {report.compact(r.summary)}", markup=False,
                highlight=False,
            ),
        )  # fmt: skip
        rows = [r.summary for r in results]
        if not a.quiet:
            console.print(report.sweep_table(rows, "headrace load: rate sweep"))
        _write(rows, a, doc={"rows": rows, "run": run_record(
            spec, {"rate_range": a.rate_range, "rates": parse_range(a.rate_range)})})
        return 0
    result = await _with_progress(spec, err, a.quiet)
    s = result.summary
    if a.quiet:
        console.print(report.compact(s), markup=False, highlight=False)
        for w in result.warnings:
            err.print(f"warning: {w}", markup=False, highlight=False)
    else:
        report.print_report(s, console)
    _write([s], a, result)
    return 0


async def _with_progress(spec: LoadSpec, err: Console, quiet: bool) -> LoadResult:
    """A progress bar with the live window on a terminal; elsewhere (a log) one line per
    window; nothing with --quiet."""
    if quiet:
        return await run_load(spec)
    if not err.is_terminal:
        shown: list[LiveWindow] = []

        def log(sent: int, done: int, total: int | None, live: LiveWindow | None) -> None:
            if live is not None and (not shown or live is not shown[-1]):
                shown.append(live)
                err.print(f"load {done}/{total or '?'} at {live.end_s:.0f} s: {live.line()}",
                          markup=False, highlight=False)  # fmt: skip

        return await run_load(spec, log)
    with Progress(
        TextColumn("[bold]load"), BarColumn(), MofNCompleteColumn(),
        TextColumn("sent {task.fields[sent]}"), TimeElapsedColumn(), TextColumn("{task.fields[live]}"),
        console=err, transient=True, auto_refresh=False,
    ) as bar:  # fmt: skip
        task = bar.add_task("load", total=None, sent=0, live="")

        def update(sent: int, done: int, total: int | None, live: LiveWindow | None) -> None:
            bar.update(task, completed=done, total=total, sent=sent,
                       live="" if live is None else live.line())  # fmt: skip
            bar.refresh()

        return await run_load(spec, update)


def _write(
    rows: list[dict[str, Any]],
    a: argparse.Namespace,
    result: LoadResult | None = None,
    doc: dict[str, Any] | None = None,
    target: float | None = None,
) -> None:
    """JSON (one run's summary, or a sweep's document), CSV (a row per run) and plots (one
    run's CDF and timeline, or a sweep's attainment and p99 by rate)."""
    if a.json:
        report.to_json(rows[0] if doc is None else doc, a.json)
    if a.csv:
        report.to_csv(rows, a.csv)
    if a.plot:
        a.plot.parent.mkdir(parents=True, exist_ok=True)
        if result is not None:
            report.plot(result.summary, result.recorder, a.plot)
        else:
            report.plot_sweep(rows, a.plot, target)
