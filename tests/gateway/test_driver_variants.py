"""Variant constraints through the driver (fake replicas): a request's minimum accuracy, cost
cap and pin, given as request parameters or as headers, choose the variant that serves it, and
the answer names it; a malformed constraint or a pin to no variant is a 400 before queueing;
the model's objective orders the allowed variants."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from gateway.config import ServedModel, ServedReplica
from gateway.contract import choice_headers
from gateway.driver import Driver
from gateway.errors import InvalidRequest, Rejected
from gateway.policy.config import SchedulerConfig
from gateway.policy.scheduler import EdfScheduler
from gateway.policy.types import Priority
from tests.gateway.test_driver_live_replicas import fleet
from tests.gateway.test_gateway_driver import Clock, profile, request

# variant -> (accuracy, price per hour): the big one is the most accurate and the dearest
VARIANTS = {"big": (0.80, 4.0), "mid": (0.76, 2.0), "small": (0.70, 1.0)}


def driver(objective: str = "accuracy") -> Driver:
    reps = tuple(ServedReplica(f"{v}-0", f"host:{9000 + i}", "http", v,
                               replace(profile(), variant=v, accuracy=acc), 1, None, price)
                 for i, (v, (acc, price)) in enumerate(VARIANTS.items()))
    model = ServedModel("m", 1.0, 8, Priority.GUARANTEED, reps, objective=objective)
    factory, _ = fleet(auto=True)
    return Driver([model], EdfScheduler(SchedulerConfig(wait=False)), clock=Clock(), health_interval=3600,
                  replica_factory=factory)


def served_by(objective: str, **kw) -> str:
    async def main() -> str:
        d = driver(objective)
        await d.start()
        try:
            hints = kw.pop("hints", None)
            res = await d.infer("m", request([1, 1], **kw), hints=hints)
            return res.parameters()["headrace_variant"]
        finally:
            await d.stop()

    return asyncio.run(main())


def test_constraints_as_parameters_choose_the_variant():
    assert served_by("accuracy") == "big"
    assert served_by("cost") == "small"
    assert served_by("cost", headrace_min_accuracy=0.75) == "mid"
    assert served_by("accuracy", headrace_variant="small") == "small"
    # the cost cap is per 1,000 answers: mid's cost per answer is (t(8) / 8) * $2/h
    mid_per_1000 = profile().latency(8) / 8 * 2.0 / 3600 * 1000
    assert served_by("accuracy", headrace_max_cost=mid_per_1000 * 1.0001) == "mid"


def test_constraints_as_headers_and_parameters_win():
    hints = choice_headers({"x-headrace-variant": "mid", "x-headrace-min-accuracy": "0.7", "other": "x"})
    assert hints == {"headrace_variant": "mid", "headrace_min_accuracy": "0.7"}
    assert served_by("accuracy", hints=hints) == "mid"
    assert served_by("accuracy", hints=hints, headrace_variant="small") == "small"
    assert choice_headers([("x-headrace-max-cost", b"0.5")]) == {"headrace_max_cost": "0.5"}
    assert choice_headers({"x-other": "1"}) is None


@pytest.mark.parametrize(("params", "match"), [
    ({"headrace_variant": "huge"}, r"model 'm' has no variant 'huge'; variants: \['big', 'mid', 'small'\]"),
    ({"headrace_min_accuracy": 1.5}, r"headrace_min_accuracy 1.5 must be a number in \[0, 1\]"),
    ({"headrace_max_cost": "cheap"}, "headrace_max_cost 'cheap' is not a number"),
    ({"headrace_variant": 7}, "headrace_variant 7 must be a variant name"),
])
def test_malformed_constraints_are_400_before_queueing(params, match):
    async def main() -> None:
        d = driver()
        await d.start()
        try:
            with pytest.raises(InvalidRequest, match=match):
                d.submit("m", request([1, 1], **params))
            assert d.core.pending == 0
        finally:
            await d.stop()

    asyncio.run(main())


def test_an_unmeetable_constraint_is_refused_naming_it():
    async def main() -> None:
        d = driver()
        await d.start()
        try:
            with pytest.raises(Rejected, match="accuracy floor 0.9"):
                d.submit("m", request([1, 1], headrace_min_accuracy=0.9))
        finally:
            await d.stop()

    asyncio.run(main())


def test_level_and_moves_are_exported():
    async def main() -> None:
        d = driver()
        await d.start()
        try:
            text = d.render_metrics().decode()
            assert 'headrace_variant_level{model="m"} 0.0' in text
            assert 'headrace_variant_moves{kind="down",model="m"} 0.0' in text
        finally:
            await d.stop()

    asyncio.run(main())
