"""A Triton decoupled model as a generative model's engine (``engine: triton``): real tritonserver
serving the emulated LLM engine, reached over its generate_stream. The OpenAI routes (whole,
streamed, chat) and the generate routes answer the text the engine model makes; its refusals come
back with their status; a client leaving aborts the request in the engine and frees its KV."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import openai
import pytest

from gateway.app import Gateway, GatewayThread
from gateway.config import parse_config
from profiles.emulator.llm_repository import write_llm_model
from profiles.llm.tokens import chat_prompt
from profiles.triton.server import TritonServer
from tests.gateway.llm.conftest import client
from tests.gateway.llm.test_generate_routes import events, post
from tests.gateway.llm.test_grpc_stream import send
from tests.profiles.test_llm_triton import (
    MODEL,
    SETTINGS,
    Stream,
    engine_metric,
    engine_text,
    tiny_profile,
)

pytestmark = pytest.mark.integration
PROMPT = "The quick brown fox jumps over the lazy dog, twice."


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repo = tmp_path_factory.mktemp("llm")
    write_llm_model(repo, MODEL, tiny_profile(), **SETTINGS)
    with TritonServer(repo, ready_timeout=120) as server:  # a busy host starts python stubs slowly
        yield server


@pytest.fixture(scope="module")
def gw(triton: TritonServer) -> Iterator[Gateway]:
    doc = {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0}, "write_timeout_s": 1.0,
           "llm_models": [{"name": "llama", "slo_ttft_ms": 500, "slo_tpot_ms": 50, "replicas": [
               {"url": f"http://{triton.http_url}", "engine": "triton", "model": MODEL,
                "metrics_url": f"http://127.0.0.1:{triton.metrics_port}"}]}]}
    with GatewayThread(parse_config(doc)) as g:
        yield g


def test_openai_completions_whole_and_streamed_are_the_engines_text(gw: Gateway) -> None:
    want = engine_text(PROMPT, 8, 3)
    c = client(gw)
    whole = c.completions.create(model="llama", prompt=PROMPT, max_tokens=8, seed=3)
    assert whole.choices[0].text == want and whole.model == "llama"
    assert whole.usage.completion_tokens == 8 and whole.choices[0].finish_reason == "length"
    chunks = list(c.completions.create(model="llama", prompt=PROMPT, max_tokens=8, seed=3, stream=True,
                                       stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want
    assert len([ch for ch in chunks if ch.choices and ch.choices[0].text]) == 8  # one chunk per token
    assert chunks[-1].usage.completion_tokens == 8


def test_openai_chat_goes_through_the_models_chat_prompt(gw: Gateway) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    want = engine_text(chat_prompt(messages), 5, 9)
    c = client(gw)
    got = c.chat.completions.create(model="llama", messages=messages, max_tokens=5, seed=9)  # type: ignore[arg-type]
    assert got.choices[0].message.content == want
    streamed = c.chat.completions.create(model="llama", messages=messages, max_tokens=5, seed=9,  # type: ignore[arg-type]
                                         stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices) == want


def test_generate_routes_through_the_gateway(gw: Gateway) -> None:
    want = engine_text(PROMPT, 6, 1)
    status, body = post(gw, "/v2/models/llama/generate", {"text_input": PROMPT, "max_tokens": 6, "seed": 1})
    assert (status, json.loads(body)) == (200, {"model_name": "llama", "model_version": "1", "text_output": want})
    status, body = post(gw, "/v2/models/llama/generate_stream", {"text_input": PROMPT, "max_tokens": 6, "seed": 1})
    assert status == 200
    got = events(body)
    assert len(got) == 6 and "".join(e["text_output"] for e in got) == want


def test_the_engines_refusal_comes_back_with_its_status(gw: Gateway) -> None:
    prompt = " ".join(["word"] * 4090)
    with pytest.raises(openai.BadRequestError) as e:
        client(gw).completions.create(model="llama", prompt=prompt, max_tokens=16)
    assert "maximum context length is 4096 tokens" in e.value.message
    status, body = post(gw, "/v2/models/llama/generate_stream", {"text_input": prompt, "max_tokens": 16})
    assert status == 400 and "maximum context length is 4096 tokens" in json.loads(body)["error"]
    with pytest.raises(openai.BadRequestError):  # token ids cannot be put as Triton's text_input
        client(gw).completions.create(model="llama", prompt=[1, 2, 3], max_tokens=2)


def test_a_client_leaving_aborts_in_the_engine_and_frees_its_kv(gw: Gateway, triton: TritonServer) -> None:
    aborted = engine_metric(triton, "vllm:request_success_total", finished_reason="abort")
    stream = client(gw).completions.create(model="llama", prompt=PROMPT, max_tokens=2000, stream=True)
    for _ in range(3):
        next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 10
    while engine_metric(triton, "vllm:request_success_total", finished_reason="abort") < aborted + 1:
        assert time.monotonic() < deadline, "the engine never aborted the request of the client that left"
        time.sleep(0.05)
    # NOTE: the abort freed the request's KV blocks
    assert engine_metric(triton, "vllm:kv_cache_usage_perc") == 0.0
    assert engine_metric(triton, "vllm:num_requests_running") == 0.0


def test_a_grpc_stream_gets_one_response_per_token_relayed_from_triton(gw: Gateway) -> None:
    s = Stream(gw.grpc_url)
    try:
        send(s, PROMPT, 6, 3)
        got = s.read_all()
    finally:
        s.close()
    assert "".join(t or "" for t, _, _ in got) == engine_text(PROMPT, 6, 3)
    assert [bool(t) for t, _, _ in got] == [True] * 6 + [False]  # then the empty final response
