"""The operator's gateway: a process of its own (``headrace serve`` with a control channel), in
a session of its own, so it keeps serving while the controller is down or restarting.

:func:`start_gateway` writes the plan's gateway config to the state directory's ``run/`` and
starts it; :func:`adopt_gateway` takes over one a previous controller started, from its record
in the state (pid + start time, control address). Either gives a :class:`GatewayProcess`: the
:class:`gateway.control.RemoteHandle` the controller drives it with (the control channel's
token is the state directory's ``control-token``), which also knows the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from typing import Any

import yaml

from deploy.operator.adopt import Foreign, started_of
from deploy.operator.state import DirStateStore, control_token
from gateway.control import ControlError, RemoteHandle
from profiles.gateway_config import GatewayConfig
from profiles.triton.process import stop_group

READY_TIMEOUT_S = 60.0


class GatewayProcess(RemoteHandle):
    """A gateway process and the control channel to it."""

    proc: subprocess.Popen | Foreign | None = None
    models: dict[str, str] | None = None  # adopted: the classic replicas it served then, id -> model

    @property
    def record(self) -> dict[str, Any] | None:
        """What the state keeps of it (:func:`adopt_gateway` reads it back)."""
        if self.proc is None:
            return None
        return {"pid": self.proc.pid, "started": started_of(self.proc), "control": self.control_url,
                "http": self.http_url, "grpc": self.grpc_url}

    @property
    def records(self) -> dict[str, dict[str, Any]]:
        return {"gateway": self.record} if self.record else {}

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def stop(self, drain_timeout: float, wait: bool = True) -> None:
        """Drain and stop it over the control channel; whatever of its process group is left
        after the drain is stopped by signal."""
        try:
            if self.alive():
                await super().stop(drain_timeout, wait=wait)
        except ControlError:
            pass
        finally:
            if self.proc is not None:
                await asyncio.to_thread(stop_group, self.proc, grace=5.0)  # type: ignore[arg-type]
            await self.close()


async def start_gateway(store: DirStateStore, cfg: GatewayConfig, timeout: float = READY_TIMEOUT_S,
                        name: str = "gateway", reuse_port: bool = False) -> GatewayProcess:
    """``cfg`` served by a new gateway process; returns once it serves (its log:
    ``<name>.log`` in the state directory). An exit or a timeout first is a ``RuntimeError``
    with the log's tail. ``reuse_port``: it shares its ports with the other gateway workers."""
    run = store.run_dir
    run.mkdir(parents=True, exist_ok=True)
    cfg_path, ready = run / f"{name}.yaml", run / f"{name}.ready"
    doc = cfg.model_dump(mode="json", exclude_none=True)
    cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    ready.unlink(missing_ok=True)
    log_path = store.path / f"{name}.log"
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg_path), "--control-listen", "127.0.0.1:0",
            "--control-token-file", str(control_token(store)), "--ready-file", str(ready), "--log-level", "WARNING",
            *(["--reuse-port"] if reuse_port else [])]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout + cfg.startup_timeout_s
    try:
        while not ready.exists():
            if proc.poll() is not None or loop.time() > end:
                why = (f"exited with code {proc.returncode}" if proc.poll() is not None
                       else f"was not serving after {timeout + cfg.startup_timeout_s:g} s")
                tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
                raise RuntimeError(f"the gateway process {why}; {log_path}: " + " | ".join(tail))
            await asyncio.sleep(0.05)
        info = json.loads(ready.read_text())
        gw = GatewayProcess(info["control"], control_token(store).read_text().strip(), info["http"], info["grpc"])
    except BaseException:
        await asyncio.to_thread(stop_group, proc, grace=5.0)
        raise
    gw.proc, gw.pid = proc, proc.pid
    return gw


async def adopt_gateway(store: DirStateStore, rec: dict[str, Any]) -> GatewayProcess:
    """The gateway process ``rec`` (its record in the state) names, taken over as it runs.
    ``RuntimeError`` when its control channel does not answer, or another process does."""
    gw = GatewayProcess(rec["control"], control_token(store).read_text().strip())
    try:
        state = await gw.state()
        if state.get("pid") != rec["pid"]:
            raise RuntimeError(f"the control address {rec['control']} is answered by pid {state.get('pid')}, "
                               f"not the gateway (pid {rec['pid']})")
    except BaseException:
        with contextlib.suppress(Exception):
            await gw.close()
        raise
    gw.http_url, gw.grpc_url, gw.pid = state["http"], state["grpc"], state["pid"]
    gw.models = dict(state.get("models") or {})
    gw.proc = Foreign(rec["pid"], rec.get("started"))
    return gw
