"""The gateway's control channel: an operator in another process adds, lists and drains
replicas, sets generative models, reads counters, starts held models from zero and stops the
gateway, all through :class:`RemoteHandle`. Only the token's holder changes anything (401
otherwise); a bad call is a one-line 4xx, never a traceback; the channel listens on loopback
only. ``headrace serve --control-listen`` serves it beside the gateway, announces it in the
ready file, and exits 0 when asked to stop."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from deploy.cli import main as headrace
from gateway.app import Gateway
from gateway.config import parse_config
from gateway.control import ControlError, ControlServer, RemoteHandle, parse_listen
from gateway.errors import ConfigError
from gateway.handle import GatewayHandle, LocalHandle
from profiles.gateway_config import LlmModelConfig, LlmReplicaConfig
from profiles.triton.process import stop_group
from tests.gateway.test_access_log import Echo

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-token"
PROFILE = "resnet50@A100-80GB/1g.10gb"


class Down(Echo):
    """A replica nothing answers at."""

    async def model_info(self, variant: str) -> Any:
        raise OSError("connection refused")


DOWN = 9999  # the fake replicas' port that is down


def fake(protocol: str, url: str) -> Echo:
    return Down(url) if url.endswith(f":{DOWN}") else Echo(url)


def replica(port: int, rid: str | None = None) -> dict[str, Any]:
    return {"url": f"fake:{port}", "variant": "v", "profile": PROFILE, **({"id": rid} if rid else {})}


def gateway_doc(*models: tuple[str, list[dict]]) -> dict[str, Any]:
    return {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0},
            "models": [{"name": name, "slo_ms": 2000, "max_batch": 8, "replicas": reps} for name, reps in models]}


Scenario = Callable[[Gateway, RemoteHandle, list[float]], Awaitable[None]]


def on_channel(scenario: Scenario, *models: tuple[str, list[dict]]) -> None:
    """Run ``scenario`` against a gateway (fake replicas) with its control channel and a
    handle over it, all on one loop; the stops the channel asked for are listed."""
    cfg = parse_config(gateway_doc(*(models or (("m", [replica(9000, "m#1")]),))))

    async def run() -> None:
        stops: list[float] = []
        gw = Gateway(cfg, replica_factory=fake)
        await gw.start()
        server = ControlServer(gw, TOKEN, stops.append)
        async with AsyncExitStack() as stack:
            stack.push_async_callback(gw.stop)
            stack.push_async_callback(server.close)
            url = await server.start("127.0.0.1", 0)
            handle = await RemoteHandle.connect(url, TOKEN, timeout=10.0)
            stack.push_async_callback(handle.close)
            await scenario(gw, handle, stops)

    asyncio.run(run())


async def raw(handle: RemoteHandle, method: str, path: str, token: str | None = TOKEN,
              data: bytes | None = None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    body = None if data is None else io.BytesIO(data)
    async with aiohttp.ClientSession() as s, s.request(method, f"{handle.control_url}/v1/control/{path}",
                                                        data=body, headers=headers) as r:
        return r.status, json.loads(await r.text())


def test_replicas_are_added_listed_and_drained_over_the_channel() -> None:
    async def scenario(gw: Gateway, handle: RemoteHandle, stops: list[float]) -> None:
        assert (handle.http_url, handle.grpc_url, handle.pid) == (gw.http_url, gw.grpc_url, os.getpid())
        assert await handle.replicas() == {"m#1": True}
        # an id that needs quoting in a path still names its replica
        more = parse_config(gateway_doc(("m", [replica(9001, "m/2#b")])))
        await handle.add_replica(more, "m")
        assert await handle.replicas() == await LocalHandle(gw).replicas() == {"m#1": True, "m/2#b": True}
        assert (await handle.state())["models"] == {"m#1": "m", "m/2#b": "m"}  # what a takeover reads back
        gw.driver.metrics.goodput.labels(model="m").inc(3)
        seen, here = await handle.look(), await LocalHandle(gw).look()  # one call: what a controller's tick reads
        assert (seen.replicas, seen.llm) == (here.replicas, here.llm) == ({"m#1": True, "m/2#b": True}, {})
        assert seen.counters == here.counters and ("headrace_goodput_total", {"model": "m"}, 3.0) in seen.counters
        with pytest.raises(ControlError, match="already served") as e:
            await handle.add_replica(more, "m")
        assert e.value.status == 409
        assert await handle.remove_replica("m/2#b", 1.0) is True
        assert await handle.replicas() == {"m#1": True}
        with pytest.raises(ControlError, match="not served") as e:
            await handle.remove_replica("m/2#b", 1.0)
        assert e.value.status == 404
        # the last replica goes and the model stays addressable, as the operator asks
        assert await handle.remove_replica("m#1", 1.0, keep_model=True) is True
        assert await handle.replicas() == {} and "m" in gw.driver.fleet.models

    on_channel(scenario)


def test_only_the_tokens_holder_is_answered() -> None:
    async def scenario(gw: Gateway, handle: RemoteHandle, stops: list[float]) -> None:
        for token in (None, "wrong", TOKEN + "x", ""):
            status, doc = await raw(handle, "POST", "stop", token, b"{}")
            assert status == 401 and "token" in doc["error"]
        wrong = RemoteHandle(handle.control_url, "wrong")
        try:
            with pytest.raises(ControlError) as e:
                await wrong.remove_replica("m#1", 1.0)
            assert e.value.status == 401
        finally:
            await wrong.close()
        # NOTE: nothing changed: the replica serves and no stop was asked for
        assert await handle.replicas() == {"m#1": True} and stops == []

    on_channel(scenario)


def test_a_bad_call_is_a_one_line_client_error_and_changes_nothing() -> None:
    async def scenario(gw: Gateway, handle: RemoteHandle, stops: list[float]) -> None:
        cfg_doc = gateway_doc(("m", [replica(9001, "r2")]))
        calls = [
            ("POST", "replicas", b"{not json", 400),
            ("POST", "replicas", b"[1, 2]", 400),
            ("POST", "replicas", json.dumps({"config": cfg_doc, "model": "nope"}).encode(), 400),
            ("POST", "replicas", json.dumps({"config": {"models": "x"}, "model": "m"}).encode(), 400),
            ("POST", "replicas", json.dumps({"config": {**cfg_doc, "bogus": 1}, "model": "m"}).encode(), 400),
            ("DELETE", "replicas/m%231?timeout=soon", None, 400),
            ("DELETE", "replicas/m%231?timeout=-1", None, 400),
            ("DELETE", "replicas/m%231?keep_model=maybe", None, 400),
            ("GET", "cold?wait=nan", None, 400),
            ("PUT", "cold", json.dumps({"waits": {"m": "long"}}).encode(), 400),
            ("PUT", "llm/models", json.dumps({"name": "g", "slo_ttft_ms": -1, "replicas": []}).encode(), 400),
            ("POST", "stop", json.dumps({"drain_timeout": "never"}).encode(), 400),
            ("POST", "replicas", b"x" * (8 << 20 | 1), 413),
            ("GET", "nowhere", None, 404),
            ("PATCH", "state", None, 405),
        ]
        for method, path, body, want in calls:
            status, doc = await raw(handle, method, path, data=body)
            assert (status, path) == (want, path) and "\n" not in doc["error"] and "Traceback" not in doc["error"]
        with pytest.raises(ControlError, match="'nope' is not in the config") as e:
            await handle.add_replica(parse_config(cfg_doc), "nope")
        assert e.value.status == 400
        assert await handle.replicas() == {"m#1": True} and stops == []

    on_channel(scenario)


def test_a_replica_the_gateway_cannot_reach_is_refused_with_the_reason() -> None:
    async def scenario(gw: Gateway, handle: RemoteHandle, stops: list[float]) -> None:
        with pytest.raises(ControlError, match="refused: connection refused") as e:
            await handle.add_replica(parse_config(gateway_doc(("m", [replica(DOWN, "r9")]))), "m")
        assert e.value.status == 409 and await handle.replicas() == {"m#1": True}

    on_channel(scenario)


def test_counters_are_the_gateways_own_samples() -> None:
    async def scenario(gw: Gateway, handle: RemoteHandle, stops: list[float]) -> None:
        assert await infer(gw, "m") == 200
        samples = await handle.counters()
        assert samples == await LocalHandle(gw).counters()
        assert samples and all(name.endswith("_total") for name, _, _ in samples)
        assert any(value >= 1 and labels.get("model") == "m" for _, labels, value in samples)

    on_channel(scenario)


async def infer(gw: Gateway, model: str) -> int:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    async with aiohttp.ClientSession() as s, s.post(f"http://{gw.http_url}/v2/models/{model}/infer", json=body,
                                                    timeout=aiohttp.ClientTimeout(total=10)) as r:
        await r.read()
        return r.status


def test_a_request_for_a_model_at_zero_starts_it_through_the_channel() -> None:
    async def scenario(gw: Gateway, handle: RemoteHandle, stops: list[float]) -> None:
        started: list[str] = []
        ask = asyncio.Event()

        def starter(model: str) -> None:
            started.append(model)
            ask.set()

        await handle.hold_cold({"cold": 10.0}, starter)
        request = asyncio.create_task(infer(gw, "cold"))
        await asyncio.wait_for(ask.wait(), 5)
        assert started == ["cold"] and not request.done()  # held, not refused
        await handle.add_replica(parse_config(gateway_doc(("cold", [replica(9100, "cold#1")]))), "cold")
        # NOTE: the held request goes on once the operator's replica serves
        assert await asyncio.wait_for(request, 5) == 200
        assert started == ["cold"]

    on_channel(scenario, ("m", [replica(9000, "m#1")]), ("cold", []))


def test_the_cold_poll_answers_what_was_asked_since_the_last_call_or_nothing_in_time() -> None:
    async def scenario(gw: Gateway, handle: RemoteHandle, stops: list[float]) -> None:
        assert (await raw(handle, "PUT", "cold", data=b'{"waits": {"a": 1, "b": 2.5}}'))[0] == 200
        assert gw.driver.cold is not None and gw.driver.cold.waits == {"a": 1.0, "b": 2.5}
        t0 = time.monotonic()
        assert await raw(handle, "GET", "cold?wait=0.2") == (200, {"models": []})
        assert time.monotonic() - t0 >= 0.2
        waiting = asyncio.create_task(raw(handle, "GET", "cold?wait=5"))
        await asyncio.sleep(0.05)
        gw.driver.cold.starter("b")
        gw.driver.cold.starter("a")
        assert await asyncio.wait_for(waiting, 2) == (200, {"models": ["b", "a"]})
        assert await raw(handle, "GET", "cold?wait=0") == (200, {"models": []})

    on_channel(scenario)


def test_generative_models_are_set_served_and_dropped() -> None:
    async def scenario(gw: Gateway, handle: RemoteHandle, stops: list[float]) -> None:
        model = LlmModelConfig(name="g", replicas=[])
        await handle.set_llm_model(model)
        await handle.add_llm_replica(model, LlmReplicaConfig(url="http://127.0.0.1:1", id="g-e1"))
        assert await handle.llm_replicas() == await LocalHandle(gw).llm_replicas()
        assert set(await handle.llm_replicas()) == {"g-e1"}
        with pytest.raises(ControlError, match="still has engines") as e:
            await handle.drop_llm_model("g")
        assert e.value.status == 409
        assert await handle.remove_replica("g-e1", 1.0) is True
        await handle.drop_llm_model("g")
        assert await handle.llm_replicas() == {} and "g" not in gw.llm.models

    on_channel(scenario)


def test_stop_is_answered_then_asked_of_the_serving_process() -> None:
    async def scenario(gw: Gateway, handle: RemoteHandle, stops: list[float]) -> None:
        await handle.stop(2.5, wait=False)
        await asyncio.sleep(0.01)
        assert stops == [2.5]

    on_channel(scenario)


def test_the_channel_listens_on_loopback_only() -> None:
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:7000") == ("::1", 7000)
    for bad in ("0.0.0.0:9000", "10.1.2.3:9000", "example.com:9000", "127.0.0.1", "127.0.0.1:99999", ":80"):
        with pytest.raises(ConfigError, match="--control-listen"):
            parse_listen(bad)

    async def run() -> None:
        with pytest.raises(ConfigError, match="not a loopback address"):
            await ControlServer(None, TOKEN, print).start("0.0.0.0", 0)  # type: ignore[arg-type]

    asyncio.run(run())


def test_the_remote_handle_is_a_gateway_handle() -> None:
    handle: GatewayHandle = RemoteHandle("http://127.0.0.1:1", TOKEN)
    assert handle.http_url == ""


@pytest.mark.parametrize(("flags", "says"), [
    (["--control-listen", "0.0.0.0:0"], "not a loopback address"),
    (["--control-listen", "127.0.0.1:0"], "HEADRACE_CONTROL_TOKEN"),
    (["--control-listen", "127.0.0.1:0", "--control-token-file", "/nonexistent/token"], "cannot read"),
    (["--control-token-file", "t"], "needs --control-listen"),
    (["--control-listen", "127.0.0.1:0", "--workers", "2"], "not supported yet"),
])
def test_bad_control_flags_are_one_line_and_exit_2(flags: list[str], says: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("HEADRACE_CONTROL_TOKEN", raising=False)
    (tmp_path / "gw.yaml").write_text(json.dumps(gateway_doc(("m", [replica(9000)]))))
    assert headrace(["serve", "--config", str(tmp_path / "gw.yaml"), *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_headrace_serve_is_driven_and_stopped_over_its_control_channel(tmp_path: Path) -> None:
    (tmp_path / "gw.yaml").write_text(json.dumps({**gateway_doc(("m", [])), "drain_timeout_s": 5}))
    (tmp_path / "token").write_text(f"  {TOKEN}\n")
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "serve", "--config", str(tmp_path / "gw.yaml"),
         "--control-listen", "127.0.0.1:0", "--control-token-file", str(tmp_path / "token"),
         "--ready-file", str(ready)],
        cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate(timeout=5)[0] if proc.poll() is not None else "no ready file"
        doc = json.loads(ready.read_text())
        assert set(doc) == {"http", "grpc", "control", "pid"} and doc["pid"] == proc.pid
        assert doc["control"].startswith("http://127.0.0.1:")

        async def drive() -> None:
            handle = await RemoteHandle.connect(doc["control"], TOKEN, timeout=10.0)
            try:
                assert (handle.http_url, handle.grpc_url, handle.pid) == (doc["http"], doc["grpc"], proc.pid)
                assert await handle.replicas() == {}
                assert all(n.endswith("_total") for n, _, _ in await handle.counters())
                with pytest.raises(ControlError) as e:  # nothing listens there
                    await handle.add_replica(parse_config(gateway_doc(("m", [
                        {"url": "127.0.0.1:1", "variant": "v", "profile": PROFILE}]))), "m")
                assert e.value.status == 409
                await handle.stop(0.5)  # returns once the gateway is gone
            finally:
                await handle.close()

        asyncio.run(drive())
        out = proc.communicate(timeout=5)[0]
        assert proc.returncode == 0, out
        assert "draining (up to 0.5s)" in out and "stopped" in out
        assert not ready.exists()  # NOTE: a stopped gateway leaves no stale address behind
    finally:
        if proc.poll() is None:
            stop_group(proc, grace=5)
