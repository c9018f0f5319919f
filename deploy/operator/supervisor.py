"""The controller's supervisor: ``headrace up --detach`` runs the controller under it, and when
the controller dies (killed, crashed) it starts it again, which takes the running fleet over
(:mod:`deploy.operator.adopt`): the gateway kept serving meanwhile, no replica is restarted,
and the generation, history and events are the ones the state records.

``python -m deploy.operator.supervisor --state-dir DIR -- CONTROLLER ARGV...``. A controller
that exits 0 (``headrace down``, SIGTERM) ends the supervisor; SIGTERM or SIGINT to the
supervisor goes on to the controller, which stops everything it runs. A restart waits
:func:`restart_delay` (0.5 s, doubling while the controller keeps dying young, at most 30 s);
a controller that refuses to take the fleet over (exit 2: a state it cannot read) or dies
:data:`MAX_FAILURES` times in a row young is not started again, with an event that says so;
nor is one whose ``up`` failed before it served (it said why, and stopped what it began).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from deploy.operator.state import DirStateStore, StateError, start_time
from deploy.operator.status import Event

RESTART_FIRST_S = 0.5
RESTART_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0  # a controller that lived this long starts its restart delays over
MAX_FAILURES = 5


def restart_delay(failures: int) -> float:
    """Seconds before a controller that died ``failures`` times in a row young starts again."""
    return min(RESTART_MAX_S, RESTART_FIRST_S * 2 ** max(0, failures - 1))


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


class Supervisor:
    """Runs ``argv`` (the controller) and starts it again with ``--adopt`` when it dies."""

    def __init__(self, store: DirStateStore, argv: Sequence[str], *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, wall: Callable[[], float] = time.time) -> None:
        self.store = store
        self.argv = list(argv)
        self.clock, self.sleep, self.wall = clock, sleep, wall
        self.child: subprocess.Popen | None = None
        self.stopping = False

    def event(self, kind: str, message: str) -> None:
        try:
            self.store.record_event(Event(self.wall(), "", kind, message).to_dict())
        except OSError:
            pass
        print(f"headrace supervisor: {kind}: {message}", file=sys.stderr, flush=True)

    def on_signal(self, signum: int, _frame: object) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def record(self, pid: int | None) -> None:
        """The supervisor's own pid and start time in the state (None: it has ended)."""
        try:
            st = self.store.read()
        except StateError:
            return
        st.update(supervisor_pid=pid, supervisor_started=None if pid is None else start_time(pid))
        self.store.write(st)

    def was_serving(self, pid: int) -> bool:
        """Whether the controller ``pid`` died serving: the state still says it runs the fleet
        (a controller whose ``up`` failed, or that stopped, recorded that nothing runs)."""
        try:
            st = self.store.read()
        except StateError:
            return False
        return bool(st.get("running")) and st.get("controller_pid") == pid

    def run(self) -> int:
        failures, adopt = 0, False
        while True:
            began = self.clock()
            with open(self.store.log_path, "ab") as log:
                self.child = subprocess.Popen(self.argv + (["--adopt"] if adopt else []), stdout=log,
                                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            rc = self.child.wait()
            if self.stopping or rc == 0:
                return 0 if rc in (0, -signal.SIGTERM, -signal.SIGINT) else rc
            if not self.was_serving(self.child.pid):  # its up failed: it said why, and stopped what it began
                return rc
            if rc == 2 and adopt:
                self.event("ControllerNotRestarted", f"the controller (pid {self.child.pid}) could not take the "
                           f"fleet over ({describe_exit(rc)}; see {self.store.log_path}); headrace down stops what "
                           "the state records")
                return rc
            failures = 1 if self.clock() - began >= HEALTHY_AFTER_S else failures + 1
            if failures > MAX_FAILURES:
                self.event("ControllerNotRestarted", f"the controller died {MAX_FAILURES} times in a row within "
                           f"{HEALTHY_AFTER_S:g} s of starting; see {self.store.log_path}")
                return 1
            delay = restart_delay(failures)
            self.event("ControllerRestarting", f"the controller (pid {self.child.pid}) {describe_exit(rc)}; "
                       f"starting it again in {delay:g} s to take the running fleet over")
            self.sleep(delay)
            if self.stopping:
                return 0
            adopt = True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.operator.supervisor")
    p.add_argument("--state-dir", required=True)
    p.add_argument("controller", nargs=argparse.REMAINDER, help="-- then the controller's command line")
    args = p.parse_args(argv)
    cmd = args.controller[1:] if args.controller[:1] == ["--"] else args.controller
    if not cmd:
        p.error("no controller command after --")
    sup = Supervisor(DirStateStore(args.state_dir), cmd)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, sup.on_signal)
    sup.record(os.getpid())
    try:
        return sup.run()
    finally:
        sup.record(None)


if __name__ == "__main__":
    sys.exit(main())
