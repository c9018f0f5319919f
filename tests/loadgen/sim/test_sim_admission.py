"""The admission default, as ``bench.admission_tradeoff`` decided it by measurement: ``burst``.

It admits as ``plan`` does under steady load (the same answers, record for record) and, in
bursts, refuses at arrival what ``plan`` would admit and later expire, so many more admitted
requests finish on time. Everything that reads scheduler settings (the gateway config, the
operator's Gateway document, ``headrace sim``) gets it when the setting is left out."""

from __future__ import annotations

import json

import numpy as np

from deploy.cli import main as headrace
from gateway.config import parse_config, scheduler_config
from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.types import ReplicaInfo
from loadgen.arrivals import Gamma, Poisson, times
from loadgen.sim.simulator import SimReplica, Simulator, make_requests
from tests.policy_builders import fake_profile

DECIDED = "burst"


def run(config: SchedulerConfig, arrivals: np.ndarray) -> dict:
    rep = SimReplica(ReplicaInfo("r0", "m", "m", fake_profile(), 32))
    res = Simulator(EdfScheduler(config), [rep]).run(make_requests(arrivals, "m", 0.1))
    return {"records": res.records, **res.summary()}


def test_the_default_is_the_measured_choice_everywhere_settings_are_read(tmp_path) -> None:
    assert SchedulerConfig().admission == DECIDED
    assert scheduler_config({}, "test").admission == DECIDED
    cfg = parse_config({"models": [{"name": "m", "slo_ms": 100, "replicas": [
        {"url": "127.0.0.1:9000", "variant": "resnet50", "profile": "resnet50@A100-80GB/1g.10gb"}]}]})
    assert scheduler_config(cfg.scheduler, "test").admission == DECIDED
    out = tmp_path / "s.json"
    assert headrace(["sim", "--rate", "100", "--duration", "1", "--quiet", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["sim"]["scheduler"]["admission"] == DECIDED


def test_under_steady_load_the_default_admits_exactly_as_plan() -> None:
    # NOTE: at 250 req/s Poisson a 50 ms window never holds 1.5x the replica's capacity
    ts = times(Poisson(250), 20, np.random.default_rng(7))
    assert run(SchedulerConfig(), ts)["records"] == run(SchedulerConfig(admission="plan"), ts)["records"]


def test_in_bursts_the_default_keeps_admitted_requests_on_time() -> None:
    ts = times(Gamma(350, 4.0), 30, np.random.default_rng(1))
    default, plan = run(SchedulerConfig(), ts), run(SchedulerConfig(admission="plan"), ts)
    assert default["admitted_attainment"] >= plan["admitted_attainment"] + 0.03
    # for a little goodput: what it refuses at arrival, plan partly serves
    assert default["goodput_rps"] >= 0.95 * plan["goodput_rps"]
