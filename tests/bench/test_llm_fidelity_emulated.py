"""The prediction the emulated engine is held to: arrivals replayed through the engine model in
virtual time, each token stamped with the end of the step that made it."""

from __future__ import annotations

import pytest

from bench.llm_fidelity_emulated import replay
from profiles.llm.engine import EngineConfig, LlmRequest
from profiles.llm.steptime import StepTime

STEP = 0.02
CONFIG = EngineConfig(num_blocks=64, max_model_len=256)
FLAT = StepTime(layers=1, linear=((1, STEP), (8192, STEP)))  # every step takes STEP, whatever it holds


def test_one_request_makes_a_token_per_step_from_its_arrival() -> None:
    times = replay(CONFIG, FLAT, [(0.5, LlmRequest("a", list(range(1, 11)), 3))])
    assert times["a"] == pytest.approx([0.5 + STEP, 0.5 + 2 * STEP, 0.5 + 3 * STEP])


def test_a_request_arriving_during_a_step_joins_the_next() -> None:
    # NOTE: the engine never idles while it has work: b's first step starts when a's first ends
    times = replay(CONFIG, FLAT, [(0.0, LlmRequest("a", [1] * 10, 3)), (0.005, LlmRequest("b", [2] * 10, 2))])
    assert times["a"] == pytest.approx([STEP, 2 * STEP, 3 * STEP])
    assert times["b"] == pytest.approx([2 * STEP, 3 * STEP])


def test_an_arrival_after_an_idle_spell_starts_a_step_at_once() -> None:
    times = replay(CONFIG, FLAT, [(0.0, LlmRequest("a", [1] * 10, 1)), (1.0, LlmRequest("b", [2] * 10, 1))])
    assert times == {"a": pytest.approx([STEP]), "b": pytest.approx([1.0 + STEP])}
