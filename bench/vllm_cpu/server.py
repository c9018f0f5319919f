"""Real vLLM on CPU serving the tiny Llama, for the opt-in tests and the fidelity bench: start
``vllm serve`` on a free port in its own process group, wait for ``/health``, read what the
engine chose from its startup log, stop it by its process group.

Nothing here imports vLLM: it runs in headrace's venv and starts the server from the vLLM venv
that ``bench/vllm_cpu/install.sh`` makes.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("VLLM_VENV", ROOT / ".venv-vllm"))
MODEL_DIR = VENV / "tiny-llama"  # config and tokenizer only: the venv is never in git
SERVED = "tiny-llama"
KVCACHE_SPACE_GB = 1  # VLLM_CPU_KVCACHE_SPACE: the CPU engine's KV cache, in GiB
INSTALL = "bench/vllm_cpu/install.sh"


def missing() -> str | None:
    """Why real vLLM cannot run here (None when it can)."""
    if not (VENV / "bin" / "vllm").exists():
        return f"no vLLM venv at {VENV}: run {INSTALL} (about 3.5 GB)"
    if not (VENV / ".vllm-cpu-installed").exists():
        return f"the vLLM venv at {VENV} is incomplete: run {INSTALL} again"
    return None


def ensure_model(out: Path = MODEL_DIR) -> Path:
    """The tiny model's config and tokenizer in ``out``, written by the vLLM venv's Python once."""
    if not (out / "tokenizer.json").exists():
        subprocess.run([str(VENV / "bin" / "python"), str(Path(__file__).with_name("tiny_model.py")), str(out)],
                       check=True, capture_output=True, timeout=300)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The CPU engine's defaults for the OpenAI server (vLLM 0.32: block size in vllm/platforms/cpu.py,
# the scheduler's in vllm/engine/arg_utils.py), passed explicitly so the startup log states them.
ENGINE_ARGS = ("--max-model-len", "2048", "--block-size", "128", "--max-num-seqs", "128",
               "--max-num-batched-tokens", "2048")


@dataclass(frozen=True)
class Startup:
    """What the engine runs with, as its startup log states it."""

    version: str | None
    args: dict  # the ``non-default args`` it was started with
    kv_tokens: int | None  # the KV cache's capacity in tokens

    def setting(self, name: str) -> int | None:
        value = self.args.get(name)
        return None if value is None else int(value)

    @property
    def block_size(self) -> int | None:
        return self.setting("block_size")

    @property
    def kv_blocks(self) -> int | None:
        return None if self.kv_tokens is None or not self.block_size else self.kv_tokens // self.block_size


def read_startup(log: str) -> Startup:
    version = re.search(r"V1 LLM engine \(v([^)]+)\)", log)
    args = re.search(r"non-default args: (\{.*\})\s*$", log, re.MULTILINE)
    kv = re.search(r"KV cache size: ([\d,]+) tokens", log)
    return Startup(version=version.group(1) if version else None,
                   args=ast.literal_eval(args.group(1)) if args else {},
                   kv_tokens=int(kv.group(1).replace(",", "")) if kv else None)


@dataclass
class VllmServer:
    """One ``vllm serve`` of the tiny model. ``args`` are extra ``vllm serve`` flags."""

    log_path: Path
    args: Sequence[str] = ENGINE_ARGS
    model_dir: Path = MODEL_DIR
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [str(VENV / "bin" / "vllm"), "serve", str(self.model_dir), "--load-format", "dummy",
                "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "bfloat16", *self.args]

    def start(self) -> None:
        self.port = self.port or free_port()
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": str(KVCACHE_SPACE_GB),
               "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **self.env}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Seconds until ``/health`` answers 200; RuntimeError, with the log's tail, when the
        server exits or is not ready in ``timeout``."""
        assert self.proc is not None
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                if urllib.request.urlopen(self.url + "/health", timeout=2).status == 200:
                    return time.monotonic() - t0
            time.sleep(0.5)
        raise RuntimeError(f"vllm serve not ready after {timeout:.0f} s:\n{self.log()[-4000:]}")

    def startup(self) -> Startup:
        return read_startup(self.log())

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 20 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # the engine core runs in a child process of the same group: make sure none outlives it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def vllm_server(log_path: Path, args: Sequence[str] = ENGINE_ARGS, timeout: float = 300.0) -> Iterator[VllmServer]:
    """A ready server of the tiny model; always stopped."""
    server = VllmServer(log_path, args, ensure_model())
    server.start()
    try:
        server.wait_ready(timeout)
        yield server
    finally:
        server.stop()
