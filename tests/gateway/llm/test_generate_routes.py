"""Triton's generate extension through the gateway to an OpenAI-compatible engine (``headrace
engine``): a whole answer, one event per token, the token metrics, a client leaving mid-stream
aborted at the engine, and every bad request answered ``{"error": ...}`` with Triton's 400/404."""

from __future__ import annotations

import http.client
import json
import time

import openai
import pytest

from gateway.app import Gateway
from tests.gateway.llm.conftest import Engine, client
from tests.prometheus import samples

PROMPT = "tell me about the sea"


def post(gw: Gateway, path: str, body: object, timeout: float = 10) -> tuple[int, str]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn = http.client.HTTPConnection(*gw.http_url.split(":"), timeout=timeout)
    try:
        conn.request("POST", path, raw, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def events(body: str) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in body.splitlines() if line.startswith("data: ")]


def test_generate_answers_the_text_the_completion_gives(gateway: Gateway) -> None:
    want = client(gateway).completions.create(model="llama", prompt=PROMPT, max_tokens=6, seed=4).choices[0].text
    status, body = post(gateway, "/v2/models/llama/generate", {"text_input": PROMPT, "max_tokens": 6, "seed": 4})
    assert status == 200, body
    assert json.loads(body) == {"model_name": "llama", "model_version": "1", "text_output": want}
    # the generate extension's parameters are read as well, and a version in the path
    status, body = post(gateway, "/v2/models/llama/versions/1/generate",
                        {"text_input": PROMPT, "parameters": {"max_tokens": 6, "seed": 4}})
    assert (status, json.loads(body)["text_output"]) == (200, want)


def test_generate_stream_sends_one_event_per_token(gateway: Gateway) -> None:
    want = client(gateway).completions.create(model="llama", prompt=PROMPT, max_tokens=7, seed=2).choices[0].text
    before = samples(f"http://{gateway.http_url}/metrics")
    status, body = post(gateway, "/v2/models/llama/generate_stream",
                        {"text_input": PROMPT, "max_tokens": 7, "seed": 2, "stream": True})
    assert status == 200, body
    got = events(body)
    assert len(got) == 7 and all(set(e) == {"model_name", "model_version", "text_output"} for e in got)
    assert "".join(e["text_output"] for e in got) == want
    after = samples(f"http://{gateway.http_url}/metrics")
    key = 'headrace_llm_tokens_total{kind="output",model="llama",variant="tiny"}'
    # NOTE: a generate stream is measured as a completion's: its tokens and its TTFT are counted
    assert after[key] - before.get(key, 0.0) == 7
    ttft = 'headrace_llm_ttft_seconds_count{model="llama",variant="tiny"}'
    assert after[ttft] - before.get(ttft, 0.0) == 1


BAD = [
    ("malformed JSON", "llama", b'{"text_input": ', 400, "parse"),
    ("no text_input", "llama", {"max_tokens": 3}, 400, "text_input"),
    ("text_input a number", "llama", {"text_input": 5}, 400, "text_input"),
    ("max_tokens 0", "llama", {"text_input": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens a string", "llama", {"text_input": "hi", "parameters": {"max_tokens": "ten"}}, 400, "max_tokens"),
    ("an unknown input", "llama", {"text_input": "hi", "colour": "red"}, 400, "colour"),
    ("parameters not an object", "llama", {"text_input": "hi", "parameters": [1]}, 400, "parameters"),
    ("over the context (the engine's 400)", "llama", {"text_input": "word " * 2100, "max_tokens": 4}, 400,
     "context"),
    ("unknown model", "gpt-9", {"text_input": "hi"}, 404, "unknown model"),
]


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize(("model", "body", "status", "says"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_requests_get_tritons_error_shape(gateway: Gateway, route: str, model: str, body: object,
                                              status: int, says: str) -> None:
    got, text = post(gateway, f"/v2/models/{model}/{route}", body)
    assert got == status, text
    doc = json.loads(text)
    assert list(doc) == ["error"] and says in doc["error"]


def test_a_client_leaving_a_generate_stream_aborts_at_the_engine(engine: Engine, gateway: Gateway) -> None:
    kv_idle = engine.gauge("vllm:kv_cache_usage_perc")
    conn = http.client.HTTPConnection(*gateway.http_url.split(":"), timeout=10)
    conn.request("POST", "/v2/models/llama/generate_stream", json.dumps({"text_input": PROMPT, "max_tokens": 1900}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.readline().startswith(b"data: ")
    assert engine.gauge("vllm:num_requests_running") == 1.0
    conn.close()
    # NOTE: the engine frees the request's KV blocks once the client is gone
    engine.wait_idle(kv_idle)
    deadline = time.monotonic() + 5
    key = 'headrace_llm_aborted_total{model="llama",reason="disconnect"}'
    while samples(f"http://{gateway.http_url}/metrics").get(key, 0.0) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    # and the gateway serves the next request as before
    assert client(gateway).completions.create(model="llama", prompt="hi", max_tokens=2).usage.completion_tokens == 2


def test_openai_client_still_works_beside_generate(gateway: Gateway) -> None:
    with pytest.raises(openai.NotFoundError):
        client(gateway).completions.create(model="gpt-9", prompt="hi", max_tokens=2)
