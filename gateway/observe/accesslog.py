"""Structured access logs: one JSON line per inference request the front doors answer.

Every answer to an infer call is one line: the request served, refused by the scheduler
(429 / 503 with its reason), refused at the front door (400, 401, 404, 413, ...), failed at
a replica or given up by its client. Its fields, always all present (``null`` when unknown)::

    {"time": "2025-01-31T12:00:00.123Z", "tenant": "team-a", "protocol": "http",
     "model": "resnet50", "version": "1", "variant": "resnet50-fp16", "status": 200,
     "queue_ms": 1.234, "total_ms": 4.567, "rows": 1, "reason": null, "request_id": "abc"}

``time`` is when the answer was given (UTC); ``total_ms`` counts from when the front door
read the request's first bytes, so its arrival is ``time - total_ms``. ``status`` is the HTTP
status for ``http`` and the gRPC code name for ``grpc``; a client that hangs up before its
answer is ``499`` / ``CANCELLED``. ``queue_ms`` is the wait from arrival until its batch was
sent (served requests only). ``reason`` is the scheduler's reject reason (``expired``,
``infeasible``, ``no_replica``, ...) or the front door's error message for other refusals.
``request_id`` is the client's own request ``id`` (KServe v2), else its ``x-request-id``.

Sampling: ``sample`` is the fraction of *successful* answers logged, drawn independently per
request from the injected ``random.Random``. Refusals and errors are all logged unless
``sample_failures`` is set: they are what an operator reads the log for, and normally rare.
(Under a heavy overload refusals can outnumber successes; ``sample_failures`` bounds the
log's cost there.)

Why a small writer and not :mod:`logging`: the gateway writes one line per request at
thousands a second on its event loop. A :class:`logging.LogRecord` with its handler lock and
formatter costs several times the JSON encoding itself, and a ``StreamHandler`` flushes each
record: a ``write`` system call per request on the loop. :class:`AccessLog` encodes the line,
appends it to a buffer and writes the buffer once per ``flush_s`` (and when it passes 64 KiB,
and on close). A line reaches its file at most ``flush_s`` after its answer.

Off (the default) it costs a front door one ``is None`` check per request: the front doors
hold ``access_log: AccessLog | None`` and build nothing when it is None.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol, TextIO

FrontDoor = Literal["http", "grpc"]  # the front door a request came in through
CANCELLED_HTTP = 499  # the client closed the connection before its answer (nginx's convention)
_FLUSH_BYTES = 64 << 10


class AccessLogSettings(Protocol):
    """What :meth:`AccessLog.from_settings` reads (``profiles.schema.AccessLogSpec``)."""

    enabled: bool
    sample: float
    sample_failures: bool
    path: str | None


class AccessLog:
    """A buffered JSON-lines writer of access records; see the module docstring."""

    def __init__(self, sink: TextIO | str | Path | None = None, *, sample: float = 1.0,
                 sample_failures: bool = False, rng: random.Random | None = None,
                 wall: Callable[[], float] = time.time, flush_s: float = 0.5) -> None:
        if not 0.0 <= sample <= 1.0:
            raise ValueError(f"access log sample ({sample}) must be within [0, 1]")
        if isinstance(sink, str | Path):
            self._out: TextIO = open(sink, "a", encoding="utf-8")  # noqa: SIM115  (closed by close())
            self._owned = True
        else:
            self._out = sink if sink is not None else sys.stderr
            self._owned = False
        self.sample = sample
        self.sample_failures = sample_failures
        self.rng = rng or random.Random()
        self.wall = wall
        self.flush_s = flush_s
        self._buf: list[str] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None
        self._second = -1  # the whole second _stamp was made for
        self._stamp = ""
        self.closed = False

    @classmethod
    def from_settings(cls, spec: AccessLogSettings, rng: random.Random | None = None) -> AccessLog | None:
        """The log ``spec`` asks for, or None when it is off (``enabled: false`` or ``sample: 0``
        with failures sampled too). A path that cannot be opened is an :class:`OSError` naming it."""
        if not spec.enabled or (spec.sample == 0.0 and spec.sample_failures):
            return None
        try:
            return cls(spec.path, sample=spec.sample, sample_failures=spec.sample_failures, rng=rng)
        except OSError as e:
            raise OSError(f"access_log.path: cannot open {spec.path!r}: {e.strerror}") from None

    def answered(self, protocol: FrontDoor, model: str | None, status: int | str, ok: bool, total_s: float, *,
                 version: str | None = None, variant: str | None = None, queue_s: float | None = None,
                 rows: int | None = None, reason: str | None = None, request_id: str | None = None,
                 tenant: str | None = None) -> None:
        """Log one answer (if sampled): ``ok`` is a success (HTTP 200 / gRPC OK)."""
        if (ok or self.sample_failures) and self.sample < 1.0 and self.rng.random() >= self.sample:
            return
        self.write({
            "time": self._time(), "tenant": tenant, "protocol": protocol, "model": model,
            "version": version or None, "variant": variant, "status": status,
            "queue_ms": None if queue_s is None else round(queue_s * 1e3, 3),
            "total_ms": round(total_s * 1e3, 3), "rows": rows, "reason": reason,
            "request_id": request_id or None,
        })

    def write(self, record: dict[str, Any]) -> None:
        """Append one record as a JSON line; written at the next flush."""
        if self.closed:
            return
        line = json.dumps(record, separators=(",", ":"), default=str) + "\n"
        self._buf.append(line)
        self._size += len(line)
        if self._size >= _FLUSH_BYTES:
            self.flush()
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no event loop (a tool, a test): written at once
                self.flush()
                return
            self._timer = loop.call_later(self.flush_s, self.flush)

    def flush(self) -> None:
        """Write what is buffered now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._buf:
            return
        text, self._buf, self._size = "".join(self._buf), [], 0
        try:
            self._out.write(text)
            self._out.flush()
        except (OSError, ValueError) as e:  # a full disk or a closed stream must not fail requests
            print(f"headrace access log: write failed, {text.count(chr(10))} lines lost: {e}", file=sys.stderr)

    def close(self) -> None:
        """Flush, and close the file if the log opened it."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        if self._owned:
            self._out.close()

    def _time(self) -> str:
        """ISO 8601 UTC with milliseconds; the seconds part is formatted once per second."""
        t = self.wall()
        second = int(t)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((t - second) * 1000):03d}Z"


def rows_of(shape: list[int] | tuple[int, ...], batched: bool) -> int:
    """The rows a request carries: its first input's batch dimension, or 1 for a model
    without batching."""
    return int(shape[0]) if batched and shape else 1
