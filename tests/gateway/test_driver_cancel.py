"""Cancellation through the driver: a waiter that gives up (a cancelled gRPC call, an HTTP
client gone) takes its queued request out of the core, so it never reaches a replica."""

from __future__ import annotations

import asyncio

from tests.gateway.test_driver_live_replicas import driver, fleet, run
from tests.gateway.test_gateway_driver import request, settle


def test_a_cancelled_waiter_never_reaches_the_replica_and_the_rest_are_served():
    async def main() -> None:
        factory, fakes = fleet()
        d = driver(factory)
        await d.start()
        busy = asyncio.create_task(d.infer("m", request([0, 0])))  # holds the replica
        await settle()
        waiting = [asyncio.create_task(d.infer("m", request([i, i]))) for i in (1, 2, 3)]
        await settle()
        waiting[1].cancel()  # the client of the middle one gives up while it is queued
        await settle()
        rep = fakes["host:9000"]
        rep.release()
        await busy
        await settle()
        rep.release()
        done = await asyncio.gather(*waiting, return_exceptions=True)
        # NOTE: the replica saw the first batch and then only the two requests still wanted
        assert [rows for _, rows in rep.calls] == [1, 2], rep.calls
        assert isinstance(done[1], asyncio.CancelledError)
        assert not isinstance(done[0], BaseException) and not isinstance(done[2], BaseException)
        assert not d._pending  # noqa: SLF001  (the invariant under test: nothing left behind)
        assert 'headrace_cancelled_total{model="m"} 1.0' in d.render_metrics().decode()
        await d.stop()

    run(main())


def test_a_waiter_cancelled_in_flight_leaves_the_batch_to_its_other_waiters():
    async def main() -> None:
        factory, fakes = fleet()
        d = driver(factory)
        await d.start()
        busy = asyncio.create_task(d.infer("m", request([0, 0])))
        await settle()
        pair = [asyncio.create_task(d.infer("m", request([i, i]))) for i in (1, 2)]
        await settle()
        rep = fakes["host:9000"]
        rep.release()
        await busy
        await settle()
        assert rep.calls[-1] == ("v", 2)  # both in one batch, now in flight
        pair[0].cancel()
        await settle()
        rep.release()
        out = await pair[1]
        assert out.outputs and not d._pending  # noqa: SLF001
        await d.stop()

    run(main())


def test_a_batch_whose_every_waiter_is_gone_is_cancelled_and_frees_its_replica():
    async def main() -> None:
        factory, fakes = fleet()
        d = driver(factory)
        await d.start()
        rep = fakes["host:9000"]
        task = asyncio.create_task(d.infer("m", request([1, 1])))
        await settle()
        gate = rep.gates[-1]
        task.cancel()
        await settle()
        assert gate.cancelled()  # the call to the replica itself was cancelled
        assert not d._pending and d.core.pending == 0  # noqa: SLF001
        # the replica is free at once: the next request goes out without waiting for the first
        nxt = asyncio.create_task(d.infer("m", request([2, 2])))
        await settle()
        assert rep.calls == [("v", 1), ("v", 1)]
        rep.release()
        await nxt
        assert 'headrace_cancelled_total{model="m"} 1.0' in d.render_metrics().decode()
        await d.stop()

    run(main())
