"""Real vLLM on CPU behind the gateway: the official ``openai`` client (sync, async, streaming)
through ``llm_models`` to vLLM, vLLM's own 400 for a prompt past the context relayed as it is, and
a client leaving mid-stream aborting the request at vLLM.

Opt-in: ``pytest -m vllm --run-vllm`` after ``bench/vllm_cpu/install.sh``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import openai
import pytest

from bench.vllm_cpu.server import SERVED, VllmServer
from gateway.app import Gateway, GatewayThread
from gateway.config import parse_config
from tests.vllm.test_vllm_cpu import ids, metrics

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def gw(vllm: VllmServer) -> Iterator[Gateway]:
    doc = {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0},
           "llm_models": [{"name": "llama", "slo_ttft_ms": 2000, "slo_tpot_ms": 200,
                           "replicas": [{"url": vllm.url, "engine": "vllm", "model": SERVED}]}]}
    with GatewayThread(parse_config(doc)) as g:
        yield g


def client(g: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{g.http_url}/v1", api_key="none", max_retries=0, timeout=120)


def test_completions_and_chats_whole_and_streamed_through_the_gateway(gw: Gateway) -> None:
    c = client(gw)
    out = c.completions.create(model="llama", prompt=ids(40), max_tokens=8, extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 8
    chat = c.chat.completions.create(model="llama", messages=[{"role": "user", "content": "hello there"}],
                                     max_tokens=6, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 6
    chunks = list(c.completions.create(model="llama", prompt=ids(20), max_tokens=10, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == 10
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"


def test_the_async_client_streams_chats_through_the_gateway(gw: Gateway) -> None:
    async def run() -> list[str]:
        c = openai.AsyncOpenAI(base_url=f"http://{gw.http_url}/v1", api_key="none", max_retries=0, timeout=120)
        stream = await c.chat.completions.create(model="llama", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=5, stream=True, extra_body={"ignore_eos": True})
        parts = [ch.choices[0].finish_reason async for ch in stream if ch.choices]
        await c.close()
        return parts

    assert asyncio.run(run())[-1] == "length"


def test_a_prompt_past_the_context_gets_vllms_own_400(gw: Gateway, vllm: VllmServer) -> None:
    with pytest.raises(openai.BadRequestError) as direct:
        openai.OpenAI(base_url=vllm.url + "/v1", api_key="none", max_retries=0).completions.create(
            model=SERVED, prompt=ids(2100), max_tokens=10)
    with pytest.raises(openai.BadRequestError) as relayed:
        client(gw).completions.create(model="llama", prompt=ids(2100), max_tokens=10)
    assert relayed.value.status_code == 400 and relayed.value.body == direct.value.body


def test_a_client_leaving_mid_stream_aborts_the_request_at_vllm(gw: Gateway, vllm: VllmServer) -> None:
    stream = client(gw).completions.create(model="llama", prompt=ids(64), max_tokens=1500, stream=True,
                                           extra_body={"ignore_eos": True})
    next(iter(stream))
    assert metrics(vllm.url)["vllm:num_requests_running"] == 1
    stream.close()
    deadline = time.monotonic() + 30
    while metrics(vllm.url)["vllm:num_requests_running"] != 0:
        assert time.monotonic() < deadline, "vLLM still runs the request its client left"
        time.sleep(0.1)
