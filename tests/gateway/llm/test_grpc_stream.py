"""tritonclient's gRPC stream (``ModelStreamInfer``) through the gateway to a generative model: one
response per token, from an OpenAI-compatible engine and from Triton alike; a bad request is an
error response on the stream; a cancelled stream is aborted at the engine."""

from __future__ import annotations

from gateway.app import Gateway
from tests.gateway.llm.conftest import Engine, client
from tests.profiles.test_llm_triton import Stream, stream_inputs

PROMPT = "tell me about the sea"


def send(s: Stream, prompt: str, max_tokens: int | None, seed: int | None = None) -> None:
    """A request to the gateway's ``llama``, its end an empty response flagged final."""
    s.client.async_stream_infer("llama", stream_inputs(prompt, max_tokens, seed), enable_empty_final_response=True)


def test_one_response_per_token_from_an_openai_engine(gateway: Gateway) -> None:
    want = client(gateway).completions.create(model="llama", prompt=PROMPT, max_tokens=5, seed=4).choices[0].text
    s = Stream(gateway.grpc_url)
    try:
        send(s, PROMPT, 5, 4)
        got = s.read_all()
        send(s, PROMPT, 0)  # the stream carries on after a refusal
        _, final, error = s.next()
        send(s, PROMPT, 2, 4)
        after = s.read_all()
    finally:
        s.close()
    assert [final for _, final, _ in got] == [False] * 5 + [True]  # then the empty final response
    assert "".join(t or "" for t, _, _ in got) == want
    assert final and "max_tokens" in error  # type: ignore[operator]
    assert len([t for t, _, _ in after if t]) == 2


def test_a_cancelled_stream_is_aborted_at_the_engine(engine: Engine, gateway: Gateway) -> None:
    kv_idle = engine.gauge("vllm:kv_cache_usage_perc")
    s = Stream(gateway.grpc_url)
    send(s, PROMPT, 1900)
    for _ in range(3):
        text, final, error = s.next()
        assert error is None and not final
    s.close(cancel=True)
    # NOTE: the engine frees the request's KV blocks once the client cancels
    engine.wait_idle(kv_idle)

