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
    assert m.replica_id(m.replicas[0]) == "meta-llama/Llama-3.1-8B-Instruct@http://127.0.0.1:9100"
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
