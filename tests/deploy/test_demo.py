"""The README's main job runs end to end: headrace up, load reports, status, down, nothing left."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest


@pytest.mark.integration
def test_demo_plans_serves_and_reports():
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "demo", "--duration", "3", "--rate", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-3000:]
    assert "headrace up" in out and "generation 1" in out
    flat = " ".join(out.split())  # the report may wrap at any space
    m = re.search(r"attainment ([\d.]+)% within 100 ms \| goodput ([\d.]+)/s of ([\d.]+)/s offered.*"
                  r"errors (\d+)", flat)
    assert m, out[-3000:]
    # NOTE: every request got an answer: no transport errors, and goodput is real traffic
    assert int(m.group(4)) == 0
    assert float(m.group(2)) > 0
    # the real-model phase: trained variants with measured accuracy, served through the gateway
    assert re.search(r"held-out accuracy: (digits-\w+ [\d.]+%,? ?){3}", flat)
    d = re.findall(r"attainment ([\d.]+)% within 50 ms .*? errors (\d+)", flat)
    assert d and int(d[-1][1]) == 0, out[-3000:]
    # the report breaks answers down by the variant that served them
    assert re.search(r"digits ?/ ?digits-(medium|large)", flat), out[-3000:]  # accuracy floor 0.97
    # the generative phase: the openai client streamed from the emulated LLM through the gateway
    assert "llama-8b: 20 streams through the gateway" in flat, out[-3000:]
    row = r"[^\w%]+([\d.]+)[^\w%]+([\d.]+)[^\w%]+{}[^\w%]+(\d+)%"  # p50, p90, SLO, within SLO
    assert re.search("TTFT" + row.format(500), flat) and re.search("TPOT" + row.format(50), flat), out[-3000:]
    assert re.search(r"attainment \(both SLOs\): \d+% of 20 requests", flat), out[-3000:]
    assert flat.rstrip().endswith("stopped"), out[-3000:]
    # NOTE: nothing the demo started outlives it (its state and repositories sit in headrace-demo-*)
    left = subprocess.run(["pgrep", "-f", "headrace-demo-"], capture_output=True, text=True).stdout.split()
    assert not left, left
