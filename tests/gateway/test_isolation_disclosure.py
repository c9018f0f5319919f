"""Nothing is disclosed (issue #31): no client-visible error, header or /metrics label names a
backend's address; /metrics on the main port, which shows every tenant's names and counts,
answers only a tenant allowed to read it; API keys can come from a file descriptor, and
``--workers`` hands its workers digests, so a restarted worker needs neither the file nor the
descriptor.

The live checks run an in-process gateway in front of real sockets: a Triton stand-in whose
infer answers 500 naming its own address (Triton behind a proxy can), one that goes away
after start, a gRPC replica and an OpenAI engine on ports where nothing listens. Every surface
a client can read is scraped for those ports."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from gateway.app import GatewayThread
from gateway.backends.grpc import ModelInfo, TritonReplica, signature_of
from gateway.backends.http import TritonHttpReplica
from gateway.codec import Tensor
from gateway.config import parse_config, resolve
from gateway.errors import BackendError, ConfigError
from gateway.frontdoor.security import fd_key_digest, load_tenants, with_key_digests
from gateway.partition import partition
from profiles.schema import TenantSpec
from profiles.triton.process import stop_group
from profiles.triton.server import free_port

PROFILE = "resnet50@A100-80GB/1g.10gb"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


# --------------------------------------------------------------------------- a Triton stand-in


def _metadata(name: str) -> bytes:
    return json.dumps({"name": name, "versions": ["1"], "platform": "stand-in",
                       "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
                       "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}]}).encode()


def _config(name: str) -> bytes:
    return json.dumps({"name": name, "max_batch_size": 8,
                       "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                       "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}).encode()


def _answer(status: bytes, body: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


class _StandIn(asyncio.Protocol):
    """KServe v2 HTTP: metadata, config and ready for any model; every infer answered 500 with
    an error that names this server's address and another backend's."""

    def __init__(self, owner: StandIn) -> None:
        self.owner, self.buf = owner, bytearray()

    def connection_made(self, t: asyncio.BaseTransport) -> None:
        self.t = t
        self.owner.conns.add(t)

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.conns.discard(self.t)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            n = next((int(h.split(":", 1)[1]) for h in head[1:] if h.lower().startswith("content-length:")), 0)
            if len(self.buf) < end + 4 + n:
                return
            del self.buf[:end + 4 + n]
            method, path = head[0].split(" ")[:2]
            self.t.write(self._reply(method, path.strip("/").split("/")))  # type: ignore[attr-defined]

    def _reply(self, method: str, parts: list[str]) -> bytes:
        if method == "POST":
            where = f"upstream 127.0.0.1:{self.owner.port} (and 10.9.8.7:8001) failed"
            return _answer(b"500 Internal Server Error", json.dumps({"error": where}).encode())
        if parts[:2] == ["v2", "health"] or parts[-1] == "ready":
            return _answer(b"200 OK")
        if len(parts) == 3 and parts[1] == "models":
            return _answer(b"200 OK", _metadata(parts[2]))
        if len(parts) == 4 and parts[3] == "config":
            return _answer(b"200 OK", _config(parts[2]))
        return _answer(b"404 Not Found")


class StandIn:
    """A :class:`_StandIn` server on a loop in a background thread; :meth:`stop` closes it and
    every connection to it (a backend gone)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.conns: set[asyncio.BaseTransport] = set()
        make = self.loop.create_server(lambda: _StandIn(self), "127.0.0.1", 0)
        self.server = asyncio.run_coroutine_threadsafe(make, self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        def close() -> None:
            self.server.close()
            for t in list(self.conns):
                t.abort()

        self.loop.call_soon_threadsafe(close)

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def call(url: str, method: str, path: str, body: Any = None, headers: dict | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        c.request(method, path, None if body is None else json.dumps(body), headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


INFER = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def infer_pb(model: str) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model)
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    return req


def shows(text: str, ports: list[int]) -> list[str]:
    """What in ``text`` names a backend: a loopback address, or ``:port`` of one of ``ports``."""
    return [s for s in ("127.0.0.1", "10.9.8.7", *(f":{p}" for p in ports)) if s in text]


# --------------------------------------------------------------------------- replica ids


def test_a_replica_without_an_id_is_its_variant_and_an_index_never_its_address():
    doc = {"models": [
        {"name": "a", "replicas": [{"url": "10.0.0.1:8000", "variant": "r50", "profile": PROFILE},
                                   {"url": "10.0.0.2:8000", "variant": "r50", "profile": PROFILE, "id": "r50#1"},
                                   {"url": "10.0.0.3:8000", "variant": "r18", "profile": PROFILE}]},
        {"name": "b", "replicas": [{"url": "10.0.0.4:8001", "variant": "r50", "profile": PROFILE,
                                    "protocol": "grpc"}]}],
        "llm_models": [{"name": "llama", "replicas": [{"url": "http://10.0.0.5:9000"}]}]}
    cfg = parse_config(doc)
    ids = [r.id for m in cfg.models for r in m.replicas] + [r.id for m in cfg.llm_models for r in m.replicas]
    # NOTE: an id configured is kept, and the defaults count past it: unique, in config order
    assert ids == ["r50#2", "r50#1", "r18#1", "r50#3", "llama#1"]
    assert [r.id for m in resolve(cfg) for r in m.replicas] == ids[:4]
    assert [r.id for m in parse_config(doc).models for r in m.replicas] == ids[:4]  # stable
    # a partition keeps the fleet's ids: each gateway names a replica as the whole fleet does
    two = partition(cfg, 2)
    assert sorted(r.id for c in two.configs for m in c.models for r in m.replicas) == sorted(ids[:4])


# --------------------------------------------------------------------------- backend errors


def test_backend_errors_name_the_variant_never_the_address(caplog):
    caplog.set_level(logging.INFO, logger="headrace.gateway")
    closed = free_port()
    stand_in = StandIn()
    x = [Tensor("INPUT0", "FP32", [1, 4], np.ones((1, 4), np.float32).tobytes())]

    async def errors() -> list[BackendError]:
        out = []
        for client in (TritonHttpReplica(f"127.0.0.1:{closed}"), TritonReplica(f"127.0.0.1:{closed}"),
                       TritonHttpReplica(f"127.0.0.1:{stand_in.port}")):
            for attempt in (client.infer("m", x, 5.0), client.model_info("m", 5.0), client.ready("m")):
                try:
                    await attempt
                except BackendError as e:
                    out.append(e)
            await client.close()
        return out

    try:
        errs = asyncio.run(errors())
    finally:
        stand_in.close()
    assert [e.grpc_code.name for e in errs] == ["UNAVAILABLE"] * 4 + ["INTERNAL"]
    for e in errs:
        assert str(e).startswith("m: ") and not shows(str(e), [closed, stand_in.port]), e
    assert errs[-1].at("m#1").args[0] == "replica m#1: m: INTERNAL: upstream <replica> (and <replica>) failed"
    # the address is in the gateway's own log: once per server that stops answering
    down = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(down) == 2 and all(f"127.0.0.1:{closed}" in m for m in down), down


# --------------------------------------------------------------------------- every surface, live


def test_no_client_visible_surface_names_a_backend_address():
    failing, leaving = StandIn(), StandIn()
    grpc_down, engine_down = free_port(), free_port()
    ports = [failing.port, leaving.port, grpc_down, engine_down]
    cfg = parse_config({
        "listen": {"http_port": 0, "grpc_port": 0}, "health_interval_s": 60, "startup_timeout_s": 10,
        "models": [
            {"name": "m", "slo_ms": 2000, "replicas": [
                {"url": f"127.0.0.1:{failing.port}", "variant": "m", "profile": PROFILE},
                {"url": f"127.0.0.1:{grpc_down}", "variant": "m", "profile": PROFILE, "protocol": "grpc"}]},
            {"name": "d", "slo_ms": 2000, "replicas": [
                {"url": f"127.0.0.1:{leaving.port}", "variant": "d", "profile": PROFILE}]}],
        "llm_models": [{"name": "llama", "replicas": [{"url": f"http://127.0.0.1:{engine_down}"}]}]})
    seen: list[tuple[str, str]] = []
    try:
        with GatewayThread(cfg) as gw:
            leaving.stop()  # d's only replica goes away; the health probe has not seen it yet
            for method, path, body in [
                ("POST", "/v2/models/m/infer", INFER), ("POST", "/v2/models/d/infer", INFER),
                ("POST", "/v1/completions", {"model": "llama", "prompt": "hi", "max_tokens": 1}),
                ("GET", "/metrics", None), ("GET", "/v2/models/stats", None), ("GET", "/v2/models/m/stats", None),
                ("GET", "/v2/models/m/config", None), ("GET", "/v2/models/m", None), ("GET", "/v2", None),
                ("GET", "/v2/models/m/ready", None), ("POST", "/v2/repository/index", {}),
                ("GET", "/v1/models", None)]:
                status, headers, data = call(gw.http_url, method, path, body)
                seen.append((f"{method} {path} -> {status}", f"{headers} {data.decode(errors='replace')}"))
            with grpc.insecure_channel(gw.grpc_url) as ch:
                stub = pbg.GRPCInferenceServiceStub(ch)
                for model in ("m", "d"):
                    try:
                        stub.ModelInfer(infer_pb(model), timeout=10)
                    except grpc.RpcError as e:
                        seen.append((f"gRPC ModelInfer {model} -> {e.code().name}",
                                     f"{e.details()} {e.trailing_metadata()}"))
                for name, fn, req in [("ModelConfig", stub.ModelConfig, pb.ModelConfigRequest(name="m")),
                                      ("ModelStatistics", stub.ModelStatistics, pb.ModelStatisticsRequest()),
                                      ("ModelMetadata", stub.ModelMetadata, pb.ModelMetadataRequest(name="m"))]:
                    seen.append((f"gRPC {name}", str(fn(req, timeout=10))))
    finally:
        failing.close()
        leaving.close()
    said = dict(seen)
    # the failures really were reached: m's replica answered 500, d's was gone, the engine is down
    assert said["POST /v2/models/m/infer -> 500"].count("replica m#1: m: INTERNAL: upstream <replica>") == 1
    assert "POST /v2/models/d/infer -> 503" in said and "POST /v1/completions -> 503" in said
    assert "gRPC ModelInfer m -> INTERNAL" in said
    assert 'replica="m#2"' in said["GET /metrics -> 200"] and 'replica="d#1"' in said["GET /metrics -> 200"]
    # NOTE: no surface names a backend's address
    leaks = {what: shows(text, ports) for what, text in seen if shows(text, ports)}
    assert not leaks, leaks


# --------------------------------------------------------------------------- /metrics and tenants


class EchoClient:
    """A replica client that answers ``OUTPUT0 = INPUT0`` at once (in-process, no socket)."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def infer(self, variant: str, inputs: list[Tensor], *args: Any, **kwargs: Any) -> list[Tensor]:
        return [Tensor("OUTPUT0", "FP32", list(inputs[0].shape), bytes(inputs[0].raw))]

    async def model_info(self, variant: str, timeout: float = 5.0) -> ModelInfo:
        md = json_format.Parse(_metadata(variant), pb.ModelMetadataResponse(), ignore_unknown_fields=True)
        cfg = json_format.Parse(_config(variant), mc.ModelConfig(), ignore_unknown_fields=True)
        return ModelInfo(signature_of(cfg), md, cfg)

    async def ready(self, variant: str, timeout: float = 1.0) -> bool:
        return True

    async def close(self) -> None:
        pass


OPS, SEARCH = "ops-7c1e5a90d2b34f68", "search-0e4b8d2c6a1f9357"


def test_metrics_on_the_main_port_answer_only_a_tenant_allowed_to_read_them():
    cfg = parse_config({
        "listen": {"http_port": 0, "grpc_port": 0},
        "tenants": [{"name": "search", "keys": [{"sha256": sha(SEARCH)}]},
                    {"name": "ops", "keys": [{"sha256": sha(OPS)}], "metrics": True}],
        "models": [{"name": "m", "replicas": [{"url": "127.0.0.1:1", "variant": "m", "profile": PROFILE}]}]})
    with GatewayThread(cfg, replica_factory=lambda _, url: EchoClient(url)) as gw:
        assert call(gw.http_url, "POST", "/v2/models/m/infer", INFER, {"x-api-key": SEARCH})[0] == 200
        status, _, data = call(gw.http_url, "GET", "/metrics", None, {"x-api-key": SEARCH})
        # NOTE: a tenant never reads another tenant's name or counts
        assert status == 403 and b"ops" not in data and b"headrace_" not in data, (status, data)
        assert call(gw.http_url, "GET", "/metrics")[0] == 401
        status, _, data = call(gw.http_url, "GET", "/metrics", None, {"Authorization": f"Bearer {OPS}"})
        assert status == 200 and b'code="200",tenant="search"' in data and b'code="403",tenant="search"' in data


# --------------------------------------------------------------------------- keys from a descriptor


def key_pipe(text: str) -> int:
    """The read end of a pipe holding ``text``, its write end closed."""
    r, w = os.pipe()
    os.write(w, text.encode())
    os.close(w)
    return r


def test_a_key_comes_from_a_file_descriptor_read_once_per_process():
    fd = key_pipe("  fd-key-1f3b9c\nnot the key\n")
    try:
        spec = TenantSpec.model_validate({"name": "t", "keys": [{"fd": fd}]})
        first = load_tenants([spec])
        assert first is not None and first.identify("fd-key-1f3b9c").name == "t"
        # the pipe is drained; a second load in this process (the operator checks, then serves) reuses it
        again = load_tenants([spec])
        assert again is not None and again.identify("fd-key-1f3b9c").name == "t"
    finally:
        os.close(fd)
    unused = TenantSpec.model_validate({"name": "t", "keys": [{"fd": 65_000}]})
    with pytest.raises(ConfigError, match=r"^tenants\.0\.keys\.0\.fd: file descriptor 65000 is not open"):
        load_tenants([unused])
    empty = key_pipe("\n \n")
    try:
        with pytest.raises(ConfigError, match=r"^here: file descriptor \d+ gives no key"):
            fd_key_digest(empty, "here")
    finally:
        os.close(empty)


def test_workers_are_handed_digests_so_no_key_has_to_be_read_again(tmp_path: Path):
    (tmp_path / "k").write_text("file-key-8d2e\n")
    fd = key_pipe("fd-key-5a7c\n")
    doc = {"tenants": [{"name": "a", "keys": [{"file": "k"}, {"env": "HEADRACE_TEST_KEY_B"}], "metrics": True},
                       {"name": "b", "keys": [{"fd": fd}]}],
           "models": [{"name": "m", "replicas": [{"url": "127.0.0.1:1", "variant": "m", "profile": PROFILE}]}]}
    try:
        handed = with_key_digests(doc, parse_config(doc, base_dir=tmp_path), tmp_path,
                                  environ={"HEADRACE_TEST_KEY_B": "env-key-31ab"})
    finally:
        os.close(fd)
    (tmp_path / "k").unlink()
    assert handed["tenants"] == [
        {"name": "a", "keys": [{"sha256": sha("file-key-8d2e")}, {"sha256": sha("env-key-31ab")}], "metrics": True},
        {"name": "b", "keys": [{"sha256": sha("fd-key-5a7c")}]}]
    # a worker started later: no file, no variable, no descriptor, and the same keys admitted
    tenants = load_tenants(parse_config(handed).tenants, environ={})
    assert tenants is not None
    assert [tenants.identify(k).name for k in ("file-key-8d2e", "env-key-31ab", "fd-key-5a7c")] == ["a", "a", "b"]
    assert doc["tenants"][1]["keys"] == [{"fd": fd}]  # the parent's own config is left as it was


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    s = StandIn()
    yield s
    s.close()


@pytest.mark.integration
def test_a_restarted_worker_admits_keys_from_a_file_and_a_descriptor(tmp_path: Path, stand_in: StandIn):
    (tmp_path / "a.key").write_text("file-key-c4d1\n")
    fd = key_pipe("fd-key-92be\n")
    http_port, grpc_port = free_port(), free_port()
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump({
        "listen": {"host": "127.0.0.1", "http_port": http_port, "grpc_port": grpc_port}, "drain_timeout_s": 1,
        "tenants": [{"name": "a", "keys": [{"file": "a.key"}]}, {"name": "b", "keys": [{"fd": fd}]}],
        "models": [{"name": "m", "replicas": [  # one per worker, both on the stand-in
            {"url": f"127.0.0.1:{stand_in.port}", "variant": "m", "profile": PROFILE, "id": f"m-{i}"}
            for i in range(2)]}]}))
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "serve", "--config", str(tmp_path / "gw.yaml"),
                             "--workers", "2", "--log-level", "WARNING"], pass_fds=(fd,), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    os.close(fd)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip() for line in proc.stdout), daemon=True).start()

    def wait_for(text: str, after: int = 0, timeout: float = 60.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end and proc.poll() is None:
            hit = next((x for x in lines[after:] if text in x), None)
            if hit is not None:
                return hit
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} in:\n" + "\n".join(lines[-20:]))

    def admitted() -> list[int]:
        return [call(f"127.0.0.1:{http_port}", "GET", "/v2/models/m", None, {"x-api-key": k})[0]
                for k in ("file-key-c4d1", "fd-key-92be", "nope")]

    try:
        wait_for("2 workers")
        (tmp_path / "a.key").unlink()  # gone after start: a restart must not need it
        worker0 = int(wait_for("headrace gateway: worker 0 pid").split()[5])
        before = len(lines)
        os.kill(worker0, signal.SIGKILL)
        metrics = wait_for("headrace gateway: worker 0 pid", after=before).split()[7]
        # the new worker 0 read its config (keys included) and listens, and did not die again
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if call(metrics, "GET", "/v2/health/live")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        assert call(metrics, "GET", "/v2/health/live")[0] == 200
        assert sum("exited" in x for x in lines) == 1, lines
        deadline = time.monotonic() + 30
        # NOTE: whichever worker the kernel picks, the file's key and the descriptor's still work
        while (got := [admitted() for _ in range(6)]) and time.monotonic() < deadline:
            if all(g == [200, 200, 401] for g in got):
                break
            time.sleep(0.2)
        assert all(g == [200, 200, 401] for g in got), (got, lines[-10:])
    finally:
        stop_group(proc, grace=5)
