"""``headrace serve --config FILE``: run the gateway until SIGTERM/SIGINT, then drain.

A start that cannot happen (a bad config field, scheduler key or port, an address that
cannot be bound, a certificate or key file that cannot be read or is not PEM, a tenant's key
variable that is unset) is one line on stderr naming the field or address, and exit status 2."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from gateway.config import ConfigError, GatewayConfig, load_config, with_ports
from gateway.errors import GatewayError


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


async def serve_config(cfg: GatewayConfig, reuse_port: bool = False, name: str = "gateway") -> int:
    """Serve ``cfg`` until SIGTERM/SIGINT, then drain; ``reuse_port``: share the HTTP and gRPC
    ports with the other workers of ``headrace serve --workers``."""
    from gateway.app import Gateway

    gw = Gateway(cfg, reuse_port=reuse_port)  # resolves the profiles: their errors come before any port is opened
    await gw.start()
    # startup objects (profiles, protobuf descriptors, pydantic models) live as long as the
    # process: keep them out of the collector's full passes, which then walk only live traffic
    gc.collect()
    gc.freeze()
    tls = " (TLS)" if gw.security.tls is not None else ""
    metrics = f"  metrics {gw.metrics_url}" if gw.metrics_url else ""
    print(f"headrace {name}: http {gw.http_url}  grpc {gw.grpc_url}{tls}{metrics}  models "
          f"{', '.join(m.name for m in cfg.models)}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print(f"headrace {name}: draining (up to {cfg.drain_timeout_s:g}s)", flush=True)
    await gw.stop(drain_timeout=cfg.drain_timeout_s)
    print(f"headrace {name}: stopped", flush=True)
    return 0


T = TypeVar("T")


def _loop_factory():  # noqa: ANN202
    """uvloop when installed (a faster loop for the front door and the replica clients), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_on_serve_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on the event loop ``headrace serve`` runs on (benchmarks' floor servers
    use it too, so they measure the same loop)."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(main)


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
