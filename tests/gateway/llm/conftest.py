"""Emulated engines (``headrace engine`` processes on free ports) and gateways in front of them."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.app import Gateway, GatewayThread
from gateway.config import parse_config
from tests.prometheus import samples

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "profiles/llm/measured/tiny-llama-cpu.yaml"  # 2048-token context, a few ms per token
SERVED = "tiny"  # the engine's model name; clients address "llama"


class Engine:
    """``headrace engine`` on a free port, serving the tiny profile as ``tiny``."""

    def __init__(self, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "engine", "--profile", str(TINY), "--port", "0",
             "--served-model-name", SERVED, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        found = re.search(r"(http://[\d.]+:\d+)/v1", line)
        if not found:
            self.proc.kill()
            raise RuntimeError(f"headrace engine did not start: {line}{self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.url = found.group(1)

    def gauge(self, name: str) -> float:
        return samples(self.url + "/metrics")[f'{name}{{engine="0",model_name="{SERVED}"}}']

    def wait_idle(self, kv_idle: float, timeout: float = 10.0) -> None:
        """Until nothing runs or waits at the engine and its KV usage is back to ``kv_idle``."""
        deadline = time.monotonic() + timeout
        while True:
            state = (self.gauge("vllm:num_requests_running"), self.gauge("vllm:num_requests_waiting"),
                     self.gauge("vllm:kv_cache_usage_perc"))
            if state == (0.0, 0.0, kv_idle):
                return
            assert time.monotonic() < deadline, f"engine still busy (running, waiting, kv usage): {state}"
            time.sleep(0.05)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gateway_config(engine_url: str | None, **extra: Any) -> Any:
    """A gateway serving ``llama`` on ``engine_url`` (None: on a port nothing listens on)."""
    url = engine_url or f"http://127.0.0.1:{closed_port()}"
    doc = {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0},
           "llm_models": [{"name": "llama", "slo_ttft_ms": 500, "slo_tpot_ms": 50,
                           "replicas": [{"url": url, "engine": "emulated", "model": SERVED}]}], **extra}
    return parse_config(doc)


@pytest.fixture(scope="package")
def engine() -> Iterator[Engine]:
    e = Engine()
    try:
        yield e
    finally:
        e.close()


@pytest.fixture(scope="package")
def gateway(engine: Engine) -> Iterator[Gateway]:
    with GatewayThread(gateway_config(engine.url, write_timeout_s=1.0)) as gw:
        yield gw


def client(gw: Gateway, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{gw.http_url}/v1", api_key="none", max_retries=0, **kw)
