"""The gateway as a child process: ``headrace serve --config`` started in a process group of
its own and waited on until it is ready (the benchmarks and end-to-end tests run it so)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from profiles.triton.process import stop_group, wait_http_ready


def start_serve(cfg_path: Path, http: str, log_path: Path, *, prefix: Sequence[str] = (),
                timeout: float = 60.0) -> subprocess.Popen:
    """``headrace serve --config cfg_path`` in a process group of its own, its output in
    ``log_path``; returns once it is ready on ``http`` (``host:port``). If it exits or is not
    ready in time it is stopped and ``RuntimeError`` says why, with the log's tail. ``prefix``
    goes between the interpreter and ``-m deploy.cli`` (e.g. a profiler's ``-m pyinstrument ...``).
    Stop it with :func:`~profiles.triton.process.stop_group`."""
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, *prefix, "-m", "deploy.cli", "serve", "--config", str(cfg_path), "--log-level", "WARNING"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    why = wait_http_ready(http, proc, timeout)
    if why is not None:
        stop_group(proc)
        raise RuntimeError(f"the gateway {why}; gateway log:\n{log_path.read_text(errors='replace')[-4000:]}")
    return proc
