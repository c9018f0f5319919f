"""Front door isolation at full scale: each attack of :mod:`loadgen.attacks`, one client from
127.0.0.2, beside a well-behaved tritonclient load at half the model's capacity from 127.0.0.1
and readiness probes from 127.0.0.3 (:mod:`loadgen.isolation`); against ``headrace serve`` in
front of Triton, and against Triton itself (the ``tritonserver`` of the nvidia-pytriton wheel)
under the same attack. Each system's run without an attack is the baseline of its attainment.

    .venv/bin/python -m bench.isolation [--duration 20] [--only ATTACK ...] [--render]

Per attack and system: the well-behaved client's attainment (answered OK within the SLO; an
error is a miss) and p99, the probes' p99 and failures, the server's RSS before, at its peak
and after, and whether a valid 60 MiB request sent mid-attack was answered. Target: attainment
within 1 point of the same system's run without the attack, for every attack.

Writes bench/results/isolation.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient
import yaml

from bench.output import git_commit, write_results
from deploy.gateway_process import start_serve
from loadgen.attacks import ATTACKS
from loadgen.isolation import Outcome, measure
from profiles.emulator.repository import write_emulated_model
from profiles.profile import LatencyPoint, Profile, Provenance, save_profiles
from profiles.triton.process import stop_group
from profiles.triton.repository import DynamicBatching, TensorSpec
from profiles.triton.server import TritonServer, free_port

RESULTS = Path(__file__).parent / "results"
NAME = "isolation"
SLO_S = 0.5
CAPACITY = 8 / 0.040  # the emulated model: 20 ms at batch 1, 40 ms at batch 8 -> 200 requests/s
BIG_BYTES = 60 << 20  # the valid large request sent during every attack


def _profile(name: str, b1_ms: float, b8_ms: float) -> Profile:
    return Profile(name, name, "EMU", "slice", 8,
                   (LatencyPoint(1, b1_ms / 1e3, b1_ms / 1e3), LatencyPoint(8, b8_ms / 1e3, b8_ms / 1e3)),
                   provenance=Provenance("bench.isolation", "emulated"))


def write_repo(tmp: Path, triton_batches: bool) -> dict[str, Path]:
    """The models: ``emu`` (the well-behaved client's), ``slow`` (a [-1] input: where the
    queued attack's valid 8 MiB requests wait) and ``big`` (a [-1] input: the valid 60 MiB request). Their profile files.
    ``triton_batches``: Triton's own dynamic batcher on (when clients call Triton directly)."""
    files = {}
    tmp.mkdir(parents=True, exist_ok=True)
    for name, b1, b8, dims in (("emu", 20.0, 40.0, (16,)), ("slow", 400.0, 500.0, (-1,)), ("big", 20.0, 40.0, (-1,))):
        prof = _profile(name, b1, b8)
        files[name] = tmp / f"{name}.yaml"
        save_profiles(files[name], [prof])
        write_emulated_model(tmp / "repo", name, prof, slice_id=f"{name}/slice",
                             input=TensorSpec("INPUT0", "FP32", dims), output=TensorSpec("OUTPUT0", "FP32", dims),
                             dynamic_batching=DynamicBatching() if triton_batches else None)
    return files


def big_request(url: str, done: list[bool]) -> None:
    """One valid 60 MiB request (binary tensor); appends whether it was answered OK."""
    x = httpclient.InferInput("INPUT0", [1, BIG_BYTES // 4], "FP32")
    x.set_data_from_numpy(np.ones((1, BIG_BYTES // 4), np.float32), binary_data=True)
    try:
        client = httpclient.InferenceServerClient(url, network_timeout=60.0, connection_timeout=60.0)
        r = client.infer("big", [x], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)],
                         headers={"x-headrace-slo-ms": "60000"})
        done.append(r.as_numpy("OUTPUT0").shape == (1, BIG_BYTES // 4))
        client.close()
    except Exception:  # noqa: BLE001  (any failure is a failure)
        done.append(False)


def one(attack: str | None, *, http: str, grpc: str, pid: int, duration: float) -> dict[str, Any]:
    big: list[bool] = []
    t = threading.Timer(2.0 + duration / 2, big_request, args=(http, big))
    t.start()
    o: Outcome = measure(attack, http=http, grpc=grpc, model="emu", pid=pid, rate=CAPACITY / 2,
                         duration=duration, slo_s=SLO_S, queue_model="slow")
    t.join()
    return {**o.as_dict(), "big_ok": bool(big and big[0])}


def run_system(system: str, attacks: list[str], duration: float, tmp: Path) -> list[dict[str, Any]]:
    files = write_repo(tmp / system, triton_batches=system == "triton")
    rows = []
    with TritonServer(tmp / system / "repo") as triton:
        if system == "triton":
            http, grpc, pid, gw = triton.http_url, triton.grpc_url, triton.pid, None
        else:
            http_port, grpc_port = free_port(), free_port()
            cfg = tmp / system / "gw.yaml"
            cfg.write_text(yaml.safe_dump({
                "listen": {"http_port": http_port, "grpc_port": grpc_port},
                "models": [{"name": m, "slo_ms": 60_000 if m == "big" else 5000, "max_batch": 8, "replicas": [
                    {"url": triton.http_url, "variant": m, "profile": str(files[m])}]} for m in files],
            }))
            gw = start_serve(cfg, f"127.0.0.1:{http_port}", tmp / system / "gw.log")
            http, grpc, pid = f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", gw.pid
        try:
            for attack in [None, *attacks]:
                row = {"system": system, **one(attack, http=http, grpc=grpc, pid=pid, duration=duration)}
                alive = triton.proc.poll() is None and (gw is None or gw.poll() is None)
                row["server_alive"] = alive
                rows.append(row)
                print(f"{system:8s} {row['attack']:10s} attainment {row['attainment']:.4f} p99 {row['p99_ms']:.0f} ms "
                      f"probes p99 {row['probe_p99_ms']:.0f} ms ({row['probe_failures']} failed) RSS "
                      f"{row['rss_before_mib']:.0f}/{row['rss_peak_mib']:.0f}/{row['rss_after_mib']:.0f} MiB "
                      f"big {'ok' if row['big_ok'] else 'FAILED'}", flush=True)
                if not alive:
                    print(f"{system}: the server died under {attack}; later attacks not run", flush=True)
                    break
        finally:
            if gw is not None:
                stop_group(gw)
    return rows


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per attack, headrace's attainment against its own run without an attack."""
    base = {r["system"]: r["attainment"] for r in rows if r["attack"] == "none"}
    out = {}
    for r in rows:
        if r["system"] != "headrace" or r["attack"] == "none":
            continue
        drop = base["headrace"] - r["attainment"]
        out[r["attack"]] = {"drop_points": round(100 * drop, 2), "met": drop <= 0.01 and r["big_ok"]}
    return {"per_attack": out, "all_met": bool(out) and all(v["met"] for v in out.values())}


def render(res: dict[str, Any]) -> str:
    s = res["settings"]
    lines = [
        "# Front door isolation: one client attacking, everyone else measured",
        "",
        f"Commit `{res['commit']}`, {s['duration_s']:g} s per attack after {s['warmup_s']:g} s of warm-up, "
        f"a tritonclient HTTP open loop at {s['rate']:g} requests/s (half the emulated model's capacity), "
        f"SLO {s['slo_ms']:g} ms; probes every 100 ms from another address; a valid 60 MiB request "
        f"mid-attack. Host: {res['host']}.",
        "",
        "| attack | system | attainment | p99 ms | probes p99 ms (failed) | RSS before / peak / after MiB | 60 MiB request |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in res["rows"]:
        lines.append(f"| {r['attack']} | {r['system']} | {100 * r['attainment']:.2f}% | {r['p99_ms']:.0f} | "
                     f"{r['probe_p99_ms']:.0f} ({r['probe_failures']}) | {r['rss_before_mib']:.0f} / "
                     f"{r['rss_peak_mib']:.0f} / {r['rss_after_mib']:.0f} | {'answered' if r['big_ok'] else 'failed'}"
                     f"{'' if r.get('server_alive', True) else ' (server died)'} |")
    v = res["verdict"]
    lines += ["", "Target: headrace's attainment within 1 point of its run without an attack, and the "
              "60 MiB request answered, for every attack: " + ("met." if v["all_met"] else "**not met**: " + ", ".join(
                  f"{a} ({x['drop_points']:+.2f} points)" for a, x in v["per_attack"].items() if not x["met"])), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.isolation", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--only", nargs="*", choices=sorted(ATTACKS), help="these attacks (default: all)")
    p.add_argument("--systems", nargs="*", default=["headrace", "triton"], choices=["headrace", "triton"])
    p.add_argument("--render", action="store_true", help="rewrite the markdown from the JSON")
    p.add_argument("--out", default=str(RESULTS))
    a = p.parse_args(argv)
    if a.render:
        res = json.loads((Path(a.out) / f"{NAME}.json").read_text())
        write_results(a.out, NAME, res, render(res))
        return 0
    attacks = a.only or list(ATTACKS)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="headrace-isolation-") as tmp:
        for system in a.systems:
            rows += run_system(system, attacks, a.duration, Path(tmp))
    commit = git_commit()
    res = {"commit": commit, "host": f"{platform.node()} ({len(__import__('os').sched_getaffinity(0))} cores)",
           "settings": {"duration_s": a.duration, "warmup_s": 2.0, "rate": CAPACITY / 2, "slo_ms": SLO_S * 1e3,
                        "attacks": attacks, "systems": a.systems},
           "rows": rows, "verdict": verdict(rows), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_results(a.out, NAME, res, render(res))
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
