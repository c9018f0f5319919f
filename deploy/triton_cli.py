"""``headrace triton up``: run one tritonserver on a model repository until interrupted."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from profiles.triton.server import TritonError, TritonServer


def _up(args: argparse.Namespace) -> int:
    server = TritonServer(
        Path(args.repo), http_port=args.http_port, grpc_port=args.grpc_port,
        metrics_port=args.metrics_port, binary=Path(args.tritonserver) if args.tritonserver else None,
        ready_timeout=args.timeout,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.start()
    except TritonError as e:
        print(f"error: {e}")
        return 1
    try:
        print(f"tritonserver ready: http {server.http_url}  grpc {server.grpc_url}  "
              f"metrics 127.0.0.1:{server.metrics_port}  pid {server.pid}  log {server.log_path}", flush=True)
        while not stop.wait(0.5):
            if server.proc is None or server.proc.poll() is not None:
                print(f"tritonserver exited; log {server.log_path}:\n{server.logs()}")
                return 1
        return 0
    finally:
        server.__exit__(None, None, None)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("triton", help="run a local tritonserver (CPU) on a model repository")
    tsub = p.add_subparsers(dest="triton_command", metavar="ACTION", required=True)
    up = tsub.add_parser("up", help="start tritonserver and keep it running until Ctrl-C / SIGTERM")
    up.add_argument("--repo", required=True, help="model repository directory (one folder per model)")
    up.add_argument("--http-port", type=int, default=0, help="HTTP port (default: a free port)")
    up.add_argument("--grpc-port", type=int, default=0, help="gRPC port (default: a free port)")
    up.add_argument("--metrics-port", type=int, default=0, help="metrics port (default: a free port)")
    up.add_argument("--tritonserver", help="path to the binary (default: the one in nvidia-pytriton)")
    up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    up.set_defaults(func=_up)
