"""Run one load test from a :class:`~loadgen.spec.LoadSpec`: probe the target, build the
requests, drive the open or closed loop in this process or in worker processes (each with an
interleaved share of the schedule; their recorders merge exactly), and summarize.

In-process API::

    result = await run_load(LoadSpec(target="grpc://127.0.0.1:8001", model="m", rate=500))
    result.summary["attainment"], result.summary["latency_ms"]["p99"]
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadgen import payload, tls
from loadgen.arrivals import Schedule
from loadgen.clients import (
    AiohttpClient,
    Client,
    GrpcClient,
    LoadError,
    RawHttpClient,
    probe_grpc,
    probe_http,
)
from loadgen.describe import arrival_name
from loadgen.drivers import CLOSED_LOOP_NOTE, Progress, closed_loop, open_loop
from loadgen.live import LiveMeter, LiveWindow
from loadgen.record import run_record
from loadgen.spec import LoadSpec, parse_target
from loadgen.stats import Recorder

# sent, done, total (None: unknown), the last closed live window (None before the first)
ProgressFn = Callable[[int, int, "int | None", "LiveWindow | None"], None]
LIVE_WINDOW_S = 1.0
START_DELAY_S = 0.05  # between computing t0 and the first send (single process)
WORKER_START_DELAY_S = 0.3


@dataclass
class Prepared:
    """What every process needs to send: per model, the encoded requests it sends in turn
    (one, unless the payloads come from a data set)."""

    scheme: str
    host: str
    port: int
    models: tuple[str, ...]
    http: list[list[payload.HttpBody]] = field(default_factory=list)
    grpc: list[list[bytes]] = field(default_factory=list)


@dataclass
class LoadResult:
    spec: LoadSpec
    summary: dict[str, Any]
    recorder: Recorder
    duration_s: float  # measured period
    elapsed_s: float  # wall time of the whole run
    warnings: list[str]

    @property
    def fell_behind(self) -> bool:
        return bool(self.summary["fell_behind"])


async def prepare(spec: LoadSpec) -> Prepared:
    scheme, host, port = parse_target(spec.target)
    models = spec.models
    need_meta = spec.inputs is None and spec.input_file is None
    keys = {m: tls.auth_pairs(spec.key_for(m)) for m in models}
    if scheme == "http":
        meta = await probe_http(host, port, models if need_meta else (), ssl=tls.ssl_context(spec),
                                keys=keys)  # fmt: skip
    else:
        meta = await probe_grpc(host, port, models if need_meta else (),
                                credentials=tls.grpc_credentials(spec), keys=keys)  # fmt: skip
    rng = np.random.default_rng(spec.seed)
    prep = Prepared(scheme, host, port, models)
    params = payload.parameters(spec.slo_ms, spec.priority, spec.send_timeout)
    for m in models:
        declared = spec.inputs or (None if m not in meta else payload.inputs_from_metadata(meta[m], m))
        if spec.input_file is not None:
            requests = [payload.read_input_file(spec.input_file)]
        elif spec.input_dir is not None:
            requests = payload.read_input_dir(spec.input_dir, declared)
        elif spec.dataset == "digits":
            requests = payload.digits_requests(declared, spec.batch)
        else:
            assert declared is not None
            requests = [payload.synthesize(declared, spec.batch, rng)]
        if scheme == "http":
            binary = spec.protocol == "binary"
            auth = tuple((k.title(), v) for k, v in keys[m])
            prep.http.append([payload.http_body(m, t, params, binary, auth) for t in requests])
        else:
            prep.grpc.append([payload.grpc_request(m, t, params) for t in requests])
    return prep


def make_client(spec: LoadSpec, prep: Prepared) -> Client:
    if prep.scheme == "grpc":
        metadata = [tls.auth_pairs(spec.key_for(m)) for m in prep.models]
        return GrpcClient(prep.host, prep.port, prep.grpc, spec.request_timeout_s,
                          tls.grpc_credentials(spec), metadata)  # fmt: skip
    cls = RawHttpClient if spec.http_client == "raw" else AiohttpClient
    return cls(prep.host, prep.port, prep.http, spec.connections, spec.request_timeout_s,
               tls.ssl_context(spec))  # fmt: skip


def _picker(spec: LoadSpec, worker: int) -> Callable[[], int]:
    if not spec.mix:
        return lambda: 0
    from loadgen.arrivals import parse_mix

    w = np.array([w for _, w in parse_mix(spec.mix)])
    rng = np.random.default_rng([spec.seed, worker])
    p = w / w.sum()
    return lambda: int(rng.choice(len(p), p=p))


async def _drive(
    spec: LoadSpec,
    prep: Prepared,
    share: Schedule | None,
    worker: int,
    workers: int,
    t0: float,
    rec: Recorder,
    prog: Progress,
) -> float:
    """One process's part of the run; returns the measured duration (closed loop)."""
    client = make_client(spec, prep)
    slo_s = spec.slo_ms / 1e3 if spec.slo_ms else None
    restore = _go_realtime() if spec.realtime else None
    try:
        if spec.mode == "open":
            assert share is not None
            await open_loop(
                client, share, t0, spec.warmup_s, slo_s, rec, prog,
                timeout_s=spec.request_timeout_s,
            )  # fmt: skip
            return 0.0
        conc = spec.concurrency // workers + (1 if worker < spec.concurrency % workers else 0)
        reqs = None
        if spec.requests is not None:
            reqs = spec.requests // workers + (1 if worker < spec.requests % workers else 0)
        end = None if reqs is not None else spec.warmup_s + spec.duration_s
        return await closed_loop(
            client, conc, prep.models, _picker(spec, worker), t0, spec.warmup_s, end, reqs,
            slo_s, rec, prog, timeout_s=spec.request_timeout_s,
        )  # fmt: skip
    finally:
        if restore is not None:
            os.sched_setscheduler(0, *restore)
        await client.close()


def _go_realtime() -> tuple[int, os.sched_param]:
    """Put this thread (the event loop's) under SCHED_RR priority 1; returns how to undo it.
    The kernel keeps 5% of each period for other work (sched_rt_runtime_us)."""
    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    except PermissionError:
        raise LoadError("--realtime needs root or CAP_SYS_NICE (SCHED_RR)") from None
    return before


async def run_load(spec: LoadSpec, on_progress: ProgressFn | None = None) -> LoadResult:
    """Run the test described by ``spec``. Raises :class:`LoadError` when it cannot start."""
    started = time.monotonic()
    sched, duration = (None, spec.duration_s)
    total: int | None = None
    if spec.mode == "open":  # before touching the target: bad traces fail fast
        sched, duration = spec.measured(spec.schedule())
        if not len(sched):
            raise LoadError("the arrival schedule is empty: raise the rate or the duration")
        total = len(sched)
    prep = await prepare(spec)
    rec = Recorder(spec.window_s)
    with quiet_gc():
        if spec.processes == 1:
            duration = await _single(spec, prep, sched, rec, duration, total, on_progress)
        else:
            duration = await _multi(spec, prep, sched, rec, duration, total, on_progress)
    return _result(spec, rec, duration, time.monotonic() - started)


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Collect once, then move every object alive into the permanent generation for the run:
    the collector's full passes then walk only what the run itself allocates, instead of a
    long-lived heap (schedules, earlier results) in the middle of the send schedule."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def _single(spec, prep, sched, rec, duration, total, on_progress) -> float:
    loop = asyncio.get_running_loop()
    prog = Progress(live=on_progress is not None)
    t0 = loop.time() + START_DELAY_S
    meter = LiveMeter(LIVE_WINDOW_S, spec.slo_ms is not None, start=t0)
    ticker = None
    if on_progress is not None:

        async def tick() -> None:
            while True:
                meter.add(*prog.take())
                on_progress(prog.sent, prog.done, total, meter.roll(loop.time()))
                await asyncio.sleep(0.25)

        ticker = loop.create_task(tick())
    try:
        closed = await _drive(spec, prep, sched, 0, 1, t0, rec, prog)
    finally:
        if ticker is not None:
            ticker.cancel()
            on_progress(prog.sent, prog.done, total, meter.last)
    return duration if spec.mode == "open" else closed


def _frame(kind: bytes, obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return kind + len(data).to_bytes(8, "little") + data


async def _read_frame(stream: asyncio.StreamReader) -> tuple[bytes, Any]:
    head = await stream.readexactly(9)
    return head[:1], pickle.loads(await stream.readexactly(int.from_bytes(head[1:], "little")))


def worker_main() -> None:
    """Worker process (``python -m loadgen.run``): read its job from stdin, say ready, read
    t0, run, and write progress and the encoded recorder as frames on stdout."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints go to stderr, never into the frames
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer

    def send(kind: bytes, obj: Any) -> None:
        out.write(_frame(kind, obj))
        out.flush()

    def recv() -> Any:
        n = int.from_bytes(inp.read(8), "little")
        return pickle.loads(inp.read(n))

    try:
        spec_json, prep, share, worker, workers = recv()
        spec = LoadSpec.model_validate_json(spec_json)
        rec = Recorder(spec.window_s)
        prog = Progress(live=True)

        async def main() -> float:
            loop = asyncio.get_running_loop()
            send(b"R", None)
            t0 = await loop.run_in_executor(None, recv)

            async def publish() -> None:
                while True:
                    send(b"P", (prog.sent, prog.done, prog.take()))
                    await asyncio.sleep(0.2)

            async def watch_parent() -> None:  # an orphaned worker stops at once
                parent = os.getppid()
                while os.getppid() == parent:
                    await asyncio.sleep(0.5)
                os._exit(3)

            pub = loop.create_task(publish())
            watch = loop.create_task(watch_parent())
            try:
                return await _drive(spec, prep, share, worker, workers, t0, rec, prog)
            finally:
                pub.cancel()
                watch.cancel()
                send(b"P", (prog.sent, prog.done, prog.take()))

        measured = asyncio.run(main())
        send(b"D", (rec.encode(), measured))
    except BaseException as e:  # the parent turns this into a LoadError
        send(b"E", f"{type(e).__name__}: {e}")


def _to_worker(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(8, "little") + data


async def _multi(spec, prep, sched, rec, duration, total, on_progress) -> float:
    n = spec.processes
    procs: list[asyncio.subprocess.Process] = []
    counts = [[0, 0] for _ in range(n)]
    meter = LiveMeter(LIVE_WINDOW_S, spec.slo_ms is not None, start=float("inf"))

    def report() -> None:
        if on_progress is not None:
            live = meter.roll(time.monotonic())
            on_progress(sum(c[0] for c in counts), sum(c[1] for c in counts), total, live)

    async def next_frame(i: int, timeout: float | None = None) -> tuple[bytes, Any]:
        while True:
            try:
                kind, val = await asyncio.wait_for(_read_frame(procs[i].stdout), timeout)
            except asyncio.IncompleteReadError:
                code = await procs[i].wait()
                raise LoadError(f"worker {i} died (exit code {code})") from None
            except TimeoutError:
                raise LoadError(f"worker {i} did not answer within {timeout:g} s") from None
            if kind == b"P":
                counts[i] = list(val[:2])
                meter.add(*val[2])
                report()
                continue
            if kind == b"E":
                raise LoadError(f"worker {i} failed: {val}")
            return kind, val

    try:
        for i in range(n):
            p = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "loadgen.run",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                start_new_session=True,
            )  # fmt: skip
            procs.append(p)
            share = sched.share(i, n) if sched is not None else None
            p.stdin.write(_to_worker((spec.model_dump_json(), prep, share, i, n)))
        for i in range(n):
            await next_frame(i, 60.0)  # ready
        t0 = time.monotonic() + WORKER_START_DELAY_S
        meter.start = t0  # windows count from the first send, not from the workers' start-up
        for p in procs:
            p.stdin.write(_to_worker(t0))
            await p.stdin.drain()
        results = await asyncio.gather(*(next_frame(i) for i in range(n)))
        measured = []
        for _, (encoded, m) in results:
            rec.merge(encoded)
            measured.append(m)
        report()
        return duration if spec.mode == "open" else max(measured)
    finally:
        for p in procs:
            if p.returncode is None:
                try:
                    await asyncio.wait_for(p.wait(), 2.0)
                except TimeoutError:
                    os.killpg(p.pid, signal.SIGKILL)  # its own process group, by PID
                    await p.wait()


def _result(spec: LoadSpec, rec: Recorder, duration: float, elapsed: float) -> LoadResult:
    slo_s = spec.slo_ms / 1e3 if spec.slo_ms else None
    summary = rec.summary(duration, slo_s)
    warnings: list[str] = []
    lag = summary["send_lag_ms"]["p99"] or 0.0
    lag50 = summary["send_lag_ms"]["p50"] or 0.0
    behind = spec.mode == "open" and lag > spec.lag_warn_ms
    if behind and lag50 > spec.lag_warn_ms:
        warnings.append(
            f"the load generator cannot keep the schedule: send lag p50 {lag50:.2f} ms, p99 "
            f"{lag:.2f} ms > {spec.lag_warn_ms:g} ms (latencies still count from the schedule); "
            f"use more --processes or a lower rate"
        )
    elif behind:
        warnings.append(
            f"the load generator fell behind its schedule at times: send lag p99 {lag:.2f} ms > "
            f"{spec.lag_warn_ms:g} ms but p50 {lag50:.2f} ms (stalls such as a busy CPU; "
            f"latencies still count from the schedule)"
        )
    pool = pool_warning(summary, spec)
    summary["pool_saturated"] = pool is not None
    if pool is not None:
        warnings.append(pool)
    if summary["error_count"]:
        kinds = ", ".join(f"{k} x{v}" for k, v in summary["errors"].items())
        warnings.append(f"{summary['error_count']} requests failed: {kinds}")
    if summary["offered"] == 0:
        warnings.append("no request was measured (is the duration shorter than one arrival gap?)")
    if spec.mode == "closed":
        warnings.append(CLOSED_LOOP_NOTE)
    summary.update(
        {
            "target": spec.target,
            "mode": spec.mode,
            "arrival": arrival_name(spec),
            "rate": spec.rate if spec.mode == "open" and spec.arrival not in ("trace",) else None,
            "concurrency": spec.concurrency if spec.mode == "closed" else None,
            "processes": spec.processes,
            "duration_s": duration,
            "window_s": spec.window_s,
            "elapsed_s": elapsed,
            "fell_behind": behind,
            "warnings": warnings,
            "run": run_record(spec),
        }
    )
    return LoadResult(spec, summary, rec, duration, elapsed, warnings)


POOL_WARN_FRACTION = 0.1  # of the SLO (or, without one, of the latency p99)
POOL_WARN_FLOOR_MS = 1.0  # waits below this are noise, whatever the SLO


def pool_warning(summary: dict[str, Any], spec: LoadSpec) -> str | None:
    """A warning when the client's own connection pool is the bottleneck, else None.

    The pool is saturated when the 99th percentile of the time requests waited for a free
    connection exceeds ``POOL_WARN_FRACTION`` of the SLO (without an SLO: of the latency
    p99) and ``POOL_WARN_FLOOR_MS``. At that point a tenth of the latency budget is spent queued
    inside the load generator, not in the server: latencies (still counted from the scheduled
    send) describe the client, and the fix is more connections or processes."""
    pool = summary.get("pool_wait_ms")
    if not pool or pool["p99"] is None:
        return None
    lat99 = summary["latency_ms"]["p99"]
    ref, what = (spec.slo_ms, f"the {spec.slo_ms:g} ms SLO") if spec.slo_ms else (lat99, "p99")
    if ref is None:
        return None
    limit = max(POOL_WARN_FRACTION * ref, POOL_WARN_FLOOR_MS)
    if pool["p99"] <= limit:
        return None
    return (
        f"the client's connection pool is the bottleneck: {pool['queued_share']:.0%} of requests "
        f"waited for one of its {spec.connections} connections per process, pool wait p50 "
        f"{pool['p50']:.2f} ms p99 {pool['p99']:.2f} ms (> {POOL_WARN_FRACTION:.0%} of {what}); "
        f"latencies include that wait: raise --connections or --processes"
    )


def run_load_sync(spec: LoadSpec, on_progress: ProgressFn | None = None) -> LoadResult:
    """``run_load`` for callers without an event loop."""
    return asyncio.run(run_load(spec, on_progress))


if __name__ == "__main__":
    worker_main()
