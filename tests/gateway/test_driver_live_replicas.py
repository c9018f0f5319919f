"""The driver's live fleet changes, with fake replicas and an injected clock: a replica added
while serving takes work at once, a removed one is drained first, a variant whose signature
differs is refused, and every admitted request is answered exactly once throughout."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import grpc
import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from gateway.backends.grpc import ModelInfo
from gateway.codec import Signature, Tensor, TensorSig
from gateway.config import ServedModel, ServedReplica
from gateway.driver import Driver
from gateway.errors import BackendError, ConfigError, ModelNotFound, Rejected, Unavailable
from gateway.policy.config import SchedulerConfig
from gateway.policy.scheduler import EdfScheduler
from gateway.policy.types import Priority
from tests.gateway.test_gateway_driver import SIG, Clock, FakeReplica, profile, request, settle

DIMS = Signature({"x": TensorSig("x", "FP32", (3,))}, SIG.outputs, SIG.max_batch_size)
DTYPE = Signature({"x": TensorSig("x", "FP16", (2,))}, SIG.outputs, SIG.max_batch_size)
MAX_BATCH = Signature(SIG.inputs, SIG.outputs, max_batch_size=4)
MODEL = ServedModel("m", 1.0, 8, Priority.GUARANTEED, ())


class Fake(FakeReplica):
    """A fake replica with a signature of its own; ``auto`` answers each call a few loop turns
    later (else the test releases it); ``down`` fails metadata and ready probes."""

    def __init__(self, url: str, sig: Signature, auto: bool) -> None:
        super().__init__(url)
        self.sig, self.auto, self.down, self.closed = sig, auto, False, False

    async def model_info(self, variant: str) -> ModelInfo:
        if self.down:
            raise BackendError(f"{self.url} is down", grpc.StatusCode.UNAVAILABLE, retryable=True)
        return ModelInfo(self.sig, pb.ModelMetadataResponse(name=variant), mc.ModelConfig(name=variant))

    async def ready(self, variant: str, timeout: float = 1.0) -> bool:
        return not self.down

    async def close(self) -> None:
        self.closed = True

    async def infer(self, variant: str, inputs: list[Tensor], timeout: float | None,
                    forward: object = None, triton_timeout_us: int = 0) -> list[Tensor]:
        if not self.auto:
            return await super().infer(variant, inputs, timeout, forward, triton_timeout_us)
        self.calls.append((variant, inputs[0].shape[0]))
        for _ in range(3):
            await asyncio.sleep(0)
        return [Tensor("y", "FP32", list(inputs[0].shape), bytes(inputs[0].raw))]


def fleet(sigs: dict[str, Signature] | None = None, auto: bool = False):
    """A replica factory and the fakes it made, by url."""
    fakes: dict[str, Fake] = {}

    def factory(protocol: str, url: str) -> Fake:
        fakes[url] = Fake(url, (sigs or {}).get(url, SIG), auto)
        return fakes[url]

    return factory, fakes


def served(rid: str, port: int, variant: str = "v") -> ServedReplica:
    return ServedReplica(rid, f"host:{port}", "http", variant, profile(), 1)


def driver(factory, *replicas: ServedReplica, health_interval: float = 3600) -> Driver:
    model = ServedModel("m", 1.0, 8, Priority.GUARANTEED, replicas or (served("r0", 9000),))
    core = EdfScheduler(SchedulerConfig(policy="adaptive", wait=False))
    return Driver([model], core, clock=Clock(), health_interval=health_interval, replica_factory=factory)


def run(coro):
    return asyncio.run(coro)


def test_adding_a_variant_then_removing_the_old_one_under_load_answers_every_request():
    async def main() -> None:
        factory, fakes = fleet(auto=True)
        d = driver(factory)
        await d.start()
        tasks: list[asyncio.Task] = []

        async def stream(n: int) -> None:
            for i in range(n):
                d.clock.now += 0.004  # 250 req/s: within v's capacity, so v stays preferred
                tasks.append(asyncio.create_task(d.infer("m", request([i, -i]))))
                await asyncio.sleep(0)

        producer = asyncio.create_task(stream(600))
        for _ in range(30):
            await asyncio.sleep(0)
        await d.add_replica(MODEL, served("r1", 9001, variant="v2"))  # make ...
        for _ in range(30):
            await asyncio.sleep(0)
        burst = [d.submit("m", request([i, -i])) for i in range(600, 620)]  # queued for v, mostly
        removal = asyncio.create_task(d.remove_replica("r0", timeout=10.0))  # ... before break
        await asyncio.sleep(0)  # the removal has drained r0: it gets no new batch from here on
        sent_to_old = len(fakes["host:9000"].calls)
        assert await removal is True
        await producer
        results = await asyncio.gather(*tasks, *burst, return_exceptions=True)
        # NOTE: every request is answered, none with an error, each with its own rows
        assert [r for r in results if isinstance(r, BaseException)] == []
        for i, res in enumerate(results):
            y = np.frombuffer(bytes(res.outputs[0].raw), np.float32)
            np.testing.assert_array_equal(y, [i, -i])
        by = Counter((r.replica, r.variant) for r in results)
        assert by[("r0", "v")] > 0 and by[("r1", "v2")] > 0 and set(by) == {("r0", "v"), ("r1", "v2")}
        assert len(fakes["host:9000"].calls) == sent_to_old
        assert d.fleet.replica_ids() == {"m": ["r1"]} and fakes["host:9000"].closed
        assert not d._pending  # noqa: SLF001  (the invariant under test: nothing left behind)
        await d.stop()

    run(main())


def test_removing_a_replica_waits_for_its_batch_in_flight():
    async def main() -> None:
        factory, fakes = fleet()
        d = driver(factory)
        await d.start()
        first = asyncio.create_task(d.infer("m", request([1, 1])))
        await settle()
        old = fakes["host:9000"]
        assert old.calls == [("v", 1)]
        await d.add_replica(MODEL, served("r1", 9001))
        removal = asyncio.create_task(d.remove_replica("r0", timeout=30.0))
        await settle()
        assert not removal.done()  # r0 still holds a batch
        second = asyncio.create_task(d.infer("m", request([2, 2])))
        await settle()
        assert fakes["host:9001"].calls == [("v", 1)] and len(old.calls) == 1
        old.release()
        assert (await first).replica == "r0"
        await settle()
        assert removal.done() and removal.result() is True  # at once, not at its timeout
        assert d.fleet.replica_ids() == {"m": ["r1"]} and old.closed
        assert 'replica="r0"' not in d.render_metrics().decode()  # its series are gone
        fakes["host:9001"].release()
        assert (await second).replica == "r1"
        with pytest.raises(KeyError, match="'r0'"):
            await d.remove_replica("r0")
        await d.stop()

    run(main())


def test_a_replica_that_does_not_drain_in_time_is_removed_and_its_requests_fail():
    async def main() -> None:
        factory, fakes = fleet()
        d = driver(factory)
        await d.start()
        first = asyncio.create_task(d.infer("m", request([1, 1])))
        await settle()
        await d.add_replica(MODEL, served("r1", 9001))
        assert await d.remove_replica("r0", timeout=0.0) is False
        with pytest.raises(Unavailable, match="r0 was removed"):
            await first
        fakes["host:9000"].release()  # a late answer changes nothing
        await settle()
        assert not d._pending  # noqa: SLF001
        later = asyncio.create_task(d.infer("m", request([2, 2])))
        await settle()
        fakes["host:9001"].release()
        assert (await later).replica == "r1"
        await d.stop()

    run(main())


@pytest.mark.parametrize(("sig", "differs"), [
    (DIMS, "input 'x' FP32 [3], the model's is FP32 [2]"),
    (DTYPE, "input 'x' FP16 [2], the model's is FP32 [2]"),
    (MAX_BATCH, "max_batch_size 4, the model's is 8"),
])
def test_a_variant_with_another_signature_is_refused_and_serving_goes_on(sig, differs):
    async def main() -> None:
        factory, fakes = fleet({"host:9001": sig}, auto=True)
        d = driver(factory)
        await d.start()
        with pytest.raises(ConfigError) as e:
            await d.add_replica(MODEL, served("r1", 9001, variant="v2"))
        assert str(e.value) == f"model 'm': variant 'v2' has {differs}"
        assert d.fleet.replica_ids() == {"m": ["r0"]} and fakes["host:9001"].closed
        assert (await d.infer("m", request([1, 1]))).replica == "r0"
        with pytest.raises(ConfigError, match="'r0' is already served"):
            await d.add_replica(MODEL, served("r0", 9000))
        await d.stop()

    run(main())


def test_start_checks_every_replicas_signature_against_the_first():
    async def main() -> None:
        factory, _ = fleet({"host:9001": DIMS})
        d = driver(factory, served("r0", 9000), served("r1", 9001))
        with pytest.raises(ConfigError, match=r"^model 'm': variant 'v' has input 'x' FP32 \[3\]"):
            await d.start()
        await d.stop()

    run(main())


def test_a_replica_silent_at_startup_serves_only_once_its_signature_matches(caplog):
    async def main() -> None:
        factory, fakes = fleet({"host:9002": DIMS}, auto=True)
        d = driver(factory, served("r0", 9000), served("r1", 9001), served("r2", 9002), health_interval=0.005)
        for url in ("host:9001", "host:9002"):
            fakes[url].down = True
        await d.start()
        assert [r.healthy for r in d.replicas.values()] == [True, False, False]
        for url in ("host:9001", "host:9002"):
            fakes[url].down = False
        for _ in range(400):  # real time: the health loop probes every 5 ms
            if d.replicas["r1"].healthy and sum("r2" in r.message for r in caplog.records):
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)  # some more probes of r2
        assert d.replicas["r1"].healthy and not d.replicas["r2"].healthy
        refused = [r for r in caplog.records if "r2 stays out of service" in r.message]
        assert len(refused) == 1 and "input 'x' FP32 [3]" in refused[0].message  # logged once
        await d.stop()

    with caplog.at_level(logging.ERROR, logger="headrace.gateway"):
        run(main())


def test_a_new_model_is_served_live_and_goes_with_its_last_replica():
    async def main() -> None:
        factory, fakes = fleet()
        d = driver(factory)
        await d.start()
        with pytest.raises(ModelNotFound):
            d.model("m2")
        await d.add_replica(ServedModel("m2", 1.0, 8, Priority.GUARANTEED, ()), served("s0", 9100, "w"))
        assert d.fleet.replica_ids() == {"m": ["r0"], "m2": ["s0"]} and d.model_ready("m2")
        tasks = [asyncio.create_task(d.infer("m2", request([i, i]))) for i in range(3)]
        await settle()
        assert fakes["host:9100"].calls == [("w", 1)]  # one in flight, two queued
        removal = asyncio.create_task(d.remove_replica("s0"))
        await settle()
        fakes["host:9100"].release()
        assert await removal is True
        first, *queued = await asyncio.gather(*tasks, return_exceptions=True)
        # NOTE: the batch in flight completes; the queue, with nowhere to go, is answered at once
        assert first.replica == "s0"
        assert all(isinstance(r, Rejected) and r.reason == "no_replica" for r in queued), queued
        with pytest.raises(ModelNotFound):
            await d.infer("m2", request([3, 3]))
        assert d.fleet.replica_ids() == {"m": ["r0"]} and not d._pending  # noqa: SLF001
        await d.stop()

    run(main())


def test_keep_model_leaves_a_model_without_replicas_addressable_until_one_comes():
    async def main() -> None:
        factory, fakes = fleet()
        d = driver(factory)
        await d.start()
        await d.add_replica(ServedModel("m2", 1.0, 8, Priority.GUARANTEED, ()), served("s0", 9100, "w"))
        assert await d.remove_replica("s0", keep_model=True) is True
        # NOTE: refused as while every replica is down (429 no_replica), never 404
        with pytest.raises(Rejected) as e:
            await d.infer("m2", request([1, 1]))
        assert e.value.reason == "no_replica"
        await d.add_replica(ServedModel("m2", 1.0, 8, Priority.GUARANTEED, ()), served("s1", 9101, "w"))
        task = asyncio.create_task(d.infer("m2", request([2, 2])))
        await settle()
        fakes["host:9101"].release()
        assert (await task).replica == "s1"
        await d.stop()

    run(main())
