"""Throughput of 1, 2 and 4 gateway processes (``headrace serve --workers N``) in front of one
trivial fleet, and the CPU each process spends per request, which predicts the throughput a
host with a free core per worker reaches.

The fleet is four replicas of ``bench.echo_backend`` (one process, four ports: answers rows at
once, so the gateway's own cost shows). ``headrace load`` (closed loop, raw HTTP client, in this
process) keeps ``--concurrency`` requests in flight over as many connections; the kernel spreads
them over the workers. In the same run:

- the floor: the load generator straight at one echo backend (what the client and the backend
  alone reach on this host, with no gateway);
- N = 1, 2, 4 workers, interleaved over ``--rounds``: requests/s, and per process the CPU
  seconds per request (gateway workers, the supervising parent, the backend, the load
  generator), read from /proc;
- the hop: the same load through ``bench.relay`` (a bare TCP relay, parsing nothing) in front
  of one gateway: the least any forwarding between workers costs a request.

The prediction for a host with the cores: with a core per worker, throughput is bounded by the
busiest worker reaching one core, i.e. requests / max(worker CPU seconds) per second of a
trial. Its ratio at N = 2 against N = 1 is what the 1.8x target is checked against when this
host lacks the cores (it has ``os.cpu_count()`` shared by everything above).

    .venv/bin/python -m bench.gateway_scaleout [--duration 5] [--rounds 2] [--concurrency 64]

Writes bench/results/gateway_scaleout.{json,md}. Run under ``flock /tmp/headrace-bench.lock``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from bench.gateway_overhead import cpu_seconds, start_floor
from bench.host import cpu_times, steal_share
from bench.output import write_results
from loadgen.run import run_load
from loadgen.spec import InputSpec, LoadSpec
from profiles.profile import LatencyPoint, Profile, Provenance, save_profiles
from profiles.triton.process import exit_on_sigterm, stop_group, wait_http_ready
from profiles.triton.server import free_port

RESULTS = Path(__file__).parent / "results"
REPLICAS = 4
INPUTS = (InputSpec(name="INPUT0", shape=(1, 4), datatype="FP32"),)
TARGET_RATIO = 1.8


class Serve:
    """``headrace serve --workers N`` in its own process group; its worker pids from its output."""

    def __init__(self, cfg: Path, n: int, http_port: int, grpc_port: int) -> None:
        self.n = n
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "serve", "--config", str(cfg), "--workers", str(n),
             "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--log-level", "WARNING"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        try:
            why = wait_http_ready(f"127.0.0.1:{http_port}", self.proc, 60.0)
            deadline = time.monotonic() + 60.0
            while why is None and n > 1 and not any(f"{n} workers" in x for x in self.lines):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    why = "workers did not all start"
                time.sleep(0.05)
            if why is not None:
                raise RuntimeError(f"headrace serve --workers {n}: {why}:\n" + "\n".join(self.lines[-20:]))
        except BaseException:
            stop_group(self.proc)
            raise

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def metrics_urls(self, http_port: int) -> list[str]:
        """Each worker's /metrics (one process: on its HTTP port)."""
        if self.n == 1:
            return [f"http://127.0.0.1:{http_port}/metrics"]
        urls = {}
        for line in self.lines:
            f = line.split()
            if line.startswith("headrace gateway: worker ") and len(f) > 7 and f[6] == "metrics":
                urls[int(f[3])] = f"http://{f[7]}/metrics"
        return [urls[i] for i in sorted(urls)]

    def wait_for(self, text: str, timeout: float = 60.0, after: int = 0) -> str:
        """The first output line from ``after`` on that contains ``text``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines[after:]:
                if text in line:
                    return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} in the output:\n" + "\n".join(self.lines))

    def pids(self) -> dict[int, int]:
        """Worker index -> its latest pid, from the parent's lines."""
        out = {}
        for line in self.lines:
            f = line.split()
            if line.startswith("headrace gateway: worker ") and len(f) > 5 and f[4] == "pid":
                out[int(f[3])] = int(f[5])
        return out

    def worker_pids(self) -> list[int]:
        if self.n == 1:
            return [self.proc.pid]
        pids = self.pids()
        return [pids[i] for i in sorted(pids)]


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def scrape(url: str) -> tuple[float, float, float]:
    """A gateway's answered requests, batches and batched rows so far, from its /metrics."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    got = {"headrace_request_duration_seconds_count": 0.0, "headrace_batch_size_count": 0.0,
           "headrace_batch_size_sum": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in got:
            got[name] += float(line.rsplit(" ", 1)[1])
    return (got["headrace_request_duration_seconds_count"], got["headrace_batch_size_count"],
            got["headrace_batch_size_sum"])


def trial(url: str, duration: float, concurrency: int, pids: dict[str, list[int]],
          metrics: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """Closed loop at ``url`` for ``duration`` s; CPU seconds of each named group of processes
    and, from each gateway's ``metrics`` URL, its requests and batches."""
    spec = LoadSpec(target=url, model="echo", mode="closed", concurrency=concurrency, connections=concurrency,
                    duration_s=duration, warmup_s=0.0, inputs=INPUTS, processes=1)
    seen = [scrape(m) for m in metrics]
    before = {k: [cpu_seconds(p) for p in ps] for k, ps in pids.items()}
    me, stat0, t0 = _self_cpu(), cpu_times(), time.monotonic()
    s = asyncio.run(run_load(spec)).summary
    wall, stat1 = time.monotonic() - t0, cpu_times()
    cpu = {k: [cpu_seconds(p) - b for p, b in zip(ps, before[k], strict=True)] for k, ps in pids.items()}
    cpu["load generator"] = [_self_cpu() - me]
    n = s["throughput_rps"] * duration
    out = {
        "throughput_rps": s["throughput_rps"], "requests": n, "errors": s["error_count"], "wall_s": wall,
        "latency_p50_ms": s["latency_ms"]["p50"], "latency_p99_ms": s["latency_ms"]["p99"],
        "cpu_s": cpu, "steal_share": steal_share(stat0, stat1),
        "cpu_us_per_request": {k: [c / n * 1e6 for c in v] for k, v in cpu.items()} if n else {},
        "cores_busy": sum(sum(v) for v in cpu.values()) / duration,
    }
    if metrics:
        now = [scrape(m) for m in metrics]
        reqs = [a[0] - b[0] for a, b in zip(now, seen, strict=True)]
        out["worker_requests"] = [round(x) for x in reqs]
        out["worker_mean_batch"] = [round((a[2] - b[2]) / max(1.0, a[1] - b[1]), 2) for a, b in zip(now, seen, strict=True)]
        out["worker_cpu_us_per_own_request"] = [c / max(1.0, r) * 1e6 for c, r in zip(cpu["gateway"], reqs, strict=True)]
    if "gateway" in cpu and n:
        # a core per worker: the busiest worker at one core bounds the throughput
        out["predicted_rps_core_per_worker"] = n / max(cpu["gateway"])
        out["gateway_cpu_us_per_request"] = sum(cpu["gateway"]) / n * 1e6
    return out


SPIN = "import sys\nn = int(sys.argv[1])\nx = 0\nfor i in range(n):\n    x += i * i\n"


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def spin_floor(k: int, iterations: int = 10_000_000) -> dict[str, float]:
    """``k`` processes each running the same pure-Python loop at once: units of work per wall
    second in all and CPU seconds per unit. Two at once against one is what this host gives a
    second busy process (two vCPUs that are hyperthreads of one core give well under 2x)."""
    c0, t0 = _children_cpu(), time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(iterations)]) for _ in range(k)]
    for p in procs:
        p.wait()
    wall = time.monotonic() - t0
    return {"processes": k, "wall_s": wall, "units_per_s": k / wall, "cpu_s_per_unit": (_children_cpu() - c0) / k}


def write_fleet(work: Path, ports: list[int]) -> Path:
    prof = Profile("echo", "echo", "CPU", "cpu", 8, (LatencyPoint(1, 2e-4, 1e-3), LatencyPoint(8, 3e-4, 1.5e-3)),
                   provenance=Provenance("bench.gateway_scaleout: bench.echo_backend on loopback", "measured"))
    save_profiles(work / "echo.yaml", [prof])
    cfg = {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0}, "drain_timeout_s": 2,
           "models": [{"name": "echo", "slo_ms": 1000, "max_batch": 8, "replicas": [
               {"url": f"127.0.0.1:{p}", "variant": "echo", "profile": "echo.yaml"} for p in ports]}]}
    (work / "gateway.yaml").write_text(yaml.safe_dump(cfg))
    return work / "gateway.yaml"


def run(duration: float, rounds: int, concurrency: int, counts: tuple[int, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version(), "duration_s": duration,
                           "concurrency": concurrency, "replicas": REPLICAS, "load_avg_before": os.getloadavg()}
    spins = []
    for _ in range(rounds):  # the host's own scaling floor: one busy process, then two at once
        one, two = spin_floor(1), spin_floor(2)
        spins.append({"one": one, "two": two, "ratio": two["units_per_s"] / one["units_per_s"],
                      "cpu_per_unit_ratio": two["cpu_s_per_unit"] / one["cpu_s_per_unit"]})
    out["spin_floor"] = spins
    print(f"host floor: two busy processes at once do {[round(x['ratio'], 2) for x in spins]}x one", flush=True)
    ports = [free_port() for _ in range(REPLICAS)]
    with tempfile.TemporaryDirectory(prefix="hr-scaleout-") as tmp:
        cfg = write_fleet(Path(tmp), ports)
        backend = subprocess.Popen([sys.executable, "-m", "bench.echo_backend", *map(str, ports)],
                                   start_new_session=True)
        try:
            why = wait_http_ready(f"127.0.0.1:{ports[-1]}", backend, 30.0)
            if why is not None:
                raise RuntimeError(f"echo backend {why}")
            out["floor"] = [trial(f"http://127.0.0.1:{ports[0]}", duration, concurrency,
                                  {"backend": [backend.pid]}) for _ in range(rounds)]
            print(f"floor (no gateway): {[round(t['throughput_rps']) for t in out['floor']]} req/s", flush=True)
            runs: dict[int, list[dict]] = {n: [] for n in counts}
            hops: list[dict] = []
            for r in range(rounds):
                for n in counts:
                    hp, gp = free_port(), free_port()
                    serve = Serve(cfg, n, hp, gp)
                    try:
                        pids = {"gateway": serve.worker_pids(), "backend": [backend.pid]}
                        if n > 1:
                            pids["parent"] = [serve.proc.pid]
                        trial(f"http://127.0.0.1:{hp}", 1.0, concurrency, pids)  # warm-up
                        t = trial(f"http://127.0.0.1:{hp}", duration, concurrency, pids, serve.metrics_urls(hp))
                        runs[n].append(t)
                        print(f"round {r + 1}: {n} gateway process(es): {t['throughput_rps']:.0f} req/s, gateway "
                              f"{t['gateway_cpu_us_per_request']:.0f} us CPU/request, predicted with a core each "
                              f"{t['predicted_rps_core_per_worker']:.0f} req/s; per worker: requests "
                              f"{t['worker_requests']}, mean batch {t['worker_mean_batch']}", flush=True)
                        if n == 1:  # the hop: a bare relay in front of the same gateway
                            rp = free_port()
                            relay = start_floor("bench.relay", rp, f"127.0.0.1:{hp}")
                            try:
                                pids["relay"] = [relay.pid]
                                h = trial(f"http://127.0.0.1:{rp}", duration, concurrency, pids)
                                hops.append(h)
                                print(f"round {r + 1}: relay -> 1 gateway: {h['throughput_rps']:.0f} req/s, relay "
                                      f"{h['cpu_us_per_request']['relay'][0]:.0f} us CPU/request", flush=True)
                            finally:
                                stop_group(relay, grace=5)
                    finally:
                        stop_group(serve.proc, grace=10)
            out["gateways"] = {str(n): v for n, v in runs.items()}
            out["hop"] = hops
        finally:
            stop_group(backend, grace=5)
    out["summary"] = summarize(out, counts)
    return out


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(out: dict[str, Any], counts: tuple[int, ...]) -> dict[str, Any]:
    s: dict[str, Any] = {"floor_rps": max(t["throughput_rps"] for t in out["floor"]),
                         "host_two_process_ratio": _med([x["ratio"] for x in out["spin_floor"]]),
                         "host_cpu_per_unit_ratio": _med([x["cpu_per_unit_ratio"] for x in out["spin_floor"]])}
    per: dict[str, Any] = {}
    for n in counts:
        ts = out["gateways"][str(n)]
        per[str(n)] = {
            "throughput_rps": _med([t["throughput_rps"] for t in ts]),
            "gateway_cpu_us_per_request": _med([t["gateway_cpu_us_per_request"] for t in ts]),
            "worker_cpu_us_per_request": [_med(list(x)) for x in zip(*(t["cpu_us_per_request"]["gateway"] for t in ts),
                                                                      strict=True)],
            "backend_cpu_us_per_request": _med([t["cpu_us_per_request"]["backend"][0] for t in ts]),
            "loadgen_cpu_us_per_request": _med([t["cpu_us_per_request"]["load generator"][0] for t in ts]),
            "predicted_rps_core_per_worker": _med([t["predicted_rps_core_per_worker"] for t in ts]),
            "cores_busy": _med([t["cores_busy"] for t in ts]),
            "worker_mean_batch": [_med(list(x)) for x in zip(*(t["worker_mean_batch"] for t in ts), strict=True)],
            "worker_request_share": [_med([r / max(1, sum(t["worker_requests"])) for t in ts for r in
                                           [t["worker_requests"][i]]]) for i in range(int(n))],
            "errors": sum(t["errors"] for t in ts),
        }
    s["per_count"] = per
    one = per[str(counts[0])]
    s["measured_ratio"] = {n: per[n]["throughput_rps"] / one["throughput_rps"] for n in per}
    s["predicted_ratio"] = {n: per[n]["predicted_rps_core_per_worker"] / one["predicted_rps_core_per_worker"]
                            for n in per}
    if out["hop"]:
        relay = _med([h["cpu_us_per_request"]["relay"][0] for h in out["hop"]])
        s["relay_cpu_us_per_request"] = relay
        s["relay_share_of_gateway"] = relay / one["gateway_cpu_us_per_request"]
    return s


def markdown(res: dict[str, Any]) -> str:
    s = res["summary"]
    per = s["per_count"]
    lines = [
        "# Gateway scale-out: 1, 2 and 4 gateway processes (`headrace serve --workers N`)", "",
        f"{res['cpus']} CPUs shared by everything below: the load generator (`headrace load`, closed loop, "
        f"{res['concurrency']} in flight over as many connections, raw HTTP client), the gateway processes and "
        f"the trivial backend (`bench.echo_backend`, {res['replicas']} replicas in one process, answering at once). "
        f"{res['duration_s']:g} s per trial, counts interleaved over {len(res['gateways'][next(iter(per))])} rounds "
        "(medians). CPU from /proc per process.", "",
        f"Floor of this host with no gateway (load generator -> backend): {s['floor_rps']:.0f} req/s.", "",
        f"Floor of this host for any two busy processes: the same pure-Python loop in two processes at once does "
        f"{s['host_two_process_ratio']:.2f}x the work per second of one alone, each spending "
        f"{s['host_cpu_per_unit_ratio']:.2f}x the CPU seconds per unit of work (medians of "
        f"{len(res['spin_floor'])}). A gateway process is such a process: its CPU per request rises by about "
        "as much when the other core is busy too.", "",
        "| gateway processes | req/s here | x 1 process | cores busy | gateway CPU us/request (all workers) | "
        "per worker | worker share of requests | mean batch per worker | backend | load generator | "
        "predicted req/s, a core per worker | predicted x 1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, p in per.items():
        lines.append(
            f"| {n} | {p['throughput_rps']:.0f} | {s['measured_ratio'][n]:.2f} | {p['cores_busy']:.2f} | "
            f"{p['gateway_cpu_us_per_request']:.0f} | {' / '.join(f'{x:.0f}' for x in p['worker_cpu_us_per_request'])} | "
            f"{' / '.join(f'{x:.0%}' for x in p['worker_request_share'])} | "
            f"{' / '.join(f'{x:.1f}' for x in p['worker_mean_batch'])} | "
            f"{p['backend_cpu_us_per_request']:.0f} | {p['loadgen_cpu_us_per_request']:.0f} | "
            f"{p['predicted_rps_core_per_worker']:.0f} | {s['predicted_ratio'][n]:.2f} |")
    lines += [
        "",
        "Per worker: its CPU seconds over all requests; its share of the requests and its mean batch from its "
        "own /metrics (the share follows its share of the connections, set by the kernel's SO_REUSEPORT hash). Predicted with a core per worker: requests / the busiest worker's CPU "
        "seconds, i.e. the rate at which that worker fills one core, the others not being the limit.",
        "",
    ]
    two = s["predicted_ratio"].get("2")
    if two is not None:
        met = "met" if two >= TARGET_RATIO else "not met"
        lines += [f"Target 2 processes >= {TARGET_RATIO}x 1 process on a host with the cores: predicted "
                  f"{two:.2f}x ({met}), from each worker's CPU per request measured here (with both vCPUs busy, "
                  f"this host charges any process {s['host_cpu_per_unit_ratio']:.2f}x the CPU per unit of work; above). "
                  f"Measured here {s['measured_ratio']['2']:.2f}x, on {res['cpus']} cores that also run the load "
                  "generator and the backend (cores busy), so the measured ratio is this host's, not the gateway's."]
    if "relay_cpu_us_per_request" in s:
        lines += ["", f"Forwarding floor: a bare TCP relay in front of one gateway costs "
                  f"{s['relay_cpu_us_per_request']:.0f} us CPU per request, {s['relay_share_of_gateway']:.0%} of "
                  "what the gateway itself spends; forwarding a model's requests to the worker that owns it "
                  "would add at least that to every forwarded request, in both the forwarding worker's "
                  "parse-and-send and the owner's."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--counts", default="1,2,4", help="gateway process counts, comma-separated")
    ap.add_argument("--out", default=str(RESULTS), help="where the JSON and markdown go")
    a = ap.parse_args(argv)
    exit_on_sigterm()
    counts = tuple(int(x) for x in a.counts.split(","))
    res = run(a.duration, a.rounds, a.concurrency, counts)
    write_results(a.out, "gateway_scaleout", res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
