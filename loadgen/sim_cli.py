"""``headrace sim``: one virtual-time run of the gateway's policy core against profiled replicas.

    headrace sim --profile resnet50@A100-80GB/1g.10gb --max-batch 32 --slo-ms 100 \\
        --rate 330 --arrival poisson --duration 60 --policy adaptive --seed 0

Prints the same report as ``headrace load``; ``--json`` writes the summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import get_args

import numpy as np
from pydantic import ValidationError

from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.batching import POLICIES
from gateway.policy.types import ReplicaInfo
from loadgen.arrivals import make_process, times
from loadgen.sim import SimReplica, Simulator, make_requests, to_recorder
from profiles.profile import Profile, ProfileError, ProfileSet


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


def run(args: argparse.Namespace) -> int:
    try:
        profile = parse_profile(args.profile, args.profile_file or [])
        if args.max_batch is not None:
            if args.max_batch > profile.max_batch:
                raise ProfileError(
                    f"--max-batch ({args.max_batch}) exceeds profile max "
                    f"({profile.max_batch}) for {profile.name}"
                )
            profile = profile.with_max_batch(args.max_batch)
        config = SchedulerConfig(
            policy=args.policy,
            wait=args.wait,
            admission=args.admission,
            quantile=args.quantile,
            max_queue_delay_s=args.max_queue_delay_ms / 1e3,
            queue_timeout_s=None if args.queue_timeout_ms is None else args.queue_timeout_ms / 1e3,
        )
        process = make_process(args.arrival, args.rate, args.cv)
    except (ProfileError, ValueError, ValidationError) as e:
        print(f"headrace sim: {e}", file=sys.stderr)
        return 2
    if args.duration <= 0 or args.slo_ms <= 0 or args.replicas < 1:
        print("headrace sim: --duration, --slo-ms and --replicas must be > 0", file=sys.stderr)
        return 2
    ts = times(process, args.duration, np.random.default_rng(args.seed))
    model = profile.model
    reps = [
        SimReplica(ReplicaInfo(f"r{i}", model, profile.variant, profile, profile.max_batch))
        for i in range(args.replicas)
    ]
    result = Simulator(EdfScheduler(config), reps, service=args.service).run(
        make_requests(ts, model, args.slo_ms / 1e3)
    )
    rec = to_recorder(result.records)
    summary = rec.summary(args.duration, args.slo_ms / 1e3)
    summary.update(
        {
            "mode": "open",
            "target": f"sim {args.policy} x{args.replicas} {profile.name}",
            "arrival": args.arrival + (f" cv={args.cv:g}" if args.arrival == "gamma" else ""),
            "rate": args.rate,
            "duration_s": args.duration,
            "seed": args.seed,
            "sim": result.summary(),
        }
    )
    try:
        from loadgen.report import print_report

        print_report(summary)
    except ImportError:  # the report module is optional for the simulator
        print(json.dumps(result.summary(), indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, default=str))
    return 0


def _choices(field: str) -> tuple[str, ...]:
    """The values SchedulerConfig accepts for a Literal field: the CLI offers exactly those."""
    return get_args(SchedulerConfig.model_fields[field].annotation)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sim",
        help="simulate the gateway's batching policy in virtual time",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--profile", default="resnet50@A100-80GB/1g.10gb", help="VARIANT@GPU/SLICE")
    p.add_argument("--profile-file", action="append", help="extra profile YAML (repeatable)")
    p.add_argument("--max-batch", type=int, default=32, help="replica max batch (<= the profile's)")
    p.add_argument(
        "--replicas", type=int, default=1, help="identical replicas, each on its own slice"
    )
    p.add_argument("--slo-ms", type=float, default=100.0)
    p.add_argument("--rate", type=float, default=330.0, help="offered requests per second")
    p.add_argument("--arrival", choices=("constant", "poisson", "gamma"), default="poisson")
    p.add_argument(
        "--cv", type=float, default=4.0, help="coefficient of variation for --arrival gamma"
    )
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    p.add_argument("--policy", default="adaptive", help=f"one of: {', '.join(sorted(POLICIES))}")
    p.add_argument(
        "--wait",
        action="store_true",
        help="let a free replica wait for a larger batch when rate and slack allow",
    )
    p.add_argument(
        "--admission",
        choices=_choices("admission"),
        default=SchedulerConfig.model_fields["admission"].default,
        help="plan: count the queue ahead at submit; protect: also refuse requests that would "
        "push admitted ones late; burst: protect only while arrivals run well above capacity; "
        "alone: only the request itself",
    )
    p.add_argument(
        "--quantile",
        choices=_choices("quantile"),
        default=SchedulerConfig.model_fields["quantile"].default,
        help="latency the policy predicts with",
    )
    p.add_argument(
        "--service", choices=("p50", "p99"), default="p50", help="latency the replicas take"
    )
    p.add_argument("--max-queue-delay-ms", type=float, default=0.0, help="take-all only")
    p.add_argument("--queue-timeout-ms", type=float, default=None, help="take-all only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the summary here")
    p.set_defaults(func=run)
