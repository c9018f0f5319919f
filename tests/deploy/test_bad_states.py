"""Bad states get one line and exit 2, and start nothing: a corrupt or truncated state file, two
listeners on one port. A deployment at rate 0 is no bad state: it plans one replica. Every
command here runs in-process and stops before a process would start (seconds, no Triton)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.cli import main
from deploy.operator.controller import Controller
from deploy.operator.desired import validate
from deploy.operator.state import CHECKSUM, DirStateStore, StateError
from placement.solve.solver import solve
from placement.spec import inventory
from tests.operator_harness import GATEWAY, deployment, pool, write_docs

LIVE = {"running": True, "generation": 3, "observed_generation": 3, "history": [1, 2, 3],
        "admin_url": "http://127.0.0.1:9", "controller_pid": 2**22 + 1, "controller_started": 1,
        "processes": {"triton:local/gpu0/gpu/resnet50": {"pid": 2**22 + 2, "started": 1}},
        "gateway": {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001"}, "plan": None}


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tripwire where `up` would start the controller in the foreground."""
    import gateway.serving

    def started(main: Any) -> int:
        main.close()
        raise AssertionError("up started a controller")

    monkeypatch.setattr(gateway.serving, "run_on_serve_loop", started)


def one_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"headrace {command}: "), lines[0]
    return lines[0]


def docs(tmp_path: Path, *extra: dict[str, Any]) -> Path:
    return write_docs(tmp_path / "d.yaml", pool(), deployment("resnet50", 50, 100), *extra)


def written(tmp_path: Path) -> Path:
    """A state directory as a live controller leaves it."""
    store = DirStateStore(tmp_path / "state")
    store.write(LIVE)
    return store.state_path


# --------------------------------------------------------------------------- state.json


def truncate(p: Path) -> None:
    p.write_text(p.read_text()[: len(p.read_text()) // 2])


def empty(p: Path) -> None:
    p.write_text("")


def hand_edited(p: Path) -> None:
    p.write_text(p.read_text().replace('"generation": 3', '"generation": 4'))


def not_a_state(p: Path) -> None:
    p.write_text(json.dumps({**LIVE, "processes": {"triton:x": {"pid": "one"}}}))


def a_list(p: Path) -> None:
    p.write_text("[]")


CORRUPT = {"truncated": (truncate, "it is not JSON"), "empty": (empty, "it is empty"),
           "hand-edited": (hand_edited, "its checksum does not match"),
           "wrong-shape": (not_a_state, "processes.triton:x is not a pid"),
           "not-an-object": (a_list, "the top level is a list")}


@pytest.mark.parametrize("dry_run", [False, True], ids=["up", "up-dry-run"])
@pytest.mark.parametrize("corrupt", CORRUPT.values(), ids=CORRUPT.keys())
def test_a_corrupt_state_file_is_named_in_one_line_and_up_starts_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_starts: None, corrupt: Any, dry_run: bool) -> None:
    how, why = corrupt
    p = written(tmp_path)
    how(p)
    before = p.read_bytes()
    rc = main(["up", "--state-dir", str(p.parent), "-f", str(docs(tmp_path))] + (["--dry-run"] if dry_run else []))
    line = one_line(capsys, "up")
    assert rc == 2
    assert f"state file {p} is corrupt: {why}" in line, line
    assert f"mv {p} {p}.bad" in line and "run headrace up again" in line
    # NOTE: the file the user must look at is left exactly as it was
    assert p.read_bytes() == before


@pytest.mark.parametrize("command", ["status", "down", "rollback", "apply"])
def test_every_command_refuses_a_truncated_state_file_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    p = written(tmp_path)
    truncate(p)
    extra = ["-f", str(docs(tmp_path))] if command == "apply" else []
    rc = main([command, "--state-dir", str(p.parent), *extra])
    assert rc == 2
    assert f"state file {p} is corrupt" in one_line(capsys, command)


def test_a_state_file_without_a_checksum_is_read_and_gains_one_on_the_next_write(tmp_path: Path) -> None:
    store = DirStateStore(tmp_path)
    store.state_path.write_text(json.dumps(LIVE, indent=1))  # as the operator wrote it before checksums
    assert store.read() == LIVE
    store.write({**store.read(), "running": False})
    on_disk = json.loads(store.state_path.read_text())
    assert on_disk[CHECKSUM].startswith("sha256:")
    assert store.read() == {**LIVE, "running": False}
    hand_edited(store.state_path)
    with pytest.raises(StateError, match="checksum does not match"):
        store.read()


def test_a_controller_whose_state_file_goes_corrupt_rewrites_it_from_its_own_record(tmp_path: Path) -> None:
    _, want, base = validate([str(docs(tmp_path))])
    store = DirStateStore(tmp_path / "state")
    store.write({"controller_pid": 1234, "controller_started": 5, "token_file": None})
    ctl = Controller(store, base, clock=lambda: 0.0, wall=lambda: 0.0)
    ctl.generation = 2
    ctl.save()
    truncate(store.state_path)
    ctl.save()
    st = store.read()
    # NOTE: what `up` recorded before the controller started (its pid for `down`) survives
    assert (st["controller_pid"], st["controller_started"], st["generation"]) == (1234, 5, 2)
    assert [e.kind for e in ctl.events] == ["StateRewritten"]


# --------------------------------------------------------------------------- ports


def gateway(**spec: Any) -> dict[str, Any]:
    return {**GATEWAY, "spec": {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0}, **spec}}


CLASHES = {
    "http=grpc": (gateway(listen={"http_port": 8000, "grpc_port": 8000}),
                  "listen.grpc_port (8000) is also listen.http_port on 127.0.0.1"),
    "http=admin": (gateway(listen={"http_port": 18000, "grpc_port": 0}, admin={"port": 18000}),
                   "admin.port (18000) is also listen.http_port on 127.0.0.1"),
    "grpc=metrics": (gateway(listen={"host": "0.0.0.0", "grpc_port": 9001},
                             metrics_listen={"host": "127.0.0.1", "port": 9001}),
                     "metrics_listen.port (9001) is also listen.grpc_port on 127.0.0.1"),
    "metrics=admin": (gateway(metrics_listen={"host": "localhost", "port": 9100}, admin={"port": 9100}),
                      "admin.port (9100) is also metrics_listen.port on 127.0.0.1"),
    # each gateway worker serves /metrics on metrics_listen.port + its index
    "worker-metrics=admin": (gateway(workers=3, metrics_listen={"host": "127.0.0.1", "port": 9100},
                                     admin={"port": 9102}),
                             "metrics_listen.port of worker 2 (9102) is also admin.port on 127.0.0.1"),
}


@pytest.mark.parametrize("command", ["up", "apply"])
@pytest.mark.parametrize("clash", CLASHES.values(), ids=CLASHES.keys())
def test_two_listeners_on_one_port_are_one_line_and_exit_2_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_starts: None, clash: Any, command: str) -> None:
    gw, why = clash
    d = docs(tmp_path, gw)
    rc = main([command, "--state-dir", str(tmp_path / "state"), "-f", str(d)])
    line = one_line(capsys, command)
    assert rc == 2
    assert f"{d} document 2: spec: {why}: every listener needs its own port (0: any free)" in line, line
    assert not (tmp_path / "state" / "state.json").exists()


@pytest.mark.parametrize("spec", [
    {"listen": {"http_port": 0, "grpc_port": 0}, "admin": {"port": 0}, "metrics_listen": {"port": 0}},
    {"listen": {"host": "127.0.0.1", "http_port": 9000}, "metrics_listen": {"host": "10.1.2.3", "port": 9000}},
    {"listen": {"host": "0.0.0.0", "grpc_port": 9001}, "admin": {"host": "::1", "port": 9001}},
], ids=["any-free-port-repeated", "one-port-on-two-addresses", "ipv4-any-and-ipv6-loopback"])
def test_listeners_that_can_all_bind_pass(tmp_path: Path, spec: dict[str, Any]) -> None:
    validate([str(docs(tmp_path, gateway(**spec)))])


@pytest.mark.parametrize(("spec", "why"), [
    ({"workers": 0}, "spec.workers: Input should be greater than or equal to 1"),
    ({"workers": 2, "metrics_listen": {"port": 65535}}, "metrics_listen.port (65535) + 2 workers runs past port 65535"),
], ids=["no-worker", "metrics-ports-past-65535"])
def test_a_gateway_worker_count_that_cannot_run_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_starts: None, spec: dict[str, Any], why: str) -> None:
    d = docs(tmp_path, gateway(**spec))
    rc = main(["up", "--state-dir", str(tmp_path / "state"), "-f", str(d)])
    line = one_line(capsys, "up")
    assert rc == 2 and why in line, line
    assert not (tmp_path / "state" / "state.json").exists()


def test_gateway_workers_plan_every_classic_model_that_many_replicas(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    d = write_docs(tmp_path / "d.yaml", pool(), deployment("resnet50", 100, 100),
                   deployment("digits", 0, 50, source="digits", autoscaling={"min_replicas": 0}), gateway(workers=3))
    rc = main(["up", "--dry-run", "--state-dir", str(tmp_path / "state"), "-f", str(d)])
    out, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    # NOTE: one replica per worker (any GPU: all three on the one A100); digits stays at zero
    assert sum(" resnet50 (" in ln for ln in out.splitlines()) == 3 and "digits-" not in out, out


# --------------------------------------------------------------------------- rate 0


def test_up_dry_run_at_rate_0_plans_one_replica_or_none_at_min_replicas_0(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    d = write_docs(tmp_path / "d.yaml", pool(), deployment("resnet50", 0, 100),
                   deployment("digits", 0, 50, source="digits", autoscaling={"min_replicas": 0}))
    rc = main(["up", "--dry-run", "--state-dir", str(tmp_path / "state"), "-f", str(d)])
    out, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    # NOTE: one replica keeps resnet50 served at rate 0; digits (min_replicas 0) scales to zero
    assert out.startswith("would start 1 replicas on 1 GPUs")
    assert sum(" resnet50 (" in ln for ln in out.splitlines()) == 1 and "digits-" not in out
    assert not (tmp_path / "state" / "state.json").exists()


def test_the_quickstart_at_rate_0_plans_one_replica_and_one_engine_per_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    quickstart = Path(__file__).parents[2] / "deploy/examples/quickstart"
    for f in quickstart.glob("*.yaml"):
        ds = list(yaml.safe_load_all(f.read_text()))
        for d in ds:
            if d["kind"] == "ModelDeployment":
                d["spec"]["rate"] = 0
                d["spec"].get("llm", {}).pop("replicas", None)  # sized from the rate
        (tmp_path / f.name).write_text(yaml.safe_dump_all(ds))
    rc = main(["up", "--dry-run", "--state-dir", str(tmp_path / "state"), "-f", str(tmp_path)])
    out, err = capsys.readouterr()
    assert (rc, err) == (0, ""), err
    steps = out.splitlines()[1:]
    assert sum("start_replica" in s for s in steps) == 2 and sum("start LLM engine llama-8b/" in s for s in steps) == 1


def test_an_idle_autoscaled_deployment_replans_to_one_replica(tmp_path: Path) -> None:
    d = write_docs(tmp_path / "d.yaml", pool(a100s=2), deployment("resnet50", 5000, 100))
    _, want, base = validate([str(d)])
    busy = solve(want.demands({}), want.profiles, inventory(want.docs.pools[0]))
    assert len(busy.replicas()) > 1
    # the autoscaler's rate after a quiet downscale_delay_s: 0 req/s (the old code divided by it)
    ctl = Controller(DirStateStore(tmp_path / "state"), base, plan=busy, rates={"resnet50": 0.0})
    res = ctl.preview(want)
    assert len(res["started"]) == 0 and sum(s.startswith("stop_replica") for s in res["steps"]) >= 1
    kept = [r["model"] for g in res["plan"]["spec"]["gpus"] for s in g["slices"] for r in s["replicas"]]
    assert kept == ["resnet50"]
