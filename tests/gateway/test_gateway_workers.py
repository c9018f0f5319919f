"""``headrace serve --workers N``: N gateway processes share the HTTP and gRPC ports, each
sends batches only to its own replicas (never two workers to one replica at once), a worker
that dies is started again while the others keep serving, and the parent stops them all.

The invariant is checked at the replicas: each echo backend (max_inflight 1 in the gateway's
config, every batch held 20 ms) records the most batches it held at once and the client ports
they came from, and the ports are mapped to the worker processes through /proc. The same
probe run against two gateways that share the replicas sees two batches at once, so it can
tell."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml

from bench.echo_backend import start_echo
from bench.gateway_scaleout import Serve, scrape
from gateway.app import GatewayThread
from gateway.config import parse_config
from gateway.errors import ConfigError
from gateway.workers import (
    RESTART_MAX_S,
    Supervisor,
    Worker,
    layout,
    local_partition,
    restart_delay,
)
from profiles.profile import LatencyPoint, Profile, Provenance, save_profiles
from profiles.triton.process import stop_group
from profiles.triton.server import free_port

HOLD_S = 0.02


# --------------------------------------------------------------------------- builders


class Echoes:
    """``n`` echo backends on a loop in a background thread."""

    def __init__(self, n: int, hold_s: float = HOLD_S) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers, self.stats, self.ports = [], [], []
        for _ in range(n):
            srv, st = asyncio.run_coroutine_threadsafe(start_echo(0, hold_s), self.loop).result(10)
            self.servers.append(srv)
            self.stats.append(st)
            self.ports.append(srv.sockets[0].getsockname()[1])

    def reset(self) -> None:
        for st in self.stats:
            st.requests = st.max_inflight = 0
            st.peers.clear()

    def close(self) -> None:
        for srv in self.servers:
            self.loop.call_soon_threadsafe(srv.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def fleet_doc(tmp: Path, ports: list[int], http_port: int = 0, grpc_port: int = 0) -> dict:
    prof = Profile("echo", "echo", "CPU", "cpu", 4, (LatencyPoint(1, HOLD_S, HOLD_S), LatencyPoint(4, HOLD_S, HOLD_S)),
                   provenance=Provenance("tests: echo backend holding each batch", "measured"))
    save_profiles(tmp / "echo.yaml", [prof])
    return {"listen": {"host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port},
            "drain_timeout_s": 2, "models": [{"name": "echo", "slo_ms": 5000, "max_batch": 4, "replicas": [
                {"url": f"127.0.0.1:{p}", "variant": "echo", "profile": "echo.yaml", "max_inflight": 1}
                for p in ports]}]}


def load(http_port: int, grpc_port: int, clients: int = 12, each: int = 25) -> int:
    """``clients`` threads, each on its own connection (half HTTP, half gRPC), ``each``
    requests in a row; returns how many were answered with the rows sent."""
    def one(k: int) -> int:
        rows = np.full((1, 4), k, dtype=np.float32)
        ok = 0
        if k % 2:
            c = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            x = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        else:
            c = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
            x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(rows)
        try:
            for _ in range(each):
                ok += bool((c.infer("echo", [x]).as_numpy("OUTPUT0") == rows).all())
        finally:
            c.close()
        return ok

    with ThreadPoolExecutor(clients) as pool:
        return sum(pool.map(one, range(clients)))


def socket_ports(pid: int) -> set[int]:
    """Local TCP ports of the sockets process ``pid`` holds (/proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[9] in inodes:
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


# --------------------------------------------------------------------------- the invariant, live


@pytest.mark.integration
def test_workers_share_the_ports_and_never_send_two_batches_to_one_replica(tmp_path: Path):
    echoes = Echoes(4)
    http_port, grpc_port = free_port(), free_port()
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump(fleet_doc(tmp_path, echoes.ports)))
    serve = Serve(tmp_path / "gw.yaml", 2, http_port, grpc_port)
    try:
        serve.wait_for("2 workers")
        assert load(http_port, grpc_port) == 12 * 25
        pids = serve.pids()
        owners = {}
        for port, st in zip(echoes.ports, echoes.stats, strict=True):
            # NOTE: a replica never holds two batches at once: only one worker sends to it
            assert st.max_inflight <= 1, f"replica :{port} held {st.max_inflight} batches at once"
            holders = {i for i, pid in pids.items() if st.peers & socket_ports(pid)}
            assert len(holders) <= 1, f"replica :{port} got batches from workers {holders}"
            if holders:  # (a light load may need only one of a worker's two replicas)
                owners[port] = holders.pop()
        assert sorted(set(owners.values())) == [0, 1]  # both workers sent batches, each to its own
        assert all(list(owners.values()).count(w) <= 2 for w in (0, 1))  # two replicas each
        # each worker counts its own answers on its own metrics port; together, every answer
        served = [scrape(f"http://{line.split()[-1]}/metrics")[0]
                  for line in serve.lines if line.startswith("headrace gateway: worker ")]
        assert len(served) == 2 and min(served) > 0 and sum(served) == 12 * 25

        # a worker killed mid-run is started again; the other keeps answering meanwhile
        before = len(serve.lines)
        os.kill(pids[0], signal.SIGKILL)
        # once the kernel has closed its listener, new connections reach worker 1 only
        serve.wait_for(f"worker 0 (pid {pids[0]}) exited", after=before, timeout=10)
        assert load(http_port, grpc_port, clients=4, each=10) == 40
        serve.wait_for("headrace gateway: worker 0 pid", after=before, timeout=30)
        serve.wait_for("headrace gateway worker 0: http", after=before, timeout=60)
        assert serve.pids()[0] != pids[0]
        echoes.reset()
        assert load(http_port, grpc_port) == 12 * 25
        assert max(st.max_inflight for st in echoes.stats) == 1

        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(30) == 0
        for pid in serve.pids().values():
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        stop_group(serve.proc, grace=10)
        echoes.close()


@pytest.mark.integration
def test_the_probe_sees_two_gateways_that_share_replicas(tmp_path: Path):
    # the control: two gateways given the whole fleet (no partition) overlap at the replicas
    echoes = Echoes(2)
    cfg_a = parse_config(fleet_doc(tmp_path, echoes.ports), base_dir=tmp_path)
    cfg_b = parse_config(fleet_doc(tmp_path, echoes.ports), base_dir=tmp_path)
    try:
        with GatewayThread(cfg_a) as a, GatewayThread(cfg_b) as b, ThreadPoolExecutor(2) as pool:
            done = list(pool.map(lambda g: load(g.http_port, g.grpc_port, clients=8, each=15), (a, b)))
        assert done == [120, 120]
        assert max(st.max_inflight for st in echoes.stats) == 2
    finally:
        echoes.close()


def test_too_few_replicas_for_the_workers_is_one_line_and_status_2(tmp_path: Path):
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump(fleet_doc(tmp_path, [9001, 9002])))
    r = subprocess.run([sys.executable, "-m", "deploy.cli", "serve", "--config", str(tmp_path / "gw.yaml"),
                        "--workers", "3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "headrace serve: --workers 3: every worker answers every model, so each model needs at least 3 replicas; "
        "fewer: echo (2) (use --workers 2 or more replicas; docs/scaleout.md)"]


# --------------------------------------------------------------------------- the parent's rules


def test_every_worker_holds_a_share_of_every_model(tmp_path: Path):
    doc = fleet_doc(tmp_path, [9001, 9002, 9003])
    doc["models"].append({**doc["models"][0], "name": "other"})
    doc["models"][1]["replicas"] = [{**r, "url": f"127.0.0.1:{9100 + i}"} for i, r in enumerate(doc["models"][0]["replicas"])]
    p = local_partition(parse_config(doc, base_dir=tmp_path), 3)
    assert p.everywhere()
    with pytest.raises(ConfigError, match="at least 4 replicas"):
        local_partition(parse_config(doc, base_dir=tmp_path), 4)


def test_ports_are_chosen_once_and_metrics_ports_count_up(tmp_path: Path):
    doc = fleet_doc(tmp_path, [9001, 9002], http_port=8000)
    picked = iter(range(40000, 40010))
    lay = layout(parse_config(doc, base_dir=tmp_path), 2, pick=lambda host: next(picked))
    assert (lay.http_port, lay.grpc_port, lay.metrics) == (8000, 40000, (("127.0.0.1", 40001), ("127.0.0.1", 40002)))
    doc["metrics_listen"] = {"port": 9500}
    lay = layout(parse_config(doc, base_dir=tmp_path), 2, pick=lambda host: 1)
    assert lay.metrics == (("127.0.0.1", 9500), ("127.0.0.1", 9501))
    doc["metrics_listen"] = {"port": 65535}
    with pytest.raises(ConfigError, match=r"metrics_listen.port \(65535\) \+ 2 workers runs past port 65535"):
        layout(parse_config(doc, base_dir=tmp_path), 2)


class FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        return self.returncode


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Scripted(Supervisor):
    """The supervisor's restart rule over fake processes and an injected clock."""

    def __init__(self, clock: Clock, tmp: Path) -> None:
        lay = layout(parse_config(fleet_doc(tmp, [9001, 9002]), base_dir=tmp), 2, pick=lambda host: 1)
        super().__init__(tmp / "gw.yaml", tmp, lay, "WARNING", clock)
        self.spawned: list[tuple[int, float]] = []

    def spawn(self, w: Worker) -> None:
        w.proc = FakeProc(1000 + len(self.spawned))  # type: ignore[assignment]
        w.started, w.due = self.clock(), None
        self.spawned.append((w.index, self.clock()))

    def reap(self, w: Worker) -> None:
        pass


def test_a_worker_that_keeps_dying_young_waits_longer_each_time(tmp_path: Path):
    assert [restart_delay(k) for k in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert restart_delay(40) == RESTART_MAX_S
    clock = Clock()
    sup = Scripted(clock, tmp_path)
    for w in sup.workers:
        sup.spawn(w)
    for delay in (0.5, 1.0, 2.0):
        sup.workers[1].proc.returncode = -9  # type: ignore[union-attr]
        clock.now += 1.0  # dies young
        sup.poll()
        started = len(sup.spawned)
        clock.now += delay - 0.01
        sup.poll()
        assert len(sup.spawned) == started  # not yet
        clock.now += 0.01
        sup.poll()
        assert sup.spawned[-1] == (1, clock.now)
    # a worker that served a while before dying starts over at the shortest delay
    clock.now += 3600
    sup.workers[1].proc.returncode = 1  # type: ignore[union-attr]
    sup.poll()
    assert sup.workers[1].due == clock.now + 0.5
    assert [i for i, _ in sup.spawned] == [0, 1, 1, 1, 1] and sup.restarts == 3
