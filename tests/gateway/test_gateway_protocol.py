"""tritonclient (HTTP and gRPC, sync and aio) works unchanged against the gateway, in front
of a real Triton; malformed input gets a 4xx / INVALID_ARGUMENT and never a 5xx."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from gateway.app import GatewayThread
from gateway.config import parse_config
from profiles.triton.repository import ModelConfig, TensorSpec, write_model
from profiles.triton.server import TritonServer

pytestmark = pytest.mark.integration

# y = 2x; s = the sum of each row (a second output, to check output selection and splitting)
AFFINE = '''
import numpy as np
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "x").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("y", x * 2),
                pb_utils.Tensor("s", x.sum(axis=1, keepdims=True).astype(np.float64))]))
        return out
'''


@pytest.fixture(scope="module", params=["http", "grpc"])
def gateway(tmp_path_factory, request):
    backend = request.param  # how the gateway talks to Triton; clients see no difference
    repo = tmp_path_factory.mktemp("repo")
    cfg = ModelConfig("affine-v1", (TensorSpec("x", "FP32", (3,)),),
                      (TensorSpec("y", "FP32", (3,)), TensorSpec("s", "FP64", (1,))), max_batch_size=8)
    write_model(repo, cfg, AFFINE)
    with TritonServer(repo) as triton:
        gcfg = parse_config({
            "listen": {"http_port": 0, "grpc_port": 0},
            "models": [{"name": "affine", "slo_ms": 2000, "max_batch": 8, "replicas": [
                {"url": triton.http_url if backend == "http" else triton.grpc_url, "protocol": backend,
                 "variant": "affine-v1", "profile": "resnet50@A100-80GB/1g.10gb"}]}],
        })
        with GatewayThread(gcfg) as gw:
            yield gw


def _x(rows: int) -> np.ndarray:
    return np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)


@pytest.mark.parametrize("binary", [False, True])
def test_http_sync_infer_json_and_binary(gateway, binary):
    c = httpclient.InferenceServerClient(gateway.http_url)
    x = httpclient.InferInput("x", [2, 3], "FP32")
    x.set_data_from_numpy(_x(2), binary_data=binary)
    outs = [httpclient.InferRequestedOutput("y", binary_data=binary)]
    r = c.infer("affine", [x], outputs=outs, request_id="req-7")
    np.testing.assert_allclose(r.as_numpy("y"), _x(2) * 2)
    assert r.as_numpy("s") is None  # only the requested output comes back
    resp = r.get_response()
    assert resp["id"] == "req-7"
    assert resp["parameters"]["headrace_variant"] == "affine-v1"
    assert "headrace_replica" not in resp["parameters"]  # backends stay hidden unless expose_replicas


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_http_compressed_request(gateway, algorithm):
    c = httpclient.InferenceServerClient(gateway.http_url)
    x = httpclient.InferInput("x", [1, 3], "FP32")
    x.set_data_from_numpy(_x(1))
    r = c.infer("affine", [x], request_compression_algorithm=algorithm)
    np.testing.assert_allclose(r.as_numpy("y"), _x(1) * 2)


def test_http_sync_metadata_config_ready_stats(gateway):
    c = httpclient.InferenceServerClient(gateway.http_url)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("affine")
    md = c.get_model_metadata("affine")
    assert md["name"] == "affine"
    assert [(t["name"], t["datatype"], t["shape"]) for t in md["inputs"]] == [("x", "FP32", [-1, 3])]
    cfg = c.get_model_config("affine")
    assert cfg["name"] == "affine" and cfg["max_batch_size"] == 8
    x = httpclient.InferInput("x", [1, 3], "FP32")
    x.set_data_from_numpy(_x(1))
    c.infer("affine", [x])
    stats = c.get_inference_statistics("affine")["model_stats"][0]
    assert stats["name"] == "affine" and int(stats["inference_stats"]["success"]["count"]) >= 1
    assert c.get_server_metadata()["name"] == "headrace"
    assert {m["name"] for m in c.get_model_repository_index()} == {"affine"}


def test_grpc_sync_infer_metadata_config_stats(gateway):
    c = grpcclient.InferenceServerClient(gateway.grpc_url)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("affine")
    x = grpcclient.InferInput("x", [3, 3], "FP32")
    x.set_data_from_numpy(_x(3))
    r = c.infer("affine", [x], request_id="g1")
    np.testing.assert_allclose(r.as_numpy("y"), _x(3) * 2)
    np.testing.assert_allclose(r.as_numpy("s")[:, 0], _x(3).sum(axis=1))
    assert r.get_response().parameters["headrace_variant"].string_param == "affine-v1"
    assert c.get_model_metadata("affine").name == "affine"
    assert c.get_model_config("affine").config.max_batch_size == 8
    assert c.get_inference_statistics("affine").model_stats[0].inference_stats.success.count >= 1
    assert [m.name for m in c.get_model_repository_index().models] == ["affine"]


def test_grpc_stream_infer_answers_every_request(gateway):
    c = grpcclient.InferenceServerClient(gateway.grpc_url)
    got: list = []
    c.start_stream(callback=lambda result, error: got.append((result, error)))
    for i in range(4):
        x = grpcclient.InferInput("x", [1, 3], "FP32")
        x.set_data_from_numpy(_x(1) + i)
        c.async_stream_infer("affine", [x], request_id=str(i))
    c.stop_stream()  # waits for the stream to close, after every response arrived
    assert sorted(r.get_response().id for r, e in got if e is None) == ["0", "1", "2", "3"]
    for r, _ in got:
        i = int(r.get_response().id)
        np.testing.assert_allclose(r.as_numpy("y"), (_x(1) + i) * 2)


def test_aio_clients_concurrently(gateway):
    async def main() -> None:
        h = httpaio.InferenceServerClient(gateway.http_url)
        g = grpcaio.InferenceServerClient(gateway.grpc_url)
        try:
            assert await h.is_model_ready("affine") and await g.is_model_ready("affine")

            async def one_http(i: int) -> None:
                x = httpaio.InferInput("x", [1, 3], "FP32")
                x.set_data_from_numpy(_x(1) + i)
                r = await h.infer("affine", [x])
                np.testing.assert_allclose(r.as_numpy("y"), (_x(1) + i) * 2)

            async def one_grpc(i: int) -> None:
                x = grpcaio.InferInput("x", [2, 3], "FP32")
                x.set_data_from_numpy(_x(2) + i)
                r = await g.infer("affine", [x])
                np.testing.assert_allclose(r.as_numpy("y"), (_x(2) + i) * 2)

            # NOTE: concurrent requests get batched together and each gets its own rows back
            await asyncio.gather(*(one_http(i) for i in range(6)), *(one_grpc(i) for i in range(6)))
            assert (await g.get_model_metadata("affine")).name == "affine"
            assert (await h.get_model_config("affine"))["name"] == "affine"
        finally:
            await h.close()
            await g.close()

    asyncio.run(main())


# --------------------------------------------------------------------------- malformed input


def _post(gw, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(gw.http_url, timeout=10)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return r.status, json.loads(data) if data else {}
    finally:
        conn.close()


def _infer_doc(**inp) -> bytes:
    base = {"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}
    base.update(inp)
    return json.dumps({"inputs": [base]}).encode()


@pytest.mark.parametrize("path,body,headers,status", [
    ("/v2/models/affine/infer", b"{not json", None, 400),
    ("/v2/models/affine/infer", b"[1, 2]", None, 400),
    ("/v2/models/affine/infer", _infer_doc(datatype="INT32"), None, 400),
    ("/v2/models/affine/infer", _infer_doc(datatype="FLOAT99"), None, 400),
    ("/v2/models/affine/infer", _infer_doc(shape=[1, 4]), None, 400),
    ("/v2/models/affine/infer", _infer_doc(shape=[1, 3], data=[1, 2]), None, 400),
    ("/v2/models/affine/infer", _infer_doc(data=["a", "b", "c"]), None, 400),
    ("/v2/models/affine/infer", _infer_doc(shape=[9, 3], data=list(range(27))), None, 400),
    ("/v2/models/affine/infer", _infer_doc(name="nope"), None, 400),
    ("/v2/models/nope/infer", _infer_doc(), None, 404),
    ("/v2/models/affine/infer", _infer_doc(), {"Inference-Header-Content-Length": "abc"}, 400),
    ("/v2/models/affine/infer", _infer_doc(), {"Inference-Header-Content-Length": "99999"}, 400),
    ("/v2/models/affine/infer", _infer_doc(parameters={"binary_data_size": 12}, data=None), None, 400),
    ("/v2/models/affine/infer", b"x" * (65 << 20), None, 413),
    # a small gzip body that inflates past the limit
    ("/v2/models/affine/infer", gzip.compress(b" " * (65 << 20), 1), {"Content-Encoding": "gzip"}, 413),
    ("/v2/models/affine/infer", b"not gzip at all", {"Content-Encoding": "gzip"}, 400),
])
def test_http_malformed_input_is_4xx_with_error(gateway, path, body, headers, status):
    code, doc = _post(gateway, path, body, headers)
    assert code == status
    assert isinstance(doc.get("error"), str) and doc["error"]


def test_grpc_malformed_input_is_invalid_argument(gateway):
    ch = grpc.insecure_channel(gateway.grpc_url)
    try:
        raw_infer = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as e:
            raw_infer(b"\xff\xff\xff\xff garbage")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        infer = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                               request_serializer=pb.ModelInferRequest.SerializeToString,
                               response_deserializer=pb.ModelInferResponse.FromString)
        req = pb.ModelInferRequest(model_name="affine")
        req.inputs.add(name="x", datatype="FP32", shape=[1, 3])
        req.raw_input_contents.append(b"\x00" * 8)  # 8 bytes for 12 expected
        with pytest.raises(grpc.RpcError) as e:
            infer(req)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "bytes" in e.value.details()
    finally:
        ch.close()
    c = grpcclient.InferenceServerClient(gateway.grpc_url)
    x = grpcclient.InferInput("x", [1, 3], "INT32")
    x.set_data_from_numpy(np.zeros((1, 3), np.int32))
    with pytest.raises(InferenceServerException, match="datatype INT32"):
        c.infer("affine", [x])
    with pytest.raises(InferenceServerException, match="unknown model"):
        c.get_model_metadata("nope")


def test_metrics_exported_by_model(gateway):
    conn = http.client.HTTPConnection(gateway.http_url, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    assert 'headrace_request_duration_seconds_bucket{le="0.0005",model="affine"}' in text
    assert 'headrace_batch_size_count{model="affine",variant="affine-v1"}' in text
    assert 'headrace_goodput_total{model="affine"}' in text


# --------------------------------------------------------------------------- early rejection


def test_infeasible_deadline_is_429_with_retry_after_over_http(gateway):
    # a 1 µs timeout cannot be met by any batch: the gateway answers at once, without queueing
    body = json.dumps({"parameters": {"timeout": 1},
                       "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}).encode()
    conn = http.client.HTTPConnection(gateway.http_url, timeout=10)
    try:
        conn.request("POST", "/v2/models/affine/infer", body=body)
        r = conn.getresponse()
        doc = json.loads(r.read())
    finally:
        conn.close()
    assert r.status == 429 and int(r.getheader("Retry-After")) >= 1
    assert r.getheader("x-headrace-reject-reason") == "infeasible"  # refused at arrival
    assert "deadline" in doc["error"]


def test_infeasible_slo_header_is_resource_exhausted_over_grpc(gateway):
    c = grpcclient.InferenceServerClient(gateway.grpc_url)
    x = grpcclient.InferInput("x", [1, 3], "FP32")
    x.set_data_from_numpy(_x(1))
    with pytest.raises(InferenceServerException) as e:
        c.infer("affine", [x], headers={"x-headrace-slo-ms": "0.001"})
    assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    ch = grpc.insecure_channel(gateway.grpc_url)
    try:
        infer = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                               request_serializer=pb.ModelInferRequest.SerializeToString,
                               response_deserializer=pb.ModelInferResponse.FromString)
        req = pb.ModelInferRequest(model_name="affine")
        req.inputs.add(name="x", datatype="FP32", shape=[1, 3])
        req.raw_input_contents.append(_x(1).tobytes())
        with pytest.raises(grpc.RpcError) as raw:
            infer(req, metadata=(("x-headrace-slo-ms", "0.001"),))
        assert raw.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert dict(raw.value.trailing_metadata())["x-headrace-reject-reason"] == "infeasible"
    finally:
        ch.close()
    conn = http.client.HTTPConnection(gateway.http_url, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    assert 'headrace_rejections_total{model="affine",reason="infeasible"}' in text
    refused = [ln for ln in text.splitlines() if ln.startswith('headrace_refusal_wait_seconds_count{model="affine"}')]
    assert refused and float(refused[0].rsplit(" ", 1)[1]) >= 2  # both refusals above were timed
