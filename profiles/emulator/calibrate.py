"""Measuring :class:`~profiles.emulator.overhead.Overhead` on the host at hand, through a private
tritonserver."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Literal

import numpy as np

from profiles.emulator.overhead import Overhead
from profiles.emulator.repository import write_emulated_model
from profiles.profile import LatencyPoint, Profile
from profiles.triton.server import TritonServer


def calibrate_overhead(protocol: Literal["http", "grpc"] = "http", samples: int = 30,
                       ramp_ms: float = 10.0) -> Overhead:
    """Measure :class:`Overhead` on this host: serve uncompensated emulated models of known
    constant latency (0, ramp and 3x ramp) in a private tritonserver and time them (lower
    quartile of ``samples`` each)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

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
