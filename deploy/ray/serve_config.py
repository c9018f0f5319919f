"""``headrace render-serve``: the deployment as a Ray Serve config for ``serve deploy``.

Each Serve deployment gets the same custom resources ``headrace up --ray`` gives its actors (see
:mod:`deploy.ray.resources`): a GPU's arbiter one unit of its GPU model on its node, a replica a
pin to its node, the gateway a pin to the head node. Serve's HTTP proxy is off: clients call the
gateway's own ports.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

import yaml

from deploy.ray.resources import HEAD, PIN, node_of, pinned
from placement.diff import diff

if TYPE_CHECKING:
    from deploy.operator.controller import Desired
    from placement.plan import Plan
    from profiles.profile import ProfileSet

IMPORT_PATH = "deploy.ray.serve_app:build"


def deployment_name(kind: str, ident: str) -> str:
    """A Serve deployment name for a GPU or replica id (Serve names avoid '/')."""
    return f"{kind}-{ident.replace('/', '-').replace('#', '-').replace('@', '-')}"


def plan_for(text: str, base: ProfileSet, method: str = "greedy") -> tuple[Desired, Plan]:
    from deploy.operator.controller import prepare  # noqa: PLC0415
    from placement.solve.solver import solve  # noqa: PLC0415
    from placement.spec import inventory, single_pool  # noqa: PLC0415

    want = prepare(text, base, "render-serve")
    plan = solve(want.demands({}), want.profiles, inventory(single_pool(want.docs, ["render-serve"])), method)
    plan.verify()
    return want, plan


def render(text: str, want: Desired, plan: Plan, method: str = "greedy", name: str = "headrace") -> dict[str, Any]:
    """The Serve config (``ServeDeploySchema``) serving ``plan``."""
    deployments: list[dict[str, Any]] = []
    gpus: set[str] = set()
    for st in diff(None, plan).steps:
        if st.action != "start_replica":
            continue
        assert st.replica is not None
        src = want.sources.get((st.replica.model, st.replica.variant))
        if (src is None or src.kind == "emulated") and st.gpu not in gpus:
            gpus.add(st.gpu)
            deployments.append({"name": deployment_name("gpu", st.gpu), "num_replicas": 1,
                                "ray_actor_options": {"num_cpus": 0,
                                                      "resources": pinned(node_of(st.gpu), {st.gpu_model: 1.0})}})
        deployments.append({"name": deployment_name("triton", st.replica_id), "num_replicas": 1,
                            "ray_actor_options": {"num_cpus": 0, "resources": pinned(node_of(st.gpu))}})
    deployments.append({"name": "gateway", "num_replicas": 1,
                        "ray_actor_options": {"num_cpus": 1, "resources": {HEAD: PIN}}})
    return {"proxy_location": "Disabled",
            "applications": [{"name": name, "route_prefix": None, "import_path": IMPORT_PATH,
                              "args": {"documents": text, "method": method}, "deployments": deployments}]}


def run(args: argparse.Namespace) -> int:
    from deploy.operator.cli import CliError, validate  # noqa: PLC0415
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
