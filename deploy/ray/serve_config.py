"""The Ray Serve config (``ServeDeploySchema``) that serves a plan: a deployment for each GPU's
arbiter, each replica and the gateway, pinned by the custom resources of
:mod:`deploy.ray.resources`, with Serve's HTTP proxy off."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deploy.ray.resources import HEAD, PIN, node_of, pinned
from placement.diff import diff

if TYPE_CHECKING:
    from deploy.operator.desired import Desired
    from placement.plan import Plan
    from profiles.profile import ProfileSet

IMPORT_PATH = "deploy.ray.serve_app:build"


def deployment_name(kind: str, ident: str) -> str:
    """A Serve deployment name for a GPU or replica id (Serve names avoid '/')."""
    return f"{kind}-{ident.replace('/', '-').replace('#', '-').replace('@', '-')}"


def plan_for(text: str, base: ProfileSet, method: str = "greedy") -> tuple[Desired, Plan]:
    from deploy.operator.desired import prepare  # noqa: PLC0415
    from placement.solve.solver import solve  # noqa: PLC0415
    from placement.spec import inventory, single_pool  # noqa: PLC0415

    want = prepare(text, base, "render-serve")
    plan = solve(want.demands({}), want.profiles, inventory(single_pool(want.docs, ["render-serve"])), method,
                 bound=method != "greedy")
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
