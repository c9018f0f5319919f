"""The baseline generative routers (gateway.policy.llm.baselines): each pinned to the behaviour its
original documents, on a fake fleet in virtual time (no engine, no clock)."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.policy.llm.baselines import BASELINES, make
from gateway.policy.llm.baselines.common import BlockIndex, min_max
from gateway.policy.llm.baselines.dynamo import Dynamo
from gateway.policy.llm.baselines.least_request import LeastRequest
from gateway.policy.llm.baselines.llmd import LlmD
from gateway.policy.llm.baselines.pow2 import PowerOfTwo
from gateway.policy.llm.baselines.round_robin import RoundRobin
from gateway.policy.llm.baselines.sglang import SglangCacheAware
from gateway.policy.llm.types import (
    EngineLoad,
    Refuse,
    ReplicaSpec,
    Route,
    RouterBase,
    TokenRequest,
)
from profiles.llm.kv import BlockStored, block_hashes


def fleet(r: RouterBase, n: int = 2, **spec_kw: object) -> RouterBase:
    for i in range(n):
        r.add_replica(ReplicaSpec(f"r{i}", **spec_kw))  # type: ignore[arg-type]
    return r


def req(i: int | str, prompt: int | list[int] = 256, out: int = 50) -> TokenRequest:
    tokens = list(range(prompt)) if isinstance(prompt, int) else prompt
    return TokenRequest(f"q{i}", len(tokens), out, block_hashes(tokens))


def distinct(i: int, n: int = 256) -> list[int]:
    """A prompt sharing nothing with any other."""
    return [10**7 * (i + 1) + k for k in range(n)]


def route(r: RouterBase, request: TokenRequest, now: float = 0.0) -> str:
    (d,) = r.submit(request, now)
    assert isinstance(d, Route)
    return d.replica


def occupy(r: RouterBase, replica: str, n: int, tag: str = "x") -> None:
    """``n`` open requests at ``replica`` (routed, not finished)."""
    for k in range(n):
        r.routed(req(f"{tag}{replica}-{k}", distinct(hash((tag, replica, k)) % 10**6, 16)), r.replicas[replica], 0.0)


# ---- the registry
def test_every_baseline_builds_by_name_and_routes():
    for name in BASELINES:
        r = fleet(make(name, seed=3), 3)
        assert route(r, req(0)) in r.replicas, name
    with pytest.raises(ValueError, match="dynamo, dynamo-approx, least-request"):
        make("nginx")


def test_baselines_refuse_only_when_no_replica_can_take_a_request():
    r = fleet(make("sglang"), 2, max_inflight=1)
    route(r, req(0))
    route(r, req(1))
    (d,) = r.submit(req(2), 0.0)
    assert isinstance(d, Refuse)


# ---- round robin (production-stack)
def test_round_robin_cycles_in_replica_id_order_and_keeps_counting_when_the_set_changes():
    r = RoundRobin()
    for rid in ("c", "a", "b"):
        r.add_replica(ReplicaSpec(rid))
    assert [route(r, req(i)) for i in range(4)] == ["a", "b", "c", "a"]
    r.drain_replica("a")
    assert route(r, req(4)) == "b"  # request 4 of the cycle: 4 % 2 over [b, c]


# ---- least request (Envoy)
def test_least_request_takes_the_fewest_open_and_spreads_ties_evenly():
    r = fleet(LeastRequest(seed=1), 3)
    occupy(r, "r0", 2)
    occupy(r, "r1", 1)
    assert route(r, req(0)) == "r2"  # r2 had none
    picks = Counter()
    for seed in range(300):
        r = fleet(LeastRequest(seed=seed), 3)
        picks[route(r, req(0))] += 1
    assert set(picks) == {"r0", "r1", "r2"} and min(picks.values()) > 70  # ~100 each


def test_least_request_frees_a_replica_when_its_request_finishes():
    r = fleet(LeastRequest(), 2)
    occupy(r, "r0", 1)
    occupy(r, "r1", 2)
    r.on_finish("qxr1-0", 1.0)
    r.on_finish("qxr1-1", 1.0)
    assert route(r, req(0), 1.0) == "r1"


# ---- power of two (Ray Serve)
def test_pow2_never_picks_the_longer_of_its_two_samples():
    r = fleet(PowerOfTwo(seed=7), 5)
    for i, n in enumerate((0, 3, 1, 5, 2)):
        occupy(r, f"r{i}", n)
    shadow = PowerOfTwo(seed=7)  # the same draws, read through its public draw()
    for i in range(40):
        cands = [v for v in r.replicas.values() if not v.full]
        pair = [(v.id, v.outstanding) for v in shadow.draw(cands)]
        chosen = route(r, req(i))
        assert chosen in dict(pair) and dict(pair)[chosen] == min(n for _, n in pair)
        if len(pair) == 2 and pair[0][1] == pair[1][1]:
            assert chosen == pair[0][0]  # a tie goes to the first drawn


def test_pow2_skips_replicas_at_max_ongoing_requests():
    r = fleet(PowerOfTwo(seed=0, max_ongoing_requests=2), 3)
    occupy(r, "r0", 2)
    occupy(r, "r1", 2)
    assert {route(r, req(i)) for i in range(2)} == {"r2"}
    assert route(r, req(9)) in r.replicas  # all full: not held, the shorter of a draw


# ---- SGLang cache-aware
def sglang(**kw: object) -> SglangCacheAware:
    return fleet(SglangCacheAware(**kw), 2)  # type: ignore[return-value]


def test_sglang_routes_a_shared_prefix_to_its_holder_while_loads_are_balanced():
    r = sglang()
    home = route(r, req(0, 512))
    other = "r1" if home == "r0" else "r0"
    occupy(r, home, 63)  # 64 open there: max - min = 64 is not > 64, still balanced
    assert route(r, req(1, 512)) == home
    occupy(r, home, 1, tag="y")  # 66 - 0 > 64 and 66 > 0 * 1.5: imbalanced
    assert route(r, req(2, 512)) == other  # the least loaded, prefix or not


def test_sglang_needs_both_thresholds_to_call_loads_imbalanced():
    r = sglang()
    home = route(r, req(0, 512))
    other = "r1" if home == "r0" else "r0"
    occupy(r, other, 100)
    occupy(r, home, 80, tag="y")  # diff 20 <= 64 and 101 < 80 * 1.5: balanced, cache decides
    assert route(r, req(1, 512)) == home


def test_sglang_below_the_cache_threshold_picks_the_smallest_tree():
    r = sglang()
    big = route(r, req(0, distinct(0, 1024)))
    small = "r1" if big == "r0" else "r0"
    route(r, req(1, distinct(1, 64)))  # the smaller tree, by 1024 - 64 tokens
    # 256 of 1024 tokens cached on `big` is a 0.25 match, not above 0.3
    prompt = distinct(0, 256) + distinct(9, 768)
    assert route(r, req(2, prompt)) == small
    prompt = distinct(0, 512) + distinct(8, 512)  # 0.5 > 0.3
    assert route(r, req(3, prompt)) == big


def test_sglang_evicts_least_recently_used_leaves_each_interval():
    r = sglang(eviction_interval_secs=10.0, max_tree_size=32)  # 2 blocks per tree
    route(r, req(0, 64), now=0.0)  # starts the eviction clock: first pass due at 10 s
    t = r.trees[r.where["q0"]]
    assert t.size == 64
    route(r, req(1, 64), now=9.9)
    assert t.size == 64 or r.trees[r.where["q1"]].size == 64
    route(r, req(2, 16), now=10.0)
    assert all(tree.size <= 32 for tree in r.trees.values())
    assert t.match(block_hashes(list(range(64)))) == 2  # the leaves went first: the prefix stays


# ---- llm-d
def llmd(**kw: object) -> LlmD:
    return fleet(LlmD(**kw), 2)  # type: ignore[return-value]


def test_llmd_approximate_prefix_score_counts_the_model_hash_and_caps_at_256_blocks():
    r = llmd()
    home = route(r, req(0, 64))  # 4 blocks
    s = r.approx_scores(req(1, list(range(64)) + distinct(1, 64)), list(r.replicas.values()))
    assert s[home] == pytest.approx(5 / 9)  # model + 4 of model + 8
    assert r.approx_scores(req(2, 15), list(r.replicas.values())) == {"r0": 0.0, "r1": 0.0}  # under a block
    assert len(r.prompt_hashes(req(3, 16 * 300))) == 257


def test_llmd_weights_combine_prefix_3_queue_2_kv_2():
    r = llmd()
    home = route(r, req(0, 256))
    other = "r1" if home == "r0" else "r0"
    r.on_load(home, EngineLoad(waiting=4), 0.0)
    r.on_load(other, EngineLoad(waiting=0), 0.0)
    s = r.scores(req(1, 256), list(r.replicas.values()))
    assert s == {home: pytest.approx(3 * 1 + 2 * 0 + 2 * 1), other: pytest.approx(3 * 0 + 2 * 1 + 2 * 1)}
    assert route(r, req(1, 256)) == home  # a full prefix (3) outweighs the longest queue (2)
    r.on_load(home, EngineLoad(waiting=4, kv_usage=0.9), 0.0)
    assert route(r, req(2, 256)) == other  # 3 + 0 + 0.2 < 0 + 2 + 2


def test_llmd_max_score_picker_breaks_ties_at_random():
    picks = Counter(route(llmd(seed=s), req(0)) for s in range(200))
    assert set(picks) == {"r0", "r1"} and min(picks.values()) > 60


def test_llmd_precise_scores_the_longest_cached_prefix_normalised_over_holders():
    r = fleet(LlmD(precise=True), 3)
    h = block_hashes(list(range(128)))  # 8 blocks
    r.on_kv_events("r0", [BlockStored(tuple(h[:8]), 0)], 0.0)
    r.on_kv_events("r1", [BlockStored(tuple(h[:2]), 0)], 0.0)
    cands = list(r.replicas.values())
    assert r.precise_scores(req(0, 128), cands) == {"r0": 1.0, "r1": 0.0, "r2": 0.0}
    assert route(r, req(0, 128)) == "r0"
    r.on_kv_events("r2", [BlockStored(tuple(h[:8]), 0)], 0.0)
    assert r.precise_scores(req(1, 128), cands) == {"r0": 1.0, "r1": 0.0, "r2": 1.0}
    assert r.precise_scores(req(2, distinct(0)), cands) == {"r0": 0.0, "r1": 0.0, "r2": 0.0}


# ---- Dynamo
def test_dynamo_prefers_overlap_until_the_decode_load_outweighs_it():
    r = fleet(Dynamo(), 2)
    prompt = list(range(512))  # 32 blocks
    r.on_kv_events("r0", [BlockStored(tuple(block_hashes(prompt)), 0)], 0.0)
    # r0: 0 prefill blocks + 32 new; r1: 32 prefill + 32 new
    assert r.logits(req(0, prompt), list(r.replicas.values()), 0.0) == {"r0": 32.0, "r1": 64.0}
    assert route(r, req(0, prompt)) == "r0"
    r.on_first_token("q0", 0.1)  # prefill done; its 32 blocks stay active (and shared with the next)
    assert route(r, req(1, prompt), 0.2) == "r0"  # 0 + 32 against 32 + 32
    for k in range(2, 10):
        route(r, req(f"o{k}", distinct(k, 64)), 0.3)  # unrelated prompts fill both
    lg = r.logits(req(2, prompt), list(r.replicas.values()), 0.4)
    assert lg["r0"] < lg["r1"]
    occupy(r, "r0", 40)  # 40 more active blocks on r0 (and their prefill)
    lg = r.logits(req(3, prompt), list(r.replicas.values()), 0.5)
    assert lg["r0"] > lg["r1"]
    assert route(r, req(3, prompt), 0.5) == "r1"


def test_dynamo_counts_unfinished_prefill_and_frees_on_finish():
    r = fleet(Dynamo(), 1)
    route(r, req(0, 160))  # 10 blocks, 160 tokens to prefill
    lg = r.logits(req(1, distinct(1, 160)), list(r.replicas.values()), 0.0)
    assert lg == {"r0": (160 + 160) / 16 + (10 + 10)}
    r.on_first_token("q0", 1.0)
    assert r.logits(req(1, distinct(1, 160)), list(r.replicas.values()), 1.0) == {"r0": 160 / 16 + 20}
    r.on_finish("q0", 2.0)
    assert r.logits(req(1, distinct(1, 160)), list(r.replicas.values()), 2.0) == {"r0": 10 + 10}


def test_dynamo_ties_go_to_the_smaller_index():
    r = fleet(Dynamo(), 2)
    r.on_kv_events("r0", [BlockStored(tuple(block_hashes(distinct(5))), 0)], 0.0)
    assert route(r, req(0, distinct(6))) == "r1"  # equal costs; r1 holds fewer blocks


def test_dynamo_approximate_counts_routed_prompts_for_the_ttl():
    r = fleet(Dynamo(approximate=True), 2)
    home = route(r, req(0, 320), 0.0)
    r.on_finish("q0", 1.0)
    assert route(r, req(1, 320), 50.0) == home  # routed 50 s ago: counted as cached
    r.on_finish("q1", 51.0)
    lg = r.logits(req(2, 320), list(r.replicas.values()), 169.9)
    assert lg[home] < lg["r1" if home == "r0" else "r0"]
    lg = r.logits(req(2, 320), list(r.replicas.values()), 170.0)  # 120 s after its last routing
    assert lg["r0"] == lg["r1"]


def test_dynamo_temperature_samples_the_costlier_worker_sometimes():
    def picks(temperature: float) -> Counter[str]:
        c: Counter[str] = Counter()
        for seed in range(200):
            r = fleet(Dynamo(seed=seed, router_temperature=temperature), 2)
            occupy(r, "r0", 1)
            c[route(r, req(0))] += 1
        return c
    assert picks(0.0) == Counter({"r1": 200})
    hot = picks(1.0)
    assert 0 < hot["r0"] < hot["r1"]


# ---- shared helpers
def test_min_max_scales_to_the_spread_and_is_neutral_when_flat():
    assert min_max({"a": 2, "b": 4, "c": 3}) == {"a": 0.0, "b": 1.0, "c": 0.5}
    assert min_max({"a": 2, "b": 4}, lower_is_better=True) == {"a": 1.0, "b": 0.0}
    assert min_max({"a": 7, "b": 7}) == {"a": 1.0, "b": 1.0}


def test_block_index_lru_ttl_and_prune():
    ix = BlockIndex(capacity=3)
    ix.add("a", [1, 2, 3], 0.0)
    ix.add("a", [1, 4], 1.0)  # 2 is now the least recently routed
    assert ix.match("a", [1, 2]) == 1 and ix.holders(3) == {"a"} and ix.size("a") == 3
    ix = BlockIndex(ttl=10.0)
    ix.add("a", [1, 2], 0.0)
    ix.add("a", [1], 5.0)
    ix.expire(10.0)
    assert ix.match("a", [1, 2]) == 1 and not ix.holders(2)
    ix = BlockIndex(max_total=4, prune_to=0.5)
    ix.add("a", [1, 2], 0.0)
    ix.add("b", [3, 4], 1.0)
    ix.add("a", [5], 2.0)  # 5 > 4: pruned to 2, oldest first
    assert ix.total == 2 and ix.holders(4) == {"b"} and ix.holders(5) == {"a"}
