"""The load driver sends each request's priority band (a seeded mix) and its tenant (when the
workload has tenants) as the gateway's headers."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiohttp import web

from deploy.cli import main
from loadgen.llm.driver import Target, drive, parse_mix, priorities
from loadgen.llm.workload import TraceRows, Workload


def test_a_mix_gives_critical_and_sheddable_their_shares_and_standard_the_rest() -> None:
    mix = parse_mix("critical=0.2, sheddable=0.5")
    bands = priorities(mix, 4000, seed=1)
    share = {b: bands.count(b) / len(bands) for b in ("critical", "standard", "sheddable")}
    assert share == pytest.approx({"critical": 0.2, "standard": 0.3, "sheddable": 0.5}, abs=0.03)
    assert priorities(mix, 50, seed=1) == bands[:50] and priorities(mix, 50, seed=2) != bands[:50]
    assert set(priorities(parse_mix("standard=1"), 20, seed=0)) == {"standard"}


@pytest.mark.parametrize(("text", "says"), [
    ("urgent=0.1", "unknown band 'urgent'"), ("critical=2", "must be a number in [0, 1]"),
    ("critical", "must be a number"), ("critical=0.6,sheddable=0.6", "more than 1"),
])
def test_a_bad_mix_is_refused_in_one_line(text: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=says.replace("[", r"\[").replace("]", r"\]")):
        parse_mix(text)
    rc = main(["load", "llm", "--url", "http://127.0.0.1:9", "--model", "m", "--requests", "1",
               "--priority-mix", text])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1


def test_each_request_carries_its_band_and_tenant() -> None:
    seen: list[tuple[str | None, str | None]] = []

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        seen.append((request.headers.get("x-headrace-priority"), request.headers.get("x-headrace-tenant")))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"text":" ka"}]}\n\ndata: [DONE]\n\n')
        return resp

    async def go(work: Workload, mix: dict[str, float] | None) -> list:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            outcomes, _ = await drive(work, Target(f"http://127.0.0.1:{runner.addresses[0][1]}", "m",
                                                   priority_mix=mix))
            return outcomes
        finally:
            await runner.cleanup()

    n = 6
    rows = TraceRows(np.linspace(0, 0.01, n), np.full(n, 8), np.full(n, 1), (), np.array([0, 1, 0, 2, 1, 0]))
    work = Workload("shared-prefix", rows, seed=4)
    outcomes = asyncio.run(go(work, {"critical": 0.5}))
    bands = priorities({"critical": 0.5}, n, seed=4)
    assert sorted(seen) == sorted(zip(bands, [f"tenant-{t}" for t in (0, 1, 0, 2, 1, 0)], strict=True))
    assert [(o.band, o.tenant) for o in outcomes] == list(zip(bands, [f"tenant-{t}" for t in (0, 1, 0, 2, 1, 0)],
                                                              strict=True))
    seen.clear()
    plain = Workload("poisson", TraceRows(np.zeros(2), np.full(2, 8), np.full(2, 1), ()), seed=4)
    asyncio.run(go(plain, None))
    assert seen == [(None, None), (None, None)]  # NOTE: no mix and no tenants: no headers
