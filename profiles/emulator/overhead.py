"""Triton's own cost per batch, by which the emulated model ends each batch early.

A request through ``tritonclient`` -> tritonserver -> python-backend stub and back costs time
that is not the emulated GPU's: about 0.6 ms when the processes are busy, rising to about
1.5 ms when they have idled through a batch of 10 ms or more (waking idle threads is slower).
Ending every emulated batch that much early makes the latency measured through Triton match
the profile (and the sharing maths of :mod:`profiles.sharing`, which scale the whole batch).
:func:`calibrate_overhead` measures it on the host at hand.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class Overhead:
    """Seconds by which to end early a batch that should take ``latency`` seconds end to end:
    ``fixed_ms + idle_ms * min(1, latency / ramp_ms)``, never more than the batch itself."""

    fixed_ms: float = 0.6
    idle_ms: float = 0.9
    ramp_ms: float = 10.0

    def __post_init__(self) -> None:
        if self.fixed_ms < 0 or self.idle_ms < 0 or self.ramp_ms <= 0:
            raise ValueError(f"overhead needs fixed_ms >= 0, idle_ms >= 0, ramp_ms > 0; got {self}")

    @classmethod
    def none(cls) -> Overhead:
        return cls(0.0, 0.0, 1.0)

    def seconds(self, latency: float) -> float:
        ms = self.fixed_ms + self.idle_ms * min(1.0, latency * 1e3 / self.ramp_ms)
        return min(latency, ms / 1e3)

    def to_params(self) -> dict[str, str]:
        return {"overhead_fixed_ms": repr(self.fixed_ms), "overhead_idle_ms": repr(self.idle_ms),
                "overhead_ramp_ms": repr(self.ramp_ms)}

    @classmethod
    def from_params(cls, p: dict[str, str]) -> Overhead:
        return cls(float(p["overhead_fixed_ms"]), float(p["overhead_idle_ms"]), float(p["overhead_ramp_ms"]))


DEFAULT_OVERHEAD = Overhead()


def calibrate_overhead(protocol: Literal["http", "grpc"] = "http", samples: int = 30,
                       ramp_ms: float = 10.0) -> Overhead:
    """Measure :class:`Overhead` on this host: serve uncompensated emulated models of known
    constant latency (0, ramp and 3x ramp) in a private tritonserver and time them (lower
    quartile of ``samples`` each)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from profiles.emulator.repository import write_emulated_model
    from profiles.profile import LatencyPoint, Profile
    from profiles.triton.server import TritonServer

    lat_ms = {"c0": 0.001, "c1": ramp_ms, "c3": 3 * ramp_ms}
    repo = Path(tempfile.mkdtemp(prefix="headrace-calib-"))
    try:
        for name, ms in lat_ms.items():
            prof = Profile(name, name, "none", "none", 1, (LatencyPoint(1, ms / 1e3, ms / 1e3),))
            write_emulated_model(repo, name, prof, slice_id=name, overhead=Overhead.none())
        with TritonServer(repo, ready_timeout=120) as server:
            mod = grpcclient if protocol == "grpc" else httpclient
            client = mod.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url)
            x = mod.InferInput("INPUT0", [1, 16], "FP32")
            x.set_data_from_numpy(np.zeros((1, 16), np.float32))
            for name in lat_ms:
                for _ in range(3):
                    client.infer(name, [x])  # warm-up
            # interleaved blocks (a burst of load from elsewhere hits all three alike); the first
            # call of a block follows another model's idle time and is not counted
            times: dict[str, list[float]] = {name: [] for name in lat_ms}
            for _ in range(max(1, samples // 5)):
                for name in lat_ms:
                    for i in range(6):
                        t0 = time.perf_counter()
                        client.infer(name, [x])
                        if i:
                            times[name].append(time.perf_counter() - t0)
            # lower quartile: delays from other work on a busy host are not Triton's cost
            extra = {name: max(0.0, float(np.percentile(times[name], 25)) * 1e3 - ms)
                     for name, ms in lat_ms.items()}
            client.close()
    finally:
        shutil.rmtree(repo, ignore_errors=True)
    fixed = extra["c0"]
    idle = max(0.0, (extra["c1"] + extra["c3"]) / 2 - fixed)
    return Overhead(round(fixed, 4), round(idle, 4), ramp_ms)
