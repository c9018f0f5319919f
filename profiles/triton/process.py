"""Child processes headrace starts (tritonserver, the gateway): readiness over KServe v2 HTTP and
stopping a whole process group. One definition for the launcher, the demo and the benchmarks;
every process is stopped by its group id, never by name."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request


def http_ready(hostport: str, timeout: float = 1.0) -> bool:
    """``GET /v2/health/ready`` on ``host:port`` answered 200."""
    try:
        with urllib.request.urlopen(f"http://{hostport}/v2/health/ready", timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_http_ready(hostport: str, proc: subprocess.Popen | None, timeout: float) -> str | None:
    """Poll readiness until ``timeout``; None once ready, else why not (exit or time-out)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return f"exited with code {proc.returncode} before becoming ready"
        if http_ready(hostport):
            return None
        time.sleep(0.1)
    return f"not ready after {timeout:g}s"


def exit_on_sigterm() -> None:
    """Make SIGTERM end this process as Ctrl-C would: it raises SystemExit(143) where the
    process is, so every ``finally`` and context manager on the way out runs and stops the
    process groups this one started (asyncio.run cancels its tasks, whose ``finally`` blocks
    run too). Without it a terminated benchmark leaves its Triton and gateways running."""
    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 30.0) -> None:
    """``sig`` to the process group, up to ``grace`` seconds to exit, then SIGKILL to whatever
    of the group is left (children such as Triton's python stubs), and wait until it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:  # killed children are reaped by init, not by us
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
