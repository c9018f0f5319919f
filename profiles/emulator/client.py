"""Blocking client of the arbiter, used inside the emulated model's ``execute``.

The client owns the precise wait: it sleeps until shortly before the latest ``eta`` the
arbiter sent (``select`` wakes it early if the eta moves), spins the rest, and looks once
more for a late update before it returns.
"""

from __future__ import annotations

import itertools
import json
import select
import socket
import time

from profiles.emulator.timing import SPIN_S
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
        self._seq = itertools.count(1)

    def connect(self) -> None:
        self.close()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket_path)
        except OSError as e:
            s.close()
            raise ArbiterError(f"cannot reach emulated-GPU arbiter at {self.socket_path}: {e}") from None
        s.setblocking(False)
        self._sock = s
        self._buf = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _send(self, msg: dict) -> None:
        if self._sock is None:
            self.connect()
        assert self._sock is not None
        data = json.dumps(msg).encode() + b"\n"
        try:
            while data:
                select.select([], [self._sock], [], self.timeout)
                data = data[self._sock.send(data):]
        except OSError as e:
            self.close()
            raise ArbiterError(f"emulated-GPU arbiter at {self.socket_path} failed: {e}") from None

    def _read(self, timeout: float | None) -> list[dict]:
        """Messages that arrive within ``timeout`` seconds (None: wait for at least one)."""
        assert self._sock is not None
        wait = self.timeout if timeout is None else max(0.0, timeout)
        try:
            ready, _, _ = select.select([self._sock], [], [], wait)
            if not ready:
                if timeout is None:
                    raise TimeoutError(f"no answer within {self.timeout:.0f}s")
                return []
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("arbiter closed the connection")
        except OSError as e:
            self.close()
            raise ArbiterError(f"emulated-GPU arbiter at {self.socket_path} failed: {e}") from None
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        out = [json.loads(x) for x in lines if x]
        for m in out:
            if "error" in m:
                raise ArbiterError(f"arbiter refused: {m['error']}")
        return out

    def run(self, job: ActiveJob, work: float, early: float = 0.0, spin: float = SPIN_S) -> float:
        """Run ``work`` solo-seconds of ``job`` under the GPU's sharing; returns ``early``
        seconds before the job is done (``time.monotonic()`` then)."""
        seq = next(self._seq)
        self._send({
            "op": "run", "seq": seq, "slice": job.slice_id, "client": job.client, "mode": job.mode,
            "share": job.share, "interference": job.interference, "terms": list(job.terms), "work": work, "t": time.monotonic(),
        })
        eta: float | None = None  # when to return: the arbiter's eta minus ``early``
        while True:
            timeout = None if eta is None else eta - spin - time.monotonic()
            for m in self._read(timeout):
                if m.get("seq") != seq:
                    continue  # late news about an earlier job
                if "done" in m:
                    return time.monotonic()
                eta = float(m["eta"]) - early
            if eta is None or time.monotonic() < eta - spin:
                continue
            while (now := time.monotonic()) < eta:
                pass
            # one last look: a job that started elsewhere a moment ago may have moved our eta
            late = [m for m in self._read(0.0) if m.get("seq") == seq]
            if any("done" in m for m in late):
                return now
            moved = [float(m["eta"]) - early for m in late if "eta" in m]
            if moved and moved[-1] > eta:
                eta = moved[-1]
                continue
            return now

    def ping(self) -> float:
        """Round-trip seconds of one message."""
        if self._sock is None:
            self.connect()
        t0 = time.monotonic()
        self._send({"op": "ping"})
        while not any("pong" in m for m in self._read(None)):
            pass
        return time.monotonic() - t0
