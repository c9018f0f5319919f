"""Scale from zero at the gateway: requests for a model with no replica wait for its first one
(the operator is asked once), go on when it is added, and get 503 with Retry-After when it does
not come in time; a model not scaled to zero is not held."""

from __future__ import annotations

import asyncio

import pytest

from gateway.coldstart import ColdStart
from gateway.errors import NoReplica


def test_waiters_share_one_start_and_go_on_when_a_replica_serves() -> None:
    asked: list[str] = []

    async def run() -> list[float]:
        cold = ColdStart(asked.append, {"m": 30.0})
        waiters = [asyncio.ensure_future(cold.wait("m")) for _ in range(3)]
        await asyncio.sleep(0)  # every waiter waits now
        assert asked == ["m"] and not any(w.done() for w in waiters)
        cold.ready("m")
        return await asyncio.gather(*waiters)

    waited = asyncio.run(run())
    # NOTE: one start for three requests, and each went on at once when the replica came
    assert asked == ["m"] and len(waited) == 3 and all(0 <= w < 1.0 for w in waited)


def test_a_replica_that_does_not_come_in_time_is_a_503_with_retry_after_and_the_next_asks_again() -> None:
    asked: list[str] = []

    async def run() -> None:
        cold = ColdStart(asked.append, {"m": 0.01}, retry_after_s=5.0)
        with pytest.raises(NoReplica) as e:
            await cold.wait("m")
        assert e.value.http_status == 503 and e.value.retry_after == 5.0 and "one is starting" in str(e.value)
        with pytest.raises(NoReplica):
            await cold.wait("m")

    asyncio.run(run())
    assert asked == ["m", "m"]


def test_only_models_scaled_to_zero_are_held() -> None:
    cold = ColdStart(lambda m: None, {"m": 1.0})
    assert cold.holds("m") and not cold.holds("other")
