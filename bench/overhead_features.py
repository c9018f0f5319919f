"""The optional features' part of ``bench.gateway_overhead``: a gateway per feature (TLS, an
API key, tracing on, tracing configured but off, the access log on) and one built without
tracing, each measured with tritonclient over HTTP and gRPC against the plain gateway in the
same interleaved rounds (the rounds themselves are ``bench.gateway_overhead``'s).

The build without tracing is this repository at ``--baseline-ref`` in a clone of its own with
the commits that brought tracing and the access log in reverted (``--baseline-without``); the
plain gateway and every feature are served from a clean clone of the same commit, so work in
progress in the repository's folder changes none of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from profiles.triton.process import stop_group, wait_http_ready
from profiles.triton.server import TritonServer, free_port

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"  # a traced client's (sampled)
API_KEY = "bench-key-0123456789abcdef"
PLAIN, NO_TRACING_BUILD, TRACING_OFF = "plain", "build without tracing", "tracing configured, off"
FEATURES = (PLAIN, NO_TRACING_BUILD, TRACING_OFF, "tracing on", "tracing on, 1% sampled", "access log on", "TLS",
            "API key")
TRACING_OFF_LIMIT_MS = 0.02  # tracing off: p50 within this of a gateway without it
# gateways without the feature on, compared to 0.02 ms: several processes each, as two processes
# of the same code differ by about that much on their own
COPIES = {PLAIN: 3, NO_TRACING_BUILD: 3, TRACING_OFF: 3}
BASELINE_REF = "HEAD"
# the commits that brought tracing and the access log into the gateway, newest first
BASELINE_WITHOUT = ("42f7d9c", "80548ff", "f6bbfba", "d74d819")


class TritonClientTarget:
    """tritonclient, HTTP or gRPC, with TLS (``ca``: the CA file to trust) and headers as given."""

    def __init__(self, client: str, url: str, model: str, ca: Path | None = None,
                 headers: dict[str, str] | None = None) -> None:
        import tritonclient.grpc as tcg
        import tritonclient.http as tch

        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        self.model, self.headers = model, dict(headers) if headers else None  # tritonclient http adds to it
        if client == "http":
            tls = {"ssl": True, "ssl_options": {"ca_certs": str(ca)}} if ca else {}
            self.client = tch.InferenceServerClient(url, network_timeout=10.0, **tls)
            inp = tch.InferInput("INPUT0", [1, 16], "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            self.outputs = [tch.InferRequestedOutput("OUTPUT0", binary_data=True)]
        else:
            self.client = tcg.InferenceServerClient(url, ssl=ca is not None,
                                                    root_certificates=str(ca) if ca else None)
            inp = tcg.InferInput("INPUT0", [1, 16], "FP32")
            inp.set_data_from_numpy(x)
            self.outputs = [tcg.InferRequestedOutput("OUTPUT0")]
        self.inputs = [inp]

    def __call__(self) -> None:
        self.client.infer(self.model, self.inputs, outputs=self.outputs, headers=self.headers)

    def close(self) -> None:
        self.client.close()


def self_signed(work: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (openssl), the gateway's TLS and the clients' CA."""
    cert, key = work / "tls.crt", work / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    return cert, key


def feature_settings(work: Path, sink_port: int) -> tuple[dict[str, dict], dict[str, dict]]:
    """Each feature's gateway settings and its clients' options (``ca``, ``headers``)."""
    cert, key = self_signed(work)
    otlp = {"exporter": "otlp", "endpoint": f"http://127.0.0.1:{sink_port}", "sample_ratio": 1.0}
    settings = {
        TRACING_OFF: {"tracing": {"enabled": False, **otlp}},
        "tracing on": {"tracing": {"enabled": True, **otlp}},
        "tracing on, 1% sampled": {"tracing": {"enabled": True, **otlp, "sample_ratio": 0.01}},
        "access log on": {"access_log": {"enabled": True, "path": str(work / "access.jsonl")}},
        "TLS": {"tls": {"cert_file": str(cert), "key_file": str(key)}},
        "API key": {"tenants": [{"name": "bench", "keys": [{"sha256": hashlib.sha256(API_KEY.encode()).hexdigest()}]}]},
    }
    clients = {"tracing on": {"headers": {"traceparent": TRACEPARENT}}, "TLS": {"ca": cert},
               "API key": {"headers": {"authorization": f"Bearer {API_KEY}"}}}
    return settings, clients


def build_tree(ref: str, without: tuple[str, ...], tree: Path) -> str:
    """This repository at ``ref`` in a clone of its own at ``tree`` (``--shared``: nothing here
    changes) with the commits ``without`` reverted, in order; a hunk another commit has changed
    since keeps its current form (``-X ours``: e.g. a signature that gained other parameters),
    a file such a commit added is removed. Raises if an import of tracing or the access log is
    left. Returns which commit, without which."""
    root = Path(__file__).resolve().parent.parent
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "-C", str(tree)]
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(root), str(tree)], check=True)
    subprocess.run([*git, "checkout", "-q", ref], check=True)
    for c in without:
        if subprocess.run([*git, "revert", "--no-commit", "-X", "ours", c], capture_output=True).returncode:
            unmerged = subprocess.run([*git, "diff", "--name-only", "--diff-filter=U"], check=True,
                                      capture_output=True, text=True).stdout.split()
            subprocess.run([*git, "rm", "-q", *unmerged], check=True)
            subprocess.run([*git, "revert", "--quit"], check=True)
    left = subprocess.run(["grep", "-rlE", r"^\s*(from|import)\s+gateway\.(tracing|observe|accesslog)", "gateway"],
                          cwd=tree, capture_output=True, text=True).stdout.split()
    if without and left:
        raise RuntimeError(f"the build without tracing still imports it: {left}")
    head = subprocess.run([*git, "log", "-1", "--format=%h"], check=True, capture_output=True, text=True).stdout
    return f"{head.strip()} without {', '.join(without)}" if without else head.strip()


def start_tree_gateway(tree: Path, cfg_path: Path, ready: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``headrace serve`` from the source tree ``tree`` (its packages shadow the installed ones)."""
    with open(cfg_path.with_suffix(".log"), "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "serve", "--config", str(cfg_path),
                                 "--log-level", "WARNING"], cwd=tree, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, **(env or {})})
    why = wait_http_ready(ready, proc, 60.0)
    if why is not None:
        stop_group(proc)
        raise RuntimeError(f"the gateway built from {tree} {why}: {cfg_path.with_suffix('.log').read_text()[-2000:]}")
    return proc


def start_features(work: Path, base: dict, triton: TritonServer, ref: str, without: tuple[str, ...],
                   procs: dict, start_floor: Callable[..., subprocess.Popen]) -> tuple[dict, dict, dict]:
    """A gateway per feature, each measured by tritonclient over HTTP and gRPC; (targets,
    pid_of, notes); ``start_floor`` starts the OTLP receiver. All are served from clean clones of ``ref`` (uncommitted work in this
    folder changes none of them): the build without tracing from one with ``without`` reverted."""
    sink_port = free_port()
    procs["otlp sink"] = start_floor("bench.otlp_sink", sink_port, str(work / "otlp-spans.txt"))
    settings, client_opts = feature_settings(work, sink_port)
    current, baseline = work / "current-build", work / "baseline-build"
    notes: dict = {"commit": build_tree(ref, (), current), "baseline_commit": build_tree(ref, without, baseline)}
    ports: dict[tuple[str, int], tuple[int, int, int]] = {}
    # the copies of the gateways without the feature on take turns: none always follows another
    plain = [(n, i) for i in range(max(COPIES.values())) for n in FEATURES if i < COPIES.get(n, 1)]
    for name, copy in plain + [(n, 0) for n in FEATURES if n not in COPIES]:
        hp, gp, probe = free_port(), free_port(), free_port()
        cfg = {**base, "listen": {"http_port": hp, "grpc_port": gp}, **settings.get(name, {})}
        if name in ("TLS", "API key"):  # health probes on a plain listener of their own
            cfg["metrics_listen"] = {"port": probe}
        else:
            probe = hp
        path = work / f"gw-feature-{FEATURES.index(name)}-{copy}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        tree = baseline if name == NO_TRACING_BUILD else current
        # a tracing gateway exports every 50 ms (the SDK's default is 5 s): its exports land in
        # its own turn (the rounds wait for it to go idle), not in the next gateway's
        env = {"OTEL_BSP_SCHEDULE_DELAY": "50"} if name.startswith("tracing on") else None
        procs[f"feature/{name}/{copy}"] = start_tree_gateway(tree, path, f"127.0.0.1:{probe}", env)
        ports[(name, copy)] = (hp, gp, procs[f"feature/{name}/{copy}"].pid)
    targets, pid_of = {}, {}
    for client in ("http", "grpc"):
        direct = triton.http_url if client == "http" else triton.grpc_url
        targets[(f"tritonclient {client}", "triton")] = TritonClientTarget(client, direct, "echo")
        for (name, copy), (hp, gp, pid) in ports.items():
            key = (f"tritonclient {client}", name, copy)
            targets[key] = TritonClientTarget(client, f"127.0.0.1:{hp if client == 'http' else gp}", "echo",
                                              **client_opts.get(name, {}))
            pid_of[key] = pid
            if name.startswith("tracing on"):
                notes.setdefault("settle", set()).add(key)
    # the same request path in-process, with tracing configured but off and without tracing
    fake = [{"name": "m", "slo_ms": 1000, "max_batch": 8, "replicas": [
        {"url": "fake:1", "variant": "m", "profile": base["models"][0]["replicas"][0]["profile"]}]}]
    notes["in_process"] = {TRACING_OFF: (current, {"models": fake, **settings[TRACING_OFF]}),
                           NO_TRACING_BUILD: (baseline, {"models": fake})}
    notes["access_log"] = work / "access.jsonl"
    notes["otlp_spans"] = work / "otlp-spans.txt"
    return targets, pid_of, notes


# One request path in-process, no sockets: the HTTP door (parse, admit, answer) and the gRPC
# servicer's infer, through the driver and the policy core to a replica that answers at once.
# Run with the working directory at a source tree, whose packages it imports.
_IN_PROCESS = r"""
import asyncio, json, os, sys, time
sys.path.insert(0, os.getcwd())
import numpy as np
from tritonclient.grpc import model_config_pb2 as mc, service_pb2 as pb
from gateway.app import Gateway
from gateway.backends.grpc import ModelInfo
from gateway.codec import Signature, Tensor, TensorSig
from gateway.config import parse_config
from gateway.frontdoor.grpc import InferenceServicer
from gateway.frontdoor.httpserver import HttpRequest, HttpResponse

SIG = Signature({"x": TensorSig("x", "FP32", (16,))}, {"y": TensorSig("y", "FP32", (16,))}, max_batch_size=8)

class Echo:
    def __init__(self, *args):
        pass
    async def model_info(self, variant, timeout=5.0):
        return ModelInfo(SIG, pb.ModelMetadataResponse(name=variant, versions=["1"]), mc.ModelConfig(name=variant))
    async def ready(self, variant, timeout=1.0):
        return True
    async def close(self):
        pass
    async def infer(self, variant, inputs, timeout, *args, **kwargs):
        return [Tensor("y", "FP32", list(inputs[0].shape), bytes(inputs[0].raw))]

async def main(cfg, n, runs):
    gw = Gateway(parse_config(cfg), replica_factory=Echo)
    await gw.driver.start()
    door, grpc_infer = gw._http.handler, InferenceServicer(gw.driver, gw.info)._infer
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16],
                                   "parameters": {"binary_data_size": 64}}]}).encode()
    headers = {"inference-header-content-length": str(len(head))}
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 16])
    req.raw_input_contents.append(x.tobytes())

    async def http():
        ans = door(HttpRequest("POST", "/v2/models/m/infer", headers, head + x.tobytes(), time.monotonic()))
        if not isinstance(ans, HttpResponse):
            await ans.future
            ans = ans.make(ans.future)
        assert ans.status == 200, ans.body

    async def grpc():
        await grpc_infer(req, None)

    out = {}
    for name, one in (("http", http), ("grpc", grpc)):
        for _ in range(n // 10):
            await one()
        passes = []
        for _ in range(runs):
            t = time.perf_counter()
            for _ in range(n):
                await one()
            passes.append((time.perf_counter() - t) / n * 1e6)
        out[name] = min(passes)
    await gw.driver.stop()
    print(json.dumps(out))

asyncio.run(main(json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
"""


def in_process_cost(trees: dict[str, tuple[Path, dict]], alternations: int = 9, n: int = 3000) -> dict:
    """Microseconds per request of the same path in-process (no sockets, an instant replica) in
    each (tree, gateway config): the fastest of ``alternations`` runs taken in turn, each the
    fastest of 3 passes of ``n`` requests (the least disturbed by whatever else the machine does,
    as timeit takes the minimum)."""
    runs: dict[str, dict[str, list[float]]] = {name: {"http": [], "grpc": []} for name in trees}
    for _ in range(alternations):
        for name, (tree, cfg) in trees.items():
            done = subprocess.run([sys.executable, "-c", _IN_PROCESS, json.dumps(cfg), str(n), "3"], cwd=tree,
                                  capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"in-process run in {tree} failed: {done.stderr[-2000:]}")
            for proto, us in json.loads(done.stdout.strip().splitlines()[-1]).items():
                runs[name][proto].append(us)
    return {name: {proto: min(v) for proto, v in by.items()} | {"runs": by} for name, by in runs.items()}


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1e3, q))


def feature_rows(samples: dict, cpu: dict) -> list[dict]:
    """Each feature against the plain gateway, measured by the same client in the same rounds;
    a feature served by several processes is their samples pooled (``p50_ms_each``: each one's)."""
    rows = []
    for client in ("tritonclient http", "tritonclient grpc"):
        keys = {name: [k for k in samples if k[:2] == (client, name)] for name in FEATURES}
        if not keys[PLAIN]:
            continue

        def pooled(name: str) -> tuple[list[float], float]:
            return sum((samples[k] for k in keys[name]), []), sum(cpu[k] for k in keys[name])  # noqa: B023

        (plain, plain_cpu), direct = pooled(PLAIN), samples[(client, "triton")]
        for name in FEATURES:
            if not keys[name]:
                continue
            g, g_cpu = pooled(name)
            row = {"client": client, "gateway": name, "processes": len(keys[name]),
                   "triton_p50_ms": pct(direct, 50), "p50_ms": pct(g, 50), "p99_ms": pct(g, 99),
                   "p50_ms_each": [pct(samples[k], 50) for k in keys[name]],
                   "gateway_cpu_us_per_request": g_cpu / len(g) * 1e6}
            row["added_p50_ms"] = row["p50_ms"] - pct(plain, 50)
            row["added_p99_ms"] = row["p99_ms"] - pct(plain, 99)
            row["added_cpu_us_per_request"] = row["gateway_cpu_us_per_request"] - plain_cpu / len(plain) * 1e6
            rows.append(row)
    return rows


def features_markdown(res: dict) -> list[str]:
    rows = res.get("features") or []
    if not rows:
        return []
    notes = res.get("features_notes", {})
    lines = ["", "## Optional features, measured with tritonclient", "",
             f"Each feature's own gateway (HTTP to Triton, otherwise the plain gateway's settings), served from a "
             f"clean clone of `{notes.get('commit')}`, against the plain gateway, measured by the same tritonclient client in the same interleaved rounds: what the "
             "feature adds to a request's round trip and to the gateway's CPU per request. `tracing on` exports "
             "every span (sample_ratio 1) over OTLP/gRPC to a receiver process that keeps nothing, and its client "
             "sends a sampled `traceparent`; with `1% sampled` the client sends none and the gateway records one "
             "trace in 100 (the others still carry a `traceparent` to Triton). Both export every 50 ms "
             "(`OTEL_BSP_SCHEDULE_DELAY=50`; the SDK's default is 5 s) and each of their turns ends when their "
             "process is idle, so their exports are counted in their own turn; `access log on` writes every request to a file; `TLS` is ECDSA "
             "P-256 on kept-alive connections; `API key` sends `Authorization: Bearer`. `build without tracing` "
             f"is `{notes.get('baseline_commit')}`: the commits that brought tracing and the access log in, "
             "reverted in a clone of its own (where later commits changed the same lines, those lines keep "
             "their later form: the `trace` keyword of `Driver.submit` stays, unused); "
             "`tracing configured, off` has a `tracing:` section with `enabled: false`. These three are served "
             f"by {COPIES[PLAIN]} processes each, their samples pooled (processes of the same code differ at p50 on "
             "their own, by more than 0.02 ms on this shared machine: each process's p50 is in the last column).", "",
             "| client | gateway | Triton direct p50 ms | p50 ms | added p50 ms | p99 ms | added p99 ms | "
             "gateway CPU µs/request | added CPU µs/request | each process's p50 ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        each = ", ".join(f"{x:.3f}" for x in r["p50_ms_each"]) if r["processes"] > 1 else ""
        lines.append(f"| {r['client']} | {r['gateway']} | {r['triton_p50_ms']:.3f} | {r['p50_ms']:.3f} | "
                     f"**{r['added_p50_ms']:+.3f}** | {r['p99_ms']:.3f} | **{r['added_p99_ms']:+.3f}** | "
                     f"{r['gateway_cpu_us_per_request']:.0f} | {r['added_cpu_us_per_request']:+.0f} | {each} |")
    lines.append("")
    for client in dict.fromkeys(r["client"] for r in rows):
        by = {r["gateway"]: r for r in rows if r["client"] == client}
        off = by.get(TRACING_OFF)
        for other in (PLAIN, NO_TRACING_BUILD):
            if off is None or other not in by:
                continue
            gap = off["p50_ms"] - by[other]["p50_ms"]
            lines.append(f"- {client}: tracing off vs {other}: p50 {gap:+.3f} ms "
                         f"({'within' if abs(gap) <= TRACING_OFF_LIMIT_MS else 'NOT within'} "
                         f"{TRACING_OFF_LIMIT_MS} ms)")
        spread = max(by[PLAIN]["p50_ms_each"]) - min(by[PLAIN]["p50_ms_each"])
        lines.append(f"- {client}: the plain processes' own p50s span {spread:.3f} ms")
    ip = res.get("features_in_process")
    if ip:
        off, without = ip[TRACING_OFF], ip[NO_TRACING_BUILD]
        lines.append(f"- in-process, the same request path without sockets to a replica that answers at once (the "
                     f"fastest of {len(off['runs']['http'])} runs taken in turn, each the fastest of 3 passes): HTTP {off['http']:.1f} µs per request with "
                     f"tracing configured off, {without['http']:.1f} µs without tracing ({off['http'] - without['http']:+.1f}); "
                     f"gRPC {off['grpc']:.1f} vs {without['grpc']:.1f} µs ({off['grpc'] - without['grpc']:+.1f})")
    lines.append(f"- access log lines written: {notes.get('access_log_lines')}; spans the OTLP receiver got: "
                 f"{notes.get('otlp_spans_received')}")
    return lines
