"""Emulator fidelity: does an emulated GPU served by real Triton behave like its profile?

Reference profile ResNet-50 on A100-80GB MIG 1g.10gb (profiles/reference/, max batch capped
at 32). Checks, each against a baseline measured in the same run:

1. latency: for every batch 1..32, the median latency through Triton (tritonclient HTTP) is
   within 5% or 0.5 ms of the profile's p50;
2. MIG: two slices of one emulated GPU loaded at once each keep >= 95% of solo throughput;
3. MPS: two clients (two Triton servers) at 50% on one slice each get what
   :func:`profiles.sharing.mps_latency` predicts for a batch at that share next to a busy
   neighbour (solo * t(b) / t_share(b)), within 10%;
4. time-slicing: two clients on one slice without MPS each get solo / 2 and together
   solo, within 10%;
5. MPS co-location against published data: every CHECK point of
   ``profiles/reference/sharing/measurements.yaml`` (a model's latency on a smaller share of a
   GPU, predicted from its whole-share curve by :func:`profiles.sharing.predict`); the MPS
   points also run on the emulated GPU, in virtual time through its physics and live through
   Triton and the arbiter. Target: each within 15% of the published latency (reported
   separately: ``published_target_met``); the emulated runs must agree with the model within
   5% (live: 5% or 0.5 ms), which counts towards ``pass``.

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
from profiles.emulator.physics import SharedGpu
from profiles.profile import Profile, ProfileSet
from profiles.sharing import (
    CHECK_TOLERANCE,
    ActiveJob,
    PublishedPoint,
    load_published,
    mps_latency,
    mps_terms,
    predict,
)
from profiles.triton.process import exit_on_sigterm
from profiles.triton.server import TritonServer

OUT = Path(__file__).parent / "results"
MAX_BATCH = 32
LOAD_BATCH = 8
LAT_REL, LAT_ABS = 0.05, 0.0005
MIG_KEEP = 0.95
SHARE_TOL = 0.10
EMULATED_TOL = 0.05  # emulated published points against the model's own prediction


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
    want = solo * prof.latency(LOAD_BATCH, "p50") / mps_latency(prof, LOAD_BATCH, 0.5, False, "p50")
    rows.append(check("MPS 50% client alone (req/s)", mps_alone, want, abs(mps_alone / want - 1) <= SHARE_TOL, within))
    # the model's slowdown of a LOAD_BATCH batch at half the SMs next to a busy neighbour
    want = solo * prof.latency(LOAD_BATCH, "p50") / mps_latency(prof, LOAD_BATCH, 0.5, True, "p50")
    rows += [check(f"MPS 50% client {i} of 2, interference {f:g} (req/s)", r, want,
                   abs(r / want - 1) <= SHARE_TOL, within) for i, r in enumerate(mps)]
    rows += [check(f"time-sliced client {i} of 2 (req/s)", r, solo / 2, abs(r / (solo / 2) - 1) <= SHARE_TOL, within)
             for i, r in enumerate(ts)]
    rows.append(check("time-sliced sum of 2 (req/s)", sum(ts), solo, abs(sum(ts) / solo - 1) <= SHARE_TOL, within))
    return solo, rows


def _published_row(p: PublishedPoint, got_s: float, model_s: float, abs_tol: float = 0.0) -> dict:
    err = got_s * 1e3 / p.published_ms - 1
    agree = abs(got_s - model_s) <= max(EMULATED_TOL * model_s, abs_tol)
    return {"series": p.series, "model": p.model, "gpu": p.gpu, "share": p.slice, "sm_share": round(p.share, 4),
            "memory_share": round(p.memory_share, 4), "batch": p.batch, "published_ms": p.published_ms,
            "model_ms": round(model_s * 1e3, 3), "got_ms": round(got_s * 1e3, 3), "error": round(err, 4),
            "approximate": p.approximate, "within_target": abs(err) <= CHECK_TOLERANCE, "agrees_with_model": agree}


def published_model() -> list[dict]:
    """Every CHECK point as the sharing model predicts it (the planner's and simulator's view)."""
    rows = []
    for p in load_published():
        if p.role == "check":
            t = predict(p).predicted_ms / 1e3
            rows.append(_published_row(p, t, t))
    return rows


def mps_check_points() -> list[PublishedPoint]:
    """The CHECK points of MPS clients alone (all the memory bandwidth, a share of the SMs):
    what an emulated MPS client can be run at."""
    return [p for p in load_published() if p.role == "check" and p.mode == "mps" and p.memory_share == 1.0]


def published_virtual() -> list[dict]:
    """Each MPS CHECK point run alone at its share, and each time-sliced one next to a
    neighbour that never stops, on the emulated GPU's physics in virtual time."""
    rows = []
    for p in load_published():
        if p.role != "check" or p.memory_share != 1.0:
            continue
        gpu = SharedGpu()
        base = p.baseline
        if p.mode == "timeslice":
            for n in range(1, p.tenants):
                gpu.start(100 + n, ActiveJob("s", f"neighbour{n}"), 1e6, now=0.0)
            job = ActiveJob("s", "c")
        else:
            job = ActiveJob("s", "c", "mps", p.share, base.mps_interference, mps_terms(base, p.batch, "p50"))
        gpu.start(1, job, base.latency(p.batch, "p50"), now=0.0)
        done = next(f for f in gpu.advance(1e5) if f.job_id == 1)
        rows.append(_published_row(p, done.finished, predict(p).predicted_ms / 1e3))
    return rows


def live_points() -> dict[str, list[PublishedPoint]]:
    """The MPS CHECK points by emulated model name (one model per series and share)."""
    out: dict[str, list[PublishedPoint]] = {}
    for p in mps_check_points():
        name = f"pub_{p.series.replace('-', '_')}_{round(p.share * 100)}"
        out.setdefault(name, []).append(p)
    return out


def published_live(url: str, points: dict[str, list[PublishedPoint]], samples: int) -> list[dict]:
    """Median latency through Triton of each MPS point's model at its share (alone)."""
    client = httpclient.InferenceServerClient(url)
    rows = []
    try:
        for model, pts in points.items():
            for p in pts:
                x = _input(p.batch)
                client.infer(model, [x])  # warm-up
                times = []
                for _ in range(samples):
                    t0 = time.perf_counter()
                    client.infer(model, [x])
                    times.append(time.perf_counter() - t0)
                rows.append(_published_row(p, statistics.median(times), predict(p).predicted_ms / 1e3, LAT_ABS))
    finally:
        client.close()
    return rows


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
            # each published MPS client's curve at its share, alone on a slice of GPU 1
            live = live_points()
            for name, pts in live.items():
                write_emulated_model(a_repo, name, pts[0].baseline, slice_id=f"gpu1/{name}", mode="mps",
                                     share=pts[0].share, **common)
            with TritonServer(a_repo, ready_timeout=120) as a, TritonServer(b_repo, ready_timeout=120) as b:
                lat = latency_sweep(a.http_url, "mig0", prof, samples)
                pub_live = published_live(a.http_url, live, samples)
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
        "published": (pub := {"model": published_model(), "virtual": published_virtual(), "live": pub_live}),
        "published_summary": {
            kind: {"points": len(rows), "within_target": sum(r["within_target"] for r in rows),
                   "worst_error": max((r["error"] for r in rows), key=abs, default=0.0),
                   "agree_with_model": all(r["agrees_with_model"] for r in rows)}
            for kind, rows in pub.items()},
        "published_target_met": all(r["within_target"] for r in pub["model"]),
        "pass": all(r["pass"] for r in lat) and all(r["pass"] for r in share)
        and all(r["agrees_with_model"] for rows in pub.values() for r in rows),
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
    pub, summ = res["published"], res["published_summary"]
    lines += [
        "", "## MPS co-location against published data",
        "",
        "Each CHECK point of `profiles/reference/sharing/measurements.yaml`: a model's published latency "
        "on a smaller share of a GPU, alone (MIGPerf: a smaller MIG slice, whose SM and memory share is "
        "the lesser of its fractions of the 7g slice; iGniter: one MPS client at a lower "
        "`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), predicted from the same model's whole-share curve alone; "
        "and (iGniter) a model next to a busy neighbour, taking turns (time-slicing), predicted from its "
        "solo latency. "
        "The sharing model's constants were fitted on other series (role FIT). Target: within "
        f"{CHECK_TOLERANCE:.0%} of the published latency: "
        f"{'met' if res['published_target_met'] else '**not met**'}.", "",
        "| run | points | within target | worst error | emulated = model (5%) |", "|---|---:|---:|---:|---|",
    ]
    lines += [f"| {kind} | {s['points']} | {s['within_target']} | {s['worst_error']:+.1%} | "
              f"{ok(s['agree_with_model']) if kind != 'model' else '-'} |" for kind, s in summ.items()]
    lines += [
        "", "`model`: `profiles.sharing.predict` (what the planner and simulator use); `virtual`: the MPS "
        "and time-sliced points run on the emulated GPU's physics; `live`: the MPS points through Triton and the "
        f"arbiter (median of {res['settings']['samples_per_batch']}).", "",
        "| run | model | GPU | share | batch | published ms | predicted ms | run ms | error | target |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    lines += [f"| {kind} | {r['model']} | {r['gpu']} | {r['share']} | {r['batch']} | {r['published_ms']} | "
              f"{r['model_ms']} | {r['got_ms']} | {r['error']:+.1%} | {ok(r['within_target'])} |"
              for kind in ("live", "virtual", "model") for r in pub[kind]]
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
