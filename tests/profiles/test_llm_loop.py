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
    lp.add(LlmRequest("a", [1, 2, 3], max_tokens=3))
    assert lp.poll(1.0) is None and lp.wake == pytest.approx(1.01)
    assert lp.poll(1.005) is None
    out = lp.poll(1.02)  # late by 10 ms: the next step still starts when this one ended
    assert [t for _, t in out.tokens] and lp.started_at == pytest.approx(1.01) and lp.wake == pytest.approx(1.02)
    lp.poll(1.02)
    last = lp.poll(1.03)
    assert last.finished == ["a"] and lp.wake is None
    lp.add(LlmRequest("b", [4], max_tokens=1))
    lp.poll(5.0)
    assert lp.started_at == 5.0  # after an idle spell the step starts when work is found


def test_an_abort_while_a_step_runs_yields_no_token_for_it() -> None:
    lp = loop()
    lp.add(LlmRequest("a", [1, 2], max_tokens=5))
    lp.poll(0.0)
    assert lp.abort("a")
    assert lp.poll(0.02).tokens == [] and lp.wake is None


def test_text_tokenizes_the_same_everywhere_and_decodes_to_words() -> None:
    assert encode("Hello, world!", 32000) == encode("Hello, world!", 32000)
    assert len(encode("Hello, world!", 32000)) == 4
    assert all(16 <= t < 512 for t in encode("a b c d e f g " * 50, 512))
    assert decode([0, 17]) == " ka lolo"
    assert chat_prompt([{"role": "user", "content": "hi"}]) == "user: hi\nassistant:"
