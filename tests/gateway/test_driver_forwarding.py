"""The driver's side of the request contract, against fake replicas: what a batch forwards
(the members' common parameters, outputs and version, and Triton's ``timeout`` from the
remaining budget), a named version goes only to replicas serving it, the client's own
deadline caps the budget, and malformed contract parameters are refused before queueing."""

from __future__ import annotations

import asyncio

import pytest

from gateway.codec import RequestedOutput
from gateway.contract import Forward
from gateway.errors import InvalidRequest
from tests.gateway.test_front_door_contract import versioned_driver
from tests.gateway.test_gateway_driver import Clock, make_driver, request, run, settle


def test_a_batch_forwards_its_members_parameters_outputs_and_the_remaining_budget():
    async def main() -> None:
        clock = Clock()
        d, (fake,) = make_driver(clock, slo=1.0)
        await d.start()
        busy = asyncio.create_task(d.infer("m", request([0, 0])))
        await settle()
        clock.now += 0.2
        inp = request([1, 1], color="red", priority=1, timeout=800_000, headrace_note="x",
                      binary_data_output=True)
        inp.outputs = [RequestedOutput("y", True, {"classification": 2})]
        asked = asyncio.create_task(d.infer("m", inp))
        await settle()
        fake.release()
        await settle()
        fwd, triton_us = fake.forwarded[-1]
        assert fwd == Forward("", (("color", "red"),), (("y", (("classification", 2),)),))
        assert 0 < triton_us <= 800_000  # what is left of its own 0.8 s
        assert fake.forwarded[0] == (None, fake.forwarded[0][1])  # nothing asked: nothing forwarded
        fake.release()
        await asyncio.gather(busy, asked)
        await d.stop()

    run(main())


def test_a_named_version_goes_only_to_replicas_that_serve_it():
    async def main() -> None:
        d = versioned_driver(9000, 9001)  # r9000 serves 1 and 3, r9001 serves 2
        await d.start()
        fakes = {r.id: r.client for r in d.replicas.values()}
        for version, where in (("2", "r9001"), ("3", "r9000"), ("1", "r9000")):
            task = asyncio.create_task(d.infer("m", request([1, 1]), version=version))
            await settle()
            fake = fakes[where]
            assert fake.forwarded and fake.forwarded[-1][0].version == version
            fake.release()
            await task
            for f in fakes.values():
                f.forwarded.clear()
        await d.stop()

    run(main())


def test_the_clients_own_deadline_caps_the_budget():
    async def main() -> None:
        clock = Clock()
        d, (fake,) = make_driver(clock, slo=10.0)
        await d.start()
        task = asyncio.create_task(d.infer("m", request([1, 1]), deadline=0.5))
        await settle()
        assert 0 < fake.forwarded[-1][1] <= 500_000
        fake.release()
        await task
        await d.stop()

    run(main())


@pytest.mark.parametrize(("params", "match"), [
    ({"color": [1, 2]}, "parameter 'color' must be a string, number or boolean"),
    ({"sequence_id": -3}, "sequence_id"),
    ({"sequence_id": 5, "sequence_start": "yes"}, "sequence_start"),
])
def test_malformed_contract_parameters_are_refused_before_queueing(params, match):
    async def main() -> None:
        d, (fake,) = make_driver(Clock())
        await d.start()
        with pytest.raises(InvalidRequest, match=match):
            d.submit("m", request([1, 1], **params))
        assert d.core.pending == 0 and not fake.calls
        await d.stop()

    run(main())
