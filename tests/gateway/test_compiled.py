"""The compiled core: each package declares its own compiled modules, a build is found only for
the very source it came from, it is what the process imports when it exists, and it makes
exactly the pure Python decisions."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.compile_cli import modules
from profiles import compiled

ROOT = Path(__file__).resolve().parents[2]
MODULES = modules()  # what `headrace compile` builds: every module the packages declare


def test_a_build_is_named_by_its_source_so_an_edited_source_is_never_served_stale(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HEADRACE_COMPILED_DIR", str(tmp_path))
    src = tmp_path / "m.py"
    src.write_text("X = 1\n")
    first = compiled.artifact("gateway.policy.rate", src, "3.0")
    assert first.parent == tmp_path and first.name.startswith("gateway.policy.rate-")
    assert compiled.artifact("gateway.policy.rate", src, "3.0") == first  # stable
    src.write_text("X = 2\n")
    assert compiled.artifact("gateway.policy.rate", src, "3.0") != first  # edited: another name
    src.write_text("X = 1\n")
    assert compiled.artifact("gateway.policy.rate", src, "3.1") != first  # another Cython


def test_the_finder_takes_only_core_modules_that_have_a_build(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HEADRACE_COMPILED_DIR", str(tmp_path))
    finder = compiled._Finder()
    assert finder.find_spec("gateway.app") is None  # not a core module
    assert finder.find_spec("gateway.policy.rate") is None  # no build in this directory
    so = compiled.artifact("gateway.policy.rate", compiled.source_of("gateway.policy.rate"))
    so.write_bytes(b"")  # a build's name for the current source
    spec = finder.find_spec("gateway.policy.rate")
    assert spec is not None and spec.origin == str(so)


def test_every_core_module_has_its_source() -> None:
    for name in MODULES:
        assert compiled.source_of(name).is_file(), name


def test_each_package_declares_its_own_compiled_modules() -> None:
    import gateway.policy
    import loadgen
    import loadgen.sim

    for package in (gateway.policy, loadgen, loadgen.sim):
        assert package.COMPILED and all(n.rpartition(".")[0] == package.__name__ for n in package.COMPILED)
    assert set(MODULES) == {*gateway.policy.COMPILED, *loadgen.COMPILED, *loadgen.sim.COMPILED}
    assert "gateway.policy.scheduler" in MODULES and "loadgen.sim.simulator" in MODULES


def test_importing_gateway_changes_nothing_in_the_import_system() -> None:
    """``import gateway`` only defines the package; the finder comes with a package that
    declares compiled modules."""
    code = ("import sys; before = list(sys.meta_path); import gateway; "
            "print(sys.meta_path == before, 'profiles.compiled' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={k: v for k, v in os.environ.items() if k != "HEADRACE_COMPILED"})
    assert run.stdout.split() == ["True", "False"], run.stderr


def test_a_module_with_a_build_is_imported_compiled_unless_turned_off() -> None:
    """Where this machine has built the core (``./run.sh`` does), the suite runs it compiled."""
    names = [n for n in MODULES if compiled.artifact(n, compiled.source_of(n)).exists()]
    if not names:
        pytest.skip("no compiled core built here (no Cython or C compiler): the suite runs pure Python")
    code = ("import importlib, sys; from profiles import compiled; "
            "print(all(compiled.compiled(importlib.import_module(n)) for n in sys.argv[1:]))")
    run = [sys.executable, "-c", code, *names]
    on = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, check=True,
                        env={k: v for k, v in os.environ.items() if k != "HEADRACE_COMPILED"})
    off = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, check=True,
                         env={**os.environ, "HEADRACE_COMPILED": "0"})
    assert (on.stdout.strip(), off.stdout.strip()) == ("True", "False"), (on.stderr, off.stderr)


def test_the_pure_python_core_makes_the_same_decisions_as_the_compiled_one() -> None:
    """The identity digests, taken from pure Python, hold in the other mode too (the suite
    itself runs whichever this machine has)."""
    mode = "0" if compiled.compiled(importlib.import_module("gateway.policy.scheduler")) else "1"
    if mode == "1" and not any(compiled.artifact(n, compiled.source_of(n)).exists() for n in MODULES):
        pytest.skip("no compiled core built here: only the pure Python mode exists")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/loadgen/sim/test_sim_identity.py::test_fixed_seeded_runs_give_exactly_the_same_answers"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "HEADRACE_COMPILED": mode},
                         timeout=240)
    assert run.returncode == 0, run.stdout[-3000:]
