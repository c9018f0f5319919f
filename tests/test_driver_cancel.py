"""Cancellation through the driver: a waiter that gives up (a cancelled gRPC call, an HTTP
client gone) takes its queued request out of the core, so it never reaches a replica."""

from __future__ import annotations

import asyncio

from tests.test_driver_live_replicas import driver, fleet, run
from tests.test_gateway_driver import request, settle


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


def test_a_waiter_cancelled_in_flight_leaves_the_batch_to_finish():
    async def main() -> None:
        factory, fakes = fleet()
        d = driver(factory)
        await d.start()
        task = asyncio.create_task(d.infer("m", request([1, 1])))
        await settle()
        task.cancel()
        await settle()
        fakes["host:9000"].release()
        await settle()
        assert fakes["host:9000"].calls == [("v", 1)] and not d._pending  # noqa: SLF001
        await d.stop()

    run(main())
