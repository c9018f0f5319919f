"""The arbiter of one emulated physical GPU: a unix-socket service that runs the shared
physics (:class:`profiles.emulator.physics.SharedGpu`) against the wall clock.

Protocol: one JSON object per line. An emulated model instance keeps one connection and has at
most one job in flight on it.

- ``{"op": "run", "slice": s, "client": c, "mode": "mps"|"timeslice", "share": p,
  "interference": f, "work": seconds, "t": monotonic send time}`` -> ``{"done": t, "started": t0}``
  once the job's work is done under the sharing rules.
- ``{"op": "ping"}`` -> ``{"pong": monotonic now}`` (round-trip measurement).
- anything invalid -> ``{"error": "..."}``; the connection stays usable.

A connection that closes with a job in flight cancels that job, so a dead client never wedges
the GPU. Run as ``python -m profiles.emulator.arbiter --socket PATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import time
from collections.abc import Callable

from profiles.emulator.physics import Finished, SharedGpu
from profiles.emulator.timing import wait_until
from profiles.sharing import ActiveJob

WAKE_EARLY_S = 0.0015  # the event loop wakes this much before a completion, then spins
REPLY_LEAD_S = 0.00005  # completions are sent this much early to cover the reply's delivery


class ProtocolError(ValueError):
    pass


def parse_job(msg: dict) -> tuple[ActiveJob, float, float | None]:
    """(job, work seconds, client send time) from a ``run`` message; raises ProtocolError."""
    try:
        mode = msg.get("mode", "timeslice")
        if mode not in ("mps", "timeslice"):
            raise ProtocolError(f"mode must be 'mps' or 'timeslice', got {mode!r}")
        share = float(msg.get("share", 1.0))
        if not 0 < share <= 1:
            raise ProtocolError(f"share must be in (0, 1], got {share}")
        interference = float(msg.get("interference", 0.0))
        if not 0 <= interference <= 10:
            raise ProtocolError(f"interference must be in [0, 10], got {interference}")
        work = float(msg["work"])
        if not 0 <= work <= 3600:
            raise ProtocolError(f"work must be in [0, 3600] seconds, got {work}")
        job = ActiveJob(str(msg["slice"]), str(msg.get("client", "")), mode, share, interference)
        t = msg.get("t")
        return job, work, (float(t) if t is not None else None)
    except KeyError as e:
        raise ProtocolError(f"run message lacks field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        if isinstance(e, ProtocolError):
            raise
        raise ProtocolError(f"bad run message: {e}") from None


class Arbiter:
    """Drives one :class:`SharedGpu` from an asyncio loop; ``clock`` is ``time.monotonic``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.gpu = SharedGpu()
        self.clock = clock
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.StreamWriter] = {}
        self._timer: asyncio.TimerHandle | None = None
        self.completed = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        job_id: int | None = None
        try:
            while line := await reader.readline():
                try:
                    msg = json.loads(line)
                    if not isinstance(msg, dict):
                        raise ProtocolError("message must be a JSON object")
                    op = msg.get("op", "run")
                    if op == "ping":
                        self._send(writer, {"pong": self.clock()})
                        continue
                    if op != "run":
                        raise ProtocolError(f"unknown op {op!r}; known: run, ping")
                    if job_id is not None and job_id in self.gpu:
                        raise ProtocolError("a job is already in flight on this connection")
                    job, work, sent = parse_job(msg)
                except (ProtocolError, json.JSONDecodeError) as e:
                    self._send(writer, {"error": str(e)})
                    continue
                now = self.clock()
                # the job started when the client sent it, unless that is in the past of the
                # physics (then the physics clamps it to its own now)
                start = min(now, sent) if sent is not None else now
                job_id = next(self._ids)
                self._waiting[job_id] = writer
                self._deliver(self.gpu.start(job_id, job, work, start))
                self._reschedule()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if job_id is not None and job_id in self.gpu:
                self._waiting.pop(job_id, None)
                self._deliver(self.gpu.cancel(job_id, self.clock()))
                self._reschedule()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _send(self, writer: asyncio.StreamWriter, msg: dict) -> None:
        if writer.is_closing():
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            writer.write(json.dumps(msg).encode() + b"\n")

    def _deliver(self, finished: list[Finished]) -> None:
        for f in finished:
            self.completed += 1
            writer = self._waiting.pop(f.job_id, None)
            if writer is not None:
                self._send(writer, {"done": f.finished, "started": f.started})

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        t_next = self.gpu.next_completion()
        if t_next is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(t_next - WAKE_EARLY_S, self._fire, t_next)

    def _fire(self, t_next: float) -> None:
        self._timer = None
        wait_until(t_next - REPLY_LEAD_S)
        self._deliver(self.gpu.advance(max(t_next, self.clock())))
        self._reschedule()


async def serve(socket_path: str) -> None:
    arbiter = Arbiter()
    server = await asyncio.start_unix_server(arbiter.handle, path=socket_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="arbiter of one emulated GPU (unix socket service)")
    ap.add_argument("--socket", required=True, help="unix socket path to listen on")
    args = ap.parse_args(argv)
    asyncio.run(serve(args.socket))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
