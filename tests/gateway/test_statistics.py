"""Triton-shaped statistics, read at the gateway: per model, version and variant, with queue,
compute and batch statistics, successes and failures (driver against fake replicas)."""

from __future__ import annotations

import asyncio

import pytest
from tritonclient.grpc import service_pb2 as pb

from gateway.errors import GatewayError
from gateway.frontdoor.stats import ServerInfo
from tests.gateway.test_front_door_contract import versioned_driver
from tests.gateway.test_gateway_driver import Clock, make_driver, request, run, settle


def stats_of(d, model: str = "m", version: str = "") -> dict[tuple[str, str], pb.ModelStatistics]:  # noqa: ANN001
    info = ServerInfo([model], default_version=d.fleet.default_version, stats=d.stats)
    return {(s.name, s.version): s for s in info.statistics(model, version).model_stats}


def test_batches_queue_and_compute_are_counted_per_model_and_variant():
    async def main() -> None:
        clock = Clock()
        d, (fake,) = make_driver(clock, slo=1.0)
        await d.start()
        first = asyncio.create_task(d.infer("m", request([0, 0])))
        await settle()
        clock.now += 0.01
        rest = [asyncio.create_task(d.infer("m", request([i, i], [i, -i]))) for i in (1, 2)]
        await settle()
        clock.now += 0.02  # the first batch takes 30 ms at the replica
        fake.release()
        await settle()
        clock.now += 0.005
        fake.release()
        await asyncio.gather(first, *rest)
        with pytest.raises(GatewayError):  # refused at once: counted as a failure
            d.submit("m", request(*[[1, 1]] * 9))
        s = stats_of(d)
        model, variant = s[("m", "1")], s[("m/v", "1")]
        for e in (model, variant):
            assert e.inference_count == 5 and e.execution_count == 2  # rows, batches
            st = e.inference_stats
            assert st.success.count == 3 and st.queue.count == 3 and st.compute_infer.count == 3
            assert [(b.batch_size, b.compute_infer.count) for b in e.batch_stats] == [(1, 1), (4, 1)]
        assert model.inference_stats.fail.count == 1
        # the first waited 0 in the queue; the other two 20 ms each (sent when the replica freed)
        assert model.inference_stats.queue.ns == pytest.approx(2 * 0.02e9, rel=0.01)
        assert model.batch_stats[0].compute_infer.ns == pytest.approx(0.03e9, rel=0.01)
        await d.stop()

    run(main())


def test_a_named_version_is_counted_under_it():
    async def main() -> None:
        d = versioned_driver(9000, 9001)  # r9000 serves 1 and 3, r9001 serves 2; 3 is the default
        await d.start()
        fakes = {r.id: r.client for r in d.replicas.values()}
        for version, where in (("2", "r9001"), ("", "r9000")):
            task = asyncio.create_task(d.infer("m", request([1, 1]), version=version))
            await settle()
            fakes[where].release()
            await task
        s = stats_of(d)
        assert s[("m", "2")].inference_stats.success.count == 1
        assert s[("m", "3")].inference_stats.success.count == 1
        only = stats_of(d, version="2")
        assert set(only) == {("m", "2"), ("m/v", "2")}
        await d.stop()

    run(main())
