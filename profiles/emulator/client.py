"""Blocking client of the arbiter (used inside the emulated model's ``execute``)."""

from __future__ import annotations

import json
import socket
import time

from profiles.sharing import ActiveJob


class ArbiterError(RuntimeError):
    """The arbiter is unreachable or refused a job; the message says which and why."""


class ArbiterClient:
    """One connection to one arbiter; one job in flight at a time."""

    def __init__(self, socket_path: str, timeout: float = 600.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buf = b""

    def connect(self) -> None:
        self.close()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.socket_path)
        except OSError as e:
            s.close()
            raise ArbiterError(f"cannot reach emulated-GPU arbiter at {self.socket_path}: {e}") from None
        self._sock = s
        self._buf = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _call(self, msg: dict) -> dict:
        if self._sock is None:
            self.connect()
        assert self._sock is not None
        try:
            self._sock.sendall(json.dumps(msg).encode() + b"\n")
            while b"\n" not in self._buf:
                chunk = self._sock.recv(4096)
                if not chunk:
                    raise ConnectionError("arbiter closed the connection")
                self._buf += chunk
        except OSError as e:
            self.close()
            raise ArbiterError(f"emulated-GPU arbiter at {self.socket_path} failed: {e}") from None
        line, _, self._buf = self._buf.partition(b"\n")
        reply = json.loads(line)
        if "error" in reply:
            raise ArbiterError(f"arbiter refused: {reply['error']}")
        return reply

    def run(self, job: ActiveJob, work: float) -> tuple[float, float]:
        """Run ``work`` solo-seconds of ``job`` under the GPU's sharing; (started, done)."""
        reply = self._call({
            "op": "run", "slice": job.slice_id, "client": job.client, "mode": job.mode,
            "share": job.share, "interference": job.interference, "work": work, "t": time.monotonic(),
        })
        return float(reply["started"]), float(reply["done"])

    def ping(self) -> float:
        """Round-trip seconds of one message."""
        t0 = time.monotonic()
        self._call({"op": "ping"})
        return time.monotonic() - t0
