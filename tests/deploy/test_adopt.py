"""What a controller needs to take a running fleet over, without processes of the fleet: the
fleet's record round trip, processes it did not start, the states it refuses, and the
supervisor's restarts (real child processes, an injected sleep)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.cli import main
from deploy.operator.adopt import Foreign, gpus_from_state, gpus_to_state
from deploy.operator.controller import Controller
from deploy.operator.desired import validate
from deploy.operator.state import DirStateStore, start_time
from deploy.operator.supervisor import MAX_FAILURES, Supervisor, restart_delay
from deploy.operator.takeover import AdoptError, check_adoptable

QUICKSTART = Path(__file__).resolve().parents[2] / "deploy/examples/quickstart"


def test_a_fleet_recorded_in_the_state_reads_back_exactly(tmp_path: Path) -> None:
    _, want, base = validate([str(QUICKSTART)])
    plan, _, _ = Controller(DirStateStore(tmp_path), base)._solve_diff(want)  # noqa: SLF001
    assert gpus_from_state(json.loads(json.dumps(gpus_to_state(plan.gpus)))) == plan.gpus


def test_a_foreign_process_reads_as_running_until_it_is_gone() -> None:
    me = Foreign(os.getpid(), start_time(os.getpid()))
    assert me.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        me.wait(0.05)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = start_time(child.pid)
    child.wait()
    assert Foreign(child.pid, started).poll() == -1
    # NOTE: a pid reused by another process is not ours
    assert Foreign(os.getpid(), (start_time(os.getpid()) or 0) + 1).poll() == -1


@pytest.mark.parametrize(("state", "says"), [
    ({"running": True, "generation": 1, "observed_generation": 1}, "older headrace"),
    ({"state_version": 99, "running": True}, "version 99"),
    ({"state_version": 2, "running": False}, "no running fleet"),
    ({}, "records no fleet"),
])
def test_a_state_that_cannot_be_taken_over_says_why_and_what_to_do(state: dict, says: str) -> None:
    with pytest.raises(AdoptError, match=says):
        check_adoptable(state)


def test_adopting_a_state_written_before_adoption_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    store = DirStateStore(tmp_path)
    store.write({"running": True, "generation": 1, "observed_generation": 1, "history": [1], "processes": {}})
    assert main(["up", "--adopt", "--state-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "headrace down" in err and "older headrace" in err


def controller(tmp_path: Path, body: str) -> list[str]:
    """A stand-in controller: a python script given ``--adopt`` when restarted."""
    script = tmp_path / "ctl.py"
    script.write_text("import os, signal, sys\nadopt = '--adopt' in sys.argv\n" + body)
    return [sys.executable, str(script)]


def serving_controller(tmp_path: Path, body: str) -> list[str]:
    """A stand-in controller that records itself as serving the fleet, then runs ``body``."""
    return controller(tmp_path, "from deploy.operator.state import DirStateStore\n"
                      f"s = DirStateStore({str(tmp_path / 'state')!r})\n"
                      "s.write({**s.read(), 'running': True, 'controller_pid': os.getpid()})\n" + body)


def test_a_killed_controller_is_started_again_to_adopt_and_a_clean_exit_ends_the_supervisor(tmp_path: Path) -> None:
    store = DirStateStore(tmp_path / "state")
    delays: list[float] = []
    sup = Supervisor(store, serving_controller(tmp_path, "sys.exit(0) if adopt else os.kill(os.getpid(), "
                                                         "signal.SIGKILL)"), sleep=delays.append)
    assert sup.run() == 0
    assert delays == [restart_delay(1)]
    events = store.events()
    assert [e["kind"] for e in events] == ["ControllerRestarting"] and "SIGKILL" in events[0]["message"]


def test_a_controller_that_cannot_adopt_is_not_started_again(tmp_path: Path) -> None:
    store = DirStateStore(tmp_path / "state")
    sup = Supervisor(store, serving_controller(tmp_path, "sys.exit(2 if adopt else 1)"), sleep=lambda s: None)
    assert sup.run() == 2
    assert [e["kind"] for e in store.events()] == ["ControllerRestarting", "ControllerNotRestarted"]


def test_a_controller_that_keeps_dying_young_is_given_up_on_with_growing_delays(tmp_path: Path) -> None:
    store = DirStateStore(tmp_path / "state")
    delays: list[float] = []
    sup = Supervisor(store, serving_controller(tmp_path, "sys.exit(3)"), sleep=delays.append)
    assert sup.run() == 1
    assert delays == [restart_delay(k) for k in range(1, MAX_FAILURES + 1)] == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert store.events()[-1]["kind"] == "ControllerNotRestarted"


def test_a_replica_gone_while_the_controller_was_down_is_kept_for_the_loop_to_restart(tmp_path: Path) -> None:
    from dataclasses import asdict

    from deploy.operator.runtime import LocalRuntime
    from placement.apply.render import Endpoint
    from profiles.profile import ProfileSet

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = start_time(child.pid)
    child.wait()
    ep = Endpoint("g/gpu/m", "m", "m", "g", "gpu", 1.0, 8, 100.0, "127.0.0.1:1", "127.0.0.1:2")
    rec = {"pid": child.pid, "started": started, "repository": str(tmp_path / "repo"), "ports": [1, 2, 3],
           "log": None, "workdir": None, "endpoint": asdict(ep)}
    runtime = LocalRuntime(ProfileSet(), tmp_path / "run")
    assert runtime.adopt({"triton:g/gpu/m": rec}) == ["triton:g/gpu/m"]
    # NOTE: still the runtime's, not running: the controller's loop restarts it on its ports
    assert runtime.endpoints() == {"g/gpu/m": ep} and not runtime.alive("g/gpu/m")
    assert runtime.ex.servers["g/gpu/m"].http_port == 1


def test_a_controller_whose_up_failed_is_not_started_again(tmp_path: Path) -> None:
    store = DirStateStore(tmp_path / "state")
    store.write({"running": False, "controller_pid": None})
    delays: list[float] = []
    # NOTE: it exits 1 without having served (its up failed): no restart, no adoption of nothing
    assert Supervisor(store, controller(tmp_path, "sys.exit(1)"), sleep=delays.append).run() == 1
    assert delays == [] and store.events() == []
