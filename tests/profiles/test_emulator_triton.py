"""The emulated GPU served by real tritonserver: timing, row alignment, sharing, failures."""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient

from bench.emulator_fidelity import closed_loop
from profiles.emulator import ArbiterClient, ArbiterError, EmulatedGpu, write_emulated_model
from profiles.profile import LatencyPoint, Profile, ProfileSet
from profiles.sharing import ActiveJob
from profiles.triton.repository import DynamicBatching
from profiles.triton.server import TritonServer


def const_profile(ms: float, max_batch: int = 8) -> Profile:
    return Profile("c", "c", "EMU", "1g", max_batch, (LatencyPoint(1, ms / 1e3, ms / 1e3),),
                   mps_interference=0.2)


def alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_a_dead_client_does_not_wedge_the_arbiter_and_stop_ends_the_process():
    with EmulatedGpu("gpu-t") as gpu:
        pid = gpu.pid
        hog = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        hog.connect(gpu.socket_path)
        hog.sendall(b'{"op": "run", "seq": 1, "slice": "s", "client": "hog", "work": 600}\n')
        hog.recv(4096)  # its eta: the hog is on the slice now
        hog.close()  # dies mid-job
        c = ArbiterClient(gpu.socket_path)
        t0 = time.monotonic()
        c.run(ActiveJob("s", "b"), 0.05)
        # NOTE: alone again, the job runs at full speed (time-sliced with the hog it would not end)
        assert time.monotonic() - t0 == pytest.approx(0.05, abs=0.02)
        with pytest.raises(ArbiterError, match="work must be"):
            c.run(ActiveJob("s", "b"), -1.0)
        c.close()
    assert not alive(pid)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("emu")
    ref = ProfileSet.reference().get("resnet50", "A100-80GB", "1g.10gb").with_max_batch(8)
    c30 = const_profile(30.0)
    with EmulatedGpu("gpu-it") as gpu:
        arb = gpu.socket_path
        write_emulated_model(repo, "ref", ref, slice_id="solo/1g@0", dynamic_batching=DynamicBatching())
        write_emulated_model(repo, "rows", c30, slice_id="solo/1g@1",
                             dynamic_batching=DynamicBatching(max_queue_delay_us=50000))
        write_emulated_model(repo, "mig_a", c30, slice_id="g/1g@0", arbiter=arb)
        write_emulated_model(repo, "mig_b", c30, slice_id="g/1g@1", arbiter=arb)
        write_emulated_model(repo, "ts_b", c30, slice_id="g/1g@0", arbiter=arb)  # beside mig_a
        write_emulated_model(repo, "mps_a", c30, slice_id="g/mps", mode="mps", share=0.5, arbiter=arb)
        write_emulated_model(repo, "mps_b", c30, slice_id="g/mps", mode="mps", share=0.5, arbiter=arb)
        write_emulated_model(repo, "lost", c30, slice_id="g/lost", arbiter="/tmp/headrace-no-such.sock")
        with TritonServer(repo, ready_timeout=120) as server:  # 8 python stubs start slowly on a busy host
            yield server, ref


def infer(url: str, model: str, x: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    try:
        inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp]).as_numpy("OUTPUT0")
    finally:
        client.close()  # an open keep-alive connection holds up Triton's shutdown


@pytest.mark.integration
@pytest.mark.parametrize("batch", [1, 8])
def test_latency_through_triton_follows_the_profile(served, batch):
    server, ref = served
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("INPUT0", [batch, 16], "FP32")
    inp.set_data_from_numpy(np.zeros((batch, 16), np.float32))
    times = []
    try:
        for _ in range(12):
            t0 = time.perf_counter()
            client.infer("ref", [inp])
            times.append(time.perf_counter() - t0)
    finally:
        client.close()
    want = ref.latency(batch, "p50")
    # NOTE: load from other work on the host only adds time, so the lower quartile is held to
    # 10% / 1 ms here; the bench holds the median to the strict 5% / 0.5 ms
    got = float(np.percentile(times[2:], 25))
    assert abs(got - want) <= max(0.10 * want, 0.001), (got, want, times)


@pytest.mark.integration
def test_dynamic_batches_answer_each_request_with_its_own_rows(served):
    server, _ = served
    results: dict[int, np.ndarray] = {}
    inputs = {i: np.full((i, 16), float(i), np.float32) for i in (1, 2, 3)}

    def send(i: int) -> None:
        results[i] = infer(server.http_url, "rows", inputs[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, x in inputs.items():
        np.testing.assert_array_equal(results[i], x + 1)


@pytest.mark.integration
def test_sharing_rules_hold_through_triton(served):
    server, _ = served
    url = server.http_url
    scenarios = {"solo": ["mig_a"], "mig": ["mig_a", "mig_b"], "ts": ["mig_a", "ts_b"], "mps": ["mps_a", "mps_b"]}
    runs: dict[str, list[list[float]]] = {k: [] for k in scenarios}
    for _ in range(2):  # interleaved, so background load on the host hits baseline and shared alike
        for k, models in scenarios.items():
            runs[k].append(closed_loop([(url, m) for m in models], duration=0.3, batch=1))
    got = {k: [statistics.fmean(c) for c in zip(*v, strict=True)] for k, v in runs.items()}
    solo = got["solo"][0]
    assert solo == pytest.approx(1 / 0.030, rel=0.15), got  # 30 ms a batch
    # the bench holds the strict bounds; a shared CI host gets wider ones here
    assert min(got["mig"]) >= 0.85 * solo, got  # separate slices: isolated
    assert got["ts"] == pytest.approx([solo / 2] * 2, rel=0.15), got  # one slice, no MPS: turns
    assert got["mps"] == pytest.approx([solo * 0.5 / 1.2] * 2, rel=0.15), got  # half the threads, 20% interference


@pytest.mark.integration
def test_unreachable_arbiter_is_a_clear_inference_error_not_a_hang(served):
    server, _ = served
    with pytest.raises(Exception, match="cannot reach emulated-GPU arbiter"):
        infer(server.http_url, "lost", np.zeros((1, 16), np.float32))


@pytest.mark.integration
@pytest.mark.slow
def test_fidelity_benchmark_passes_its_strict_bounds():
    # NOTE: the acceptance bounds (5% / 0.5 ms, MIG >= 95%, MPS and time-slicing within 10%);
    # meaningful on a quiet host only, hence opt-in
    from bench.emulator_fidelity import run

    res = run(samples=9, duration=3.0, rounds=3, calibrate=True)
    failed = [r for r in res["latency"] + res["sharing"] if not r["pass"]]
    assert res["pass"], failed
