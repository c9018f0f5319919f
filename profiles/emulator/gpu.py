"""Start and stop the arbiter process of one emulated physical GPU."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from profiles.emulator.client import ArbiterClient, ArbiterError


class EmulatedGpu:
    """One emulated physical GPU: an arbiter process listening on a unix socket.

    Use as a context manager (or ``start()``/``stop()``); ``socket_path`` is what
    ``write_emulated_model(..., arbiter=...)`` takes. The process runs in its own group and
    is stopped by its PID, even when the body fails.
    """

    def __init__(self, name: str = "gpu0", ready_timeout: float = 10.0) -> None:
        self.name = name
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self._dir: Path | None = None
        self.socket_path = ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> EmulatedGpu:
        # unix socket paths are short (108 bytes): keep the directory in /tmp
        self._dir = Path(tempfile.mkdtemp(prefix=f"hr-{self.name[:20]}-", dir="/tmp"))
        self.socket_path = str(self._dir / "arbiter.sock")
        log = open(self._dir / "arbiter.log", "wb")  # noqa: SIM115  (owned by the child)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "profiles.emulator.arbiter", "--socket", self.socket_path],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        finally:
            log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ArbiterError(f"arbiter of {self.name} exited with {self.proc.returncode}: {self.logs()}")
            if os.path.exists(self.socket_path):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(self.socket_path)
                    return
                except OSError:
                    pass
                finally:
                    s.close()
            time.sleep(0.02)
        raise ArbiterError(f"arbiter of {self.name} not ready after {self.ready_timeout:.0f}s: {self.logs()}")

    def logs(self) -> str:
        f = self._dir / "arbiter.log" if self._dir else None
        return f.read_text(errors="replace")[-4000:] if f and f.exists() else ""

    def round_trip(self, n: int = 50) -> float:
        """Median seconds of one message to the arbiter and back."""
        c = ArbiterClient(self.socket_path)
        try:
            times = sorted(c.ping() for _ in range(n))
        finally:
            c.close()
        return times[len(times) // 2]

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5.0)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> EmulatedGpu:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
