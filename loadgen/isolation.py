"""What everyone else gets while one client attacks a front door: a well-behaved tritonclient
load (open loop, the client users run), health probes from another address, and the server's
memory, measured beside one attack of :mod:`loadgen.attacks` run in its own process.

:func:`measure` gives, for one attack (or none: the baseline), the well-behaved client's
attainment (answered OK within its SLO; an error is a miss) and latency percentiles, the probes'
latencies, and the server's RSS before, at its peak and after the attack ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parents[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Outcome:
    attack: str
    sent: int = 0  # what the attacker made (requests or connections)
    requests: int = 0  # the well-behaved client's
    ok_in_slo: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    probes: int = 0
    probe_failures: int = 0
    probe_p99_ms: float = 0.0
    rss_before_mib: float = 0.0
    rss_peak_mib: float = 0.0
    rss_after_mib: float = 0.0

    @property
    def attainment(self) -> float:
        return self.ok_in_slo / self.requests if self.requests else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "attainment": self.attainment}


async def _witness(url: str, model: str, rate: float, duration: float, slo_s: float,
                   out: Outcome) -> None:
    """Open loop at ``rate`` for ``duration``: one INPUT0 [1, 16] FP32 request each."""
    client = httpaio.InferenceServerClient(url, conn_limit=256, conn_timeout=30.0)
    x = httpaio.InferInput("INPUT0", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    lat: list[float] = []

    async def one() -> None:
        t = time.perf_counter()
        try:
            await client.infer(model, [x], headers={"x-headrace-slo-ms": str(int(slo_s * 1e3))})
        except InferenceServerException as e:
            key = str(e.status() or e.message())[:60]
            out.errors[key] = out.errors.get(key, 0) + 1
            return
        except Exception as e:  # noqa: BLE001  (a connection error is a miss, counted by kind)
            key = type(e).__name__
            out.errors[key] = out.errors.get(key, 0) + 1
            return
        finally:
            out.requests += 1
        took = time.perf_counter() - t
        lat.append(took)
        if took <= slo_s:
            out.ok_in_slo += 1

    tasks = []
    start = time.perf_counter()
    n = 0
    while (due := start + n / rate) < start + duration:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        tasks.append(asyncio.create_task(one()))
        n += 1
    await asyncio.gather(*tasks)
    await client.close()
    if lat:
        out.p50_ms = float(np.percentile(lat, 50) * 1e3)
        out.p99_ms = float(np.percentile(lat, 99) * 1e3)


def _probe(addr: tuple[str, int], source: str, timeout: float = 2.0) -> float | None:
    """Seconds a readiness probe on a new connection took; None when it failed."""
    t = time.perf_counter()
    try:
        with socket.create_connection(addr, timeout=timeout, source_address=(source, 0)) as s:
            s.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
    except OSError:
        return None
    return time.perf_counter() - t if data.startswith(b"HTTP/1.1 200") else None


def _probes(addr: tuple[str, int], source: str, stop: threading.Event, out: Outcome, pid: int,
            every_s: float) -> None:
    took: list[float] = []
    while not stop.wait(every_s):
        out.rss_peak_mib = max(out.rss_peak_mib, rss_mib(pid))
        t = _probe(addr, source)
        out.probes += 1
        if t is None:
            out.probe_failures += 1
        else:
            took.append(t)
    if took:
        out.probe_p99_ms = float(np.percentile(took, 99) * 1e3)


def measure(attack: str | None, *, http: str, grpc: str, model: str, pid: int, rate: float,
            duration: float, slo_s: float, scale: float = 1.0, warmup_s: float = 2.0,
            settle_s: float = 3.0, queue_model: str | None = None, probe_every_s: float = 0.1) -> Outcome:
    """Run ``attack`` (None: no attack) against the server ``pid`` listening on ``http`` /
    ``grpc`` for ``warmup_s + duration``, the well-behaved load and probes measuring over the
    last ``duration``; then stop the attack and read the RSS after ``settle_s``.
    ``queue_model``: where the ``queued`` attack sends (a slow model); ``probe_every_s``: the
    pause between one probe's end and the next."""
    out = Outcome(attack or "none")
    out.rss_before_mib = out.rss_peak_mib = rss_mib(pid)
    host, _, port = http.rpartition(":")
    proc = None
    if attack is not None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "loadgen.attacks", attack, "--http", http, "--grpc", grpc, "--model", model,
             "--scale", str(scale), "--duration", str(warmup_s + duration + 1.0),
             *(["--queue-model", queue_model] if queue_model else [])],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        time.sleep(warmup_s)
    stop = threading.Event()
    prober = threading.Thread(target=_probes, args=((host, int(port)), "127.0.0.3", stop, out, pid, probe_every_s), daemon=True)
    prober.start()
    try:
        asyncio.run(_witness(http, model, rate, duration, slo_s, out))
    finally:
        stop.set()
        prober.join()
        if proc is not None:  # it ends by itself a second after the witness; else it is stopped
            try:
                text, _ = proc.communicate(timeout=5.0)
                out.sent = json.loads(text.strip().splitlines()[-1])["sent"] if text.strip() else 0
            except (subprocess.TimeoutExpired, ValueError, KeyError):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    time.sleep(settle_s)
    out.rss_after_mib = rss_mib(pid)
    return out
