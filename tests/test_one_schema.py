"""One definition of each configuration concept: the autoscaler's settings are one class, the
deployment's ``autoscaling:`` model, which the policy reads as it is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("profiles", "gateway", "placement", "loadgen", "deploy", "bench")
AUTOSCALING_SPEC = re.compile(r"Autoscal\w*Spec")


def classes(pattern: re.Pattern[str], root: Path = ROOT) -> list[str]:
    """``path:Name`` of every class in the packages whose name matches ``pattern``."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef) and pattern.fullmatch(node.name):
                    out.append(f"{path.relative_to(root)}:{node.name}")
    return out


def test_exactly_one_autoscaling_spec_class() -> None:
    assert classes(AUTOSCALING_SPEC) == ["profiles/schema.py:AutoscalingSpec"]


def test_the_scan_catches_a_second_autoscaling_spec(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "placement").mkdir()
    (tmp_path / "profiles" / "schema.py").write_text("class AutoscalingSpec:\n    pass\n")
    (tmp_path / "placement" / "autoscale.py").write_text("from dataclasses import dataclass\n\n\n"
                                                         "@dataclass\nclass AutoscaleSpec:\n    x: int = 0\n")
    assert classes(AUTOSCALING_SPEC, tmp_path) == ["profiles/schema.py:AutoscalingSpec",
                                                   "placement/autoscale.py:AutoscaleSpec"]
