"""The gateway routes generative requests through each model's router, end to end against
emulated engines with the official ``openai`` client: every router by name; a request held while
its engine is full and routed once it frees; one refused with 429, ``Retry-After`` and the
router's reason; a bad priority header a 400; a client that leaves while held withdrawn; and an
emulated engine's KV events feeding precise prefix routing."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import openai
import pytest

from gateway.app import Gateway, GatewayThread
from gateway.llm.api import read_call
from gateway.llm.routing import ROUTERS, prompt_ids
from profiles.llm.kv import block_hashes
from tests.gateway.llm.conftest import SERVED, TINY, Engine, client, gateway_config
from tests.prometheus import samples

LONG = 1900  # tokens: longer than any test waits (a few ms each)


def _wait(cond, timeout: float = 10.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("router", ROUTERS)
def test_every_router_serves_completions_streams_and_chats(engine: Engine, router: str) -> None:
    with GatewayThread(gateway_config(engine.url, llm_routing={"router": router, "seed": 3})) as gw:
        c = client(gw)
        assert c.completions.create(model="llama", prompt="a b c", max_tokens=3).usage.completion_tokens == 3
        chunks = list(c.completions.create(model="llama", prompt=[5, 6, 7], max_tokens=4, stream=True))
        assert len(chunks) == 4
        chat = c.chat.completions.create(model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert chat.usage.completion_tokens == 2  # type: ignore[union-attr]
        view = next(iter(gw.llm.routers["llama"].router.replicas.values()))
        assert gw.llm.routers["llama"].router.name == router and view.outstanding == 0 and not view.draining


# ---- one engine taking one request at a time, sheddable requests never held

@pytest.fixture(scope="module")
def narrow(engine: Engine) -> Iterator[Gateway]:
    cfg = gateway_config(engine.url, llm_routing={"router": "headrace"}, flow_control={"queue": {"sheddable": 0}})
    cfg.llm_models[0].replicas[0].max_inflight = 1
    with GatewayThread(cfg) as gw:
        yield gw


def _queued(gw: Gateway) -> int:
    return gw.llm.routers["llama"].router.queued


def _metric(gw: Gateway, name: str) -> float:
    return samples(f"http://{gw.http_url}/metrics").get(name, 0.0)


def test_a_held_request_is_routed_once_its_engine_frees(engine: Engine, narrow: Gateway) -> None:
    first = client(narrow).completions.create(model="llama", prompt="hold", max_tokens=LONG, stream=True)
    next(iter(first))
    out: list = []
    later = threading.Thread(target=lambda: out.append(client(narrow).completions.create(
        model="llama", prompt="after", max_tokens=2, extra_headers={"x-slo-ttft-ms": "20000"})))
    later.start()
    _wait(lambda: _queued(narrow) == 1)
    assert _metric(narrow, 'headrace_llm_queued{model="llama"}') == 1
    time.sleep(0.1)
    assert later.is_alive()  # NOTE: held while the engine's one place is taken
    first.close()
    later.join(10)
    assert out and out[0].usage.completion_tokens == 2 and _queued(narrow) == 0


def test_a_refused_request_gets_429_retry_after_and_the_reason(engine: Engine, narrow: Gateway) -> None:
    first = client(narrow).completions.create(model="llama", prompt="hold", max_tokens=LONG, stream=True)
    next(iter(first))
    before = _metric(narrow, 'headrace_llm_refused_total{model="llama",reason="sheddable queue full"}')
    try:
        with pytest.raises(openai.RateLimitError) as e:
            client(narrow).completions.create(model="llama", prompt="x", max_tokens=1,
                                              extra_headers={"x-headrace-priority": "best-effort"})
    finally:
        first.close()
    h = e.value.response.headers
    assert h["x-headrace-reject-reason"] == "sheddable queue full" and int(h["retry-after"]) >= 1
    assert e.value.body["type"] == "RateLimitError" and "refused" in e.value.body["message"]  # type: ignore[index]
    assert _metric(narrow, 'headrace_llm_refused_total{model="llama",reason="sheddable queue full"}') == before + 1


def test_a_bad_priority_header_is_a_400(narrow: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client(narrow).completions.create(model="llama", prompt="x", max_tokens=1,
                                          extra_headers={"x-headrace-priority": "urgent"})
    assert e.value.body["param"] == "x-headrace-priority"  # type: ignore[index]


def test_a_client_that_leaves_while_held_is_withdrawn(engine: Engine, narrow: Gateway) -> None:
    first = client(narrow).completions.create(model="llama", prompt="hold", max_tokens=LONG, stream=True)
    next(iter(first))
    host, port = narrow.http_url.split(":")
    body = json.dumps({"model": "llama", "prompt": "never sent", "max_tokens": 2}).encode()
    with socket.create_connection((host, int(port))) as leaving:
        leaving.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"x-slo-ttft-ms: 20000\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
        _wait(lambda: _queued(narrow) == 1)
    _wait(lambda: _queued(narrow) == 0)  # it left: the router forgot it
    first.close()
    kv_idle = 0.0
    engine.wait_idle(kv_idle)
    view = narrow.llm.routers["llama"].router.replicas[narrow.replica_ids()["llama"][0]]
    assert view.outstanding == 0 and not narrow.llm.routers["llama"].waiting


# ---- KV events

@pytest.fixture(scope="module")
def second() -> Iterator[Engine]:
    e = Engine()
    try:
        yield e
    finally:
        e.close()


@pytest.mark.parametrize("router", ["llm-d-precise", "headrace"])
def test_kv_events_send_a_repeated_prefix_to_the_engine_that_holds_it(engine: Engine, second: Engine,
                                                                       router: str) -> None:
    replicas = [{"url": e.url, "engine": "emulated", "model": SERVED, "profile": str(TINY)} for e in (engine, second)]
    doc = {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0}, "llm_routing": {"router": router},
           "llm_models": [{"name": "llama", "slo_ttft_ms": 5000, "slo_tpot_ms": 500, "replicas": replicas}]}
    from gateway.config import parse_config

    prompt = f"{router} shares this prefix: " + "one two three four five six seven eight " * 12
    ids, _ = prompt_ids(read_call("completion", json.dumps({"model": "llama", "prompt": prompt}).encode()))
    hashes = block_hashes(ids)
    with GatewayThread(parse_config(doc)) as gw:
        r = gw.llm.routers["llama"].router

        def held() -> dict[str, int]:
            """Who holds the prompt, as the engines' events told the router."""
            if router == "llm-d-precise":
                return r.kv.match_all(hashes)  # type: ignore[attr-defined]
            return {k: n for k, n in r.index.match_all(hashes).items() if k in r.precise}  # type: ignore[attr-defined]

        c = client(gw)
        for _ in range(20):  # the first may pass before the engines' event streams are subscribed
            c.completions.create(model="llama", prompt=prompt, max_tokens=1)
            try:
                _wait(held, timeout=0.5)
                break
            except AssertionError:
                continue
        (holder, blocks), = held().items()
        assert blocks == len(hashes)
        engines = dict(zip(gw.replica_ids()["llama"], (engine, second), strict=True))
        other = next(e for rid, e in engines.items() if rid != holder)
        seen = {rid: e.gauge("vllm:prompt_tokens_total") for rid, e in engines.items()}
        for _ in range(3):
            c.completions.create(model="llama", prompt=prompt, max_tokens=1)
        assert engines[holder].gauge("vllm:prompt_tokens_total") == seen[holder] + 3 * len(ids)
        assert other.gauge("vllm:prompt_tokens_total") == seen[next(k for k in engines if k != holder)]
