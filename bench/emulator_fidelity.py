"""Emulator fidelity: does an emulated GPU served by real Triton behave like its profile?

Reference profile ResNet-50 on A100-80GB MIG 1g.10gb (profiles/reference/, max batch capped
at 32). Checks, each against a baseline measured in the same run:

1. latency: for every batch 1..32, the median latency through Triton (tritonclient HTTP) is
   within 5% or 0.5 ms of the profile's p50;
2. MIG: two slices of one emulated GPU loaded at once each keep >= 95% of solo throughput;
3. MPS: two clients (two Triton servers) at 50% on one slice each get
   solo * 0.5 / (1 + interference), within 10%;
4. time-slicing: two clients on one slice without MPS each get solo / 2 and together
   solo, within 10%.

Triton's own per-request cost is calibrated first (``calibrate_overhead``) and handed to
the emulated models. Throughput is closed-loop, one client thread per model, batch 8.

    .venv/bin/python -m bench.emulator_fidelity [--samples 9] [--duration 3] [--rounds 3]

Writes bench/results/emulator_fidelity.{json,md}; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from bench.output import write_results
from profiles.emulator import (
    ArbiterClient,
    EmulatedGpu,
    Overhead,
    calibrate_overhead,
    write_emulated_model,
)
from profiles.process import exit_on_sigterm
from profiles.profile import Profile, ProfileSet
from profiles.sharing import ActiveJob
from profiles.tritonserver import TritonServer

OUT = Path(__file__).parent / "results"
MAX_BATCH = 32
LOAD_BATCH = 8
LAT_REL, LAT_ABS = 0.05, 0.0005
MIG_KEEP = 0.95
SHARE_TOL = 0.10


def reference() -> Profile:
    return ProfileSet.reference().get("resnet50", "A100-80GB", "1g.10gb").with_max_batch(MAX_BATCH)


def _input(batch: int) -> httpclient.InferInput:
    x = httpclient.InferInput("INPUT0", [batch, 16], "FP32")
    x.set_data_from_numpy(np.zeros((batch, 16), np.float32))
    return x


def latency_sweep(url: str, model: str, prof: Profile, samples: int) -> list[dict]:
    """Median latency per batch size; rounds sweep all sizes in turn, so a burst of load from
    elsewhere on the host spreads over many sizes instead of spoiling a few."""
    client = httpclient.InferenceServerClient(url)
    batches = range(1, prof.max_batch + 1)
    inputs = {b: _input(b) for b in batches}
    times: dict[int, list[float]] = {b: [] for b in batches}
    try:
        for b in batches:
            client.infer(model, [inputs[b]])  # warm-up
        for _ in range(samples):
            for b in batches:
                t0 = time.perf_counter()
                client.infer(model, [inputs[b]])
                times[b].append(time.perf_counter() - t0)
    finally:
        client.close()
    rows = []
    for b in batches:
        want, got = prof.latency(b, "p50"), statistics.median(times[b])
        p25 = float(np.percentile(times[b], 25))
        tol = max(LAT_REL * want, LAT_ABS)
        rows.append({"batch": b, "profile_ms": round(want * 1e3, 3), "measured_ms": round(got * 1e3, 3),
                     "p25_ms": round(p25 * 1e3, 3), "error_ms": round((got - want) * 1e3, 3),
                     "tolerance_ms": round(tol * 1e3, 3), "pass": abs(got - want) <= tol,
                     "p25_pass": abs(p25 - want) <= tol})
    return rows


def closed_loop(targets: list[tuple[str, str]], duration: float, batch: int = LOAD_BATCH) -> list[float]:
    """Rows/s each (url, model) gets when all are driven at once, back to back with batches
    of ``batch`` rows, for the same ``duration`` seconds from a common start."""
    out = [0.0] * len(targets)
    start = threading.Barrier(len(targets))

    def drive(i: int) -> None:
        url, model = targets[i]
        client = httpclient.InferenceServerClient(url)
        try:
            x = _input(batch)
            client.infer(model, [x])
            start.wait()
            n, t0 = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - t0) < duration:
                client.infer(model, [x])
                n += 1
            out[i] = n * batch / elapsed
        finally:
            client.close()

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def arbiter_precision(socket_path: str, n: int = 30) -> dict[str, float]:
    """Median microseconds a job through the arbiter takes beyond its work (no Triton)."""
    client = ArbiterClient(socket_path)
    out = {}
    try:
        for work in (0.001, 0.010):
            extra = []
            for _ in range(n):
                t0 = time.monotonic()
                client.run(ActiveJob("precision", "bench"), work)
                extra.append(time.monotonic() - t0 - work)
            out[f"{work * 1e3:g}ms_extra_us"] = round(statistics.median(extra) * 1e6, 1)
    finally:
        client.close()
    return out


def check(name: str, measured: float, expected: float, ok: bool, rule: str) -> dict:
    return {"check": name, "measured": round(measured, 2), "expected": round(expected, 2),
            "ratio": round(measured / expected, 4), "rule": rule, "pass": bool(ok)}


def sharing_checks(a_url: str, b_url: str, prof: Profile, duration: float,
                   rounds: int) -> tuple[float, list[dict]]:
    """Scenarios interleaved over ``rounds`` so the solo baseline and the shared runs see
    the same background load; throughput is averaged over the rounds."""
    f = prof.mps_interference
    scenarios = {
        "solo": [(a_url, "mig0")],
        "mig": [(a_url, "mig0"), (b_url, "mig1")],
        "mps_alone": [(a_url, "mps")],
        "mps": [(a_url, "mps"), (b_url, "mps")],
        "ts": [(a_url, "mig0"), (b_url, "ts0")],
    }
    got: dict[str, list[list[float]]] = {k: [] for k in scenarios}
    for _ in range(rounds):
        for k, targets in scenarios.items():
            got[k].append(closed_loop(targets, duration / rounds))
    avg = {k: [statistics.fmean(col) for col in zip(*v, strict=True)] for k, v in got.items()}
    solo, mig, mps_alone, mps, ts = avg["solo"][0], avg["mig"], avg["mps_alone"][0], avg["mps"], avg["ts"]
    keep = f">= {MIG_KEEP:.0%} of solo"
    within = f"within {SHARE_TOL:.0%}"
    rows = [check(f"MIG slice {i} under load (req/s)", r, solo, r >= MIG_KEEP * solo, keep) for i, r in enumerate(mig)]
    want = solo * 0.5
    rows.append(check("MPS 50% client alone (req/s)", mps_alone, want, abs(mps_alone / want - 1) <= SHARE_TOL, within))
    want = solo * 0.5 / (1 + f)
    rows += [check(f"MPS 50% client {i} of 2, interference {f:g} (req/s)", r, want,
                   abs(r / want - 1) <= SHARE_TOL, within) for i, r in enumerate(mps)]
    rows += [check(f"time-sliced client {i} of 2 (req/s)", r, solo / 2, abs(r / (solo / 2) - 1) <= SHARE_TOL, within)
             for i, r in enumerate(ts)]
    rows.append(check("time-sliced sum of 2 (req/s)", sum(ts), solo, abs(sum(ts) / solo - 1) <= SHARE_TOL, within))
    return solo, rows


def run(samples: int, duration: float, rounds: int, calibrate: bool) -> dict:
    prof = reference()
    t_start = time.perf_counter()
    load0 = round(os.getloadavg()[0], 2)
    overhead = calibrate_overhead("http") if calibrate else Overhead()
    work = Path(tempfile.mkdtemp(prefix="headrace-bench-emu-"))
    try:
        with EmulatedGpu("bench-gpu") as gpu:
            rtt = gpu.round_trip()
            precision = arbiter_precision(gpu.socket_path)
            arb = gpu.socket_path
            a_repo, b_repo = work / "a", work / "b"
            common = {"arbiter": arb, "overhead": overhead}
            # server a is MPS client "a", server b is client "b"; slices @0..@2 of one GPU
            write_emulated_model(a_repo, "mig0", prof, slice_id="gpu0/1g.10gb@0", client="a", **common)
            write_emulated_model(a_repo, "mps", prof, slice_id="gpu0/1g.10gb@2", mode="mps", share=0.5,
                                 client="a", **common)
            write_emulated_model(b_repo, "mig1", prof, slice_id="gpu0/1g.10gb@1", client="b", **common)
            write_emulated_model(b_repo, "ts0", prof, slice_id="gpu0/1g.10gb@0", client="b", **common)
            write_emulated_model(b_repo, "mps", prof, slice_id="gpu0/1g.10gb@2", mode="mps", share=0.5,
                                 client="b", **common)
            with TritonServer(a_repo, ready_timeout=120) as a, TritonServer(b_repo, ready_timeout=120) as b:
                lat = latency_sweep(a.http_url, "mig0", prof, samples)
                solo, share = sharing_checks(a.http_url, b.http_url, prof, duration, rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "benchmark": "emulator_fidelity",
        "profile": prof.name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "loadavg_1m_start": load0, "loadavg_1m": round(os.getloadavg()[0], 2),
                 "python": platform.python_version()},
        "settings": {"samples_per_batch": samples, "load_seconds": duration, "rounds": rounds,
                     "load_batch": LOAD_BATCH},
        "overhead": {"fixed_ms": overhead.fixed_ms, "idle_ms": overhead.idle_ms, "ramp_ms": overhead.ramp_ms,
                     "calibrated": calibrate},
        "arbiter_round_trip_us": round(rtt * 1e6, 1),
        "arbiter_precision": precision,
        "solo_throughput": round(solo, 2),
        "latency": lat,
        "latency_pass": all(r["pass"] for r in lat),
        "latency_p25_pass": all(r["p25_pass"] for r in lat),
        "latency_worst_error_ms": max(abs(r["error_ms"]) for r in lat),
        "sharing": share,
        "pass": all(r["pass"] for r in lat) and all(r["pass"] for r in share),
        "seconds": round(time.perf_counter() - t_start, 1),
    }


def markdown(res: dict) -> str:
    ok = lambda p: "pass" if p else "**FAIL**"  # noqa: E731
    lines = [
        "# Emulator fidelity", "",
        f"Profile `{res['profile']}`, {res['when']}, {res['host']['cpus']} CPUs, 1-min load average "
        f"{res['host']['loadavg_1m_start']} at the start and {res['host']['loadavg_1m']} at the end; "
        f"{res['seconds']} s in all. Command: "
        "`.venv/bin/python -m bench.emulator_fidelity`.", "",
        f"Triton overhead compensation: fixed {res['overhead']['fixed_ms']} ms + idle "
        f"{res['overhead']['idle_ms']} ms (calibrated: {res['overhead']['calibrated']}). "
        f"Arbiter round trip {res['arbiter_round_trip_us']} µs; a job through the arbiter alone (no Triton) "
        f"ends {res['arbiter_precision']['1ms_extra_us']} µs (1 ms of work) and "
        f"{res['arbiter_precision']['10ms_extra_us']} µs (10 ms) after its work (medians).", "",
        f"Overall: {ok(res['pass'])}", "",
        f"## Sharing (closed loop, batch {res['settings']['load_batch']}, {res['settings']['load_seconds']} s per "
        f"scenario in {res['settings']['rounds']} interleaved rounds; expected from the solo throughput of the same run)",
        "",
        "| check | measured | expected | ratio | rule | result |", "|---|---:|---:|---:|---|---|",
    ]
    lines += [f"| {r['check']} | {r['measured']} | {r['expected']} | {r['ratio']:.3f} | {r['rule']} | {ok(r['pass'])} |"
              for r in res["sharing"]]
    lines += [
        "", f"## Latency by batch (median of {res['settings']['samples_per_batch']}; rule: within 5% or 0.5 ms)", "",
        f"All medians within: {ok(res['latency_pass'])}; worst error {res['latency_worst_error_ms']} ms. "
        f"All lower quartiles within: {ok(res['latency_p25_pass'])} (delays from other work on the host only "
        "add time, so the lower quartile shows the emulator's own accuracy when the host is busy; the pass "
        "rule is the median's).", "",
        "| batch | profile ms | median ms | p25 ms | median error ms | tolerance ms | result |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [f"| {r['batch']} | {r['profile_ms']} | {r['measured_ms']} | {r['p25_ms']} | {r['error_ms']:+.3f} | "
              f"{r['tolerance_ms']} | "
              f"{ok(r['pass'])} |" for r in res["latency"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=9, help="latency samples per batch size")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds of load per sharing scenario")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds the load seconds are split into")
    ap.add_argument("--no-calibrate", action="store_true", help="use the default Triton overhead")
    ap.add_argument("--out", type=Path, default=OUT, help="directory for the JSON and markdown results")
    args = ap.parse_args(argv)
    exit_on_sigterm()  # what it started is stopped on the way out
    if args.samples < 1 or args.duration <= 0 or args.rounds < 1:
        ap.error(f"need --samples >= 1, --duration > 0, --rounds >= 1 (got {args.samples}, {args.duration}, {args.rounds})")
    res = run(args.samples, args.duration, args.rounds, not args.no_calibrate)
    write_results(args.out, "emulator_fidelity", res, markdown(res))
    print(markdown(res))
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
