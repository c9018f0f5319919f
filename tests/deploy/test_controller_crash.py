"""The controller's own crash, live on the quickstart pool (one emulated A100 and the host):
the gateway is a process of its own and keeps answering; the supervisor starts the controller
again, which takes the running fleet over (same pids, same generation and history); ``status``
works from the state meanwhile and ``down`` stops everything. When nothing restarts it (its
supervisor died too), ``status`` says so, and ``down`` or ``up`` stop what it left."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from deploy.operator.state import same_process
from tests.operator_harness import (
    TritonLoad,
    deployment,
    operator_up,
    pool,
    versioned_model,
    write_docs,
)

pytestmark = pytest.mark.integration


def scaler() -> dict:
    variant = {"name": "scaler-v1", "artifact": {"uri": "models/scaler", "version": 1}, "profile": "scaler-v1.yaml"}
    return deployment("scaler", 50, 100, source="artifact", variants=[variant])


def running(st: dict) -> list[tuple[int, int | None]]:
    """The recorded processes (and the supervisor) still running."""
    procs = [(p["pid"], p.get("started")) for p in (st.get("processes") or {}).values()]
    if st.get("supervisor_pid"):
        procs.append((st["supervisor_pid"], st.get("supervisor_started")))
    return [p for p in procs if same_process(*p)]


@pytest.mark.slow  # a live acceptance run of 25-65 s: .ci/run runs it as a later step
def test_kill_9_of_the_controller_under_load_loses_nothing_and_it_comes_back_adopting_the_fleet(
        tmp_path: Path, capsys) -> None:
    from deploy.cli import main

    versioned_model(tmp_path)
    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1), scaler())
    with operator_up(tmp_path, docs) as op:
        st, pids = op.state(), op.pids()
        assert "gateway" in pids and any(k.startswith("triton:") for k in pids)
        load = TritonLoad(op.http, "scaler", 35.0, 14.0)  # 70% of the deployment's rate
        load.start()
        time.sleep(2.0)
        sup = st["supervisor_pid"]
        os.kill(sup, signal.SIGSTOP)  # the supervisor waits while the outage is looked at
        try:
            os.kill(st["controller_pid"], signal.SIGKILL)
            op.wait_for("controller gone", lambda: not same_process(st["controller_pid"], st["controller_started"]))
            capsys.readouterr()
            # NOTE: status during the outage exits 0 and says the controller is down
            assert main(["status", "--state-dir", str(op.state_dir)]) == 0
            out = capsys.readouterr().out
            assert f"the controller (pid {st['controller_pid']}) is not running" in out
            assert "starting it again" in out
        finally:
            os.kill(sup, signal.SIGCONT)
        let_go = time.monotonic()

        def back() -> bool:
            now = op.state()
            return (now.get("running") and now["controller_pid"] != st["controller_pid"]
                    and same_process(now["controller_pid"], now["controller_started"])
                    and any(e["kind"] == "Adopted" for e in op.status()["events"]))

        # NOTE: the controller is back within 10 s, by itself
        assert op.wait_for("controller back", back, timeout=60) - let_go <= 10.0
        load.join(120)
        bad = [a for a in load.answers if a.factor is None]
        # NOTE: the gateway kept answering: no error, none unanswered
        assert not bad and load.unanswered == 0 and len(load.answers) > 400, bad[:5]
        # NOTE: every process adopted as it ran (the gateway, Triton, the emulated GPU)
        assert op.pids() == pids
        status = op.status()
        assert status["generation"] == 1 and status["observedGeneration"] == 1
        assert op.condition("scaler", "Ready") == "True"
        assert op.state()["history"] == st["history"]
        kinds = [e["kind"] for e in status["events"]]
        assert kinds.index("Applied") < kinds.index("ControllerRestarting") < kinds.index("Adopted")
        assert main(["down", "--state-dir", str(op.state_dir)]) == 0
        # NOTE: down afterwards leaves no process
        assert not running({**st, "processes": {**st["processes"], **op.state().get("processes", {})}})


def test_with_its_supervisor_dead_too_status_and_down_work_from_the_state(tmp_path: Path, capsys) -> None:
    from deploy.cli import main

    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1, host=False), deployment("resnet50", 100, 100))
    with operator_up(tmp_path, docs) as op:
        st = op.state()
        os.kill(st["supervisor_pid"], signal.SIGKILL)
        os.kill(st["controller_pid"], signal.SIGKILL)
        # both gone before status reads them: a SIGKILL is delivered, not waited for
        op.wait_for("controller and supervisor gone", lambda: not any(
            same_process(st[f"{who}_pid"], st.get(f"{who}_started")) for who in ("controller", "supervisor")))
        capsys.readouterr()
        assert main(["status", "--state-dir", str(op.state_dir)]) == 0
        out = capsys.readouterr().out
        assert "is not running; nothing restarts it" in out and "generation 1" in out
        assert main(["down", "--state-dir", str(op.state_dir)]) == 0
        assert "was down" in capsys.readouterr().out
        # NOTE: down leaves no process behind, from the state alone (the gateway process included)
        assert not running(st) and op.state()["running"] is False


@pytest.mark.slow  # a live acceptance run of 25-65 s: .ci/run runs it as a later step
def test_up_on_the_state_of_a_dead_controller_stops_what_it_left_and_serves(tmp_path: Path) -> None:
    from deploy.cli import main

    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1, host=False), deployment("resnet50", 100, 100))
    with operator_up(tmp_path, docs) as op:
        st = op.state()
        os.kill(st["supervisor_pid"], signal.SIGKILL)
        os.kill(st["controller_pid"], signal.SIGKILL)  # the gateway, Triton and the GPU run on
        op.wait_for("controller gone", lambda: not same_process(st["controller_pid"], st["controller_started"]))
        assert len(running(st)) == len(st["processes"])
        assert main(["up", "--detach", "--state-dir", str(op.state_dir), "-f", str(docs), "--timeout", "240"]) == 0
        # NOTE: what the dead controller left is stopped (matched by pid and start time), never adopted blindly
        assert not running(st)
        assert op.condition("resnet50", "Ready") == "True"
        assert op.state()["controller_pid"] != st["controller_pid"]


@pytest.mark.slow  # a live acceptance run: .ci/run runs it as a later step
def test_a_gateway_process_killed_under_load_comes_back_on_its_ports_and_replicas_keep_their_pids(
        tmp_path: Path) -> None:
    versioned_model(tmp_path)
    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1), scaler())
    with operator_up(tmp_path, docs) as op:
        st, pids = op.state(), op.pids()
        os.killpg(pids["gateway"], signal.SIGKILL)
        killed = time.monotonic()

        def back() -> bool:
            now = op.state()
            return now["processes"].get("gateway", {}).get("pid") not in (None, pids["gateway"]) and any(
                e["kind"] == "Restarted" and "gateway" in e["message"] for e in op.status()["events"])

        assert op.wait_for("gateway back", back, timeout=60) - killed <= 10.0
        # NOTE: the same address for clients, every replica still serving from its own process
        assert op.state()["gateway"] == st["gateway"]
        load = TritonLoad(op.http, "scaler", 35.0, 3.0)
        load.start()
        load.join(60)
        assert load.unanswered == 0 and all(a.factor is not None for a in load.answers) and len(load.answers) > 90
        assert {k: v for k, v in op.pids().items() if k != "gateway"} == {
            k: v for k, v in pids.items() if k != "gateway"}
        assert op.condition("scaler", "Ready") == "True"
