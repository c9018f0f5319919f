"""Real vLLM on CPU (the tiny Llama of ``bench/vllm_cpu``) through the official ``openai`` client:
the API the emulated engine stands in for. Whole and streamed completions and chats with usage,
the metric series a router reads, and the errors and the context limit, compared with what the
emulated engine (``headrace engine``) answers to the same request.

Opt-in: ``pytest -m vllm --run-vllm`` after ``bench/vllm_cpu/install.sh``; the server takes about a
minute to start."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from bench.vllm_cpu.server import SERVED, VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

MAX_MODEL_LEN = 2048
PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "llm" / "measured" / "tiny-llama-cpu.yaml"


@pytest.fixture(scope="module")
def emulated() -> Iterator[str]:
    """``headrace engine`` serving the profile measured from this CPU engine, named as vLLM's."""
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "engine", "--profile", str(PROFILE), "--port", "0",
                             "--served-model-name", SERVED, "--max-model-len", str(MAX_MODEL_LEN)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        assert m, f"headrace engine did not start: {line}{proc.stdout.read() if proc.poll() is not None else ''}"
        yield f"http://127.0.0.1:{m.group(1)}"
    finally:
        proc.terminate()
        proc.wait(10)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def metrics(url: str) -> dict[str, float]:
    """Each sample of /metrics by its name (labels dropped, samples of one name summed)."""
    out: dict[str, float] = {}
    for line in urllib.request.urlopen(url + "/metrics", timeout=10).read().decode().splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            name = key.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
    return out


def ids(n: int, start: int = 3) -> list[int]:
    """``n`` token ids of the tiny model's vocabulary (512), past its special tokens."""
    return [start + (i * 7) % 500 for i in range(n)]


def test_a_completion_of_token_ids_has_its_tokens_and_usage(vllm: VllmServer) -> None:
    out = client(vllm.url).completions.create(model=SERVED, prompt=ids(40), max_tokens=8,
                                              extra_body={"ignore_eos": True})
    assert out.object == "text_completion" and out.model == SERVED and out.id.startswith("cmpl-")
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (40, 8, 48)


def test_a_chat_has_the_assistants_answer_and_usage(vllm: VllmServer) -> None:
    chat = client(vllm.url).chat.completions.create(
        model=SERVED, messages=[{"role": "user", "content": "hello how are you"}], max_completion_tokens=6,
        extra_body={"ignore_eos": True})
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-")
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].finish_reason == "length"
    assert chat.usage.completion_tokens == 6 and chat.usage.prompt_tokens > 4


def test_streams_end_with_usage_when_asked(vllm: VllmServer) -> None:
    c = client(vllm.url)
    chunks = list(c.completions.create(model=SERVED, prompt=ids(20), max_tokens=10, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finish[-1] == "length" and set(finish[:-1]) <= {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    chat = list(c.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                          stream=True, extra_body={"ignore_eos": True}))
    assert chat[0].choices[0].delta.role == "assistant"
    assert chat[-1].choices[0].finish_reason == "length"
    assert all(ch.usage is None for ch in chat)  # no usage chunk unless asked


def test_metrics_carry_the_series_a_router_reads_and_count_prefix_hits(vllm: VllmServer) -> None:
    c = client(vllm.url)
    before = metrics(vllm.url)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        assert name in before, f"{name} not on vLLM's /metrics"
    prompt = ids(300, start=11)
    for _ in range(2):
        c.completions.create(model=SERVED, prompt=prompt, max_tokens=2, extra_body={"ignore_eos": True})
    after = metrics(vllm.url)
    # NOTE: the second run finds the first's full blocks (of 128 tokens on CPU), never its last token
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] == 256
    assert after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] == 600
    assert 0 <= after["vllm:kv_cache_usage_perc"] <= 1


def test_the_gauges_see_requests_in_flight(vllm: VllmServer) -> None:
    import threading

    c = client(vllm.url)
    done = threading.Event()

    def load() -> None:
        try:
            c.completions.create(model=SERVED, prompt=ids(64), max_tokens=400, extra_body={"ignore_eos": True})
        finally:
            done.set()

    t = threading.Thread(target=load)
    t.start()
    seen = 0.0
    deadline = time.monotonic() + 30
    while not done.is_set() and time.monotonic() < deadline:
        m = metrics(vllm.url)
        seen = max(seen, m["vllm:num_requests_running"])
        if seen:
            assert m["vllm:kv_cache_usage_perc"] > 0
            break
        time.sleep(0.05)
    t.join(60)
    assert seen == 1


def error(url: str, prompt: list[int], max_tokens: int) -> dict:
    """The error body of a completion the server refuses."""
    with pytest.raises(openai.BadRequestError) as e:
        client(url).completions.create(model=SERVED, prompt=prompt, max_tokens=max_tokens)
    assert e.value.status_code == 400
    return e.value.body


def test_a_prompt_past_the_context_is_400_with_vllms_numbers(vllm: VllmServer) -> None:
    body = error(vllm.url, ids(2100), 10)
    assert (body["type"], body["param"], body["code"]) == ("BadRequestError", "input_tokens", 400)
    assert body["message"] == (
        "This model's maximum context length is 2048 tokens. However, your prompt contains 2100 input tokens, "
        "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. "
        "(parameter=input_tokens, value=2100)")


@pytest.mark.parametrize(("prompt", "max_tokens"), [
    (ids(2100), 10),  # the prompt alone is past the context
    (ids(2048), 10),  # the prompt fills the context: max_tokens comes to 0
    (ids(20), 0),
    (ids(20), 5000),  # max_tokens alone is past the context
    ([5, 99999, 7], 4),  # a token id out of the vocabulary (of either)
])
def test_the_emulated_engine_refuses_as_vllm_word_for_word(vllm: VllmServer, emulated: str, prompt: list[int],
                                                          max_tokens: int) -> None:
    assert error(emulated, prompt, max_tokens) == error(vllm.url, prompt, max_tokens)


def test_vllm_shortens_a_max_tokens_that_runs_past_the_context(vllm: VllmServer) -> None:
    out = client(vllm.url).completions.create(model=SERVED, prompt=ids(2000), max_tokens=100,
                                              extra_body={"ignore_eos": True})
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (2000, 48)
    # a prompt that fills the context leaves max_tokens 0, and that is the error
    body = error(vllm.url, ids(2048), 10)
    assert (body["param"], body["message"]) == (
        "max_tokens", "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)")


def test_past_the_context_by_max_tokens_the_emulated_engine_shortens_it_as_vllm(vllm: VllmServer,
                                                                                emulated: str) -> None:
    real, emu = (client(url).completions.create(model=SERVED, prompt=ids(2000), max_tokens=100,
                                                extra_body={"ignore_eos": True}) for url in (vllm.url, emulated))
    assert (emu.usage.prompt_tokens, emu.usage.completion_tokens) == (real.usage.prompt_tokens,
                                                                      real.usage.completion_tokens)
    assert emu.choices[0].finish_reason == real.choices[0].finish_reason == "length"


def test_usage_has_no_prompt_tokens_details_by_default_on_either(vllm: VllmServer, emulated: str) -> None:
    for url in (vllm.url, emulated):
        out = client(url).completions.create(model=SERVED, prompt=ids(40), max_tokens=2,
                                             extra_body={"ignore_eos": True})
        assert out.usage.prompt_tokens_details is None, url
