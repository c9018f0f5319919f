"""The Ray Serve application behind ``headrace render-serve``: the same plan as ``headrace up
--ray``, as Serve deployments (``serve deploy`` starts it; import path
``deploy.ray.serve_app:build``).

One deployment per planned GPU (its arbiter), one per replica (its Triton server), and one for
the gateway, which serves its own ports (requests reach it directly; Serve's proxy is off).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ray import serve

from deploy.operator.desired import base_profiles
from deploy.ray.runtime import GpuActorImpl, TritonActorImpl
from deploy.ray.serve_config import deployment_name, plan_for
from placement.diff import diff


@serve.deployment(num_replicas=1)
class GpuDeployment(GpuActorImpl):
    """One emulated GPU's arbiter."""


@serve.deployment(num_replicas=1)
class TritonDeployment(TritonActorImpl):
    """One replica's Triton server."""

    def __init__(self, what: Any, gpu: Any, workdir: str) -> None:
        arbiter = gpu.info.remote().result()["socket"] if gpu is not None else None
        super().__init__(what, arbiter, workdir)


@serve.deployment(num_replicas=1)
class GatewayDeployment:
    """The gateway configured from the plan, on its own loop and ports."""

    def __init__(self, plan: Any, profiles: Any, settings: dict[str, Any], workdir: str, *replicas: Any) -> None:
        from pathlib import Path  # noqa: PLC0415

        from gateway.app import Gateway  # noqa: PLC0415
        from placement.apply.render import gateway_config  # noqa: PLC0415
        from profiles.schema import GatewaySpec  # noqa: PLC0415

        endpoints = [r.info.remote().result()["endpoint"] for r in replicas]
        cfg = gateway_config(plan, endpoints, profiles, Path(workdir) / "profiles", GatewaySpec.model_validate(settings))
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="headrace-gateway").start()
        self.gateway = Gateway(cfg)
        asyncio.run_coroutine_threadsafe(self.gateway.start(), self.loop).result(60)

    def urls(self) -> dict[str, str]:
        return {"http": self.gateway.http_url, "grpc": self.gateway.grpc_url}


def build(args: dict[str, Any]) -> Any:
    """The application for ``args``: ``documents`` (the YAML stream), ``method``, ``workdir``."""
    import tempfile  # noqa: PLC0415

    want, plan = plan_for(args["documents"], base_profiles(), args.get("method", "greedy"))
    workdir = args.get("workdir") or tempfile.mkdtemp(prefix="headrace-serve-")
    gpus: dict[str, Any] = {}
    replicas = []
    for st in diff(None, plan).steps:
        if st.action != "start_replica":
            continue
        assert st.replica is not None
        src = want.sources.get((st.replica.model, st.replica.variant))
        gpu = None
        if src is None or src.kind == "emulated":
            if st.gpu not in gpus:
                gpus[st.gpu] = GpuDeployment.options(name=deployment_name("gpu", st.gpu)).bind(st.gpu)
            gpu = gpus[st.gpu]
        replicas.append(TritonDeployment.options(name=deployment_name("triton", st.replica_id)).bind(
            (st, want.profiles, want.sources), gpu, workdir))
    return GatewayDeployment.options(name="gateway").bind(plan, want.profiles, want.settings.model_dump(mode="json"),
                                                          workdir, *replicas)
