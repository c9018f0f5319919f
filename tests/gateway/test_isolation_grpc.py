"""Every listener is limited (issue #31, rows 4 and 5): the gRPC port closes connections past
its cap as they are accepted, closes idle ones, advertises its streams per connection and
polices keepalive pings as Triton does; the metrics listener caps connections per client
address and closes idle ones. Clients already connected keep working throughout. And a
parameter Triton would refuse as the client's error is INVALID_ARGUMENT / 400 at either
door, never INTERNAL / 500, whichever protocol the replica speaks.

An in-process gateway with fake replicas; the attackers are raw sockets speaking just enough
HTTP/2 (the client preface and a SETTINGS frame)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import resource
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from gateway.app import Gateway, GatewayThread, metrics_limits
from gateway.codec import Tensor
from gateway.config import parse_config
from gateway.errors import BackendError
from gateway.frontdoor.grpc import server_options
from profiles.schema import LimitsSpec
from tests.gateway.test_gateway_driver import FakeReplica

PROFILE = "resnet50@A100-80GB/1g.10gb"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x1, 0x3, 0x4, 0x6, 0x7
ACK, END_HEADERS = 0x1, 0x4  # frame flags
MAX_CONCURRENT_STREAMS = 0x3  # a SETTINGS parameter
REFUSED_STREAM, ENHANCE_YOUR_CALM = 0x7, 0xB  # error codes


# --------------------------------------------------------------------------- builders


INT64 = range(-(2**63), 2**63)


class TritonRules(FakeReplica):
    """Answers ``y = x`` at once, except where a Triton replica fails a request on a parameter,
    as measured on Triton 2.51: its HTTP front end answers a value of the wrong type with 500
    "Unable to parse ..." (INTERNAL to the replica client), and an integer past int64 cannot
    be encoded for a gRPC replica at all (``Value out of range``: the batch fails).
    ``seen``: what each request it was sent forwarded."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.seen: list[Any] = []

    async def infer(self, variant: str, inputs: list[Tensor], timeout: float | None, forward: Any = None,
                    triton_timeout_us: int = 0, **_: Any) -> list[Tensor]:
        self.seen.append(forward)
        if forward is not None:
            every = [*forward.parameters, *(p for _, params in forward.outputs for p in params)]
            for _, v in every:
                if isinstance(v, int) and v not in INT64:
                    raise ValueError(f"Value out of range: {v}")
            for k, v in forward.parameters:
                if k in ("sequence_start", "sequence_end") and not isinstance(v, bool):
                    raise self._refused(f"Unable to parse '{k}': attempt to access JSON non-boolean as boolean")
            for _, params in forward.outputs:
                for k, v in params:
                    if k == "classification" and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                        raise self._refused("Unable to set 'classification': attempt to access JSON "
                                            "non-unsigned-integer as unsigned-integer")
        return [Tensor("y", "FP32", list(inputs[0].shape), bytes(inputs[0].raw))]

    def _refused(self, message: str) -> BackendError:
        return BackendError(f"replica {self.url} (v): INTERNAL: {message}", grpc.StatusCode.INTERNAL, False)


@contextlib.contextmanager
def gateway(replicas: list[TritonRules] | None = None, metrics: bool = False, **limits: Any) -> Iterator[Gateway]:
    doc: dict[str, Any] = {"listen": {"http_port": 0, "grpc_port": 0}, "limits": limits,
                           "models": [{"name": "m", "slo_ms": 2000, "max_batch": 8, "replicas": [
                               {"url": "fake:9000", "variant": "v", "profile": PROFILE}]}]}
    if metrics:
        doc["metrics_listen"] = {"host": "127.0.0.1", "port": 0}

    def factory(_: str, url: str) -> TritonRules:
        r = TritonRules(url)
        if replicas is not None:
            replicas.append(r)
        return r

    with GatewayThread(parse_config(doc), replica_factory=factory) as gw:
        yield gw


def frame(kind: int, payload: bytes = b"", flags: int = 0, stream: int = 0) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def h2_connect(url: str, source: str = "127.0.0.1") -> socket.socket:
    """A raw connection that says it speaks HTTP/2, then nothing more."""
    host, port = url.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5, source_address=(source, 0))
    s.sendall(PREFACE + frame(SETTINGS))
    return s


def closed_within(s: socket.socket, timeout: float) -> bool:
    """Whether the server closes ``s`` within ``timeout`` s (what it sends first is read and dropped)."""
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        if select.select([s], [], [], left)[0]:
            try:
                if not s.recv(65536):
                    return True
            except (ConnectionResetError, TimeoutError):
                return True
    return False


def frames_until(s: socket.socket, kind: int, timeout: float = 5.0) -> list[tuple[int, int, bytes]]:
    """The server's frames (type, flags, payload) up to the first of ``kind`` (or its close)."""
    buf, out, end = b"", [], time.monotonic() + timeout
    while time.monotonic() < end:
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            n = int.from_bytes(buf[:3], "big")
            out.append((buf[3], buf[4], buf[9:9 + n]))
            buf = buf[9 + n:]
            if out[-1][0] == kind:
                return out
        if not select.select([s], [], [], max(0.0, end - time.monotonic()))[0]:
            break
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        buf += chunk
    return out


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def x_grpc() -> grpcclient.InferInput:
    x = grpcclient.InferInput("x", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[1.5, -2.0]], np.float32))
    return x


def http_get(url: str, path: str, source: str = "127.0.0.1") -> int:
    host, port = url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5, source_address=(source, 0))
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def until(cond: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting until {what}"
        time.sleep(0.02)


# --------------------------------------------------------------------------- the gRPC listener


def test_the_grpc_listeners_defaults_are_tritons_keepalive_and_a_bounded_port():
    opts = dict(server_options(64 << 20))
    # NOTE: Triton's KeepAliveOptions (src/grpc/grpc_server.h), so clients tuned for Triton keep working
    assert opts["grpc.keepalive_time_ms"] == 7_200_000
    assert opts["grpc.keepalive_timeout_ms"] == 20_000
    assert opts["grpc.keepalive_permit_without_calls"] == 0
    assert opts["grpc.http2.max_pings_without_data"] == 2
    assert opts["grpc.http2.min_ping_interval_without_data_ms"] == 300_000
    assert opts["grpc.http2.max_ping_strikes"] == 2
    # and what grpc leaves unbounded by default is bounded
    assert opts["grpc.max_allowed_incoming_connections"] == LimitsSpec().grpc_max_connections
    assert opts["grpc.max_connection_idle_ms"] == 300_000
    assert opts["grpc.server_handshake_timeout_ms"] == 10_000
    assert opts["grpc.max_concurrent_streams"] == 4096
    tight = dict(server_options(1 << 20, LimitsSpec(grpc_max_connections=3, grpc_idle_timeout_s=0.25)))
    assert (tight["grpc.max_allowed_incoming_connections"], tight["grpc.max_connection_idle_ms"]) == (3, 250)


def test_grpc_connections_past_the_cap_are_closed_while_connected_clients_keep_working():
    cap, attackers = 6, 60
    with gateway(grpc_max_connections=cap) as gw:
        client = grpcclient.InferenceServerClient(gw.grpc_url)
        try:
            assert client.infer("m", [x_grpc()]).as_numpy("y").tolist() == [[1.5, -2.0]]
            fds = open_fds()
            raw = [h2_connect(gw.grpc_url) for _ in range(attackers)]
            closed = [closed_within(s, 0.5) for s in raw]
            # NOTE: the client's connection holds one place: the first cap - 1 raw ones get the rest
            assert sum(not c for c in closed) == cap - 1, closed
            # the server holds no socket for a refused connection: the growth is ours plus its cap
            assert open_fds() - fds <= attackers + cap + 4
            for _ in range(5):
                assert client.infer("m", [x_grpc()]).as_numpy("y").tolist() == [[1.5, -2.0]]
            assert http_get(gw.http_url, "/v2/health/ready") == 200
            with grpc.insecure_channel(gw.grpc_url) as ch:  # a new client is turned away at the cap
                with pytest.raises(grpc.RpcError) as e:
                    pbg.GRPCInferenceServiceStub(ch).ServerLive(pb.ServerLiveRequest(), timeout=1)
                assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            for s in raw:
                s.close()

            def a_new_client_is_served() -> bool:
                with grpc.insecure_channel(gw.grpc_url) as ch:
                    try:
                        return pbg.GRPCInferenceServiceStub(ch).ServerLive(pb.ServerLiveRequest(), timeout=1).live
                    except grpc.RpcError:
                        return False
            until(a_new_client_is_served, "the attackers' places are free again")
        finally:
            client.close()


def test_a_grpc_connection_idle_or_silent_past_its_timeout_is_closed():
    with gateway(grpc_idle_timeout_s=0.4, grpc_handshake_timeout_s=0.4) as gw:
        host, port = gw.grpc_url.rsplit(":", 1)
        t = time.monotonic()
        idle = h2_connect(gw.grpc_url)
        silent = socket.create_connection((host, int(port)))  # not even the preface
        assert not closed_within(idle, 0.3)  # NOTE: never before its timeout
        assert closed_within(idle, 3.0) and closed_within(silent, 3.0)
        assert 0.3 <= time.monotonic() - t < 3.5
        # a client whose channel went idle connects again on its next call
        with grpc.insecure_channel(gw.grpc_url) as ch:
            stub = pbg.GRPCInferenceServiceStub(ch)
            assert stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live
            time.sleep(0.8)
            assert stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live


def live_call_headers() -> bytes:
    """The HPACK block of a ServerLive call (literal fields, never indexed)."""
    fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"x"),
              (b":path", b"/inference.GRPCInferenceService/ServerLive"), (b"content-type", b"application/grpc"),
              (b"te", b"trailers")]
    return b"".join(b"\x00" + bytes([len(k)]) + k + bytes([len(v)]) + v for k, v in fields)


def test_the_grpc_listener_advertises_its_streams_per_connection_and_refuses_calls_past_them():
    with gateway(grpc_max_concurrent_streams=3) as gw:
        s = h2_connect(gw.grpc_url)
        settings = [f for f in frames_until(s, SETTINGS) if f[0] == SETTINGS][0][2]
        advertised = {struct.unpack(">H", settings[i:i + 2])[0]: struct.unpack(">I", settings[i + 2:i + 6])[0]
                      for i in range(0, len(settings), 6)}
        assert advertised[MAX_CONCURRENT_STREAMS] == 3
        s.sendall(frame(SETTINGS, flags=ACK))
        # six calls opened and never sent their message: the fourth on are refused
        s.sendall(b"".join(frame(HEADERS, live_call_headers(), END_HEADERS, sid) for sid in (1, 3, 5, 7, 9, 11)))
        refused = {}
        for kind, _, payload, sid in frames_with_stream(s, until=lambda got: len(got) == 3):
            if kind == RST_STREAM:
                refused[sid] = int.from_bytes(payload, "big")
        s.close()
        assert refused == {7: REFUSED_STREAM, 9: REFUSED_STREAM, 11: REFUSED_STREAM}
        client = grpcclient.InferenceServerClient(gw.grpc_url)
        try:  # calls within the limit are served
            answers: list[Any] = []
            for wave in range(1, 5):
                for _ in range(3):
                    client.async_infer("m", [x_grpc()], lambda result, error: answers.append(error or result))
                until(lambda n=3 * wave: len(answers) == n, "every call is answered")
            errors = [str(a) for a in answers if isinstance(a, Exception)]
            assert not errors, errors
        finally:
            client.close()


def frames_with_stream(s: socket.socket, until: Callable[[dict], bool],
                       timeout: float = 5.0) -> list[tuple[int, int, bytes, int]]:
    """The server's frames (type, flags, payload, stream) until ``until`` holds of the
    RST_STREAMs seen so far (by stream), or the server stops sending."""
    buf, out, resets, end = b"", [], {}, time.monotonic() + timeout
    while time.monotonic() < end and not until(resets):
        if not select.select([s], [], [], max(0.0, end - time.monotonic()))[0]:
            break
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            n = int.from_bytes(buf[:3], "big")
            sid = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            out.append((buf[3], buf[4], buf[9:9 + n], sid))
            if buf[3] == RST_STREAM:
                resets[sid] = buf[9:9 + n]
            buf = buf[9 + n:]
    return out


def test_a_client_that_pings_without_calls_is_sent_away_as_triton_does():
    with gateway() as gw:
        s = h2_connect(gw.grpc_url)
        for i in range(4):  # NOTE: a connection with no call may ping once in 2 hours; 2 strikes are forgiven
            s.sendall(frame(PING, i.to_bytes(8, "big")))
        got = frames_until(s, GOAWAY)
        s.close()
        goaway = got[-1]
        assert goaway[0] == GOAWAY, got
        assert int.from_bytes(goaway[2][4:8], "big") == ENHANCE_YOUR_CALM
        assert b"too_many_pings" in goaway[2][8:]


def test_the_open_file_limit_holds_every_listeners_cap_at_once():
    # NOTE: the gRPC port at its cap must leave the HTTP port its own: at the open-file limit
    # accepting fails everywhere, health probes included
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the open-file hard limit ({hard}) is below what the test asks")
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
    try:
        with gateway(metrics=True, max_connections=300, probe_connections=10, grpc_max_connections=1500):
            raised = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert raised >= 300 + 10 + 1500 + 256 + 16  # HTTP, gRPC, metrics (256 + 16) and the reserve


# --------------------------------------------------------------------------- the metrics listener


def test_the_metrics_listener_takes_the_gateways_limits_where_they_are_tighter():
    mine = metrics_limits(LimitsSpec())
    assert (mine.max_connections, mine.max_address_connections, mine.idle_timeout_s) == (256, 16, 15.0)
    tighter = metrics_limits(LimitsSpec(max_address_connections=4, idle_timeout_s=2.0, max_connections=50))
    assert (tighter.max_connections, tighter.max_address_connections, tighter.idle_timeout_s) == (50, 4, 2.0)


def test_one_address_cannot_fill_the_metrics_listener_and_idle_connections_close():
    with gateway(metrics=True, max_address_connections=4, idle_timeout_s=0.4) as gw:
        assert gw.metrics_url is not None
        host, port = gw.metrics_url.rsplit(":", 1)
        attackers = [socket.create_connection((host, int(port)), source_address=("127.0.0.2", 0)) for _ in range(30)]
        closed = [closed_within(s, 0.3) for s in attackers]
        assert sum(not c for c in closed) <= 4, closed  # NOTE: one address holds at most its 4
        assert http_get(gw.metrics_url, "/metrics", source="127.0.0.3") == 200
        assert http_get(gw.metrics_url, "/v2/health/ready", source="127.0.0.3") == 200
        scraper = socket.create_connection((host, int(port)), source_address=("127.0.0.3", 0))
        scraper.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert closed_within(scraper, 3.0)  # answered, then closed once idle
        for s in attackers:
            s.close()


# --------------------------------------------------------------------------- parameters Triton refuses


def infer_pb(**output_params: Any) -> pb.ModelInferRequest:
    """A request for ``y`` whose output and request parameters are given as (kind, value)
    pairs: ``out_classification=("string_param", "2")``, ``req_sequence_start=(...)``."""
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    req.raw_input_contents.append(np.array([[1.5, -2.0]], np.float32).tobytes())
    out = req.outputs.add(name="y")
    for key, (kind, value) in output_params.items():
        where, name = key.split("_", 1)
        setattr((out.parameters if where == "out" else req.parameters)[name], kind, value)
    return req


REFUSED_BY_TRITON = {
    "classification as a string": {"out_classification": ("string_param", "2")},
    "classification as a boolean": {"out_classification": ("bool_param", True)},
    "classification as a double": {"out_classification": ("double_param", 2.0)},
    "negative classification": {"out_classification": ("int64_param", -1)},
    "sequence_start as a string": {"req_sequence_start": ("string_param", "true")},
    "sequence_end as an integer": {"req_sequence_end": ("int64_param", 1)},
    "an integer past int64": {"req_color": ("uint64_param", 2**64 - 1)},
}


@pytest.mark.parametrize("params", REFUSED_BY_TRITON.values(), ids=REFUSED_BY_TRITON.keys())
def test_a_parameter_triton_refuses_is_invalid_argument_on_grpc_never_internal(params):
    replicas: list[TritonRules] = []
    with gateway(replicas) as gw, grpc.insecure_channel(gw.grpc_url) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(infer_pb(**params), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert "127.0.0.1" not in e.value.details() and "fake:" not in e.value.details()
        assert stub.ModelInfer(infer_pb(out_classification=("int64_param", 1)), timeout=10).outputs
    assert sum(len(r.seen) for r in replicas) == 1  # only the valid request reached Triton


REFUSED_BY_TRITON_JSON = {
    "classification as a string": ({"classification": "2"}, {}),
    "classification as a boolean": ({"classification": True}, {}),
    "negative classification": ({"classification": -1}, {}),
    "sequence_start as a string": ({}, {"sequence_start": "true"}),
    "an integer past int64": ({}, {"color": 2**64 - 1}),
}


@pytest.mark.parametrize(("output", "request_params"), REFUSED_BY_TRITON_JSON.values(),
                         ids=REFUSED_BY_TRITON_JSON.keys())
def test_the_same_parameters_are_400_on_http(output, request_params):
    with gateway() as gw:
        host, port = gw.http_url.rsplit(":", 1)
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.5, -2.0]}],
                "outputs": [{"name": "y", "parameters": output}], "parameters": request_params}
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("POST", "/v2/models/m/infer", body=json.dumps(body))
            r = conn.getresponse()
            status, doc = r.status, json.loads(r.read())
        finally:
            conn.close()
        assert status == 400, doc
        assert "fake:" not in doc["error"]
