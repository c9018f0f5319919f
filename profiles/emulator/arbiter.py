"""The arbiter of one emulated physical GPU: a unix-socket service that runs the shared
physics (:class:`profiles.emulator.physics.SharedGpu`) against the wall clock.

The arbiter does no precise waiting itself. For every job it tells the job's client the
predicted completion time (``eta``, on ``time.monotonic``, which all processes of the host
share) and tells it again whenever a job starting or ending on the GPU moves it. The client
waits until its latest ``eta`` (sleep, then spin) in its own process. The arbiter's physics
completes jobs at their exact times, lazily, whenever the next event is processed; a coarse
timer at each predicted completion pushes the speed-ups that follow a completion.

Protocol: one JSON object per line; a connection (one emulated model instance) has at most
one job in flight, and a new ``run`` ends its previous job.

- ``{"op": "run", "seq": n, "slice": s, "client": c, "mode": "mps"|"timeslice", "share": p,
  "interference": f, "terms": [floor, fixed, scalable], "work": seconds, "t": monotonic send time}`` -> ``{"seq": n, "eta": t}``
  (again on every change), then ``{"seq": n, "done": t}`` when the physics completes it.
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
from collections.abc import Hashable
from dataclasses import dataclass

from profiles.emulator.physics import Finished, SharedGpu
from profiles.sharing import FULLY_SCALABLE, ActiveJob

ETA_RESEND_S = 1e-6  # an eta that moved less than this is not sent again


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
        terms = tuple(float(x) for x in msg.get("terms", FULLY_SCALABLE))
        if len(terms) != 3 or not all(0 <= x <= 1e3 for x in terms):
            raise ProtocolError(f"terms must be 3 numbers in [0, 1000] (floor, fixed, scalable), got {list(terms)}")
        job = ActiveJob(str(msg["slice"]), str(msg.get("client", "")), mode, share, interference, terms)  # type: ignore[arg-type]
        t = msg.get("t")
        return job, work, (float(t) if t is not None else None)
    except KeyError as e:
        raise ProtocolError(f"run message lacks field {e.args[0]!r}") from None
    except ProtocolError:
        raise
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"bad run message: {e}") from None


@dataclass
class _Flight:
    conn: Hashable
    seq: object
    eta: float = float("nan")


Outbox = list[tuple[Hashable, dict]]


class ArbiterCore:
    """Sans-IO arbiter: events in (with ``now``), messages out as ``(connection, message)``."""

    def __init__(self) -> None:
        self.gpu = SharedGpu()
        self._ids = itertools.count(1)
        self._flights: dict[int, _Flight] = {}
        self._by_conn: dict[Hashable, int] = {}
        self.completed = 0

    def on_message(self, conn: Hashable, msg: object, now: float) -> Outbox:
        try:
            if not isinstance(msg, dict):
                raise ProtocolError("message must be a JSON object")
            op = msg.get("op", "run")
            if op == "ping":
                return [(conn, {"pong": now})]
            if op != "run":
                raise ProtocolError(f"unknown op {op!r}; known: run, ping")
            job, work, sent = parse_job(msg)
        except ProtocolError as e:
            return [(conn, {"error": str(e)})]
        # the job started when the client sent it (the physics clamps a send time earlier
        # than its last event to that event)
        start = min(now, sent) if sent is not None else now
        out = self._end_conn_job(conn, start)
        jid = next(self._ids)
        self._flights[jid] = _Flight(conn, msg.get("seq"))
        self._by_conn[conn] = jid
        out += self._finished(self.gpu.start(jid, job, work, start))
        return out + self._etas()

    def on_close(self, conn: Hashable, now: float) -> Outbox:
        out = self._end_conn_job(conn, now)
        return out + self._etas()

    def on_timer(self, now: float) -> Outbox:
        # advance only to the last completion due, not to ``now``: a client that returned at
        # its eta may already have sent its next job, stamped before ``now``
        out: Outbox = []
        while (t := self.gpu.next_completion()) is not None and t <= now:
            done = self.gpu.advance(t)
            out += self._finished(done)
            if not done:  # rounding left the job a hair short of done: finish it at now
                out += self._finished(self.gpu.advance(now))
                break
        return out + self._etas()

    def next_wakeup(self) -> float | None:
        return self.gpu.next_completion()

    def _end_conn_job(self, conn: Hashable, now: float) -> Outbox:
        jid = self._by_conn.pop(conn, None)
        if jid is None or jid not in self.gpu:
            return []
        self._flights.pop(jid, None)
        return self._finished(self.gpu.cancel(jid, now))

    def _finished(self, finished: list[Finished]) -> Outbox:
        out: Outbox = []
        for f in finished:
            self.completed += 1
            fl = self._flights.pop(f.job_id, None)
            if fl is not None:
                if self._by_conn.get(fl.conn) == f.job_id:
                    del self._by_conn[fl.conn]
                out.append((fl.conn, {"seq": fl.seq, "done": f.finished}))
        return out

    def _etas(self) -> Outbox:
        out: Outbox = []
        for jid, eta in self.gpu.predicted_completions().items():
            fl = self._flights.get(jid)
            if fl is not None and not abs(eta - fl.eta) < ETA_RESEND_S:
                fl.eta = eta
                out.append((fl.conn, {"seq": fl.seq, "eta": eta}))
        return out


class Arbiter:
    """asyncio driver of an :class:`ArbiterCore` on a unix socket, with the monotonic clock."""

    def __init__(self) -> None:
        self.core = ArbiterCore()
        self._timer: asyncio.TimerHandle | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    msg = json.loads(line)
                except json.JSONDecodeError as e:
                    self._send([(writer, {"error": f"not JSON: {e}"})])
                    continue
                self._send(self.core.on_message(writer, msg, time.monotonic()))
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass  # ValueError: a line longer than the stream limit
        finally:
            self._send(self.core.on_close(writer, time.monotonic()))
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _send(self, out: Outbox) -> None:
        for writer, msg in out:
            assert isinstance(writer, asyncio.StreamWriter)
            if not writer.is_closing():
                with contextlib.suppress(ConnectionError, RuntimeError):
                    writer.write(json.dumps(msg).encode() + b"\n")
        self._reschedule()

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        t_next = self.core.next_wakeup()
        if t_next is not None:
            self._timer = asyncio.get_running_loop().call_at(t_next, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._send(self.core.on_timer(time.monotonic()))


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
