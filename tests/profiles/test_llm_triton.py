"""The emulated LLM engine as a decoupled python-backend model behind real tritonserver: gRPC
streams one response per token, Triton's generate and generate_stream answer the text the engine
model makes, refusals are Triton errors, and a cancelled stream is aborted in the engine."""

from __future__ import annotations

import json
import queue
import re
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from profiles.emulator.llm_repository import (
    engine_config_from_params,
    engine_params,
    write_llm_model,
)
from profiles.llm.engine import Engine, LlmRequest
from profiles.llm.profile import LlmProfile
from profiles.llm.steptime import StepTime
from profiles.llm.tokens import decode, encode
from profiles.profile import ProfileError, Provenance
from profiles.triton.server import TritonServer
from tests.prometheus import samples

STEP_S = 0.005  # every step of the tiny model: 5 ms, whatever it holds
MODEL = "llm"
MAX_MODEL_LEN = 4096
SETTINGS = {"max_num_seqs": 8, "max_num_batched_tokens": 512}
PROMPT = "The quick brown fox jumps over the lazy dog, twice."


def tiny_profile(max_model_len: int = MAX_MODEL_LEN) -> LlmProfile:
    """A model whose every step takes STEP_S, with 640 KV blocks at utilisation 0.9."""
    return LlmProfile(
        model="tiny", variant="tiny-bf16", gpu="CPU", slice="gpu", tp=1, memory_gb=1.0, weights_gb=0.5,
        activation_gb=0.0, kv_bytes_per_token=39_000, max_model_len=max_model_len,
        step_time=StepTime(layers=1, linear=((1, STEP_S), (4096, STEP_S))), provenance=Provenance("test"))


def engine_text(prompt: str, max_tokens: int, seed: int) -> str:
    """What the engine model itself generates for one request, run here without Triton."""
    engine = Engine(tiny_profile().engine_config(**SETTINGS), tiny_profile().step_time)
    engine.add(LlmRequest("r", encode(prompt, engine.config.vocab_size), max_tokens, seed))
    tokens = []
    while not engine.idle:
        tokens += [t for _, t in engine.complete(engine.schedule()).tokens]
    return decode(tokens)


# the repository writer, without Triton

def test_the_written_model_is_decoupled_with_the_llm_tensors_and_its_engine(tmp_path):
    mdir = write_llm_model(tmp_path, MODEL, tiny_profile(), **SETTINGS)
    pbtxt = (mdir / "config.pbtxt").read_text()
    assert "model_transaction_policy { decoupled: true }" in pbtxt
    assert "max_batch_size: 0" in pbtxt
    assert '{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }' in pbtxt
    assert '{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }' in pbtxt
    assert '{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }' in pbtxt
    assert (mdir / "1" / "model.py").exists() and (mdir / "1" / "profile.yaml").exists()
    params = dict(re.findall(r'key: "(\w+)" value: \{ string_value: "([^"]*)" \}', pbtxt))
    # NOTE: the engine the model runs is the one the profile gives, read back from config.pbtxt
    assert engine_config_from_params(params) == tiny_profile().engine_config(**SETTINGS)


def test_engine_parameters_round_trip_and_name_what_is_wrong():
    config = tiny_profile().engine_config(max_num_seqs=3, prefix_caching=False)
    params = engine_params(config)
    assert engine_config_from_params(params) == config
    with pytest.raises(ValueError, match="'max_num_seqs' must be an integer, got 'many'"):
        engine_config_from_params({**params, "max_num_seqs": "many"})
    with pytest.raises(ValueError, match="'prefix_caching' must be true or false"):
        engine_config_from_params({**params, "prefix_caching": "yes"})
    with pytest.raises(ValueError, match="'num_blocks' is missing"):
        engine_config_from_params({k: v for k, v in params.items() if k != "num_blocks"})


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_num_sequences": 4}, r"unknown engine settings \['max_num_sequences'\]"),
    ({"gpu_memory_utilization": 0.0}, r"gpu_memory_utilization \(0.0\) must be in \(0, 1\]"),
    ({"gpu_memory_utilization": 0.5}, "leave no KV cache"),
    ({"max_model_len": 8192}, r"max_model_len \(8192\) exceeds the profile's \(4096\)"),
    ({"max_num_batched_tokens": 0}, "must be at least 1"),
    ({"default_max_tokens": 0}, r"default_max_tokens \(0\) must be at least 1"),
])
def test_the_writer_refuses_an_engine_it_cannot_build(tmp_path, kwargs, message):
    with pytest.raises(ProfileError, match=message):
        write_llm_model(tmp_path, MODEL, tiny_profile(), **kwargs)


# behind real Triton

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("llm")
    write_llm_model(repo, MODEL, tiny_profile(), **SETTINGS)
    with TritonServer(repo, ready_timeout=120) as server:  # a busy host starts python stubs slowly
        yield server


def stream_inputs(prompt: str, max_tokens: int | None, seed: int | None = None) -> list[grpcclient.InferInput]:
    def tensor(name: str, dtype: str, value: np.ndarray) -> grpcclient.InferInput:
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(value)
        return t

    out = [tensor("text_input", "BYTES", np.array([prompt.encode()], dtype=np.object_)),
           tensor("stream", "BOOL", np.array([True]))]
    if max_tokens is not None:
        out.append(tensor("max_tokens", "INT32", np.array([max_tokens], dtype=np.int32)))
    if seed is not None:
        out.append(tensor("seed", "UINT64", np.array([seed], dtype=np.uint64)))
    return out


class Stream:
    """One gRPC bidirectional stream to Triton; each response or error lands in ``got``."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.got: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.got.put((result, error)))

    def send(self, prompt: str, max_tokens: int | None, seed: int | None = None, request_id: str = "",
             parameters: dict | None = None) -> None:
        self.client.async_stream_infer(MODEL, stream_inputs(prompt, max_tokens, seed), request_id=request_id,
                                       enable_empty_final_response=True, parameters=parameters)

    def next(self) -> tuple[str | None, bool, str | None]:
        """(text_output, whether it is the final response, error message) of the next response."""
        result, error = self.got.get(timeout=30)
        if error is not None:
            return None, True, str(error)
        final = result.get_response().parameters["triton_final_response"].bool_param
        out = result.as_numpy("text_output")
        return (None if out is None else out[0].decode()), final, None

    def read_all(self) -> list[tuple[str | None, bool, str | None]]:
        out = [self.next()]
        while not out[-1][1]:
            out.append(self.next())
        return out

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def metrics(server: TritonServer) -> dict[str, float]:
    return samples(f"http://127.0.0.1:{server.metrics_port}/metrics")


def engine_metric(server: TritonServer, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in {"model": MODEL, "version": "1", **labels}.items())
    for key, value in metrics(server).items():
        if key.startswith(name + "{") and all(p in key for p in want.split(",")):
            return value
    raise KeyError(f"{name} with {want} is not on Triton's /metrics")


def post(server: TritonServer, path: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/{MODEL}/{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.integration
def test_a_grpc_stream_gets_one_response_per_token_then_the_final_flag(served):
    s = Stream(served.grpc_url)
    try:
        t0 = time.monotonic()
        s.send(PROMPT, 12, seed=7)
        got = s.read_all()
        elapsed = time.monotonic() - t0
        s.send(PROMPT, 12, seed=7)
        again = s.read_all()
        s.send(PROMPT, 12, seed=8)
        other = s.read_all()
    finally:
        s.close()
    assert all(err is None for _, _, err in got)
    # NOTE: the last token's own response carries the final flag; none before it does
    assert [final for _, final, _ in got] == [False] * 11 + [True]
    assert all(text is not None and len(text.split()) == 1 for text, _, _ in got)
    text = "".join(t for t, _, _ in got)
    assert text == engine_text(PROMPT, 12, 7)  # what the engine model makes, token by token, in order
    assert "".join(t for t, _, _ in again) == text
    # NOTE: the engine paces the tokens: each is one step of the profile, so 12 take at least 12 steps
    assert elapsed >= 12 * STEP_S
    assert "".join(t for t, _, _ in other) != text


@pytest.mark.integration
def test_streams_on_one_connection_interleave_and_each_ends_whole(served):
    s = Stream(served.grpc_url)
    try:
        s.send(PROMPT, 6, seed=1, request_id="a")
        s.send("A different prompt entirely", 9, seed=2, request_id="b")
        by_id: dict[str, list[str]] = {"a": [], "b": []}
        finals = 0
        while finals < 2:
            result, error = s.got.get(timeout=30)
            assert error is None, error
            rid = result.get_response().id
            by_id[rid].append(result.as_numpy("text_output")[0].decode())
            finals += result.get_response().parameters["triton_final_response"].bool_param
    finally:
        s.close()
    assert "".join(by_id["a"]) == engine_text(PROMPT, 6, 1)
    assert "".join(by_id["b"]) == engine_text("A different prompt entirely", 9, 2)


@pytest.mark.integration
def test_generate_answers_the_whole_text_and_generate_stream_one_event_per_token(served):
    want = engine_text(PROMPT, 8, 3)
    status, body = post(served, "generate", {"text_input": PROMPT, "max_tokens": 8, "seed": 3})
    assert status == 200, body
    # NOTE: as vLLM's Triton backend, a whole answer starts with its prompt unless asked not to
    assert json.loads(body)["text_output"] == PROMPT + want
    status, body = post(served, "generate", {"text_input": PROMPT, "max_tokens": 8, "seed": 3,
                                             "exclude_input_in_output": True})
    assert (status, json.loads(body)["text_output"]) == (200, want)
    # the generate extension's request parameters are read as well as tensors
    status, body = post(served, "generate", {"text_input": PROMPT, "parameters": {"max_tokens": 8, "seed": 3}})
    assert (status, json.loads(body)["text_output"]) == (200, PROMPT + want)

    status, body = post(served, "generate_stream", {"text_input": PROMPT, "max_tokens": 8, "seed": 3,
                                                    "stream": True})
    assert status == 200, body
    events = [json.loads(line[len("data: "):]) for line in body.splitlines() if line.startswith("data: ")]
    assert len(events) == 8
    assert "".join(e["text_output"] for e in events) == want


@pytest.mark.integration
def test_a_prompt_past_the_context_is_refused_with_the_engines_numbers(served):
    prompt = " ".join(["word"] * 4090)
    status, body = post(served, "generate", {"text_input": prompt, "max_tokens": 16})
    assert status == 400
    assert json.loads(body)["error"] == ("this model's maximum context length is 4096 tokens, but the request has "
                                         "4090 input tokens and asks for 16 more")
    status, body = post(served, "generate", {"text_input": PROMPT, "max_tokens": 0})
    assert (status, json.loads(body)["error"]) == (400, "max_tokens must be at least 1, got 0")
    s = Stream(served.grpc_url)
    try:
        s.send(prompt, 16)
        _, final, error = s.next()
        s.send(PROMPT, None, parameters={"max_tokens": "ten"})
        _, bad_final, bad = s.next()
        s.send(PROMPT, 2, seed=5)  # the stream carries on after a refusal
        after = s.read_all()
    finally:
        s.close()
    assert final and "maximum context length is 4096 tokens" in error
    assert bad_final and "parameter 'max_tokens' must be an integer, got 'ten'" in bad
    assert "".join(t for t, _, _ in after) == engine_text(PROMPT, 2, 5)


@pytest.mark.integration
def test_a_cancelled_stream_is_aborted_in_the_engine_and_frees_its_kv(served):
    generated = engine_metric(served, "vllm:generation_tokens_total")
    aborted = engine_metric(served, "vllm:request_success_total", finished_reason="abort")
    s = Stream(served.grpc_url)
    s.send(PROMPT, 2000, seed=11)  # 2000 steps: about 10 s of tokens
    for _ in range(3):
        text, final, error = s.next()
        assert error is None and not final
    s.close(cancel=True)
    deadline = time.monotonic() + 10
    while engine_metric(served, "vllm:request_success_total", finished_reason="abort") < aborted + 1:
        assert time.monotonic() < deadline, "the engine never aborted the cancelled request"
        time.sleep(0.05)
    # NOTE: the abort freed the request's KV blocks and stopped its tokens well short of 2000
    assert engine_metric(served, "vllm:kv_cache_usage_perc") == 0.0
    assert engine_metric(served, "vllm:num_requests_running") == 0.0
    made = engine_metric(served, "vllm:generation_tokens_total") - generated
    time.sleep(0.2)
    assert engine_metric(served, "vllm:generation_tokens_total") - generated == made
    assert 3 <= made < 2000
    # and the engine serves the next request as before
    status, body = post(served, "generate", {"text_input": PROMPT, "max_tokens": 4, "seed": 3,
                                             "exclude_input_in_output": True})
    assert (status, json.loads(body)["text_output"]) == (200, engine_text(PROMPT, 4, 3))
