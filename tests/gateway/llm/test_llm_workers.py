"""``headrace serve --workers N`` with generative models only: every worker relays to all the
model's engines, on the shared ports, and the official client is answered through any of them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import yaml

from profiles.triton.server import free_port
from tests.gateway.llm.conftest import ROOT, SERVED, Engine


def test_two_workers_serve_a_config_of_generative_models_only(engine: Engine, tmp_path: Path) -> None:
    port = free_port()
    doc = {"listen": {"host": "127.0.0.1", "http_port": port, "grpc_port": free_port()},
           "llm_models": [{"name": "llama", "replicas": [{"url": engine.url, "engine": "emulated", "model": SERVED}]}]}
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump(doc))
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "serve", "--config", str(tmp_path / "gw.yaml"),
                             "--workers", "2"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the workers never became ready"
            time.sleep(0.2)
        for _ in range(6):  # a new connection each: the kernel spreads them over the workers
            c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
            assert c.completions.create(model="llama", prompt="hi", max_tokens=3).usage.completion_tokens == 3
            assert len([ch for ch in c.completions.create(model="llama", prompt="hi", max_tokens=3, stream=True)
                        if ch.choices and ch.choices[0].text]) == 3
            c.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
