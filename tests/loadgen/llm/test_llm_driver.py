"""The open-loop streaming driver against ``headrace engine`` in a process of its own: exact
lengths, token timing, prefix reuse the engine sees, refusals counted as misses; the official
``openai`` client sending the same request gets the same answer; Triton's generate_stream; and
``headrace load llm`` end to end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import openai
import pytest
from aiohttp import web

from deploy.cli import main
from loadgen.llm.driver import Target, drive, request_body
from loadgen.llm.run import LlmLoadSpec, find_max_goodput
from loadgen.llm.stats import summarize
from loadgen.llm.workload import BLOCK_TOKENS, TraceRows, Workload
from tests.loadgen.llm.conftest import ENGINE_MODEL, STEP_S

BLOCK = 16  # the engine's KV block size: prefix-cache hits come in whole blocks


def workload(times: list[float], inputs: list[int], outputs: list[int], hash_ids: tuple = (),
             name: str = "mooncake") -> Workload:
    return Workload(name, TraceRows(np.array(times), np.array(inputs), np.array(outputs), hash_ids), seed=5)


def test_every_request_streams_its_exact_length_and_shared_blocks_hit_the_cache(engine: str) -> None:
    # request 1 shares request 0's first 512-token block; request 2 shares nothing
    w = workload([0.0, 0.3, 0.35], [600, 700, 300], [8, 5, 1], ((1, 2), (1, 3), (4,)))
    outcomes, elapsed = asyncio.run(drive(w, Target(engine, ENGINE_MODEL)))
    assert [o.error for o in outcomes] == [None] * 3
    assert [o.output_tokens for o in outcomes] == [8, 5, 1]
    assert [len(o.itl) for o in outcomes] == [7, 4, 0]
    assert [o.cached_tokens for o in outcomes] == [0, BLOCK_TOKENS, 0]
    assert all(o.ttft is not None and o.ttft < o.e2e for o in outcomes)  # type: ignore[operator]
    assert all(o.send_lag < 0.25 for o in outcomes)  # a busy host may delay a send, not by seconds
    assert 0 < outcomes[0].tpot < 50 * STEP_S  # type: ignore[operator]
    s = summarize(outcomes, elapsed)
    assert s["prefix_cache_hit_rate"] == pytest.approx(BLOCK_TOKENS / 1600)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_the_openai_client_sending_the_drivers_request_gets_the_same_answer(engine: str, api: str) -> None:
    w = workload([0.0], [520], [6], ((11, 12),))
    target = Target(engine, ENGINE_MODEL, api)
    body = request_body(target, w, 0)
    client = openai.OpenAI(base_url=engine + "/v1", api_key="none")
    extra = {"ignore_eos": body["ignore_eos"], "min_tokens": body["min_tokens"]}
    if api == "completions":
        assert body["prompt"] == w.prompt(0) and len(body["prompt"]) == 520
        out = client.completions.create(model=ENGINE_MODEL, prompt=body["prompt"], max_tokens=body["max_tokens"],
                                        extra_body=extra)
        prompt_tokens = 520
    else:
        out = client.chat.completions.create(model=ENGINE_MODEL, messages=body["messages"],
                                             max_tokens=body["max_tokens"], extra_body=extra)
        prompt_tokens = out.usage.prompt_tokens
        assert prompt_tokens > 520  # the chat template's words come on top
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (prompt_tokens, 6)
    # the driver's request finds every whole block of the client's prompt in the cache: the
    # engine saw the same tokens
    [o], _ = asyncio.run(drive(w, target))
    assert o.error is None and o.output_tokens == 6
    assert o.cached_tokens == (prompt_tokens - 1) // BLOCK * BLOCK


def test_a_refused_request_is_a_miss_with_the_engines_status(engine: str) -> None:
    w = workload([0.0, 0.01], [5000, 10], [4, 4], name="azure-llm")  # 5000 tokens: past the 4096 context
    outcomes, elapsed = asyncio.run(drive(w, Target(engine, ENGINE_MODEL, slo_ttft_ms=10_000, slo_tpot_ms=1000)))
    assert outcomes[0].status == 400 and "maximum context length is 4096" in (outcomes[0].error or "")
    s = summarize(outcomes, elapsed, 10_000, 1000)
    assert (s["ok"], s["good"], s["attainment"], s["errors"]) == (1, 1, 0.5, {"HTTP 400": 1})


def test_triton_generate_stream_is_timed_per_event() -> None:
    seen: list[dict] = []

    async def ready(request: web.Request) -> web.Response:
        return web.Response()

    async def generate_stream(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(body["max_tokens"]):
            await asyncio.sleep(0.002)
            await resp.write(b'data: {"model_name":"m","model_version":"1","text_output":" ka"}\n\n')
        return resp

    async def go() -> list:
        app = web.Application()
        app.router.add_get("/v2/models/m/ready", ready)
        app.router.add_post("/v2/models/m/generate_stream", generate_stream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            w = workload([0.0, 0.01], [20, 30], [3, 5], name="azure-llm")
            outcomes, _ = await drive(w, Target(f"http://127.0.0.1:{port}", "m", "triton", slo_ttft_ms=50))
            return outcomes
        finally:
            await runner.cleanup()

    outcomes = asyncio.run(go())
    assert [(o.error, o.output_tokens, len(o.itl)) for o in outcomes] == [(None, 3, 2), (None, 5, 4)]
    assert [len(b["text_input"].split()) for b in seen] == [20, 30]  # one word per prompt token
    assert all(b["stream"] and b["ignore_eos"] for b in seen)


def test_the_goodput_search_finds_the_highest_passing_load(engine: str) -> None:
    spec = LlmLoadSpec(url=engine, model=ENGINE_MODEL, workload="poisson", rate=5.0, requests=12,
                       input_len="fixed:64", output_len="fixed:4", slo_ttft_ms=2000, slo_tpot_ms=500)
    res = asyncio.run(find_max_goodput(spec, 1.0, 4.0, steps=1))
    assert res.best is not None and res.best.spec.rate == 20.0  # both ends pass: the top one
    assert [r.spec.rate for r in res.runs] == [5.0, 20.0]
    assert all(r["passed"] for r in res.rows())


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["load", "llm", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_headrace_load_llm_writes_the_report(engine: str, tmp_path: Path, capsys) -> None:
    rc, out, err = run(capsys, "--url", engine, "--model", ENGINE_MODEL, "--trace", "gamma", "--rate", "20",
                       "--cv", "2", "--requests", "15", "--input-len", "uniform:20:200", "--output-len", "fixed:5",
                       "--slo-ttft-ms", "5000", "--slo-tpot-ms", "1000", "--out", str(tmp_path))
    assert rc == 0, err
    assert "TTFT" in out and "goodput" in out
    doc = json.loads((tmp_path / "llm_load.json").read_text())
    assert doc["summary"]["offered"] == 15 and doc["summary"]["attainment"] == 1.0
    assert len(doc["requests"]) == 15 and doc["run"]["spec"]["workload"] == "gamma"
    assert (tmp_path / "llm_load_cdf.png").stat().st_size > 0


def test_a_search_no_load_passes_exits_3(engine: str, tmp_path: Path, capsys) -> None:
    rc, out, _ = run(capsys, "--url", engine, "--model", ENGINE_MODEL, "--requests", "3", "--rate", "10",
                     "--input-len", "8", "--output-len", "2", "--slo-ttft-ms", "0.001",
                     "--find-max-goodput", "1:2", "--out", str(tmp_path))
    assert rc == 3 and "no load in 1:2" in out
    assert json.loads((tmp_path / "llm_search.json").read_text())["best_load"] is None
    assert (tmp_path / "llm_search.png").exists()


@pytest.mark.parametrize(("args", "needle"), [
    (["--trace", "poisson", "--rate", "0", "--duration", "1"], "rate"),
    (["--trace", "poisson"], "needs --duration or --requests"),
    (["--trace", "mooncake", "--duration", "5", "--traces-dir", "/nonexistent"], "no such trace file"),
    (["--trace", "poisson", "--duration", "1", "--input-len", "beta:1"], "bad length 'beta:1'"),
    (["--duration", "1", "--find-max-goodput", "1:2"], "needs --slo-ttft-ms and/or --slo-tpot-ms"),
    (["--duration", "1", "--slo-tpot-ms", "5", "--find-max-goodput", "3:x"], "want LO:HI"),
])
def test_bad_arguments_give_one_line_and_exit_2(capsys, args: list[str], needle: str) -> None:
    rc, _, err = run(capsys, "--url", "http://127.0.0.1:9", "--model", "m", *args)
    assert rc == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_an_unreachable_target_exits_1(capsys) -> None:
    rc, _, err = run(capsys, "--url", "http://127.0.0.1:9", "--model", "m", "--requests", "1", "--quiet")
    assert rc == 1 and "cannot reach http://127.0.0.1:9" in err


def test_every_option_of_load_llm_reaches_it_past_the_classic_load_options() -> None:
    # NOTE: `headrace load`'s own options see these strings first; none may claim or reject one
    from deploy.cli import build_parser

    a = build_parser().parse_args([
        "load", "llm", "--url", "http://h:1", "--model", "m", "--endpoint", "chat", "--api-key-env", "K",
        "--request-timeout", "9", "--trace", "gamma", "--traces-dir", "/t", "--start", "3", "--duration", "4",
        "--requests", "5", "--rate-scale", "6", "--rate", "7", "--cv", "2", "--input-len", "8",
        "--output-len", "9", "--max-context", "100", "--vocab-size", "1000", "--seed", "1",
        "--slo-ttft-ms", "10", "--slo-tpot-ms", "11", "--find-max-goodput", "1:2",
        "--target-attainment", "0.8", "--bisect", "2", "--out", "o", "--quiet"])
    got = {k: getattr(a, k) for k in ("url", "endpoint", "api_key_env", "request_timeout", "trace", "start",
                                      "duration", "requests", "rate_scale", "rate", "cv", "input_len",
                                      "max_context", "slo_tpot_ms", "find_max_goodput", "target_attainment",
                                      "bisect", "quiet")}
    assert got == {"url": "http://h:1", "endpoint": "chat", "api_key_env": "K", "request_timeout": 9.0,
                   "trace": "gamma", "start": 3.0, "duration": 4.0, "requests": 5, "rate_scale": 6.0,
                   "rate": 7.0, "cv": 2.0, "input_len": "8", "max_context": 100, "slo_tpot_ms": 11.0,
                   "find_max_goodput": "1:2", "target_attainment": 0.8, "bisect": 2, "quiet": True}
