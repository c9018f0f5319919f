"""The package layers, bottom to top: profiles -> gateway | placement -> loadgen -> deploy.

A module may import its own package and the packages below it, never one above it, and
gateway and placement never import each other. Imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LEVEL = {"profiles": 0, "gateway": 1, "placement": 1, "loadgen": 2, "deploy": 3}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def upward_imports(root: Path = ROOT) -> list[str]:
    bad = []
    for pkg, level in LEVEL.items():
        for path in sorted((root / pkg).rglob("*.py")):
            for line, target in imports_of(path):
                if target not in LEVEL or target == pkg:
                    continue
                if LEVEL[target] > level or (LEVEL[target] == level):
                    bad.append(f"{path.relative_to(root)}:{line} imports {target} ({pkg} is below or beside it)")
    return bad


def test_no_package_imports_a_layer_above_or_beside_it() -> None:
    bad = upward_imports()
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(("pkg", "target"), [("profiles", "placement"), ("gateway", "placement"),
                                             ("loadgen", "deploy")])
def test_the_check_catches_an_upward_import(tmp_path: Path, pkg: str, target: str) -> None:
    for p in LEVEL:
        (tmp_path / p).mkdir()
    (tmp_path / pkg / "bad.py").write_text(f"def f():\n    from {target}.x import y\n    return y\n")
    assert upward_imports(tmp_path) == [f"{pkg}/bad.py:2 imports {target} ({pkg} is below or beside it)"]
