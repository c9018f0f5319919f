"""Builders for the operator's integration tests: documents, a detached controller that is
always stopped, the admin client, and load runs on their own threads."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deploy.cli import main
from deploy.operator.cli import ensure_down
from deploy.operator.client import call
from deploy.operator.state import DirStateStore


def pool(a100s: int = 1, host: bool = True, mps: bool = True) -> dict[str, Any]:
    gpus = [{"model": "A100-80GB", "count": a100s, "mps": mps}] + ([{"model": "cpu", "count": 1}] if host else [])
    return {"apiVersion": "headrace.dev/v1", "kind": "GpuPool", "metadata": {"name": "test"},
            "spec": {"emulate": True, "nodes": [{"name": "local", "gpus": gpus}]}}


def deployment(model: str, rate: float, slo_ms: float, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "headrace.dev/v1", "kind": "ModelDeployment", "metadata": {"name": model},
            "spec": {"model": model, "rate": rate, "slo_ms": slo_ms, **spec}}


GATEWAY = {"apiVersion": "headrace.dev/v1", "kind": "Gateway", "metadata": {"name": "gw"},
           "spec": {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0}}}


def write_docs(path: Path, *docs: dict[str, Any]) -> Path:
    """The documents, with a Gateway on free ports unless one is given."""
    if not any(d["kind"] == "Gateway" for d in docs):
        docs = (*docs, GATEWAY)
    path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False))
    return path


@dataclass
class Running:
    state_dir: Path

    def state(self) -> dict[str, Any]:
        return DirStateStore(self.state_dir).read()

    @property
    def url(self) -> str:
        return self.state()["admin_url"]

    @property
    def token(self) -> str:
        return DirStateStore(self.state_dir).token()

    @property
    def http(self) -> str:
        return self.state()["gateway"]["http"]

    def admin(self, method: str, path: str, body: bytes | None = None) -> Any:
        return call(self.url, self.token, method, path, body)

    def status(self) -> dict[str, Any]:
        return self.admin("GET", "/v1/status")

    def apply(self, path: Path, dry_run: bool = False) -> dict[str, Any]:
        return self.admin("POST", "/v1/apply" + ("?dry_run=1" if dry_run else ""), path.read_bytes())

    def deployment(self, name: str) -> dict[str, Any]:
        return next(d for d in self.status()["deployments"] if d["name"] == name)

    def condition(self, name: str, kind: str) -> str:
        return next(c["status"] for c in self.deployment(name)["conditions"] if c["type"] == kind)

    def pids(self) -> dict[str, int]:
        return {k: v["pid"] for k, v in self.state()["processes"].items()}

    def wait_for(self, what: str, pred, timeout: float = 90.0, period: float = 0.25) -> float:  # noqa: ANN001
        """Poll ``pred()`` until true; returns when (monotonic). Integration only: the operator
        runs in another process on a real clock."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return time.monotonic()
            time.sleep(period)
        raise AssertionError(f"not {what} after {timeout:g} s: {json.dumps(self.status(), indent=1)[:4000]}")


@contextlib.contextmanager
def operator_up(tmp_path: Path, *files: Path) -> Iterator[Running]:
    state = tmp_path / "state"
    args = ["up", "--detach", "--state-dir", str(state), "--tick", "0.5", "--timeout", "240"]
    for f in files:
        args += ["-f", str(f)]
    try:
        assert main(args) == 0, (state / "controller.log").read_text()[-4000:]
        yield Running(state)
    finally:
        ensure_down(state)


class LoadThread(threading.Thread):
    """``headrace load``'s engine on its own thread (its own event loop)."""

    def __init__(self, target: str, mix: str, rate: float, duration: float, slo_ms: float, seed: int = 0,
                 warmup_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        from loadgen.spec import LoadSpec  # noqa: PLC0415

        self.spec = LoadSpec(target=f"http://{target}", mix=mix, rate=rate, duration_s=duration, warmup_s=warmup_s,
                             slo_ms=slo_ms, seed=seed)
        self.summary: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from loadgen.run import run_load_sync  # noqa: PLC0415

        try:
            self.summary = run_load_sync(self.spec).summary
        except BaseException as e:  # noqa: BLE001  (re-raised by result())
            self.error = e

    def result(self, timeout: float = 300.0) -> dict[str, Any]:
        self.join(timeout)
        if self.error is not None:
            raise self.error
        assert self.summary is not None, "load run did not finish"
        return self.summary



@dataclass
class Answer:
    sent: float  # monotonic
    factor: float | None  # OUTPUT0 / INPUT0 of the scaler model (None: an error)
    error: str = ""


class TritonLoad(threading.Thread):
    """An open-loop load of ``tritonclient.http`` requests to the scaler model (``x * FACTOR``,
    the factor telling which version answered): one every ``1/rate`` s for ``duration`` s,
    each answer (or error) recorded with when it was sent."""

    def __init__(self, target: str, model: str, rate: float, duration: float) -> None:
        super().__init__(daemon=True)
        self.target, self.model, self.rate, self.duration = target, model, rate, duration
        self.answers: list[Answer] = []
        self.unanswered = 0

    def run(self) -> None:
        import numpy as np  # noqa: PLC0415
        import tritonclient.http as th  # noqa: PLC0415

        client = th.InferenceServerClient(self.target, concurrency=32, network_timeout=30.0)
        x = th.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.arange(1, 5, dtype=np.float32).reshape(1, 4))
        pending = []
        start = time.monotonic()
        k = 0
        while (at := start + k / self.rate) < start + self.duration:
            time.sleep(max(0.0, at - time.monotonic()))
            pending.append((time.monotonic(), client.async_infer(self.model, [x])))
            k += 1
        for sent, req in pending:
            try:
                out = req.get_result(timeout=30).as_numpy("OUTPUT0")
                self.answers.append(Answer(sent, float(out[0][0])))
            except Exception as e:  # noqa: BLE001  (recorded: the test asserts there are none)
                self.answers.append(Answer(sent, None, str(e)[:200]))
        self.unanswered = k - len(self.answers)
        client.close()


VERSIONED = Path(__file__).resolve().parents[1] / "deploy/examples/versioned"


def versioned_model(tmp_path: Path) -> None:
    """The example user model (deploy/examples/versioned: version 1 answers x2, version 2 x3)
    copied under ``tmp_path``: ``models/scaler`` and its profile ``scaler-v1.yaml`` beside it."""
    import shutil  # noqa: PLC0415

    shutil.copytree(VERSIONED / "models", tmp_path / "models")
    shutil.copy(VERSIONED / "profiles/scaler-v1.yaml", tmp_path)


def full_gpu(tmp_path: Path, variants: list[str], name: str, **spec: Any) -> Path:
    """Documents for model ``big`` on one A100-80GB without MIG or MPS, each of ``variants``
    taking 50 of its 80 GB: a successor never fits beside its predecessor."""
    vs = []
    for v in variants:
        pts = [{"batch": b, "p50": 2.0 + 0.1 * b, "p99": 3.0 + 0.1 * b} for b in (1, 8, 32)]
        doc = {"apiVersion": "headrace.dev/v1", "kind": "Profile", "metadata": {"name": f"{v}@A100-80GB/gpu"},
               "spec": {"model": "big", "variant": v, "gpu": "A100-80GB", "slice": "gpu", "max_batch": 32,
                        "memory_mb": 50_000.0, "latency_ms": pts,
                        "provenance": {"source": "test", "kind": "measured", "measured_batches": [1, 8, 32]}}}
        (tmp_path / f"{v}.yaml").write_text(yaml.safe_dump(doc))
        vs.append({"name": v, "profile": f"{v}.yaml"})
    gpus = pool(a100s=1, host=False, mps=False)
    gpus["spec"]["nodes"][0]["gpus"][0]["mig"] = False
    return write_docs(tmp_path / name, gpus, deployment("big", 100, 100, variants=vs, **spec))
