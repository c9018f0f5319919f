"""Adoption: a controller that starts on a state directory whose fleet still runs takes that
fleet over as it is, without restarting a process.

The state records each process (pid + start time, so a reused pid is never taken for ours)
with what it takes to drive it again: a Triton replica's repository, ports and endpoint, an
emulated GPU's socket, an engine's command line and URL, the gateway's control address. It
also records the fleet each generation ran (:func:`fleet_to_state`), so the plan, rollback
and the history survive the controller. :class:`Foreign` gives a process this controller did
not start the face of the :class:`subprocess.Popen` it would have had, so the runtime's
stop, restart and liveness checks work on it unchanged.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from deploy.operator.state import same_process, start_time
from placement.apply.render import Endpoint
from placement.llm import LlmChoice, LlmPlan, LlmReplica
from placement.plan import GpuPlan, Replica, SlicePlan

STATE_VERSION = 2  # what this controller writes; a state of another version is migrated or refused


class Foreign:
    """A running process another controller started: ``poll``/``wait``/``pid`` as
    :class:`subprocess.Popen` has them. It is not this process's child, so its exit status is
    unknown: a process gone reads as exited with -1."""

    def __init__(self, pid: int, started: int | None) -> None:
        self.pid = pid
        self.started = started
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not same_process(self.pid, self.started):
            self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(9)


# ---------------------------------------------------------------------------- fleets


def gpus_to_state(gpus: tuple[GpuPlan, ...]) -> list[dict[str, Any]]:
    """A plan's GPUs, exactly (capacities unrounded), as JSON."""
    return [asdict(g) for g in gpus]


def gpus_from_state(data: list[dict[str, Any]]) -> tuple[GpuPlan, ...]:
    return tuple(GpuPlan(g["id"], g["gpu"], g["mig"], tuple(
        SlicePlan(s["profile"], s["start"], s["mps"], tuple(Replica(**r) for r in s["replicas"]))
        for s in g["slices"])) for g in data)


def fleet_to_state(gpus: tuple[GpuPlan, ...], llm: LlmPlan) -> dict[str, Any]:
    """What a generation runs: the classic plan's GPUs and the LLM engines."""
    return {"gpus": gpus_to_state(gpus), "llm": [{"id": r.id, "model": r.model, "gpu": r.gpu} for r in llm.replicas]}


def llm_from_state(data: list[dict[str, Any]], choices: tuple[LlmChoice, ...]) -> LlmPlan:
    """The engines recorded, each with its deployment's chosen profile (one engine whose
    deployment is no longer declared is left out: it is stopped as an extra)."""
    by_model = {c.model: c for c in choices}
    return LlmPlan(choices, tuple(LlmReplica(r["id"], r["model"], by_model[r["model"]].profile, r["gpu"])
                                  for r in data if r["model"] in by_model))


def endpoint_to_state(ep: Endpoint) -> dict[str, Any]:
    return asdict(ep)


def endpoint_from_state(data: dict[str, Any]) -> Endpoint:
    return Endpoint(**data)


def started_of(proc: Any) -> int | None:
    """The start time of a process a runtime runs: recorded when it was adopted, else read."""
    return proc.started if isinstance(proc, Foreign) else start_time(proc.pid)


def alive(record: dict[str, Any] | None) -> bool:
    """Whether a recorded process (pid + start time) still runs."""
    return record is not None and same_process(record["pid"], record.get("started"))


def path_or_none(p: str | None) -> Path | None:
    return None if p is None else Path(p)
