"""The engine loop against a driver's clock, and the emulated engines' tokenizer."""

from __future__ import annotations

import pytest

from profiles.llm.engine import Engine, EngineConfig, LlmRequest
from profiles.llm.loop import EngineLoop
from profiles.llm.steptime import StepTime
from profiles.llm.tokens import chat_prompt, decode, encode

STEP = StepTime(layers=1, linear=((1, 0.01), (1000, 0.01)))  # every step 10 ms


def loop() -> EngineLoop:
    return EngineLoop(Engine(EngineConfig(num_blocks=32, max_model_len=256), STEP))


def test_a_step_completes_only_when_its_time_has_passed() -> None:
    lp = loop()
    assert lp.poll(0.0) is None and lp.wake is None  # idle
    lp.add(LlmRequest("a", [1, 2, 3], max_tokens=3), 1.0)
    assert lp.poll(1.0) is None and lp.wake == pytest.approx(1.01)
    assert lp.poll(1.005) is None
    out = lp.poll(1.02)  # late by 10 ms: the next step still starts when this one ended
    assert [t for _, t in out.tokens] and lp.started_at == pytest.approx(1.01) and lp.wake == pytest.approx(1.02)
    lp.poll(1.02)
    last = lp.poll(1.03)
    assert last.finished == ["a"] and lp.wake is None
    lp.add(LlmRequest("b", [4], max_tokens=1), 5.0)
    lp.poll(5.0)
    assert lp.started_at == 5.0  # after an idle spell the step starts when work is found


def test_an_abort_while_a_step_runs_yields_no_token_for_it() -> None:
    lp = loop()
    lp.add(LlmRequest("a", [1, 2], max_tokens=5), 0.0)
    lp.poll(0.0)
    assert lp.abort("a")
    assert lp.poll(0.02).tokens == [] and lp.wake is None


def test_a_request_joins_the_queue_after_the_front_end_and_steps_run_beside_it() -> None:
    lp = EngineLoop(Engine(EngineConfig(num_blocks=32, max_model_len=256), STEP), frontend_s=0.005)
    lp.add(LlmRequest("a", [1, 2], max_tokens=3), 1.0)
    assert lp.engine.seqs["a"].state == "arriving" and lp.wake == pytest.approx(1.005)
    assert lp.poll(1.001) is None and lp.step is None  # still on its way in: no step
    lp.poll(1.005)
    assert lp.started_at == pytest.approx(1.005) and lp.wake == pytest.approx(1.015)
    lp.add(LlmRequest("b", [3], max_tokens=1), 1.006)  # arrives while a's first step runs
    assert lp.wake == pytest.approx(1.011)  # b joins the queue then; a's step goes on
    assert lp.poll(1.011) is None and lp.engine.seqs["b"].state == "waiting"
    out = lp.poll(1.015)
    assert [r for r, _ in out.tokens] == ["a"]
    assert {s.req.id for s, _ in lp.step.scheduled} == {"a", "b"}  # b is in the next step


def test_a_late_poll_starts_the_step_when_the_request_joined_not_at_the_poll() -> None:
    lp = EngineLoop(Engine(EngineConfig(num_blocks=32, max_model_len=256), STEP), frontend_s=0.005)
    lp.add(LlmRequest("a", [1], max_tokens=2), 2.0)
    lp.poll(2.5)
    assert lp.started_at == pytest.approx(2.005)


def test_an_arriving_request_aborted_never_runs_and_holds_no_blocks() -> None:
    lp = EngineLoop(Engine(EngineConfig(num_blocks=32, max_model_len=256), STEP), frontend_s=0.005)
    lp.add(LlmRequest("a", [1, 2], max_tokens=3), 0.0)
    assert lp.abort("a")
    assert lp.poll(0.01) is None and lp.step is None and lp.wake is None
    assert lp.engine.pool.usage == 0.0


def test_text_tokenizes_the_same_everywhere_and_decodes_to_words() -> None:
    assert encode("Hello, world!", 32000) == encode("Hello, world!", 32000)
    assert len(encode("Hello, world!", 32000)) == 4
    assert all(16 <= t < 512 for t in encode("a b c d e f g " * 50, 512))
    assert decode([0, 17]) == " ka lolo"
    assert chat_prompt([{"role": "user", "content": "hi"}]) == "user: hi\nassistant:"
