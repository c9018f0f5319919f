"""The house rules, read from the code's own imports (imports inside functions count too):

- the package layers, bottom to top: profiles -> gateway | placement -> loadgen -> deploy. A
  module imports its own package and those below it, never one above or beside it;
- no import cycle between modules;
- every CLI module (``cli.py``, ``*_cli.py``) is a leaf: nothing imports one, except the
  command dispatcher (``deploy/cli.py``, which loads the subcommands by name) and the demo;
- no module imports another module's private name (``from x import _y``, ``x._y``);
- the policy core (``gateway/policy/``) and the LLM engine model (``profiles/llm/``'s engine, KV
  cache, loop, step time and metrics) are sans-IO: nothing from asyncio, grpc, socket, time,
  threads or processes; the policy core takes nothing of ``gateway`` outside itself.

``import_module("x")`` and ``__import__("x")`` count as imports of ``x``; for the layers, so does any
other string that is a module's name (a tuple of module names a lower layer keeps). Each rule is
shown to catch a planted violation.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LEVEL = {"profiles": 0, "gateway": 1, "placement": 1, "loadgen": 2, "deploy": 3}
# they may import a CLI module: the dispatcher loads every subcommand, the demo drives `headrace up`
CLI_IMPORTERS = frozenset({"deploy.cli", "deploy.demo"})
POLICY = "gateway.policy"
# the LLM engine model, which the emulated engines, the router and the simulator drive with their clocks
ENGINE_MODEL = ("profiles.llm.engine", "profiles.llm.kv", "profiles.llm.loop", "profiles.llm.steptime",
                "profiles.llm.metrics")
POLICY_FORBIDDEN = ("asyncio", "grpc", "socket", "time", "threading", "subprocess", "multiprocessing",
                    "aiohttp", "selectors", "concurrent")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    path: str  # its file, relative to the root
    line: int
    target: str  # the module imported (dotted)
    name: str | None = None  # the name taken from it, for `from target import name`
    kind: str = "import"  # "import", "call" (import_module, __import__) or "string" (a module's name)


def module_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_of(p, root): p for pkg in LEVEL if (root / pkg).is_dir()
            for p in sorted((root / pkg).rglob("*.py"))}


def _resolve(known: dict[str, Path], base: str, name: str) -> tuple[str, str | None]:
    """``from base import name``: the module ``base.name`` where that is one, else ``base``."""
    return (f"{base}.{name}", None) if f"{base}.{name}" in known else (base, name)


def imports(root: Path = ROOT) -> tuple[Import, ...]:
    return _imports(root)


@functools.cache
def _imports(root: Path) -> tuple[Import, ...]:
    return tuple(_scan(root))


def _scan(root: Path) -> Iterator[Import]:
    known = modules(root)
    for mod, path in known.items():
        rel = str(path.relative_to(root))
        tree = ast.parse(path.read_text(), rel)
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and n.body and isinstance(n.body[0], ast.Expr)}
        called = {id(n.args[0]): n.args[0].value for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and _callee(n.func) in ("import_module", "__import__") and n.args
                  and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)}
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield Import(mod, rel, node.lineno, a.name)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for a in node.names:
                    target, name = _resolve(known, base, a.name)
                    yield Import(mod, rel, node.lineno, target, name)
            elif id(node) in called:
                yield Import(mod, rel, node.lineno, called[id(node)], kind="call")
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                  and node.value in known):
                yield Import(mod, rel, node.lineno, node.value, kind="string")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                dotted = _dotted(node.value)
                if dotted in known and dotted != mod:
                    yield Import(mod, rel, node.lineno, dotted, node.attr)


def _callee(node: ast.expr) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return head and f"{head}.{node.attr}"
    return None


def _top(module: str) -> str:
    return module.split(".")[0]


def upward_imports(root: Path = ROOT) -> list[str]:
    bad = []
    for i in imports(root):
        pkg, target = _top(i.source), _top(i.target)
        if target in LEVEL and target != pkg and LEVEL[target] >= LEVEL[pkg]:
            bad.append(f"{i.path}:{i.line} imports {target} ({pkg} is below or beside it)")
    return sorted(set(bad))


def cycles(root: Path = ROOT) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan)."""
    known = modules(root)
    graph: dict[str, set[str]] = {m: set() for m in known}
    for i in imports(root):
        if i.target in known and i.target != i.source:
            graph[i.source].add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def is_cli(module: str) -> bool:
    last = module.rpartition(".")[2]
    return last == "cli" or last.endswith("_cli")


def cli_imports(root: Path = ROOT) -> list[str]:
    """Imports of CLI modules, by statement or by ``import_module``/``__import__``. A module's name
    in another string (``python -m deploy.cli`` for a child process) runs it, not imports it."""
    return sorted({f"{i.path}:{i.line} imports the CLI module {i.target}" for i in imports(root)
                   if is_cli(i.target) and _top(i.target) in LEVEL and i.source not in CLI_IMPORTERS
                   and i.target != i.source and i.kind != "string"})


def private_imports(root: Path = ROOT) -> list[str]:
    known = modules(root)
    return sorted({f"{i.path}:{i.line} takes the private name {i.target}.{i.name}" for i in imports(root)
                   if i.name and i.name.startswith("_") and not i.name.startswith("__")
                   and i.target in known and i.target != i.source})


def impure_policy(root: Path = ROOT) -> list[str]:
    bad = []
    for i in imports(root):
        in_policy = i.source == POLICY or i.source.startswith(POLICY + ".")
        if not in_policy and i.source not in ENGINE_MODEL:
            continue
        if i.target.split(".")[0] in POLICY_FORBIDDEN:
            bad.append(f"{i.path}:{i.line} imports {i.target} (the policy core is sans-IO)")
        elif in_policy and _top(i.target) == "gateway" and i.target != POLICY and not i.target.startswith(POLICY + "."):
            bad.append(f"{i.path}:{i.line} imports {i.target} (the policy core imports no other part of gateway)")
    return sorted(set(bad))


def test_no_package_imports_a_layer_above_or_beside_it() -> None:
    bad = upward_imports()
    assert not bad, "\n".join(bad)


def test_no_import_cycle_between_modules() -> None:
    found = cycles()
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_no_module_imports_a_cli_module() -> None:
    bad = cli_imports()
    assert not bad, "\n".join(bad)


def test_no_module_imports_another_modules_private_name() -> None:
    bad = private_imports()
    assert not bad, "\n".join(bad)


def test_the_policy_core_is_sans_io() -> None:
    bad = impure_policy()
    assert not bad, "\n".join(bad)


# planted violations: each rule catches its own


def _house(tmp_path: Path, files: dict[str, str]) -> Path:
    for p in LEVEL:
        (tmp_path / p).mkdir()
        (tmp_path / p / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize(("pkg", "target"), [("profiles", "placement"), ("gateway", "placement"),
                                             ("loadgen", "deploy")])
def test_the_check_catches_an_upward_import(tmp_path: Path, pkg: str, target: str) -> None:
    root = _house(tmp_path, {f"{pkg}/bad.py": f"def f():\n    from {target}.x import y\n    return y\n"})
    assert upward_imports(root) == [f"{pkg}/bad.py:2 imports {target} ({pkg} is below or beside it)"]


def test_the_check_catches_a_module_named_in_a_string(tmp_path: Path) -> None:
    root = _house(tmp_path, {"loadgen/sim.py": "", "gateway/hook.py": 'MODULES = ("loadgen.sim",)\n'})
    assert upward_imports(root) == ["gateway/hook.py:1 imports loadgen (gateway is below or beside it)"]


def test_the_check_catches_a_cycle(tmp_path: Path) -> None:
    root = _house(tmp_path, {"gateway/a.py": "from gateway.b import x\n",
                             "gateway/b.py": "def f():\n    from gateway import c\n",
                             "gateway/c.py": "import gateway.a\n", "gateway/d.py": "from gateway.a import y\n"})
    assert cycles(root) == [["gateway.a", "gateway.b", "gateway.c"]]


def test_the_check_catches_an_import_of_a_cli_module(tmp_path: Path) -> None:
    root = _house(tmp_path, {"gateway/cli.py": "", "placement/k8s_cli.py": "",
                             "deploy/cli.py": "import importlib\nimportlib.import_module('gateway.cli')\n",
                             "loadgen/run.py": "from gateway.cli import serve\n",
                             "deploy/tool.py": "import importlib\nimportlib.import_module('placement.k8s_cli')\n",
                             "deploy/spawn.py": "ARGV = ['python', '-m', 'gateway.cli', 'serve']\n"})
    assert cli_imports(root) == ["deploy/tool.py:2 imports the CLI module placement.k8s_cli",
                                 "loadgen/run.py:1 imports the CLI module gateway.cli"]


def test_the_check_catches_a_private_name(tmp_path: Path) -> None:
    root = _house(tmp_path, {"placement/solver.py": "def _check():\n    pass\n",
                             "placement/accuracy.py": "from placement.solver import _check\n",
                             "placement/other.py": "import placement.solver\nplacement.solver._check()\n",
                             "placement/fine.py": "from placement.solver import __doc__\n"})
    assert private_imports(root) == ["placement/accuracy.py:1 takes the private name placement.solver._check",
                                     "placement/other.py:2 takes the private name placement.solver._check"]


def test_the_check_catches_io_in_the_engine_model(tmp_path: Path) -> None:
    root = _house(tmp_path, {"profiles/llm/__init__.py": "", "profiles/llm/engine.py": "import time\n"})
    assert impure_policy(root) == ["profiles/llm/engine.py:1 imports time (the policy core is sans-IO)"]


@pytest.mark.parametrize(("text", "why"), [("import time\n", "imports time (the policy core is sans-IO)"),
                                           ("from asyncio import sleep\n", "imports asyncio (the policy core is sans-IO)"),
                                           ("from gateway.driver import Driver\n",
                                            "imports gateway.driver (the policy core imports no other part of gateway)")])
def test_the_check_catches_io_in_the_policy_core(tmp_path: Path, text: str, why: str) -> None:
    root = _house(tmp_path, {"gateway/policy/__init__.py": "", "gateway/policy/types.py": "",
                             "gateway/driver.py": "", "gateway/policy/bad.py": "from gateway.policy.types import x\n" + text})
    assert impure_policy(root) == [f"gateway/policy/bad.py:2 {why}"]
