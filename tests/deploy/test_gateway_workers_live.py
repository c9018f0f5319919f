"""The operator's gateway as two workers (``Gateway`` ``spec.workers: 2``), live on the
quickstart pool (one emulated A100 and the host): both listen on one address, each serves
its own replicas of the model, both answer a ``tritonclient`` load; a worker killed under
load is back on the same address with the replicas it held while the other answers on; a
new version rolls out two successors at once (``max_surge: 2``) with every answer given; the
controller's crash takes both workers over as they run; ``down`` leaves no process."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from deploy.operator.state import DirStateStore, control_token, same_process
from tests.deploy.test_controller_crash import running, scaler
from tests.operator_harness import (
    GATEWAY,
    TritonLoad,
    deployment,
    operator_up,
    pool,
    versioned_model,
    write_docs,
)

pytestmark = pytest.mark.integration


def control(state_dir: Path, rec: dict[str, Any], path: str) -> Any:
    token = control_token(DirStateStore(state_dir)).read_text().strip()
    req = urllib.request.Request(f"{rec['control']}/v1/control/{path}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310  (loopback)
        return json.loads(resp.read())


def served(state_dir: Path, rec: dict[str, Any]) -> dict[str, str]:
    """The classic replicas a worker serves: id -> model."""
    return control(state_dir, rec, "state")["models"]


def requests_of(state_dir: Path, rec: dict[str, Any]) -> float:
    return sum(v for name, labels, v in control(state_dir, rec, "counters")
               if name == "headrace_variant_requests_total" and labels.get("model") == "scaler")


@pytest.mark.slow  # a live acceptance run of about a minute: .ci/run runs it as a later step
def one_request(target: str) -> None:
    """One scaler request on a connection of its own (a fresh client)."""
    import numpy as np
    import tritonclient.http as th

    client = th.InferenceServerClient(target, network_timeout=30.0)
    x = th.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.arange(1, 5, dtype=np.float32).reshape(1, 4))
    try:
        client.infer("scaler", [x])
    finally:
        client.close()


def test_two_gateway_workers_share_the_address_split_the_replicas_and_survive_crashes(tmp_path: Path) -> None:
    from deploy.cli import main

    versioned_model(tmp_path)
    gateway = {**GATEWAY, "spec": {**GATEWAY["spec"], "workers": 2}}
    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1), scaler(), gateway)
    with operator_up(tmp_path, docs) as op:
        st, pids = op.state(), op.pids()
        recs = [st["processes"]["gateway"], st["processes"]["gateway-1"]]
        assert recs[0]["http"] == recs[1]["http"] == st["gateway"]["http"] and recs[0]["pid"] != recs[1]["pid"]
        # NOTE: every replica in exactly one worker, and each worker holds the model
        homes = [served(op.state_dir, r) for r in recs]
        tritons = {k for k in pids if k.startswith("triton:")}
        assert all("scaler" in h.values() for h in homes), homes
        assert not homes[0].keys() & homes[1].keys()
        assert len(homes[0]) + len(homes[1]) >= 2
        before = [requests_of(op.state_dir, r) for r in recs]
        load = TritonLoad(op.http, "scaler", 35.0, 3.0)
        load.start()
        load.join(60)
        assert load.unanswered == 0 and all(a.factor is not None for a in load.answers) and len(load.answers) > 90
        # NOTE: the kernel deals connections, not requests, and one client at 35 req/s may hold a single
        # connection: 16 clients of one connection each reach both workers but with odds 2^-15
        for _ in range(16):
            one_request(op.http)
        after = [requests_of(op.state_dir, r) for r in recs]
        # NOTE: the kernel spread the clients' connections: both workers answered
        assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)

        os.killpg(recs[1]["pid"], signal.SIGKILL)
        killed = time.monotonic()
        load = TritonLoad(op.http, "scaler", 35.0, 4.0)  # the other worker answers meanwhile
        load.start()

        def back() -> bool:
            now = op.state()["processes"]
            return now.get("gateway-1", {}).get("pid") not in (None, recs[1]["pid"]) and any(
                e["kind"] == "Restarted" and "gateway worker 1" in e["message"] for e in op.status()["events"])

        assert op.wait_for("worker 1 back", back, timeout=60) - killed <= 10.0
        load.join(60)
        assert load.unanswered == 0
        new = op.state()["processes"]
        # NOTE: only the dead worker restarted, on the same address, with the replicas it held
        assert new["gateway"]["pid"] == recs[0]["pid"] and new["gateway-1"]["http"] == recs[1]["http"]
        assert [served(op.state_dir, new[k]) for k in ("gateway", "gateway-1")] == homes
        load = TritonLoad(op.http, "scaler", 35.0, 3.0)
        load.start()
        load.join(60)
        assert load.unanswered == 0 and all(a.factor is not None for a in load.answers), load.answers[:3]

        # a new version of the model, two successors at once (max_surge 2), under load
        v = {"name": "scaler-v1", "artifact": {"uri": "models/scaler", "version": 2}, "profile": "scaler-v1.yaml"}
        v2 = write_docs(tmp_path / "v2.yaml", pool(a100s=1), gateway, deployment(
            "scaler", 50, 100, source="artifact", variants=[v], rollout={"max_surge": 2}))
        load = TritonLoad(op.http, "scaler", 35.0, 16.0)
        load.start()
        time.sleep(1.0)
        began = time.monotonic()
        assert main(["apply", "--state-dir", str(op.state_dir), "-f", str(v2), "--wait"]) == 0
        done = time.monotonic()
        load.join(60)
        bad = [a for a in load.answers if a.factor is None]
        # NOTE: nothing failed or went unanswered; after apply --wait, only version 2 (x3) answers
        assert not bad and load.unanswered == 0, bad[:5]
        after = [a.factor for a in load.answers if a.sent > done + 0.5]
        assert len(after) > 20 and set(after) == {3.0}, (done - began, after)
        homes = [served(op.state_dir, op.state()["processes"][k]) for k in ("gateway", "gateway-1")]
        assert all("scaler" in h.values() for h in homes) and not homes[0].keys() & homes[1].keys(), homes
        tritons = {k for k in op.pids() if k.startswith("triton:")}

        st = op.state()
        os.kill(st["controller_pid"], signal.SIGKILL)

        def adopted() -> bool:
            now = op.state()
            return (now.get("running") and now["controller_pid"] != st["controller_pid"]
                    and same_process(now["controller_pid"], now["controller_started"])
                    and any(e["kind"] == "Adopted" for e in op.status()["events"]))

        op.wait_for("controller back", adopted, timeout=60)
        # NOTE: both workers and every replica taken over as they ran
        assert {k: v for k, v in op.pids().items() if k in ("gateway", "gateway-1") or k in tritons} == {
            k: v["pid"] for k, v in st["processes"].items() if k in ("gateway", "gateway-1") or k in tritons}
        assert [served(op.state_dir, st["processes"][k]) for k in ("gateway", "gateway-1")] == homes
        assert op.condition("scaler", "Ready") == "True"
        assert main(["down", "--state-dir", str(op.state_dir)]) == 0
        # NOTE: down leaves no process
        assert not running({**st, "processes": {**st["processes"], **op.state().get("processes", {})}})
