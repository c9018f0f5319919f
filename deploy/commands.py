"""Running a parsed ``headrace`` command: the one way the console script and the operator's own
entry point (the detached controller's ``python -m deploy.operator.cli``) turn arguments into
an exit code."""

from __future__ import annotations

import argparse


def run(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand's ``func``: its exit code, 2 (with the help)
    when no subcommand was given, 130 on Ctrl-C."""
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
