"""``headrace serve --workers N``: N gateway processes on one host behind the same ports.

Every worker listens on the configured HTTP and gRPC ports with SO_REUSEPORT, so the kernel
spreads client connections over them; each holds its own share of every model's replicas
(:func:`gateway.partition.partition`), so no replica gets batches from two workers that do not
see each other's. On one host every worker must answer every model (the kernel picks the
worker per connection, not per model), so each model needs at least N replicas; the parent
refuses fewer in one line (docs/scaleout.md says why requests are not forwarded between workers).

Each worker serves ``/metrics`` and the health probes on a port of its own: the config's
``metrics_listen.port`` plus its index (port 0: free ports picked once at start and kept over
restarts). The parent supervises: a worker that dies is started again on the same ports
(after 0.5 s, doubling up to 30 s while it keeps dying young); SIGTERM or SIGINT to the parent
drains and stops every worker by its process group.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.app import check_bindable
from gateway.config import (
    load_config,
    parse_config,
    resolve,
    with_ports,
)
from gateway.errors import ConfigError
from gateway.frontdoor.security import with_key_digests
from gateway.partition import Partition, partition
from profiles.gateway_config import GatewayConfig
from profiles.schema import ListenAddress
from profiles.triton.process import stop_group

log = logging.getLogger("headrace.workers")
RESTART_FIRST_S = 0.5
RESTART_MAX_S = 30.0
HEALTHY_AFTER_S = 30.0  # a worker that lived this long starts its restart delays over


def local_partition(cfg: GatewayConfig, n: int) -> Partition:
    """``cfg`` split over ``n`` workers on one host; :class:`ConfigError` when a model has
    fewer than ``n`` replicas (some worker could not answer it), but none (each refuses it)."""
    short = {m.name: len(m.replicas) for m in cfg.models if 0 < len(m.replicas) < n}
    if short:
        named = ", ".join(f"{k} ({v})" for k, v in short.items())
        raise ConfigError(
            f"--workers {n}: every worker answers every model, so each model needs at least {n} replicas; "
            f"fewer: {named} (use --workers {min(short.values())} or more replicas; docs/scaleout.md)")
    return partition(cfg, n)


def restart_delay(failures: int) -> float:
    """Seconds before a worker that died ``failures`` times in a row is started again."""
    return min(RESTART_MAX_S, RESTART_FIRST_S * 2 ** max(0, failures - 1))


def free_reusable_port(host: str) -> int:
    """A free TCP port on ``host`` that listeners with SO_REUSEPORT can share."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Layout:
    """Where the workers listen: the shared ports and each worker's metrics address."""

    host: str
    http_port: int
    grpc_port: int
    metrics: tuple[tuple[str, int], ...]  # per worker: (host, port)

    @property
    def n(self) -> int:
        return len(self.metrics)


def layout(cfg: GatewayConfig, n: int, pick: Callable[[str], int] = free_reusable_port) -> Layout:
    """Ports 0 replaced by free ones, once; :class:`ConfigError` when the metrics ports run past 65535."""
    host, listen = cfg.listen.host, cfg.listen
    http = listen.http_port or pick(host)
    grpc = listen.grpc_port or pick(host)
    m = cfg.metrics_listen or ListenAddress(host=host, port=0)
    if m.port and m.port + n - 1 > 65535:
        raise ConfigError(f"metrics_listen.port ({m.port}) + {n} workers runs past port 65535")
    metrics = tuple((m.host, m.port + i if m.port else pick(m.host)) for i in range(n))
    return Layout(host, http, grpc, metrics)


# --------------------------------------------------------------------------- the parent


@dataclass
class Worker:
    index: int
    proc: subprocess.Popen | None = None
    started: float = 0.0
    failures: int = 0  # deaths in a row, each within HEALTHY_AFTER_S of its start
    due: float | None = None  # when it is started again after dying


def _die_with_parent() -> None:
    """In the worker, before exec: SIGTERM when the parent goes (even by SIGKILL)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Supervisor:
    """The parent of ``--workers N``: starts the workers, restarts the ones that die, stops
    them all by process group. ``doc``: the config as read once, its API keys as digests
    (:func:`~gateway.frontdoor.security.with_key_digests`), so every worker (and every restart)
    splits the same fleet the same way and admits the same keys."""

    def __init__(self, doc_path: Path, base_dir: Path, lay: Layout, log_level: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.doc_path, self.base_dir, self.layout, self.log_level = doc_path, base_dir, lay, log_level
        self.clock = clock
        self.workers = [Worker(i) for i in range(lay.n)]
        self.restarts = 0

    def command(self, i: int) -> list[str]:
        lay = self.layout
        mhost, mport = lay.metrics[i]
        return [sys.executable, "-m", "gateway.workers", "--doc", str(self.doc_path), "--base-dir",
                str(self.base_dir), "--index", str(i), "--workers", str(lay.n), "--http-port", str(lay.http_port),
                "--grpc-port", str(lay.grpc_port), "--metrics-host", mhost, "--metrics-port", str(mport),
                "--log-level", self.log_level]

    def spawn(self, w: Worker) -> None:
        w.proc = subprocess.Popen(self.command(w.index), start_new_session=True, preexec_fn=_die_with_parent)
        w.started, w.due = self.clock(), None
        print(f"headrace gateway: worker {w.index} pid {w.proc.pid} metrics "
              f"{self.layout.metrics[w.index][0]}:{self.layout.metrics[w.index][1]}", flush=True)

    def reap(self, w: Worker) -> None:
        """Stop whatever a dead worker left in its process group."""
        if w.proc is not None:
            stop_group(w.proc, grace=0.5)

    def start(self, timeout: float) -> None:
        """Start every worker and wait until each listens; :class:`RuntimeError` naming the
        first that exits or does not listen in time (the others are stopped)."""
        for w in self.workers:
            self.spawn(w)
        deadline = self.clock() + timeout
        for w in self.workers:
            host, port = self.layout.metrics[w.index]
            while not _live(host, port):
                assert w.proc is not None
                if w.proc.poll() is not None:
                    raise RuntimeError(f"worker {w.index} exited with code {w.proc.returncode} while starting")
                if self.clock() > deadline:
                    raise RuntimeError(f"worker {w.index} not listening after {timeout:g}s")
                time.sleep(0.05)

    def poll(self) -> None:
        """Note the workers that died and start again those whose delay is over."""
        now = self.clock()
        for w in self.workers:
            if w.proc is not None and w.due is None and w.proc.poll() is not None:
                w.failures = 1 if now - w.started >= HEALTHY_AFTER_S else w.failures + 1
                w.due = now + restart_delay(w.failures)
                log.warning("worker %d (pid %d) exited with code %s; starting it again in %.1fs",
                            w.index, w.proc.pid, w.proc.returncode, w.due - now)
                self.reap(w)
            if w.due is not None and now >= w.due:
                self.restarts += 1
                self.spawn(w)

    def stop(self, grace: float) -> None:
        """SIGTERM to every worker's group at once, up to ``grace`` seconds to drain, then SIGKILL."""
        procs = [w.proc for w in self.workers if w.proc is not None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        end = self.clock() + grace
        for p in procs:
            stop_group(p, grace=max(0.1, end - self.clock()))


def _live(host: str, port: int) -> bool:
    """``GET /v2/health/live`` on a worker's metrics listener answered 200 (it listens)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/v2/health/live", timeout=1.0) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def supervise(args: argparse.Namespace) -> int:
    """``headrace serve --workers N``: until SIGTERM/SIGINT; a start that cannot happen is one
    line on stderr and exit status 2."""
    n = args.workers
    if n < 1:
        raise ConfigError(f"--workers ({n}) must be at least 1")
    path = Path(args.config)
    cfg = load_config(path)
    with_ports(cfg, http_port=args.http_port, where="--http-port")
    with_ports(cfg, grpc_port=args.grpc_port, where="--grpc-port")
    local_partition(cfg, n)
    resolve(cfg)  # a bad profile is one line here, not N
    # keys read once, here: every worker, and every restart, gets their digests
    served = with_key_digests(yaml.safe_load(path.read_text()), cfg, cfg.base_dir or path.parent)
    lay = layout(cfg, n)
    check_bindable("HTTP", lay.host, lay.http_port, reuse_port=True)
    check_bindable("gRPC", lay.host, lay.grpc_port, reuse_port=True)
    for host, port in lay.metrics:
        check_bindable("metrics", host, port)
    stopping: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        stopping.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    with tempfile.TemporaryDirectory(prefix="headrace-workers-") as tmp:
        doc = Path(tmp) / "gateway.yaml"
        doc.write_text(yaml.safe_dump(served, sort_keys=False))
        sup = Supervisor(doc, cfg.base_dir or path.parent, lay, args.log_level)
        try:
            sup.start(cfg.startup_timeout_s + 30.0)
            print(f"headrace gateway: {n} workers  http {lay.host}:{lay.http_port}  grpc {lay.host}:{lay.grpc_port}  "
                  f"metrics {' '.join(f'{h}:{p}' for h, p in lay.metrics)}", flush=True)
            while not stopping:
                sup.poll()
                time.sleep(0.1)
            print(f"headrace gateway: stopping {n} workers", flush=True)
        except RuntimeError as e:
            print(f"headrace serve: {e}", file=sys.stderr)
            return 2
        finally:
            sup.stop(cfg.drain_timeout_s + 5.0)
            for s, h in old.items():
                signal.signal(s, h)
    return 0


# --------------------------------------------------------------------------- a worker


def worker_config(doc: Any, base_dir: Path, index: int, n: int, http_port: int, grpc_port: int,
                  metrics: tuple[str, int]) -> GatewayConfig:
    """Worker ``index``'s config: its partition of the fleet on the shared ports, with its
    own metrics listener."""
    cfg = parse_config(doc, "gateway config", base_dir)
    with_ports(cfg, http_port, grpc_port)
    mine = local_partition(cfg, n).configs[index]
    mine.metrics_listen = ListenAddress(host=metrics[0], port=metrics[1])
    return mine


def worker_main(argv: list[str] | None = None) -> int:
    from gateway.errors import GatewayError
    from gateway.serving import run_on_serve_loop, serve_config

    ap = argparse.ArgumentParser(prog="python -m gateway.workers", description="one worker of headrace serve --workers")
    for flag in ("--doc", "--base-dir", "--metrics-host", "--log-level"):
        ap.add_argument(flag, required=True)
    for flag in ("--index", "--workers", "--http-port", "--grpc-port", "--metrics-port"):
        ap.add_argument(flag, type=int, required=True)
    a = ap.parse_args(argv)
    logging.basicConfig(level=a.log_level, format=f"%(asctime)s %(levelname)s worker {a.index} %(name)s: %(message)s")
    try:
        cfg = worker_config(yaml.safe_load(Path(a.doc).read_text()), Path(a.base_dir), a.index, a.workers,
                            a.http_port, a.grpc_port, (a.metrics_host, a.metrics_port))
        return run_on_serve_loop(serve_config(cfg, reuse_port=True, name=f"gateway worker {a.index}"))
    except (ConfigError, GatewayError, OSError) as e:
        print(f"headrace serve: worker {a.index}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(worker_main())
