"""The emulated LLM engine behind vLLM's OpenAI API, through the official ``openai`` client: whole
and streamed answers, usage with prefix-cache hits, vLLM's errors, aborts on disconnect, the
metrics a router reads, and the KV events it indexes."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml
from aiohttp import ClientSession, ClientTimeout

from deploy.cli import main
from profiles.emulator.llm_server import EmulatedEngine, make_app, serve
from profiles.llm.engine import Engine
from profiles.llm.kv import block_hashes
from profiles.llm.profile import LlmProfile, llm_profile_to_dict
from profiles.llm.steptime import StepTime
from profiles.llm.tokens import chat_prompt, encode
from profiles.profile import Provenance
from tests.prometheus import samples

STEP_S = 0.005  # every step of the tiny model: 5 ms, whatever it holds
MODEL = "tiny-llm"


def tiny_profile(max_model_len: int = 256) -> LlmProfile:
    """A model whose every step takes STEP_S, with about 64 KV blocks at utilisation 0.9."""
    return LlmProfile(
        model="tiny", variant="tiny-bf16", gpu="CPU", slice="gpu", tp=1, memory_gb=1.0, weights_gb=0.5,
        activation_gb=0.0, kv_bytes_per_token=390_000, max_model_len=max_model_len,
        step_time=StepTime(layers=1, linear=((1, STEP_S), (4096, STEP_S))), provenance=Provenance("test"))


class Server:
    """The emulated engine's app on a free port, on its own event loop in a thread."""

    def __init__(self, profile: LlmProfile, names: tuple[str, ...] = (MODEL, "tiny-alias"),
                 prompt_tokens_details: bool = False) -> None:
        self.profile = profile
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.emu, self.runner, port = self.call(self._start(names, prompt_tokens_details))
        self.url = f"http://127.0.0.1:{port}"

    async def _start(self, names: tuple[str, ...], prompt_tokens_details: bool):  # noqa: ANN202
        config = self.profile.engine_config(max_num_seqs=8, max_num_batched_tokens=512)
        emu = EmulatedEngine(Engine(config, self.profile.step_time), names[0])
        runner, port = await serve(make_app(emu, names, prompt_tokens_details), "127.0.0.1", 0)
        return emu, runner, port

    def call(self, coro):  # noqa: ANN001, ANN201
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self) -> None:
        self.call(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    def client(self, **kw: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", **kw)

    def metrics(self) -> dict[str, float]:
        return samples(self.url + "/metrics")

    def gauge(self, name: str) -> float:
        return self.metrics()[f'{name}{{engine="0",model_name="{MODEL}"}}']

    def until_idle(self, timeout: float = 3.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.gauge("vllm:num_requests_running") == 0 and self.gauge("vllm:num_requests_waiting") == 0:
                return
            time.sleep(0.01)
        raise AssertionError("the engine still holds requests")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server(tiny_profile())
    yield s
    s.close()


@pytest.fixture(scope="module")
def detailed() -> Iterator[Server]:
    """A server that reports prefix-cache hits in usage (vLLM's --enable-prompt-tokens-details)."""
    s = Server(tiny_profile(), prompt_tokens_details=True)
    yield s
    s.close()


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# answers

def test_a_completion_has_its_tokens_and_usage_and_a_repeated_prefix_is_cached(detailed: Server) -> None:
    client = detailed.client()
    prompt = words(40, "cache")
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, seed=7)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, seed=7)
    other = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, seed=8)
    choice = first.choices[0]
    assert first.object == "text_completion" and first.model == MODEL and first.id.startswith("cmpl-")
    assert choice.finish_reason == "length" and len(choice.text.split()) == 5
    assert again.choices[0].text == choice.text != other.choices[0].text  # the seed sets the tokens
    n = len(encode(prompt, 32000))
    assert (first.usage.prompt_tokens, first.usage.completion_tokens, first.usage.total_tokens) == (n, 5, n + 5)
    # NOTE: the second run finds the prompt's full blocks, never its last token, in the prefix cache
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16


def test_usage_has_no_prompt_tokens_details_unless_the_server_enables_them(server: Server) -> None:
    client = server.client()
    for _ in range(2):
        status, body = post(server.url + "/v1/completions",
                            json.dumps({"model": MODEL, "prompt": words(40, "plain"), "max_tokens": 2}).encode())
        assert status == 200
        assert body["usage"]["prompt_tokens_details"] is None  # a null field, as vLLM's whole answer has it
    chunks = list(client.completions.create(model=MODEL, prompt=words(40, "plain"), max_tokens=2, stream=True,
                                            stream_options={"include_usage": True}))
    # NOTE: vLLM's last chunk leaves its null fields out
    assert chunks[-1].usage.model_dump(exclude_unset=True) == {"prompt_tokens": chunks[-1].usage.prompt_tokens,
                                                               "completion_tokens": 2,
                                                               "total_tokens": chunks[-1].usage.prompt_tokens + 2}


def test_without_a_seed_equal_prompts_give_equal_text(server: Server) -> None:
    client = server.client()
    a, b = (client.completions.create(model=MODEL, prompt="same words here", max_tokens=4) for _ in range(2))
    assert a.choices[0].text == b.choices[0].text
    assert len(a.choices[0].text.split()) == 4


def test_a_prompt_of_token_ids_and_a_chat(server: Server) -> None:
    client = server.client()
    ids = client.completions.create(model=MODEL, prompt=[17, 18, 19], max_tokens=3)
    assert ids.usage.prompt_tokens == 3 and ids.usage.completion_tokens == 3
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    chat = client.chat.completions.create(model="tiny-alias", messages=messages, max_completion_tokens=4)
    assert chat.object == "chat.completion" and chat.model == "tiny-alias" and chat.id.startswith("chatcmpl-")
    assert chat.choices[0].message.role == "assistant" and len(chat.choices[0].message.content.split()) == 4
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage.prompt_tokens == len(encode(chat_prompt(messages), 32000))
    assert chat.usage.completion_tokens == 4


def test_streams_send_one_chunk_per_token_then_usage(server: Server) -> None:
    client = server.client()
    whole = client.completions.create(model=MODEL, prompt="stream me", max_tokens=6, seed=3)
    chunks = list(client.completions.create(model=MODEL, prompt="stream me", max_tokens=6, seed=3, stream=True,
                                            stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) == 6 and "".join(texts) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None] * 5 + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6

    chat = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=5, stream=True))
    assert chat[0].choices[0].delta.role == "assistant"
    content = [c.choices[0].delta.content for c in chat[1:]]
    assert len(content) == 5 and all(content) and chat[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chat)  # no usage chunk unless asked


def test_the_async_client_runs_requests_side_by_side(server: Server) -> None:
    async def go() -> tuple[list[str], list[str]]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none")
        async with client:
            whole = [client.completions.create(model=MODEL, prompt=f"async {i}", max_tokens=8, seed=i)
                     for i in range(4)]

            async def streamed(i: int) -> str:
                out = []
                async for c in await client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": f"async {i}"}], max_tokens=8,
                        stream=True):
                    if c.choices and c.choices[0].delta.content:
                        out.append(c.choices[0].delta.content)
                return "".join(out)

            results = await asyncio.gather(*whole, *(streamed(i) for i in range(4)))
        return [r.choices[0].text for r in results[:4]], results[4:]

    server.until_idle()
    e2e = f'vllm:e2e_request_latency_seconds_sum{{engine="0",model_name="{MODEL}"}}'
    before = server.metrics()[e2e]
    texts, streamed = asyncio.run(go())
    assert all(len(t.split()) == 8 for t in texts + streamed)
    assert len(set(texts)) == 4
    # NOTE: the engine batches them: each takes about its own 8 steps, not the 8 x 8 of running one by one
    assert server.metrics()[e2e] - before < 8 * 16 * STEP_S


def test_token_times_follow_the_profile(server: Server) -> None:
    server.until_idle()
    before = server.metrics()
    key = f'{{engine="0",model_name="{MODEL}"}}'
    started = time.monotonic()
    server.client().completions.create(model=MODEL, prompt="timed", max_tokens=10)
    took = time.monotonic() - started
    after = server.metrics()
    e2e = after["vllm:e2e_request_latency_seconds_sum" + key] - before["vllm:e2e_request_latency_seconds_sum" + key]
    ttft = after["vllm:time_to_first_token_seconds_sum" + key] - before["vllm:time_to_first_token_seconds_sum" + key]
    # NOTE: alone, a request takes one step per token: its prefill gives the first, each decode one more
    assert 10 * STEP_S <= e2e < 10 * STEP_S + 0.01
    assert STEP_S <= ttft < STEP_S + 0.01
    assert took >= 10 * STEP_S


# errors, as vLLM gives them

def refusal(server: Server, path: str, body: dict) -> dict:
    """The error of a request the server refuses with a 400."""
    status, answer = post(server.url + path, json.dumps(body).encode())
    assert status == 400, answer
    return answer["error"]


def test_a_prompt_past_the_context_gets_vllms_400(server: Server) -> None:
    err = refusal(server, "/v1/completions", {"prompt": list(range(3, 303)), "max_tokens": 10})
    assert err == {"type": "BadRequestError", "param": "input_tokens", "code": 400, "message": (
        "This model's maximum context length is 256 tokens. However, your prompt contains 300 input tokens, which "
        "exceeds this limit even without any output tokens. Please reduce the length of the input prompt. "
        "(parameter=input_tokens, value=300)")}
    # NOTE: one token past the context, vLLM cannot tell how many more there are: "at least"
    err = refusal(server, "/v1/completions", {"prompt": list(range(3, 260)), "max_tokens": 10})
    assert err["message"].startswith("This model's maximum context length is 256 tokens. However, your prompt "
                                     "contains at least 257 input tokens, which exceeds")
    # NOTE: a text prompt is tokenized to one token past the context, as vLLM's tokenizer truncates it
    err = refusal(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": words(300, "w")}]})
    assert (err["param"], err["message"]) == ("input_tokens", (
        "This model's maximum context length is 256 tokens. However, your prompt contains at least 257 input tokens, "
        "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. "
        "(parameter=input_tokens, value=257)"))


def test_a_max_tokens_past_the_context_is_shortened_to_the_rest_of_it(server: Server) -> None:
    client = server.client()
    out = client.completions.create(model=MODEL, prompt=list(range(3, 253)), max_tokens=10)
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (250, 6)
    assert out.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(model=MODEL, prompt=list(range(3, 253)), max_tokens=10, stream=True))
    assert [c.choices[0].finish_reason for c in chunks] == [None] * 5 + ["length"]
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": words(40, "w")}])
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == 256  # no max_tokens: the rest of the context


def test_a_prompt_that_fills_the_context_leaves_max_tokens_0(server: Server) -> None:
    err = refusal(server, "/v1/completions", {"prompt": list(range(3, 259)), "max_tokens": 10})
    assert err == {"type": "BadRequestError", "param": "max_tokens", "code": 400,
                   "message": "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"}


def test_a_max_tokens_above_the_context_is_400(server: Server) -> None:
    err = refusal(server, "/v1/completions", {"prompt": "x", "max_tokens": 300})
    assert err == {"type": "BadRequestError", "param": "max_tokens", "code": 400, "message": (
        "max_tokens=300 cannot be greater than max_model_len=256. Please request fewer output tokens. "
        "(parameter=max_tokens, value=300)")}
    err = refusal(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                    "max_completion_tokens": 257, "max_tokens": 3})
    assert (err["param"], err["message"]) == ("max_completion_tokens", (
        "max_completion_tokens=257 cannot be greater than max_model_len=256. Please request fewer output tokens. "
        "(parameter=max_completion_tokens, value=257)"))


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", "max_tokens must be at least 1, got 0. (parameter=max_tokens, "
                                                     "value=0)"),
    ({"prompt": "x", "max_tokens": -2}, "max_tokens", "max_tokens must be at least 1, got -2. (parameter=max_tokens, "
                                                      "value=-2)"),
    ({"prompt": []}, None, "The decoder prompt cannot be empty"),
    ({"prompt": [5, 99999999, 32000]}, None, "Token id 99999999 is out of vocabulary"),
    ({"prompt": [5, 32000, -1]}, None, "Token id -1 is out of vocabulary"),
    ({"prompt": [5, 32000]}, None, "Token id 32000 is out of vocabulary"),
])
def test_vllms_validation_errors_word_for_word(server: Server, body: dict, param: str | None, message: str) -> None:
    assert refusal(server, "/v1/completions", body) == {"type": "BadRequestError", "param": param, "code": 400,
                                                        "message": message}


def test_an_unknown_model_is_404(server: Server) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        server.client().completions.create(model="gpt-9", prompt="x", max_tokens=1)
    assert e.value.body == {"message": "The model `gpt-9` does not exist.", "type": "NotFoundError",
                            "param": "model", "code": 404}


@pytest.mark.parametrize(("body", "says"), [
    (b"{not json", "invalid JSON body"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"prompt": "x", "max_tokens": "many"}', "max_tokens: Input should be a valid integer"),
    (b'{"prompt": "x", "n": 2}', "n must be 1"),
    (b'{"prompt": "x", "stream_options": {"include_usage": true}}', "only be defined when `stream=True`"),
    (b'{"max_tokens": 3}', "prompt: Field required"),
])
def test_a_malformed_request_is_400_with_a_clear_message(server: Server, body: bytes, says: str) -> None:
    status, answer = post(server.url + "/v1/completions", body)
    assert status == 400 and answer["error"]["type"] == "BadRequestError" and answer["error"]["code"] == 400
    assert says in answer["error"]["message"]


# aborts

def test_a_client_that_disconnects_mid_stream_aborts_its_request(server: Server) -> None:
    server.until_idle()
    aborted = f'vllm:request_success_total{{engine="0",finished_reason="abort",model_name="{MODEL}"}}'
    before = server.metrics()

    async def read_two_and_leave() -> None:
        async with ClientSession() as s, s.post(server.url + "/v1/completions", json={
                "model": MODEL, "prompt": "a long answer", "max_tokens": 200, "stream": True}) as r:
            got = 0
            async for line in r.content:
                got += line.startswith(b"data: {")
                if got == 2:
                    break
            r.close()  # drop the connection

    asyncio.run(read_two_and_leave())
    server.until_idle()
    after = server.metrics()
    assert after[aborted] == before[aborted] + 1
    assert server.gauge("vllm:kv_cache_usage_perc") == 0.0  # its blocks are free (cached, unheld)
    tokens = 'vllm:generation_tokens_total{engine="0",model_name="' + MODEL + '"}'
    assert after[tokens] - before[tokens] < 50  # it stopped long before its 200 tokens


def test_a_whole_answer_abandoned_by_its_client_is_aborted(server: Server) -> None:
    server.until_idle()
    aborted = f'vllm:request_success_total{{engine="0",finished_reason="abort",model_name="{MODEL}"}}'
    tokens = f'vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}}'
    before = server.metrics()
    with pytest.raises(openai.APITimeoutError):
        server.client(timeout=0.1, max_retries=0).completions.create(model=MODEL, prompt="slow", max_tokens=250)
    server.until_idle()
    after = server.metrics()
    assert after[aborted] == before[aborted] + 1 and after[tokens] - before[tokens] < 250
    assert server.gauge("vllm:kv_cache_usage_perc") == 0.0


# what a router reads

def test_metrics_carry_vllms_names_and_labels(server: Server) -> None:
    server.client().completions.create(model=MODEL, prompt="metered", max_tokens=2)
    names = {re.sub(r"\{.*", "", k) for k in server.metrics()}
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:request_time_per_output_token_seconds_count", "vllm:e2e_request_latency_seconds_sum"):
        assert name in names, name
    m = server.metrics()
    assert m[f'vllm:prompt_tokens_total{{engine="0",model_name="{MODEL}"}}'] > 0
    assert 0.0 <= server.gauge("vllm:kv_cache_usage_perc") <= 1.0


def test_models_lists_the_served_names(server: Server) -> None:
    models = server.client().models.list()
    assert [m.id for m in models.data] == [MODEL, "tiny-alias"]
    with urllib.request.urlopen(server.url + "/health", timeout=5) as r:
        assert r.status == 200


def test_a_kv_event_subscriber_sees_the_blocks_of_a_prompt_it_sent(server: Server) -> None:
    prompt = words(50, "indexed")
    ids = encode(prompt, 32000)
    want = block_hashes(ids)  # what a router computes from the prompt
    assert len(want) == 3

    async def subscribe_and_send() -> list[dict]:
        events: list[dict] = []
        async with ClientSession(timeout=ClientTimeout(total=5)) as s, s.get(server.url + "/v1/kv_events") as sub:
            assert await sub.content.readline() == b": subscribed\n"
            async with s.post(server.url + "/v1/completions",
                              json={"model": MODEL, "prompt": prompt, "max_tokens": 2}) as r:
                assert r.status == 200
            stored: set[int] = set()
            while not set(want) <= stored:
                line = await sub.content.readline()
                if line.startswith(b"data: "):
                    batch = json.loads(line[6:])
                    events += batch["events"]
                    stored |= {h for ev in batch["events"] if ev["type"] == "BlockStored" for h in ev["block_hashes"]}
        return events

    events = asyncio.run(subscribe_and_send())
    chain = next(ev for ev in events if ev["type"] == "BlockStored" and want[0] in ev["block_hashes"])
    # NOTE: a prompt's blocks come as one chain from the root: each names the one before it
    assert chain["parent_block_hash"] is None and chain["block_hashes"][:3] == want and chain["block_size"] == 16


# the command

def test_headrace_engine_refuses_bad_input_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["engine", "--profile", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("headrace engine: error: ") and "\n" not in err
    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump(llm_profile_to_dict(tiny_profile())))
    assert main(["engine", "--profile", str(f), "--max-model-len", "100000"]) == 2
    assert "--max-model-len (100000)" in capsys.readouterr().err
    assert main(["engine", "--profile", str(f), "--gpu-memory-utilization", "1.5"]) == 2


def test_headrace_engine_serves_a_profile_file(tmp_path: Path) -> None:
    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump(llm_profile_to_dict(tiny_profile())))
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "engine", "--profile", str(f), "--port", "0",
                             "--served-model-name", "cli-tiny", "--max-num-seqs", "4",
                             "--enable-prompt-tokens-details"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://\S+/v1", line)
        assert url, line + proc.stderr.read()
        client = openai.OpenAI(base_url=url.group(0), api_key="none")
        assert [m.id for m in client.models.list().data] == ["cli-tiny"]
        out = client.completions.create(model="cli-tiny", prompt="hi", max_tokens=3)
        assert len(out.choices[0].text.split()) == 3
        assert out.usage.prompt_tokens_details.cached_tokens == 0  # reported: the flag is on
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
