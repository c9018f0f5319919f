"""``headrace serve --config FILE``: run the gateway until SIGTERM/SIGINT, then drain.

A start that cannot happen (a bad config field, scheduler key or port, an address that
cannot be bound, a certificate or key file that cannot be read or is not PEM, a tenant's key
variable that is unset, a control channel on a non-loopback address or without a token) is one
line on stderr naming the field, flag or address, and exit status 2.

``--control-listen HOST:PORT`` serves the control channel (:mod:`gateway.control`) an operator
in another process changes the gateway over; ``--ready-file`` tells it where everything listens."""

from __future__ import annotations

import argparse
import logging
import sys

from gateway import serving
from gateway.config import load_config, with_ports
from gateway.control import ControlListen, parse_listen, read_token
from gateway.errors import ConfigError, GatewayError


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
    p.add_argument("--control-listen", metavar="HOST:PORT", default=None,
                   help="serve the control channel (an operator in another process adds and drains "
                   "replicas, holds cold starts, stops the gateway) on this loopback address; port 0: a "
                   "free one (see --ready-file). Needs --control-token-file or HEADRACE_CONTROL_TOKEN")
    p.add_argument("--control-token-file", metavar="PATH", default=None,
                   help="file whose content (stripped) every control call must carry as "
                   "'Authorization: Bearer <token>'")
    p.add_argument("--ready-file", metavar="PATH", default=None,
                   help='once serving, write {"http", "grpc", "control", "pid"} there as JSON (atomically); '
                   "removed when the gateway stops")
    p.add_argument("--reuse-port", action="store_true",
                   help="bind the HTTP and gRPC ports with SO_REUSEPORT, shared with other gateway processes "
                   "on this host (the operator's gateway workers; each serves its own replicas)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.set_defaults(func=run)


def control_of(args: argparse.Namespace) -> ControlListen | None:
    """The control channel the flags ask for (None: none); :class:`ConfigError` for bad flags."""
    if args.control_listen is None:
        if args.control_token_file is not None:
            raise ConfigError("--control-token-file needs --control-listen")
        return None
    if args.workers != 1:
        raise ConfigError(f"--control-listen with --workers {args.workers}: not supported yet (use --workers 1)")
    host, port = parse_listen(args.control_listen)
    return ControlListen(host, port, read_token(args.control_token_file))


async def serve(args: argparse.Namespace) -> int:
    control = control_of(args)
    cfg = load_config(args.config)
    with_ports(cfg, http_port=args.http_port, where="--http-port")
    with_ports(cfg, grpc_port=args.grpc_port, where="--grpc-port")
    return await serving.serve_config(cfg, reuse_port=args.reuse_port, control=control, ready_file=args.ready_file)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.workers != 1:
            control_of(args)
            if args.ready_file is not None:
                raise ConfigError(f"--ready-file with --workers {args.workers}: not supported yet (use --workers 1)")
            from gateway.workers import supervise

            return supervise(args)
        return serving.run_on_serve_loop(serve(args))  # looked up at the call (tests trip it)
    except (ConfigError, GatewayError, OSError) as e:
        print(f"headrace serve: {e}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """``python -m gateway.cli serve ...``: ``headrace serve`` alone, without the rest of the
    CLI (the operator starts its gateway process so)."""
    p = argparse.ArgumentParser(prog="python -m gateway.cli")
    register(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
