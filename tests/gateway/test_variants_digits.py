"""Variant choice end to end on real models: the digits family (three trained MLPs of
different size and held-out accuracy) behind real Triton, as three variants of one served
model. Requests with an accuracy floor, a cost cap and a pin each get a variant that honours
them, over HTTP and gRPC; each variant's accuracy on the held-out rows it served agrees with
its measured accuracy."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from gateway.app import GatewayThread
from gateway.config import parse_config
from profiles.digits.family import MEASURED_DIR, VARIANTS, dataset, write_digits_models
from profiles.profile import ProfileSet
from profiles.triton.server import TritonServer

pytestmark = pytest.mark.integration

SIZES = ("digits-small", "digits-medium", "digits-large")
PRICE = 1.0  # $/h of the host every variant runs on: cost differs by each profile's time per row


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    write_digits_models(repo, list(SIZES), max_batch=32)
    with TritonServer(repo) as t:
        yield t


def measured() -> dict[str, ProfileSet]:
    return {p.variant: p for p in ProfileSet.load(MEASURED_DIR).find(model="digits")}


def cost_per_1000(variant: str) -> float:
    p = measured()[variant].with_max_batch(32)
    return p.latency(32) / 32 * PRICE / 3600 * 1000


@pytest.fixture(scope="module", params=["accuracy", "cost"])
def gateway(triton, request):
    replicas = [{"url": triton.http_url, "variant": v, "profile": str(MEASURED_DIR / f"{v}.yaml"),
                 "price_per_hour": PRICE, "id": v} for v in SIZES]
    doc = {"listen": {"http_port": 0, "grpc_port": 0},
           "models": [{"name": "digits", "slo_ms": 2000, "max_batch": 32, "objective": request.param,
                       "replicas": replicas}]}
    with GatewayThread(parse_config(doc)) as gw:
        yield request.param, gw


def rows(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    _, x_te, _, y_te = dataset(VARIANTS["digits-small"])
    return x_te[:n].astype(np.float32), y_te[:n]


def http_ask(gw, x: np.ndarray, **params) -> tuple[str, np.ndarray]:  # noqa: ANN001
    c = httpclient.InferenceServerClient(gw.http_url)
    try:
        inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        res = c.infer("digits", [inp], parameters=params or None)
        return res.get_response()["parameters"]["headrace_variant"], res.as_numpy("PROBS")
    finally:
        c.close()


def grpc_ask(gw, x: np.ndarray, headers: dict[str, str]) -> str:  # noqa: ANN001
    c = grpcclient.InferenceServerClient(gw.grpc_url)
    try:
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        res = c.infer("digits", [inp], headers=headers)
        return res.get_response().parameters["headrace_variant"].string_param
    finally:
        c.close()


def test_each_constraint_gets_a_variant_that_honours_it(gateway):
    objective, gw = gateway
    acc = {v: p.accuracy for v, p in measured().items()}
    cost = {v: cost_per_1000(v) for v in SIZES}

    def best(allowed: list[str]) -> str:  # what the objective picks among allowed variants
        return max(allowed, key=acc.get) if objective == "accuracy" else min(allowed, key=cost.get)

    x, _ = rows(1)
    assert http_ask(gw, x)[0] == best(list(SIZES))
    floor = (acc["digits-small"] + acc["digits-medium"]) / 2  # small falls short of it
    got, _ = http_ask(gw, x, headrace_min_accuracy=floor)
    assert acc[got] >= floor and got == best([v for v in SIZES if acc[v] >= floor])
    cheapest = min(SIZES, key=cost.get)
    cap = cost[cheapest] * 1.0001  # only the cheapest costs no more than the cap
    got, _ = http_ask(gw, x, headrace_max_cost=cap)
    assert cost[got] <= cap and got == cheapest
    assert http_ask(gw, x, headrace_variant="digits-medium")[0] == "digits-medium"
    # the same constraints as gRPC metadata
    assert grpc_ask(gw, x, {"x-headrace-variant": "digits-small"}) == "digits-small"
    got = grpc_ask(gw, x, {"x-headrace-min-accuracy": str(floor)})
    assert acc[got] >= floor


def test_held_out_accuracy_per_variant_matches_what_was_measured(gateway):
    _, gw = gateway
    x, y = rows(400)
    report = {}
    for v in SIZES:
        hits = 0
        for start in range(0, len(x), 32):  # the model's max batch per request
            served, probs = http_ask(gw, x[start:start + 32], headrace_variant=v)
            assert served == v
            hits += int((probs.argmax(1) == y[start:start + 32]).sum())
        report[v] = hits / len(x)
    acc = {v: p.accuracy for v, p in measured().items()}
    for v in SIZES:
        assert abs(report[v] - acc[v]) < 0.06, (v, report[v], acc[v])
    assert report["digits-large"] > report["digits-small"]
