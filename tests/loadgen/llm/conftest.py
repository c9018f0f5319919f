"""Fixtures of the generative load tests: the shared traces (a missing folder fails under
``CI=true`` and skips elsewhere) and ``headrace engine`` serving a small, fast profile in a
process of its own on a free port."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from loadgen.llm.run import DEFAULT_TRACES
from loadgen.llm.workload import TRACES
from profiles.llm.profile import LlmProfile, llm_profile_to_dict
from profiles.llm.steptime import StepTime
from profiles.profile import Provenance

ROOT = Path(__file__).resolve().parents[3]
ENGINE_MODEL = "small-llm"
STEP_S = 0.004  # every engine step of the small model, whatever it holds
MAX_MODEL_LEN = 4096


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """The shared traces folder; without it a CI run fails and a local run skips."""
    missing = [f for f in TRACES.values() if not (DEFAULT_TRACES / f).is_file()]
    if missing:
        msg = (f"the shared traces are missing: {', '.join(missing)} not in {DEFAULT_TRACES} "
               f"(the repository's ../shared/traces)")
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return DEFAULT_TRACES


def small_profile() -> LlmProfile:
    """A model whose every step takes STEP_S, with room for about 10k tokens of KV cache."""
    return LlmProfile(
        model="small", variant="small-bf16", gpu="CPU", slice="gpu", tp=1, memory_gb=1.0, weights_gb=0.5,
        activation_gb=0.0, kv_bytes_per_token=40_000, max_model_len=MAX_MODEL_LEN,
        step_time=StepTime(layers=1, linear=((1, STEP_S), (8192, STEP_S))), provenance=Provenance("test"))


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``headrace engine`` on a free port (prompt-token details on, so usage reports prefix-cache
    hits), in its own process group, stopped by its PID; yields http://HOST:PORT."""
    f = tmp_path_factory.mktemp("engine") / "small.yaml"
    f.write_text(yaml.safe_dump(llm_profile_to_dict(small_profile())))
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "engine", "--profile", str(f), "--port", "0",
                             "--served-model-name", ENGINE_MODEL, "--enable-prompt-tokens-details"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        url = re.search(r"(http://\S+)/v1", line)
        if url is None:
            raise RuntimeError(f"headrace engine did not start: {line}{proc.stderr.read()}")  # type: ignore[union-attr]
        yield url.group(1)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
