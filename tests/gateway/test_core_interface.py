"""The seam between the drivers and the policy core: the gateway's driver drives its core
through :class:`SchedulerCore` alone, never asking what it happens to offer, and every core
handed to a driver (the gateway's or the simulator's) offers the whole interface."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from gateway.policy import EdfScheduler, SchedulerConfig
from gateway.policy.types import SchedulerCore
from tests.gateway.policy.test_policy_props import CheckedCore
from tests.gateway.test_front_door_security import Recording

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ("gateway/driver.py", "gateway/fleet.py")  # the driver and the fleet it holds
MEMBERS = sorted(n for n, v in vars(SchedulerCore).items() if callable(v) and not n.startswith("_"))


def core_probes(path: Path) -> list[str]:
    """Each ``getattr``/``hasattr`` on the core in ``path``, as ``file:line``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and node.args
                and "core" in ast.unparse(node.args[0])):
            out.append(f"{path.name}:{node.lineno}")
    return out


def test_the_driver_calls_its_core_without_probing_it() -> None:
    assert [p for f in DRIVER for p in core_probes(ROOT / f)] == []


def test_a_planted_probe_is_caught(tmp_path: Path) -> None:
    planted = tmp_path / "driver.py"
    planted.write_text("class D:\n    def f(self):\n        level = getattr(self.core, 'level', None)\n")
    assert core_probes(planted) == ["driver.py:3"]


def test_the_interface_names_what_the_driver_reads() -> None:
    assert {"queued", "level", "variant_moves", "submit", "poll", "on_complete"} <= set(MEMBERS)


# every core class a driver is handed: the scheduler, and the tests' wrappers around it
CORES = {
    "EdfScheduler": lambda: EdfScheduler(SchedulerConfig(wait=False)),
    "CheckedCore": lambda: CheckedCore(EdfScheduler(SchedulerConfig(wait=False))),
    "Recording": lambda: Recording(EdfScheduler(SchedulerConfig(wait=False))),
}


@pytest.mark.parametrize("name", sorted(CORES))
def test_every_core_offers_the_whole_interface(name: str) -> None:
    core = CORES[name]()
    for member in MEMBERS:
        got = getattr(core, member, None)
        assert callable(got), f"{name} has no {member}()"
        want = list(inspect.signature(getattr(SchedulerCore, member)).parameters)[1:]  # without self
        assert list(inspect.signature(got).parameters) == want, f"{name}.{member}"
