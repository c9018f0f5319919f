"""Gateway actors on Ray (``headrace up --ray --gateways 1``): the replicas are split between the
controller's gateway and the actor; a killed gateway actor fails its in-flight requests at once,
clients are served by the other gateway, and Ray brings the actor back on its ports."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

pytest.importorskip("ray")

from deploy.cli import main  # noqa: E402
from deploy.operator.cli import ensure_down  # noqa: E402
from tests.operator_harness import Running, deployment  # noqa: E402
from tests.ray_harness import local_cluster, ray_pool, write  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                               "data": [float(i) for i in range(16)]}]}).encode()


@pytest.fixture(scope="module")
def op(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("gw")
    with local_cluster(tmp) as cluster:
        docs = write(tmp / "d.yaml", ray_pool(), deployment("resnet50", 3500, 100))
        state = tmp / "state"
        try:
            assert main(["up", "-f", str(docs), "--ray", cluster.address, "--gateways", "1",
                         "--state-dir", str(state), "--tick", "0.5", "--timeout", "300"]) == 0
            yield Running(state)
        finally:
            ensure_down(state)


def infer(url: str, timeout: float = 5.0) -> None:
    """One KServe v2 JSON inference; raises on any failure (connection, status, timeout)."""
    host, port = url.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        c.request("POST", "/v2/models/resnet50/infer", BODY, {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {data[:200]!r}")
    finally:
        c.close()


@dataclass(eq=False)
class Client(threading.Thread):
    """Sends to ``first`` until a request fails, then to ``other``; records what happened."""

    first: str
    other: str
    stop: threading.Event
    failed: list[tuple[float, float, str]] = field(default_factory=list)  # (sent, failed, error) on first
    recovered: float | None = None  # when the first request to ``other`` was answered
    served_first: int = 0

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, daemon=True)

    def run(self) -> None:
        url = self.first
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                infer(url)
            except Exception as e:  # noqa: BLE001  (recorded; the test judges it)
                if url == self.first:
                    self.failed.append((sent, time.monotonic(), type(e).__name__))
                    url = self.other
                continue
            if url == self.first:
                self.served_first += 1
            elif self.recovered is None:
                self.recovered = time.monotonic()


def test_replicas_are_split_between_the_gateways(op: Running) -> None:
    (actor,) = op.status()["ray"]["gateways"]
    mine = {r["id"] for r in op.deployment("resnet50")["replicas"] if r["serving"] and r["gateway"] == 0}
    assert len(actor["replicas"]) == 1 and len(mine) == 1 and set(actor["replicas"]).isdisjoint(mine), (actor, mine)
    infer(actor["http"])
    infer(op.http)
    # NOTE: a replica the actor serves is serving: the deployment is Ready, not Degraded
    d = op.deployment("resnet50")
    assert all(r["serving"] for r in d["replicas"]), d["replicas"]
    assert {r["id"] for r in d["replicas"] if r["gateway"] == 1} == set(actor["replicas"]), d["replicas"]
    conds = {c["type"]: c["status"] for c in d["conditions"]}
    assert conds["Ready"] == "True" and conds["Degraded"] == "False", d["conditions"]


def test_a_killed_gateway_actor_fails_its_in_flight_requests_and_the_other_gateway_serves(op: Running) -> None:
    import ray  # noqa: PLC0415

    (before,) = op.status()["ray"]["gateways"]
    stop = threading.Event()
    clients = [Client(before["http"], op.http, stop) for _ in range(6)]
    for c in clients:
        c.start()
    time.sleep(2.0)
    assert all(c.served_first > 0 for c in clients)
    killed = time.monotonic()
    ray.kill(ray.get_actor("headrace-gateway:1"), no_restart=False)
    time.sleep(3.0)
    stop.set()
    for c in clients:
        c.join(10)
    assert not any(c.is_alive() for c in clients), "a client hangs"
    failed = [f for c in clients for f in c.failed]
    in_flight = [f for f in failed if f[2] != "ConnectionRefusedError"]  # the rest were sent after the kill
    print(f"requests in flight on the killed gateway: {len(in_flight)} of {len(failed)} failed: {failed}")
    # NOTE: each client saw exactly one error (its request in flight), promptly, and no timeout
    assert all(len(c.failed) == 1 for c in clients), [c.failed for c in clients]
    assert all(at - killed < 1.0 and err != "TimeoutError" for _, at, err in failed), failed
    assert in_flight, failed  # six clients in a closed loop always have requests in flight
    # NOTE: the other gateway answers each client's next request within 1 s of the kill
    assert all(c.recovered is not None and c.recovered - killed < 1.0 for c in clients), \
        [None if c.recovered is None else c.recovered - killed for c in clients]
    op.wait_for("the gateway actor back", lambda: (op.status()["ray"]["gateways"] or [{}])[0].get("starts") == 2,
                timeout=60)
    (after,) = op.status()["ray"]["gateways"]
    assert after["http"] == before["http"] and after["replicas"] == before["replicas"]
    infer(after["http"])
