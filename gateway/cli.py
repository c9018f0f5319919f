"""``headrace serve --config FILE``: run the gateway until SIGTERM/SIGINT, then drain.

A start that cannot happen (a bad config field, scheduler key or port, an address that
cannot be bound, a certificate or key file that cannot be read or is not PEM, a tenant's key
variable that is unset) is one line on stderr naming the field or address, and exit status 2."""

from __future__ import annotations

import argparse
import logging
import sys

from gateway.config import load_config, with_ports
from gateway.errors import ConfigError, GatewayError
from gateway.serving import run_on_serve_loop, serve_config


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the SLO-aware gateway (KServe v2 HTTP + gRPC) in front of Triton replicas",
        description="Run the gateway. SIGTERM stops accepting requests, drains in-flight ones "
        "(up to drain_timeout_s) and exits.",
    )
    p.add_argument("--config", required=True, help="gateway YAML (models -> Triton replicas, SLO, profile)")
    p.add_argument("--http-port", type=int, default=None, help="override listen.http_port")
    p.add_argument("--grpc-port", type=int, default=None, help="override listen.grpc_port")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="run N gateway processes sharing the HTTP and gRPC ports (SO_REUSEPORT), each "
                   "batching for its own share of every model's replicas, restarted if one dies; each "
                   "serves /metrics on its own port (metrics_listen.port + its index; docs/scaleout.md)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(func=run)


async def serve(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    with_ports(cfg, http_port=args.http_port, where="--http-port")
    with_ports(cfg, grpc_port=args.grpc_port, where="--grpc-port")
    return await serve_config(cfg)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.workers != 1:
            from gateway.workers import supervise

            return supervise(args)
        return run_on_serve_loop(serve(args))
    except (ConfigError, GatewayError, OSError) as e:
        print(f"headrace serve: {e}", file=sys.stderr)
        return 2
