"""``headrace render-serve``: the deployment as a Ray Serve config for ``serve deploy``.

Each Serve deployment gets the same custom resources ``headrace up --ray`` gives its actors (see
:mod:`deploy.ray.resources`): a GPU's arbiter one unit of its GPU model on its node, a replica a
pin to its node, the gateway a pin to the head node. Serve's HTTP proxy is off: clients call the
gateway's own ports.
"""

from __future__ import annotations

import argparse
import sys

import yaml

from deploy.operator.client import CliError
from deploy.operator.desired import validate
from deploy.ray.serve_config import plan_for, render


def run(args: argparse.Namespace) -> int:
    from placement.plan import PlanError  # noqa: PLC0415
    from placement.solve.solver import SolverError  # noqa: PLC0415

    try:
        text, want, base = validate(args.file)
        want, plan = plan_for(text, base, args.method)
    except CliError as e:
        print(f"headrace render-serve: {e}", file=sys.stderr)
        return e.code
    except (SolverError, PlanError) as e:
        print(f"headrace render-serve: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    out = yaml.safe_dump(render(text, want, plan, args.method), sort_keys=False)
    if args.output in (None, "-"):
        sys.stdout.write(out)
    else:
        with open(args.output, "w") as f:
            f.write(out)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("render-serve", help="render the deployment as a Ray Serve config (serve deploy)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-f", "--file", action="append", required=True, metavar="FILE|DIR",
                   help="GpuPool / ModelDeployment / Gateway YAML (repeatable; a folder: its *.yaml)")
    p.add_argument("--method", choices=("greedy", "milp"), default="greedy", help="placement solver")
    p.add_argument("-o", "--output", default=None, help="write the config here (default: stdout)")
    p.set_defaults(func=run)
