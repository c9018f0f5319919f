"""headrace's token-level router (gateway.policy.llm.router): unit tests on its decisions and
property tests on its invariants, driven by a fake fleet in virtual time (no engine, no clock)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.policy.llm.flow import FlowQueue, FlowSettings
from gateway.policy.llm.prefix import PrefixIndex
from gateway.policy.llm.router import RouterSettings, SloRouter
from gateway.policy.llm.types import Band, Refuse, ReplicaSpec, Route, TokenRequest, band_of
from profiles.llm.kv import BlockRemoved, BlockStored, block_hashes
from profiles.llm.profile import REFERENCE, load_llm_profiles

PROFILE = next(p for p in load_llm_profiles(REFERENCE / "llama-3.1-8b-instruct-h100-80gb.yaml")
               if p.name == "llama-3.1-8b-instruct-bf16@H100-80GB/gpu")


def spec(i: int, **kw: object) -> ReplicaSpec:
    cfg = PROFILE.engine_config()
    args = dict(step_time=PROFILE.step_time, num_blocks=cfg.num_blocks, max_num_seqs=cfg.max_num_seqs,
                max_num_batched_tokens=cfg.max_num_batched_tokens)
    args.update(kw)
    return ReplicaSpec(f"r{i}", **args)  # type: ignore[arg-type]


def router(n: int = 2, **kw: object) -> SloRouter:
    r = SloRouter(RouterSettings(**kw))  # type: ignore[arg-type]
    for i in range(n):
        r.add_replica(spec(i))
    return r


def req(i: int, prompt: list[int] | int = 1000, out: int = 100, ttft: float = 2.0, tpot: float = 0.05,
        band: Band = Band.STANDARD, tenant: str = "") -> TokenRequest:
    tokens = list(range(prompt)) if isinstance(prompt, int) else prompt
    return TokenRequest(f"q{i}", len(tokens), out, block_hashes(tokens), ttft, tpot, band, tenant)


def test_bands_map_from_the_kserve_classes():
    assert band_of("guaranteed") is Band.STANDARD and band_of("best-effort") is Band.SHEDDABLE
    assert band_of("Critical") is Band.CRITICAL
    with pytest.raises(ValueError, match="unknown priority"):
        band_of("urgent")


def test_a_repeated_prefix_goes_where_it_is_cached_until_the_queue_there_costs_more():
    r = router(2)
    shared = list(range(6144))
    first = r.submit(req(0, shared + [10**6 + k for k in range(1200)]), 0.0)
    assert isinstance(first[0], Route)
    home = first[0].replica
    second = r.submit(req(1, shared + [2 * 10**6 + k for k in range(1200)]), 0.0)
    assert second[0].replica == home  # its 6k cached tokens save more than the one request queued costs
    # a pile of long uncached prompts on the home replica: the next shared-prefix request leaves
    for k in range(2, 12):
        r.routed(req(k, [3 * 10**6 + 10**4 * k + j for j in range(8000)]), r.replicas[home], 0.0)
        r.models[home].route(req(k, 8000), 8000, 0.3 * k, 0.0)
    third = r.submit(req(20, shared + [4 * 10**6 + k for k in range(1200)]), 0.0)
    assert third[0].replica != home


def test_a_request_that_cannot_make_its_ttft_even_alone_is_refused_at_once():
    r = router(1)
    d = r.submit(req(0, 100_000, ttft=0.5), 0.0)
    assert isinstance(d[0], Refuse) and "cannot be met" in d[0].reason and d[0].retry_after >= 1


def test_held_until_capacity_frees_then_routed():
    small = ReplicaSpec("s", step_time=PROFILE.step_time, num_blocks=100, max_num_seqs=2)
    r = SloRouter()
    r.add_replica(small)
    a = r.submit(req(0, 1000, 100), 0.0)
    b = r.submit(req(1, [10**6 + k for k in range(1000)], 100), 0.0)
    assert isinstance(a[0], Route) and b == []  # KV for the second does not fit: held
    assert r.queued == 1 and r.wake is not None and r.wake < 2.0
    r.on_first_token("q0", 0.1)
    r.on_finish("q0", 0.9)
    routed = r.poll(0.9)
    assert [type(d) for d in routed] == [Route] and r.queued == 0


def test_a_held_request_is_refused_before_its_deadline_passes():
    r = SloRouter()
    r.add_replica(ReplicaSpec("s", step_time=PROFILE.step_time, num_blocks=100))
    r.submit(req(0, 1000, 500), 0.0)
    assert r.submit(req(1, [10**6 + k for k in range(1000)], 100, ttft=1.0), 0.0) == []
    wake = r.wake
    assert wake is not None and 0.9 < wake < 1.0
    out = r.poll(wake)
    assert isinstance(out[0], Refuse) and "no longer" in out[0].reason and r.queued == 0


def test_sheddable_is_refused_while_a_higher_band_waits():
    r = SloRouter()
    r.add_replica(ReplicaSpec("s", step_time=PROFILE.step_time, num_blocks=100))
    r.submit(req(0, 1000, 500), 0.0)
    assert r.submit(req(1, 1000, 100, band=Band.CRITICAL), 0.0) == []
    d = r.submit(req(2, 100, 10, band=Band.SHEDDABLE), 0.0)
    assert isinstance(d[0], Refuse) and d[0].reason.startswith("shed")


def test_a_cached_prefix_takes_no_new_kv():
    small = ReplicaSpec("s", step_time=PROFILE.step_time, num_blocks=100, max_num_seqs=8)
    r = SloRouter()
    r.add_replica(small)
    assert isinstance(r.submit(req(0, 1000, 100), 0.0)[0], Route)  # 69 blocks
    assert isinstance(r.submit(req(1, 1000, 100), 0.0)[0], Route)  # the same prompt: only its tail and output


def test_a_withdrawn_request_is_forgotten():
    r = SloRouter()
    r.add_replica(ReplicaSpec("s", step_time=PROFILE.step_time, num_blocks=100))
    r.submit(req(0, 1000, 500), 0.0)
    r.submit(req(1, 1000, 100), 0.0)
    assert r.withdraw("q1") and r.queued == 0 and not r.withdraw("q1")
    r.on_finish("never-seen", 1.0)  # harmless


def test_without_an_engine_model_it_balances_open_requests():
    r = SloRouter()
    r.add_replica(ReplicaSpec("a"))
    r.add_replica(ReplicaSpec("b"))
    seen = [r.submit(req(i, 64), 0.0)[0].replica for i in range(4)]  # type: ignore[union-attr]
    assert sorted(seen) == ["a", "a", "b", "b"]


def test_prefix_index_bounds_memory_and_follows_events():
    ix = PrefixIndex(4)
    ix.add("a", [1, 2, 3])
    ix.add("b", [1, 2, 9])
    assert ix.match_all([1, 2, 3, 4]) == {"a": 3, "b": 2}
    ix.add("a", [5, 6])  # evicts the least recently used, 1: the chain breaks there
    assert ix.blocks("a") == 4 and ix.match("a", [1, 2]) == 0
    ix.apply("c", [BlockStored((1, 2), 0), BlockRemoved((2,))])
    assert ix.match_all([1, 2]) == {"b": 2, "c": 1}
    ix.drop("b")
    assert ix.match_all([1, 2]) == {"c": 1}


def test_kv_events_make_the_index_precise():
    r = router(2)
    tokens = list(range(4096))
    hashes = block_hashes(tokens)
    r.on_kv_events("r1", [BlockStored(tuple(hashes), 0)], 0.0)
    d = r.submit(req(0, tokens + [99] * 10), 0.0)
    assert d[0].replica == "r1"


# ---- properties, on a fake fleet: each routed request's first token and finish come after
# random delays


class Fleet:
    def __init__(self, r: SloRouter) -> None:
        self.r = r
        self.events: list[tuple[float, int, str, str]] = []  # (time, order, kind, request id)
        self.routed: dict[str, float] = {}
        self.refused: dict[str, float] = {}
        self.n = 0

    def carry(self, decisions: list, now: float, delays: dict[str, tuple[float, float]]) -> None:
        for d in decisions:
            rid = d.request.id
            assert rid not in self.routed and rid not in self.refused, "decided twice"
            if isinstance(d, Route):
                self.routed[rid] = now
                first, rest = delays[rid]
                self.n += 1
                self.events.append((now + first, self.n, "first", rid))
                self.events.append((now + first + rest, self.n, "finish", rid))
            else:
                self.refused[rid] = now

    def check_held(self, now: float) -> None:
        for held in self.r.flow.ids.values():
            assert held.ttft_deadline > now, "a held request outlived its TTFT deadline"


arrivals = st.lists(st.tuples(st.floats(0, 0.5), st.integers(16, 20_000), st.integers(1, 400),
                              st.sampled_from(list(Band)), st.sampled_from(["a", "b", "c"]),
                              st.floats(0.01, 3.0), st.floats(0.01, 20.0)), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(arrivals, st.integers(1, 3))
def test_every_request_is_decided_once_and_none_waits_past_its_deadline(items, n):
    r = SloRouter()
    for i in range(n):
        r.add_replica(ReplicaSpec(f"r{i}", step_time=PROFILE.step_time, num_blocks=3000, max_num_seqs=8))
    f = Fleet(r)
    now = 0.0
    delays = {}
    pending = []
    for i, (gap, plen, out, band, tenant, first, rest) in enumerate(items):
        now += gap
        q = req(i, plen, out, ttft=1.0, band=band, tenant=tenant)
        delays[q.id] = (first, rest)
        pending.append((now, q))
    k = 0
    t = 0.0
    while k < len(pending) or f.events or r.wake is not None:
        nxt = min(pending[k][0] if k < len(pending) else math.inf,
                  min(f.events)[0] if f.events else math.inf,
                  r.wake if r.wake is not None else math.inf)
        assert nxt >= t
        t = nxt
        if k < len(pending) and pending[k][0] <= t:
            f.carry(r.submit(pending[k][1], t), t, delays)
            k += 1
        while f.events and min(f.events)[0] <= t:
            f.events.sort()
            _, _, kind, rid = f.events.pop(0)
            (r.on_first_token if kind == "first" else r.on_finish)(rid, t)
        f.carry(r.poll(t), t, delays)
        f.check_held(t)
    assert set(f.routed) | set(f.refused) == set(delays)
    assert not set(f.routed) & set(f.refused)
    assert r.queued == 0 and not r.where


def test_tenant_shares_converge_under_contention():
    """Two tenants keep the one replica's queue full, one sending prompts 4x as long: the
    router's routed tokens per tenant (VTC's service) stay within one request's cost of even."""
    q = FlowQueue(FlowSettings())
    served = {"a": 0.0, "b": 0.0}
    n = 0
    for _ in range(200):
        for tenant, plen in (("a", 400), ("b", 1600)):
            n += 1
            q.push(TokenRequest(f"{tenant}{n}", plen, 100, (), 1e9, 1.0, Band.STANDARD, tenant))
        head = next(q.order())
        q.remove(head)
        q.charge(head)
        served[head.tenant] += head.prompt_len + 2 * head.max_tokens
    assert abs(served["a"] - served["b"]) <= 1600 + 200


def test_an_unreachable_replica_takes_nothing_and_coming_back_does_not_undo_a_drain():
    r = SloRouter()
    r.add_replica(ReplicaSpec("a"))
    r.add_replica(ReplicaSpec("b"))
    r.set_reachable("a", False)
    assert {r.submit(req(i, 64), 0.0)[0].replica for i in range(3)} == {"b"}  # type: ignore[union-attr]
    r.drain_replica("a")
    r.set_reachable("a", True)
    assert {r.submit(req(i, 64), 0.0)[0].replica for i in range(3, 6)} == {"b"}  # type: ignore[union-attr]
