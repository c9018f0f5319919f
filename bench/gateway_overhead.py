"""What the gateway adds at concurrency 1: the same request sent directly to Triton and
through the gateway, over HTTP (binary tensors) and gRPC, interleaved round by round in one
run so machine noise hits every system alike.

    .venv/bin/python -m bench.gateway_overhead [--requests 300] [--rounds 8] [--profile]

Writes bench/results/gateway_overhead.{json,md}. ``--profile`` also runs the gateway under
pyinstrument during one extra gRPC + HTTP round and puts the hot path into the markdown.

The features section (``bench.overhead_features``) measures, with tritonclient (HTTP and gRPC,
the clients users run), what each optional feature adds to the plain gateway in the same
rounds: TLS, an API key, tracing on (exporting over OTLP/gRPC to ``bench.otlp_sink``), tracing
configured but off, the access log on (to a file), and a build without tracing at all.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import yaml
from tritonclient.grpc import service_pb2 as pb

from bench.host import cpu_times, steal_share
from bench.output import write_results
from bench.overhead_features import (
    BASELINE_REF,
    BASELINE_WITHOUT,
    feature_rows,
    features_markdown,
    in_process_cost,
    pct,
    start_features,
)
from deploy.gateway_process import start_serve
from profiles.profile import LatencyPoint, Profile, Provenance, save_profiles
from profiles.triton.process import exit_on_sigterm, stop_group
from profiles.triton.repository import ModelConfig, TensorSpec, write_model
from profiles.triton.server import TritonServer, free_port

RESULTS = Path(__file__).parent / "results"
# the echo model: as cheap as Triton's python backend gets, so the gateway's cost shows
ECHO = '''
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''
BACKENDS = ("http", "grpc")  # how the gateway reaches Triton; the first is the default
TARGETS = {"p50": (0.5, 0.3), "p99": (1.5, 1.0)}  # (limit, goal) of added ms
GRPC_ECHO, GRPC_VIA_HTTP, GRPC_VIA_GRPC = "grpc.aio echo", "grpc.aio -> Triton HTTP", "grpc.aio -> Triton gRPC, unparsed"
GRPC_FLOORS = (GRPC_ECHO, GRPC_VIA_HTTP, GRPC_VIA_GRPC)


class HttpTarget:
    """Keep-alive HTTP/1.1 with a prebuilt binary-tensor body (as lean as a client gets)."""

    status = 200  # the answer expected

    def __init__(self, url: str, model: str, parameters: dict | None = None) -> None:
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                                       "parameters": {"binary_data_size": x.nbytes}}],
                           "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
                           **({"parameters": parameters} if parameters else {})}).encode()
        self.body = head + x.tobytes()
        self.headers = {"Inference-Header-Content-Length": str(len(head)),
                        "Content-Type": "application/octet-stream"}
        self.path = f"/v2/models/{model}/infer"
        host, port = url.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=10)

    def __call__(self) -> None:
        self.conn.request("POST", self.path, self.body, self.headers)
        r = self.conn.getresponse()
        r.read()
        if r.status != self.status:
            raise RuntimeError(f"HTTP {r.status}, expected {self.status}")

    def close(self) -> None:
        self.conn.close()


class RefusalTarget(HttpTarget):
    """A request whose 1 µs deadline no batch can meet: the gateway's refusal path (429)."""

    status = 429

    def __init__(self, url: str, model: str) -> None:
        super().__init__(url, model, {"timeout": 1})


class GrpcTarget:
    """A sync channel sending a pre-serialized ModelInferRequest."""

    def __init__(self, url: str, model: str) -> None:
        req = pb.ModelInferRequest(model_name=model)
        req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
        req.raw_input_contents.append(np.arange(16, dtype=np.float32).tobytes())
        self.raw = req.SerializeToString()
        self.channel = grpc.insecure_channel(url)
        self.call = self.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

    def __call__(self) -> None:
        self.call(self.raw, timeout=10)

    def close(self) -> None:
        self.channel.close()


def core_cost(profile: Profile, n: int = 3000) -> dict[str, float]:
    """Microseconds the policy core (default config) spends per request at concurrency 1:
    submit + poll, then on_complete + poll. Part of the gateway's added latency."""
    from gateway.policy.scheduler import EdfScheduler
    from gateway.policy.types import ReplicaInfo, Request

    core = EdfScheduler()
    core.add_replica(ReplicaInfo("r", "echo", "echo", profile, profile.max_batch), 0.0)
    admit, finish, now = 0.0, 0.0, 0.0
    for i in range(n):
        now += 0.002
        t0 = time.perf_counter()
        core.submit(Request(i, "echo", now, now + 1.0), now)
        d = core.poll(now)
        t1 = time.perf_counter()
        core.on_complete(d.batches[0], now + 0.001)
        core.poll(now + 0.001)
        finish += time.perf_counter() - t1
        admit += t1 - t0
    return {"submit_poll_us": admit / n * 1e6, "complete_poll_us": finish / n * 1e6}


def measure(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its reaped children (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def settle(pid: int, quiet: float = 0.1, limit: float = 3.0) -> None:
    """Wait until process ``pid`` is idle: at most one clock tick of CPU over ``quiet`` seconds
    (giving up after ``limit``)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        c = cpu_seconds(pid)
        time.sleep(quiet)
        if cpu_seconds(pid) - c <= 1.0 / os.sysconf("SC_CLK_TCK"):
            return


def start_gateway(cfg_path: Path, http_port: int, profile_out: Path | None) -> subprocess.Popen:
    """``headrace serve`` on ``cfg_path``, under pyinstrument writing ``profile_out`` if given."""
    prefix = ["-m", "pyinstrument", "-r", "text", "-o", str(profile_out)] if profile_out else []
    return start_serve(cfg_path, f"127.0.0.1:{http_port}", cfg_path.with_suffix(".log"), prefix=prefix)


def start_floor(module: str, port: int, *args: str) -> subprocess.Popen:
    """``bench.relay`` or ``bench.grpc_echo`` in its own process group, listening once this returns."""
    proc = subprocess.Popen([sys.executable, "-m", module, str(port), *args],
                            start_new_session=True, cwd=Path(__file__).parent.parent)
    return listening(proc, port, 10.0, f"{module} on port {port}")


def listening(proc: subprocess.Popen, port: int, timeout: float, what: str, log: Path | None = None) -> subprocess.Popen:
    """``proc`` once its port on 127.0.0.1 accepts a connection; its group stopped and a
    RuntimeError (with ``log``'s tail) when it exits or is not listening within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    stop_group(proc)
    raise RuntimeError(f"{what} did not start" + (f": {log.read_text()[-2000:]}" if log else ""))


def run(requests: int, rounds: int, profile: bool, baseline_ref: str = "HEAD",
        baseline_without: tuple[str, ...] = (), features: bool = True) -> dict:
    work = Path(tempfile.mkdtemp(prefix="hr-bench-overhead-"))
    repo = work / "repo"
    write_model(repo, ModelConfig("echo", (TensorSpec("INPUT0", "FP32", (16,)),),
                                  (TensorSpec("OUTPUT0", "FP32", (16,)),), max_batch_size=8), ECHO)
    with TritonServer(repo) as triton:
        hp, gp = free_port(), free_port()
        # the echo model's own profile (about 0.4 ms a batch on CPU), so the policy has no
        # reason to hold a request back waiting for a bigger batch
        echo = Profile(
            "echo", "echo", "CPU", "cpu", 8, (LatencyPoint(1, 4e-4, 1e-3), LatencyPoint(8, 6e-4, 1.5e-3)),
            provenance=Provenance("bench.gateway_overhead: echo model on CPU Triton", "measured"))
        save_profiles(work / "echo.yaml", [echo])
        gateways: dict[str, tuple[int, int, Path]] = {}
        base: dict = {}  # the plain gateway's config (HTTP to Triton): the features' starting point
        for backend in BACKENDS:
            hp, gp = free_port(), free_port()
            cfg = {"listen": {"http_port": hp, "grpc_port": gp}, "health_interval_s": 1.0,
                   "models": [{"name": "echo", "slo_ms": 1000, "max_batch": 8, "replicas": [
                       {"url": triton.http_url if backend == "http" else triton.grpc_url, "protocol": backend,
                        "variant": "echo", "profile": str(work / "echo.yaml")}]}]}
            (work / f"gw-{backend}.yaml").write_text(yaml.safe_dump(cfg))
            base = base or cfg
            gateways[backend] = (hp, gp, work / f"gw-{backend}.yaml")
        procs: dict[str, subprocess.Popen] = {}  # by name: gateway/<backend>, relay/<protocol>
        try:
            for backend, (hp, _, path) in gateways.items():
                procs[f"gateway/{backend}"] = start_gateway(path, hp, None)
            relays = {proto: free_port() for proto in ("http", "grpc")}
            for proto, port in relays.items():
                procs[f"relay/{proto}"] = start_floor("bench.relay", port,
                                                      triton.http_url if proto == "http" else triton.grpc_url)
            grpc_floors = {  # row -> bench.grpc_echo mode: what a Python gRPC front door costs at least
                GRPC_ECHO: [], GRPC_VIA_HTTP: ["http", triton.http_url], GRPC_VIA_GRPC: ["grpc", triton.grpc_url]}
            floor_ports = {name: free_port() for name in grpc_floors}
            for name, mode in grpc_floors.items():
                procs[name] = start_floor("bench.grpc_echo", floor_ports[name], *mode)
            targets: dict = {}
            pid_of: dict = {}  # target -> the process whose CPU it is charged (none for Triton itself)
            for proto in ("http", "grpc"):
                make = HttpTarget if proto == "http" else GrpcTarget
                targets[(proto, "triton")] = make(triton.http_url if proto == "http" else triton.grpc_url, "echo")
                for backend, (hp, gp, _) in gateways.items():
                    key = (proto, f"gateway/{backend}")
                    targets[key] = make(f"127.0.0.1:{hp if proto == 'http' else gp}", "echo")
                    pid_of[key] = procs[f"gateway/{backend}"].pid
                targets[(proto, "relay")] = make(f"127.0.0.1:{relays[proto]}", "echo")
                pid_of[(proto, "relay")] = procs[f"relay/{proto}"].pid
            for name in grpc_floors:
                targets[("grpc", name)] = GrpcTarget(f"127.0.0.1:{floor_ports[name]}", "echo")
                pid_of[("grpc", name)] = procs[name].pid
            notes: dict = {}
            if features:
                more, pids, notes = start_features(work, base, triton, baseline_ref, baseline_without, procs,
                                                   start_floor)
                targets.update(more)
                pid_of.update(pids)
            # the refusal path: what a 429 costs the gateway (admission only, no Triton call)
            targets[("http", "refusal")] = RefusalTarget(f"127.0.0.1:{gateways[BACKENDS[0]][0]}", "echo")
            pid_of[("http", "refusal")] = procs[f"gateway/{BACKENDS[0]}"].pid
            samples: dict = {k: [] for k in targets}
            for fn in targets.values():
                measure(fn, 50)  # warm up connections and code paths
            cpu: dict = {k: 0.0 for k in targets}
            host0 = cpu_times()
            for r in range(rounds):
                order = list(targets) if r % 2 == 0 else list(reversed(targets))
                for k in order:
                    pid = pid_of.get(k)
                    c0 = cpu_seconds(pid) if pid else 0.0
                    samples[k] += measure(targets[k], requests)
                    if k in notes.get("settle", ()):  # its span exports finish (and are counted) in its turn
                        settle(pid)
                    cpu[k] += (cpu_seconds(pid) - c0) if pid else 0.0
            stolen = steal_share(host0, cpu_times())
            for t in targets.values():
                t.close()
        finally:
            for p in reversed(procs.values()):  # the OTLP sink outlives the gateways exporting to it
                stop_group(p)
        hot_path = ""
        if profile:
            prof = work / "profile.txt"
            hp, gp, path = gateways[BACKENDS[0]]
            gw = start_gateway(path, hp, prof)
            try:
                for t in (GrpcTarget(f"127.0.0.1:{gp}", "echo"), HttpTarget(f"127.0.0.1:{hp}", "echo")):
                    measure(t, requests * 10)  # long enough that serving, not startup, dominates
                    t.close()
            finally:
                stop_group(gw, signal.SIGINT)
            hot_path = prof.read_text() if prof.exists() else "(pyinstrument wrote no profile)"
    out: dict = {"requests_per_round": requests, "rounds": rounds, "machine": platform.node(),
                 "cpus": os.cpu_count(), "rows": []}
    for proto in ("http", "grpc"):
        d = samples[(proto, "triton")]
        for system in (*(f"gateway/{b}" for b in BACKENDS), "relay", *(GRPC_FLOORS if proto == "grpc" else ())):
            g = samples[(proto, system)]
            backend = system.removeprefix("gateway/")
            row = {"client": proto, "backend": backend,
                   "direct_p50_ms": pct(d, 50), "direct_p99_ms": pct(d, 99),
                   "gateway_p50_ms": pct(g, 50), "gateway_p99_ms": pct(g, 99)}
            # CPU the gateway process burns per request: robust to a busy machine, unlike latency
            row["gateway_cpu_us_per_request"] = cpu[(proto, system)] / len(g) * 1e6
            row["added_p50_ms"] = row["gateway_p50_ms"] - row["direct_p50_ms"]
            row["added_p99_ms"] = row["gateway_p99_ms"] - row["direct_p99_ms"]
            row["meets_limit"] = (row["added_p50_ms"] <= TARGETS["p50"][0]
                                  and row["added_p99_ms"] <= TARGETS["p99"][0])
            row["meets_goal"] = (row["added_p50_ms"] <= TARGETS["p50"][1]
                                 and row["added_p99_ms"] <= TARGETS["p99"][1])
            out["rows"].append(row)
    ref = samples[("http", "refusal")]
    out["refusal"] = {"p50_ms": pct(ref, 50), "p99_ms": pct(ref, 99),
                      "gateway_cpu_us_per_request": cpu[("http", "refusal")] / len(ref) * 1e6}
    out["features"] = feature_rows(samples, cpu)
    if features:  # the gateways are stopped: the machine is as quiet as this run gets
        out["features_in_process"] = in_process_cost(notes["in_process"])
    if features:
        log, spans = notes["access_log"], notes["otlp_spans"]
        out["features_notes"] = {
            "commit": notes["commit"], "baseline_commit": notes["baseline_commit"],
            "access_log_lines": len(log.read_text().splitlines()) if log.exists() else 0,
            "otlp_spans_received": int(spans.read_text()) if spans.exists() else None}
    out["policy_core"] = core_cost(echo)
    out["load_average"] = os.getloadavg()
    out["steal"] = stolen
    out["hot_path_profile"] = hot_path
    return out


def markdown(res: dict) -> str:
    lines = [
        "# Gateway overhead at concurrency 1",
        "",
        f"Same run, interleaved: {res['rounds']} rounds x {res['requests_per_round']} sequential requests per "
        f"system; echo model (FP32 1x16) on CPU Triton; {res['cpus']} CPUs shared with other work.",
        f"Command: `.venv/bin/python -m bench.gateway_overhead --profile --rounds {res['rounds']} "
        f"--requests {res['requests_per_round']}`",
        "",
        "The `relay` rows are the floor: a bare TCP relay process (`bench.relay`, on the gateway's event loop, parses nothing) "
        "between the same client and Triton. What it adds is what any extra process in the path costs here.",
        "",
        "The grpc.aio rows are floors of a Python gRPC front door (`bench.grpc_echo`, on the gateway's event loop, no scheduling, "
        f"validation or metrics): `{GRPC_ECHO}` answers each ModelInfer at once with its inputs, calling no "
        f"Triton; `{GRPC_VIA_HTTP}` sends its tensors to Triton over HTTP with the gateway's own replica client "
        f"and answers with Triton's outputs (what the gateway's gRPC path does, less the gateway); "
        f"`{GRPC_VIA_GRPC}` hands the request's bytes, unparsed, to Triton's gRPC endpoint and returns the "
        "answer's bytes (the least any Python gRPC proxy does). Their 'added' column is their round trip minus "
        "Triton's.",
        "",
        "| client protocol | gateway -> Triton | Triton p50 ms | gateway p50 ms | added p50 ms | Triton p99 ms | gateway p99 ms | added p99 ms | limit 0.5/1.5 | goal 0.3/1.0 | gateway CPU µs/request |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        floor = r["backend"] in ("relay", *GRPC_FLOORS)
        lines.append(
            f"| {r['client']} | {r['backend'] + ' (floor)' if floor else r['backend']} | {r['direct_p50_ms']:.3f} | {r['gateway_p50_ms']:.3f} | **{r['added_p50_ms']:.3f}** | "
            f"{r['direct_p99_ms']:.3f} | {r['gateway_p99_ms']:.3f} | **{r['added_p99_ms']:.3f}** | "
            f"{'yes' if r['meets_limit'] else 'NO'} | {'yes' if r['meets_goal'] else 'no'} | "
            f"{r['gateway_cpu_us_per_request']:.0f} |"
        )
    c = res["policy_core"]
    f = res["refusal"]
    lines += ["", f"Refusal path (HTTP, a 1 µs `timeout` no batch can meet, answered 429 without calling "
              f"Triton), round trip from the same client: p50 {f['p50_ms']:.3f} ms, p99 {f['p99_ms']:.3f} ms, "
              f"{f['gateway_cpu_us_per_request']:.0f} µs of gateway CPU per refusal."]
    lines += features_markdown(res)
    lines += ["", f"Policy core alone (in-process, default EdfScheduler, same profile): submit+poll "
              f"{c['submit_poll_us']:.0f} µs, on_complete+poll {c['complete_poll_us']:.0f} µs per request "
              "(the driver skips the second poll when nothing is queued).",
              f"Load average during the run: {', '.join(f'{x:.1f}' for x in res['load_average'])} "
              f"on {res['cpus']} CPUs" + (f"; {res['steal']:.1%} of all CPU time stolen by the hypervisor "
                                          "while it measured." if res.get("steal") is not None else ".")]
    if res.get("hot_path_profile"):
        lines += ["", "## Where the time goes (pyinstrument, gateway process)", "",
                  res.get("hot_path_notes", ""), "", "```", res["hot_path_profile"].strip()[:12000], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="sequential requests per system per round")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--profile", action="store_true", help="also profile the gateway with pyinstrument")
    ap.add_argument("--notes", default="", help="text placed above the profile in the markdown")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--baseline-ref", default=BASELINE_REF,
                    help="git commit the features' gateways are served from (a clean clone of it)")
    ap.add_argument("--baseline-without", default=",".join(BASELINE_WITHOUT),
                    help="commits reverted, in order, for the build without tracing (comma-separated)")
    ap.add_argument("--no-features", action="store_true", help="skip the optional-features section")
    args = ap.parse_args(argv)
    exit_on_sigterm()  # what it started is stopped on the way out
    without = tuple(c for c in args.baseline_without.split(",") if c)
    res = run(args.requests, args.rounds, args.profile, args.baseline_ref, without, not args.no_features)
    res["hot_path_notes"] = args.notes
    write_results(args.out, "gateway_overhead", res, markdown(res))
    print(markdown(res).split("## Where")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
