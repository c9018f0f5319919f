"""`headrace --help` and every subcommand's `--help` print their usage and exit 0, and the
dispatcher offers every subcommand module it names (none silently missing)."""

from __future__ import annotations

import argparse

import pytest

from deploy.cli import build_parser, main


def _subcommands() -> list[str]:
    (sub,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_every_subcommand_module_is_offered() -> None:
    assert {"serve", "load", "sim", "plan", "up", "apply", "status", "down", "rollback", "demo", "explain",
            "compile", "profile", "render-k8s", "render-serve", "triton"} <= set(_subcommands())


@pytest.mark.parametrize("argv", [["--help"], *([name, "--help"] for name in _subcommands())])
def test_help_prints_usage_and_exits_0(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    assert "usage: headrace" in capsys.readouterr().out
