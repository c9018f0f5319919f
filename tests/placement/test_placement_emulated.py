"""An emulated apply of a small plan serves real requests through the gateway."""

from __future__ import annotations

import numpy as np
import pytest

from placement.plan import Demand, GpuClass, Inventory
from placement.solve.solver import solve
from profiles.derive import with_derived
from profiles.profile import ProfileSet

pytestmark = pytest.mark.integration


def test_emulated_plan_serves_through_the_gateway():
    tritonclient_http = pytest.importorskip("tritonclient.http")
    from gateway.app import GatewayThread
    from placement.apply.emulated import Emulated
    from placement.apply.render import gateway_config

    ps = with_derived(ProfileSet.reference())
    inv = Inventory((GpuClass("A100-80GB", ("local/gpu0",), 1.0, True, True),))
    plan = solve([Demand("resnet50", 500.0, 0.1)], ps, inv, "milp")
    plan.verify()
    with Emulated(ps) as ex:
        endpoints = ex.apply(plan)
        assert len(endpoints) == len(plan.replicas()) >= 1
        cfg = gateway_config(plan, ex.endpoints.values(), ex.profiles, ex.workdir / "profiles")
        with GatewayThread(cfg) as gw:
            client = tritonclient_http.InferenceServerClient(gw.http_url)
            x = np.arange(16, dtype=np.float32).reshape(1, 16)
            for _ in range(5):
                inp = tritonclient_http.InferInput("INPUT0", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                out = client.infer("resnet50", [inp]).as_numpy("OUTPUT0")
                # NOTE: the emulated model answers INPUT + 1, row for row
                np.testing.assert_array_equal(out, x + 1)
            client.close()


@pytest.mark.slow
def test_predicted_capacity_holds_when_served():
    from bench.placement_capacity import measure, scenario_plans

    ps = with_derived(ProfileSet.reference())
    plan = scenario_plans(ps)["1g.10gb exclusive"]
    row = measure(plan, ps, duration=15.0)
    # NOTE: goodput within 10% of the plan's prediction, at the predicted rate
    assert row["goodput_rps"] >= 0.9 * row["predicted_rps"], row
