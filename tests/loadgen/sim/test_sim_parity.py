"""``headrace sim -f`` simulates the fleet ``headrace serve`` and ``headrace up`` would run: the
same YAML, the same scheduler settings (all of them), the operator's plan rendered by its own
functions, faults, every arrival process of ``headrace load``, and ``headrace load``'s report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from deploy.cli import main as headrace
from gateway.policy import SchedulerConfig
from loadgen.run import _result
from loadgen.sim.fleet import load_fleet
from loadgen.spec import LoadSpec
from loadgen.stats import Recorder
from placement.apply.render import replica_profile
from profiles.catalogue import gpu_model

QUICKSTART = "deploy/examples/quickstart"


def gateway_yaml(tmp_path: Path, scheduler: dict, models: int = 1) -> Path:
    doc = {"models": [{"name": f"m{k}", "slo_ms": 100, "max_batch": 16, "replicas": [
        {"url": f"127.0.0.1:{9000 + 10 * k + i}", "variant": "resnet50", "id": f"m{k}-r{i}",
         "profile": "resnet50@A100-80GB/1g.10gb"} for i in range(2)]} for k in range(models)],
        "scheduler": scheduler}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def sim(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "out.json"
    assert headrace(["sim", *args, "--quiet", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_scheduler_setting_of_the_gateway_config_reaches_the_core(tmp_path) -> None:
    # NOTE: every field differs from its default, so a setting dropped on the way shows
    settings = {"policy": "skip-heads", "quantile": "p50", "admission": "burst", "burst_window_s": 0.1,
                "burst_factor": 2.5, "wait": True, "headroom": 0.3, "rate_window_s": 2.0,
                "min_retry_after_s": 0.5, "no_replica_retry_after_s": 3.0, "variant_dwell_s": 5.0,
                "learn_overhead": False, "overhead_quantile": 0.8, "overhead_step_s": 0.001,
                "max_overhead_s": 0.02, "pipeline_lead_s": 0.005, "max_queue_delay_s": 0.001,
                "queue_timeout_s": 1.0, "request_timeouts": True}
    assert set(settings) == set(SchedulerConfig.model_fields)
    fleet = load_fleet([gateway_yaml(tmp_path, settings)])
    assert fleet.scheduler == SchedulerConfig(**settings)
    assert [r.info.id for r in fleet.replicas] == ["m0-r0", "m0-r1"]
    assert all(r.info.max_batch == 16 and r.info.max_inflight == 2 for r in fleet.replicas)
    s = sim(tmp_path, "-f", str(tmp_path / "gateway.yaml"), "--duration", "2", "--set", "burst_factor=4")
    assert s["sim"]["scheduler"] == {**SchedulerConfig(**settings).model_dump(mode="json"), "burst_factor": 4.0}


def test_a_bad_setting_is_one_line_naming_it(tmp_path, capsys) -> None:
    assert headrace(["sim", "-f", str(gateway_yaml(tmp_path, {"burst_factr": 2}))]) == 2
    assert "scheduler.burst_factr" in capsys.readouterr().err
    assert headrace(["sim", "--set", "admission=sometimes"]) == 2
    assert "scheduler.admission" in capsys.readouterr().err


def test_operator_documents_are_planned_and_rendered_as_the_operator_does() -> None:
    fleet = load_fleet([QUICKSTART])
    assert fleet.plan is not None and set(fleet.models) == {"resnet50", "digits"}
    assert fleet.models["resnet50"].slo == 0.1 and fleet.models["digits"].slo == 0.05
    from placement.problem import load
    _, _, profiles = load([str(p) for p in sorted(Path(QUICKSTART).glob("*.yaml"))], [])
    # each simulated replica runs at the latency render predicts for its slice and share
    for r, planned in zip(fleet.replicas, fleet.plan["replicas"], strict=True):
        assert r.info.id == planned["id"]
        gpu = next(g for g in ("A100-80GB", "cpu") if _on(planned["slice"], g))
        from placement.apply.render import Endpoint
        e = Endpoint(planned["id"], planned["model"], planned["variant"], planned["slice"].rsplit("/", 1)[0],
                     planned["slice"].rsplit("/", 1)[1], planned["share"], planned["max_batch"], 0.0, "x:1", "x:1")
        want = replica_profile(profiles, gpu_model(gpu).name, e)
        # (the rendered file keeps latencies to a tenth of a microsecond)
        assert [r.info.profile.latency(b, "p50") for b in (1, 8)] == pytest.approx(
            [want.latency(b, "p50") for b in (1, 8)], abs=1e-7)


def _on(slice_: str, gpu: str) -> bool:
    return ("gpu1" in slice_) == (gpu == "cpu")


def test_a_replica_down_and_back_serves_nothing_in_between_and_all_is_answered(tmp_path) -> None:
    path = gateway_yaml(tmp_path, {})
    s = sim(tmp_path, "-f", str(path), "--rate", "550", "--duration", "6", "--warmup", "0",
            "--down", "m0-r0=2:4", "--window", "1")
    assert s["sim"]["unanswered"] == 0 and s["offered"] > 3000
    base = sim(tmp_path, "-f", str(path), "--rate", "550", "--duration", "6", "--warmup", "0")
    # one replica of two left for 2 s of 6 at a rate one replica cannot carry alone
    assert s["good"] < base["good"] - 100
    hit = [w for w in s["timeline"] if 2 <= w["t"] < 4]
    assert all(w["attainment"] < 0.95 for w in hit)
    assert all(w["attainment"] > 0.97 for w in s["timeline"] if w["t"] >= 5)


def test_a_slow_replica_slows_answers_from_then_on(tmp_path) -> None:
    path = gateway_yaml(tmp_path, {})
    args = ("-f", str(path), "--rate", "100", "--duration", "6", "--warmup", "0", "--window", "3")
    fast = sim(tmp_path, *args)
    slow = sim(tmp_path, *args, "--slow", "m0-r0=3@3", "--slow", "m0-r1=3@3")
    assert slow["timeline"][0]["p50_ms"] == fast["timeline"][0]["p50_ms"]
    assert slow["timeline"][1]["p50_ms"] > 2 * fast["timeline"][1]["p50_ms"]


def test_unknown_fault_replica_is_named(tmp_path, capsys) -> None:
    assert headrace(["sim", "-f", str(gateway_yaml(tmp_path, {})), "--down", "zz=1"]) == 2
    assert "unknown replica 'zz'; known: m0-r0, m0-r1" in capsys.readouterr().err


def test_traces_and_mixes_address_several_models(tmp_path) -> None:
    path = gateway_yaml(tmp_path, {}, models=2)
    trace = sim(tmp_path, "-f", str(path), "--arrival", "trace", "--trace", "loadgen/data/azure_sample.csv",
                "--duration", "4")
    assert set(trace["per_model"]) == {"m0", "m1"} and trace["rate"] is None
    assert trace["run"]["spec"]["arrival"] == "trace"
    mix = sim(tmp_path, "-f", str(path), "--mix", "m0:3,m1:1", "--rate", "200", "--duration", "5")
    n0, n1 = mix["per_model"]["m0"]["offered"], mix["per_model"]["m1"]["offered"]
    assert 2.4 < n0 / n1 < 3.8
    ts = tmp_path / "ts.txt"
    ts.write_text("\n".join(str(0.01 * i) for i in range(300)))
    stamped = sim(tmp_path, "-f", str(path), "--arrival", "timestamps", "--timestamps", str(ts),
                  "--model", "m1", "--warmup", "0", "--duration", "3")
    assert stamped["offered"] == 300 and set(stamped["per_model"]) == {"m1"}


def test_the_report_is_headrace_loads_with_a_sim_section(tmp_path) -> None:
    s = sim(tmp_path, "--rate", "200", "--duration", "2")
    spec = LoadSpec(target="http://h:1", model="m", slo_ms=100)
    live = _result(spec, Recorder(), 1.0, 0.0).summary
    assert set(live) <= set(s) and "sim" in s
    assert s["run"]["spec"]["rate"] == 200 and s["warmup_offered"] > 0


def test_models_that_share_nothing_simulate_apart_with_the_same_result(tmp_path) -> None:
    path = gateway_yaml(tmp_path, {}, models=2)
    args = ("-f", str(path), "--rate", "500", "--arrival", "gamma", "--duration", "4")
    one, two = sim(tmp_path, *args), sim(tmp_path, *args, "--processes", "2")
    assert two["processes"] == 2 and two["sim"]["groups"] == 2
    for key in ("offered", "good", "rejected", "expired", "latency_ms", "per_model", "timeline"):
        assert one[key] == two[key]


@pytest.mark.parametrize("flag", ["--down", "--slow"])
def test_bad_fault_syntax_is_refused(tmp_path, capsys, flag) -> None:
    assert headrace(["sim", flag, "r0"]) == 2
    assert flag in capsys.readouterr().err
