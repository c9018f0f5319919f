"""``headrace sim``: the gateway's own policy core in virtual time, on the fleet a gateway config
or the operator's documents describe (or flags), under any arrivals ``headrace load`` sends.

    # one profiled replica, from flags
    headrace sim --profile resnet50@A100-80GB/1g.10gb --max-batch 32 --slo-ms 100 \\
        --rate 330 --arrival poisson --duration 60 --policy adaptive --seed 0

    # the fleet `headrace serve --config` serves, with its scheduler settings
    headrace sim -f gateway/example.yaml --rate 600 --arrival gamma --cv 4

    # the fleet `headrace up -f` would plan (slices, MPS shares), a replica down for 5 s
    headrace sim -f deploy/examples/quickstart --duration 30 \\
        --down local/gpu0/1g.10gb@0/resnet50=10:15 --set admission=burst

Prints the same report as ``headrace load`` (latencies from arrival, in virtual time);
``--json`` writes the same summary with a ``sim`` section and the run record.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import ValidationError

from gateway.errors import ConfigError
from gateway.policy import SchedulerConfig
from gateway.policy.batching import POLICIES
from loadgen import report
from loadgen.arrivals import TraceError
from loadgen.describe import validation_message
from loadgen.llm import sim_command as llm_sim
from loadgen.sim.fleet import FleetError, flag_fleet, load_fleet, with_settings
from loadgen.sim.run import SimOptions, run_sim
from loadgen.sim.simulator import Fault, Slow
from loadgen.spec import LoadSpec
from profiles.profile import Profile, ProfileError, ProfileSet
from profiles.schema import SpecError

SIM_TARGET = "http://simulator:1"  # the load spec's target: nothing is sent
DEFAULT_RATE = 330.0


def parse_profile(spec: str, files: list[str]) -> Profile:
    """``variant@gpu/slice`` from the reference profiles plus any ``--profile-file``."""
    try:
        variant, rest = spec.split("@", 1)
        gpu, slice_ = rest.split("/", 1)
    except ValueError:
        raise ProfileError(
            f"--profile {spec!r}: expected VARIANT@GPU/SLICE, e.g. resnet50@A100-80GB/1g.10gb"
        ) from None
    profiles = ProfileSet.reference()
    for f in files:
        for p in ProfileSet.load(f):
            profiles.add(p)
    return profiles.get(variant, gpu, slice_)


def _times(text: str, flag: str) -> tuple[float, float | None]:
    at, _, until = text.partition(":")
    try:
        t0, t1 = float(at), (float(until) if until else None)
    except ValueError:
        raise ValueError(f"{flag} {text!r}: times must be seconds, AT[:UNTIL]") from None
    if t0 < 0 or (t1 is not None and t1 <= t0):
        raise ValueError(f"{flag} {text!r}: want 0 <= AT < UNTIL")
    return t0, t1


def parse_down(text: str, horizon: float) -> Fault:
    """``ID=AT[:UNTIL]``: the replica dies at AT (its batches fail and are retried elsewhere)
    and is back at UNTIL (default: never within the run)."""
    rid, eq, when = text.rpartition("=")
    if not eq or not rid:
        raise ValueError(f"--down {text!r}: want REPLICA=AT[:UNTIL]")
    at, until = _times(when, "--down")
    return Fault(rid, at, (until if until is not None else horizon + 3600.0) - at)


def parse_slow(text: str) -> Slow:
    """``ID=FACTOR@AT[:UNTIL]``: from AT (until UNTIL) the replica's batches take FACTOR times
    their profile."""
    rid, eq, rest = text.rpartition("=")
    factor, at_, when = rest.partition("@")
    try:
        k = float(factor)
    except ValueError:
        k = -1.0
    if not eq or not rid or not at_ or not k > 0:
        raise ValueError(f"--slow {text!r}: want REPLICA=FACTOR@AT[:UNTIL], FACTOR > 0")
    at, until = _times(when, "--slow")
    return Slow(rid, at, k, until)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` (values read as YAML: 0.05, true, burst)."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--set {item!r}: want KEY=VALUE, a SchedulerConfig field "
                             f"({', '.join(SchedulerConfig.model_fields)})")
        out[key.strip()] = yaml.safe_load(value)
    return out


def scheduler_overrides(a: argparse.Namespace) -> dict[str, Any]:
    """The scheduler flags given (each overrides the file's setting), then ``--set``."""
    out: dict[str, Any] = {}
    for flag in ("policy", "admission", "quantile"):
        if getattr(a, flag) is not None:
            out[flag] = getattr(a, flag)
    if a.wait:
        out["wait"] = True
    if a.max_queue_delay_ms is not None:
        out["max_queue_delay_s"] = a.max_queue_delay_ms / 1e3
    if a.queue_timeout_ms is not None:
        out["queue_timeout_s"] = a.queue_timeout_ms / 1e3
    return {**out, **parse_sets(a.set)}


def build_fleet(a: argparse.Namespace):
    overrides = scheduler_overrides(a)
    if a.file:
        return load_fleet(a.file, overrides, a.method)
    profile = parse_profile(a.profile, a.profile_file or [])
    if a.max_batch is not None:
        if a.max_batch > profile.max_batch:
            raise ProfileError(f"--max-batch ({a.max_batch}) exceeds profile max "
                               f"({profile.max_batch}) for {profile.name}")
        profile = profile.with_max_batch(a.max_batch)
    if a.replicas < 1:
        raise ValueError(f"--replicas ({a.replicas}) must be >= 1")
    slo = (a.slo_ms if a.slo_ms is not None else 100.0) / 1e3
    return flag_fleet(profile, a.replicas, slo, with_settings({}, overrides, "command line"),
                      max_inflight=a.max_inflight, margin=a.deadline_margin)


def spec_of(a: argparse.Namespace, fleet) -> LoadSpec:
    """The load test the arrivals come from: ``headrace load``'s own spec. Without --model,
    --mix or --trace-models the fleet's models are addressed, in proportion to their planned
    rates (operator documents) or alike; without --rate, at the plan's total rate."""
    model, mix = a.model, a.mix
    trace_models = tuple(m for m in a.trace_models.split(",") if m)
    if not (model or mix or trace_models):
        names = list(fleet.models)
        rates = (fleet.plan or {}).get("rates", {})
        if len(names) == 1:
            model = names[0]
        else:
            mix = ",".join(f"{m}:{rates.get(m, 1.0):g}" for m in names)
            if a.arrival == "trace":
                trace_models = tuple(names)
    rate = a.rate
    if rate is None:
        planned = sum((fleet.plan or {}).get("rates", {}).values())
        rate = planned if planned > 0 else DEFAULT_RATE
    fields: dict[str, Any] = dict(
        target=SIM_TARGET, model=model, mix=mix, arrival=a.arrival, rate=rate, cv=a.cv,
        trace_cv=a.trace_cv, trace=a.trace, trace_models=trace_models, time_scale=a.time_scale,
        rate_scale=a.rate_scale, trace_start_minute=a.trace_start_minute, timestamps=a.timestamps,
        trace_top=a.trace_top, trace_sample=a.trace_sample, trace_seed=a.trace_seed,
        intervals_us=a.intervals_us, duration_s=a.duration, requests=a.requests, warmup_s=a.warmup,
        slo_ms=a.slo_ms if a.file else None, priority=a.priority, seed=a.seed,
    )
    if a.window is not None:
        fields["window_s"] = a.window
    return LoadSpec(**fields)


def run(a: argparse.Namespace) -> int:
    try:
        fleet = build_fleet(a)
        spec = spec_of(a, fleet)
        horizon = spec.warmup_s + spec.duration_s
        faults = tuple(parse_down(x, horizon) for x in a.down) + tuple(parse_slow(x) for x in a.slow)
        known = {r.info.id for r in fleet.replicas}
        for f in faults:
            if f.replica not in known:
                raise ValueError(f"fault names unknown replica {f.replica!r}; known: {', '.join(sorted(known))}")
        opts = SimOptions(a.service, faults, a.overhead_ms / 1e3, a.jitter_ms / 1e3, a.transit_ms / 1e3,
                          a.processes)
        if spec.arrival == "trace" and not a.quiet:
            print("\n".join(report.trace_mapping(spec.trace_replay().table())), file=sys.stderr)
        summary, rec = run_sim(fleet, spec, opts)
    except ValidationError as e:
        return _fail(validation_message(e))
    except (ConfigError, FleetError, SpecError, ProfileError, TraceError, ValueError, OSError) as e:
        return _fail(str(e))
    if a.quiet:
        print(report.compact(summary))
    else:
        report.print_report(summary)
    if a.json:
        report.to_json(summary, Path(a.json))
    if a.csv:
        report.to_csv([summary], Path(a.csv))
    if a.plot:
        Path(a.plot).parent.mkdir(parents=True, exist_ok=True)
        report.plot(summary, rec, Path(a.plot))
    return 0


def _fail(msg: str) -> int:
    print(f"headrace sim: {' '.join(msg.split())}", file=sys.stderr)
    return 2


def _choices(field: str) -> tuple[str, ...]:
    """The values SchedulerConfig accepts for a Literal field: the CLI offers exactly those."""
    return get_args(SchedulerConfig.model_fields[field].annotation)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sim", help="simulate the gateway's batching policy in virtual time",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("fleet (a file, or flags for identical replicas)")
    g.add_argument("-f", "--file", action="append",
                   help="gateway config (headrace serve --config) or operator documents / folder "
                        "(headrace up -f), repeatable")
    g.add_argument("--method", default="greedy", help="operator documents: the planner's method")
    g.add_argument("--profile", default="resnet50@A100-80GB/1g.10gb", help="VARIANT@GPU/SLICE")
    g.add_argument("--profile-file", action="append", help="extra profile YAML (repeatable)")
    g.add_argument("--max-batch", type=int, default=32, help="replica max batch (<= the profile's)")
    g.add_argument("--replicas", type=int, default=1, help="identical replicas, each on its own slice")
    g.add_argument("--max-inflight", type=int, default=1,
                   help="batches a flag replica holds at once (the simulator has no network to hide)")
    g.add_argument("--deadline-margin", type=float, default=0.0,
                   help="flag model: share of the SLO kept outside the plan (no network here: 0)")

    g = p.add_argument_group("scheduler (overrides the file's scheduler: settings)")
    g.add_argument("--policy", help=f"one of: {', '.join(sorted(POLICIES))}")
    g.add_argument("--wait", action="store_true",
                   help="let a free replica wait for a larger batch when rate and slack allow")
    g.add_argument("--admission", choices=_choices("admission"),
                   help="plan, protect, burst or alone (headrace explain Scheduler)")
    g.add_argument("--quantile", choices=_choices("quantile"), help="latency the policy predicts with")
    g.add_argument("--max-queue-delay-ms", type=float, help="take-all only")
    g.add_argument("--queue-timeout-ms", type=float, help="take-all only")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any SchedulerConfig setting, e.g. --set burst_factor=2 (repeatable)")

    g = p.add_argument_group("replicas in virtual time")
    g.add_argument("--service", choices=("p50", "p99"), default="p50", help="latency the replicas take")
    g.add_argument("--overhead-ms", type=float, default=0.0, help="every batch's time beyond its profile")
    g.add_argument("--jitter-ms", type=float, default=0.0, help="mean exponential extra per batch")
    g.add_argument("--transit-ms", type=float, default=0.0, help="gateway <-> replica, each way")
    g.add_argument("--down", action="append", default=[], metavar="REPLICA=AT[:UNTIL]",
                   help="the replica dies at AT s and is back at UNTIL (repeatable)")
    g.add_argument("--slow", action="append", default=[], metavar="REPLICA=FACTOR@AT[:UNTIL]",
                   help="from AT s the replica's batches take FACTOR times as long (repeatable)")
    g.add_argument("--processes", type=int, default=1,
                   help="simulate models that share no replica in this many processes")

    g = p.add_argument_group("arrivals (as headrace load)")
    g.add_argument("--model", default="", help="model to address (default: the fleet's)")
    g.add_argument("--mix", help="weighted models, e.g. resnet50:3,digits:1")
    g.add_argument("--rate", type=float, help=f"offered requests/s (default: the plan's, else {DEFAULT_RATE:g})")
    g.add_argument("--arrival", default="poisson",
                   choices=("constant", "poisson", "gamma", "trace", "timestamps"))
    g.add_argument("--cv", type=float, default=LoadSpec.model_fields["cv"].default,
                   help="gamma coefficient of variation (default 4, as headrace load)")
    g.add_argument("--trace", type=Path, help="per-minute CSV in the Azure Functions 2019 format")
    g.add_argument("--trace-cv", type=float, default=1.0, help="CV within each trace minute")
    g.add_argument("--trace-models", default="", help="models the trace's functions map to")
    g.add_argument("--time-scale", type=float, default=60.0, help="trace minutes per second")
    g.add_argument("--rate-scale", type=float, default=1.0, help="multiply trace counts")
    g.add_argument("--trace-start-minute", type=int, default=0)
    g.add_argument("--trace-top", type=int, metavar="N",
                   help="replay only the N most invoked functions, dealt onto --trace-models by rank")
    g.add_argument("--trace-sample", type=int, metavar="N",
                   help="replay N functions drawn with --trace-seed, dealt onto --trace-models by rank")
    g.add_argument("--trace-seed", type=int, default=0, help="seed of --trace-sample's draw")
    g.add_argument("--timestamps", type=Path, help="file of arrival times (s), one a line")
    g.add_argument("--intervals-us", action="store_true", help="--timestamps holds gaps in µs")
    g.add_argument("--duration", type=float, default=60.0, help="measured seconds of arrivals")
    g.add_argument("--requests", type=int, help="measure this many requests instead")
    g.add_argument("--warmup", type=float, default=LoadSpec.model_fields["warmup_s"].default,
                   help="simulated, unmeasured seconds first")
    g.add_argument("--slo-ms", type=float,
                   help="per-request SLO (flags: the model's, default 100; files: overrides theirs)")
    g.add_argument("--priority", type=int, help="Triton priority (2+: best-effort)")
    g.add_argument("--seed", type=int, default=0)

    g = p.add_argument_group("output (as headrace load)")
    g.add_argument("--window", type=float, help="timeline window s (1)")
    g.add_argument("--json", help="write the summary here")
    g.add_argument("--csv", help="write perf_analyzer-style CSV")
    g.add_argument("--plot", help="write PREFIX_cdf.png and PREFIX_timeline.png")
    g.add_argument("--quiet", action="store_true", help="one line")
    p.set_defaults(func=run)
    llm_sim.register(p.add_subparsers(title="generative models", dest="sim_kind", metavar="llm"))
