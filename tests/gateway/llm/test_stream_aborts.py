"""A stream ends at the engine as soon as its client is gone: a client that disconnects mid-stream,
one that stops reading (past the write timeout), and a replica removed before its streams end
(after they drain, up to the bound) each leave the engine with nothing running or waiting and its
KV cache back to its idle use; other clients stream on meanwhile."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time

import openai
import pytest

from gateway.app import Gateway, GatewayThread
from tests.gateway.llm.conftest import Engine, client, gateway_config
from tests.prometheus import samples

LONG = 1900  # tokens: longer than any test waits (a few ms each)


def _aborted(gw: Gateway, reason: str) -> float:
    return samples(f"http://{gw.http_url}/metrics").get(
        f'headrace_llm_aborted_total{{model="llama",reason="{reason}"}}', 0.0)


def _wait(cond, timeout: float = 10.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_client_leaving_mid_stream_aborts_at_the_engine(engine: Engine, gateway: Gateway) -> None:
    kv_idle = engine.gauge("vllm:kv_cache_usage_perc")
    before = _aborted(gateway, "disconnect")
    stream = client(gateway).completions.create(model="llama", prompt="tell a long story", max_tokens=LONG,
                                                stream=True)
    it = iter(stream)
    for _ in range(3):
        next(it)
    assert engine.gauge("vllm:num_requests_running") == 1
    assert engine.gauge("vllm:kv_cache_usage_perc") > kv_idle
    stream.close()
    engine.wait_idle(kv_idle)
    _wait(lambda: _aborted(gateway, "disconnect") == before + 1)


def test_a_client_that_stops_reading_is_aborted_after_the_write_timeout(engine: Engine, gateway: Gateway) -> None:
    kv_idle = engine.gauge("vllm:kv_cache_usage_perc")
    before = _aborted(gateway, "write_timeout")
    host, port = gateway.http_url.split(":")
    body = json.dumps({"model": "llama", "prompt": "a slow reader", "max_tokens": LONG, "stream": True}).encode()
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # small, and never read
    slow.connect((host, int(port)))
    try:
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        _wait(lambda: engine.gauge("vllm:num_requests_running") == 1)
        started = time.monotonic()
        # NOTE: while the slow reader holds its stream, another client streams as usual
        chunks = list(client(gateway).completions.create(model="llama", prompt="hi", max_tokens=5, stream=True))
        assert len(chunks) == 5
        engine.wait_idle(kv_idle, timeout=20)
        # the stream ran at least the write timeout (1 s) past the point its client stopped reading
        assert time.monotonic() - started >= 1.0
        _wait(lambda: _aborted(gateway, "write_timeout") == before + 1)
    finally:
        slow.close()


def _stream_in_thread(gw: Gateway, max_tokens: int, out: list) -> threading.Thread:
    def run() -> None:
        try:
            chunks = list(client(gw).completions.create(model="llama", prompt="drain me", max_tokens=max_tokens,
                                                        stream=True))
            out.append(len(chunks))
        except Exception as e:  # noqa: BLE001  (the test reads what happened)
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_removing_a_replica_lets_its_streams_finish(engine: Engine) -> None:
    thread = GatewayThread(gateway_config(engine.url))
    with thread as gw:
        rid = gw.replica_ids()["llama"][0]
        out: list = []
        t = _stream_in_thread(gw, 40, out)
        _wait(lambda: engine.gauge("vllm:num_requests_running") == 1)
        drained = thread.call(gw.remove_replica(rid, 20.0))
        t.join(10)
        assert drained and out == [40]  # every token came before the replica went
        assert gw.replica_ids()["llama"] == []
        with pytest.raises(openai.APIStatusError) as e:  # no replica serves it now
            client(gw).completions.create(model="llama", prompt="x", max_tokens=1)
        assert e.value.status_code == 503
        # its deployment gone, the model is no longer addressable
        thread.call(_drop(gw, "llama"))
        with pytest.raises(openai.NotFoundError):
            client(gw).completions.create(model="llama", prompt="x", max_tokens=1)
        assert "llama" not in [m.id for m in client(gw).models.list()]


async def _drop(gw: Gateway, model: str) -> None:
    gw.llm.drop_model(model)


def test_a_model_with_engines_is_not_dropped(engine: Engine) -> None:
    with GatewayThread(gateway_config(engine.url)) as gw, pytest.raises(ValueError, match="still has engines"):
        gw.llm.drop_model("llama")


def test_a_stream_past_the_drain_bound_is_aborted_at_the_engine(engine: Engine) -> None:
    kv_idle = engine.gauge("vllm:kv_cache_usage_perc")
    thread = GatewayThread(gateway_config(engine.url))
    with thread as gw:
        rid = gw.replica_ids()["llama"][0]
        out: list = []
        t = _stream_in_thread(gw, LONG, out)
        _wait(lambda: engine.gauge("vllm:num_requests_running") == 1)
        assert thread.call(gw.remove_replica(rid, 0.3)) is False
        t.join(10)
        # the client is told its stream broke off (an error event), not left waiting
        assert len(out) == 1 and isinstance(out[0], openai.APIError), out
        engine.wait_idle(kv_idle)
        assert _aborted(gw, "removed") == 1


def test_a_replica_added_while_serving_takes_requests(engine: Engine) -> None:
    from profiles.gateway_config import LlmModelConfig, LlmReplicaConfig

    thread = GatewayThread(gateway_config(engine.url))
    with thread as gw:
        model = LlmModelConfig(name="llama-too", replicas=[])
        rid = thread.call(_add(gw, model, LlmReplicaConfig(url=engine.url, engine="emulated", model="tiny")))
        assert gw.replica_ids()["llama-too"] == [rid]
        out = client(gw).completions.create(model="llama-too", prompt="hi", max_tokens=2)
        assert out.model == "llama-too" and out.usage.completion_tokens == 2


async def _add(gw: Gateway, model, replica) -> str:  # noqa: ANN001  (runs on the gateway's loop)
    return gw.add_llm_replica(model, replica)


def test_an_engine_dying_mid_stream_ends_the_stream_with_an_error_event() -> None:
    dying = Engine()
    try:
        with GatewayThread(gateway_config(dying.url)) as gw:
            stream = iter(client(gw).completions.create(model="llama", prompt="x", max_tokens=LONG, stream=True))
            next(stream)
            dying.proc.kill()
            with pytest.raises(openai.APIError, match="broke off"):
                for _ in stream:
                    pass
            _wait(lambda: _aborted(gw, "engine") == 1)
            with pytest.raises(openai.APIStatusError) as e:  # and the next request is a 503, not a 500
                client(gw).completions.create(model="llama", prompt="x", max_tokens=1)
            assert e.value.status_code == 503
    finally:
        dying.close()


def test_streams_over_tls_and_a_disconnect_there_aborts_too(engine: Engine, tmp_path) -> None:  # noqa: ANN001
    from tests.pki import make_pki

    pki = make_pki(tmp_path / "pki")
    kv_idle = engine.gauge("vllm:kv_cache_usage_perc")
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    with GatewayThread(gateway_config(engine.url, tls=tls)) as gw:
        c = openai.OpenAI(base_url=f"https://localhost:{gw.http_port}/v1", api_key="none", max_retries=0,
                          http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(pki.ca))))
        assert len(list(c.completions.create(model="llama", prompt="hi", max_tokens=4, stream=True))) == 4
        stream = c.completions.create(model="llama", prompt="tls", max_tokens=LONG, stream=True)
        next(iter(stream))
        stream.close()
        engine.wait_idle(kv_idle)
        _wait(lambda: _aborted_tls(gw) == 1)


def _aborted_tls(gw: Gateway) -> float:
    """Streams aborted by a disconnect, read in-process (/metrics over TLS needs the CA too)."""
    text = gw.driver.render_metrics().decode()
    line = next((x for x in text.splitlines() if x.startswith('headrace_llm_aborted_total{model="llama",'
                                                               'reason="disconnect"}')), None)
    return 0.0 if line is None else float(line.rsplit(" ", 1)[1])


def _open_at(gw: Gateway, rid: str) -> int:
    """Requests the model's router has open at replica ``rid``."""
    return gw.llm.routers["llama"].router.replicas[rid].outstanding


def test_the_engines_load_is_read_from_its_metrics(engine: Engine) -> None:
    with GatewayThread(gateway_config(engine.url)) as gw:
        rid = gw.replica_ids()["llama"][0]
        rep, view = gw.llm.find(rid), gw.llm.routers["llama"].router.replicas[rid]
        stream = client(gw).completions.create(model="llama", prompt="load", max_tokens=LONG, stream=True)
        next(iter(stream))
        _wait(lambda: rep.load.running == 1 and rep.load.kv_usage > 0)  # type: ignore[union-attr]
        # NOTE: the router reads the same load the gateway read
        assert rep.reachable and _open_at(gw, rid) == 1 and view.load.running == 1  # type: ignore[union-attr]
        stream.close()
        _wait(lambda: rep.load.running == 0 and _open_at(gw, rid) == 0)  # type: ignore[union-attr]


def test_past_max_inflight_on_every_replica_a_request_is_held_then_refused_at_its_ttft_slo(engine: Engine) -> None:
    cfg = gateway_config(engine.url)
    cfg.llm_models[0].replicas[0].max_inflight = 1
    with GatewayThread(cfg) as gw:
        rid = gw.replica_ids()["llama"][0]
        stream = client(gw).completions.create(model="llama", prompt="hold", max_tokens=LONG, stream=True)
        next(iter(stream))
        started = time.monotonic()
        with pytest.raises(openai.RateLimitError) as e:
            client(gw).completions.create(model="llama", prompt="x", max_tokens=1, extra_headers={"x-slo-ttft-ms": "300"})
        assert time.monotonic() - started >= 0.3  # held for its TTFT SLO, then refused
        assert int(e.value.response.headers["retry-after"]) >= 1
        assert "TTFT" in e.value.response.headers["x-headrace-reject-reason"]
        stream.close()
        _wait(lambda: _open_at(gw, rid) == 0)
        assert client(gw).completions.create(model="llama", prompt="x", max_tokens=1).usage.completion_tokens == 1
