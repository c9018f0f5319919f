"""Access logs: one JSON line per answered inference request with a fixed set of fields, off
by default, successes sampled by the configured fraction while refusals and errors are all
kept (unless they are sampled too), buffered off the request path and flushed on close.
Through the gateway, over HTTP and gRPC: served, refused by the scheduler, refused at the front
door (unknown model, bad body, no key, a body too large for the HTTP server) and given up by
the client (499 / CANCELLED) each get their line with the caller's tenant; other routes none."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import io
import json
import random
import re
import socket
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest
import yaml
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from gateway.app import GatewayThread
from gateway.codec import Tensor
from gateway.config import load_config, parse_config
from gateway.observe.accesslog import AccessLog
from profiles.schema import load_documents
from tests.gateway.test_gateway_driver import FakeReplica

FIELDS = ["time", "tenant", "protocol", "model", "version", "variant", "status", "queue_ms", "total_ms",
          "rows", "reason", "request_id"]
JAN_1_2025_NOON = 1735732800.0


def make_log(sink: io.StringIO, **kw) -> AccessLog:
    return AccessLog(sink, rng=random.Random(7), wall=lambda: JAN_1_2025_NOON + 0.25, **kw)


def lines(sink: io.StringIO) -> list[dict]:
    return [json.loads(x) for x in sink.getvalue().splitlines()]


def served(log: AccessLog, n: int = 1) -> None:
    for i in range(n):
        log.answered("http", "m", 200, True, 0.0045, version="1", variant="m-fp16", queue_s=0.0012, rows=2,
                     request_id=f"r{i}", tenant="team-a")


def refused(log: AccessLog, n: int = 1) -> None:
    for _ in range(n):
        log.answered("grpc", "m", "RESOURCE_EXHAUSTED", False, 0.0002, reason="infeasible")


def spec(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"enabled": True, "sample": 1.0, "sample_failures": False, "path": None, **kw})


def test_off_by_default_means_no_log_object_at_all() -> None:
    # NOTE: off is None, so the front doors pay one `is None` check and build nothing
    assert AccessLog.from_settings(spec(enabled=False)) is None
    assert AccessLog.from_settings(spec(sample=0.0, sample_failures=True)) is None
    assert AccessLog.from_settings(spec(sample=0.0)) is not None  # failures are still logged


def test_a_served_request_is_one_json_line_with_every_field() -> None:
    sink = io.StringIO()
    log = make_log(sink)
    served(log)
    log.close()
    (rec,) = lines(sink)
    assert list(rec) == FIELDS
    assert rec == {"time": "2025-01-01T12:00:00.250Z", "tenant": "team-a", "protocol": "http", "model": "m",
                   "version": "1", "variant": "m-fp16", "status": 200, "queue_ms": 1.2, "total_ms": 4.5,
                   "rows": 2, "reason": None, "request_id": "r0"}


def test_a_refusal_carries_its_reason_and_grpc_code_name_with_unknowns_null() -> None:
    sink = io.StringIO()
    log = make_log(sink)
    refused(log)
    log.close()
    (rec,) = lines(sink)
    assert rec["status"] == "RESOURCE_EXHAUSTED" and rec["reason"] == "infeasible"
    assert rec["variant"] is None and rec["queue_ms"] is None and rec["tenant"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", rec["time"])


def test_successes_are_sampled_and_every_failure_is_kept() -> None:
    sink = io.StringIO()
    log = make_log(sink, sample=0.25)
    served(log, 4000)
    refused(log, 100)
    log.close()
    recs = lines(sink)
    ok = sum(r["status"] == 200 for r in recs)
    assert 900 <= ok <= 1100  # 25% of 4000, drawn independently
    assert sum(r["status"] == "RESOURCE_EXHAUSTED" for r in recs) == 100


def test_failures_are_sampled_too_when_asked() -> None:
    sink = io.StringIO()
    log = make_log(sink, sample=0.1, sample_failures=True)
    refused(log, 2000)
    log.close()
    assert 150 <= len(lines(sink)) <= 250


def test_on_an_event_loop_lines_wait_for_the_flush_instead_of_a_write_per_request() -> None:
    sink = io.StringIO()

    async def main() -> None:
        log = make_log(sink, flush_s=3600)
        served(log, 10)
        assert sink.getvalue() == ""  # buffered: no write on the request path
        log.flush()
        assert len(lines(sink)) == 10
        served(log, 1)
        log.close()  # what is left is written on close

    asyncio.run(main())
    assert len(lines(sink)) == 11


def test_a_file_path_is_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"
    path.write_text('{"earlier": true}\n')
    log = AccessLog.from_settings(spec(path=str(path)))
    served(log, 3)
    log.close()
    assert len(path.read_text().splitlines()) == 4


def test_an_unopenable_path_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(OSError, match=r"access_log.path: cannot open .*nope/access.jsonl"):
        AccessLog.from_settings(spec(path=str(tmp_path / "nope" / "access.jsonl")))


# --------------------------------------------------------------------------- through the gateway

KEY = "team-a-7f3c9e1d5b2a4680"


class Echo(FakeReplica):
    """A replica that answers ``y = x`` at once."""

    async def infer(self, variant: str, inputs: list[Tensor], timeout: float | None, *args: Any,
                    **kwargs: Any) -> list[Tensor]:
        return [Tensor("y", "FP32", list(inputs[0].shape), bytes(inputs[0].raw))]


def gateway_doc(log_path: Path, **access_log: Any) -> dict:
    return {"listen": {"http_port": 0, "grpc_port": 0},
            "access_log": {"enabled": True, "path": str(log_path), **access_log},
            "tenants": [{"name": "team-a", "keys": [{"sha256": hashlib.sha256(KEY.encode()).hexdigest()}]}],
            "models": [{"name": "m", "slo_ms": 2000, "max_batch": 8, "replicas": [
                {"url": "fake:9000", "variant": "v", "profile": "resnet50@A100-80GB/1g.10gb"}]}]}


def http_infer(gw: Any, path: str = "/v2/models/m/infer", key: str | None = KEY, **doc: Any) -> int:
    body = json.dumps({"id": "req-1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2],
                                                  "data": [1, 2, 3, 4]}], **doc}).encode()
    conn = http.client.HTTPConnection(gw.http_url, timeout=10)
    try:
        conn.request("POST", path, body, {"authorization": f"Bearer {key}"} if key else {})
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def grpc_infer(gw: Any, model: str = "m", key: str | None = KEY, timeout_us: int = 0) -> str:
    req = pb.ModelInferRequest(model_name=model, id="req-2")
    req.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    req.raw_input_contents.append(np.ones((1, 2), np.float32).tobytes())
    if timeout_us:
        req.parameters["timeout"].int64_param = timeout_us
    with grpc.insecure_channel(gw.grpc_url) as ch:
        try:
            pbg.GRPCInferenceServiceStub(ch).ModelInfer(
                req, timeout=10, metadata=(("authorization", f"Bearer {key}"),) if key else ())
        except grpc.RpcError as e:
            return e.code().name
    return "OK"


def too_large(gw: Any) -> int:
    """An infer request declaring a 1 GB body: refused on its headers."""
    host, port = gw.http_url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000000000\r\n\r\n")
        return int(s.recv(4096).split()[1])


def test_every_inference_answer_is_one_line_and_nothing_else_is(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"
    cfg = parse_config(gateway_doc(path))
    with GatewayThread(cfg, replica_factory=lambda _, url: Echo(url)) as gw:
        assert http_infer(gw) == 200
        assert http_infer(gw, parameters={"timeout": 1}) == 429  # no batch meets 1 µs
        assert http_infer(gw, "/v2/models/nope/infer") == 404
        assert http_infer(gw, inputs=[{"name": "x"}]) == 400
        assert http_infer(gw, key=None) == 401
        assert grpc_infer(gw) == "OK"
        assert grpc_infer(gw, timeout_us=1) == "RESOURCE_EXHAUSTED"
        assert grpc_infer(gw, model="nope") == "NOT_FOUND"
        assert grpc_infer(gw, key="wrong") == "UNAUTHENTICATED"
        assert too_large(gw) == 413  # refused by the HTTP server itself, before the door
        conn = http.client.HTTPConnection(gw.http_url, timeout=10)  # not an inference: no line
        conn.request("GET", "/v2/models/m", headers={"authorization": f"Bearer {KEY}"})
        assert conn.getresponse().status == 200
        conn.close()
    recs = [json.loads(x) for x in path.read_text().splitlines()]  # written by the time it stopped
    assert [(r["protocol"], r["status"]) for r in recs] == [
        ("http", 200), ("http", 429), ("http", 404), ("http", 400), ("http", 401),
        ("grpc", "OK"), ("grpc", "RESOURCE_EXHAUSTED"), ("grpc", "NOT_FOUND"), ("grpc", "UNAUTHENTICATED"),
        ("http", 413)]
    served_http, refused_http, served_grpc = recs[0], recs[1], recs[5]
    assert {k: served_http[k] for k in ("tenant", "model", "variant", "rows", "reason", "request_id")} == {
        "tenant": "team-a", "model": "m", "variant": "v", "rows": 2, "reason": None, "request_id": "req-1"}
    assert 0 <= served_http["queue_ms"] <= served_http["total_ms"]
    assert served_grpc["variant"] == "v" and served_grpc["rows"] == 1 and served_grpc["request_id"] == "req-2"
    assert refused_http["reason"] == recs[6]["reason"] == "infeasible"
    assert refused_http["queue_ms"] is None and refused_http["tenant"] == "team-a"
    assert recs[2]["model"] == "nope" and "unknown model" in recs[2]["reason"]
    assert recs[4]["tenant"] is None and recs[8]["tenant"] is None  # no valid key: nobody's
    assert recs[9]["model"] == "m" and "exceeds" in recs[9]["reason"]


def test_sampled_at_zero_only_refusals_are_logged(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"
    cfg = parse_config(gateway_doc(path, sample=0.0))
    with GatewayThread(cfg, replica_factory=lambda _, url: Echo(url)) as gw:
        for _ in range(5):
            assert http_infer(gw) == 200
            assert grpc_infer(gw) == "OK"
        assert http_infer(gw, parameters={"timeout": 1}) == 429
    assert [json.loads(x)["status"] for x in path.read_text().splitlines()] == [429]


def test_a_relative_path_is_read_from_the_configs_folder(tmp_path: Path) -> None:
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump(gateway_doc(Path("logs/access.jsonl"))))
    (tmp_path / "logs").mkdir()
    with GatewayThread(load_config(tmp_path / "gw.yaml"), replica_factory=lambda _, url: Echo(url)) as gw:
        assert http_infer(gw) == 200
    assert len((tmp_path / "logs/access.jsonl").read_text().splitlines()) == 1


def test_a_gateway_document_carries_both_settings_to_the_gateway(tmp_path: Path) -> None:
    doc = {"apiVersion": "headrace.dev/v1", "kind": "Gateway", "metadata": {"name": "gw"},
           "spec": {"access_log": {"enabled": True, "sample": 0.5, "path": "/var/log/headrace/access.jsonl"},
                    "tracing": {"enabled": True, "endpoint": "https://collector:4317", "sample_ratio": 0.1}}}
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump(doc))
    (gw,) = load_documents(tmp_path).gateways
    # what headrace up hands the gateway: the document's spec but the operator's own settings
    # (its admin API, the worker count), plus the models
    settings = gw.spec.model_dump(mode="json", exclude={"admin", "workers"})
    cfg = parse_config({**settings, "models": gateway_doc(tmp_path)["models"]})
    assert cfg.access_log.sample == 0.5 and cfg.access_log.path == "/var/log/headrace/access.jsonl"
    assert cfg.tracing.endpoint == "https://collector:4317" and cfg.tracing.sample_ratio == 0.1
    assert not parse_config({"models": gateway_doc(tmp_path)["models"]}).access_log.enabled  # off by default


class Held(FakeReplica):
    """A replica that takes each batch and never answers: ``arrived`` is set when one comes,
    ``gone`` when the gateway cancels it (its waiter gave up)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.arrived, self.gone = threading.Event(), threading.Event()

    async def infer(self, variant: str, inputs: list[Tensor], timeout: float | None, *args: Any,
                    **kwargs: Any) -> list[Tensor]:
        self.arrived.set()
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            self.gone.set()
        raise AssertionError("not reached")


def test_a_client_that_gives_up_is_logged_as_cancelled(tmp_path: Path) -> None:
    path = tmp_path / "access.jsonl"
    doc = gateway_doc(path)
    del doc["tenants"]
    held: list[Held] = []

    def factory(protocol: str, url: str) -> Held:
        held.append(Held(url))
        return held[-1]

    with GatewayThread(parse_config(doc), replica_factory=factory) as gw:
        (replica,) = held
        host, port = gw.http_url.rsplit(":", 1)
        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(f"POST /v2/models/m/infer HTTP/1.1\r\nHost: gw\r\nContent-Length: {len(body)}\r\n\r\n"
                      f"{body}".encode())
            assert replica.arrived.wait(10)
        assert replica.gone.wait(10)  # the gateway saw the client go
        replica.arrived.clear()
        replica.gone.clear()
        req = pb.ModelInferRequest(model_name="m")
        req.inputs.add(name="x", datatype="FP32", shape=[1, 2])
        req.raw_input_contents.append(np.ones((1, 2), np.float32).tobytes())
        with grpc.insecure_channel(gw.grpc_url) as ch:
            call = pbg.GRPCInferenceServiceStub(ch).ModelInfer.future(req, timeout=30)
            assert replica.arrived.wait(10)
            call.cancel()
            assert replica.gone.wait(10)
    statuses = sorted(str(json.loads(x)["status"]) for x in path.read_text().splitlines())
    assert statuses == ["499", "CANCELLED"]
