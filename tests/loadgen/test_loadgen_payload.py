"""Request encodings: binary and JSON HTTP bodies and gRPC requests carry the tensors and
Triton's timeout (µs) / priority parameters; variants are read back from responses."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from loadgen.payload import (
    PayloadError,
    grpc_request,
    http_body,
    parameters,
    read_input_file,
    synthesize,
    variant_from_grpc,
    variant_from_http,
)
from loadgen.spec import InputSpec

INPUTS = (
    InputSpec(name="x", shape=(-1, 3), datatype="FP32"),
    InputSpec(name="ids", shape=(2,), datatype="INT64"),
)


def tensors(batch: int = 2):
    return synthesize(INPUTS, batch, np.random.default_rng(0))


def test_slo_and_priority_become_triton_parameters() -> None:
    assert parameters(slo_ms=100, priority=1, send_timeout=True) == {
        "timeout": 100_000,
        "priority": 1,
    }
    assert parameters(slo_ms=100, priority=None, send_timeout=False) == {}


def test_binary_body_has_header_length_and_raw_tensors() -> None:
    ts = tensors()
    b = http_body("m", ts, {"timeout": 5000}, binary=True)
    headers = dict(b.headers)
    n = int(headers["Inference-Header-Content-Length"])
    head = json.loads(b.body[:n])
    assert head["parameters"] == {"timeout": 5000, "binary_data_output": True}
    assert [i["shape"] for i in head["inputs"]] == [[2, 3], [2]]
    sizes = [i["parameters"]["binary_data_size"] for i in head["inputs"]]
    assert sizes == [2 * 3 * 4, 2 * 8]
    raw = b.body[n:]
    assert np.array_equal(np.frombuffer(raw[: sizes[0]], dtype="<f4").reshape(2, 3), ts[0].array)
    assert b.path == "/v2/models/m/infer"


def test_json_body_carries_data_and_parameters() -> None:
    ts = tensors(batch=1)
    doc = json.loads(http_body("m", ts, {"priority": 2}, binary=False).body)
    assert doc["parameters"] == {"priority": 2}
    assert doc["inputs"][0]["data"] == pytest.approx(ts[0].array.reshape(-1).tolist())
    assert doc["inputs"][1]["datatype"] == "INT64"


def test_grpc_request_carries_raw_contents_and_parameters() -> None:
    ts = tensors()
    req = pb.ModelInferRequest.FromString(grpc_request("m", ts, {"timeout": 7, "priority": 1}))
    assert req.model_name == "m"
    assert req.parameters["timeout"].int64_param == 7
    assert req.parameters["priority"].int64_param == 1
    assert list(req.inputs[0].shape) == [2, 3]
    assert req.raw_input_contents[1] == ts[1].array.astype("<i8").tobytes()


def test_variant_is_read_from_response_parameters() -> None:
    body = json.dumps({"parameters": {"headrace_variant": "r18"}, "outputs": []}).encode()
    assert variant_from_http(body, None) == "r18"
    assert variant_from_http(body + b"\x00\x01binary", len(body)) == "r18"
    assert variant_from_http(b'{"outputs": []}', None) is None
    resp = pb.ModelInferResponse(model_name="m")
    resp.parameters["headrace_variant"].string_param = "r50"
    assert variant_from_grpc(resp.SerializeToString()) == "r50"


def test_input_file_gives_real_inputs_and_clear_errors(tmp_path) -> None:
    p = tmp_path / "in.json"
    p.write_text(
        json.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})
    )
    (t,) = read_input_file(p)
    assert t.array.tolist() == [[1.0, 2.0]] and t.datatype == "FP32"
    p.write_text(
        json.dumps({"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2]}]})
    )
    with pytest.raises(PayloadError, match=r"in\.json: bad input file"):
        read_input_file(p)
