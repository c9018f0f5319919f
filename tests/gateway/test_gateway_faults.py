"""Faults against real Triton: a replica killed with SIGKILL under load loses no request and is
re-admitted after restart; SIGTERM drains in-flight requests before the gateway exits."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import yaml
from tritonclient.utils import InferenceServerException

from gateway.app import GatewayThread
from gateway.config import parse_config
from profiles.emulator import write_emulated_model
from profiles.profile import LatencyPoint, Profile, Provenance, save_profiles
from profiles.triton.server import TritonServer, free_port

pytestmark = pytest.mark.integration


def slow_profile(name: str, b1_ms: float, b8_ms: float) -> Profile:
    """A small emulated model: t(1) = b1_ms, t(8) = b8_ms, linear between, max batch 8."""
    return Profile(name, name, "EMU", "slice", 8,
                   (LatencyPoint(1, b1_ms / 1e3, b1_ms / 1e3), LatencyPoint(8, b8_ms / 1e3, b8_ms / 1e3)),
                   provenance=Provenance("test", "emulated"))


def write_replica(repo, variant: str, profile: Profile) -> None:
    write_emulated_model(repo, variant, profile, slice_id=f"{variant}/slice")


def _x() -> grpcaio.InferInput:
    x = grpcaio.InferInput("INPUT0", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    return x


async def _one(client: grpcaio.InferenceServerClient, model: str, out: list) -> None:
    t = time.monotonic()
    try:
        r = await client.infer(model, [_x()])
        out.append((t, "ok", r.get_response().parameters["headrace_replica"].string_param))
    except InferenceServerException as e:
        out.append((t, e.status() or "error", str(e.message())))


async def _open_loop(client, model: str, rate: float, duration: float, out: list) -> int:
    """Constant-rate open loop; returns how many requests were sent."""
    tasks, start, n = [], time.monotonic(), 0
    while (due := start + n / rate) < start + duration:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        tasks.append(asyncio.create_task(_one(client, model, out)))
        n += 1
    await asyncio.gather(*tasks)
    return n


def test_kill9_one_of_two_replicas_under_load(tmp_path):
    # each replica: t(b) = 30 + 10 (b - 1) ms, max batch 8 -> 80 req/s; two -> 160; load 60%
    prof = slow_profile("emu", 30.0, 100.0)
    save_profiles(tmp_path / "emu.yaml", [prof])
    repo_a, repo_b = tmp_path / "a", tmp_path / "b"
    write_replica(repo_a, "emu", prof)  # the same variant on two servers: two replicas of it
    write_replica(repo_b, "emu", prof)
    with TritonServer(repo_a) as ta, TritonServer(repo_b) as tb:
        cfg = parse_config({
            "listen": {"http_port": 0, "grpc_port": 0},
            "health_interval_s": 0.2,
            "expose_replicas": True,  # answers name the replica that served them
            "models": [{"name": "emu", "slo_ms": 5000, "max_batch": 8, "replicas": [
                {"id": "a", "url": ta.http_url, "variant": "emu", "profile": str(tmp_path / "emu.yaml")},
                {"id": "b", "url": tb.http_url, "variant": "emu", "profile": str(tmp_path / "emu.yaml")},
            ]}],
        })
        with GatewayThread(cfg) as gw:
            rep_b = gw.driver.replicas["b"]

            async def scenario() -> tuple[list, int, float]:
                client = grpcaio.InferenceServerClient(gw.grpc_url)
                out: list = []
                try:
                    load = asyncio.create_task(_open_loop(client, "emu", 96.0, 12.0, out))
                    await asyncio.sleep(2.0)
                    await asyncio.to_thread(tb.kill)  # SIGKILL to the whole process group
                    await asyncio.sleep(1.0)
                    await asyncio.to_thread(tb.restart)  # same ports
                    restarted = time.monotonic()
                    sent = await load
                finally:
                    await client.close()
                return out, sent, restarted

            out, sent, restarted = asyncio.run(scenario())
    # NOTE: every request gets exactly one answer, and almost all of them succeed
    assert len(out) == sent
    ok = [o for o in out if o[1] == "ok"]
    assert len(ok) >= 0.99 * sent, {o[2] for o in out if o[1] != "ok"}
    # the restarted replica was re-admitted: it serves again after the restart
    assert rep_b.healthy
    assert any(t > restarted and replica == "b" for t, _, replica in ok)


def test_sigterm_drains_in_flight_requests(tmp_path):
    prof = slow_profile("slowmo", 400.0, 400.0)  # every batch takes 0.4 s
    save_profiles(tmp_path / "slowmo.yaml", [prof])
    repo = tmp_path / "repo"
    write_replica(repo, "slowmo", prof)
    with TritonServer(repo) as triton:
        http_port, grpc_port = free_port(), free_port()
        (tmp_path / "gw.yaml").write_text(yaml.safe_dump({
            "listen": {"http_port": http_port, "grpc_port": grpc_port},
            "drain_timeout_s": 20,
            "models": [{"name": "slowmo", "slo_ms": 10000, "max_batch": 8, "replicas": [
                {"url": triton.http_url, "variant": "slowmo", "profile": "slowmo.yaml"}]}],
        }))
        proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "serve", "--config", str(tmp_path / "gw.yaml")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True,
        )
        try:
            _wait_ready(f"http://127.0.0.1:{http_port}/v2/health/ready", proc)

            async def scenario() -> list:
                client = grpcaio.InferenceServerClient(f"127.0.0.1:{grpc_port}")
                out: list = []
                try:
                    # 12 requests -> at least two 0.4 s batches back to back on one replica
                    tasks = [asyncio.create_task(_one(client, "slowmo", out)) for _ in range(12)]
                    await asyncio.sleep(0.2)
                    os.kill(proc.pid, signal.SIGTERM)
                    await asyncio.gather(*tasks)
                finally:
                    await client.close()
                return out

            out = asyncio.run(scenario())
            code = proc.wait(30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log = proc.stdout.read() if proc.stdout else ""
    # NOTE: everything admitted before SIGTERM is answered with its result, then it exits 0
    assert [o[1] for o in out] == ["ok"] * 12, out
    assert code == 0, log
    assert "draining" in log


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"gateway exited early: {proc.stdout.read() if proc.stdout else ''}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("gateway not ready")
