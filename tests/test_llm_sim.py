"""The token-level simulator (loadgen.llm.sim) and the engine loop's fast-forward it runs on, and
llm-d's shared-prefix workload."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from deploy.cli import main as headrace
from gateway.policy.llm.types import Band, Refuse, ReplicaView, RouterBase, TokenRequest
from loadgen.llm.sim import fleet, simulate, tenants_of
from loadgen.llm.stats import per_request, summarize
from loadgen.llm.workload import BLOCK_TOKENS, LengthDist, TraceRows, Workload, shared_prefix
from profiles.llm.engine import Engine, EngineConfig, LlmRequest
from profiles.llm.kv import block_hashes
from profiles.llm.loop import EngineLoop, replay
from profiles.llm.profile import LlmProfile, llm_profile_to_dict
from profiles.llm.steptime import StepShape, StepTime

STEP = StepTime(layers=4, linear=((1, 0.001), (64, 0.0012), (4096, 0.02)), prefill_attn_per_pair_s=1e-9,
                decode_attn_s=1e-4, decode_attn_per_kv_s=3e-8, step_s=0.002, sample_s=1e-5)


def fake_profile(frontend_s: float = 0.004, blocks: int = 2000) -> LlmProfile:
    """A small, fast model whose engine holds about ``blocks`` KV blocks at utilisation 0.9."""
    return LlmProfile(model="tiny", variant="tiny", gpu="FAKE", slice="gpu", tp=1, memory_gb=1.0,
                      weights_gb=0.9 - (blocks + 0.5) * 16 * 1000 / 1e9, activation_gb=0.0, kv_bytes_per_token=1000,
                      max_model_len=4096, step_time=STEP, frontend_s=frontend_s)


def workload(n: int = 40, rate: float = 20.0, seed: int = 0) -> Workload:
    """Poisson arrivals of prompts built from a few shared 512-token blocks and a unique tail."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, n))
    ins = rng.integers(BLOCK_TOKENS + 1, 3 * BLOCK_TOKENS, n)
    hashes = tuple((int(rng.integers(0, 3)), 100 + 2 * i, 101 + 2 * i) for i in range(n))
    return Workload("test", TraceRows(times, ins, rng.integers(1, 120, n), hashes), seed)


class LeastOutstanding(RouterBase):
    name = "least-outstanding"

    def choose(self, request: TokenRequest, candidates: list[ReplicaView], now: float) -> ReplicaView:
        return min(candidates, key=lambda v: (v.outstanding, v.id))


class RefuseAll(RouterBase):
    def submit(self, request: TokenRequest, now: float) -> list:
        request.arrival = now
        return [Refuse(request, "over capacity", 2.0)]


def test_the_simulator_is_deterministic() -> None:
    runs = [simulate(workload(), fleet(fake_profile(), 3), LeastOutstanding(), 0.5, 0.05) for _ in range(2)]
    assert per_request(runs[0].outcomes) == per_request(runs[1].outcomes)
    assert runs[0].engines == runs[1].engines
    assert all(o.ok and o.output_tokens == o.wanted_tokens for o in runs[0].outcomes)


def test_fast_forward_changes_no_outcome_of_a_run() -> None:
    work, engines = workload(60, rate=40.0), fleet(fake_profile(blocks=300), 2)
    stepped = simulate(work, engines, LeastOutstanding(), fast_forward=False)
    ran = simulate(work, engines, LeastOutstanding(), fast_forward=True)
    for a, b in zip(stepped.outcomes, ran.outcomes, strict=True):
        assert (a.ttft, a.output_tokens, a.cached_tokens) == pytest.approx((b.ttft, b.output_tokens, b.cached_tokens),
                                                                          abs=1e-9)
        assert a.e2e == pytest.approx(b.e2e, abs=1e-9)
    assert [replace(e, steps=0, runs=0, run_steps=0) for e in stepped.engines] == \
        [replace(e, steps=0, runs=0, run_steps=0) for e in ran.engines]
    assert sum(e.run_steps for e in ran.engines) > sum(e.steps for e in ran.engines)  # it did fast-forward


def test_a_refused_request_is_a_429_outcome() -> None:
    res = simulate(workload(5), fleet(fake_profile(), 1), RefuseAll())
    assert all(o.status == 429 and o.error == "HTTP 429: over capacity" and o.e2e == 0.0 for o in res.outcomes)
    s = summarize(res.outcomes, res.elapsed_s, 1000, 100)
    assert s["errors"] == {"HTTP 429": 5} and s["attainment"] == 0.0


def test_the_router_and_the_outcomes_see_each_requests_band_and_tenant() -> None:
    asked: list[tuple[Band, str]] = []

    class Watching(LeastOutstanding):
        def submit(self, request: TokenRequest, now: float) -> list:
            asked.append((request.band, request.tenant))
            return super().submit(request, now)

    res = simulate(workload(3), fleet(fake_profile(), 1), Watching(), band=["critical", 2, Band.STANDARD],
                   tenant=["a", "b", "a"])
    assert asked == [(Band.CRITICAL, "a"), (Band.SHEDDABLE, "b"), (Band.STANDARD, "a")]
    assert [(o.band, o.tenant) for o in res.outcomes] == [("critical", "a"), ("sheddable", "b"), ("standard", "a")]


def test_a_single_light_request_waits_its_front_end_and_one_prefill_step() -> None:
    profile = fake_profile(frontend_s=0.0123)
    work = Workload("one", TraceRows(np.array([1.5]), np.array([40]), np.array([1]), ()))
    res = simulate(work, fleet(profile, 2), LeastOutstanding())
    prefill = StepShape()
    prefill.add_prefill(0, 40, True)
    assert res.outcomes[0].ttft == pytest.approx(profile.frontend_s + STEP.seconds(prefill), abs=1e-12)
    assert res.outcomes[0].e2e == res.outcomes[0].ttft and res.elapsed_s == pytest.approx(1.5 + res.outcomes[0].e2e)


def test_the_router_gets_each_engines_load_every_scrape_interval() -> None:
    seen: list[tuple[str, float]] = []

    class Watching(LeastOutstanding):
        def on_load(self, replica_id, load, now) -> None:  # noqa: ANN001
            seen.append((replica_id, now))

    simulate(workload(5, rate=5.0), fleet(fake_profile(), 2), Watching(), scrape_interval=0.25)
    times = sorted({t for _, t in seen})
    assert times[:3] == [0.0, 0.25, 0.5] and all(sum(1 for _, t in seen if t == x) == 2 for x in times)


def mixed(seed: int, n: int = 60) -> list[tuple[float, LlmRequest]]:
    """Staggered requests over a few shared prefixes, short and long outputs."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(16, 999) for _ in range(rng.randrange(20, 200))] for _ in range(4)]
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(8.0)
        p = rng.choice(prefixes) + [rng.randrange(16, 999) for _ in range(rng.randrange(1, 300))]
        out.append((t, LlmRequest(str(i), p, rng.choice([1, 2, 5, 40, 200, 600]), seed=i,
                                  hashes=block_hashes(p) if i % 2 else ())))
    return out


def drive(lp: EngineLoop, arrivals: list[tuple[float, LlmRequest]]) -> tuple[dict[str, list[float]], list]:
    """Every token's time and every KV event, the loop polled whenever it wakes."""
    events: list = []
    return replay(lp, arrivals, events), events


@pytest.mark.parametrize(("blocks", "seqs", "budget", "frontend_s", "share"), [
    (4000, 256, 2048, 0.0, 0.8), (150, 16, 256, 0.003, 0.2), (80, 4, 64, 0.003, 0.1)])  # roomy, tight, tiny
def test_fast_forward_gives_the_token_times_and_counters_of_stepping(blocks: int, seqs: int, budget: int,
                                                                     frontend_s: float, share: float) -> None:
    config = EngineConfig(num_blocks=blocks, max_model_len=2048, max_num_seqs=seqs, max_num_batched_tokens=budget)
    for seed in range(3):
        arrivals = mixed(seed)
        stepped, ran = EngineLoop(Engine(config, STEP), frontend_s), EngineLoop(Engine(config, STEP), frontend_s, True)
        (t1, e1), (t2, e2) = drive(stepped, arrivals), drive(ran, arrivals)
        assert t1.keys() == t2.keys() and all(len(t1[r]) == len(t2[r]) for r in t1)
        assert max(abs(a - b) for r in t1 for a, b in zip(t1[r], t2[r], strict=True)) <= 1e-9
        assert e1 == e2 and stepped.engine.counters == ran.engine.counters
        assert list(stepped.engine.pool.free) == list(ran.engine.pool.free)  # the same blocks, in the same order
        assert ran.run_steps > share * (ran.run_steps + ran.steps)  # NOTE: it did fast-forward


def test_shared_prefix_shares_exactly_the_system_prompt_within_a_tenant() -> None:
    rows = shared_prefix("poisson", 50.0, 1.0, None, 40, LengthDist("fixed", 300), seed=3, tenants=3,
                         system_len=2 * BLOCK_TOKENS, question_len=700)
    work = Workload("shared-prefix", rows, seed=3)
    assert rows.tenant is not None and set(rows.tenant.tolist()) == {0, 1, 2}
    assert rows.input_len.tolist() == [2 * BLOCK_TOKENS + 700] * 40 and rows.output_len.tolist() == [300] * 40
    prompts = [work.prompt(i) for i in range(len(work))]
    for i in range(len(work)):
        for j in range(i + 1, len(work)):
            shared = next((k for k, (a, b) in enumerate(zip(prompts[i], prompts[j], strict=True)) if a != b), None)
            if rows.tenant[i] == rows.tenant[j]:
                assert shared == 2 * BLOCK_TOKENS  # the system prompt, not a token more
            else:
                assert shared == 0
    assert tenants_of(work)[:2] == [f"tenant-{g}" for g in rows.tenant[:2].tolist()]


def test_shared_prefix_questions_per_tenant_repeat_whole_prompts() -> None:
    rows = shared_prefix("poisson", 50.0, 1.0, None, 60, LengthDist("fixed", 10), seed=1, tenants=2,
                         system_len=BLOCK_TOKENS, questions=3)
    assert len(set(rows.hash_ids)) <= 6 and len(set(rows.hash_ids)) > 2
    with pytest.raises(ValueError, match="whole 512-token blocks"):
        shared_prefix("poisson", 5.0, 1.0, None, 5, LengthDist("fixed", 10), seed=1, system_len=6000)


def test_headrace_sim_llm_reports_a_run_and_refuses_bad_input_in_one_line(capsys: pytest.CaptureFixture,
                                                                          tmp_path: Path) -> None:
    profile = tmp_path / "tiny.yaml"
    profile.write_text(yaml.safe_dump(llm_profile_to_dict(fake_profile())))
    base = ["sim", "llm", "--profile", str(profile), "--engines", "2", "--router", "round-robin", "--trace",
            "shared-prefix", "--rate", "2", "--requests", "6", "--output-len", "20", "--system-len", "512"]
    assert headrace([*base, "--quiet", "--slo-ttft-ms", "1000", "--json", str(tmp_path / "s.json")]) == 0
    assert "6/6 ok" in capsys.readouterr().out
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["offered"] == 6 and doc["sim"]["settings"]["router"] == "round-robin"
    for bad in (["--router", "nope"], ["--engines", "0"], ["--profile", str(tmp_path)], ["--system-len", "600"]):
        assert headrace([*base, *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("headrace sim llm: error:") and err.count("\n") == 1
