"""Tensor codecs and the gateway config: JSON, binary extension and gRPC decode to the same
bytes; concatenate/split round-trips; bad input and bad config name the field and value."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from gateway.codec import (
    InferInput,
    Memo,
    RequestedOutput,
    Tensor,
    concat,
    encode_http_response,
    parse_grpc_infer,
    parse_http_infer,
    raw_to_json,
    split,
)
from gateway.config import parse_config, resolve
from gateway.errors import ConfigError, InvalidRequest


def test_json_binary_and_grpc_decode_to_the_same_bytes():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    as_json = parse_http_infer(json.dumps({"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [2, 3], "data": x.tolist()}]}).encode(), None)
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3],
                                   "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    as_binary = parse_http_infer(head + x.tobytes(), str(len(head)))
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[2, 3]).contents.fp32_contents.extend(x.ravel().tolist())
    as_grpc = parse_grpc_infer(req)
    assert bytes(as_json.inputs[0].raw) == bytes(as_binary.inputs[0].raw) == bytes(as_grpc.inputs[0].raw) == x.tobytes()


@given(st.lists(st.integers(1, 4), min_size=1, max_size=6), st.sampled_from(["FP32", "INT64", "BYTES"]))
def test_concat_then_split_gives_back_each_part(rows, datatype):
    parts = []
    for i, r in enumerate(rows):
        if datatype == "BYTES":
            els = [f"{i}-{k}" * (k % 3) for k in range(r * 2)]
            raw = b"".join(struct.pack("<I", len(e)) + e.encode() for e in els)
        else:
            raw = (np.arange(r * 2) + 10 * i).astype("<f4" if datatype == "FP32" else "<i8").tobytes()
        parts.append(Tensor("t", datatype, [r, 2], raw))
    whole = concat(parts)
    assert whole.shape == [sum(rows), 2]
    back = split(whole, rows)
    assert [bytes(b.raw) for b in back] == [bytes(p.raw) for p in parts]
    assert [b.shape for b in back] == [p.shape for p in parts]


def test_bytes_tensors_round_trip_through_json():
    doc = {"inputs": [{"name": "s", "datatype": "BYTES", "shape": [1, 2], "data": [["héllo", "x"]]}]}
    t = parse_http_infer(json.dumps(doc).encode(), None).inputs[0]
    assert raw_to_json(t) == ["héllo", "x"]


def test_binary_outputs_follow_request_and_output_flags():
    req = InferInput([], [RequestedOutput("a", binary=True), RequestedOutput("b")],
                     parameters={"binary_data_output": False})
    a = Tensor("a", "FP32", [1, 2], np.array([1, 2], np.float32).tobytes())
    b = Tensor("b", "INT32", [1, 1], np.array([7], np.int32).tobytes())
    c = Tensor("c", "INT32", [1, 1], np.array([9], np.int32).tobytes())
    body, hl = encode_http_response("m", "1", req, [a, b, c], {"headrace_variant": "v"})
    head = json.loads(body[:hl])
    assert [o["name"] for o in head["outputs"]] == ["a", "b"]  # c was not requested
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 8 and body[hl:] == bytes(a.raw)
    assert head["outputs"][1]["data"] == [7] and head["parameters"] == {"headrace_variant": "v"}


def test_a_repeated_header_is_decoded_once_but_each_body_is_its_own():
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
                                   "parameters": {"binary_data_size": 8}}]}).encode()
    a, b = (np.array(v, np.float32) for v in ([1, 2], [3, 4]))
    first = parse_http_infer(head + a.tobytes(), str(len(head)))
    second = parse_http_infer(head + b.tobytes(), str(len(head)))
    assert bytes(first.inputs[0].raw) == a.tobytes() and bytes(second.inputs[0].raw) == b.tobytes()
    with pytest.raises(InvalidRequest, match="not claimed"):  # the known header still checks the body
        parse_http_infer(head + a.tobytes() + b"\0", str(len(head)))
    bad = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],
                                  "parameters": {"binary_data_size": 4}}]}).encode()
    for _ in range(2):  # a header that fails is not remembered as good
        with pytest.raises(InvalidRequest, match="bytes do not match shape"):
            parse_http_infer(bad + b"\0" * 4, str(len(bad)))


def test_the_memo_keeps_short_keys_only_and_empties_when_full():
    memo = Memo(size=2, max_key_bytes=8)
    assert memo.put(b"x" * 9, 1) == 1 and memo.get(b"x" * 9) is None  # a document with inline data
    memo.put(b"a", 1)
    memo.put(("t",), 2)
    assert memo.get(b"a") == 1 and memo.get(("t",)) == 2
    memo.put(b"c", 3)  # full: starts over
    assert memo.get(b"a") is None and memo.get(b"c") == 3


def test_response_headers_follow_each_requests_choice_of_outputs():
    a = Tensor("a", "FP32", [1, 2], np.array([1, 2], np.float32).tobytes())
    b = Tensor("b", "FP32", [1, 1], np.array([3], np.float32).tobytes())
    everything = InferInput([], [], parameters={"binary_data_output": True})
    only_b = InferInput([], [RequestedOutput("b", binary=True)])
    for req, names, blobs in ((everything, ["a", "b"], a.raw + b.raw), (only_b, ["b"], b.raw),
                              (everything, ["a", "b"], a.raw + b.raw)):
        body, hl = encode_http_response("m", "1", req, [a, b], {"headrace_variant": "v"})
        assert [o["name"] for o in json.loads(body[:hl])["outputs"]] == names and body[hl:] == blobs
    body, hl = encode_http_response("m", "1", InferInput([], [RequestedOutput("a", binary=False)]), [a, b], {})
    assert hl is None and json.loads(body)["outputs"][0]["data"] == [1.0, 2.0]


@pytest.mark.parametrize("doc,match", [
    ({"inputs": []}, "non-empty 'inputs'"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, -3], "data": [1]}]}, "shape"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, "a"]}]}, "not FP32"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [[1], [2, 3]]}]}, "not FP32|ragged|do not match"),
    ({"inputs": [{"name": "x", "datatype": "BF16", "shape": [1], "data": [1.0]}]}, "binary"),
    ({"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [300]}]}, "INT8"),
])
def test_bad_json_inputs_name_the_tensor(doc, match):
    with pytest.raises(InvalidRequest, match=match):
        parse_http_infer(json.dumps(doc).encode(), None)


def test_binary_data_must_be_claimed_exactly():
    head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1],
                                   "parameters": {"binary_data_size": 4}}]}).encode()
    with pytest.raises(InvalidRequest, match="not claimed"):
        parse_http_infer(head + b"\0" * 8, str(len(head)))
    with pytest.raises(InvalidRequest, match="runs past"):
        parse_http_infer(head + b"\0" * 2, str(len(head)))


# --------------------------------------------------------------------------- config


def _cfg(**model) -> dict:
    m = {"name": "r", "slo_ms": 100, "replicas": [
        {"url": "127.0.0.1:8001", "variant": "resnet50", "profile": "resnet50@A100-80GB/1g.10gb"}]}
    m.update(model)
    return {"models": [m]}


def test_config_resolves_reference_profile_capped_at_max_batch():
    (m,) = resolve(parse_config(_cfg(max_batch=16)))
    assert m.slo == pytest.approx(0.1) and m.replicas[0].profile.max_batch == 16
    assert m.replicas[0].id == "resnet50#1"  # the variant's first replica: an id, never its address


def test_replica_overhead_is_added_to_every_planned_latency():
    base = parse_config(_cfg(max_batch=8))
    slow = parse_config(_cfg(max_batch=8, replicas=[{
        "url": "127.0.0.1:8001", "variant": "resnet50", "profile": "resnet50@A100-80GB/1g.10gb", "overhead_ms": 3}]))
    p0, p3 = resolve(base)[0].replicas[0].profile, resolve(slow)[0].replicas[0].profile
    for b in (1, 4, 8):
        assert p3.latency(b) == pytest.approx(p0.latency(b) + 0.003)


@pytest.mark.parametrize("model,match", [
    ({"slo_ms": -5}, r"models\.0\.slo_ms.*-5"),
    ({"max_batch": 0}, r"models\.0\.max_batch.*0"),
    ({"priority": "vip"}, r"models\.0\.priority.*vip"),
    ({"replicas": [{"url": "nohost", "variant": "v", "profile": "p"}]}, r"models\.0\.replicas\.0\.url.*nohost"),
])
def test_config_errors_name_field_and_value(model, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(_cfg(**model))


def test_unknown_profile_reference_lists_known_ones():
    cfg = parse_config(_cfg(replicas=[{"url": "h:1", "variant": "v", "profile": "nope@X/1g"}]))
    with pytest.raises(ConfigError, match=r"replicas\.0\.profile.*nope@X/1g.*known"):
        resolve(cfg)


def test_shipped_example_config_resolves():
    from pathlib import Path

    from gateway.config import load_config

    (m,) = resolve(load_config(Path(__file__).parents[2] / "gateway" / "example.yaml"))
    assert [r.protocol for r in m.replicas] == ["http", "grpc"]
    assert m.replicas[1].profile.latency(1) > m.replicas[0].profile.latency(1)  # overhead_ms applies
