"""The ``headrace`` console script: one entry point, one subcommand module per package.

Each subcommand module exposes ``register(subparsers)``, adding its parser and setting
``func`` (``args -> int`` exit code). A module that is absent is simply not offered. A command
imports only its own module (:data:`SUBCOMMAND_MODULES` says which registers it).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from deploy.commands import run

# each subcommand module and the commands it registers: ``headrace COMMAND ...`` imports the one
# module that registers COMMAND (a short command's time is much of it imports: ``plan``'s own are
# half of all of them); --help, no command or an unknown one import them all
SUBCOMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "deploy.triton_cli": ("triton",),
    "profiles.emulator.llm_cli": ("engine",),
    "profiles.cli": ("profile",),
    "loadgen.cli": ("load",),
    "gateway.cli": ("serve",),
    "placement.cli": ("plan",),
    "placement.k8s_cli": ("render-k8s",),
    "deploy.demo": ("demo",),  # the README's main job
    "loadgen.sim.cli": ("sim",),
    "deploy.operator.cli": ("up", "apply", "status", "down", "rollback"),
    "deploy.ray.serve_cli": ("render-serve",),
    "deploy.explain": ("explain",),
    "deploy.compile_cli": ("compile",),
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of the one alone that ``argv`` (the arguments that
    will be parsed) names when it names one."""
    parser = argparse.ArgumentParser(
        prog="headrace",
        description="SLO-aware inference gateway and GPU placement controller for Triton fleets.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    command = argv[0] if argv else None
    names = [m for m, commands in SUBCOMMAND_MODULES.items() if command in commands]
    if not any(_register(name, sub) for name in names):
        for name in SUBCOMMAND_MODULES:
            _register(name, sub)
    return parser


def _register(name: str, sub: argparse._SubParsersAction) -> bool:
    """Add module ``name``'s subcommands to ``sub``; False when the module is absent."""
    try:
        mod = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            return False
        raise
    mod.register(sub)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run(build_parser(argv), argv)


if __name__ == "__main__":
    sys.exit(main())
