"""The CPU engine's tooling without the engine: what vLLM's startup log says it runs with, the
step-time fit recovering a known step time from the measurements it would give, and the engine
model run in virtual time on the comparison's arrivals."""

from __future__ import annotations

import pytest

from bench.vllm_cpu import fidelity, measure
from bench.vllm_cpu.load import Send
from bench.vllm_cpu.server import read_startup
from profiles.llm.steptime import StepShape, StepTime

LOG = """\
(APIServer pid=1) INFO 11-27 05:18:58 [api_utils.py:286] non-default args: {'model_tag': '/m', 'port': 39475, \
'dtype': 'bfloat16', 'max_model_len': 2048, 'load_format': 'dummy', 'block_size': 128, \
'max_num_batched_tokens': 2048, 'max_num_seqs': 128}
(EngineCore pid=2) INFO 11-27 05:19:54 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/m'
(EngineCore pid=2) INFO 11-27 05:21:07 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum \
concurrency for 2,048 tokens per request: 1024.00x
"""

KNOWN = StepTime(layers=2, linear=((1, 50e-6), (8192, 50e-6 * 8192)), prefill_attn_s=5e-3,
                 prefill_attn_per_pair_s=100e-9, decode_attn_per_kv_s=20e-9, step_s=2e-3, sample_s=1e-3)


def test_the_startup_log_gives_the_engines_settings_and_kv_blocks() -> None:
    s = read_startup(LOG)
    assert s.version == "0.32.0" and s.kv_tokens == 2_097_152 and s.block_size == 128
    assert (s.setting("max_num_seqs"), s.setting("max_num_batched_tokens"), s.kv_blocks) == (128, 2048, 16_384)


FRONTEND_S = 12e-3


def measured(st: StepTime, frontend_s: float = FRONTEND_S) -> dict:
    """What the four series would measure on an engine whose steps take ``st`` behind a front end
    of ``frontend_s``."""
    def decode(batch: int, context: int) -> float:
        s = StepShape()
        for _ in range(batch):
            s.add_decode(context)
        return st.seconds(s)

    raw: dict = {"prefill": [], "decode": [], "context": [], "join": []}
    for n in measure.PREFILL:
        s = StepShape()
        s.add_prefill(0, n, True)
        raw["prefill"].append({"prompt": n, "ttft": frontend_s + st.seconds(s),
                               "tpot": decode(1, n + measure.PREFILL_TOKENS // 2)})
    for n in measure.JOIN:
        s = StepShape()
        s.add_prefill(0, n, True)
        s.add_decode(measure.DECODE_PROMPT + 20)
        raw["join"].append({"prompt": n, "gap": st.seconds(s), "decode": decode(1, measure.DECODE_PROMPT + 20),
                            "context": measure.DECODE_PROMPT + 20})
    for series, batches, prompts, tokens in (
            ("decode", measure.DECODE, [measure.DECODE_PROMPT], measure.DECODE_TOKENS),
            ("context", [measure.CONTEXT_BATCH], measure.CONTEXT, measure.CONTEXT_TOKENS)):
        for b in batches:
            for p in prompts:
                decoded = tokens - 8
                raw[series].append({"batch": b, "prompt": p, "tokens": tokens, "decoded": decoded,
                                    "tpot": decode(b, p + tokens - decoded // 2), "ttft": 0.1})
    return raw


def test_the_fit_recovers_a_known_step_time_and_parts_it_from_the_front_end() -> None:
    st, frontend_s, report = measure.fit(measured(KNOWN))
    assert max(report["max_abs_error"].values()) < 1e-6
    assert frontend_s == pytest.approx(FRONTEND_S, rel=1e-3)
    assert st.prefill_attn_s == pytest.approx(KNOWN.prefill_attn_s, rel=1e-3)
    assert st.step_s == pytest.approx(KNOWN.step_s, rel=1e-4)
    assert st.sample_s == pytest.approx(KNOWN.sample_s, rel=1e-4)
    assert st.prefill_attn_per_pair_s == pytest.approx(KNOWN.prefill_attn_per_pair_s, rel=1e-4)
    assert st.decode_attn_per_kv_s == pytest.approx(KNOWN.decode_attn_per_kv_s, rel=1e-4)


def test_alone_a_request_takes_a_prefill_step_then_a_decode_step_a_token() -> None:
    profile = fidelity.load_llm_profiles(fidelity.PROFILE)[0]
    (t,) = fidelity.simulate(profile, [Send(0.5, list(range(3, 203)), 10)])
    first, decode = StepShape(), StepShape()
    first.add_prefill(0, 200, True)
    decode.add_decode(205)
    assert t.tokens == 10 and t.ttft == pytest.approx(profile.frontend_s + profile.step_time.seconds(first))
    assert t.tpot == pytest.approx(profile.step_time.seconds(decode), rel=0.02)


def test_the_workloads_are_seeded_and_share_whole_blocks() -> None:
    a, b = fidelity.workload("knee", True, 5.0, seed=3, n=20), fidelity.workload("knee", True, 5.0, seed=3, n=20)
    assert a == b
    prefixes = {tuple(s.prompt[:fidelity.PREFIX_LEN]) for s in a.sends}
    assert 1 < len(prefixes) <= fidelity.SHARED_PREFIXES and fidelity.PREFIX_LEN % 128 == 0
    assert all(s.max_tokens == fidelity.MAX_TOKENS for s in a.sends)
