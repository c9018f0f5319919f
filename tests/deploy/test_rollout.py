"""Rollouts as the controller runs them, on a recording runtime and gateway (no process starts):
a new artifact revision replaces its replica make-before-break, a replica that is not Ready
rolls the change back, a change that would drop capacity is refused unless allowed, and
rollback restores an earlier generation's fleet, not a re-plan of its documents."""

from __future__ import annotations

import asyncio
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from deploy.operator.controller import ApplyError, Controller, Disruption
from deploy.operator.desired import base_profiles, prepare, validate
from deploy.operator.state import DirStateStore, start_time
from deploy.operator.takeover import take_over
from gateway.config import resolve
from gateway.handle import Seen
from placement.apply.executors import ExecutorError
from placement.apply.render import Endpoint
from placement.diff import Step
from tests.operator_harness import deployment, full_gpu, pool, versioned_model, write_docs

DIGITS = ["digits-small", "digits-medium", "digits-large"]


@dataclass
class Runtime:
    """Records steps; a start of a replica id in ``fail`` raises as a Triton not Ready would."""

    fail: set[str] = field(default_factory=set)
    running: dict[str, Endpoint] = field(default_factory=dict)
    log: list[tuple[str, str]] = field(default_factory=list)

    def run(self, st: Step) -> Endpoint | None:
        self.log.append((st.action, st.replica_id))
        if st.action == "start_replica":
            if any(f in st.replica_id for f in self.fail):
                raise ExecutorError(f"{st.describe()}: not ready after 120 s")
            r, s = st.replica, st.slice
            assert r is not None and s is not None and st.replica_id not in self.running, st.replica_id
            self.running[st.replica_id] = Endpoint(st.replica_id, r.model, r.variant, st.gpu, s.label, r.share,
                                                   r.max_batch, r.capacity, "127.0.0.1:1", "127.0.0.1:2")
            return self.running[st.replica_id]
        if st.action == "stop_replica":
            del self.running[st.replica_id]
        return None

    def alive(self, replica_id: str) -> bool:
        return True

    def endpoints(self) -> dict[str, Endpoint]:
        return dict(self.running)

    def processes(self) -> dict:
        """Each replica as a process record (this test's own pid stands in for Triton's)."""
        return {f"triton:{rid}": {"pid": os.getpid(), "started": start_time(os.getpid()), "endpoint": asdict(ep)}
                for rid, ep in self.running.items()}

    def adopt(self, processes: dict) -> list[str]:
        for name, rec in processes.items():
            if name.startswith("triton:"):
                self.running[name.removeprefix("triton:")] = Endpoint(**rec["endpoint"])
        return []

    def discard(self, rid: str) -> None:
        self.log.append(("discard", rid))
        del self.running[rid]

    def stop(self) -> None:
        self.running.clear()


class Gateway:
    """What the controller calls on its gateway (:class:`gateway.handle.GatewayHandle`),
    recorded: the replicas and engines it routes to."""

    http_url = grpc_url = "127.0.0.1:0"

    def __init__(self) -> None:
        self.classic: dict[str, bool] = {}
        self.llm: set[str] = set()

    async def add_replica(self, cfg: Any, model: str) -> None:
        served = next(m for m in resolve(cfg) if m.name == model)
        self.classic[served.replicas[0].id] = True

    async def remove_replica(self, rid: str, drain: float, keep_model: bool = False) -> bool:
        self.llm.discard(rid)
        return self.classic.pop(rid, None) is not None

    async def replicas(self) -> dict[str, bool]:
        return dict(self.classic)

    async def llm_replicas(self) -> dict[str, bool]:
        return dict.fromkeys(self.llm, True)

    async def set_llm_model(self, model: Any) -> None: ...
    async def drop_llm_model(self, name: str) -> None: ...

    async def add_llm_replica(self, model: Any, replica: Any) -> None:
        self.llm.add(replica.id)

    async def counters(self) -> list:
        return []

    async def look(self) -> Seen:
        return Seen(await self.replicas(), await self.llm_replicas(), await self.counters())

    async def hold_cold(self, waits: dict, starter: Any) -> None: ...
    async def stop(self, drain_timeout: float) -> None: ...


def started(tmp_path: Path, text: str) -> Controller:
    """A controller serving generation 1 of ``text`` on the recording runtime and gateway."""
    base = base_profiles()
    ctl = Controller(DirStateStore(tmp_path / "state"), base, runtime=Runtime(), clock=lambda: 0.0,
                     wall=lambda: 0.0)
    ctl.gateway = Gateway()  # type: ignore[assignment]
    want = prepare(text, base)
    plan, d, llm = ctl._solve_diff(want)  # noqa: SLF001
    ctl.desired = want
    ctl.plan = plan
    for st in d.steps:
        ep = ctl.runtime.run(st)  # type: ignore[union-attr]
        if ep is not None:
            ctl.gateway.classic[ep.replica_id] = True  # type: ignore[union-attr]
    ctl.generation = ctl.observed_generation = 1
    ctl.history, ctl.fleets[1] = [1], (plan, llm)
    ctl.store.save_generation(1, want.text)
    return ctl


def serving(ctl: Controller) -> list[str]:
    return sorted(ctl.gateway.classic)  # type: ignore[union-attr]


def scaler_docs(tmp_path: Path, version: int, name: str = "d.yaml") -> str:
    v = {"name": "scaler-v1", "artifact": {"uri": "models/scaler", "version": version}, "profile": "scaler-v1.yaml"}
    return validate([str(write_docs(tmp_path / name, pool(a100s=1), deployment("resnet50", 100, 100),
                                    deployment("scaler", 50, 100, source="artifact", variants=[v])))])[0]


def test_a_new_artifact_version_replaces_its_replica_beside_it_and_keeps_the_others(tmp_path: Path) -> None:
    versioned_model(tmp_path)
    ctl = started(tmp_path, scaler_docs(tmp_path, 1))
    before = serving(ctl)
    old = next(r for r in before if "scaler" in r)
    out = asyncio.run(ctl.apply(scaler_docs(tmp_path, 2, "v2.yaml")))
    new = next(r for r in serving(ctl) if "scaler" in r)
    # NOTE: the successor starts (and joins the gateway) before its predecessor stops
    assert [a for a in ctl.runtime.log[-2:]] == [("start_replica", new), ("stop_replica", old)]  # type: ignore[union-attr]
    assert new != old and out["stopped"] == [old] and out["started"] == [new] and not out["capacity_dips"]
    assert [r for r in before if r != old] == [r for r in serving(ctl) if r != new]  # resnet50 untouched
    assert ctl.observed_generation == 2 and ctl.failure is None
    # the same documents again: nothing to do
    assert asyncio.run(ctl.apply(scaler_docs(tmp_path, 2, "v2.yaml")))["steps"] == []
    # a file of the served version changes: a new revision, rolled out again
    (tmp_path / "models/scaler/2/model.py").write_text("FACTOR = 30\n")
    assert asyncio.run(ctl.apply(scaler_docs(tmp_path, 2, "v2.yaml")))["stopped"] == [new]


def test_a_successor_that_is_not_ready_rolls_the_change_back(tmp_path: Path) -> None:
    versioned_model(tmp_path)
    ctl = started(tmp_path, scaler_docs(tmp_path, 1))
    before = serving(ctl)
    ctl.runtime.fail = {"scaler-v1~"}  # type: ignore[union-attr]
    with pytest.raises(ApplyError, match="not ready after 120 s; rolled back to generation 1"):
        asyncio.run(ctl.apply(scaler_docs(tmp_path, 2, "v2.yaml")))
    assert serving(ctl) == before and sorted(ctl.runtime.running) == before  # type: ignore[union-attr]
    assert ctl.observed_generation == 1 and ctl.failure is None and "rolled back" in (ctl.rolled_back or "")
    assert [e.kind for e in ctl.events][-1] == "RolledBack" and ctl.applying is None


def test_a_failure_part_way_undoes_what_was_done_newest_first(tmp_path: Path) -> None:
    text = write_docs(tmp_path / "d.yaml", pool(a100s=1), deployment("resnet50", 100, 100),
                      deployment("digits", 100, 50, source="digits", variants=DIGITS)).read_text()
    ctl = started(tmp_path, text)
    before = serving(ctl)
    # rate x6 adds resnet50 replicas beside the one serving; the second to start fails
    more = text.replace("rate: 100\n", "rate: 2000\n", 1)
    plan, d, _ = ctl._solve_diff(prepare(more, ctl.base_profiles))  # noqa: SLF001
    starts = [s.replica_id for s in d.steps if s.action == "start_replica"]
    assert len(starts) >= 2 and not [s for s in d.steps if s.action == "stop_replica"]
    ctl.runtime.fail = {starts[1]}  # type: ignore[union-attr]
    with pytest.raises(ApplyError, match="rolled back"):
        asyncio.run(ctl.apply(more))
    assert serving(ctl) == before
    assert ctl.runtime.log[-1] == ("stop_replica", starts[0])  # type: ignore[union-attr]


def full_pool(tmp_path: Path, variants: list[str], name: str, **spec: Any) -> str:
    return validate([str(full_gpu(tmp_path, variants, name, **spec))])[0]


def test_a_change_that_would_drop_capacity_is_refused_unless_allowed(tmp_path: Path) -> None:
    ctl = started(tmp_path, full_pool(tmp_path, ["big-a"], "a.yaml"))
    before, steps = serving(ctl), len(ctl.runtime.log)  # type: ignore[union-attr]
    swap = full_pool(tmp_path, ["big-b"], "b.yaml")
    dry = asyncio.run(ctl.apply(swap, dry_run=True))
    assert dry["refused"].startswith("the change would drop capacity: big 0 < 110 req/s at step 1")
    with pytest.raises(Disruption, match="apply --allow-disruption to accept it$"):
        asyncio.run(ctl.apply(swap))
    # NOTE: refused: nothing ran, the generation did not move
    assert serving(ctl) == before and len(ctl.runtime.log) == steps and ctl.generation == 1  # type: ignore[union-attr]
    asyncio.run(ctl.apply(swap, allow_disruption=True))
    assert [r.rsplit("/", 1)[1] for r in serving(ctl)] == ["big-b"] and ctl.generation == 2


def test_max_unavailable_lets_a_deployment_take_its_replicas_down_one_at_a_time(tmp_path: Path) -> None:
    ctl = started(tmp_path, full_pool(tmp_path, ["big-a"], "a.yaml"))
    swap = full_pool(tmp_path, ["big-b"], "b.yaml", rollout={"max_unavailable": 1})
    assert "refused" not in asyncio.run(ctl.apply(swap, dry_run=True))
    asyncio.run(ctl.apply(swap))
    assert [r.rsplit("/", 1)[1] for r in serving(ctl)] == ["big-b"]


def digits_docs(tmp_path: Path, variants: list[str], name: str) -> str:
    return validate([str(write_docs(tmp_path / name, pool(a100s=1), deployment("resnet50", 100, 100),
                                    deployment("digits", 100, 50, source="digits", variants=variants,
                                               accuracy_floor=0.97)))])[0]


def test_rollback_restores_the_fleet_of_the_generation_not_a_replan_of_its_documents(tmp_path: Path) -> None:
    ctl = started(tmp_path, digits_docs(tmp_path, DIGITS, "d.yaml"))
    variant = next(r for r in serving(ctl) if "digits" in r).rsplit("/", 1)[1]
    keep = [v for v in DIGITS if v != variant]
    asyncio.run(ctl.apply(digits_docs(tmp_path, keep, "d2.yaml")))
    now = next(r for r in serving(ctl) if "digits" in r).rsplit("/", 1)[1]
    # the documents of generation 1 allow the variant serving now: a re-plan of them would keep it
    assert now in keep
    out = asyncio.run(ctl.rollback())
    assert out["generation"] == 3 and next(r for r in serving(ctl) if "digits" in r).endswith(variant)
    assert ctl.observed_generation == 3 and ctl.history == [1, 2, 3]
    back = asyncio.run(ctl.rollback(to=2, dry_run=True))
    assert back["dry_run"] and any(s.endswith(variant) for s in back["stopped"]), back
    with pytest.raises(ApplyError, match="generation 7 was never applied"):
        asyncio.run(ctl.rollback(to=7))


def test_a_replica_id_started_again_gets_a_fresh_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import placement.apply.emulated as emulated
    from placement.diff import diff

    versioned_model(tmp_path)
    want = prepare(scaler_docs(tmp_path, 1), base_profiles())
    plan, _, _ = Controller(DirStateStore(tmp_path / "state"), want.profiles)._solve_diff(want)  # noqa: SLF001
    start = next(s for s in diff(None, plan).steps if s.action == "start_replica" and "scaler" in s.replica_id)
    written = []

    class Server:  # records the repository it is given instead of starting Triton
        http_url = grpc_url = "127.0.0.1:0"

        def __init__(self, repo: Path, **kw: Any) -> None:
            written.append(sorted(p.name for p in (repo / "scaler-v1").iterdir()))

        def start(self) -> None: ...

        def __exit__(self, *a: Any) -> None: ...

    monkeypatch.setattr(emulated, "TritonServer", Server)
    ex = emulated.Emulated(want.profiles, sources=want.sources, workdir=tmp_path / "run")
    ex.start_replica(start)
    ex.stop_replica(start)
    # NOTE: the same id again (a version rolled back to): the files it left do not break the copy
    ex.start_replica(start)
    assert written == [["1", "config.pbtxt"], ["1", "config.pbtxt"]]


def test_each_deployment_has_its_own_generation_and_events_persist_with_rfc3339_times(tmp_path: Path) -> None:
    import json
    import re

    versioned_model(tmp_path)
    ctl = started(tmp_path, scaler_docs(tmp_path, 1))
    ctl._bump(ctl.desired)  # noqa: SLF001  (as up does)
    ctl.observed = {n: g for n, (g, _) in ctl.generations.items()}
    asyncio.run(ctl.apply(scaler_docs(tmp_path, 2, "v2.yaml")))
    # NOTE: only the deployment whose spec changed moves to generation 2
    assert {n: g for n, (g, _) in ctl.generations.items()} == {"resnet50": 1, "scaler": 2}
    assert ctl.observed == {"resnet50": 1, "scaler": 2} and ctl.generation == 2
    # the same spec, but a file of its artifact changed: what it serves changed, so does its generation
    (tmp_path / "models/scaler/2/model.py").write_text("FACTOR = 30\n")
    asyncio.run(ctl.apply(scaler_docs(tmp_path, 2, "v2.yaml")))
    assert ctl.generations["scaler"][0] == 3 and ctl.generations["resnet50"][0] == 1
    lines = [json.loads(x) for x in (tmp_path / "state/events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in lines] == ["Applied", "Applied"]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e["time"]) for e in lines)
    assert ctl.store.events() == lines  # type: ignore[attr-defined]


def test_status_watch_prints_what_changed_and_stops_when_the_controller_does() -> None:
    from deploy.operator.cli import watch
    from deploy.operator.client import CliError

    def st(gen: int, ready: str, events: list[str]) -> dict:
        cond = {"type": "Ready", "status": ready, "reason": "r", "message": "m"}
        return {"generation": gen, "observedGeneration": gen, "deployments": [{"name": "a", "conditions": [cond]}],
                "events": [{"time": f"t{i}", "model": "a", "kind": k, "message": "x"} for i, k in enumerate(events)]}

    seq = iter([st(1, "True", ["Applied"]), st(2, "False", ["Applied", "ApplyFailed"]),
                st(2, "False", ["Applied", "ApplyFailed"])])
    lines: list[str] = []
    assert watch(lambda: next(seq), st(1, "True", ["Applied"]), 1.0, lines.append, sleep=lambda s: None, polls=3) == 0
    assert lines == ["generation 2 (observed 2)", "a: Ready=False (r): m", "t1 a ApplyFailed: x"]

    def gone() -> dict:
        raise CliError("cannot reach the controller at http://x: refused", 1)

    with pytest.raises(CliError, match="^the controller stopped answering: cannot reach"):
        watch(gone, st(1, "True", []), 1.0, lines.append, sleep=lambda s: None)


def test_a_replica_the_gateway_refuses_is_stopped_and_the_change_rolled_back(tmp_path: Path) -> None:
    versioned_model(tmp_path)
    ctl = started(tmp_path, scaler_docs(tmp_path, 1))
    before = sorted(ctl.runtime.running)  # type: ignore[union-attr]

    async def refuse(served: Any, replica: Any) -> None:
        raise ValueError("signature differs from the variant's")

    ctl.gateway.add_replica = refuse  # type: ignore[union-attr, method-assign]
    with pytest.raises(ApplyError, match="signature differs"):
        asyncio.run(ctl.apply(scaler_docs(tmp_path, 2, "v2.yaml")))
    # NOTE: the successor Triton that started is stopped, not left running outside the gateway
    assert sorted(ctl.runtime.running) == before  # type: ignore[union-attr]


def test_apply_without_wait_answers_once_the_rollout_has_begun_and_finishes_it(tmp_path: Path) -> None:
    versioned_model(tmp_path)
    ctl = started(tmp_path, scaler_docs(tmp_path, 1))

    async def run() -> tuple[dict, bool, bool]:
        out = await ctl.apply(scaler_docs(tmp_path, 2, "v2.yaml"), wait=False)
        begun = ctl._lock.locked()  # noqa: SLF001  (the rollout holds the apply lock)
        await asyncio.gather(*list(ctl._heals))  # noqa: SLF001
        return out, begun, ctl._lock.locked()  # noqa: SLF001

    out, begun, still = asyncio.run(run())
    assert out["rolling"] and out["generation"] == 2 and begun and not still
    assert ctl.observed_generation == 2 and any("scaler-v1~" in r and r in out["started"] for r in serving(ctl))


class Engines:
    """LLM engines, recorded; starting one in ``fail`` raises as an engine not healthy would."""

    def __init__(self, fail: set[str]) -> None:
        self.fail, self.running, self.log = fail, set(), []

    def start(self, r: Any) -> str:
        self.log.append(("start", r.id))
        self.running.add(r.id)  # registered before it is healthy, as the real one is
        if r.id in self.fail:
            raise ExecutorError(f"engine {r.id} not healthy after 60s")
        return "http://127.0.0.1:1"

    def stop_replica(self, rid: str) -> None:
        self.log.append(("stop", rid))
        self.running.discard(rid)

    def processes(self) -> dict:
        return {}


def test_an_llm_engine_that_does_not_start_undoes_the_engines_it_began(tmp_path: Path) -> None:
    h100 = {"model": "H100-80GB", "count": 2, "mig": False}
    gpus = pool(a100s=1)
    gpus["spec"]["nodes"][0]["gpus"].append(h100)
    chat = deployment("chat", 2, 1000, variants=["llama-3.1-8b-instruct-fp8"], llm={"slo_tpot_ms": 50, "replicas": 2})
    text = validate([str(write_docs(tmp_path / "d.yaml", gpus, deployment("resnet50", 100, 100), chat))])[0]
    ctl = started(tmp_path, text)  # the classic fleet only: no engine runs yet
    _, _, llm = ctl._solve_diff(prepare(text, ctl.base_profiles))  # noqa: SLF001
    first, second = (r.id for r in llm.replicas)
    ctl.engines = Engines({second})  # type: ignore[assignment]
    gw = ctl.gateway
    with pytest.raises(ApplyError, match="not healthy after 60s; rolled back to generation 1"):
        asyncio.run(ctl.apply(text))
    # NOTE: the engine that started left the gateway and stopped; the one that failed was stopped too
    assert ctl.engines.running == set() and gw.llm == set()  # type: ignore[union-attr]
    assert ctl.engines.log[-2:] == [("stop", second), ("stop", first)]  # type: ignore[union-attr]
    assert not ctl.llm_plan.replicas and ctl.observed_generation == 1


def test_a_gateway_process_that_died_is_started_again_serving_the_running_fleet(tmp_path: Path) -> None:
    versioned_model(tmp_path)
    ctl = started(tmp_path, scaler_docs(tmp_path, 1))
    dead = ctl.gateway
    dead.alive = lambda: False  # type: ignore[union-attr]
    dead.http_url, dead.grpc_url = "127.0.0.1:4321", "127.0.0.1:4322"  # type: ignore[union-attr]
    configs: list[Any] = []

    async def start(cfg: Any) -> Gateway:
        configs.append(cfg)
        return Gateway()

    ctl.start_gateway = start  # type: ignore[assignment]

    async def run() -> None:
        await ctl._tick(0.0)  # noqa: SLF001
        await asyncio.gather(*ctl._heals)  # noqa: SLF001

    asyncio.run(run())
    # NOTE: the new gateway is configured with every replica the runtime serves, on the ports
    # the dead one served on (its clients keep their address)
    assert ctl.gateway is not dead and len(configs) == 1
    assert (configs[0].listen.http_port, configs[0].listen.grpc_port) == (4321, 4322)
    assert sorted(r.url for m in configs[0].models for r in m.replicas) == sorted(
        ep.http_url for ep in ctl.runtime.endpoints().values())  # type: ignore[union-attr]
    assert [e.kind for e in ctl.events][-2:] == ["GatewayDown", "Restarted"]


def test_a_controller_that_died_mid_rollout_is_taken_over_on_the_generation_it_served(tmp_path: Path) -> None:
    versioned_model(tmp_path)
    ctl = started(tmp_path, scaler_docs(tmp_path, 1))
    v1 = set(ctl.runtime.running)  # type: ignore[union-attr]
    ctl.save()
    # generation 2's rollout ran its steps (successor started, predecessor stopped), then the
    # controller died before it recorded the new fleet
    want = prepare(scaler_docs(tmp_path, 2, "v2.yaml"), ctl.base_profiles)
    _, d, _ = ctl._solve_diff(want)  # noqa: SLF001
    ctl.generation = 2
    ctl.store.save_generation(2, want.text)
    for st in d.steps:
        ctl.runtime.run(st)  # type: ignore[union-attr]
    ctl.save()
    successors = set(ctl.runtime.running) - v1  # type: ignore[union-attr]
    assert successors and not v1 <= set(ctl.runtime.running)  # type: ignore[union-attr]

    runtime = Runtime()
    after = Controller(DirStateStore(tmp_path / "state"), ctl.base_profiles, runtime=runtime, clock=lambda: 0.0,
                       wall=lambda: 0.0)

    async def start(cfg: Any) -> Gateway:
        return Gateway()

    after.start_gateway = start  # type: ignore[assignment]

    async def run() -> None:
        await take_over(after, DirStateStore(tmp_path / "state").read())
        after._task = None  # noqa: SLF001

    asyncio.run(run())
    # NOTE: the fleet of generation 1 again: the replica the rollout stopped started before the
    # one it started is stopped (make before break), and the gateway routes to exactly those
    assert set(runtime.running) == v1 and serving(after) == sorted(v1)
    kinds = [a for a, _ in runtime.log]
    assert kinds.index("start_replica") < kinds.index("discard")
    assert after.generation == 2 and after.observed_generation == 1 and after.history == [1]
    assert "during the rollout of generation 2" in (after.failure or "")
    assert [e.kind for e in after.events][-2:] == ["Adopted", "RolloutInterrupted"]


class Together(Runtime):
    """Each scaler successor waits at a barrier for another: starts run at once or fail."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        import threading  # noqa: PLC0415

        self.barrier = threading.Barrier(parties, timeout=10.0)
        self.lock = threading.Lock()
        self.inflight = self.most = 0

    def run(self, st: Step) -> Endpoint | None:
        if st.action == "start_replica" and "scaler-v1~" in st.replica_id:
            with self.lock:
                self.inflight += 1
                self.most = max(self.most, self.inflight)
            try:
                self.barrier.wait()  # BrokenBarrierError unless `parties` starts run at once
            finally:
                with self.lock:
                    self.inflight -= 1
        return super().run(st)


@pytest.mark.parametrize("surge", [2, 4])
def test_max_surge_starts_that_many_successors_at_once_before_their_predecessors_stop(tmp_path: Path,
                                                                                    surge: int) -> None:
    versioned_model(tmp_path)

    def docs(version: int, name: str) -> str:
        v = {"name": "scaler-v1", "artifact": {"uri": "models/scaler", "version": version},
             "profile": "scaler-v1.yaml"}
        gw = {"apiVersion": "headrace.dev/v1", "kind": "Gateway", "metadata": {"name": "gw"},
              "spec": {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0}, "workers": 4}}
        return validate([str(write_docs(tmp_path / name, pool(a100s=1), gw, deployment(
            "scaler", 50, 100, source="artifact", variants=[v], rollout={"max_surge": surge})))])[0]

    ctl = started(tmp_path, docs(1, "d.yaml"))
    ctl.runtime = Together(surge)  # type: ignore[assignment]
    ctl.runtime.running = started(tmp_path / "again", docs(1, "d.yaml")).runtime.running  # type: ignore[union-attr]
    old = [r for r in serving(ctl) if "scaler" in r]
    assert len(old) == 4  # one per gateway worker
    out = asyncio.run(ctl.apply(docs(2, "v2.yaml")))
    assert ctl.failure is None and ctl.rolled_back is None and not out["capacity_dips"]
    acts = "".join("+" if a == "start_replica" else "-" for a, _ in ctl.runtime.log)  # type: ignore[union-attr]
    # NOTE: `surge` successors at once (they met at the barrier), no more, before any predecessor stops
    assert acts == "++++----" and ctl.runtime.most == surge, acts  # type: ignore[union-attr]
    assert sorted(r for r in serving(ctl) if "scaler" in r) != sorted(old)
    assert len([r for r in serving(ctl) if "scaler" in r]) == 4


def test_a_wave_with_a_successor_that_is_not_ready_rolls_back_the_others_too(tmp_path: Path) -> None:
    versioned_model(tmp_path)
    v = {"name": "scaler-v1", "artifact": {"uri": "models/scaler", "version": 1}, "profile": "scaler-v1.yaml"}
    gw = {"apiVersion": "headrace.dev/v1", "kind": "Gateway", "metadata": {"name": "gw"},
          "spec": {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0}, "workers": 2}}

    def docs(version: int, name: str) -> str:
        return validate([str(write_docs(tmp_path / name, pool(a100s=1), gw, deployment(
            "scaler", 50, 100, source="artifact", variants=[{**v, "artifact": {**v["artifact"], "version": version}}],
            rollout={"max_surge": 2})))])[0]

    ctl = started(tmp_path, docs(1, "d.yaml"))
    before = serving(ctl)
    plan, d, _ = ctl._solve_diff(prepare(docs(2, "v2.yaml"), ctl.base_profiles))  # noqa: SLF001
    starts = [s.replica_id for s in d.steps if s.action == "start_replica"]
    assert len(starts) == 2
    ctl.runtime.fail = {starts[1]}  # type: ignore[union-attr]
    with pytest.raises(ApplyError, match="rolled back"):
        asyncio.run(ctl.apply(docs(2, "v2.yaml")))
    # NOTE: the successor that started is stopped again; the fleet is generation 1's
    assert serving(ctl) == before and sorted(ctl.runtime.running) == before  # type: ignore[union-attr]
    assert ("stop_replica", starts[0]) in ctl.runtime.log  # type: ignore[union-attr]


def test_an_old_engine_that_cannot_be_taken_out_stays_in_the_plan_and_the_next_apply_stops_it(tmp_path: Path) -> None:
    from gateway.control import ControlError

    h100 = {"model": "H100-80GB", "count": 2, "mig": False}
    gpus = pool(a100s=1)
    gpus["spec"]["nodes"][0]["gpus"].append(h100)

    def docs(variant: str, name: str) -> str:
        chat = deployment("chat", 2, 1000, variants=[variant], llm={"slo_tpot_ms": 50, "replicas": 1})
        return validate([str(write_docs(tmp_path / name, gpus, deployment("resnet50", 100, 100), chat))])[0]

    ctl = started(tmp_path, docs("llama-3.1-8b-instruct-fp8", "a.yaml"))
    ctl.engines = Engines(set())  # type: ignore[assignment]
    asyncio.run(ctl.apply(docs("llama-3.1-8b-instruct-fp8", "a.yaml")))
    (old,) = ctl.engines.running  # type: ignore[union-attr]
    gw = ctl.gateway
    remove = gw.remove_replica  # type: ignore[union-attr]

    async def refused(rid: str, drain: float, keep_model: bool = False) -> bool:
        if rid == old:
            raise ControlError("DELETE /v1/control/replicas: no answer from the gateway", 0)
        return await remove(rid, drain, keep_model)

    gw.remove_replica = refused  # type: ignore[union-attr]
    with pytest.raises(ApplyError, match="stopping LLM engine"):
        asyncio.run(ctl.apply(docs("llama-3.1-8b-instruct-int4", "b.yaml")))
    (new,) = ctl.engines.running - {old}  # type: ignore[union-attr]
    # NOTE: what runs is what the plan says: the new engine serves, the old one it could not take out too
    assert {r.id for r in ctl.llm_plan.replicas} == {old, new} == ctl.engines.running  # type: ignore[union-attr]
    gw.remove_replica = remove  # type: ignore[union-attr]
    asyncio.run(ctl.apply(docs("llama-3.1-8b-instruct-int4", "b.yaml")))
    assert {r.id for r in ctl.llm_plan.replicas} == {new} == ctl.engines.running  # type: ignore[union-attr]
    assert ctl.failure is None


def test_a_changed_gateway_worker_count_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    from profiles.schema import SpecError

    versioned_model(tmp_path)
    ctl = started(tmp_path, scaler_docs(tmp_path, 1))
    before, steps = serving(ctl), len(ctl.runtime.log)  # type: ignore[union-attr]
    more = scaler_docs(tmp_path, 1).replace("    grpc_port: 0\n", "    grpc_port: 0\n  workers: 2\n")
    assert "workers: 2" in more
    with pytest.raises(SpecError, match=r"spec.workers 1 -> 2: .*headrace down, then up"):
        asyncio.run(ctl.apply(more))
    assert serving(ctl) == before and len(ctl.runtime.log) == steps and ctl.generation == 1  # type: ignore[union-attr]
