"""`headrace --help` and every subcommand's `--help` print their usage and exit 0, and the
dispatcher offers every subcommand module it names (none silently missing)."""

from __future__ import annotations

import argparse

import pytest

from deploy.cli import SUBCOMMAND_MODULES, build_parser, main


def _subcommands(parser: argparse.ArgumentParser | None = None) -> list[str]:
    (sub,) = (a for a in (parser or build_parser())._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_every_subcommand_module_is_offered() -> None:
    assert {"serve", "load", "sim", "plan", "up", "apply", "status", "down", "rollback", "demo", "explain",
            "compile", "profile", "render-k8s", "render-serve", "triton"} <= set(_subcommands())


def test_a_command_loads_only_its_own_module() -> None:
    # NOTE: the table names every command its module registers and no other, or a command it
    # misses would be offered only by `headrace --help`
    assert _subcommands() == sorted(c for commands in SUBCOMMAND_MODULES.values() for c in commands)
    for commands in SUBCOMMAND_MODULES.values():
        for command in commands:
            assert _subcommands(build_parser([command, "--help"])) == sorted(commands), command
    # no command, an option or an unknown one: every subcommand, so that the help lists them all
    for argv in ([], ["--help"], ["plna"]):
        assert _subcommands(build_parser(argv)) == _subcommands(), argv


@pytest.mark.parametrize("argv", [["--help"], *([name, "--help"] for name in _subcommands())])
def test_help_prints_usage_and_exits_0(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    assert "usage: headrace" in capsys.readouterr().out
