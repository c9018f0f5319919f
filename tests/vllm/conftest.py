"""One real vLLM on CPU for every opt-in test here (it takes a minute or two to start)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bench.vllm_cpu.server import VllmServer, missing, vllm_server


@pytest.fixture(scope="package")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    why = missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"--run-vllm under CI, but {why}")
        pytest.skip(why)
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with vllm_server(log) as server:
        yield server
