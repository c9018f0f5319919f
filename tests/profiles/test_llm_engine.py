"""The LLM engine model: continuous batching over a paged KV cache, held to vLLM's v1 rules and
to the invariants every step must keep (KV blocks conserved, the prefix cache within its
capacity, no request starved by preemption, the token budget and the sequence cap)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiles.llm.engine import Engine, EngineConfig, LlmRequest, RequestTooLong, State
from profiles.llm.kv import BlockRemoved, BlockStored, block_hashes
from profiles.llm.steptime import StepShape, StepTime

STEP = StepTime(layers=2, linear=((1, 0.001), (64, 0.002), (512, 0.01)), decode_attn_per_kv_s=1e-6, step_s=0.001)


def engine(num_blocks: int = 64, budget: int = 64, max_seqs: int = 8, max_len: int = 512, **kw: object) -> Engine:
    return Engine(EngineConfig(num_blocks=num_blocks, max_model_len=max_len, max_num_batched_tokens=budget,
                               max_num_seqs=max_seqs, **kw), STEP)


def run(e: Engine, limit: int = 100_000) -> dict[str, list[int]]:
    """Steps until idle; each request's tokens."""
    out: dict[str, list[int]] = {}
    for _ in range(limit):
        step = e.schedule()
        if step is None:
            assert e.idle, "requests wait, but nothing was scheduled"
            return out
        for rid, tok in e.complete(step).tokens:
            out.setdefault(rid, []).append(tok)
    raise AssertionError("the engine never went idle")


def check_blocks(e: Engine) -> None:
    """# NOTE: every block is free or held, and its holds are the live requests holding it."""
    held = Counter(b for seq in e.seqs.values() for b in seq.blocks)
    pool = e.pool
    for b in range(pool.num_blocks):
        assert pool.refs[b] == held[b], f"block {b}: {pool.refs[b]} holds, {held[b]} holders"
        assert (b in pool.free) == (pool.refs[b] == 0)
    assert len(pool.cached) <= pool.num_blocks
    assert all(pool.hash_of[b] == h for h, b in pool.cached.items())
    assert sum(1 for h in pool.hash_of if h is not None) == len(pool.cached)


def test_a_request_gets_exactly_its_tokens_deterministically() -> None:
    a, b = engine(), engine()
    for e in (a, b):
        e.add(LlmRequest("x", list(range(40)), max_tokens=7, seed=3))
        e.add(LlmRequest("y", list(range(40)), max_tokens=5, seed=4))
    ta, tb = run(a), run(b)
    assert ta == tb
    assert [len(ta["x"]), len(ta["y"])] == [7, 5]
    assert ta["x"] != ta["y"]


def test_chunked_prefill_splits_a_prompt_by_the_token_budget() -> None:
    e = engine(budget=32)
    e.add(LlmRequest("long", list(range(100)), max_tokens=2))
    chunks = []
    while (step := e.schedule()) is not None:
        chunks += [n for _, n in step.scheduled]
        e.complete(step)
    assert chunks == [32, 32, 32, 4, 1]  # the fourth chunk finishes the prompt and samples; then one decode


def test_the_sequence_cap_and_the_token_budget_hold() -> None:
    e = engine(budget=40, max_seqs=3)
    for i in range(6):
        e.add(LlmRequest(f"r{i}", [i] * 10, max_tokens=4))
    while (step := e.schedule()) is not None:
        assert sum(n for _, n in step.scheduled) <= 40
        assert len(e.running) <= 3
        e.complete(step)


def test_a_shared_prefix_is_computed_once() -> None:
    e = engine()
    prompt = list(range(50))
    e.add(LlmRequest("a", prompt, max_tokens=1))
    run(e)
    e.add(LlmRequest("b", prompt, max_tokens=1))
    step = e.schedule()
    (seq, n), = step.scheduled
    assert seq.cached_tokens == 48 and n == 2  # 3 full blocks from the cache; the rest computed
    assert e.counters.prefix_hits == 48 and e.counters.prefix_queries == 100


def test_a_whole_cached_prompt_still_computes_its_last_token() -> None:
    e = engine()
    e.add(LlmRequest("a", list(range(32)), max_tokens=1))
    run(e)
    e.add(LlmRequest("b", list(range(32)), max_tokens=1))
    (seq, n), = e.schedule().scheduled
    assert (seq.cached_tokens, n) == (16, 16)  # the hit stops a block short: the last token must run


def test_a_request_later_in_the_same_step_finds_the_prefix_an_earlier_one_computes() -> None:
    e = engine(budget=200)
    e.add(LlmRequest("a", list(range(64)) + [1], max_tokens=1))
    e.add(LlmRequest("b", list(range(64)) + [2], max_tokens=1))
    (_, na), (seq, nb) = e.schedule().scheduled
    assert (na, seq.cached_tokens, nb) == (65, 64, 1)


def test_kv_events_name_the_blocks_a_router_computes() -> None:
    e = engine(num_blocks=4)
    prompt = list(range(40))
    e.add(LlmRequest("a", prompt, max_tokens=1))
    step = e.schedule()
    events = e.complete(step).events
    assert [h for ev in events if isinstance(ev, BlockStored) for h in ev.hashes] == block_hashes(prompt)
    e.add(LlmRequest("b", list(range(100, 164)), max_tokens=1))  # needs every block: evicts a's
    events = e.complete(e.schedule()).events
    assert {h for ev in events if isinstance(ev, BlockRemoved) for h in ev.hashes} == set(block_hashes(prompt))


def test_abort_frees_the_requests_kv_blocks() -> None:
    e = engine(num_blocks=16)
    e.add(LlmRequest("a", list(range(70)), max_tokens=50))
    e.complete(e.schedule())
    e.complete(e.schedule())
    held = list(e.seqs["a"].blocks)
    assert held and e.pool.num_free == 16 - len(held)
    assert e.abort("a")
    assert e.pool.num_free == 16 and all(e.pool.refs[b] == 0 for b in held)
    assert e.idle and e.schedule() is None and e.counters.aborted == 1
    assert not e.abort("a")


def test_an_abort_between_schedule_and_complete_produces_no_token() -> None:
    e = engine()
    e.add(LlmRequest("a", list(range(10)), max_tokens=5))
    step = e.schedule()
    e.abort("a")
    assert e.complete(step).tokens == []
    check_blocks(e)


def test_out_of_kv_the_last_running_request_is_preempted_and_later_finishes() -> None:
    e = engine(num_blocks=6, budget=64)  # 96 tokens of KV
    e.add(LlmRequest("a", [1] * 30, max_tokens=30))
    e.add(LlmRequest("b", [2] * 30, max_tokens=30))
    preempted = []
    while (step := e.schedule()) is not None:
        preempted += step.preempted
        e.complete(step)
        check_blocks(e)
    assert preempted and preempted[0] == "b"
    assert e.counters.finished == 2 and e.counters.generation_tokens == 60


def test_a_request_longer_than_the_context_is_refused_with_its_numbers() -> None:
    e = engine(max_len=100)
    with pytest.raises(RequestTooLong) as err:
        e.add(LlmRequest("a", [1] * 90, max_tokens=20))
    assert (err.value.prompt_tokens, err.value.max_tokens, err.value.max_model_len) == (90, 20, 100)
    with pytest.raises(ValueError, match="max_tokens"):
        e.add(LlmRequest("b", [1], max_tokens=0))
    assert e.idle


def test_the_step_shape_counts_decode_reads_and_prefill_work() -> None:
    e = engine(budget=64)
    e.add(LlmRequest("a", list(range(20)), max_tokens=3))
    e.complete(e.schedule())
    e.add(LlmRequest("b", list(range(100, 110)), max_tokens=1))
    step = e.schedule()
    s = step.shape
    assert (s.decode_seqs, s.kv_read, s.prefill_tokens, s.tokens, s.sampled) == (1, 21, 10, 11, 2)
    assert s.prefill_work == 10 * 5
    assert step.seconds == pytest.approx(STEP.seconds(s))


def test_step_time_interpolates_and_extends_its_table() -> None:
    shape = StepShape()
    shape.add_decode(1000)
    assert STEP.seconds(shape) == pytest.approx(2 * (0.001 + 1e-6 * 1000) + 0.001)
    assert STEP.linear_s(288) == pytest.approx(0.006)
    assert STEP.linear_s(1024) == pytest.approx(0.01 + 512 * (0.008 / 448))
    slow = STEP.scaled(compute=0.5, memory=0.25)
    assert slow.linear_s(1) == pytest.approx(0.004) and slow.linear_s(512) == pytest.approx(0.02)
    assert StepTime(layers=1, linear=((1, 0.0), (2, 0.0))).seconds(StepShape()) == 0.0


ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3), st.integers(1, 90), st.integers(1, 40)),
    st.tuples(st.just("abort"), st.integers(0, 30)),
    st.tuples(st.just("step"), st.integers(1, 4)),
), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops, num_blocks=st.integers(8, 40), budget=st.integers(16, 128), caching=st.booleans(),
       chunked=st.booleans())
def test_invariants_hold_under_any_arrivals_aborts_and_preemption(ops: list, num_blocks: int, budget: int,
                                                                  caching: bool, chunked: bool) -> None:
    max_len = min(num_blocks * 16, 256) if chunked else min(budget, num_blocks * 16)
    e = engine(num_blocks=num_blocks, budget=budget, max_seqs=6, max_len=max_len, prefix_caching=caching,
               chunked_prefill=chunked)
    prefixes = [list(range(i * 1000, i * 1000 + 64)) for i in range(4)]
    asked: dict[str, int] = {}
    got: Counter[str] = Counter()
    n = 0
    for op in ops:
        if op[0] == "add":
            _, p, plen, mt = op
            prompt = (prefixes[p] + [n] * plen)[:plen]
            if plen + mt > max_len:
                continue
            rid = f"r{n}"
            n += 1
            e.add(LlmRequest(rid, prompt, mt, seed=n))
            asked[rid] = mt
        elif op[0] == "abort":
            rid = f"r{op[1]}"
            if e.abort(rid):
                asked.pop(rid)
        else:
            for _ in range(op[1]):
                step = e.schedule()
                if step is None:
                    break
                assert sum(k for _, k in step.scheduled) <= budget
                got.update(rid for rid, _ in e.complete(step).tokens)
        check_blocks(e)
    for rid, toks in run(e).items():
        got[rid] += len(toks)
    check_blocks(e)
    assert e.pool.num_free == num_blocks
    # NOTE: no request starves: every one not aborted finishes with exactly its tokens
    assert {rid: got[rid] for rid in asked} == asked
    assert all(seq.state is not State.RUNNING for seq in e.seqs.values()) and e.idle


def test_a_preempted_request_goes_back_to_the_head_of_the_queue() -> None:
    e = engine(num_blocks=6, budget=64, max_seqs=2)
    e.add(LlmRequest("a", [1] * 30, max_tokens=30))
    e.add(LlmRequest("b", [2] * 30, max_tokens=30))
    e.add(LlmRequest("c", [3] * 10, max_tokens=2))
    while not (step := e.schedule()).preempted:
        e.complete(step)
    assert step.preempted == ["b"] and [s.req.id for s in e.waiting] == ["b", "c"]
