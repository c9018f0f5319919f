"""headrace embedded, headrace on Ray, and plain Ray Serve, on the same emulated ResNet-50 slice.

Setup: the reference ResNet-50 profile on one emulated A100-80GB 1g.10gb slice (the plan for
200 req/s at SLO 100 ms: one replica, ~322 req/s predicted), SLO 100 ms. Systems:

- (a) ``headrace up`` (the controller, its gateway and a local Triton on this machine);
- (b) ``headrace up --ray`` on a local one-node Ray (the controller and its gateway in a
  detached actor, the Triton in a Ray actor; requests reach the gateway's own port);
- (c) plain Ray Serve: a deployment with ``@serve.batch(max_batch_size=32)`` behind Serve's
  HTTP proxy, calling an emulated Triton of the same slice with tritonclient's aio client.

For each: the latency added at concurrency 1 (closed loop, p50, minus the p50 of calling an
emulated Triton of the same slice directly, in the same run), and the highest Poisson rate
holding >= 99% of requests within the SLO (``loadgen.sweep.find_max_rate``). Every client
speaks KServe v2 JSON over HTTP (Serve's handler parses only that). The gateway scale-out rows
(1/2/4 gateway processes on a trivial backend) come from ``bench.gateway_scaleout``'s results.

    flock /tmp/headrace-bench.lock .venv/bin/python -m bench.ray_scaleout [--quick]

Writes bench/results/ray_scaleout.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.output import write_results
from loadgen.run import run_load
from loadgen.spec import InputSpec, LoadSpec
from loadgen.sweep import find_max_rate

RESULTS = Path(__file__).parent / "results"
SLO_MS = 100.0
NODE = "bench"
INPUTS = (InputSpec(name="INPUT0", shape=(1, 16), datatype="FP32"),)


def documents(runtime: str) -> list[dict[str, Any]]:
    pool = {"apiVersion": "headrace.dev/v1", "kind": "GpuPool", "metadata": {"name": "bench"},
            "spec": {"emulate": True, "runtime": runtime,
                     "nodes": [{"name": NODE, "gpus": [{"model": "A100-80GB", "count": 1, "mps": False}]}]}}
    dep = {"apiVersion": "headrace.dev/v1", "kind": "ModelDeployment", "metadata": {"name": "resnet50"},
           "spec": {"model": "resnet50", "rate": 200, "slo_ms": SLO_MS}}
    gw = {"apiVersion": "headrace.dev/v1", "kind": "Gateway", "metadata": {"name": "gw"},
          "spec": {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0}}}
    return [pool, dep, gw]


def spec(url: str, **kw: Any) -> LoadSpec:
    return LoadSpec(target=f"http://{url}", model="resnet50", protocol="json", inputs=INPUTS, slo_ms=SLO_MS,
                    send_timeout=False, arrival="poisson", **kw)


def latency_c1(url: str, duration: float) -> dict[str, Any]:
    s = asyncio.run(run_load(spec(url, mode="closed", concurrency=1, duration_s=duration, warmup_s=1.0))).summary
    return {"p50_ms": s["latency_ms"]["p50"], "p99_ms": s["latency_ms"]["p99"], "ok": s["ok"], "offered": s["offered"]}


def max_rate(url: str, lo: float, hi: float, window_s: float) -> dict[str, Any]:
    """Bisected to 8%, one trial a rate; ``window_s`` long enough for a few hundred requests a
    window, so Poisson noise alone does not read as instability at low rates."""
    res = asyncio.run(find_max_rate(spec(url, warmup_s=1.0), lo, hi, target=0.99, window_s=window_s,
                                    trials=1, precision=0.08, max_windows=6))
    return {"best_rps": res.best_rate, "lo": lo, "hi": hi, "window_s": window_s,
            "tried": [r.row() for r in res.rates]}


def check_tritonclient(url: str) -> bool:
    """One inference through ``url`` with tritonclient (binary tensors): INPUT + 1 comes back."""
    import tritonclient.http as th  # noqa: PLC0415

    c = th.InferenceServerClient(url)
    try:
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        inp = th.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_data_from_numpy(x)
        return bool(np.array_equal(c.infer("resnet50", [inp]).as_numpy("OUTPUT0"), x + 1))
    finally:
        c.close()


def check_json(url: str) -> bool:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                   "data": list(range(16))}]}).encode()
    req = urllib.request.Request(f"http://{url}/v2/models/resnet50/infer", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        out = json.loads(r.read())["outputs"][0]["data"]
    return out == [float(i + 1) for i in range(16)]


def measure(name: str, url: str, args: argparse.Namespace, lo: float, hi: float, check) -> dict[str, Any]:  # noqa: ANN001
    print(f"{name}: {url}", flush=True)
    row = {"url": url, "check": check(url), "c1": latency_c1(url, args.c1_duration)}
    row["max_rate"] = max_rate(url, lo, hi, max(args.window, args.per_window / hi))
    print(f"{name}: {json.dumps({k: v for k, v in row.items() if k != 'max_rate'})} "
          f"max {row['max_rate']['best_rps']}", flush=True)
    return row


# --------------------------------------------------------------------------- the systems


def direct_triton(tmp: Path):  # noqa: ANN201
    """An emulated Triton of the planned slice, started here (the baseline and (c)'s backend)."""
    from deploy.operator.desired import base_profiles, prepare  # noqa: PLC0415
    from placement.apply.emulated import Emulated  # noqa: PLC0415
    from placement.solve.solver import solve  # noqa: PLC0415
    from placement.spec import inventory, single_pool  # noqa: PLC0415

    want = prepare(yaml.safe_dump_all(documents("local")), base_profiles(), "bench")
    plan = solve(want.demands({}), want.profiles, inventory(single_pool(want.docs, ["bench"])), "greedy")
    ex = Emulated(want.profiles, workdir=tmp / "direct")
    ex.apply(plan)
    (ep,) = ex.endpoints.values()
    return ex, ep, plan


def headrace_up(tmp: Path, runtime: str, extra: list[str]) -> tuple[Path, str]:
    from deploy.cli import main  # noqa: PLC0415
    from deploy.operator.state import DirStateStore  # noqa: PLC0415

    docs = tmp / f"{runtime}.yaml"
    docs.write_text(yaml.safe_dump_all(documents(runtime), sort_keys=False))
    state = tmp / f"state-{runtime}"
    rc = main(["up", "-f", str(docs), "--state-dir", str(state), "--timeout", "300", *extra])
    if rc != 0:
        raise RuntimeError(f"headrace up ({runtime}) exited {rc}")
    return state, DirStateStore(state).read()["gateway"]["http"]


def serve_baseline(triton_url: str) -> str:
    """(c): Ray Serve with @serve.batch(max_batch_size=32) behind its HTTP proxy."""
    from ray import serve  # noqa: PLC0415

    from profiles.triton.server import free_port  # noqa: PLC0415

    @serve.deployment(max_ongoing_requests=1000)
    class BatchedResnet:
        def __init__(self, url: str) -> None:
            self.url = url
            self.client = None

        @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
        async def infer(self, rows: list[list[float]]) -> list[list[float]]:
            import tritonclient.http.aio as tha  # noqa: PLC0415

            if self.client is None:
                self.client = tha.InferenceServerClient(self.url)
            x = np.asarray(rows, dtype=np.float32)
            inp = tha.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            out = (await self.client.infer("resnet50", [inp])).as_numpy("OUTPUT0")
            return [r.tolist() for r in out]

        async def __call__(self, request) -> dict[str, Any]:  # noqa: ANN001
            if request.method != "POST":  # the load generator's readiness probe
                return {"ready": True}
            t = (await request.json())["inputs"][0]
            out = await self.infer([float(v) for v in np.ravel(t["data"])])
            return {"model_name": "resnet50",
                    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, len(out)], "data": out}]}

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(BatchedResnet.bind(triton_url), name="baseline", route_prefix="/")
    return f"127.0.0.1:{port}"


# --------------------------------------------------------------------------- report


def scaleout_rows() -> tuple[list[str], str | None]:
    md = RESULTS / "gateway_scaleout.md"
    if not md.exists():
        return [], None
    rows = [ln for ln in md.read_text().splitlines() if ln.startswith("|")]
    return rows, json.loads((RESULTS / "gateway_scaleout.json").read_text()).get("cpus") \
        if (RESULTS / "gateway_scaleout.json").exists() else None


def report(r: dict[str, Any]) -> str:
    base = r["direct_c1"]["p50_ms"]
    lines = ["# headrace embedded vs headrace on Ray vs plain Ray Serve (`bench/ray_scaleout.py`)", "",
             f"{r['cpus']} CPUs shared by everything (load generator, gateways, Triton, Ray's own processes). "
             "Emulated ResNet-50 on one A100-80GB 1g.10gb slice (planned capacity "
             f"{r['capacity_rps']:.0f} req/s), SLO {SLO_MS:g} ms, KServe v2 JSON over HTTP for every system. "
             f"Calling the emulated Triton directly at concurrency 1: p50 {base:.2f} ms (the baseline the "
             "added latency is measured against, same run).", "",
             "| system | tritonclient/JSON check | p50 at concurrency 1 | added vs direct Triton | "
             "highest rate at >= 99% in SLO |", "|---|---|---|---|---|"]
    for key, label in (("a", "(a) headrace embedded (`headrace up`)"), ("b", "(b) headrace on local Ray (`headrace up --ray`)"),
                       ("c", "(c) Ray Serve `@serve.batch(32)` behind its proxy")):
        s = r["systems"][key]
        best = s["max_rate"]["best_rps"]
        lines.append(f"| {label} | {'ok' if s['check'] else 'FAILED'} | {s['c1']['p50_ms']:.2f} ms | "
                     f"+{s['c1']['p50_ms'] - base:.2f} ms | {'< ' + str(s['max_rate']['lo']) if best is None else f'{best:.0f} req/s'} |")
    t = r["targets"]
    lines += ["", "Targets:",
              f"- (b) within 10% of (a): rate {t['b_vs_a_rate']:.2f}x, p50 at concurrency 1 {t['b_vs_a_p50']:.2f}x "
              f"(added latency {t['b_minus_a_added_ms']:+.2f} ms) "
              f"({'met' if t['b_within_10pct'] else 'not met'}).",
              f"- (b) >= 3x the rate of (c): {t['b_over_c']:.2f}x ({'met' if t['b_3x_c'] else 'not met'}).", ""]
    rows, cpus = scaleout_rows()
    if rows:
        lines += [f"Gateway scale-out against a trivial backend (from `bench/gateway_scaleout.py`'s committed "
                  f"results, {cpus} CPUs; its own markdown explains the prediction for a host with a core per "
                  "worker):", "", *rows, ""]
    lines += ["Rates tried (one trial each, bisected to 8%; windows of "
              + ", ".join(f"{r['systems'][k]['max_rate']['window_s']:.1f} s ({k})" for k in "abc") + "):", ""]
    for key in ("a", "b", "c"):
        tried = ", ".join(f"{x['rate']:.0f} {'pass' if x['passed'] else 'fail'} ({x['attainment_median']:.1%})"
                          for x in r["systems"][key]["max_rate"]["tried"])
        lines.append(f"- ({key}) {tried}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs (a smoke test of the script)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    args.c1_duration = 3.0 if args.quick else 8.0
    args.window = 1.0 if args.quick else 2.0
    args.per_window = 100 if args.quick else 400  # requests a window at the top of the range
    logging.getLogger("ray").setLevel(logging.WARNING)
    r: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version(), "slo_ms": SLO_MS,
                         "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "systems": {}}
    from deploy.operator.cli import ensure_down  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="headrace-ray-bench-") as d:
        tmp = Path(d)
        ex, ep, plan = direct_triton(tmp)
        try:
            r["capacity_rps"] = ep.capacity
            r["direct_c1"] = latency_c1(ep.http_url, args.c1_duration)
            print(f"direct Triton: {r['direct_c1']}", flush=True)
            hi = round(ep.capacity * 1.25)
            state = None
            try:
                state, url = headrace_up(tmp, "local", ["--detach"])
                r["systems"]["a"] = measure("a", url, args, 100, hi, check_tritonclient)
            finally:
                if state is not None:
                    ensure_down(state)
            import ray  # noqa: PLC0415

            from deploy.ray.resources import node_resources  # noqa: PLC0415
            from deploy.ray.runtime import NAMESPACE  # noqa: PLC0415

            ray.init(num_cpus=2, resources=node_resources(NODE, {"A100-80GB": 1}), namespace=NAMESPACE,
                     include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
            state = None
            try:
                state, url = headrace_up(tmp, "ray", ["--ray", "auto"])
                r["systems"]["b"] = measure("b", url, args, 100, hi, check_tritonclient)
            finally:
                if state is not None:
                    ensure_down(state)
            try:
                url = serve_baseline(ep.http_url)
                r["systems"]["c"] = measure("c", url, args, 20, 120, check_json)
            finally:
                from ray import serve  # noqa: PLC0415

                serve.shutdown()
                ray.shutdown()
        finally:
            ex.stop()
    a, b, c = (r["systems"][k] for k in "abc")
    ra, rb, rc = (s["max_rate"]["best_rps"] or 0.0 for s in (a, b, c))
    added = {k: s["c1"]["p50_ms"] - r["direct_c1"]["p50_ms"] for k, s in r["systems"].items()}
    r["added_ms"] = added
    r["targets"] = {"b_vs_a_rate": rb / ra if ra else 0.0, "b_minus_a_added_ms": added["b"] - added["a"],
                    "b_vs_a_p50": b["c1"]["p50_ms"] / a["c1"]["p50_ms"],
                    "b_within_10pct": bool(ra and rb >= 0.9 * ra and b["c1"]["p50_ms"] <= 1.1 * a["c1"]["p50_ms"]),
                    "b_over_c": rb / rc if rc else float("inf"), "b_3x_c": bool(rb >= 3 * rc)}
    write_results(args.out, "ray_scaleout", r, report(r))
    print(report(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
