"""The operator end to end: headrace up (detached), live apply under load, self-healing after
kill -9, autoscaling on a load step, and the admin API's token. Real Triton servers, emulated
GPUs, the gateway; every process stopped by the harness (headrace down, then by pid)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from deploy.operator.client import CliError, call
from tests.operator_harness import (
    LoadThread,
    TritonLoad,
    deployment,
    full_gpu,
    operator_up,
    pool,
    versioned_model,
    write_docs,
)

pytestmark = pytest.mark.integration

DIGITS = ["digits-small", "digits-medium", "digits-large"]


def answered_all(s: dict) -> bool:
    """Every request sent got an answer: a result, or a refusal at arrival or from the queue
    (429 before its deadline); no error, none left hanging."""
    return s["error_count"] == 0 and s["ok"] + s["rejected"] + s["expired"] == s["offered"]


@pytest.mark.slow  # a live acceptance run of 25-65 s: .ci/run runs it as a later step
def test_live_apply_under_load_adds_capacity_and_swaps_a_variant_losing_nothing(tmp_path: Path) -> None:
    resnet = deployment("resnet50", 200, 100)
    digits = deployment("digits", 100, 50, source="digits", variants=DIGITS, accuracy_floor=0.97)
    # the quickstart pool: one emulated A100 and the host, no GPU to spare
    v1 = write_docs(tmp_path / "v1.yaml", pool(a100s=1), resnet, digits)
    with operator_up(tmp_path, v1) as op:
        first = op.status()
        assert [op.condition(d, "Ready") for d in ("resnet50", "digits")] == ["True", "True"]
        cap = {d["name"]: d["capacity_rps"] for d in first["deployments"]}
        serving = [r["variant"] for r in op.deployment("digits")["replicas"]]
        assert len(serving) == 1 and serving[0] in ("digits-medium", "digits-large")
        # ~70% of the planned capacity of each model
        mix = f"resnet50:{0.7 * cap['resnet50']:.0f},digits:{min(0.7 * cap['digits'], 100):.0f}"
        rate = 0.7 * cap["resnet50"] + min(0.7 * cap["digits"], 100)

        # the same load with no change, in the same run
        base = LoadThread(op.http, mix, rate, 8.0, 100, seed=1)
        base.start()
        calm = base.result()
        assert answered_all(calm), calm

        # apply 1 doubles ResNet-50's rate: capacity must grow; apply 2 removes the serving digits variant
        v2 = write_docs(tmp_path / "v2.yaml", pool(a100s=1), deployment("resnet50", 400, 100), digits)
        keep = [v for v in DIGITS if v != serving[0]]
        v3 = write_docs(tmp_path / "v3.yaml", pool(a100s=1), deployment("resnet50", 400, 100),
                        deployment("digits", 100, 50, source="digits", variants=keep, accuracy_floor=0.97))
        pids = op.pids()
        load = LoadThread(op.http, mix, rate, 30.0, 100, seed=2)
        results: dict[str, dict] = {}

        def change() -> None:
            time.sleep(3.0)
            results["dry"] = op.apply(v2, dry_run=True)
            results["v2"] = op.apply(v2)
            results["v3"] = op.apply(v3)

        changer = threading.Thread(target=change, daemon=True)
        load.start()
        changer.start()
        changed = load.result()
        changer.join(120)
        assert set(results) == {"dry", "v2", "v3"}, results
        assert results["dry"]["steps"] == results["v2"]["steps"] and results["dry"]["dry_run"]

        # NOTE: no request lost or failed while the fleet changed under it
        assert answered_all(changed), {k: changed[k] for k in ("offered", "ok", "rejected", "expired", "errors")}
        # capacity never dropped: at most 1% refused (break-before-make refused for seconds). Late
        # answers are not bounded here: in one 30 s run on 2 cores, each new Triton starting on the
        # cores that serve makes 1-6% late in CI; bench/replan.py measures attainment against the
        # no-change runs over 3 rounds (target: within 1 point)
        refused = (changed["rejected"] + changed["expired"]) / changed["offered"]
        assert refused <= 0.01, (refused, changed["attainment"], calm["attainment"])

        # capacity added without touching what both plans keep
        assert results["v2"]["started"] and not results["v2"]["stopped"], results["v2"]
        after = op.status()
        assert after["generation"] == 3 and after["observedGeneration"] == 3
        assert {d["name"]: d["capacity_rps"] for d in after["deployments"]}["resnet50"] > cap["resnet50"]
        stopped = set(results["v3"]["stopped"])
        assert [r for r in stopped if "digits" not in r] == [], stopped
        now = op.pids()
        kept = [k for k in pids if k.startswith("triton:") and k.removeprefix("triton:") not in stopped]
        assert kept and all(now.get(k) == pids[k] for k in kept), (pids, now)  # not restarted
        assert [r["variant"] for r in op.deployment("digits")["replicas"]] != serving
        for d in ("resnet50", "digits"):
            assert op.condition(d, "Ready") == "True" and op.condition(d, "Degraded") == "False"

        # rollback restores generation 2's fleet, as generation 4: the first digits variant serves again
        # (a re-plan of generation 2's documents, which allow every variant, would keep the new one)
        assert serving[0] not in answered_by(op.http, "digits")
        res = op.admin("POST", "/v1/rollback", b"")
        assert res["generation"] == 4 and op.status()["observedGeneration"] == 4
        assert op.admin("GET", "/v1/documents") == v2.read_text()
        assert [r["variant"] for r in op.deployment("digits")["replicas"]] == serving
        assert answered_by(op.http, "digits") == set(serving)  # NOTE: asserted on the answers
        assert op.condition("digits", "Ready") == "True"


def answered_by(url: str, model: str, n: int = 5) -> set[str]:
    """The variants that answered ``n`` tritonclient requests (each answer's ``headrace_variant``)."""
    import numpy as np
    import tritonclient.http as th

    client = th.InferenceServerClient(url)
    inp = client.get_model_metadata(model)["inputs"][0]
    shape = [1] + [int(d) for d in inp["shape"][1:]]
    x = th.InferInput(inp["name"], shape, inp["datatype"])
    x.set_data_from_numpy(np.zeros(shape, dtype=np.float32))
    try:
        return {client.infer(model, [x]).get_response()["parameters"]["headrace_variant"] for _ in range(n)}
    finally:
        client.close()


def test_kill_9_of_a_managed_triton_is_healed_and_every_request_answered(tmp_path: Path) -> None:
    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1, host=False), deployment("resnet50", 150, 100))
    with operator_up(tmp_path, docs) as op:
        reps = op.deployment("resnet50")["replicas"]
        victim = f"triton:{reps[0]['id']}"
        before = op.pids()[victim]
        load = LoadThread(op.http, "resnet50:1", 100, 14.0, 100, seed=3)
        load.start()
        time.sleep(3.0)
        os.killpg(before, signal.SIGKILL)
        op.wait_for("Degraded", lambda: op.condition("resnet50", "Degraded") == "True", timeout=10, period=0.05)
        op.wait_for("Ready again", lambda: op.condition("resnet50", "Ready") == "True", timeout=90)
        s = load.result()
        # NOTE: every request got an answer: served, or refused while no replica was up; none failed or hung
        assert answered_all(s), s
        assert op.pids()[victim] != before  # replaced by a new process
        # a restarted Triton's first second warms its python stub: measured after it, at the SLO
        again = LoadThread(op.http, "resnet50:1", 100, 4.0, 100, seed=4, warmup_s=2.0)
        again.start()
        r = again.result()
        kinds = [e["kind"] for e in op.status()["events"]]
        assert "ReplicaDown" in kinds and "Restarted" in kinds
        # the healed fleet serves at the SLO: a full GC pass over the controller's startup heap would
        # stall the loop ~150 ms (one window of late answers), so the controller freezes that heap
        assert r["attainment"] >= 0.99, r["timeline"]


@pytest.mark.slow  # a live acceptance run of 25-65 s: .ci/run runs it as a later step
def test_a_3x_load_step_scales_up_within_the_delay_and_back_down_once(tmp_path: Path) -> None:
    auto = {"upscale_delay_s": 3, "downscale_delay_s": 6, "min_replicas": 1, "max_replicas": 4}
    # one GPU: the added capacity goes beside the serving replica, make-before-break
    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1, host=False),
                      deployment("resnet50", 50, 40, headroom=1.1, autoscaling=auto))
    with operator_up(tmp_path, docs) as op:
        cap0 = op.deployment("resnet50")["capacity_rps"]
        low = LoadThread(op.http, "resnet50:1", 40, 6.0, 40, seed=4)
        low.start()
        assert answered_all(low.result())
        high = LoadThread(op.http, "resnet50:1", 120, 16.0, 40, seed=5)
        step_at = time.monotonic()
        high.start()
        up_at = op.wait_for("scaled up", lambda: op.deployment("resnet50")["capacity_rps"] > cap0, timeout=30)
        h = high.result()
        assert answered_all(h) and h["errors"] == {}, h["errors"]  # NOTE: no 503 for lack of a replica
        # after the scale-up (the next whole window on): >= 99% within the SLO, <= 1% refused
        late = [w for w in h["timeline"] if w["t"] >= up_at - step_at + 1.0]
        offered = sum(w["offered_rps"] for w in late)
        assert late and sum(w["goodput_rps"] for w in late) >= 0.99 * offered, late
        assert sum(w["rejected_rps"] for w in late) <= 0.01 * offered, late
        # capacity came within the delay (3 s) plus the 3 s rate window, the tick and the apply
        assert up_at - step_at <= 3 + 3 + 10, up_at - step_at
        cap_high = op.deployment("resnet50")["capacity_rps"]
        assert cap_high >= 120
        calm = LoadThread(op.http, "resnet50:1", 40, 24.0, 40, seed=6)
        calm.start()
        op.wait_for("scaled down", lambda: op.deployment("resnet50")["capacity_rps"] < cap_high, timeout=22)
        time.sleep(6.0)  # a downscale delay more of the same load: nothing else may happen
        kinds = [e["kind"] for e in op.status()["events"]]
        assert answered_all(calm.result())
        # NOTE: one event per direction while the load holds a level, no flapping
        assert kinds.count("ScaledUp") == 1 and kinds.count("ScaledDown") == 1, "\n".join(e["message"] for e in op.status()["events"])


def test_admin_calls_without_the_token_get_401_and_change_nothing(tmp_path: Path) -> None:
    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1, host=False), deployment("resnet50", 100, 100))
    with operator_up(tmp_path, docs) as op:
        before = op.state()["plan"]
        bigger = write_docs(tmp_path / "b.yaml", pool(a100s=1, host=False), deployment("resnet50", 900, 100))
        for token in ("", "wrong", op.token + "x"):
            for method, path, body in (("POST", "/v1/apply", bigger.read_bytes()), ("POST", "/v1/down", b""),
                                       ("POST", "/v1/rollback", b""), ("GET", "/v1/status", None)):
                with pytest.raises(CliError, match="^401"):
                    call(op.url, token, method, path, body)
        assert op.state()["plan"] == before and op.status()["generation"] == 1
        log = (op.state_dir / "controller.log").read_text()
        assert op.token not in log  # NOTE: the token is never logged


def scaler(version: int) -> dict:
    # relative paths: resolved against the YAML file's folder
    variant = {"name": "scaler-v1", "artifact": {"uri": "models/scaler", "version": version},
               "profile": "scaler-v1.yaml"}
    return deployment("scaler", 50, 100, source="artifact", variants=[variant])


def test_a_users_own_triton_model_deploys_at_the_pinned_version(tmp_path: Path) -> None:
    import numpy as np
    import tritonclient.http as th

    versioned_model(tmp_path)
    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1), scaler(1))
    with operator_up(tmp_path, docs) as op:
        assert op.condition("scaler", "Ready") == "True"
        client = th.InferenceServerClient(op.http)
        x = th.InferInput("INPUT0", [2, 4], "FP32")
        x.set_data_from_numpy(np.arange(8, dtype=np.float32).reshape(2, 4))
        res = client.infer("scaler", [x])
        # NOTE: version 1 (x2) serves, not the newer version 2 (x3) beside it
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), np.arange(8, dtype=np.float32).reshape(2, 4) * 2)
        client.close()


@pytest.mark.slow  # a live acceptance run of 25-65 s: .ci/run runs it as a later step
def test_a_new_artifact_version_rolls_out_under_load_answering_everything(tmp_path: Path) -> None:
    from deploy.cli import main

    versioned_model(tmp_path)
    resnet = deployment("resnet50", 150, 100)
    v1 = write_docs(tmp_path / "v1.yaml", pool(a100s=1), resnet, scaler(1))
    v2 = write_docs(tmp_path / "v2.yaml", pool(a100s=1), resnet, scaler(2))
    with operator_up(tmp_path, v1) as op:
        pids = op.pids()
        load = TritonLoad(op.http, "scaler", 35.0, 14.0)  # 70% of the deployment's rate
        beside = LoadThread(op.http, "resnet50:1", 100, 14.0, 100, seed=7)
        load.start()
        beside.start()
        time.sleep(3.0)
        began = time.monotonic()
        # NOTE: apply --wait returns once the rollout is done
        assert main(["apply", "--state-dir", str(op.state_dir), "-f", str(v2), "--wait"]) == 0
        done = time.monotonic()
        load.join(120)
        other = beside.result()
        bad = [a for a in load.answers if a.factor is None]
        assert not bad and load.unanswered == 0, bad[:5]
        # NOTE: every answer after apply returned comes from version 2 (x3); before it, version 1 (x2)
        after = [a.factor for a in load.answers if a.sent > done]
        assert len(after) > 50 and set(after) == {3.0}, after
        assert {a.factor for a in load.answers if a.sent < began} == {2.0}
        assert answered_all(other) and other["rejected"] == 0, other
        now = op.pids()
        kept = [k for k in pids if "resnet50" in k]
        assert kept and all(now[k] == pids[k] for k in kept)  # the other model's replica was not restarted
        assert op.status()["observedGeneration"] == 2
        assert op.condition("scaler", "Ready") == "True"


def test_up_in_the_foreground_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    import subprocess
    import sys

    from deploy.operator.state import DirStateStore, same_process

    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1, host=False), deployment("resnet50", 50, 100))
    state = tmp_path / "state"
    proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", "up", "-f", str(docs), "--state-dir", str(state)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        seen = []
        for line in proc.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if line.startswith("serving;"):
                break
        assert seen and seen[-1].startswith("serving;"), "".join(seen)
        started = DirStateStore(state).read()["processes"]
        assert started and all(same_process(p["pid"], p["started"]) for p in started.values())
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 0
        # NOTE: no orphans: every process it started is gone, and the state says nothing runs
        assert not any(same_process(p["pid"], p["started"]) for p in started.values())
        assert DirStateStore(state).read()["running"] is False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        from deploy.operator.cli import ensure_down

        ensure_down(state)


def test_a_change_that_would_drop_capacity_on_a_full_pool_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    from deploy.cli import main

    a, b = full_gpu(tmp_path, ["big-a"], "a.yaml"), full_gpu(tmp_path, ["big-b"], "b.yaml")
    with operator_up(tmp_path, a) as op:
        pids, plan = op.pids(), op.state()["plan"]
        capsys.readouterr()
        assert main(["apply", "--state-dir", str(op.state_dir), "-f", str(b), "--dry-run"]) == 0
        assert "refused: the change would drop capacity: big 0 < 110 req/s" in capsys.readouterr().out
        assert main(["apply", "--state-dir", str(op.state_dir), "-f", str(b)]) == 2
        err = capsys.readouterr().err.splitlines()
        # NOTE: one line, exit 2, and the fleet unchanged
        assert len(err) == 1 and "--allow-disruption" in err[0] and "Traceback" not in err[0], err
        assert op.pids() == pids and op.state()["plan"] == plan and op.status()["generation"] == 1


def test_a_model_scaled_to_zero_has_no_replica_and_its_first_request_starts_one(tmp_path: Path) -> None:
    import numpy as np
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    zero = {"min_replicas": 0, "upscale_delay_s": 3, "downscale_delay_s": 600}
    docs = write_docs(tmp_path / "d.yaml", pool(a100s=1, host=False),
                      deployment("resnet50", 0, 1000, autoscaling={**zero, "downscale_delay_s": 4}),
                      deployment("bert-base", 0, 1000, autoscaling={**zero, "cold_start_timeout_s": 0.5}))
    with operator_up(tmp_path, docs) as op:
        # NOTE: at rate 0 with min_replicas 0 nothing runs, and both models stay addressable
        assert op.deployment("resnet50")["replicas"] == [] and op.deployment("bert-base")["replicas"] == []
        assert op.condition("resnet50", "Ready") == "True"  # ScaledToZero
        assert not [k for k in op.pids() if k.startswith("triton:")]
        client = th.InferenceServerClient(op.http, network_timeout=120.0)
        x = th.InferInput("INPUT0", [1, 16], "FP32")  # the emulated model's input
        x.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
        t0 = time.monotonic()
        res = client.infer("resnet50", [x])  # waits (up to 60 s) while a replica starts
        assert res.as_numpy("OUTPUT0").shape == (1, 16)
        took = time.monotonic() - t0
        assert op.deployment("resnet50")["replicas"] and [k for k in op.pids() if "resnet50" in k]
        # a model whose wait is shorter than a start: 503 with Retry-After, and the replica still comes
        t1 = time.monotonic()
        with pytest.raises(InferenceServerException) as e:
            client.infer("bert-base", [x])
        assert "503" in str(e.value.status()) or "one is starting" in str(e.value), e.value
        assert time.monotonic() - t1 < 5.0
        op.wait_for("bert-base replica", lambda: bool(op.deployment("bert-base")["replicas"]), timeout=90)
        kinds = [e["kind"] for e in op.status()["events"]]
        assert kinds.count("ScaleFromZero") == 2, kinds
        # idle again: resnet50 scales back to zero after its downscale delay, and stays addressable
        op.wait_for("resnet50 at zero", lambda: op.deployment("resnet50")["replicas"] == [], timeout=40)
        assert not [k for k in op.pids() if "resnet50" in k] and op.condition("resnet50", "Ready") == "True"
        client.close()
        print(f"first request answered after {took:.1f} s")
