"""``headrace load`` against real Triton (CPU): inputs read from model metadata, binary HTTP
and gRPC, the SLO carried as Triton's ``timeout`` parameter."""

from __future__ import annotations

import asyncio

import pytest

from loadgen.run import run_load
from loadgen.spec import LoadSpec
from profiles.triton.repository import DynamicBatching, ModelConfig, TensorSpec, write_model
from profiles.triton.server import TritonServer

SLEEPY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.005)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy().sum(axis=1, keepdims=True))])
            for r in requests]
"""


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    cfg = ModelConfig(
        "sleepy", (TensorSpec("x", "FP32", (4,)),), (TensorSpec("y", "FP32", (1,)),),
        max_batch_size=8, dynamic_batching=DynamicBatching(),
    )  # fmt: skip
    write_model(repo, cfg, SLEEPY)
    with TritonServer(repo) as server:
        yield server


@pytest.mark.integration
@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_open_loop_against_triton(triton, scheme) -> None:
    port = triton.http_port if scheme == "http" else triton.grpc_port
    spec = LoadSpec(
        target=f"{scheme}://127.0.0.1:{port}", model="sleepy", rate=40, duration_s=1.5,
        warmup_s=0.5, slo_ms=2000, arrival="poisson", lag_warn_ms=1000,
    )  # fmt: skip
    s = asyncio.run(run_load(spec)).summary
    assert s["offered"] > 20
    assert s["error_count"] == 0, s["errors"]
    assert s["attainment"] == pytest.approx(1.0)
    assert s["latency_ms"]["p50"] >= 5.0  # the model sleeps 5 ms per batch
