"""Generative models in the gateway's config: what is accepted, and a bad one refused in one line
(exit 2) by ``headrace serve``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deploy.cli import main
from gateway.config import parse_config
from gateway.errors import ConfigError

LLM = {"name": "llama", "replicas": [{"url": "http://127.0.0.1:9100", "engine": "vllm",
                                      "model": "meta-llama/Llama-3.1-8B-Instruct"}]}


def test_a_config_of_generative_models_alone_is_valid() -> None:
    cfg = parse_config({"llm_models": [LLM]})
    m = cfg.llm_models[0]
    assert cfg.models == [] and m.slo_ttft_ms == 1000 and m.slo_tpot_ms == 100
    assert m.replica_id(m.replicas[0]) == "llama#1"  # the model's first engine: an id, never its url
    assert cfg.write_timeout_s == 30


@pytest.mark.parametrize(("doc", "says"), [
    ({}, "models and llm_models are both empty"),
    ({"llm_models": [{**LLM, "replicas": [{"url": "127.0.0.1:9100"}]}]}, "must be http://host:port"),
    ({"llm_models": [{**LLM, "replicas": [{"url": "http://h:1", "engine": "llamacpp"}]}]}, "engine"),
    ({"llm_models": [{**LLM, "slo_ttft_ms": 0}]}, "slo_ttft_ms"),
    ({"llm_models": [LLM, LLM]}, "model names must be unique"),
    ({"llm_models": [LLM], "write_timeout_s": 0}, "write_timeout_s"),
    ({"llm_models": [{**LLM, "typo": 1}]}, "typo"),
])
def test_bad_generative_config_is_refused_naming_the_field(doc: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_config(doc)


def test_headrace_serve_refuses_a_bad_one_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump({"llm_models": [{**LLM, "slo_tpot_ms": -1}]}))
    assert main(["serve", "--config", str(tmp_path / "gw.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("headrace serve: ") and "slo_tpot_ms" in err and len(err.splitlines()) == 1, err


def test_the_example_config_is_valid() -> None:
    from gateway.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[3] / "gateway/example-llm.yaml")
    assert [m.name for m in cfg.llm_models] == ["llama-8b"] and len(cfg.llm_models[0].replicas) == 2


def test_headrace_serve_relays_the_openai_api(tmp_path: Path, engine) -> None:  # noqa: ANN001  (the engine fixture)
    import re
    import subprocess
    import sys

    import openai

    from tests.gateway.llm.conftest import ROOT, SERVED

    doc = {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0},
           "llm_models": [{"name": "llama", "replicas": [{"url": engine.url, "engine": "emulated", "model": SERVED}]}]}
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump(doc))
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "serve", "--config", str(tmp_path / "gw.yaml")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        found = re.search(r"http (\S+)", line)
        assert found, line + proc.stderr.read()  # type: ignore[union-attr]
        c = openai.OpenAI(base_url=f"http://{found.group(1)}/v1", api_key="none", max_retries=0)
        chunks = list(c.chat.completions.create(model="llama", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=3, stream=True))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks).split().__len__() == 3
    finally:
        proc.terminate()
        assert proc.wait(15) == 0


def test_sigterm_lets_open_streams_finish(tmp_path: Path, engine) -> None:  # noqa: ANN001  (the engine fixture)
    import re
    import signal
    import subprocess
    import sys
    import threading

    import openai

    from tests.gateway.llm.conftest import ROOT, SERVED

    doc = {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0}, "drain_timeout_s": 20,
           "llm_models": [{"name": "llama", "replicas": [{"url": engine.url, "engine": "emulated", "model": SERVED}]}]}
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump(doc))
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "serve", "--config", str(tmp_path / "gw.yaml")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        found = re.search(r"http (\S+)", proc.stdout.readline())  # type: ignore[union-attr]
        assert found
        c = openai.OpenAI(base_url=f"http://{found.group(1)}/v1", api_key="none", max_retries=0)
        stream = iter(c.completions.create(model="llama", prompt="drain", max_tokens=150, stream=True))
        got = [next(stream)]
        proc.send_signal(signal.SIGTERM)
        reader = threading.Thread(target=lambda: got.extend(stream))
        reader.start()
        reader.join(20)
        # NOTE: the stream that was open when the gateway was told to stop ran to its end
        assert len(got) == 150
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
