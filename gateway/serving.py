"""Running a gateway process: the event loop it serves on and serving one config until
SIGTERM/SIGINT, then draining. ``headrace serve``, its workers, the operator and the Ray
actors all run on this loop."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from profiles.gateway_config import GatewayConfig

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


async def serve_config(cfg: GatewayConfig, reuse_port: bool = False, name: str = "gateway") -> int:
    """Serve ``cfg`` until SIGTERM/SIGINT, then drain; ``reuse_port``: share the HTTP and gRPC
    ports with the other workers of ``headrace serve --workers``."""
    from gateway.app import Gateway
    from gateway.observe.memory import pin_large_blocks, trimmer

    pin_large_blocks()  # before any request: a burst of large bodies must not keep the RSS up
    gw = Gateway(cfg, reuse_port=reuse_port)  # resolves the profiles: their errors come before any port is opened
    await gw.start()
    # startup objects (profiles, protobuf descriptors, pydantic models) live as long as the
    # process: keep them out of the collector's full passes, which then walk only live traffic
    gc.collect()
    gc.freeze()
    tls = " (TLS)" if gw.security.tls is not None else ""
    metrics = f"  metrics {gw.metrics_url}" if gw.metrics_url else ""
    print(f"headrace {name}: http {gw.http_url}  grpc {gw.grpc_url}{tls}{metrics}  models "
          f"{', '.join([m.name for m in cfg.models] + [m.name for m in cfg.llm_models])}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    trimming = asyncio.create_task(trimmer())
    await stop.wait()
    trimming.cancel()
    print(f"headrace {name}: draining (up to {cfg.drain_timeout_s:g}s)", flush=True)
    await gw.stop(drain_timeout=cfg.drain_timeout_s)
    print(f"headrace {name}: stopped", flush=True)
    return 0
