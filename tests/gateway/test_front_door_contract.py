"""The front doors keep Triton's contract with its clients, over HTTP and gRPC alike: a model
version the model does not have is not found; no healthy replica is 503 / UNAVAILABLE (the
other refusals stay 429); answers and configs name no backend (no replica address, no config
parameters); only implemented extensions are advertised; and a start that cannot happen is
one line on stderr and exit status 2."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from gateway.app import GatewayThread
from gateway.backends.grpc import ModelInfo
from gateway.config import ServedModel, parse_config
from gateway.driver import Driver
from gateway.errors import ModelNotFound
from gateway.policy.config import SchedulerConfig
from gateway.policy.scheduler import EdfScheduler
from gateway.policy.types import Priority
from profiles.triton.repository import ModelConfig, TensorSpec, write_model
from profiles.triton.server import TritonServer
from tests.gateway.test_driver_live_replicas import served
from tests.gateway.test_gateway_driver import SIG, Clock, FakeReplica

ROOT = Path(__file__).resolve().parents[2]
SECRET = "/etc/headrace/backend-secret.key"  # a config parameter the backend must keep to itself
PROFILE = "resnet50@A100-80GB/1g.10gb"
AFFINE = '''
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2)]) for r in requests]
'''


# --------------------------------------------------------------------------- builders


def triton_repo(root: Path) -> Path:
    """One model, ``affine-v1`` (version 1 only, y = 2x), whose config carries a secret."""
    cfg = ModelConfig("affine-v1", (TensorSpec("x", "FP32", (3,)),), (TensorSpec("y", "FP32", (3,)),),
                      max_batch_size=8, parameters={"key_file": SECRET})
    write_model(root, cfg, AFFINE)
    return root


def gateway_doc(url: str, protocol: str = "http", **settings) -> dict:
    return {"listen": {"http_port": 0, "grpc_port": 0}, **settings,
            "models": [{"name": "affine", "slo_ms": 2000, "max_batch": 8, "replicas": [
                {"url": url, "protocol": protocol, "variant": "affine-v1", "profile": PROFILE}]}]}


def infer_doc(rows: int = 1, **parameters) -> bytes:
    doc: dict = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 3], "data": [1.0] * 3 * rows}]}
    if parameters:
        doc["parameters"] = parameters
    return json.dumps(doc).encode()


def infer_pb(version: str = "", **parameters) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="affine", model_version=version)
    req.inputs.add(name="x", datatype="FP32", shape=[1, 3])
    req.raw_input_contents.append(np.ones((1, 3), np.float32).tobytes())
    for k, v in parameters.items():
        req.parameters[k].int64_param = v
    return req


def call(url: str, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(url, timeout=10)
    try:
        conn.request(method, path, body=body)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def stub(url: str) -> pbg.GRPCInferenceServiceStub:
    return pbg.GRPCInferenceServiceStub(grpc.insecure_channel(url))


def rpc_error(fn, req) -> grpc.RpcError:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as e:
        fn(req, timeout=10)
    return e.value


# --------------------------------------------------------------------------- fixtures

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    with TritonServer(triton_repo(tmp_path_factory.mktemp("repo"))) as t:
        yield t


@pytest.fixture(scope="module", params=["http", "grpc"])
def gateway(triton, request):
    """The gateway with its defaults, talking to Triton by either protocol."""
    url = triton.http_url if request.param == "http" else triton.grpc_url
    with GatewayThread(parse_config(gateway_doc(url, request.param))) as gw:
        yield gw


# --------------------------------------------------------------------------- 1. versions


class Versioned(FakeReplica):
    """A fake replica whose Triton model reports the versions given for its url."""

    VERSIONS = {"host:9000": ["1", "3"], "host:9001": ["2"], "host:9002": []}

    async def model_info(self, variant: str) -> ModelInfo:
        md = pb.ModelMetadataResponse(name=variant, versions=self.VERSIONS[self.url])
        return ModelInfo(SIG, md, mc.ModelConfig(name=variant))


def versioned_driver(*ports: int) -> Driver:
    model = ServedModel("m", 1.0, 8, Priority.GUARANTEED, tuple(served(f"r{p}", p) for p in ports))
    core = EdfScheduler(SchedulerConfig(policy="adaptive", wait=False))
    return Driver([model], core, clock=Clock(), health_interval=3600, replica_factory=lambda _, url: Versioned(url))


def test_a_model_has_its_replicas_versions_the_latest_by_default_and_1_when_none_is_reported():
    async def main() -> None:
        d = versioned_driver(9000, 9001)
        await d.start()
        try:
            assert d.model("m").version_list() == ["1", "2", "3"] and d.model("m").default_version == "3"
            assert d.model("m", "2") is d.model("m", "") is d.model("m")
            with pytest.raises(ModelNotFound, match=r"model 'm' has no version '7'; versions: \['1', '2', '3'\]"):
                d.model("m", "7")
            # NOTE: a removed replica's versions go with it
            await d.remove_replica("r9001", timeout=1)
            assert d.model("m").version_list() == ["1", "3"]
        finally:
            await d.stop()
        bare = versioned_driver(9002)
        await bare.start()
        try:
            assert bare.model("m").version_list() == ["1"] and bare.model("m").default_version == "1"
        finally:
            await bare.stop()

    asyncio.run(main())


@pytest.mark.parametrize(("method", "action"), [("POST", "/infer"), ("GET", ""), ("GET", "/ready"),
                                                ("GET", "/config"), ("GET", "/stats")])
def test_http_an_unknown_version_is_404_naming_the_model_and_its_versions(gateway, method, action):
    body = infer_doc() if method == "POST" else None
    status, _, data = call(gateway.http_url, method, f"/v2/models/affine/versions/7{action}", body)
    assert status == 404, data
    assert "affine" in json.loads(data)["error"] and "['1']" in json.loads(data)["error"]
    # the version the model has, and none at all, are served
    for prefix in ("/v2/models/affine/versions/1", "/v2/models/affine"):
        assert call(gateway.http_url, method, prefix + action, body)[0] == 200


def test_http_infer_echoes_the_version_it_served(gateway):
    for path in ("/v2/models/affine/versions/1/infer", "/v2/models/affine/infer"):
        status, _, data = call(gateway.http_url, "POST", path, infer_doc())
        assert status == 200 and json.loads(data)["model_version"] == "1"
    assert httpclient.InferenceServerClient(gateway.http_url).get_model_metadata("affine")["versions"] == ["1"]


def test_grpc_an_unknown_version_is_not_found_naming_the_model_and_its_versions(gateway):
    s = stub(gateway.grpc_url)
    for fn, req in [(s.ModelInfer, infer_pb("7")),
                    (s.ModelMetadata, pb.ModelMetadataRequest(name="affine", version="7")),
                    (s.ModelReady, pb.ModelReadyRequest(name="affine", version="7")),
                    (s.ModelConfig, pb.ModelConfigRequest(name="affine", version="7")),
                    (s.ModelStatistics, pb.ModelStatisticsRequest(name="affine", version="7"))]:
        e = rpc_error(fn, req)
        assert e.code() == grpc.StatusCode.NOT_FOUND and "affine" in e.details() and "['1']" in e.details()
    streamed = list(s.ModelStreamInfer(iter([infer_pb("7")]), timeout=10))
    assert len(streamed) == 1 and "no version '7'" in streamed[0].error_message
    assert s.ModelInfer(infer_pb("1"), timeout=10).model_version == "1"
    assert s.ModelInfer(infer_pb(""), timeout=10).model_version == "1"
    assert s.ModelReady(pb.ModelReadyRequest(name="affine", version="1"), timeout=10).ready
    assert list(s.ModelMetadata(pb.ModelMetadataRequest(name="affine"), timeout=10).versions) == ["1"]


# --------------------------------------------------------------------------- 2. no replica


def test_with_every_replica_down_the_answer_is_503_unavailable_with_retry_after(tmp_path):
    with TritonServer(triton_repo(tmp_path / "repo")) as lone:
        cfg = parse_config(gateway_doc(lone.http_url, health_interval_s=0.1))
        with GatewayThread(cfg) as gw:
            lone.kill()
            end = time.monotonic() + 20
            while gw.driver.ready() and time.monotonic() < end:
                time.sleep(0.05)
            assert not gw.driver.ready()
            status, headers, data = call(gw.http_url, "POST", "/v2/models/affine/infer", infer_doc())
            assert status == 503, data
            assert int(headers["retry-after"]) >= 1 and headers["x-headrace-reject-reason"] == "no_replica"
            e = rpc_error(stub(gw.grpc_url).ModelInfer, infer_pb())
            assert e.code() == grpc.StatusCode.UNAVAILABLE
            trailers = dict(e.trailing_metadata())
            assert int(trailers["retry-after"]) >= 1 and trailers["x-headrace-reject-reason"] == "no_replica"


def test_a_request_that_cannot_make_its_deadline_is_still_429(gateway):
    # NOTE: a 1 µs timeout no batch can meet: refused at arrival as infeasible (overload, not outage)
    status, headers, _ = call(gateway.http_url, "POST", "/v2/models/affine/infer", infer_doc(timeout=1))
    assert status == 429 and headers["x-headrace-reject-reason"] == "infeasible"
    e = rpc_error(stub(gateway.grpc_url).ModelInfer, infer_pb(timeout=1))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# --------------------------------------------------------------------------- 3. replica addresses


def test_answers_name_the_variant_but_no_backend_address_by_default(gateway, triton):
    _, _, data = call(gateway.http_url, "POST", "/v2/models/affine/infer", infer_doc())
    assert json.loads(data)["parameters"] == {"headrace_variant": "affine-v1"}
    params = stub(gateway.grpc_url).ModelInfer(infer_pb(), timeout=10).parameters
    assert set(params) == {"headrace_variant"} and params["headrace_variant"].string_param == "affine-v1"
    for port in (triton.http_port, triton.grpc_port):
        assert f":{port}".encode() not in data


def test_expose_replicas_names_the_replica_that_served(triton):
    with GatewayThread(parse_config(gateway_doc(triton.http_url, expose_replicas=True))) as gw:
        _, _, data = call(gw.http_url, "POST", "/v2/models/affine/infer", infer_doc())
        assert json.loads(data)["parameters"]["headrace_replica"] == "affine-v1#1"
        params = stub(gw.grpc_url).ModelInfer(infer_pb(), timeout=10).parameters
        assert params["headrace_replica"].string_param == "affine-v1#1"


# --------------------------------------------------------------------------- 4. config parameters


def test_the_config_keeps_the_backends_parameters_to_itself(gateway, triton):
    # the backend does carry the secret: the gateway has something to hide
    assert httpclient.InferenceServerClient(triton.http_url).get_model_config("affine-v1")["parameters"]
    status, _, data = call(gateway.http_url, "GET", "/v2/models/affine/config")
    assert status == 200 and "parameters" not in json.loads(data) and SECRET.encode() not in data
    assert json.loads(data)["max_batch_size"] == 8
    cfg = grpcclient.InferenceServerClient(gateway.grpc_url).get_model_config("affine").config
    assert not cfg.parameters and SECRET.encode() not in cfg.SerializeToString()
    assert cfg.max_batch_size == 8


# --------------------------------------------------------------------------- 5. extensions


def _http_probes(gw) -> dict:  # noqa: ANN001
    """How a client would use each extension over HTTP: True when it works."""
    def infer(body: bytes) -> tuple[int, dict[str, str], bytes]:
        return call(gw.http_url, "POST", "/v2/models/affine/infer", body)

    def binary() -> bool:
        x = httpclient.InferInput("x", [1, 3], "FP32")
        x.set_data_from_numpy(np.ones((1, 3), np.float32), binary_data=True)
        r = httpclient.InferenceServerClient(gw.http_url).infer(
            "affine", [x], outputs=[httpclient.InferRequestedOutput("y", binary_data=True)])
        return np.array_equal(r.as_numpy("y"), np.full((1, 3), 2, np.float32))

    return {
        "model_repository": lambda: call(gw.http_url, "POST", "/v2/repository/models/affine/load", b"{}")[0] == 200,
        "schedule_policy": lambda: infer(infer_doc(priority=2, timeout=5_000_000))[0] == 200
        and infer(infer_doc(timeout=1))[0] == 429,
        "model_configuration": lambda: call(gw.http_url, "GET", "/v2/models/affine/config")[0] == 200,
        "binary_tensor_data": binary,
        "parameters": lambda: "parameters" in json.loads(infer(infer_doc(priority=0))[2]),
        "statistics": lambda: call(gw.http_url, "GET", "/v2/models/affine/stats")[0] == 200,
    }


def _grpc_probes(gw) -> dict:  # noqa: ANN001
    s = stub(gw.grpc_url)

    def ok(fn, req) -> bool:  # noqa: ANN001
        try:
            fn(req, timeout=10)
        except grpc.RpcError:
            return False
        return True

    def refused(req: pb.ModelInferRequest) -> bool:
        return not ok(s.ModelInfer, req)

    return {
        "model_repository": lambda: ok(s.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="affine")),
        "schedule_policy": lambda: ok(s.ModelInfer, infer_pb(priority=2, timeout=5_000_000))
        and refused(infer_pb(timeout=1)),
        "model_configuration": lambda: ok(s.ModelConfig, pb.ModelConfigRequest(name="affine")),
        "binary_tensor_data": lambda: ok(s.ModelInfer, infer_pb()),  # raw contents: binary by nature
        "parameters": lambda: bool(s.ModelInfer(infer_pb(priority=0), timeout=10).parameters),
        "statistics": lambda: ok(s.ModelStatistics, pb.ModelStatisticsRequest(name="affine")),
    }


def test_http_advertises_only_extensions_it_serves(gateway):
    advertised = httpclient.InferenceServerClient(gateway.http_url).get_server_metadata()["extensions"]
    probes = _http_probes(gateway)
    assert [e for e in advertised if e not in probes or not probes[e]()] == []
    assert call(gateway.http_url, "POST", "/v2/repository/index", b"")[0] == 200  # the index stays


def test_grpc_advertises_only_extensions_it_serves(gateway):
    advertised = stub(gateway.grpc_url).ServerMetadata(pb.ServerMetadataRequest(), timeout=10).extensions
    probes = _grpc_probes(gateway)
    assert [e for e in advertised if e not in probes or not probes[e]()] == []
    assert stub(gateway.grpc_url).RepositoryIndex(pb.RepositoryIndexRequest(), timeout=10).models


# --------------------------------------------------------------------------- 6. start-up errors


def serve(tmp_path: Path, doc: dict, *args: str) -> tuple[int | None, str]:
    """``headrace serve`` with ``doc`` as its config: (exit status, stderr); None when it was
    still running after 60 s (it started instead of refusing)."""
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump(doc))
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "serve", "--config", str(tmp_path / "gw.yaml"),
                             *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return None, err
    return proc.returncode, err


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("case", ["grpc port in use", "http port in use", "unbindable host", "http port 70000",
                                  "grpc port -1", "scheduler key", "scheduler value"])
def test_a_start_that_cannot_happen_is_one_line_and_exit_2(tmp_path, triton, taken_port, case):
    # NOTE: the replica answers, so only the case itself stands in the way of starting
    doc = gateway_doc(triton.http_url)
    args: tuple[str, ...] = ()
    if case == "grpc port in use":
        args, says = ("--grpc-port", str(taken_port)), [f"127.0.0.1:{taken_port}", "gRPC"]
    elif case == "http port in use":
        args, says = ("--http-port", str(taken_port)), [f"127.0.0.1:{taken_port}", "HTTP"]
    elif case == "unbindable host":
        doc["listen"]["host"] = "192.0.2.1"  # TEST-NET-1: no address of this host
        says = ["192.0.2.1:0"]
    elif case == "http port 70000":
        args, says = ("--http-port", "70000"), ["--http-port", "listen.http_port", "70000"]
    elif case == "grpc port -1":
        args, says = ("--grpc-port", "-1"), ["--grpc-port", "listen.grpc_port", "-1"]
    elif case == "scheduler key":
        doc["scheduler"] = {"quantil": "p50"}
        says = ["scheduler.quantil"]
    else:
        doc["scheduler"] = {"quantile": "p42"}
        says = ["scheduler.quantile", "p42"]
    code, err = serve(tmp_path, doc, *args)
    assert "Traceback" not in err, err
    assert code == 2 and len(err.splitlines()) == 1, (code, err)
    assert err.startswith("headrace serve: ") and all(s in err for s in says), err
