"""Running a gateway process: the event loop it serves on and serving one config until
SIGTERM/SIGINT (or an operator's stop over the control channel), then draining. ``headrace
serve``, its workers, the operator and the Ray actors all run on this loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from profiles.gateway_config import GatewayConfig

if TYPE_CHECKING:
    from gateway.control import ControlListen

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory when uvloop is installed (a faster loop for the front door and the
    replica clients), else None (asyncio's own loop)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_on_serve_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on the event loop ``headrace serve`` runs on (benchmarks' floor servers
    use it too, so they measure the same loop)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


async def serve_config(cfg: GatewayConfig, reuse_port: bool = False, name: str = "gateway",
                       control: ControlListen | None = None, ready_file: str | Path | None = None) -> int:
    """Serve ``cfg`` until SIGTERM/SIGINT (or the control channel's ``POST stop``), then drain;
    ``reuse_port``: share the HTTP and gRPC ports with the other workers of ``headrace serve
    --workers``. ``control``: serve the control channel (:mod:`gateway.control`) there.
    ``ready_file``: once serving, write ``{"http", "grpc", "control", "pid"}`` there as JSON
    (whole or not at all); it is removed when the gateway stops."""
    from gateway.app import Gateway
    from gateway.control import ControlServer, write_ready_file
    from gateway.observe.memory import pin_large_blocks, trimmer

    pin_large_blocks()  # before any request: a burst of large bodies must not keep the RSS up
    gw = Gateway(cfg, reuse_port=reuse_port)  # resolves the profiles: their errors come before any port is opened
    stop = asyncio.Event()
    drain_timeout = cfg.drain_timeout_s

    def stop_by_operator(seconds: float) -> None:
        nonlocal drain_timeout
        drain_timeout = seconds
        stop.set()

    server = None if control is None else ControlServer(gw, control.token, stop_by_operator)
    await gw.start()
    try:
        control_url = None if server is None or control is None else await server.start(control.host, control.port)
        if ready_file is not None:
            write_ready_file(ready_file, {"http": gw.http_url, "grpc": gw.grpc_url, "control": control_url,
                                          "pid": os.getpid()})
    except BaseException:
        await gw.stop()
        if server is not None:
            await server.close()
        raise
    # startup objects (profiles, protobuf descriptors, pydantic models) live as long as the
    # process: keep them out of the collector's full passes, which then walk only live traffic
    gc.collect()
    gc.freeze()
    tls = " (TLS)" if gw.security.tls is not None else ""
    metrics = f"  metrics {gw.metrics_url}" if gw.metrics_url else ""
    ctl = f"  control {control_url}" if control_url else ""
    print(f"headrace {name}: http {gw.http_url}  grpc {gw.grpc_url}{tls}{metrics}{ctl}  models "
          f"{', '.join([m.name for m in cfg.models] + [m.name for m in cfg.llm_models])}", flush=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    trimming = asyncio.create_task(trimmer())
    await stop.wait()
    trimming.cancel()
    print(f"headrace {name}: draining (up to {drain_timeout:g}s)", flush=True)
    try:
        await gw.stop(drain_timeout=drain_timeout)
    finally:
        if server is not None:  # last: the operator sees the channel go once the gateway has stopped
            await server.close()
        if ready_file is not None:
            remove_ready_file(ready_file)
    print(f"headrace {name}: stopped", flush=True)
    return 0


def remove_ready_file(path: str | Path) -> None:
    """Remove this process's ready file (one another gateway has written since is left)."""
    with contextlib.suppress(OSError, ValueError):
        if json.loads(Path(path).read_text()).get("pid") == os.getpid():
            os.unlink(path)
