"""A process that runs ``exit_on_sigterm`` stops what it started when it is terminated."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PARENT = textwrap.dedent("""
    import asyncio, subprocess, sys
    from profiles.triton.process import exit_on_sigterm, stop_group
    if sys.argv[1] == "on":
        exit_on_sigterm()
    async def main():
        child = subprocess.Popen(["sleep", "60"], start_new_session=True)
        print(child.pid, flush=True)
        try:
            await asyncio.sleep(60)
        finally:
            stop_group(child)
    asyncio.run(main())
""")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("handler", ["on", "off"])
def test_sigterm_runs_the_finally_that_stops_children(handler: str) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, handler], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, start_new_session=True)
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(signal.SIGTERM)
        rc = parent.wait(20)
        assert rc in (143, -signal.SIGTERM)
        # with the handler the parent's finally stopped the child; without it nothing did
        assert _group_alive(child) == (handler == "off")
    finally:
        parent.stdout.close()
        for pg in (child, parent.pid):
            if _group_alive(pg):
                os.killpg(pg, signal.SIGKILL)
