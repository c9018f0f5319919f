"""The official ``openai`` client, unchanged, through the gateway to an emulated engine: whole and
streamed answers, usage, the model list, and every bad request answered in OpenAI's error shape
with its 4xx (never a 500)."""

from __future__ import annotations

import asyncio
import http.client
import json

import openai
import pytest

from gateway.app import Gateway, GatewayThread
from tests.gateway.llm.conftest import Engine, client, gateway_config
from tests.prometheus import samples

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]


def test_models_are_listed_by_the_names_clients_address(gateway: Gateway) -> None:
    assert [m.id for m in client(gateway).models.list().data] == ["llama"]


def test_whole_answers_with_usage(gateway: Gateway) -> None:
    c = client(gateway)
    out = c.completions.create(model="llama", prompt="once upon a time", max_tokens=5)
    assert out.model == "llama" and len(out.choices[0].text.split()) == 5
    assert out.usage.completion_tokens == 5 and out.usage.prompt_tokens > 0
    chat = c.chat.completions.create(model="llama", messages=CHAT, max_tokens=4)
    assert chat.choices[0].message.role == "assistant" and len(chat.choices[0].message.content.split()) == 4
    assert chat.usage.completion_tokens == 4


def test_streams_arrive_token_by_token(gateway: Gateway) -> None:
    c = client(gateway)
    chunks = list(c.completions.create(model="llama", prompt="hi", max_tokens=6, stream=True))
    # NOTE: one event per token, and no usage chunk unless asked for
    assert [len(ch.choices) for ch in chunks] == [1] * 6 and all(ch.usage is None for ch in chunks)
    assert all(ch.model == "llama" for ch in chunks)
    chat = list(c.chat.completions.create(model="llama", messages=CHAT, max_tokens=3, stream=True,
                                          stream_options={"include_usage": True}))
    assert chat[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chat if ch.choices).split().__len__() == 3
    assert chat[-1].choices == [] and chat[-1].usage.completion_tokens == 3


def test_async_client_streams_and_answers(gateway: Gateway) -> None:
    async def run() -> tuple[str, int]:
        c = openai.AsyncOpenAI(base_url=f"http://{gateway.http_url}/v1", api_key="none", max_retries=0)
        async with c:
            whole = await c.chat.completions.create(model="llama", messages=CHAT, max_tokens=2)
            stream = await c.completions.create(model="llama", prompt="x", max_tokens=4, stream=True)
            n = sum([1 async for _ in stream])
        return whole.choices[0].message.content, n

    text, n = asyncio.run(run())
    assert len(text.split()) == 2 and n == 4


def test_metrics_count_tokens_and_slo_attainment(gateway: Gateway) -> None:
    before = samples(f"http://{gateway.http_url}/metrics")
    list(client(gateway).completions.create(model="llama", prompt="a b c", max_tokens=5, stream=True))
    after = samples(f"http://{gateway.http_url}/metrics")
    lab = 'model="llama",variant="tiny"'

    def grew(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew(f"headrace_llm_requests_total{{{lab}}}") == 1
    assert grew(f'headrace_llm_tokens_total{{kind="output",{lab}}}') == 5
    assert grew(f'headrace_llm_tokens_total{{kind="input",{lab}}}') > 0
    assert grew(f"headrace_llm_ttft_seconds_count{{{lab}}}") == 1
    assert grew(f"headrace_llm_tpot_seconds_count{{{lab}}}") == 1
    # NOTE: a request meeting both SLOs meets each
    both = grew(f'headrace_llm_slo_met_total{{slo="both",{lab}}}')
    assert both <= grew(f'headrace_llm_slo_met_total{{slo="ttft",{lab}}}') and \
        both <= grew(f'headrace_llm_slo_met_total{{slo="tpot",{lab}}}')


def _post(gw: Gateway, path: str, body: bytes | str | object, method: str = "POST",
          headers: dict[str, str] | None = None) -> tuple[int, dict]:
    raw = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
    conn = http.client.HTTPConnection(*gw.http_url.split(":"), timeout=10)
    try:
        conn.request(method, path, raw, {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


CMPL = {"model": "llama", "prompt": "hi", "max_tokens": 3}
BAD = [
    ("malformed JSON", "/v1/completions", b'{"model": "llama", ', 400, None),
    ("body not an object", "/v1/completions", [1, 2], 400, None),
    ("no model", "/v1/completions", {"prompt": "hi"}, 400, "model"),
    ("unknown model", "/v1/completions", {**CMPL, "model": "gpt-9"}, 404, "model"),
    ("max_tokens 0", "/v1/completions", {**CMPL, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens 10^9 (the engine's 400)", "/v1/completions", {**CMPL, "max_tokens": 10**9}, 400, "max_tokens"),
    ("max_tokens a string", "/v1/completions", {**CMPL, "max_tokens": "3"}, 400, "max_tokens"),
    ("stream not a boolean", "/v1/completions", {**CMPL, "stream": "yes"}, 400, "stream"),
    ("stream_options without stream", "/v1/completions", {**CMPL, "stream_options": {"include_usage": True}},
     400, "stream_options"),
    ("prompt a number", "/v1/completions", {**CMPL, "prompt": 7}, 400, "prompt"),
    ("prompt over the context (the engine's 400)", "/v1/completions",
     {**CMPL, "prompt": list(range(1, 2100))}, 400, "input_tokens"),
    ("messages missing", "/v1/chat/completions", {"model": "llama"}, 400, "messages"),
    ("message not an object", "/v1/chat/completions", {"model": "llama", "messages": ["hi"]}, 400, "messages[0]"),
    ("message without role", "/v1/chat/completions", {"model": "llama", "messages": [{"content": "hi"}]},
     400, "messages[0].role"),
    ("message content a number", "/v1/chat/completions",
     {"model": "llama", "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_requests_get_openai_shaped_4xx(gateway: Gateway, path: str, body: object, status: int,
                                            param: str | None) -> None:
    got, doc = _post(gateway, path, body)
    assert got == status, doc
    err = doc["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["code"] == status
    assert err["param"] == param


@pytest.mark.parametrize(("header", "value"), [("x-slo-ttft-ms", "soon"), ("x-slo-tpot-ms", "0"),
                                               ("x-slo-ttft-ms", "-5"), ("x-slo-tpot-ms", "nan")])
def test_bad_slo_headers_get_400(gateway: Gateway, header: str, value: str) -> None:
    status, doc = _post(gateway, "/v1/completions", CMPL, headers={header: value})
    assert status == 400 and doc["error"]["param"] == header


def test_slo_headers_are_taken(gateway: Gateway) -> None:
    status, doc = _post(gateway, "/v1/completions", CMPL, headers={"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "20"})
    assert status == 200 and doc["usage"]["completion_tokens"] == 3


def test_unknown_routes_and_methods(gateway: Gateway) -> None:
    assert _post(gateway, "/v1/embeddings", CMPL)[0] == 404
    status, doc = _post(gateway, "/v1/completions", b"", method="GET")
    assert status == 405 and doc["error"]["code"] == 405


def test_an_engine_that_is_down_is_a_503() -> None:
    with GatewayThread(gateway_config(None)) as gw:
        with pytest.raises(openai.APIStatusError) as e:
            client(gw).completions.create(model="llama", prompt="hi", max_tokens=2)
        assert e.value.status_code == 503 and "unreachable" in e.value.message
        with pytest.raises(openai.APIStatusError) as e:
            list(client(gw).chat.completions.create(model="llama", messages=CHAT, max_tokens=2, stream=True))
        assert e.value.status_code == 503


def test_tenants_keys_and_quotas_hold_on_the_openai_routes(engine: Engine) -> None:
    import hashlib

    key = "sk-tenant-a"
    tenants = [{"name": "a", "keys": [{"sha256": hashlib.sha256(key.encode()).hexdigest()}],
                "quota": {"rate": 0.001, "burst": 2}}]
    with GatewayThread(gateway_config(engine.url, tenants=tenants)) as gw:
        status, doc = _post(gw, "/v1/completions", CMPL)
        assert status == 401 and doc["error"]["code"] == 401
        ok = openai.OpenAI(base_url=f"http://{gw.http_url}/v1", api_key=key, max_retries=0)
        assert ok.completions.create(**CMPL).usage.completion_tokens == 3
        assert len(list(ok.completions.create(**CMPL, stream=True))) == 3
        with pytest.raises(openai.RateLimitError) as e:  # its burst of 2 is spent
            ok.completions.create(**CMPL)
        assert e.value.response.headers["retry-after"]
        counted = gw.driver.render_metrics().decode()
        assert 'headrace_tenant_requests_total{code="200",tenant="a"} 2.0' in counted
        assert 'headrace_tenant_requests_total{code="429",tenant="a"} 1.0' in counted


def test_a_gateway_of_generative_models_is_ready_while_an_engine_is(gateway: Gateway) -> None:
    conn = http.client.HTTPConnection(*gateway.http_url.split(":"), timeout=10)
    conn.request("GET", "/v2/health/ready")
    assert conn.getresponse().status == 200
    conn.close()


def test_limits_refuse_in_openai_shape(engine: Engine) -> None:
    with GatewayThread(gateway_config(engine.url, max_message_bytes=4096)) as gw:
        status, doc = _post(gw, "/v1/completions", {**CMPL, "prompt": "word " * 2000})
        assert status == 413 and doc["error"]["code"] == 413 and doc["error"]["type"] == "BadRequestError"
        status, doc = _post(gw, "/v2/health/live", b"x" * 5000)  # the KServe routes keep their shape
        assert status == 413 and isinstance(doc["error"], str)


def test_the_access_log_sees_completions_to_their_end(engine: Engine, tmp_path) -> None:  # noqa: ANN001
    log = tmp_path / "access.jsonl"
    with GatewayThread(gateway_config(engine.url, access_log={"enabled": True, "path": str(log)})) as gw:
        c = client(gw)
        assert len(list(c.completions.create(**CMPL, stream=True))) == 3
        c.chat.completions.create(model="llama", messages=CHAT, max_tokens=2)
        stream = c.completions.create(**{**CMPL, "max_tokens": 1500}, stream=True)
        next(iter(stream))
        stream.close()
        _post(gw, "/v1/completions", {**CMPL, "model": "gpt-9"})
        _post(gw, "/v1/models", b"", method="GET")  # not a completion: not logged
        engine.wait_idle(engine.gauge("vllm:kv_cache_usage_perc"))
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["model"], x["status"]) for x in lines] == [("llama", 200), ("llama", 200), ("llama", 499), (None, 404)]
    assert lines[2]["reason"] == "stream aborted: disconnect"


def test_a_separate_metrics_listener_serves_the_llm_series_and_readiness(engine: Engine) -> None:
    with GatewayThread(gateway_config(engine.url, metrics_listen={"host": "127.0.0.1", "port": 0})) as gw:
        client(gw).completions.create(**CMPL)
        host, port = gw.metrics_url.split(":")  # type: ignore[union-attr]
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/v2/health/ready")
        assert conn.getresponse().status == 200
        conn.close()
        got = samples(f"http://{gw.metrics_url}/metrics")
        assert got['headrace_llm_requests_total{model="llama",variant="tiny"}'] == 1
