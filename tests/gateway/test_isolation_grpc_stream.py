"""A gRPC stream whose client sends and never reads (issue #31): the gateway stops reading
its requests once ``grpc_stream_pending`` answers wait (HTTP/2 flow control then holds the
client), so the client holds a bounded number of answers, not one per request it sent; and
a stream whose client reads nothing for ``write_timeout_s`` ends with RESOURCE_EXHAUSTED,
which the client sees after the answers it had not read. Other clients are
answered throughout. An in-process gateway with fake replicas that answer at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from gateway.app import GatewayThread
from gateway.backends.grpc import ModelInfo
from gateway.codec import Signature, TensorSig
from gateway.config import parse_config
from tests.gateway.test_isolation_grpc import PROFILE, TritonRules

SENT = 2_000  # requests the stuck client sends on one stream
WIDE = 1 << 16  # FP32 elements a row: each answer is 256 KiB, so unread answers fill the windows


class Wide(TritonRules):
    """Echoes rows of WIDE floats at once."""

    async def model_info(self, variant: str) -> ModelInfo:
        sig = Signature({"x": TensorSig("x", "FP32", (WIDE,))}, {"y": TensorSig("y", "FP32", (WIDE,))},
                        max_batch_size=8)
        return ModelInfo(sig, pb.ModelMetadataResponse(name=variant), mc.ModelConfig(name=variant))


def served(replicas: list[TritonRules]) -> int:
    return sum(len(r.seen) for r in replicas)


def start(replicas: list[TritonRules], **cfg: Any) -> GatewayThread:
    doc: dict[str, Any] = {"listen": {"http_port": 0, "grpc_port": 0},
                           "models": [{"name": "m", "slo_ms": 2000, "max_batch": 8, "replicas": [
                               {"url": "fake:9000", "variant": "v", "profile": PROFILE}]}], **cfg}

    def factory(_: str, url: str) -> TritonRules:
        r = Wide(url)
        replicas.append(r)
        return r

    return GatewayThread(parse_config(doc), replica_factory=factory)


def wide() -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m")
    req.inputs.add(name="x", datatype="FP32", shape=[1, WIDE])
    req.raw_input_contents.append(np.ones((1, WIDE), np.float32).tobytes())
    return req


def requests(sent: list[int]) -> Iterator[pb.ModelInferRequest]:
    for i in range(SENT):
        sent[0] = i + 1
        yield wide()


def test_a_stream_that_never_reads_is_held_back_then_cancelled_while_others_are_answered(
        caplog: pytest.LogCaptureFixture) -> None:
    replicas: list[TritonRules] = []
    with start(replicas, limits={"grpc_stream_pending": 8}, write_timeout_s=1.0) as gw, \
            grpc.insecure_channel(gw.grpc_url) as stuck, grpc.insecure_channel(gw.grpc_url) as other:
        sent = [0]
        call = pbg.GRPCInferenceServiceStub(stuck).ModelStreamInfer(requests(sent))  # never read
        # the gateway answers what the stream's flow-control window holds, then stops reading
        held, end = -1, time.monotonic() + 20
        while served(replicas) != held and time.monotonic() < end:  # until no batch for 0.5 s
            held = served(replicas)
            time.sleep(0.5)
        # NOTE: bounded: answers up to the client's receive window and the pending bound, not all sent
        assert served(replicas) == held and held < 200 and sent[0] < SENT // 2, (held, sent[0])
        stub = pbg.GRPCInferenceServiceStub(other)
        for _ in range(20):  # NOTE: another client is answered meanwhile
            assert stub.ModelInfer(wide(), timeout=5).raw_output_contents
        # NOTE: the stuck stream ends once its client has read nothing for write_timeout_s
        deadline = time.monotonic() + 10
        codes: list[grpc.StatusCode] = []

        def drain() -> None:
            try:
                for _ in call:
                    pass
            except grpc.RpcError as e:
                codes.append(e.code())

        time.sleep(1.5)  # past write_timeout_s with nothing read
        t = threading.Thread(target=drain, daemon=True)
        t.start()
        t.join(max(0.0, deadline - time.monotonic()))
        assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED], (codes, caplog.text[-2000:], served(replicas))
        assert served(replicas) <= held + 21  # nothing more of the stuck stream ran
        assert stub.ModelInfer(wide(), timeout=5).raw_output_contents
