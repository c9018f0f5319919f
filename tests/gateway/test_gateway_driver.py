"""The asyncio driver around the policy core, with fake replicas and an injected clock:
batches are concatenated and split per request, rejects are answered at once, a failed batch
is retried elsewhere or fails every waiter, and no request is left unanswered."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from gateway.backends.grpc import ModelInfo
from gateway.codec import InferInput, Signature, Tensor, TensorSig
from gateway.config import ServedModel, ServedReplica
from gateway.contract import deadline_of, priority_of
from gateway.driver import Driver
from gateway.errors import BackendError, InvalidRequest, Rejected
from gateway.policy.config import SchedulerConfig
from gateway.policy.scheduler import EdfScheduler
from gateway.policy.types import Priority
from profiles.profile import LatencyPoint, Profile

SIG = Signature({"x": TensorSig("x", "FP32", (2,))}, {"y": TensorSig("y", "FP32", (2,))}, max_batch_size=8)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeReplica:
    """Echoes ``x`` as ``y``. Each call waits for the test to release it (or fail it)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.calls: list[tuple[str, int]] = []
        self.forwarded: list[tuple[object, int]] = []  # (Forward or None, Triton timeout µs) per call
        self.gates: list[asyncio.Future] = []
        self.rows_reply: int | None = None  # answer with this many rows instead (a broken backend)

    async def model_info(self, variant: str) -> ModelInfo:
        return ModelInfo(SIG, pb.ModelMetadataResponse(name=variant), mc.ModelConfig(name=variant))

    async def ready(self, variant: str, timeout: float = 1.0) -> bool:
        return True

    async def close(self) -> None:
        pass

    async def infer(self, variant: str, inputs: list[Tensor], timeout: float | None,
                    forward: object = None, triton_timeout_us: int = 0) -> list[Tensor]:
        rows = inputs[0].shape[0]
        self.calls.append((variant, rows))
        self.forwarded.append((forward, triton_timeout_us))
        gate = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        await gate  # the test resolves it: None to answer, an exception to fail
        x = inputs[0]
        n = self.rows_reply or rows
        raw = bytes(x.raw)[: n * 8] if n <= rows else bytes(x.raw) + b"\0" * 8 * (n - rows)
        return [Tensor("y", "FP32", [n, 2], raw)]

    def release(self, exc: BaseException | None = None) -> None:
        for g in self.gates:
            if not g.done():
                g.set_exception(exc) if exc else g.set_result(None)


def profile() -> Profile:
    return Profile("m", "m", "EMU", "s", 8, (LatencyPoint(1, 0.01, 0.01), LatencyPoint(8, 0.02, 0.02)))


def make_driver(clock: Clock, n_replicas: int = 1, slo: float = 1.0) -> tuple[Driver, list[FakeReplica]]:
    fakes: list[FakeReplica] = []

    def factory(protocol: str, url: str) -> FakeReplica:
        fakes.append(FakeReplica(url))
        return fakes[-1]

    reps = tuple(ServedReplica(f"r{i}", f"host:{9000 + i}", "http", "v", profile(), 1) for i in range(n_replicas))
    model = ServedModel("m", slo, 8, Priority.GUARANTEED, reps)
    core = EdfScheduler(SchedulerConfig(policy="adaptive", wait=False))
    return Driver([model], core, clock=clock, health_interval=3600, replica_factory=factory), fakes


def request(*rows: list[float], **params) -> InferInput:
    arr = np.asarray(rows, dtype=np.float32)
    return InferInput([Tensor("x", "FP32", list(arr.shape), arr.tobytes())], parameters=params)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def run(coro):
    return asyncio.run(coro)


def test_queued_requests_share_one_batch_and_get_their_own_rows():
    async def main() -> None:
        clock = Clock()
        d, (fake,) = make_driver(clock)
        await d.start()
        first = asyncio.create_task(d.infer("m", request([0, 0])))
        await settle()
        rest = [asyncio.create_task(d.infer("m", request([i, i], [i, -i]))) for i in (1, 2, 3)]
        await settle()
        assert fake.calls == [("v", 1)]  # the replica is busy: the others queue
        fake.release()
        await settle()
        # NOTE: everything queued while the replica was busy goes out as one batch of 6 rows
        assert fake.calls == [("v", 1), ("v", 6)]
        fake.release()
        outs = await asyncio.gather(first, *rest)
        for i, res in enumerate(outs[1:], start=1):
            y = np.frombuffer(bytes(res.outputs[0].raw), np.float32).reshape(res.outputs[0].shape)
            np.testing.assert_array_equal(y, [[i, i], [i, -i]])
            assert res.variant == "v" and res.replica == "r0" and res.met_deadline
        assert not d._pending  # noqa: SLF001  (the invariant under test: nothing left behind)
        await d.stop()

    run(main())


def test_infeasible_request_is_rejected_at_once_with_retry_after():
    async def main() -> None:
        d, (fake,) = make_driver(Clock())
        await d.start()
        with pytest.raises(Rejected) as e:
            await d.infer("m", request([1, 2], timeout=1000))  # 1 ms < the 10 ms a batch takes
        assert e.value.reason == "infeasible" and e.value.retry_after > 0
        assert fake.calls == []
        await d.stop()

    run(main())


def test_deadline_counts_from_when_the_front_door_read_the_request():
    async def main() -> None:
        clock = Clock()
        d, (fake,) = make_driver(clock)  # SLO 1 s; a batch takes 10 ms
        await d.start()
        with pytest.raises(Rejected):  # read 995 ms ago: 5 ms are left, too few
            await d.infer("m", request([1, 2]), received=clock.now - 0.995)
        served = asyncio.create_task(d.infer("m", request([1, 2]), received=clock.now - 0.5))
        await settle()
        assert fake.calls == [("v", 1)]
        fake.release()
        assert (await served).met_deadline
        await d.stop()

    run(main())


def test_unavailable_replica_fails_over_and_is_marked_unhealthy():
    async def main() -> None:
        d, (a, b) = make_driver(Clock(), n_replicas=2)
        await d.start()
        t = asyncio.create_task(d.infer("m", request([5, 6])))
        await settle()
        (busy, idle) = (a, b) if a.calls else (b, a)
        busy.release(BackendError("gone", grpc.StatusCode.UNAVAILABLE, retryable=True))
        await settle()
        assert idle.calls == [("v", 1)]  # retried on the other replica of the variant
        idle.release()
        res = await t
        assert res.replica == ("r0" if idle is a else "r1")
        assert [r.healthy for r in d.replicas.values()].count(False) == 1
        await d.stop()

    run(main())


@pytest.mark.parametrize("failure", ["error", "rows"])
def test_failed_batch_fails_every_waiter(failure):
    async def main() -> None:
        d, (fake,) = make_driver(Clock())
        await d.start()
        first = asyncio.create_task(d.infer("m", request([0, 0])))
        await settle()
        waiters = [asyncio.create_task(d.infer("m", request([i, i]))) for i in range(3)]
        await settle()
        fake.release()
        await first
        await settle()
        if failure == "error":
            fake.release(BackendError("model crashed", grpc.StatusCode.INTERNAL, retryable=False))
        else:
            fake.rows_reply = 2  # 2 rows back for a batch of 3
            fake.release()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        # NOTE: one failed batch answers each of its requests with the error, none hangs
        assert all(isinstance(r, BackendError) for r in results), results
        assert not d._pending  # noqa: SLF001
        await d.stop()

    run(main())


def test_bad_input_is_refused_before_the_core_sees_it():
    async def main() -> None:
        d, (fake,) = make_driver(Clock())
        await d.start()
        bad = InferInput([Tensor("x", "FP32", [1, 3], b"\0" * 12)])
        with pytest.raises(InvalidRequest, match=r"shape \[1, 3\]"):
            await d.infer("m", bad)
        too_big = request(*([[1, 1]] * 9))
        with pytest.raises(InvalidRequest, match="max_batch_size"):
            await d.infer("m", too_big)
        assert fake.calls == []
        await d.stop()

    run(main())


def test_stop_answers_every_pending_request():
    async def main() -> None:
        d, (fake,) = make_driver(Clock())
        await d.start()
        tasks = [asyncio.create_task(d.infer("m", request([1, 1]))) for _ in range(3)]
        await settle()
        await d.stop()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, Exception) and "shutting down" in str(r) for r in results)

    run(main())


def test_deadline_sources_in_order_of_precedence():
    now = 10.0
    assert deadline_of(request([1, 1], timeout=5000), "250", 0.1, now) == pytest.approx(10.005)
    assert deadline_of(request([1, 1]), "250", 0.1, now) == pytest.approx(10.25)
    assert deadline_of(request([1, 1], timeout=0), None, 0.1, now) == pytest.approx(10.1)
    with pytest.raises(InvalidRequest, match="x-headrace-slo-ms"):
        deadline_of(request([1, 1]), "soon", 0.1, now)
    with pytest.raises(InvalidRequest, match="timeout"):
        deadline_of(request([1, 1], timeout="5"), None, 0.1, now)


def test_deadline_keeps_a_margin_of_each_budget_outside_the_plan():
    now = 10.0
    # NOTE: the margin is a fraction of whichever budget applies, so tight SLOs keep a small one
    assert deadline_of(request([1, 1], timeout=5000), None, 0.1, now, 0.1) == pytest.approx(10.0045)
    assert deadline_of(request([1, 1]), None, 0.1, now, 0.03) == pytest.approx(10.097)


def test_priority_parameter_maps_to_classes():
    assert priority_of(request([1, 1]), Priority.BEST_EFFORT) == Priority.BEST_EFFORT
    assert priority_of(request([1, 1], priority=1), Priority.BEST_EFFORT) == Priority.GUARANTEED
    assert priority_of(request([1, 1], priority=2), Priority.GUARANTEED) == Priority.BEST_EFFORT
    with pytest.raises(InvalidRequest):
        priority_of(request([1, 1], priority=-1), Priority.GUARANTEED)


def _gauge(text: bytes, name: str) -> float:
    lines = [ln for ln in text.decode().splitlines() if ln.startswith(name + "{")]
    assert len(lines) == 1, lines
    return float(lines[0].rsplit(" ", 1)[1])


def test_metrics_show_the_per_batch_overhead_the_scheduler_learned():
    async def main() -> None:
        clock = Clock()
        d, (fake,) = make_driver(clock)
        await d.start()
        name = "headrace_replica_overhead_seconds"
        assert _gauge(d.render_metrics(), name) == 0.0
        for _ in range(10):  # every batch comes back 5 ms after its profile says
            task = asyncio.create_task(d.infer("m", request([1, 1])))
            await settle()
            clock.now += profile().latency(1) + 0.005
            fake.release()
            await task
        learned = _gauge(d.render_metrics(), name)
        assert 0.0 < learned <= 0.005
        await d.stop()

    run(main())


def test_the_inflight_gauge_shows_the_batches_a_replica_holds_at_scrape_time():
    def inflight(d: Driver) -> float:
        line = next(ln for ln in d.render_metrics().decode().splitlines()
                    if ln.startswith("headrace_replica_inflight_batches{"))
        return float(line.rsplit(" ", 1)[1])

    async def main() -> None:
        d, (fake,) = make_driver(Clock())
        await d.start()
        assert inflight(d) == 0
        task = asyncio.create_task(d.infer("m", request([1, 1])))
        await settle()
        assert inflight(d) == 1  # sent, not yet answered
        fake.release()
        await task
        assert inflight(d) == 0
        await d.stop()

    run(main())


def test_a_request_checked_as_it_was_decoded_is_not_checked_again_unless_its_model_changed(monkeypatch):
    """The front doors check what a request declares against the model's signature as they
    decode it; the driver reuses that check for the same signature (the hot path paid for a
    second walk), and checks again against any other, such as a reloaded model's."""
    import json as _json
    from dataclasses import replace as _replace

    from gateway import driver as driver_mod
    from gateway.codec import parse_grpc_infer, parse_http_infer

    head = _json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 2],
                                    "parameters": {"binary_data_size": 24}}]}).encode()
    as_http = parse_http_infer(head + bytes(24), str(len(head)), sig=SIG, model="m")
    req = pb.ModelInferRequest(model_name="m", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[3, 2])], raw_input_contents=[bytes(24)])
    as_grpc = parse_grpc_infer(req, None, SIG, "m")
    for inp in (as_http, as_grpc):
        assert inp.checked is SIG and inp.rows == 3
    assert parse_http_infer(head + bytes(24), str(len(head))).checked is None  # unchecked: no signature

    checks = []
    real = driver_mod.validate
    monkeypatch.setattr(driver_mod, "validate", lambda *a: checks.append(a) or real(*a))

    async def main() -> None:
        clock = Clock()
        d, (fake,) = make_driver(clock)
        await d.start()
        t = asyncio.create_task(d.infer("m", as_http))
        await settle()
        assert fake.calls == [("v", 3)] and checks == []
        fake.release()
        await t
        d.fleet.models["m"].info = _replace(d.fleet.models["m"].info, signature=_replace(SIG))  # reloaded
        t = asyncio.create_task(d.infer("m", as_grpc))
        await settle()
        assert len(checks) == 1  # another signature object: checked again
        fake.release()
        await t
        await d.stop()

    run(main())
