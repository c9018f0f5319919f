"""A plan rendered for ``kubectl apply``: GPU partitioning through the NVIDIA GPU operator, one
Triton Deployment and Service per replica, and the gateway's config pointing at the Services.

Per node the operator gets a mig-parted config (``version: v1``, ``mig-configs``: the node's
MIG devices per GPU, for the MIG manager) and a device-plugin config (``migStrategy: mixed``;
``sharing.mps.resources`` when the node's whole GPUs are shared with MPS), selected by the node
labels ``nvidia.com/mig.config`` and ``nvidia.com/device-plugin.config`` (the YAML's header
lists the ``kubectl label`` commands). A replica asks for its slice as the device plugin names
it: ``nvidia.com/mig-<profile>`` for a MIG slice, ``nvidia.com/gpu`` for a whole GPU or its
MPS share.

Limits of that path, checked here: mig-parted places slices itself (the plan's placements are
not passed on), the device plugin does not share a MIG device with MPS, and its MPS sharing
splits every whole GPU of a node into equal parts, so a planned share must fit in one part.

Every replica's Triton loads only its variant (``--model-control-mode=explicit``) from one
model repository shared by all (a read-only volume claim, or an ``s3://`` / ``gs://`` URL) that
holds each variant's GPU repository (:mod:`placement.apply.gpu_repository`). A re-plan renders in
diff order: node configs, the new replicas, the gateway's config, and then, as commands to run
once the new replicas are ready, the deletions.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from placement.apply.executors import gpu_index, node_of
from placement.apply.render import Endpoint, gateway_config
from placement.diff import PlanDiff, Step, diff
from placement.plan import GpuPlan, Plan, SlicePlan
from profiles.profile import ProfileSet
from profiles.schema import GatewaySettings, ListenConfig
from profiles.triton.server import triton_argv

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
PROFILE_MOUNT = "/etc/headrace/profiles"
PART_OF = {"app.kubernetes.io/part-of": "headrace"}


class KubernetesError(ValueError):
    """The plan cannot be expressed through the GPU operator; the message names the GPU."""


@dataclass(frozen=True)
class Options:
    namespace: str = "headrace"
    image_tag: str = "24.08"  # nvcr.io/nvidia/tritonserver:<tag>-py3
    model_repository: str = "/models"  # a path in the container (the claim's mount) or a URL
    models_claim: str | None = "headrace-models"  # read-only volume claim mounted at a path repository
    operator_namespace: str = "gpu-operator"

    @property
    def image(self) -> str:
        return f"nvcr.io/nvidia/tritonserver:{self.image_tag}-py3"


def k8s_name(text: str, prefix: str = "hr-") -> str:
    """A DNS-1123 label for ``text`` (a replica id, a node): lower case, ``-`` for anything
    else, at most 63 characters (a hash keeps long names apart)."""
    base = prefix + re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if len(base) > 63:
        base = base[:54].rstrip("-") + "-" + hashlib.sha1(text.encode()).hexdigest()[:8]
    return base


def resource_name(g: GpuPlan, s: SlicePlan) -> str:
    """The device plugin's resource for a slice (MIG strategy ``mixed``)."""
    return f"nvidia.com/mig-{s.profile}" if g.mig else "nvidia.com/gpu"


def _by_node(plan: Plan) -> dict[str, list[GpuPlan]]:
    out: dict[str, list[GpuPlan]] = {}
    for g in plan.used():
        out.setdefault(node_of(g.id), []).append(g)
    return out


def mig_parted_configs(plan: Plan) -> dict[str, dict[str, Any]]:
    """Per node, its mig-parted config: one entry per GPU with the MIG devices it holds."""
    out = {}
    for node, gpus in _by_node(plan).items():
        entries = []
        for g in sorted(gpus, key=lambda g: gpu_index(g.id)):
            entry: dict[str, Any] = {"devices": [gpu_index(g.id)], "mig-enabled": g.mig}
            if g.mig:
                counts: dict[str, int] = {}
                for s in g.slices:
                    counts[s.profile] = counts.get(s.profile, 0) + 1
                entry["mig-devices"] = dict(sorted(counts.items()))
            entries.append(entry)
        out[node] = {"version": "v1", "mig-configs": {config_name(node): entries}}
    return out


def config_name(node: str) -> str:
    return k8s_name(node, "headrace-")


def mps_replicas(plan: Plan, node: str) -> int:
    """How many equal MPS parts the device plugin makes of each whole GPU of ``node`` (0: none);
    raises when the node's plan cannot be served that way."""
    gpus = _by_node(plan).get(node, [])
    for g in gpus:
        for s in g.slices:
            if g.mig and s.mps:
                raise KubernetesError(f"GPU {g.id} slice {s.label}: MPS on a MIG device is not offered by the "
                                      "NVIDIA device plugin (mps: false on the pool's GPUs plans them without MPS)")
    whole = [s for g in gpus if not g.mig for s in g.slices]
    if not any(s.mps for s in whole):
        return 0
    if not all(s.mps for s in whole):
        raise KubernetesError(f"node {node} has whole GPUs with and without MPS; the device plugin's "
                              "sharing applies to every whole GPU of a node (mps: false on the pool's GPUs plans them "
                              "without MPS)")
    n = max(len(s.replicas) for s in whole)
    for g in gpus:
        for s in g.slices:
            for r in s.replicas:
                if not g.mig and r.share > 1.0 / n + 1e-9:
                    raise KubernetesError(f"GPU {g.id}: a {r.share:.0%} MPS share does not fit one of the "
                                          f"{n} equal parts the device plugin makes of each GPU on {node} "
                                          "(mps: false on the pool's GPUs plans them without MPS)")
    return n


def device_plugin_configs(plan: Plan) -> dict[str, dict[str, Any]]:
    """Per node, the device plugin's config: MIG devices as their own resources, and the whole
    GPUs split into MPS parts where the plan shares them."""
    out = {}
    for node in _by_node(plan):
        cfg: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "mixed"}}
        n = mps_replicas(plan, node)
        if n:
            cfg["sharing"] = {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": n}]}}
        out[node] = cfg
    return out


def configmap(name: str, namespace: str, data: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(PART_OF)}, "data": dict(data)}


def node_configmaps(plan: Plan, opts: Options) -> list[dict[str, Any]]:
    """The MIG manager's and the device plugin's ConfigMaps (one config per node in each)."""
    mig = mig_parted_configs(plan)
    merged = {"version": "v1", "mig-configs": {k: v for c in mig.values() for k, v in c["mig-configs"].items()}}
    plugin = {config_name(node): yaml.safe_dump(c, sort_keys=False) for node, c in device_plugin_configs(plan).items()}
    return [configmap("headrace-mig-parted", opts.operator_namespace, {"config.yaml": yaml.safe_dump(merged, sort_keys=False)}),
            configmap("headrace-device-plugin", opts.operator_namespace, plugin)]


def service_host(replica_id: str, opts: Options) -> str:
    return f"{k8s_name(replica_id)}.{opts.namespace}.svc.cluster.local"


def replica_objects(st: Step, opts: Options) -> list[dict[str, Any]]:
    """The Deployment and Service of one replica (a ``start_replica`` step)."""
    if st.slice is None or st.replica is None:
        raise KubernetesError(f"{st.describe()}: a replica step needs a slice and a replica")
    name = k8s_name(st.replica_id)
    labels = {**PART_OF, "app.kubernetes.io/name": "tritonserver", "headrace.dev/replica": name}
    g = GpuPlan(st.gpu, st.gpu_model, st.slice.start is not None, (st.slice,))
    argv = triton_argv(opts.model_repository, HTTP_PORT, GRPC_PORT, METRICS_PORT, address="0.0.0.0",
                       extra=["--model-control-mode=explicit", f"--load-model={st.replica.variant}"])
    container: dict[str, Any] = {
        "name": "tritonserver", "image": opts.image, "command": [argv[0]], "args": argv[1:],
        "ports": [{"name": "http", "containerPort": HTTP_PORT}, {"name": "grpc", "containerPort": GRPC_PORT},
                  {"name": "metrics", "containerPort": METRICS_PORT}],
        "resources": {"limits": {resource_name(g, st.slice): 1}},
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"},
                           "periodSeconds": 5, "failureThreshold": 3},
    }
    if st.slice.mps:  # the plugin's part is the ceiling; the planned share tightens it
        container["env"] = [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": f"{st.replica.share * 100:g}"}]
    pod: dict[str, Any] = {"nodeSelector": {"kubernetes.io/hostname": node_of(st.gpu)}, "containers": [container]}
    if opts.models_claim and "://" not in opts.model_repository:
        container["volumeMounts"] = [{"name": "models", "mountPath": opts.model_repository, "readOnly": True}]
        pod["volumes"] = [{"name": "models", "persistentVolumeClaim": {"claimName": opts.models_claim,
                                                                        "readOnly": True}}]
    meta = {"name": name, "namespace": opts.namespace, "labels": labels,
            "annotations": {"headrace.dev/replica-id": st.replica_id, "headrace.dev/gpu": st.gpu,
                            "headrace.dev/slice": st.slice.label, "headrace.dev/share": f"{st.replica.share:g}"}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"headrace.dev/replica": name}},
        "strategy": {"type": "Recreate"},  # the pod holds its device: the old one goes first
        "template": {"metadata": {"labels": labels}, "spec": pod}}}
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": opts.namespace, "labels": labels},
               "spec": {"selector": {"headrace.dev/replica": name}, "ports": [
                   {"name": "http", "port": HTTP_PORT, "targetPort": "http"},
                   {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"}]}}
    return [deployment, service]


def endpoints(plan: Plan, opts: Options) -> list[Endpoint]:
    """Where each replica of ``plan`` serves: its Service's DNS name."""
    out = []
    for st in diff(None, plan).steps:
        if st.action == "start_replica" and st.slice is not None and st.replica is not None:
            host = service_host(st.replica_id, opts)
            r = st.replica
            out.append(Endpoint(st.replica_id, r.model, r.variant, st.gpu, st.slice.label, r.share, r.max_batch,
                                r.capacity, f"{host}:{HTTP_PORT}", f"{host}:{GRPC_PORT}"))
    return out


def gateway_configmap(plan: Plan, profiles: ProfileSet, opts: Options,
                      settings: GatewaySettings | None = None) -> dict[str, Any]:
    """The gateway's config (:func:`placement.apply.render.gateway_config`) and the replicas' profiles,
    as one ConfigMap mounted at ``PROFILE_MOUNT``."""
    settings = settings or GatewaySettings(listen=ListenConfig(host="0.0.0.0", http_port=8080, grpc_port=8081))
    with tempfile.TemporaryDirectory(prefix="headrace-k8s-") as tmp:
        cfg = gateway_config(plan, endpoints(plan, opts), profiles, Path(tmp), settings)
        data = {}
        for m in cfg.models:
            for rep in m.replicas:
                p = Path(rep.profile)
                data[p.name] = p.read_text()
                rep.profile = f"{PROFILE_MOUNT}/{p.name}"
    data["gateway.yaml"] = yaml.safe_dump(cfg.model_dump(mode="json", exclude_unset=True), sort_keys=False)
    return configmap("headrace-gateway", opts.namespace, data)


@dataclass(frozen=True)
class Manifest:
    """What ``kubectl apply`` gets (in order) and what to delete once the new replicas are ready."""

    apply: tuple[dict[str, Any], ...]
    delete: tuple[tuple[str, str], ...]  # (kind, name) in the replicas' namespace
    labels: tuple[tuple[str, str, str], ...]  # (node, label, value) the operator selects configs by

    def to_yaml(self, namespace: str) -> str:
        head = ["# headrace: apply with `kubectl apply -f`; the GPU operator picks each node's configs by label:"]
        head += [f"#   kubectl label node {n} {k}={v} --overwrite" for n, k, v in self.labels]
        body = yaml.safe_dump_all(self.apply, sort_keys=False)
        tail = []
        if self.delete:
            tail = ["# then, once the new replicas are ready (make before break):"]
            tail += [f"#   kubectl delete -n {namespace} {kind.lower()}/{name}" for kind, name in self.delete]
        return "\n".join(head) + "\n" + body + ("\n".join(tail) + "\n" if tail else "")


def render(plan_or_diff: Plan | PlanDiff, profiles: ProfileSet, opts: Options = Options(),
           settings: GatewaySettings | None = None) -> Manifest:
    """Everything the plan (or the re-plan's new plan) needs, in the diff's order."""
    d = diff(None, plan_or_diff) if isinstance(plan_or_diff, Plan) else plan_or_diff
    plan = d.new
    docs = node_configmaps(plan, opts)
    delete: list[tuple[str, str]] = []
    for st in d.steps:
        if st.action == "start_replica":
            docs += replica_objects(st, opts)
        elif st.action == "stop_replica":
            delete += [("Deployment", k8s_name(st.replica_id)), ("Service", k8s_name(st.replica_id))]
    docs.append(gateway_configmap(plan, profiles, opts, settings))
    labels = tuple((node, key, config_name(node)) for node in _by_node(plan)
                   for key in ("nvidia.com/mig.config", "nvidia.com/device-plugin.config"))
    return Manifest(tuple(docs), tuple(delete), labels)
