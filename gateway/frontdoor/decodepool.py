"""Decoding off the event loop: worker processes that decode large infer requests (and encode
large JSON answers).

Python's JSON decoder turns about 40 MiB of numbers a second into objects, and a BYTES
tensor's length prefixes are walked one element at a time: a 60 MiB JSON request holds the
thread that decodes it for over a second. A thread does not help (the GIL: ``json.loads`` in
one blocks the loop's thread all the same), so the front doors hand such requests to
processes of their own (:class:`DecodePool`), which run the very decode the loop runs for
small requests (:mod:`gateway.codec`), and keep only the cheap part on the loop: writing the
request to a pipe and reading the result back, each in 256 KiB slices (:data:`SLICE`), with the
loop free between slices (each slice is copied two or three times on its way, about 1 ms on
this project's machine: 1 MiB slices held the loop 3-5 ms each while a 281 MiB answer came back).

Jobs wait in a :class:`FairQueue`: one FIFO per client (its tenant, else its address), served
round-robin, so a client sending many large bodies delays another client's large body by at
most one of its own per worker; the queue holds at most ``max_queued_bytes`` of jobs' bytes
(bodies, and the outputs of answers to encode; past that: 429, reason ``queue_full``). A
worker is started when a job finds none free (up to ``workers``), and a worker that dies fails
only its own job (503) and is replaced by the next. The worker (``python -m gateway.frontdoor``,
:mod:`gateway.frontdoor.__main__`) reads a frame from stdin, answers one on stdout, and exits
when stdin closes, so it never outlives the gateway.

A frame is ``<IQ`` (meta length, blob length), a pickled meta and the blob: the request's
body, or the tensors decoded. A tensor the worker sliced from the request (binary data, raw
contents) comes back as an offset into the body the gateway still holds, not as bytes. The
HTTP door's large JSON answers are encoded by the same workers (:mod:`gateway.frontdoor.encode`):
the blob is then the outputs' bytes, and the answer's JSON comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import mmap
import os
import pickle
import struct
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gateway.errors import GatewayError, InvalidRequest, Rejected, Unavailable

SLICE = 256 << 10  # bytes written to or read from a worker per loop turn: ~1 ms of copies at most
PIPE = 1 << 20  # a worker's pipes' capacity
_FRAME = struct.Struct("<IQ")
_F_SETPIPE_SZ = 1031  # fcntl: a pipe's capacity
QUEUE_FULL = "queue_full"  # the reject reason of a request past the queue's bytes
T = TypeVar("T")


class TooLarge(GatewayError):
    """A body past the front door's limit once decompressed."""

    http_status = 413


class FairQueue(Generic[T]):
    """Items waiting, one FIFO per client, taken round-robin across clients; at most
    ``max_bytes`` of them (by the size each was pushed with). Plain state, no I/O."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._fifos: dict[str, deque[tuple[T, int]]] = {}
        self._turns: deque[str] = deque()  # clients with items, in the order they are served

    def __len__(self) -> int:
        return len(self._turns)  # clients waiting: non-zero exactly when items are

    def push(self, client: str, item: T, nbytes: int) -> bool:
        """Queue ``item`` for ``client``; False (nothing queued) past ``max_bytes``."""
        if self.bytes + nbytes > self.max_bytes:
            return False
        fifo = self._fifos.get(client)
        if fifo is None:
            fifo = self._fifos[client] = deque()
            self._turns.append(client)
        fifo.append((item, nbytes))
        self.bytes += nbytes
        return True

    def pop(self) -> T | None:
        """The next client's oldest item (that client then goes last); None when empty."""
        if not self._turns:
            return None
        client = self._turns.popleft()
        fifo = self._fifos[client]
        item, nbytes = fifo.popleft()
        self.bytes -= nbytes
        if fifo:
            self._turns.append(client)
        else:
            del self._fifos[client]
        return item


Blob = bytes | memoryview | list[bytes | memoryview]  # a job's bytes: one buffer, or parts sent one after another


@dataclass(slots=True)
class _Job:
    op: str
    args: tuple
    blob: Blob
    done: asyncio.Future = field(repr=False)


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.stdin: asyncio.StreamWriter = proc.stdin  # type: ignore[assignment]
        self.stdout: asyncio.StreamReader = proc.stdout  # type: ignore[assignment]

    @classmethod
    async def start(cls) -> _Worker:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.frontdoor", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, env=env, limit=PIPE)
        return cls(proc)  # the worker sizes the pipes (:func:`serve`): uvloop's transports do not show their fds

    async def call(self, op: str, args: tuple, blob: Blob) -> tuple[Any, mmap.mmap | bytearray]:
        meta = pickle.dumps((op, args))
        parts = blob if isinstance(blob, list) else [blob]
        self.stdin.write(_FRAME.pack(len(meta), sum(len(p) for p in parts)) + meta)
        for part in parts:
            view = memoryview(part)
            for i in range(0, len(view), SLICE):
                self.stdin.write(view[i : i + SLICE])
                await self.stdin.drain()
                await asyncio.sleep(0)  # drain() yields only while the pipe is full: a fast reader never fills it
        meta_len, blob_len = _FRAME.unpack(await self.stdout.readexactly(_FRAME.size))
        answer = pickle.loads(await self.stdout.readexactly(meta_len))
        # anonymous memory, its pages zeroed by the kernel as each slice first touches them:
        # bytearray(n) would zero all of it at once, and growing one would copy it as it grows
        out = mmap.mmap(-1, blob_len) if blob_len else bytearray()
        for i in range(0, blob_len, SLICE):
            n = min(SLICE, blob_len - i)
            out[i : i + n] = await self.stdout.readexactly(n)
            await asyncio.sleep(0)  # readexactly() yields only while too little is buffered
        return answer, out

    async def stop(self) -> None:
        """Close its stdin (it exits), and kill it if it has not within a second."""
        if self.proc.returncode is None:
            self.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 1.0)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


class DecodePool:
    """Up to ``workers`` decode processes, started as jobs need them, serving a
    :class:`FairQueue` of at most ``max_queued_bytes``."""

    def __init__(self, workers: int = 1, max_queued_bytes: int = 1 << 30) -> None:
        self.workers = workers
        self.queue: FairQueue[_Job] = FairQueue(max_queued_bytes)
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._starting = 0
        self._tasks: set[asyncio.Task] = set()
        self.closed = False

    async def run(self, client: str, op: str, args: tuple, blob: Blob) -> tuple[Any, mmap.mmap | bytearray]:
        """The worker's answer to ``op(blob, *args)`` for ``client`` (see :func:`serve`); a
        list of parts reaches the worker as one blob."""
        if self.closed:
            raise Unavailable("the gateway is stopping")
        job = _Job(op, args, blob, asyncio.get_running_loop().create_future())
        nbytes = sum(len(p) for p in blob) if isinstance(blob, list) else len(blob)
        if not self.queue.push(client, job, nbytes):
            raise Rejected(f"jobs waiting for a decode worker hold {self.queue.bytes} bytes; this one's "
                           f"{nbytes} would pass {self.queue.max_bytes}", QUEUE_FULL, 1.0)
        self._pump()
        return await job.done

    def _pump(self) -> None:
        while len(self.queue):
            if not self._idle:
                if len(self._all) + self._starting < self.workers:
                    self._starting += 1
                    self._spawn(self._add_worker())
                return
            job = self.queue.pop()
            if job is None or job.done.done():  # its client is gone
                continue
            self._spawn(self._serve(self._idle.pop(), job))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _add_worker(self) -> None:
        try:
            w = await _Worker.start()
        except Exception as e:  # noqa: BLE001  (whatever keeps a worker from starting fails the jobs waiting, never strands them)
            self._starting -= 1
            while (job := self.queue.pop()) is not None:
                if not job.done.done():
                    job.done.set_exception(Unavailable(f"cannot start a decode worker: {e}"))
            return
        self._starting -= 1
        if self.closed:
            await w.stop()
            return
        self._all.add(w)
        self._idle.append(w)
        self._pump()

    async def _serve(self, w: _Worker, job: _Job) -> None:
        try:
            answer = await w.call(job.op, job.args, job.blob)
        except Exception as e:  # noqa: BLE001  (a dead worker: OSError, EOF, or uvloop's RuntimeError on a closed pipe)
            self._all.discard(w)
            self._spawn(w.stop())
            if not job.done.done():
                job.done.set_exception(Unavailable(f"the decode worker failed: {type(e).__name__}"))
        else:
            if not job.done.done():
                job.done.set_result(answer)
            self._idle.append(w)
        finally:
            self._pump()

    async def close(self) -> None:
        """Stop every worker; jobs still waiting fail (503)."""
        self.closed = True
        while (job := self.queue.pop()) is not None:
            if not job.done.done():
                job.done.set_exception(Unavailable("the gateway is stopping"))
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(w.stop() for w in self._all), return_exceptions=True)
        self._all.clear()
        self._idle.clear()


def raise_answer(answer: tuple) -> Any:
    """A worker's answer's value, or its error raised as the gateway error it stands for."""
    kind, value = answer
    if kind == "ok":
        return value
    if kind == "invalid":
        raise InvalidRequest(value)
    if kind == "too_large":
        raise TooLarge(value)
    raise GatewayError(value)


# --------------------------------------------------------------------------- the worker


def _read(stream: Any, n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def serve(ops: dict[str, Callable[..., tuple[Any, list[bytes | memoryview]]]]) -> None:
    """The worker's loop: each frame on stdin is ``ops[op](blob, *args)``, answered on stdout
    as ``("ok", value)`` and the blobs it returned, concatenated; an :class:`InvalidRequest`
    as ``("invalid", message)``, :class:`TooLarge` as ``("too_large", message)``."""
    for fd in (0, 1):  # a slice per wakeup rather than 64 KiB (Linux): both ends share the size
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE)
    src, dst = sys.stdin.buffer, sys.stdout.buffer
    while (head := _read(src, _FRAME.size)) is not None:
        meta_len, blob_len = _FRAME.unpack(head)
        meta, blob = _read(src, meta_len), _read(src, blob_len)
        if meta is None or blob is None:
            return
        op, args = pickle.loads(meta)
        parts: list[bytes | memoryview] = []
        try:
            value, parts = ops[op](blob, *args)
            answer: tuple = ("ok", value)
        except InvalidRequest as e:
            answer = ("invalid", str(e))
        except TooLarge as e:
            answer = ("too_large", str(e))
        except Exception as e:  # noqa: BLE001  (a bug answers 500; the worker goes on)
            answer = ("error", f"internal error decoding the request: {type(e).__name__}: {e}")
        out = pickle.dumps(answer)
        dst.write(_FRAME.pack(len(out), sum(len(p) for p in parts)) + out)
        for p in parts:
            dst.write(p)
        dst.flush()
