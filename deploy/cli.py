"""The ``headrace`` console script: one entry point, one subcommand module per package.

Each subcommand module exposes ``register(subparsers)``, adding its parser and setting
``func`` (``args -> int`` exit code). A module that is absent is simply not offered.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from deploy.commands import run

SUBCOMMAND_MODULES = (
    "deploy.triton_cli",  # headrace triton
    "profiles.emulator.llm_cli",  # headrace engine
    "profiles.cli",  # headrace profile
    "loadgen.cli",  # headrace load
    "gateway.cli",  # headrace serve
    "placement.cli",  # headrace plan
    "placement.k8s_cli",  # headrace render-k8s
    "deploy.demo",  # headrace demo (the README's main job)
    "loadgen.sim.cli",  # headrace sim
    "deploy.operator.cli",  # headrace up / apply / status / down / rollback
    "deploy.ray.serve_cli",  # headrace render-serve
    "deploy.explain",  # headrace explain
    "deploy.compile_cli",  # headrace compile
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="headrace",
        description="SLO-aware inference gateway and GPU placement controller for Triton fleets.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
