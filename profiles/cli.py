"""``headrace profile``: measure a live Triton model and write its profile YAML."""

from __future__ import annotations

import argparse
import sys

from profiles.profile import ProfileError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile",
        help="measure a live Triton model across batch sizes and write a profile YAML",
        description="Measure a model served by Triton (HTTP or gRPC) across batch sizes and "
        "concurrency levels; write p50/p99 batch latency as a headrace profile YAML.",
    )
    p.add_argument("--url", required=True, help="Triton endpoint, e.g. http://127.0.0.1:8000 (gRPC: 127.0.0.1:8001)")
    p.add_argument("--model", required=True, help="model name on the server")
    p.add_argument("--model-version", default="", help="model version (default: the server's)")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,2,4,..,max_batch_size)")
    p.add_argument("--concurrency", default="1", help="comma-separated concurrency levels (default 1)")
    p.add_argument("--samples", type=int, default=50, help="timed requests per batch size (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed requests per batch size (default 5)")
    p.add_argument("--measure", choices=("client", "compute"), default="client",
                   help="client-seen latency (default) or model execution time with serving overhead removed")
    p.add_argument("--gpu", default="cpu", help="GPU model label of the profile (default cpu)")
    p.add_argument("--slice", default="cpu", help="slice label: MIG profile, 'gpu', or 'cpu' (default cpu)")
    p.add_argument("--variant", default=None, help="variant name (default: the model name)")
    p.add_argument("--family", default=None, help="model family (default: variant up to its first '-')")
    p.add_argument("--accuracy", type=float, default=None, help="known accuracy in [0, 1] to record")
    p.add_argument("--memory-mb", type=float, default=0.0, help="memory the variant needs, MB")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, seconds")
    p.add_argument("--out", required=True, help="profile YAML to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from profiles.profiler import ProfilerError, parse_int_list, profile_model

    try:
        settings = {
            "url": args.url, "model": args.model, "model_version": args.model_version,
            "protocol": args.protocol, "samples": args.samples, "warmup": args.warmup,
            "measure": args.measure, "gpu": args.gpu, "slice": args.slice, "variant": args.variant,
            "family": args.family, "accuracy": args.accuracy, "memory_mb": args.memory_mb,
            "timeout_s": args.timeout,
            "concurrency": parse_int_list(args.concurrency, "--concurrency"),
        }
        if args.batches:
            settings["batches"] = parse_int_list(args.batches, "--batches")
        result = profile_model(out=args.out, log=lambda line: print(line, file=sys.stderr), **settings)
    except (ProfilerError, ProfileError, OSError) as e:
        print(f"headrace profile: error: {e}", file=sys.stderr)
        return 2
    print(result.table())
    print(f"wrote {args.out} ({result.profile.name})")
    return 0
