"""``headrace render-k8s``: plan a pool for model deployments and print the plan as one
multi-document YAML for ``kubectl apply`` (:mod:`placement.apply.kubernetes`)."""

from __future__ import annotations

import argparse
import sys

from placement.apply.kubernetes import KubernetesError, Options, render
from placement.plan import PlanError
from placement.problem import add_problem_args, load
from placement.solve.solver import SolverError, solve
from placement.spec import SpecError
from profiles.catalogue import CatalogueError
from profiles.profile import ProfileError

HELP = """Plan the GPU pool in -f files for the model deployments in -f files (as `headrace plan`
does) and print the Kubernetes manifests that serve the plan: the GPU operator's MIG and
device-plugin configs per node, a Triton Deployment and Service per replica, and the gateway's
config pointing at the Services.

examples:
  headrace render-k8s -f placement/examples/pool.yaml -f placement/examples/models.yaml > fleet.yaml
  headrace render-k8s -f pool.yaml -f models.yaml --namespace serving --image-tag 24.12 \\
      --model-repository s3://bucket/models
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("render-k8s", help="render a plan as Kubernetes manifests (kubectl apply)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_problem_args(p)
    d = Options()
    p.add_argument("--namespace", default=d.namespace, help=f"the replicas' namespace (default {d.namespace})")
    p.add_argument("--image-tag", default=d.image_tag, help=f"tritonserver image tag (default {d.image_tag})")
    p.add_argument("--model-repository", default=d.model_repository,
                   help="the shared model repository: a path the claim is mounted at, or an s3:// / gs:// URL")
    p.add_argument("--models-claim", default=d.models_claim, help="read-only volume claim holding the repository")
    p.add_argument("--operator-namespace", default=d.operator_namespace, help="the GPU operator's namespace")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    opts = Options(args.namespace, args.image_tag, args.model_repository, args.models_claim or None,
                   args.operator_namespace)
    try:
        inv, demands, profiles = load(args.file, args.profiles)
        plan = solve(demands, profiles, inv, args.method, time_limit=args.time_limit)
        plan.verify()
        text = render(plan, profiles, opts).to_yaml(opts.namespace)
    except (SpecError, SolverError, ProfileError, PlanError, CatalogueError, KubernetesError) as e:
        print(f"headrace render-k8s: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0
