"""How fast can one ``headrace load`` process keep an open-loop schedule?

Against a trivial KServe v2 endpoint on loopback (``loadgen.testserver --raw``, run as separate
processes sharing one port), this measures:

1. the noise floor: p99 send lag at a low rate (what the machine's scheduler alone costs);
2. per HTTP client (raw keep-alive pool, aiohttp, tritonclient.http.aio) with one process, the
   highest constant open-loop rate with p99 send lag <= 1 ms and no errors ("strict"), and
   the highest rate it keeps up with on this machine: p50 send lag <= 1 ms, p99 send lag <=
   floor + 5 ms and no errors ("keeps up"; on a busy machine the p99 is the scheduler's);
   a rate that fails is tried once more (best of two), as spikes from other work are common;
   plus the loadgen's CPU time per request, whose inverse is the rate one free core sustains;
3. the same for the raw client with 2 worker processes (the multi-process mode), and for the
   raw client sending under SCHED_RR (``--realtime``, row ``raw+rt``), which takes the host
   scheduler's tick out of the send lag;
4. closed-loop peak throughput (1 and 2 processes) and Locust FastHttpUser's peak throughput
   against the same endpoint (headless, one process, bounded duration), as the comparison.

Run: ``.venv/bin/python -m bench.loadgen_capacity [--duration 3] [--quick]``.
Writes ``bench/results/loadgen_capacity.{json,md}``. Every process started here is stopped by
PID (process group). Numbers depend on the machine's load: the report records load average
and CPU count, and ratios within one run are the meaningful part.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.output import git_commit, write_results
from loadgen.clients import Answer
from loadgen.drivers import open_loop
from loadgen.run import run_load
from loadgen.spec import InputSpec, LoadSpec
from loadgen.stats import OK, Recorder
from profiles.triton.process import exit_on_sigterm, stop_group
from profiles.triton.server import free_port

RESULTS = Path(__file__).parent / "results"
LAG_LIMIT_MS = 1.0
RELATIVE_SLACK_MS = 5.0
ATTEMPTS = 2
INPUTS = (InputSpec(name="INPUT0", shape=(1, 4), datatype="FP32"),)
LADDER = (500, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 10000, 12000, 14000, 16000, 20000)


@dataclass
class Servers:
    """Trivial v2 endpoints: ``n`` raw-protocol processes sharing one port (SO_REUSEPORT)."""

    n: int = 2
    port: int = 0
    procs: list[subprocess.Popen] | None = None

    def __enter__(self) -> Servers:
        self.port = free_port()
        self.procs = []
        try:
            for _ in range(self.n):
                cmd = [sys.executable, "-m", "loadgen.testserver", "--raw", "--reuse-port",
                       "--http-port", str(self.port)]  # fmt: skip
                self.procs.append(subprocess.Popen(cmd, start_new_session=True))
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=1)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("trivial endpoint did not start") from None
                    time.sleep(0.05)
        except BaseException:
            self.__exit__()
            raise
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        for p in self.procs or []:
            stop_group(p, grace=5.0)


class TritonclientHttp:
    """The official client (tritonclient.http.aio, aiohttp underneath) behind the driver's
    ``infer`` interface, to compare per-request cost."""

    def __init__(self, url: str) -> None:
        import tritonclient.http.aio as th

        self.th = th
        self.client = th.InferenceServerClient(url.removeprefix("http://"), conn_limit=64)
        inp = th.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32), binary_data=True)
        self.inputs = [inp]

    async def infer(self, model_idx: int, deadline: float = math.inf) -> Answer:
        try:
            await self.client.infer("echo", self.inputs)
        except Exception as e:  # tritonclient raises its own exception types
            return f"error_{type(e).__name__}", None, None
        return OK, None, None

    async def close(self) -> None:
        await self.client.close()


def _spec(url: str, rate: float, duration: float, client: str, processes: int) -> LoadSpec:
    """``client`` is raw, aiohttp or tritonclient; a ``+rt`` suffix adds ``realtime``."""
    base = client.removesuffix("+rt")
    return LoadSpec(
        target=url, model="echo", rate=rate, duration_s=duration, warmup_s=1.0,
        arrival="constant", inputs=INPUTS, http_client=base if base != "tritonclient" else "raw",
        processes=processes, connections=64, lag_warn_ms=LAG_LIMIT_MS,
        realtime=client.endswith("+rt"),
    )  # fmt: skip


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (the worker processes)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


async def trial(url: str, rate: float, duration: float, client: str, processes: int) -> dict:
    spec = _spec(url, rate, duration, client, processes)
    cpu0 = _cpu()
    if client != "tritonclient":
        s = (await run_load(spec)).summary
    else:  # the same open-loop driver with the official client
        sched, dur = spec.measured(spec.schedule())
        rec = Recorder()
        tc = TritonclientHttp(url)
        loop = asyncio.get_running_loop()
        try:
            await open_loop(tc, sched, loop.time() + 0.05, spec.warmup_s, None, rec)
        finally:
            await tc.close()
        s = rec.summary(dur)
    sent = rate * (spec.warmup_s + duration)
    return {
        "cpu_s": _cpu() - cpu0,
        "sent": sent,
        "cpu_us_per_request": (_cpu() - cpu0) / sent * 1e6,
        "client": client,
        "processes": processes,
        "rate": rate,
        "offered_rps": s["offered_rps"],
        "throughput_rps": s["throughput_rps"],
        "errors": s["error_count"],
        "error_kinds": s["errors"],
        "send_lag_p50_ms": s["send_lag_ms"]["p50"],
        "send_lag_p99_ms": s["send_lag_ms"]["p99"],
        "latency_p50_ms": s["latency_ms"]["p50"],
        "latency_p99_ms": s["latency_ms"]["p99"],
    }


async def capacity(url: str, client: str, processes: int, duration: float, floor: dict,
                   ladder: tuple[int, ...]) -> dict[str, Any]:  # fmt: skip
    floor_ms = floor["send_lag_p99_ms"] or 0.0
    rows, best_strict, best_rel, misses = [], None, None, 0
    for rate in ladder:
        for attempt in range(ATTEMPTS):  # a busy machine spikes: a failed rate gets a retry
            r = await trial(url, rate, duration, client, processes)
            lag, lag50 = r["send_lag_p99_ms"] or 0.0, r["send_lag_p50_ms"] or 0.0
            r["attempt"] = attempt + 1
            r["strict_ok"] = r["errors"] == 0 and lag <= LAG_LIMIT_MS
            r["relative_ok"] = (r["errors"] == 0 and lag50 <= LAG_LIMIT_MS
                                and lag <= floor_ms + RELATIVE_SLACK_MS)  # fmt: skip
            if r["relative_ok"]:
                break
        rows.append(r)
        if r["strict_ok"]:
            best_strict = rate
        # marginal CPU per request over this config's lowest-rate trial (cancels fixed costs
        # such as probing, worker start-up and the summary)
        base = rows[0]
        r["marginal_cpu_us"] = ((r["cpu_s"] - base["cpu_s"]) / (r["sent"] - base["sent"]) * 1e6
                                if r["sent"] > base["sent"] else None)  # fmt: skip
        print(f"  {client} x{processes} @ {rate}/s: lag p50 {lag50:.2f} p99 {lag:.2f} ms, "
              f"latency p99 {r['latency_p99_ms']} ms, errors {r['errors']}, "
              f"marginal cpu {r['marginal_cpu_us'] or 0:.0f} us/req", flush=True)  # fmt: skip
        if r["relative_ok"]:
            best_rel, misses = rate, 0
        else:
            misses += 1
            if misses >= 2:
                break
    return {"client": client, "processes": processes, "strict_rate": best_strict,
            "relative_rate": best_rel, "trials": rows}  # fmt: skip


async def closed_peak(url: str, processes: int, duration: float) -> float:
    spec = LoadSpec(target=url, model="echo", mode="closed", concurrency=64, duration_s=duration,
                    warmup_s=1.0, inputs=INPUTS, processes=processes)  # fmt: skip
    return (await run_load(spec)).summary["throughput_rps"]


LOCUSTFILE = """
from locust import constant, task
from locust.contrib.fasthttp import FastHttpUser

BODY = {body!r}
HEADERS = {headers!r}


class Infer(FastHttpUser):
    wait_time = constant(0)

    @task
    def infer(self):
        self.client.post("/v2/models/echo/infer", data=BODY, headers=HEADERS)
"""


def locust_peak(url: str, duration: float, users: int = 64) -> dict[str, Any] | None:
    """Locust FastHttpUser, headless, one process, no wait time: its peak requests/s."""
    exe = shutil.which("locust", path=str(Path(sys.executable).parent))
    if exe is None:
        return None
    from loadgen.payload import http_body, parameters, synthesize

    b = http_body(
        "echo", synthesize(INPUTS, 1, np.random.default_rng(0)), parameters(None, None, True), True
    )
    with tempfile.TemporaryDirectory() as d:
        lf = Path(d) / "locustfile.py"
        lf.write_text(LOCUSTFILE.format(body=b.body, headers=dict(b.headers)))
        cmd = [exe, "-f", str(lf), "--headless", "-u", str(users), "-r", str(users), "-t",
               f"{int(duration) + 2}s", "--host", url, "--csv", str(Path(d) / "out"),
               "--only-summary", "--loglevel", "ERROR"]  # fmt: skip
        p = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            p.wait(timeout=duration + 60)
        except subprocess.TimeoutExpired:
            pass
        finally:
            stop_group(p, grace=5.0)
        stats = Path(d) / "out_stats.csv"
        if not stats.exists():
            return None
        for row in csv.DictReader(stats.open()):
            if row["Name"] == "Aggregated":
                return {
                    "requests": int(row["Request Count"]),
                    "failures": int(row["Failure Count"]),
                    "rps": float(row["Requests/s"]),
                    "p50_ms": float(row["50%"]),
                    "p99_ms": float(row["99%"]),
                    "users": users,
                }
    return None


def conditions() -> dict[str, Any]:
    sha = git_commit()
    return {
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git": sha,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


async def main_async(a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"conditions": conditions(), "lag_limit_ms": LAG_LIMIT_MS}
    ladder = LADDER[::2] if a.quick else LADDER
    with Servers(n=a.servers) as srv:
        floor = await trial(srv.url, 200, a.duration, "raw", 1)
        floor_ms = floor["send_lag_p99_ms"] or 0.0
        out["noise_floor"] = floor
        print(f"noise floor: p99 send lag {floor_ms:.2f} ms at 200/s", flush=True)
        configs = [("raw", 1), ("aiohttp", 1), ("tritonclient", 1), ("raw", 2)]
        if a.realtime:
            configs.append(("raw+rt", 1))
        out["open_loop"] = [await capacity(srv.url, c, p, a.duration, floor, ladder)
                            for c, p in configs]  # fmt: skip
        out["closed_loop_peak_rps"] = {
            "1 process": await closed_peak(srv.url, 1, a.duration),
            "2 processes": await closed_peak(srv.url, 2, a.duration),
        }
        print(f"closed loop peak: {out['closed_loop_peak_rps']}", flush=True)
        out["locust_fasthttpuser"] = locust_peak(srv.url, a.duration + 2)
        print(f"locust: {out['locust_fasthttpuser']}", flush=True)
    out["conditions"]["loadavg_end"] = os.getloadavg()
    return out


def markdown(r: dict[str, Any]) -> str:
    c = r["conditions"]
    lines = [
        "# loadgen capacity (one command: `.venv/bin/python -m bench.loadgen_capacity`)",
        "",
        f"Machine: {c['cpus']} CPUs, load average {c['loadavg_start'][0]:.2f} at start and "
        f"{c['loadavg_end'][0]:.2f} at end (other work shares these cores), Python "
        f"{c['python']}, git {c['git']}, {c['when']}. Endpoint: trivial v2 server "
        "(raw asyncio, fixed answer) on loopback, constant-rate open loop, 1 s warm-up.",
        "",
        f"Noise floor (raw client at 200 req/s): p99 send lag "
        f"{r['noise_floor']['send_lag_p99_ms']:.2f} ms.",
        "",
        "| client | processes | highest rate, p99 lag <= 1 ms | highest rate it keeps up "
        "(p50 lag <= 1 ms, p99 <= floor + 5 ms) |",
        "|---|---|---|---|",
    ]
    for o in r["open_loop"]:
        lines.append(f"| {o['client']} | {o['processes']} | {o['strict_rate'] or '-'} | "
                     f"{o['relative_rate'] or '-'} |")  # fmt: skip
    lines += ["", "On a shared machine the p99 send lag is set by the OS scheduler (see the noise "
              "floor) and varies a lot from run to run; compare rows of one run, and re-run on a "
              "quiet machine for absolute numbers. The top of the rate ladder is "
              f"{max(LADDER)}/s."]  # fmt: skip
    cl = r["closed_loop_peak_rps"]
    lo = r["locust_fasthttpuser"]
    lines += ["", "Peak throughput, closed loop (64 in flight):", "",
              "| tool | req/s |", "|---|---|"]  # fmt: skip
    for k, v in cl.items():
        lines.append(f"| headrace load --mode closed, {k} | {v:.0f} |")
    if lo:
        lines.append(f"| Locust FastHttpUser, 1 process, {lo['users']} users | {lo['rps']:.0f} |")
        ratio = cl["1 process"] / lo["rps"] if lo["rps"] else float("nan")
        lines += ["", f"headrace closed loop / Locust (1 process each): {ratio:.2f}x. "
                  "Locust has no open-loop mode: it cannot say whether a schedule was kept."]  # fmt: skip
    else:
        lines += ["", "Locust was not available (pip install locust) or did not report."]
    base = next((o for o in r["open_loop"] if o["client"] == "raw" and o["processes"] == 1), None)
    for o in r["open_loop"]:
        if base and o is not base and base["relative_rate"] and o["relative_rate"]:
            lines.append(f"- {o['client']} x{o['processes']} / raw x1 (relative criterion): "
                         f"{o['relative_rate'] / base['relative_rate']:.2f}x")  # fmt: skip
    lines += [
        "",
        "Every trial (rate: p50 / p99 send lag ms, p99 latency ms, errors, marginal loadgen "
        "CPU us/request over the first trial; the last of up to two attempts):",
        "",
    ]
    for o in r["open_loop"]:
        t = "; ".join(f"{x['rate']}: {x['send_lag_p50_ms'] or 0:.2f} / {x['send_lag_p99_ms'] or 0:.2f}, "
                      f"{x['latency_p99_ms'] or 0:.1f}, {x['errors']}, {x['marginal_cpu_us'] or 0:.0f}"
                      for x in o["trials"])  # fmt: skip
        lines.append(f"- {o['client']} x{o['processes']}: {t}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=3.0, help="measured seconds per trial")
    ap.add_argument("--servers", type=int, default=2, help="trivial endpoint processes")
    ap.add_argument("--quick", action="store_true", help="every other rate of the ladder")
    ap.add_argument("--no-realtime", dest="realtime", action="store_false",
                    help="skip the raw+rt row (raw client under SCHED_RR, needs root)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--markdown-only", action="store_true", help="re-render the .md from the .json")
    a = ap.parse_args()
    if a.markdown_only:
        md = markdown(json.loads((a.out / "loadgen_capacity.json").read_text()))
        (a.out / "loadgen_capacity.md").write_text(md)
        print(md)
        return
    exit_on_sigterm()  # what it started is stopped on the way out
    r = asyncio.run(main_async(a))
    md = markdown(r)
    write_results(a.out, "loadgen_capacity", r, md)
    print(md)


if __name__ == "__main__":
    main()
