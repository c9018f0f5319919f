"""The launcher runs real tritonserver on CPU and always cleans up its process group."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.http as httpclient

from profiles.triton.repository import ModelConfig, TensorSpec, write_model
from profiles.triton.server import TritonError, TritonServer

DOUBLE = '''
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() * 2)]) for r in requests]
'''


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.integration
def test_real_triton_serves_python_model_and_stops_its_group(tmp_path):
    cfg = ModelConfig("double", (TensorSpec("x", "FP32", (3,)),), (TensorSpec("y", "FP32", (3,)),), max_batch_size=4)
    write_model(tmp_path, cfg, DOUBLE)
    server = TritonServer(tmp_path)
    with server:
        pgid = server.pid
        client = httpclient.InferenceServerClient(server.http_url)
        x = httpclient.InferInput("x", [2, 3], "FP32")
        x.set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
        out = client.infer("double", [x]).as_numpy("y")
        np.testing.assert_allclose(out, np.arange(6).reshape(2, 3) * 2)
        assert _alive(pgid)
    # NOTE: no process of the server's group survives stop(), python stubs included
    assert not _alive(pgid)


def test_missing_binary_says_how_to_install(tmp_path):
    with pytest.raises(TritonError, match="pip install nvidia-pytriton"):
        TritonServer(tmp_path, binary=tmp_path / "nope" / "tritonserver").start()


@pytest.mark.integration
def test_bad_model_fails_fast_with_log(tmp_path):
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 1\n')
    (tmp_path / "broken" / "1" / "model.py").write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(TritonError, match="broken|boom"):
        TritonServer(tmp_path, ready_timeout=30).start()


@pytest.mark.integration
def test_triton_up_cli_serves_until_sigterm(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    cfg = ModelConfig("double", (TensorSpec("x", "FP32", (3,)),), (TensorSpec("y", "FP32", (3,)),), max_batch_size=4)
    write_model(tmp_path, cfg, DOUBLE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "triton", "up", "--repo", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        line = proc.stdout.readline()  # blocks until the server reports ready (or exits)
        assert "tritonserver ready" in line, line
        http = line.split("http ")[1].split()[0]
        assert httpclient.InferenceServerClient(http).is_server_ready()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5:  # the server's own group is gone too
            try:
                httpclient.InferenceServerClient(http).is_server_live()
            except Exception:
                break
            time.sleep(0.1)
        else:
            pytest.fail("tritonserver still answers after `headrace triton up` exited")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.mark.integration
def test_a_command_line_triton_refuses_is_reported_by_its_reason_not_its_usage_text(tmp_path) -> None:
    (tmp_path / "repo").mkdir()
    srv = TritonServer(tmp_path / "repo", extra_args=["--http-port=notaport"], ready_timeout=20,
                       log_path=tmp_path / "triton.log")
    with pytest.raises(TritonError) as e:
        srv.start()
    # NOTE: Triton ends its log with a 400-line usage text; the error keeps the reason and the argv
    assert "Invalid option value. Got notaport" in str(e.value) and "--trace-rate" not in str(e.value)


def test_ports_handed_out_are_not_handed_out_again_while_their_servers_start() -> None:
    import threading

    from profiles.triton.server import free_ports

    got: list[list[int]] = []
    threads = [threading.Thread(target=lambda: got.append(free_ports(3))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ports = [p for trio in got for p in trio] + free_ports(3)
    # NOTE: Triton servers a rollout wave starts at once never race for one port
    assert len(ports) == 51 and len(set(ports)) == 51
