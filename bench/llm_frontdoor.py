"""What the gateway's generative front door costs (issue 28): added TTFT and CPU per relayed token.

Three ways to one emulated engine (``headrace engine`` on a constant 1 ms step, so the engine's
own time barely varies), measured in the same run, rounds interleaved:

- **direct**: the client talks to the engine;
- **floor**: through a bare TCP relay (:mod:`bench.relay`) on the loop ``headrace serve`` runs,
  which copies the SSE bytes and parses nothing: what any proxy process in the path costs;
- **gateway**: through ``headrace serve`` (the OpenAI route, its checks, replica choice, the
  relay event by event, TTFT/TPOT metrics).

Part 1, added TTFT at concurrency 1: one streamed completion at a time (prompts of 100 and
8,000 tokens, 2 output tokens) on a kept-alive connection; TTFT is the time from sending the
request to reading the first ``data:`` event. Part 2, CPU per relayed token: concurrent streams
(one SSE event per token, nothing coalesced by the engine), the relaying process's CPU time
(user + system, /proc) over the tokens the clients read.

    .venv/bin/python -m bench.llm_frontdoor [--samples 300] [--streams 16 --tokens 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from bench.gateway_overhead import cpu_seconds, listening, settle, start_floor
from bench.host import cpu_times, steal_share
from bench.output import write_results
from deploy.gateway_process import start_serve
from loadgen.record import headrace_version
from profiles.llm.profile import LlmProfile, llm_profile_to_dict
from profiles.llm.steptime import StepTime
from profiles.llm.tokens import decode
from profiles.profile import Provenance
from profiles.triton.process import exit_on_sigterm, stop_group
from profiles.triton.server import free_port

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
MODEL = "bench-llm"
STEP_S = 0.001
TARGET_ADDED_TTFT_MS = 1.0
TARGET_TOKENS_PER_CPU_S = 25_000


def engine_profile() -> LlmProfile:
    """Every step 1 ms whatever it holds; a 16k context and room for a few hundred thousand tokens."""
    return LlmProfile(
        model="bench", variant=MODEL, gpu="CPU", slice="gpu", tp=1, memory_gb=2.0, weights_gb=0.5,
        activation_gb=0.0, kv_bytes_per_token=2048, max_model_len=16384,
        step_time=StepTime(layers=1, linear=((1, STEP_S), (65536, STEP_S))),
        provenance=Provenance("bench.llm_frontdoor: a constant step, so the engine's time is flat"))


def start_engine(work: Path, port: int) -> subprocess.Popen:
    path = work / "engine.yaml"
    path.write_text(yaml.safe_dump(llm_profile_to_dict(engine_profile())))
    log = open(work / "engine.log", "wb")  # noqa: SIM115  (the child's output, for as long as it runs)
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "engine", "--profile", str(path), "--port", str(port),
                             "--served-model-name", MODEL, "--max-num-seqs", "256",
                             "--max-num-batched-tokens", "16384"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    return listening(proc, port, 30.0, "headrace engine", work / "engine.log")


def request(prompt_tokens: int, max_tokens: int, port: int) -> bytes:
    body = json.dumps({"model": MODEL, "prompt": decode(range(100, 100 + prompt_tokens)), "max_tokens": max_tokens,
                       "stream": True, "ignore_eos": True}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (port, len(body), body))


class SseClient:
    """One kept-alive connection reading streamed completions as raw bytes."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def ttft(self, req: bytes) -> float:
        """Seconds from sending ``req`` to its first event; the rest is read to its end."""
        s = self.sock
        t0 = time.perf_counter()
        s.sendall(req)
        buf = b""
        first = None
        while True:
            data = s.recv(65536)
            if not data:
                raise RuntimeError("connection closed mid-answer")
            if first is None and b"data: " in data:
                first = time.perf_counter() - t0
            buf += data
            if b"data: [DONE]" in buf and buf.endswith(b"0\r\n\r\n"):
                if not buf.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(buf[:300].decode(errors="replace"))
                return first  # type: ignore[return-value]

    def close(self) -> None:
        self.sock.close()


async def stream_tokens(port: int, req: bytes) -> int:
    """Events (tokens) of one stream read to its end."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(req)
    n = 0
    tail = b""
    while True:
        data = await reader.read(1 << 16)
        if not data:
            break
        chunk = tail + data
        n += chunk.count(b"data: ") - tail.count(b"data: ")
        tail = chunk[-16:]
        if b"data: [DONE]" in chunk and chunk.endswith(b"0\r\n\r\n"):
            break
    writer.close()
    return n - 1  # less [DONE]


def throughput(port: int, pid: int | None, streams: int, tokens: int) -> dict:
    """``streams`` concurrent streams of ``tokens`` each; the relaying process's CPU per token."""
    req = request(100, tokens, port)

    async def run() -> list[int]:
        return await asyncio.gather(*(stream_tokens(port, req) for _ in range(streams)))

    if pid:
        settle(pid)
    c0 = cpu_seconds(pid) if pid else 0.0
    t0 = time.perf_counter()
    counts = asyncio.run(run())
    wall = time.perf_counter() - t0
    cpu = (cpu_seconds(pid) - c0) if pid else 0.0
    total = sum(counts)
    out = {"tokens": total, "wall_s": wall, "tokens_per_s": total / wall, "cpu_s": cpu}
    if pid:
        out["cpu_us_per_token"] = cpu / total * 1e6
        out["tokens_per_cpu_s"] = total / cpu if cpu else None
    return out


def run(samples: int, long_samples: int, rounds: int, streams: int, tokens: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="hr-bench-llm-"))
    eport, fport, gport = free_port(), free_port(), free_port()
    cfg = {"listen": {"host": "127.0.0.1", "http_port": gport, "grpc_port": free_port()},
           "llm_models": [{"name": MODEL, "replicas": [{"url": f"http://127.0.0.1:{eport}", "engine": "emulated"}]}]}
    (work / "gateway.yaml").write_text(yaml.safe_dump(cfg))
    procs: list[subprocess.Popen] = []
    try:
        engine = start_engine(work, eport)
        procs.append(engine)
        floor = start_floor("bench.relay", fport, f"127.0.0.1:{eport}")
        procs.append(floor)
        gateway = start_serve(work / "gateway.yaml", f"127.0.0.1:{gport}", work / "gateway.log")
        procs.append(gateway)
        targets = {"direct": (eport, None), "floor": (fport, floor.pid), "gateway": (gport, gateway.pid)}
        clients = {k: SseClient(port) for k, (port, _) in targets.items()}
        host0 = cpu_times()
        ttft: dict[str, dict[str, list[float]]] = {}
        for label, prompt, n in (("100", 100, samples), ("8k", 8000, long_samples)):
            reqs = {k: request(prompt, 2, port) for k, (port, _) in targets.items()}
            for k in targets:  # warm: connections, and the prompt in the engine's prefix cache for all three
                for _ in range(5):
                    clients[k].ttft(reqs[k])
            got: dict[str, list[float]] = {k: [] for k in targets}
            per_round = max(1, n // rounds)
            for _ in range(rounds):
                for k in targets:
                    got[k] += [clients[k].ttft(reqs[k]) for _ in range(per_round)]
            ttft[label] = got
        for c in clients.values():
            c.close()
        stolen = steal_share(host0, cpu_times())
        thr = {k: throughput(port, pid, streams, tokens) for k, (port, pid) in targets.items()}
    finally:
        for p in reversed(procs):
            stop_group(p)
    rows = []
    for label, got in ttft.items():
        direct = np.array(got["direct"])
        for k in ("floor", "gateway"):
            a = np.array(got[k])
            rows.append({"prompt": label, "via": k, "samples": len(a),
                         "ttft_p50_ms": float(np.percentile(a, 50) * 1e3), "ttft_p99_ms": float(np.percentile(a, 99) * 1e3),
                         "direct_p50_ms": float(np.percentile(direct, 50) * 1e3),
                         "direct_p99_ms": float(np.percentile(direct, 99) * 1e3),
                         "added_p50_ms": float((np.percentile(a, 50) - np.percentile(direct, 50)) * 1e3),
                         "added_p99_ms": float((np.percentile(a, 99) - np.percentile(direct, 99)) * 1e3)})
    return {"commit": headrace_version()["commit"],
            "command": (f".venv/bin/python -m bench.llm_frontdoor --samples {samples} --long-samples {long_samples} "
                        f"--rounds {rounds} --streams {streams} --tokens {tokens}"),
            "settings": {"engine_step_ms": STEP_S * 1e3, "max_tokens_ttft": 2, "streams": streams,
                         "tokens_per_stream": tokens, "rounds": rounds},
            "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "steal": stolen},
            "ttft": rows, "throughput": thr,
            "targets": {"added_ttft_p50_ms": TARGET_ADDED_TTFT_MS, "tokens_per_cpu_s": TARGET_TOKENS_PER_CPU_S}}


def markdown(res: dict) -> str:
    s, thr, tg = res["settings"], res["throughput"], res["targets"]
    lines = [
        "# The gateway's generative front door: added TTFT and CPU per relayed token",
        "",
        f"Commit `{res['commit']}`; `{res['command']}`. One emulated engine (every step {s['engine_step_ms']:g} ms), "
        f"reached directly, through a bare TCP relay (the floor) and through `headrace serve`; "
        f"{res['host']['cpus']} CPUs shared by the engine, the relays and the client.",
        "",
        "## Added TTFT at concurrency 1 (streamed completion, 2 output tokens)",
        "",
        "| prompt | via | samples | TTFT p50 ms | TTFT p99 ms | direct p50 ms | direct p99 ms | added p50 ms | added p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["ttft"]:
        lines.append(f"| {r['prompt']} | {r['via']} | {r['samples']} | {r['ttft_p50_ms']:.2f} | {r['ttft_p99_ms']:.2f} | "
                     f"{r['direct_p50_ms']:.2f} | {r['direct_p99_ms']:.2f} | {r['added_p50_ms']:+.2f} | "
                     f"{r['added_p99_ms']:+.2f} |")
    lines += [
        "",
        f"## Relayed tokens per CPU-second ({s['streams']} concurrent streams of {s['tokens_per_stream']} tokens, "
        "one SSE event per token)",
        "",
        "| via | tokens | wall s | tokens/s | relay CPU s | CPU µs per token | tokens per CPU-second |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for k, t in thr.items():
        per = f"{t['cpu_us_per_token']:.1f}" if "cpu_us_per_token" in t else "-"
        rate = f"{t['tokens_per_cpu_s']:,.0f}" if t.get("tokens_per_cpu_s") else "-"
        lines.append(f"| {k} | {t['tokens']} | {t['wall_s']:.2f} | {t['tokens_per_s']:,.0f} | "
                     f"{t['cpu_s']:.2f} | {per} | {rate} |")
    gw = next(r for r in res["ttft"] if r["via"] == "gateway" and r["prompt"] == "100")
    gw8k = next(r for r in res["ttft"] if r["via"] == "gateway" and r["prompt"] == "8k")
    rate = thr["gateway"].get("tokens_per_cpu_s") or 0.0
    lines += [
        "",
        f"Targets: added TTFT p50 <= {tg['added_ttft_p50_ms']:g} ms "
        f"({'met' if max(gw['added_p50_ms'], gw8k['added_p50_ms']) <= tg['added_ttft_p50_ms'] else 'missed'}: "
        f"{gw['added_p50_ms']:+.2f} ms at 100 tokens, {gw8k['added_p50_ms']:+.2f} ms at 8k); "
        f">= {tg['tokens_per_cpu_s']:,} relayed tokens per gateway CPU-second "
        f"({'met' if rate >= tg['tokens_per_cpu_s'] else 'missed'}: {rate:,.0f}).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=300, help="TTFT samples per target, 100-token prompt")
    ap.add_argument("--long-samples", type=int, default=150, help="TTFT samples per target, 8k-token prompt")
    ap.add_argument("--rounds", type=int, default=5, help="rounds the samples are interleaved in")
    ap.add_argument("--streams", type=int, default=16, help="concurrent streams in the throughput part")
    ap.add_argument("--tokens", type=int, default=1000, help="tokens per stream in the throughput part")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    exit_on_sigterm()
    res = run(args.samples, args.long_samples, args.rounds, args.streams, args.tokens)
    write_results(args.out, "llm_frontdoor", res, markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
