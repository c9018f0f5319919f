"""The front door's security, over HTTP and gRPC, with real clients and an in-process gateway
whose replicas are fakes: TLS (tritonclient with ``ssl=True``, a raw ``grpc.secure_channel``),
mutual TLS (a client without a certificate, or with one another CA signed, is refused), API
keys per tenant (401 / UNAUTHENTICATED without one; health probes stay open), a tenant's quota
(429 / RESOURCE_EXHAUSTED, reason ``quota``) and priority class, counts by tenant, /metrics on
its own listener, TLS inside the connection limits, and one-line start-up errors."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.client
import json
import logging
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent.ssl
import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import uvloop
import yaml
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg
from tritonclient.utils import InferenceServerException

from deploy.cli import main
from gateway.app import Gateway, GatewayThread, make_core
from gateway.codec import Tensor
from gateway.config import parse_config
from gateway.frontdoor.httpserver import HttpResponse, HttpServer
from gateway.frontdoor.tls import load_tls
from gateway.policy.types import Priority
from profiles.schema import LimitsSpec
from tests.gateway.test_gateway_driver import FakeReplica
from tests.pki import Pki, make_pki

PROFILE = "resnet50@A100-80GB/1g.10gb"
GOLD, PLAIN, METERED = "gold-5b0e3c1d9a7f4e2b", "plain-c81f0a6e2d4b9735", "metered-4e7a91c0b3d5f268"
GOLD_ENV = "HEADRACE_TEST_GOLD_KEY"


# --------------------------------------------------------------------------- builders


class Echo(FakeReplica):
    """A replica that answers ``y = x`` at once."""

    async def infer(self, variant: str, inputs: list[Tensor], timeout: float | None, *args: Any,
                    **kwargs: Any) -> list[Tensor]:
        return [Tensor("y", "FP32", list(inputs[0].shape), bytes(inputs[0].raw))]


class Recording:
    """The gateway's policy core, noting the priority class of every request submitted."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.priorities: list[Priority] = []

    def submit(self, request: Any, now: float) -> Any:
        self.priorities.append(request.priority)
        return self.core.submit(request, now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def config(**settings: Any) -> dict:
    return {"listen": {"http_port": 0, "grpc_port": 0}, **settings,
            "models": [{"name": "m", "slo_ms": 2000, "max_batch": 8, "replicas": [
                {"url": "fake:9000", "variant": "v", "profile": PROFILE}]}]}


def tls(pki: Pki, mutual: bool = False) -> dict:
    return {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
            **({"client_ca_file": str(pki.ca)} if mutual else {})}


def tenants(key_dir: Path) -> list[dict]:
    (key_dir / "plain.key").write_text(PLAIN + "\n")
    return [{"name": "gold", "keys": [{"env": GOLD_ENV}], "priority": "best-effort", "metrics": True},
            {"name": "plain", "keys": [{"file": str(key_dir / "plain.key")}]},
            {"name": "metered", "keys": [{"sha256": sha(METERED)}], "quota": {"rate": 0.001, "burst": 2}}]


@contextlib.contextmanager
def gateway(core: Recording | None = None, **settings: Any) -> Iterator[Gateway]:
    cfg = parse_config(config(**settings))
    with GatewayThread(cfg, core=core, replica_factory=lambda _, url: Echo(url)) as gw:
        yield gw


def client_context(pki: Pki, cert: str | None = None) -> ssl.SSLContext:
    """A client's context trusting the test CA; ``cert``: present ``client`` or ``stranger``."""
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert:
        ctx.load_cert_chain(getattr(pki, f"{cert}_cert"), getattr(pki, f"{cert}_key"))
    return ctx


INFER = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.5, -2.0]}]}).encode()


def request(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
            ctx: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], bytes]:
    host, port = url.rsplit(":", 1)
    conn = (http.client.HTTPSConnection(host, int(port), context=ctx, timeout=10) if ctx
            else http.client.HTTPConnection(host, int(port), timeout=10))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def infer_pb(**parameters: int) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    req.raw_input_contents.append(np.array([[1.5, -2.0]], np.float32).tobytes())
    for k, v in parameters.items():
        req.parameters[k].int64_param = v
    return req


def rpc_error(fn: Any, req: Any, metadata: tuple = ()) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        fn(req, timeout=10, metadata=metadata)
    return e.value


def x_http() -> httpclient.InferInput:
    x = httpclient.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.5, -2.0]], np.float32))
    return x


def x_grpc() -> grpcclient.InferInput:
    x = grpcclient.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.5, -2.0]], np.float32))
    return x


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(params=["asyncio", "uvloop"])
def on_loop(request) -> Any:
    """Run a coroutine on the stock asyncio loop and on uvloop (``headrace serve``'s loop)."""
    factory = uvloop.new_event_loop if request.param == "uvloop" else None

    def go(coro: Any) -> Any:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coro)
    return go


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_gw(pki) -> Iterator[Gateway]:
    """TLS on both listeners, no client certificate asked, no tenants."""
    with gateway(tls=tls(pki)) as gw:
        yield gw


@pytest.fixture(scope="module")
def mtls_gw(pki) -> Iterator[Gateway]:
    with gateway(tls=tls(pki, mutual=True)) as gw:
        yield gw


@pytest.fixture(scope="module")
def keyed(tmp_path_factory) -> Iterator[tuple[Gateway, Recording]]:
    """Plain text, three tenants (gold: best-effort; plain: no class; metered: 2 requests then 0.001/s)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(GOLD_ENV, GOLD)
        core = Recording(make_core(parse_config(config())))
        with gateway(core, tenants=tenants(tmp_path_factory.mktemp("keys"))) as gw:
            yield gw, core


# --------------------------------------------------------------------------- TLS


def test_tritonclient_http_with_ssl_infers_through_the_gateway(tls_gw, pki):
    factory = lambda **_: gevent.ssl.create_default_context(cafile=str(pki.ca))  # noqa: E731
    c = httpclient.InferenceServerClient(tls_gw.http_url, ssl=True, ssl_context_factory=factory)
    try:
        assert c.is_server_ready()
        res = c.infer("m", [x_http()])
        np.testing.assert_array_equal(res.as_numpy("y"), [[1.5, -2.0]])
        assert c.get_model_metadata("m")["name"] == "m"
    finally:
        c.close()


def test_tritonclient_grpc_with_ssl_and_a_raw_secure_channel_infer_through_the_gateway(tls_gw, pki):
    c = grpcclient.InferenceServerClient(tls_gw.grpc_url, ssl=True, root_certificates=str(pki.ca))
    try:
        np.testing.assert_array_equal(c.infer("m", [x_grpc()]).as_numpy("y"), [[1.5, -2.0]])
    finally:
        c.close()
    creds = grpc.ssl_channel_credentials(root_certificates=pki.read("ca"))
    with grpc.secure_channel(tls_gw.grpc_url, creds) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
        out = stub.ModelInfer(infer_pb(), timeout=10)
        assert np.frombuffer(out.raw_output_contents[0], np.float32).tolist() == [1.5, -2.0]


def test_a_plain_text_client_on_the_tls_ports_fails_cleanly(tls_gw, pki):
    # NOTE: plain HTTP on the TLS port is told so in plain HTTP, not left hanging or reset
    status, _, body = request(tls_gw.http_url, "GET", "/v2/health/ready")
    assert status == 400 and "TLS" in json.loads(body)["error"]
    c = httpclient.InferenceServerClient(tls_gw.http_url)
    with pytest.raises(InferenceServerException, match="TLS"):
        c.infer("m", [x_http()])
    c.close()
    t = time.monotonic()
    with grpc.insecure_channel(tls_gw.grpc_url) as ch:
        e = rpc_error(pbg.GRPCInferenceServiceStub(ch).ServerLive, pb.ServerLiveRequest())
    assert e.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() - t < 5
    # and a client that does not trust the gateway's certificate refuses it
    with pytest.raises(ssl.SSLCertVerificationError):
        request(tls_gw.http_url, "GET", "/v2/health/ready", ctx=ssl.create_default_context())


def test_with_a_client_ca_only_clients_with_a_certificate_it_signed_are_served(mtls_gw, pki):
    status, _, _ = request(mtls_gw.http_url, "POST", "/v2/models/m/infer", INFER, ctx=client_context(pki, "client"))
    assert status == 200
    for cert in (None, "stranger"):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            request(mtls_gw.http_url, "POST", "/v2/models/m/infer", INFER, ctx=client_context(pki, cert))
    opts = {"ca_certs": str(pki.ca), "certfile": str(pki.client_cert), "keyfile": str(pki.client_key)}
    c = httpclient.InferenceServerClient(mtls_gw.http_url, ssl=True, ssl_options=opts)
    np.testing.assert_array_equal(c.infer("m", [x_http()]).as_numpy("y"), [[1.5, -2.0]])
    c.close()

    c = grpcclient.InferenceServerClient(mtls_gw.grpc_url, ssl=True, root_certificates=str(pki.ca),
                                         private_key=str(pki.client_key), certificate_chain=str(pki.client_cert))
    np.testing.assert_array_equal(c.infer("m", [x_grpc()]).as_numpy("y"), [[1.5, -2.0]])
    c.close()
    for cert in (None, "stranger"):
        creds = grpc.ssl_channel_credentials(pki.read("ca"), *(
            (getattr(pki, f"{cert}_key").read_bytes(), getattr(pki, f"{cert}_cert").read_bytes()) if cert else ()))
        with grpc.secure_channel(mtls_gw.grpc_url, creds) as ch:
            e = rpc_error(pbg.GRPCInferenceServiceStub(ch).ModelInfer, infer_pb())
        assert e.code() == grpc.StatusCode.UNAVAILABLE, (cert, e)


# --------------------------------------------------------------------------- API keys


OPEN = [("GET", "/v2/health/live"), ("GET", "/v2/health/ready")]
GUARDED = [("POST", "/v2/models/m/infer"), ("GET", "/v2/models/m"), ("GET", "/v2/models/m/ready"),
           ("GET", "/v2/models/m/config"), ("GET", "/v2/models/m/stats"), ("GET", "/v2/models/stats"),
           ("GET", "/v2"), ("POST", "/v2/repository/index"), ("GET", "/metrics"), ("GET", "/nosuch")]


@pytest.mark.parametrize(("method", "path"), GUARDED)
def test_http_every_call_but_the_health_probes_needs_a_valid_key(keyed, method, path):
    gw, _ = keyed
    body = INFER if path.endswith("infer") else None
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": GOLD + "x"}, {"Authorization": GOLD}):
        status, hdrs, raw = request(gw.http_url, method, path, body, headers)
        assert status == 401 and hdrs["www-authenticate"] == "Bearer", (headers, status)
        assert "API key" in json.loads(raw)["error"] and GOLD not in raw.decode()
    for headers in ({"Authorization": f"Bearer {GOLD}"}, {"x-api-key": PLAIN}, {"authorization": f"bearer {PLAIN}"}):
        status, _, _ = request(gw.http_url, method, path, body, headers)
        # NOTE: /metrics shows every tenant's counts: only a tenant with metrics: true reads it
        forbidden = path == "/metrics" and PLAIN in str(headers)
        assert status == (404 if path == "/nosuch" else 403 if forbidden else 200), (headers, status)


@pytest.mark.parametrize(("method", "path"), OPEN)
def test_http_health_probes_answer_without_a_key(keyed, method, path):
    assert request(keyed[0].http_url, method, path)[0] == 200


def test_grpc_every_rpc_but_the_health_probes_needs_a_valid_key(keyed):
    gw, _ = keyed
    with grpc.insecure_channel(gw.grpc_url) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
        calls = [(stub.ModelInfer, infer_pb()), (stub.ModelMetadata, pb.ModelMetadataRequest(name="m")),
                 (stub.ModelConfig, pb.ModelConfigRequest(name="m")), (stub.ModelReady, pb.ModelReadyRequest(name="m")),
                 (stub.ServerMetadata, pb.ServerMetadataRequest()), (stub.ModelStatistics, pb.ModelStatisticsRequest()),
                 (stub.RepositoryIndex, pb.RepositoryIndexRequest())]
        for fn, req in calls:
            for md in ((), (("authorization", "Bearer nope"),), (("x-api-key", PLAIN[:-1]),)):
                e = rpc_error(fn, req, md)
                assert e.code() == grpc.StatusCode.UNAUTHENTICATED and PLAIN not in e.details(), (fn, md)
            fn(req, timeout=10, metadata=(("authorization", f"Bearer {PLAIN}"),))
            fn(req, timeout=10, metadata=(("x-api-key", GOLD),))
        # a stream is refused before it reads anything, and served with a key
        with pytest.raises(grpc.RpcError) as e:
            list(stub.ModelStreamInfer(iter([infer_pb()]), timeout=10))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        out = list(stub.ModelStreamInfer(iter([infer_pb(), infer_pb()]), timeout=10, metadata=(("x-api-key", PLAIN),)))
        assert [o.error_message for o in out] == ["", ""]
    c = grpcclient.InferenceServerClient(gw.grpc_url)
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED"):
        c.infer("m", [x_grpc()])
    assert c.infer("m", [x_grpc()], headers={"authorization": f"Bearer {GOLD}"}).as_numpy("y").shape == (1, 2)
    c.close()


def test_a_tenant_over_its_quota_is_refused_429_with_retry_after_and_reason_quota(keyed):
    gw, _ = keyed
    key = {"x-api-key": METERED}
    # NOTE: burst 2, then 0.001/s: the third inference is over quota, over either protocol
    assert [request(gw.http_url, "POST", "/v2/models/m/infer", INFER, key)[0] for _ in range(2)] == [200, 200]
    status, hdrs, raw = request(gw.http_url, "POST", "/v2/models/m/infer", INFER, key)
    assert status == 429 and hdrs["x-headrace-reject-reason"] == "quota"
    assert int(hdrs["retry-after"]) >= 900 and "tenant 'metered' is over its quota" in json.loads(raw)["error"]
    assert request(gw.http_url, "GET", "/v2/models/m", None, key)[0] == 200  # a quota counts inferences only
    with grpc.insecure_channel(gw.grpc_url) as ch:
        e = rpc_error(pbg.GRPCInferenceServiceStub(ch).ModelInfer, infer_pb(), (("x-api-key", METERED),))
    trailing = dict(e.trailing_metadata())
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and trailing["x-headrace-reject-reason"] == "quota"
    assert int(trailing["retry-after"]) >= 900


def test_a_tenants_priority_class_reaches_the_scheduler_else_the_requests_own(keyed):
    gw, core = keyed
    del core.priorities[:]
    with_priority = lambda p: json.dumps({**json.loads(INFER), "parameters": {"priority": p}}).encode()  # noqa: E731
    # gold is best-effort whatever its requests ask; plain has no class: each request's own priority holds
    for key, body in ((GOLD, INFER), (GOLD, with_priority(1)), (PLAIN, INFER), (PLAIN, with_priority(2))):
        assert request(gw.http_url, "POST", "/v2/models/m/infer", body, {"x-api-key": key})[0] == 200
    with grpc.insecure_channel(gw.grpc_url) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        stub.ModelInfer(infer_pb(priority=1), timeout=10, metadata=(("x-api-key", GOLD),))
        stub.ModelInfer(infer_pb(priority=2), timeout=10, metadata=(("x-api-key", PLAIN),))
        stub.ModelInfer(infer_pb(), timeout=10, metadata=(("x-api-key", PLAIN),))
    B, G = Priority.BEST_EFFORT, Priority.GUARANTEED
    assert core.priorities == [B, B, G, B, B, B, G]


def scrape(url: str, headers: dict | None = None) -> dict[tuple[str, str], float]:
    status, _, raw = request(url, "GET", "/metrics", None, headers)
    assert status == 200
    out = {}
    for line in raw.decode().splitlines():
        if line.startswith("headrace_tenant_requests_total{"):
            labels, value = line[len("headrace_tenant_requests_total{"):].split("} ")
            d = dict(kv.split("=") for kv in labels.split(","))
            out[(d["tenant"].strip('"'), d["code"].strip('"'))] = float(value)
    return out


def test_requests_are_counted_by_tenant_and_answer_and_keys_are_never_logged(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(GOLD_ENV, GOLD)
    caplog.set_level(logging.DEBUG)
    with gateway(tenants=tenants(tmp_path), metrics_listen={"host": "127.0.0.1", "port": 0}) as gw:
        for headers in ({}, {"x-api-key": "nope"}, {"x-api-key": GOLD}, {"x-api-key": PLAIN}):
            request(gw.http_url, "POST", "/v2/models/m/infer", INFER, headers)
        request(gw.http_url, "GET", "/v2/models/nosuch", None, {"x-api-key": PLAIN})
        with grpc.insecure_channel(gw.grpc_url) as ch:
            stub = pbg.GRPCInferenceServiceStub(ch)
            rpc_error(stub.ModelInfer, infer_pb())
            stub.ModelInfer(infer_pb(), timeout=10, metadata=(("x-api-key", GOLD),))
            rpc_error(stub.ModelMetadata, pb.ModelMetadataRequest(name="nosuch"), (("x-api-key", GOLD),))
            stub.ServerLive(pb.ServerLiveRequest(), timeout=10)  # a probe is nobody's request
        for _ in range(3):
            request(gw.http_url, "GET", "/v2/health/ready")
        # NOTE: the metrics listener needs no key, and the main port no longer serves /metrics
        counts = scrape(gw.metrics_url)
        assert request(gw.http_url, "GET", "/metrics", None, {"x-api-key": GOLD})[0] == 404
        assert request(gw.metrics_url, "GET", "/v2/health/ready")[0] == 200
        assert request(gw.metrics_url, "GET", "/v2/models/m")[0] == 404
    assert counts == {("unauthenticated", "401"): 2, ("gold", "200"): 1, ("plain", "200"): 1, ("plain", "404"): 1,
                      ("unauthenticated", "UNAUTHENTICATED"): 1, ("gold", "OK"): 1, ("gold", "NOT_FOUND"): 1}
    assert GOLD not in caplog.text and PLAIN not in caplog.text


def test_metrics_listen_unset_keeps_metrics_on_the_main_port_behind_the_key(keyed):
    gw, _ = keyed
    assert gw.metrics_url is None
    assert request(gw.http_url, "GET", "/metrics")[0] == 401
    assert scrape(gw.http_url, {"x-api-key": GOLD})  # counts are there


# --------------------------------------------------------------------------- TLS within the limits


async def tls_server(pki: Pki, **limits: Any) -> HttpServer:
    def door(req):  # noqa: ANN001, ANN202
        return HttpResponse(200, json.dumps({"path": req.path, "len": len(req.body)}).encode(), "application/json")

    server = HttpServer(door, 8 << 20, limits=LimitsSpec(**limits),
                        ssl_context=load_tls(str(pki.server_cert), str(pki.server_key)).ssl_context())
    await server.start("127.0.0.1", 0)
    return server


def port_of(server: HttpServer) -> int:
    return server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def tls_get(port: int, ctx: ssl.SSLContext, path: str = "/v2/health/ready", body: bytes = b"") -> dict:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    method = "POST" if body else "GET"
    writer.write(b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (method.encode(), path.encode(),
                                                                                  len(body), body))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    n = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
    doc = json.loads(await asyncio.wait_for(reader.readexactly(n), 10))
    writer.close()
    await writer.wait_closed()
    return {"status": int(head.split()[1]), **doc}


async def until(pred: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.01)


def test_tls_connections_count_against_the_cap_from_accept_with_the_probe_room(on_loop, pki):
    async def main() -> None:
        server = await tls_server(pki, max_connections=3, probe_connections=1)
        port, ctx = port_of(server), client_context(pki)
        try:
            # NOTE: connections that never begin a handshake fill the cap as plain ones do
            idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
            await until(lambda: server.connections == 3)
            assert (await tls_get(port, ctx))["status"] == 200  # the probe room
            await until(lambda: server.connections == 3)
            probe_only = await tls_get(port, ctx, "/v2/models/m")
            assert probe_only["status"] == 503 and "max_connections" in probe_only["error"]
            await until(lambda: server.connections == 3)
            extra = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
            await until(lambda: server.refused_connections >= 1)
            assert server.connections == 4  # one in the probe room, the other closed at once
            for s in idle + extra:
                s.close()
            await until(lambda: server.connections == 0)
            assert (await tls_get(port, ctx, "/v2/models/m"))["status"] == 200
        finally:
            await server.stop(timeout=1)
    on_loop(main())


def test_a_tls_handshake_must_finish_within_the_header_timeout(on_loop, pki):
    async def main() -> None:
        server = await tls_server(pki, header_timeout_s=0.3)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
            writer.write(b"\x16\x03\x01")  # the first bytes of a ClientHello, and no more
            t = time.monotonic()
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed
            assert 0.2 < time.monotonic() - t < 2.0
            writer.close()
        finally:
            await server.stop(timeout=1)
    on_loop(main())


def test_tls_carries_large_bodies_and_keep_alive(on_loop, pki):
    async def main() -> None:
        server = await tls_server(pki)
        try:
            ctx = client_context(pki)
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server), ssl=ctx)
            body = bytes(range(256)) * (6 << 12)  # 6 MiB: many TLS records each way
            for size in (len(body), 10, 0):
                method = b"POST" if size else b"GET"
                writer.write(b"%s /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (method, size) + body[:size])
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 200")
                n = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                assert json.loads(await reader.readexactly(n))["len"] == size
            writer.close()
        finally:
            await server.stop(timeout=1)
    on_loop(main())


# --------------------------------------------------------------------------- start-up errors


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("case", ["cert missing", "key of another cert", "cert not pem", "ca missing",
                                  "key env unset", "key file missing", "metrics port in use"])
def test_a_security_setting_that_cannot_work_is_one_line_and_exit_2(tmp_path, pki, monkeypatch, capsys, busy_port,
                                                                    case):
    monkeypatch.delenv("HEADRACE_TEST_UNSET", raising=False)
    doc = config()
    if case == "cert missing":
        doc["tls"], says = {**tls(pki), "cert_file": "nope.pem"}, f"tls.cert_file: cannot read {tmp_path}/nope.pem"
    elif case == "key of another cert":
        doc["tls"], says = {**tls(pki), "key_file": str(pki.client_key)}, "tls.key_file: "
    elif case == "cert not pem":
        (tmp_path / "junk.pem").write_text("junk")
        doc["tls"], says = {**tls(pki), "cert_file": "junk.pem"}, "tls.cert_file: "
    elif case == "ca missing":
        doc["tls"], says = tls(pki, mutual=True) | {"client_ca_file": "ca.pem"}, "tls.client_ca_file: cannot read"
    elif case == "key env unset":
        doc["tenants"] = [{"name": "a", "keys": [{"env": "HEADRACE_TEST_UNSET"}]}]
        says = "tenants.0.keys.0.env: environment variable HEADRACE_TEST_UNSET is not set"
    elif case == "key file missing":
        doc["tenants"] = [{"name": "a", "keys": [{"sha256": sha("k")}, {"file": "a.key"}]}]
        says = f"tenants.0.keys.1.file: cannot read {tmp_path}/a.key"
    else:
        doc["metrics_listen"] = {"host": "127.0.0.1", "port": busy_port}
        says = f"cannot bind metrics to 127.0.0.1:{busy_port}"
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump(doc))
    code = main(["serve", "--config", str(tmp_path / "gw.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("headrace serve: ") and says in err, err
